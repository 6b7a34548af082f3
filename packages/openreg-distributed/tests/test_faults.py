"""Faults: nothing hangs, nothing is silently wrong. Short timeouts (3 s) on groups of their own,
made with TORCH_OCCL_ASYNC_ERROR_HANDLING 0 or 2 so that the process goes on and the default group
stays usable; a dead peer, and the modes that take the process down, in processes of their own."""

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from conftest import OcclTestCase, fault_group, wait_until_failed
from torch._C._distributed_c10d import WorkResult
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import StreamHold


class TestFaults(OcclTestCase):
    def assert_default_group_usable(self):
        y = torch.ones(2, device=self.device)
        dist.all_reduce(y)
        self.assertEqual(y.cpu(), torch.full((2,), 2.0))
        z = torch.ones(2)
        dist.all_reduce(z)
        self.assertEqual(z, torch.full((2,), 2.0))

    def test_skipped_collective_fails_within_timeout(self):
        group = fault_group("2")  # clean up only: the process goes on
        x = torch.ones(4, device=self.device)
        if self.rank == 0:
            t0 = time.monotonic()
            work = dist.all_reduce(x, group=group, async_op=True)
            work.wait()  # orders the current stream only: returns at once
            # The watchdog fails the Work (no synchronisation needed to see it) ...
            self.assertRegex(wait_until_failed(work), r"occl ALLREDUCE \(seq 1, rank 0 of 2\) failed")
            # ... and the failure surfaces at the next synchronisation on the device, naming the collective.
            with self.assertRaisesRegex(RuntimeError, r"occl ALLREDUCE \(seq 1, rank 0 of 2\) failed"):
                x.cpu()
            self.assertLess(time.monotonic() - t0, 30)
            # Every later operation of that group fails at once with the first error.
            with self.assertRaisesRegex(dist.DistBackendError, "refused: the process group failed earlier: occl"):
                dist.all_reduce(x, group=group)
        dist.barrier()
        if self.rank == 1:
            # The rank that skipped it comes late: its collective must not pair with the one rank 0
            # gave up on (it would add rank 0's data silently); it fails instead, at once here (rank 0
            # closed its connections). Asynchronously, so that where it surfaces does not depend on
            # timing: a synchronous call's wait() raised when the failure came first, and the test
            # expected it at the next synchronisation (a flake in CI).
            work = dist.all_reduce(x, group=group, async_op=True)
            self.assertRegex(wait_until_failed(work), r"occl ALLREDUCE \(seq 1, rank 1 of 2\) failed")
            with self.assertRaisesRegex(dist.DistBackendError, r"occl ALLREDUCE \(seq 1, rank 1 of 2\) failed"):
                work.wait()  # a Work whose failure is known raises it at wait()
            with self.assertRaisesRegex(RuntimeError, r"occl ALLREDUCE \(seq 1, rank 1 of 2\) failed"):
                torch.openreg.synchronize()
        dist.barrier()
        self.assert_default_group_usable()  # its openreg and CPU parts
        dist.destroy_process_group(group)

    def test_a_failed_kernels_output_is_not_sent(self):
        # Rank 0's index_select fails on the device, and its output is the all_reduce's input. The
        # collective ran on it, and rank 1 summed rank 0's undefined data in silence. It is not run:
        # it fails, and with it the group, as NCCL's kernels do not run after a CUDA error; rank
        # 1's fails too (the failure propagated, or its timeout); the kernel's own failure is left
        # to rank 0's next synchronisation. The input may come from another stream that the
        # caller's waited for (review32b: a check of the caller's stream alone let it through).
        x = torch.arange(15.0, device=self.device).view(5, 3)
        x.index_select(0, torch.tensor([0, 1], device=self.device))  # a signature's first call is synchronous
        torch.openreg.synchronize()
        side = torch.openreg.Stream()
        for made_on in ("the caller's stream", "a side stream"):
            group = fault_group("2", TORCH_OCCL_PROPAGATE_ERROR="1")
            index = torch.tensor([0, 10] if self.rank == 0 else [0, 1], device=self.device)
            side.wait_stream(torch.openreg.current_stream())
            with torch.openreg.stream(side if made_on == "a side stream" else torch.openreg.current_stream()):
                y = x.index_select(0, index)
            torch.openreg.current_stream().wait_stream(side)
            work = dist.all_reduce(y, group=group, async_op=True)
            mine = rf"occl ALLREDUCE \(seq 1, rank {self.rank} of 2\) failed"
            if self.rank == 0:
                self.assertRegex(
                    wait_until_failed(work),
                    mine + ": not run: a kernel failed earlier on the device, and its output may be among this "
                    r"operation's inputs: .*kernel 'aten::index_select' failed on openreg device 0: index out of range",
                    msg=made_on,
                )
                with self.assertRaisesRegex(RuntimeError, "^orErrorLaunchFailure: kernel 'aten::index_select' failed"):
                    torch.openreg.synchronize()
            else:
                self.assertRegex(wait_until_failed(work), mine, msg=made_on)
                with self.assertRaisesRegex(RuntimeError, mine):
                    torch.openreg.synchronize()
            dist.barrier()
            dist.destroy_process_group(group)
        self.assert_default_group_usable()

    def test_a_failure_of_another_groups_collective_is_not_this_ones(self):
        # Rank 0's collective of a group of its own times out (rank 1 skips it) and its failure is
        # pending on the device, unreported. A collective of the default group on good data follows
        # no failed work of its caller's stream: it runs. The first check refused it for any
        # pending failure of the device (review32), and the default group died with it.
        group = fault_group("2")
        if self.rank == 0:
            work = dist.all_reduce(torch.ones(4, device=self.device), group=group, async_op=True)
            # Timed out by the watchdog or by the transport, whichever comes first.
            self.assertRegex(wait_until_failed(work), r"occl ALLREDUCE \(seq 1, rank 0 of 2\) failed: .*[Tt]imed out")
        dist.barrier()
        y = torch.full((2,), float(self.rank + 1), device=self.device)
        dist.all_reduce(y)
        if self.rank == 0:  # the timed-out collective's failure, at the next synchronisation
            with self.assertRaisesRegex(RuntimeError, r"occl ALLREDUCE \(seq 1, rank 0 of 2\) failed: .*[Tt]imed out"):
                torch.openreg.synchronize()
        self.assertEqual(y.cpu(), torch.full((2,), 3.0))
        dist.barrier()
        self.assert_default_group_usable()
        dist.destroy_process_group(group)

    def test_timeout_counts_from_enqueue(self):
        # As NCCL's watchdog: an operation that has not even started (its comm stream waits for
        # compute that does not end) times out `timeout` after it was enqueued.
        group = fault_group("0")  # no handling: the error surfaces at synchronisation
        x = torch.ones(4, device=self.device)
        if self.rank == 0:
            with StreamHold(self.device.index, timeout=60) as held:
                work = dist.all_reduce(x, group=group, async_op=True)
                message = wait_until_failed(work)
                self.assertFalse(held.stream.query())  # caught while the compute still runs
            self.assertRegex(message, r"occl ALLREDUCE \(seq 1, rank 0 of 2\) failed: timed out after 3000 ms")
            self.assertIn("not started; caught by occl's watchdog", message)
            # Failed is completed (as NCCL's Work once its exception is set), though its kernel is
            # still queued; its futures say why.
            self.assertTrue(work.is_completed())
            with self.assertRaisesRegex(RuntimeError, "timed out after 3000 ms"):
                work.get_future().wait()
            self.assertEqual(work.get_future_result().wait(), int(WorkResult.TIMEOUT))
            # The current stream never waited for the failed collective (async_op, no wait()), so
            # a copy on it need not see the failure; the device's synchronisation does, as on CUDA.
            with self.assertRaisesRegex(RuntimeError, "not started; caught by occl's watchdog"):
                torch.openreg.synchronize()
            with self.assertRaisesRegex(dist.DistBackendError, "refused: the process group failed earlier"):
                dist.broadcast(x, src=0, group=group)
        else:
            dist.all_reduce(x, group=group)  # its peer never comes: the transport's own timeout
            with self.assertRaisesRegex(RuntimeError, r"occl ALLREDUCE \(seq 1, rank 1 of 2\) failed"):
                x.cpu()
        dist.barrier()
        self.assert_default_group_usable()
        dist.destroy_process_group(group)

    def test_wait_with_a_timeout_blocks_and_raises(self):
        # As NCCL's: given a timeout, wait() blocks the host until the operation ended, and raises
        # once the timeout expired, failing the operation and its group (NCCL aborts its communicator).
        # The group's own timeout (60 s) is not the one under test: rank 1 joins once rank 0's wait
        # expired (told through the store, not a sleep that a loaded machine could outlast), and rank
        # 0's collective, failed but still in the transport, pairs with it.
        group = fault_group("0", timeout=timedelta(seconds=60))
        store = dist.distributed_c10d._get_default_store()
        expired_key = f"test_wait_with_a_timeout/{group.group_name}/expired"
        x = torch.full((4,), float(self.rank + 1), device=self.device)
        work = dist.all_reduce(x, group=group, async_op=True)
        self.assertTrue(work.wait(timeout=timedelta(seconds=30)))
        self.assertTrue(work.is_completed())  # the host blocked until it ended
        self.assertEqual(work.get_future_result().wait(), int(WorkResult.SUCCESS))
        self.assertEqual(x.cpu(), torch.full((4,), 3.0))
        if self.rank == 0:
            work = dist.all_reduce(x, group=group, async_op=True)  # rank 1 joins after the wait expired
            t0 = time.monotonic()
            expired = r"occl ALLREDUCE \(seq 2, rank 0 of 2\) failed: Work.wait\(timeout=300 ms\) expired"
            try:
                with self.assertRaisesRegex(dist.DistBackendError, expired):
                    work.wait(timeout=timedelta(milliseconds=300))
                self.assertGreaterEqual(time.monotonic() - t0, 0.3)
            finally:
                store.set(expired_key, "1")  # also when the test fails here: rank 1 then ends with it
            self.assertTrue(work.is_completed())
            self.assertFalse(work.is_success())
            with self.assertRaisesRegex(dist.DistBackendError, "the process group failed earlier: " + expired):
                dist.broadcast(x, src=0, group=group)
        else:
            store.wait([expired_key])
            dist.all_reduce(x, group=group)  # pairs with rank 0's, still in the transport
            self.assertEqual(x.cpu(), torch.full((4,), 6.0))
        dist.barrier()
        torch.openreg.synchronize()  # rank 0's collective ended in the transport: no device error
        self.assert_default_group_usable()  # the failure was not handed to the error handling
        dist.destroy_process_group(group)

    def test_blocking_wait_raises_at_wait(self):
        group = fault_group("3", TORCH_OCCL_BLOCKING_WAIT="1")  # blocking wait: the watchdog only reports
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

    def test_receive_from_the_own_rank_fails_cleanly(self):
        # A device copy (NCCL's): no peer is involved, so each rank fails alone, and its group.
        me = self.rank
        group = fault_group("2")
        dist.isend(torch.ones(4, device=self.device), dst=me, group=group)
        short = torch.empty(3, device=self.device)
        work = dist.irecv(short, src=me, group=group)
        self.assertRegex(
            wait_until_failed(work),
            rf"occl RECV \(seq 2, rank {me} of 2\) failed: the send from this rank \(tag 0\) has 16 bytes, "
            "the receiving tensor 12",
        )
        with self.assertRaisesRegex(RuntimeError, "the receiving tensor 12"):
            torch.openreg.synchronize()
        dist.destroy_process_group(group)
        # A receive no send comes for times out (the watchdog's or its own deadline, both 3 s) ...
        group = fault_group("2")
        work = dist.irecv(torch.empty(2, device=self.device), src=me, group=group)
        self.assertRegex(wait_until_failed(work), rf"occl RECV \(seq 1, rank {me} of 2\) failed: .*3000 ms")
        with self.assertRaisesRegex(RuntimeError, "3000 ms"):
            torch.openreg.synchronize()
        dist.destroy_process_group(group)
        # ... and one waiting when the group is aborted ends at once.
        group = fault_group("2")
        work = dist.irecv(torch.empty(2, device=self.device), src=me, group=group)
        group._get_backend(self.device).abort()
        self.assertRegex(
            wait_until_failed(work), rf"occl RECV \(seq 1, rank {me} of 2\) .*: occl: process group .* was aborted"
        )
        with self.assertRaisesRegex(RuntimeError, "aborted"):
            torch.openreg.synchronize()
        torch.openreg.synchronize()
        dist.barrier()
        dist.destroy_process_group(group)
        self.assert_default_group_usable()

    def test_abort_and_shutdown_return(self):
        group = fault_group("2")
        x = torch.ones(4, device=self.device)
        dist.all_reduce(x, group=group)
        self.assertEqual(x.cpu(), torch.full((4,), 2.0))
        backend = group._get_backend(self.device)
        if self.rank == 0:
            work = dist.all_reduce(x, group=group, async_op=True)  # rank 1 never joins
            backend.abort()  # returns at once
            # As NCCL's abort, it fails the operation in flight at once: its Work reported success and
            # wait() returned, chaining the caller's stream onto a kernel that ends at the timeout.
            self.assertTrue(work.is_completed())
            self.assertFalse(work.is_success())
            aborted = r"occl ALLREDUCE \(seq 2, rank 0 of 2\) failed: .*aborted"
            with self.assertRaisesRegex(dist.DistBackendError, aborted):
                work.wait()
            with self.assertRaisesRegex(dist.DistBackendError, "was aborted"):
                dist.all_reduce(x, group=group)
            # Not started yet: it runs nothing; started: it ends with the transport's timeout. Either
            # way its kernel fails, and the device's synchronisation reports that (once) ...
            with self.assertRaisesRegex(RuntimeError, r"occl ALLREDUCE \(seq 2, rank 0 of 2\)"):
                torch.openreg.synchronize()
            torch.openreg.synchronize()  # ... so the next test's device starts clean
            # ... and the Work, now ended, raises its error at wait().
            self.assertFalse(work.is_success())
            with self.assertRaisesRegex(dist.DistBackendError, r"occl ALLREDUCE \(seq 2, rank 0 of 2\)"):
                work.wait()
        dist.barrier()
        dist.destroy_process_group(group)  # shuts the backend down: returns

    def test_operations_after_shutdown_are_refused(self):
        """shutdown() (which destroy_process_group calls) lets queued work finish and refuses what comes
        after it, on the group shut down only; a subgroup's ops ran on as if nothing had happened."""
        group = dist.new_group([0, 1])
        x = torch.ones(4, device=self.device)
        work = dist.all_reduce(x, group=group, async_op=True)  # queued before the shutdown
        backend = group._get_backend(self.device)
        backend.shutdown()
        work.wait()
        self.assertEqual(x.cpu(), torch.full((4,), 2.0))  # not lost
        refused = r"occl: {} refused: the process group \(rank {} of 2\) was shut down"
        with self.assertRaisesRegex(dist.DistBackendError, refused.format("ALLREDUCE", self.rank)):
            dist.all_reduce(x, group=group)
        with self.assertRaisesRegex(dist.DistBackendError, refused.format("SEND", self.rank)):
            backend.send([x], 1 - self.rank, 0)
        with self.assertRaisesRegex(dist.DistBackendError, refused.format("BARRIER", self.rank)):
            backend.barrier()
        self.assertEqual(x.cpu(), torch.full((4,), 2.0))  # nothing ran
        self.assert_default_group_usable()
        dist.destroy_process_group(group)

    def test_results_of_operations_in_flight_at_shutdown_complete(self):
        # The watchdog completed Work.get_future_result(), and shutdown stops it: the result of an
        # operation still running then never completed (a wait on it hung), though the operation ran.
        group = dist.new_group([0, 1])
        x = torch.ones(4, device=self.device)
        if self.rank == 1:
            time.sleep(1.0)  # rank 0 shuts down while its all_reduce waits for this rank
        work = dist.all_reduce(x, group=group, async_op=True)
        result = work.get_future_result()
        group._get_backend(self.device).shutdown()
        deadline = time.monotonic() + 30  # polled: without the fix a wait never returns
        while not result.done() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertTrue(result.done(), "the result of an operation in flight at shutdown never completed")
        self.assertEqual(result.value(), int(WorkResult.SUCCESS))
        self.assertEqual(x.cpu(), torch.full((4,), 2.0))
        # A receive from this rank queued before the shutdown, and its send: both run (the
        # shutdown failed the receive, "the process group was ... shut down before a send came").
        dist.destroy_process_group(group)
        me, group = self.rank, dist.new_group([0, 1])
        got = torch.zeros(3, device=self.device)
        with StreamHold(self.device.index, timeout=60):  # neither can start before the shutdown
            received = dist.irecv(got, src=me, group=group)
            dist.isend(torch.full((3,), 5.0, device=self.device), dst=me, group=group)
            group._get_backend(self.device).shutdown()
        received.wait()
        self.assertEqual(got.cpu(), torch.full((3,), 5.0))
        torch.openreg.synchronize()  # no kernel failed
        dist.destroy_process_group(group)

    def _read_dump(self, path):
        t0 = time.monotonic()
        while True:  # written by the watchdog after it failed the group: wait until it is whole
            try:
                with open(path, "rb") as f:
                    return pickle.load(f)
            except (FileNotFoundError, EOFError, pickle.UnpicklingError):
                self.assertLess(time.monotonic() - t0, 30, f"no flight recorder dump at {path}")
                time.sleep(0.05)

    def test_failure_reaches_peers_and_dumps_the_flight_recorder(self):
        # TORCH_OCCL_PROPAGATE_ERROR: rank 0's timeout reaches rank 1, which skipped the collective and
        # has nothing in flight, through the group's store; TORCH_OCCL_DUMP_ON_TIMEOUT: each rank
        # writes its flight recorder when its group fails, through torch's DebugInfoWriter.
        dump_dir = tempfile.mkdtemp(prefix=f"occl-fr-rank{self.rank}-")
        os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(dump_dir, "trace_rank_")  # read at the first dump
        group = fault_group("2", TORCH_OCCL_PROPAGATE_ERROR="1", TORCH_OCCL_DUMP_ON_TIMEOUT="1")
        backend = group._get_backend(self.device)
        x = torch.ones(4, device=self.device)
        dist.all_reduce(x, group=group)  # a completed entry first
        self.assertEqual(x.cpu(), torch.full((4,), 2.0))
        self.assertIsNone(backend.first_error)
        timed_out = r"occl ALLREDUCE \(seq 2, rank 0 of 2\) failed: timed out after 3000 ms"
        # Both ranks dump when their group fails: rank 0's shows the collective that timed out.
        path = os.path.join(dump_dir, f"trace_rank_{self.rank}")
        if self.rank == 0:
            # Queued behind compute that does not end: only the watchdog can time it out, and the
            # dump then shows it scheduled (a collective blocked in the transport could also end by
            # the transport's own timeout first).
            with StreamHold(self.device.index, timeout=60):
                work = dist.all_reduce(x, group=group, async_op=True)  # rank 1 never joins
                self.assertRegex(wait_until_failed(work), timed_out)
                # Read while the collective is still held: once released, its kernel starts (and
                # ends at once, refusing to run), and a dump written after that shows it completed.
                dump = self._read_dump(path)
            with self.assertRaisesRegex(RuntimeError, timed_out):
                torch.openreg.synchronize()
            self.assertRegex(backend.first_error, "^" + timed_out)
        else:
            t0 = time.monotonic()
            while backend.first_error is None:
                self.assertLess(time.monotonic() - t0, 30, "rank 0's failure did not reach rank 1")
                time.sleep(0.05)
            reported = r"occl: a peer reported a failure of this process group: rank 0 \(rank 0 of 2 in the group\) "
            self.assertRegex(backend.first_error, "^" + reported + "failed: " + timed_out)
            with self.assertRaisesRegex(dist.DistBackendError, "the process group failed earlier: " + reported):
                dist.all_reduce(x, group=group)
            dump = self._read_dump(path)
        del os.environ["TORCH_FR_DUMP_TEMP_FILE"]
        shutil.rmtree(dump_dir)
        mine = [e for e in dump["entries"] if e["process_group"][0] == group.group_name]
        states = [(e["profiling_name"], e["collective_seq_id"], e["state"]) for e in mine]
        expected = [("occl:all_reduce", 1, "completed")]
        if self.rank == 0:
            expected.append(("occl:all_reduce", 2, "scheduled"))
        self.assertEqual(states, expected)
        dist.barrier()
        self.assert_default_group_usable()
        dist.destroy_process_group(group)


