"""Faults: nothing hangs, nothing is silently wrong. Short timeouts (3 s) on groups of their own,
so the default group stays usable; a dead peer in processes of its own."""

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from conftest import OcclTestCase
from torch.testing._internal.common_utils import TestCase, run_tests

TIMEOUT = timedelta(seconds=3)


class TestFaults(OcclTestCase):
    def test_skipped_collective_fails_within_timeout(self):
        group = dist.new_group(backend="occl", timeout=TIMEOUT)
        if self.rank == 0:
            x = torch.ones(4, device=self.device)
            t0 = time.monotonic()
            work = dist.all_reduce(x, group=group, async_op=True)
            work.wait()  # orders the current stream only: returns at once
            # The failure surfaces at the next synchronisation on the device, naming the collective.
            with self.assertRaisesRegex(RuntimeError, r"occl ALLREDUCE \(seq 1, rank 0 of 2\) failed"):
                x.cpu()
            self.assertLess(time.monotonic() - t0, 30)
            self.assertFalse(work.is_success())
            # Every later operation of that group fails at once with the first error.
            with self.assertRaisesRegex(dist.DistBackendError, "refused: the process group failed earlier: occl"):
                dist.all_reduce(x, group=group)
        # The default group (openreg and CPU parts) is still usable.
        y = torch.ones(2, device=self.device)
        dist.all_reduce(y)
        self.assertEqual(y.cpu(), torch.full((2,), 2.0))
        z = torch.ones(2)
        dist.all_reduce(z)
        self.assertEqual(z, torch.full((2,), 2.0))
        dist.destroy_process_group(group)

    def test_blocking_wait_raises_at_wait(self):
        os.environ["TORCH_OCCL_BLOCKING_WAIT"] = "1"
        try:
            group = dist.new_group(backend="occl", timeout=TIMEOUT)
        finally:
            del os.environ["TORCH_OCCL_BLOCKING_WAIT"]
        x = torch.full((4,), float(self.rank + 1), device=self.device)
        dist.all_reduce(x, group=group)  # a healthy collective under blocking wait
        self.assertEqual(x.cpu(), torch.full((4,), 3.0))
        if self.rank == 1:
            work = dist.broadcast(x, src=1, group=group, async_op=True)
            with self.assertRaisesRegex(dist.DistBackendError, r"occl BROADCAST \(seq 2, rank 1 of 2\) failed"):
                work.wait()
            with self.assertRaisesRegex(RuntimeError, "occl BROADCAST"):
                torch.openreg.synchronize()  # the kernel's failure is also the device's error
        dist.barrier()
        dist.destroy_process_group(group)


# Each rank in a process of its own; rank 1 dies after the first collective.
DEAD_PEER = """
import os, time
from datetime import timedelta
import torch, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("cpu:gloo,openreg:occl", rank=rank, world_size=2, timeout=timedelta(seconds=5))
x = torch.ones(4, device="openreg")
dist.all_reduce(x)
if rank == 1:
    x.cpu()  # its part of the first collective is done
    os._exit(0)  # then it dies without a word
t0 = time.monotonic()
dist.all_reduce(x)
try:
    x.cpu()
    first = "no error"
except RuntimeError as e:
    first = str(e)
try:
    dist.all_reduce(x)
    later = "no error"
except dist.DistBackendError as e:
    later = str(e)
elapsed = time.monotonic() - t0
dist.destroy_process_group()  # returns: nothing hangs
print("ALLREDUCE (seq 2, rank 0 of 2) failed" in first, "failed earlier" in later, elapsed < 20)
"""


class TestDeadPeer(TestCase):
    def test_dead_peer_fails_fast_and_shuts_down(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", DEAD_PEER],
                env=dict(env, RANK=str(r)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in (0, 1)
        ]
        (out, err), _ = [p.communicate(timeout=120) for p in procs]
        self.assertEqual(procs[0].returncode, 0, err)
        self.assertEqual(out.strip().splitlines()[-1], "True True True", out + err)


if __name__ == "__main__":
    run_tests()


class TestDebugDetail(OcclTestCase):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL wraps occl in c10d's ProcessGroupWrapper, which checks every
    collective's type and shapes across ranks (over a Gloo helper group) before running it."""

    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level_from_env()
        super()._init_pg(rank, world_size, rdvz_file)

    def test_wrapped_and_checked(self):
        backend = self.pg._get_backend(self.device)
        self.assertEqual(type(backend).__name__, "_ProcessGroupWrapper")
        x = torch.full((4,), float(self.rank + 1), device=self.device)
        dist.all_reduce(x)
        self.assertEqual(x.cpu(), torch.full((4,), 3.0))
        # Mismatched shapes are caught before anything reaches the transport, on every rank.
        y = torch.ones(4 + self.rank, device=self.device)
        with self.assertRaisesRegex(RuntimeError, "Detected mismatch between collectives on ranks"):
            dist.all_reduce(y)
        dist.all_reduce(x)  # and the group goes on
        self.assertEqual(x.cpu(), torch.full((4,), 6.0))
