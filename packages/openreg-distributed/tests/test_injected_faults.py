"""Injected faults (core's OPENREG_FAULTS, docs/mechanisms/reliability.md) under a 2-rank group: a
collective kernel that fails on one rank fails that rank's collective, and its peer gets an error
within the group's timeout instead of hanging; a send whose completion kernel fails is still
delivered."""

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from conftest import OcclTestCase, fault_group, wait_until_failed
from torch.testing._internal.common_utils import run_tests


class TestInjectedKernelFailure(OcclTestCase):
    def test_failed_collective_kernel_on_one_rank_fails_both(self):
        # Handling 2 (clean up only): the peer's timeout must not take its process down (3, the
        # default, does, as NCCL's does).
        group = fault_group("2")
        x = torch.ones(4, device=self.device)
        dist.all_reduce(x, group=group)  # healthy first
        self.assertEqual(x.cpu(), torch.full((4,), 2.0))
        dist.barrier()
        t0 = time.monotonic()
        if self.rank == 0:
            torch.openreg._inject_faults("kernel:occl::all_reduce")
        try:
            work = dist.all_reduce(x, group=group, async_op=True)
            if self.rank == 0:
                with self.assertRaisesRegex(
                    RuntimeError,
                    r"kernel 'occl::all_reduce' failed on openreg device 0: fault injected by OPENREG_FAULTS",
                ):
                    torch.openreg.synchronize()  # the comm stream's failure, reported once
                # The kernel never ran: its Work failed, and so did its group (the peer's timeout
                # is not needed for this rank to know).
                self.assertTrue(work.is_completed())
                self.assertFalse(work.is_success())
                not_run = (
                    r"occl ALLREDUCE \(seq 2, rank 0 of 2\) not run: the device failed its kernel before it started"
                )
                self.assertRegex(str(work.exception()), not_run)
                with self.assertRaisesRegex(
                    dist.DistBackendError, "refused: the process group failed earlier: " + not_run
                ):
                    dist.all_reduce(x, group=group)
            else:
                # Waited for until it failed, then read at wait() and at the device's synchronisation:
                # where a failure that comes before wait() surfaces depends on timing otherwise.
                failed = r"occl ALLREDUCE \(seq 2, rank 1 of 2\) failed"
                self.assertRegex(wait_until_failed(work), failed)
                with self.assertRaisesRegex(dist.DistBackendError, failed):
                    work.wait()
                with self.assertRaisesRegex(RuntimeError, failed):
                    torch.openreg.synchronize()
        finally:
            torch.openreg._inject_faults("")
        self.assertLess(time.monotonic() - t0, 30)
        dist.barrier()
        # The default group is still usable.
        y = torch.ones(2, device=self.device)
        dist.all_reduce(y)
        self.assertEqual(y.cpu(), torch.full((2,), 2.0))
        dist.destroy_process_group(group)

    def test_failed_kernel_is_reported_to_the_peer(self):
        # TORCH_OCCL_PROPAGATE_ERROR: the peer's collective fails with rank 0's cause, read from the
        # group's store, rather than with a timeout of its own that says nothing about rank 0.
        # Rank 0's report travels through its watchdog, the store and rank 1's watchdog (100 ms
        # polls) and must come before rank 1's own timeout: 8 s, so that a loaded machine's stalls
        # do not turn it into a timeout (rank 1's transport still waits that long for rank 0).
        group = fault_group("2", timeout=timedelta(seconds=8), TORCH_OCCL_PROPAGATE_ERROR="1")
        x = torch.ones(4, device=self.device)
        dist.all_reduce(x, group=group)
        dist.barrier()
        not_run = r"occl ALLREDUCE \(seq 2, rank 0 of 2\) not run: the device failed its kernel before it started"
        if self.rank == 0:
            torch.openreg._inject_faults("kernel:occl::all_reduce")
        try:
            work = dist.all_reduce(x, group=group, async_op=True)
            if self.rank == 0:
                with self.assertRaisesRegex(RuntimeError, "fault injected by OPENREG_FAULTS"):
                    torch.openreg.synchronize()
                self.assertRegex(str(work.exception()), not_run)
            else:
                reported = (
                    r"occl ALLREDUCE \(seq 2, rank 1 of 2\) failed: occl: a peer reported a failure of this process "
                    r"group: rank 0 \(rank 0 of 2 in the group\) failed: " + not_run
                )
                self.assertRegex(wait_until_failed(work), reported)  # as in the test above
                with self.assertRaisesRegex(RuntimeError, reported):
                    torch.openreg.synchronize()
        finally:
            torch.openreg._inject_faults("")
        dist.barrier()
        dist.destroy_process_group(group)

    def test_failed_send_wait_kernel_fails_the_send_not_its_delivery(self):
        # The kernel that waits for a send's delivery (occl::send_wait, on the send-completion
        # stream) discarded by the device: the send had started, so its data still reaches the
        # peer before the failure is told; the sender's Work and group fail, naming it.
        group = fault_group("2")
        dist.barrier()
        n = (64 << 10) // 4 + 1  # not staged: its Work ends with that kernel
        want = torch.arange(n, dtype=torch.float32)
        if self.rank == 0:
            torch.openreg._inject_faults("kernel:occl::send_wait")
        try:
            if self.rank == 0:
                work = dist.isend(want.to(self.device), dst=1, group=group)
                with self.assertRaisesRegex(
                    RuntimeError,
                    r"kernel 'occl::send_wait' failed on openreg device 0: fault injected by OPENREG_FAULTS",
                ):
                    torch.openreg.synchronize()
                self.assertTrue(work.is_completed())
                self.assertFalse(work.is_success())
                not_waited = (
                    r"occl SEND \(seq \d+, rank 0 of 2\) not waited for: "
                    r"the device failed its kernel before it completed"
                )
                self.assertRegex(str(work.exception()), not_waited)
                with self.assertRaisesRegex(
                    dist.DistBackendError, "refused: the process group failed earlier: " + not_waited
                ):
                    dist.isend(want.to(self.device), dst=1, group=group)
            else:
                got = torch.empty(n, device=self.device)
                dist.recv(got, src=0, group=group)
                self.assertEqual(got.cpu(), want)
        finally:
            torch.openreg._inject_faults("")
        dist.barrier()
        dist.destroy_process_group(group)


if __name__ == "__main__":
    run_tests()