# What the two scripts below begin with: the two ranks meet in a file store (INIT_METHOD).
RANKS_MEET = """
import os, time
from datetime import timedelta
import torch, torch.distributed as dist
rank = int(os.environ["RANK"])
# Made with a long timeout (two interpreters importing torch on a loaded machine may meet far apart),
# then lowered for the operations, through both of the group's backends.
dist.init_process_group(
    "cpu:gloo,openreg:occl",
    init_method=os.environ["INIT_METHOD"],
    rank=rank,
    world_size=2,
    timeout=timedelta(seconds=60),
)
dist.distributed_c10d._set_pg_timeout(timedelta(seconds=5))
"""

# Each rank in a process of its own; rank 1 dies after the first collective. The survivor runs
# under the TORCH_OCCL_ASYNC_ERROR_HANDLING of its environment.
DEAD_PEER = (
    RANKS_MEET
    + """
x = torch.ones(4, device="openreg")
dist.all_reduce(x)
if rank == 1:
    x.cpu()  # its part of the first collective is done
    os._exit(0)  # then it dies without a word
t0 = time.monotonic()
# Asynchronous, so that where the failure surfaces does not depend on timing: a synchronous call's
# wait() raises a failure that came before it (rank 1 may be gone before this is enqueued).
work = dist.all_reduce(x, async_op=True)
if os.environ.get("TORCH_OCCL_ASYNC_ERROR_HANDLING", "3") in ("1", "3"):
    time.sleep(60)  # the watchdog takes the process down first
    print("survived")
    raise SystemExit
try:
    torch.openreg.synchronize()
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
)


# Rank 0 all-reduces 4 elements, rank 1 8: Gloo's I/O thread on the rank that receives more than
# it expects aborts that process ("Received data size doesn't match expected size"), which occl
# cannot catch; the other rank sees a dead peer and gets a clear error.
SIZE_MISMATCH = (
    RANKS_MEET
    + """
x = torch.ones(4 * (rank + 1), device="openreg")
t0 = time.monotonic()
work = dist.all_reduce(x, async_op=True)  # asynchronous: see DEAD_PEER
try:
    torch.openreg.synchronize()
    first = "no error"
except RuntimeError as e:
    first = str(e)
try:
    dist.all_reduce(x)
    later = "no error"
except dist.DistBackendError as e:
    later = str(e)
dist.destroy_process_group()
print(f"ALLREDUCE (seq 1, rank {rank} of 2) failed" in first, "failed earlier" in later, time.monotonic() - t0 < 20)
"""
)


def run_dead_peer(handling, script=DEAD_PEER, survivor=0):
    """Both ranks of `script` under TORCH_OCCL_ASYNC_ERROR_HANDLING=handling (None: unset); returns
    the survivor's (returncode, stdout, stderr)."""
    # The ranks meet in a file store: a free port found here could be taken by another process
    # before rank 0 listens on it.
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, INIT_METHOD=Path(tmp, "store").as_uri())
        env.pop("TORCH_OCCL_ASYNC_ERROR_HANDLING", None)
        if handling is not None:
            env["TORCH_OCCL_ASYNC_ERROR_HANDLING"] = handling
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script],
                env=dict(env, RANK=str(r)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in (0, 1)
        ]
        outs = [p.communicate(timeout=120) for p in procs]
    return procs[survivor].returncode, *outs[survivor]


class TestDeadPeer(TestCase):
    def test_dead_peer_fails_fast_and_shuts_down(self):
        code, out, err = run_dead_peer("2")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip().splitlines()[-1], "True True True", out + err)

    def test_size_mismatch_fails_the_other_rank(self):
        code, out, err = run_dead_peer("2", SIZE_MISMATCH, survivor=1)
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip().splitlines()[-1], "True True True", out + err)

    def test_tear_down_modes_end_the_process(self):
        # Unset (3, NCCL's default: skip clean up) and 1 (tear down): the watchdog takes the survivor
        # down at the failure, saying why.
        for handling, mode in ((None, 3), ("1", 1)):
            with self.subTest(handling=handling):
                code, out, err = run_dead_peer(handling)
                self.assertNotEqual(code, 0, out + err)
                self.assertNotIn("survived", out)
                self.assertIn("ALLREDUCE (seq 2, rank 0 of 2) failed", err)
                self.assertIn(f"occl is taking the entire process down (TORCH_OCCL_ASYNC_ERROR_HANDLING={mode})", err)


HOOK_AT_EXIT = """
import os, torch, torch.distributed as dist
dist.init_process_group("cpu:gloo,openreg:occl", init_method=os.environ["INIT_METHOD"], rank=0, world_size=1)
seen = []
dist.group.WORLD._register_on_completion_hook(lambda info: seen.append(info.seq))
x = torch.ones(1 << 16, device="openreg")
works = [dist.all_reduce(x, async_op=True) for _ in range(5)]
print("exiting", flush=True)  # without destroy_process_group: the hook thread may still run
"""


class TestHookAtExit(TestCase):
    def test_exit_with_a_completion_hook_registered(self):
        # The hook thread called the Python hook while the interpreter finalized: "Fatal Python
        # error: PyThreadState_Get" (or a segfault) at every exit. It stops at exit, as occl's
        # other threads' releases do (stop_foreign_releases).
        for _ in range(3):
            with tempfile.TemporaryDirectory() as tmp:  # a fresh store each time: the process exits without destroy
                r = subprocess.run(
                    [sys.executable, "-c", HOOK_AT_EXIT],
                    env=dict(os.environ, INIT_METHOD=Path(tmp, "store").as_uri()),
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
            self.assertEqual((r.returncode, r.stdout), (0, "exiting\n"), r.stderr)


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


if __name__ == "__main__":
    run_tests()
