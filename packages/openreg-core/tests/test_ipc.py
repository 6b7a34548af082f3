"""Sharing openreg tensors between processes: runtime IPC handles (torch_openreg/openreg/ipc.py,
libopenreg/src/ipc.cpp) and torch.multiprocessing queues with the spawn start method."""

import contextlib
import gc
import os
import pickle

import torch
import torch.multiprocessing as mp
from conftest import run_python
from torch.testing._internal.common_utils import TestCase


def _consumer(queue, results):
    """Runs in a spawned process: receives tensors, checks them, writes into the first one."""
    t = queue.get(timeout=60)
    results.put(("tensor", str(t.device), t.cpu().tolist(), t.stride()))
    t.mul_(-1)  # a write through the shared memory
    torch.openreg.synchronize()
    p = queue.get(timeout=60)
    results.put(("parameter", type(p).__name__, p.requires_grad, p.detach().cpu().tolist()))
    s = queue.get(timeout=60)
    results.put(("storage", type(s).__name__, str(s.device), s.nbytes()))
    for _ in range(3):  # sparse COO, CSR, nested: their parts travel
        x = queue.get(timeout=60)
        parts = x.unbind() if x.is_nested else [x.to_dense()]
        results.put((str(x.layout), str(x.device), [p.cpu().tolist() for p in parts]))
    results.put(queue.get(timeout=60))  # back to the process that allocated it
    queue.get(timeout=60)  # alive until that message was read: it names this process's resources
    torch.openreg.empty_cache()  # drops what this process kept for it (the producer's refusal released it)
    results.put(("done",))


def _holding_consumer(queue, results, released):
    """Runs in a spawned process: holds every tensor it receives, reports their values, then drops
    them and says so."""
    held = [queue.get(timeout=60) for _ in range(4)]
    results.put([t.cpu().tolist() for t in held])
    released.wait(timeout=60)
    del held
    results.put("dropped")


def _forking_consumer(queue, results, go):
    """Runs in a spawned process: receives a tensor, forks a child that drops its inherited copy,
    then reads the tensor once the sender has emptied its cache and allocated again."""
    t = queue.get(timeout=60)
    pid = os.fork()
    if pid == 0:
        try:
            del t
            gc.collect()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    results.put("child exited")
    go.wait(timeout=60)
    results.put(t[:2].cpu().tolist())


def _holding_reader(queue, results, go):
    """Runs in a spawned process: reads a message's bytes, reports the values, and reads them again
    once the sender has read the message too, dropped its tensor and allocated again."""
    from multiprocessing.reduction import ForkingPickler

    t = ForkingPickler.loads(queue.get(timeout=60))
    results.put(t[:2].cpu().tolist())
    go.wait(timeout=60)
    results.put(t[:2].cpu().tolist())


def _holding_reader_of_tensors(queue, results, go):
    """Runs in a spawned process: receives a tensor, reports its first values, and reports them
    again once the sender has freed its storage and allocated again."""
    t = queue.get(timeout=60)
    results.put(t[:2].cpu().tolist())
    go.wait(timeout=60)
    results.put(t[:2].cpu().tolist())


def _twice_reading_consumer(queue, results, go):
    """Runs in a spawned process: gets a message's bytes (pickled under the file_system strategy,
    which lets them be read more than once), reads them twice, drops the first tensor, and reads
    the second once the sender has emptied its cache and allocated again."""
    from multiprocessing.reduction import ForkingPickler

    buf = queue.get(timeout=60)
    a, b = ForkingPickler.loads(buf), ForkingPickler.loads(buf)
    same = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    del a
    gc.collect()
    results.put(("read twice", same))
    go.wait(timeout=60)
    results.put(b[:2].cpu().tolist())


def _reader_of_two_messages(queue, results, go):
    """Runs in a spawned process: reads a message's bytes twice and drops what it read, then reads
    the sender's next message."""
    from multiprocessing.reduction import ForkingPickler

    buf = queue.get(timeout=60)
    a, b = ForkingPickler.loads(buf), ForkingPickler.loads(buf)
    first = a[:2].cpu().tolist()
    del a, b
    gc.collect()
    results.put(first)
    results.put(ForkingPickler.loads(queue.get(timeout=60))[:2].cpu().tolist())


def _holder_of_many(queue, results, go):
    """Runs in a spawned process: receives 20 tensors (file_system messages), holds them, and reports
    their values and how many release slabs it mapped."""
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing.reductions import shared_cache

    held = [ForkingPickler.loads(queue.get(timeout=60)) for _ in range(20)]
    slabs = [k for k, ref in list(shared_cache.items()) if isinstance(k, tuple) and k[:1] == ("openreg-slab",)]
    slabs = [k for k in slabs if not shared_cache[k].expired()]
    results.put(([t[0].item() for t in held], len(slabs)))
    go.wait(timeout=60)


def reuse_freed_memory() -> list:
    """Empties the sender's cache and fills new tensors with -1: where a storage a receiver still
    reads was wrongly freed, they overwrite it. Keep them until the receiver has read."""
    torch.accelerator.empty_cache()
    others = [torch.full((1024,), -1.0, device="openreg") for _ in range(4)]
    torch.openreg.synchronize()
    return others


@contextlib.contextmanager
def file_system_sharing():
    """torch.multiprocessing's file_system strategy for the with block: a CPU slab travels by name,
    so one message's bytes can be read more than once (a file descriptor is passed once)."""
    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        mp.set_sharing_strategy(previous)


@contextlib.contextmanager
def spawned(target):
    """A spawned process running target(queue, results, event), for the with block; then the event
    is set (whatever happened) and the process joined. Yields (queue, results, event, process)."""
    ctx = mp.get_context("spawn")
    queue, results, event = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=target, args=(queue, results, event))
    proc.start()
    try:
        yield queue, results, event, proc
    finally:
        event.set()
        proc.join(timeout=60)


class TestIpcHandles(TestCase):
    def test_live_sharing_with_another_process(self):
        t = torch.arange(12.0, device="openreg:1").view(3, 4)[1:, ::2]  # offset and strides
        h = torch.openreg.get_ipc_handle(t)
        r = run_python(
            f"""
            import pickle, torch
            h = pickle.loads(bytes.fromhex({pickle.dumps(h).hex()!r}))
            t = torch.openreg.open_ipc_handle(h)
            print(t.device, t.cpu().tolist(), t.stride(), t.storage_offset())
            t.fill_(7.0)
            torch.openreg.synchronize()
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "openreg:1 [[4.0, 6.0], [8.0, 10.0]] (4, 2) 4")
        # The other process wrote the shared memory; the elements outside the view are untouched.
        self.assertEqual(t.cpu().tolist(), [[7.0, 7.0], [7.0, 7.0]])
        self.assertEqual(t.untyped_storage().nbytes(), 48)
        whole = torch.empty(0, device="openreg:1").set_(t.untyped_storage())
        self.assertEqual(whole.cpu().tolist(), [0, 1, 2, 3, 7, 5, 7, 7, 7, 9, 7, 11])

    def test_a_range_beyond_the_allocation_is_refused_without_wrapping(self):
        # offset + nbytes computed in size_t wrapped around for a forged offset near 2**64, passed the
        # check, and gave a tensor that started before the allocation.
        t = torch.ones(4, device="openreg")
        h = torch.openreg.get_ipc_handle(t)
        r = run_python(
            f"""
            import pickle, torch
            h = pickle.loads(bytes.fromhex({pickle.dumps(h).hex()!r}))
            for offset, nbytes in ((2**64 - 8, 16), (0, 2**40), (2**40, 1)):
                try:
                    torch.openreg.open_ipc_handle(h._replace(offset=offset, nbytes=nbytes))
                    print("opened")
                except RuntimeError as e:
                    print(str(e).split(":")[0])
            print(torch.openreg.open_ipc_handle(h).cpu().tolist())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), ["IPC handle does not match the tensor"] * 3 + ["[1.0, 1.0, 1.0, 1.0]"])

    def test_conjugate_and_negative_views_keep_their_bits(self):
        # A lazy conj view and its imaginary part (a negated view after conj) read the base's memory;
        # the handle carries the bits, so the other process reads the view's values, not the base's.
        x = torch.tensor([1 + 2j, 3 - 4j], device="openreg")
        views = {"conj": x.conj(), "imag_of_conj": x.conj().imag}
        self.assertEqual((views["conj"].is_conj(), views["imag_of_conj"].is_neg()), (True, True))
        handles = {k: torch.openreg.get_ipc_handle(v) for k, v in views.items()}
        r = run_python(
            f"""
            import pickle, torch
            for k, h in pickle.loads(bytes.fromhex({pickle.dumps(handles).hex()!r})).items():
                t = torch.openreg.open_ipc_handle(h)
                print(k, t.is_conj(), t.is_neg(), t.resolve_conj().resolve_neg().cpu().tolist())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.split("\n")[:2],
            ["conj True False [(1-2j), (3+4j)]", "imag_of_conj False True [-2.0, 4.0]"],
        )
        plain = torch.openreg.get_ipc_handle(x)
        self.assertEqual((plain.conj, plain.neg), (False, False))
        # torch.multiprocessing's reducer sends the same handle.
        from multiprocessing.reduction import ForkingPickler

        _, (_, sent, _, slab, slot, _, _) = ForkingPickler._extra_reducers[torch.Tensor](views["conj"])
        slab[slot] = 0  # no receiver opens it: released by hand (see ipc.py::_keep)
        self.assertEqual((sent.conj, sent.neg), (True, False))

    def test_handle_names_no_shared_memory_file(self):
        before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        h = torch.openreg.get_ipc_handle(torch.ones(1000, device="openreg"))
        after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        self.assertEqual(after - before, set())
        self.assertEqual(len(h.handle), 64)

    def test_handle_of_an_exited_process(self):
        r = run_python(
            """
            import pickle, torch
            print(pickle.dumps(torch.openreg.get_ipc_handle(torch.ones(4, device="openreg"))).hex())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        h = pickle.loads(bytes.fromhex(r.stdout.strip()))
        with self.assertRaisesRegex(RuntimeError, r"cannot open openreg IPC handle: the process that exported it "):
            torch.openreg.open_ipc_handle(h)
        with self.assertRaisesRegex(RuntimeError, r"has exited"):
            torch.openreg.open_ipc_handle(h)
        self.assertEqual(torch.ones(2, device="openreg").sum().item(), 2.0)  # the device still works

    def test_bad_input(self):
        t = torch.ones(4, device="openreg")
        h = torch.openreg.get_ipc_handle(t)
        with self.assertRaisesRegex(RuntimeError, "this IPC handle was made by this process"):
            torch.openreg.open_ipc_handle(h)
        with self.assertRaisesRegex(RuntimeError, "not an openreg IPC memory handle"):
            torch.openreg.open_ipc_handle(h._replace(handle=bytes(64)))
        with self.assertRaisesRegex(RuntimeError, "an openreg IPC handle has 64 bytes, got 3"):
            torch.openreg.open_ipc_handle(h._replace(handle=b"abc"))
        with self.assertRaisesRegex(RuntimeError, "Invalid openreg device index 7"):
            torch.openreg.open_ipc_handle(h._replace(device=7))
        with self.assertRaisesRegex(ValueError, "get_ipc_handle takes an openreg tensor, got one on cpu"):
            torch.openreg.get_ipc_handle(torch.ones(2))
        with self.assertRaisesRegex(ValueError, "has no device memory"):
            torch.openreg.get_ipc_handle(torch.empty(0, device="openreg"))


class TestMultiprocessing(TestCase):
    def test_spawn_queue_shares_tensors_parameters_and_storages(self):
        from torch_openreg.openreg.ipc import _kept_count

        ctx = mp.get_context("spawn")
        queue, results = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=_consumer, args=(queue, results))
        proc.start()
        try:
            t = torch.arange(6.0, device="openreg:1").view(2, 3).t()  # transposed
            queue.put(t)
            self.assertEqual(results.get(timeout=120), ("tensor", "openreg:1", [[0, 3], [1, 4], [2, 5]], (1, 3)))
            # As with CUDA tensors, the producer keeps what it sent alive while the consumer uses it.
            param = torch.nn.Parameter(torch.full((2,), 3.0, device="openreg"))
            queue.put(param)
            self.assertEqual(results.get(timeout=60), ("parameter", "Parameter", True, [3.0, 3.0]))
            storage = torch.zeros(5, device="openreg").untyped_storage()
            queue.put(storage)
            self.assertEqual(results.get(timeout=60), ("storage", "UntypedStorage", "openreg:0", 20))
            # Sparse and nested tensors: their pickling failed in the queue's feeder thread, and the
            # consumer waited forever.
            x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]], device="openreg:1")
            queue.put(x.to_sparse())
            self.assertEqual(results.get(timeout=60), ("torch.sparse_coo", "openreg:1", [x.cpu().tolist()]))
            queue.put(x.to_sparse_csr())
            self.assertEqual(results.get(timeout=60), ("torch.sparse_csr", "openreg:1", [x.cpu().tolist()]))
            queue.put(torch.nested.nested_tensor([x[0], x[1, :2]]))
            self.assertEqual(results.get(timeout=60), ("torch.strided", "openreg:1", [[0.0, 1.0, 0.0], [2.0, 0.0]]))
            # A tensor sent back to its process: refused with what to do, not the runtime's words.
            queue.put(torch.ones(3, device="openreg"))
            with self.assertRaisesRegex(RuntimeError, r"allocated by this process and sent back .* send a clone"):
                results.get(timeout=60)
            queue.put(None)
            self.assertEqual(results.get(timeout=60), ("done",))
            proc.join(timeout=60)
            # Nothing stays kept for what was sent, that one included, once the consumer is gone.
            torch.openreg.empty_cache()
            self.assertEqual(_kept_count(), 0)
        finally:
            proc.join(timeout=60)
        self.assertEqual(proc.exitcode, 0)
        # The consumer's in-place write is visible here: shared, not copied.
        self.assertEqual(t.cpu().tolist(), [[0, -3], [-1, -4], [-2, -5]])

    def test_the_sender_keeps_what_it_sent_until_the_receiver_drops_it(self):
        # As torch keeps a CUDA storage it sent (CudaIPCSentData): the sender may drop its tensor
        # right after the send; the memory is freed once the receiver's copy is gone (collected at
        # the next send or an empty_cache()). Before, the sender's allocator gave it to the sender's
        # next tensor, which overwrote what the receiver read.
        from torch_openreg.openreg.ipc import _kept_count

        with spawned(_holding_consumer) as (queue, results, released, proc):
            torch.openreg.empty_cache()  # collects what earlier tests' receivers released
            base = torch.openreg.memory_allocated(0)
            kept = _kept_count()
            for i in range(4):
                t = torch.full((1024,), float(i), device="openreg")
                queue.put(t)
                del t  # the next tensor would take its block
                torch.full((1024,), -1.0, device="openreg")
            got = results.get(timeout=120)
            self.assertEqual(got, [[float(i)] * 1024 for i in range(4)])
            self.assertEqual(_kept_count(), kept + 4)
            self.assertEqual(torch.openreg.memory_allocated(0) - base, 4 * 4096)  # kept for the receiver
            released.set()
            self.assertEqual(results.get(timeout=60), "dropped")
            torch.openreg.empty_cache()  # collects the storages the receiver released
            self.assertEqual(_kept_count(), kept)
            self.assertEqual(torch.openreg.memory_allocated(0), base)
        self.assertEqual(proc.exitcode, 0)

    def test_torch_accelerator_empty_cache_frees_what_receivers_released(self):
        # The collection is the allocator's (a free-memory callback, as CUDA's IPC collect):
        # torch.accelerator.empty_cache() goes to the allocator without torch.openreg's Python.
        # Before, only torch.openreg.empty_cache() collected, and a storage a receiver had released
        # stayed reserved after torch.accelerator.empty_cache() (test_accelerator's test_memory
        # found 2 MiB reserved when an IPC test had run before it in the same process).
        from multiprocessing.reduction import ForkingPickler

        from torch_openreg.openreg.ipc import _kept_count

        torch.accelerator.empty_cache()
        kept, base = _kept_count(), torch.accelerator.memory_allocated()
        t = torch.ones(1000, device="openreg")
        _, (_, _, _, slab, slot, _, _) = ForkingPickler._extra_reducers[torch.Tensor](t)
        del t
        torch.accelerator.empty_cache()
        self.assertEqual((_kept_count(), torch.accelerator.memory_allocated()), (kept + 1, base + 4096))
        slab[slot] = 0  # what the receiver's storage does when it dies
        torch.accelerator.empty_cache()
        self.assertEqual((_kept_count(), torch.accelerator.memory_allocated()), (kept, base))

    def test_a_storage_resized_after_its_send_keeps_its_memory_for_the_receiver(self):
        # A sender that resizes a storage it sent (untyped_storage().resize_(0), as FSDP frees
        # memory, or a growing resize_) let go of the memory the receiver maps: the allocator gave it
        # to the sender's next tensor. It stays allocated now until the receiver releases the send,
        # as CUDA's sharing parks it; memory the send did not share is freed as usual.
        from multiprocessing.reduction import ForkingPickler

        from torch_openreg.openreg.ipc import _kept_count

        torch.accelerator.empty_cache()
        kept, base = _kept_count(), torch.accelerator.memory_allocated()
        shrunk, grown = torch.ones(1000, device="openreg"), torch.ones(1000, device="openreg")
        reduce = ForkingPickler._extra_reducers[torch.Tensor]
        slots = [reduce(t)[1][3:5] for t in (shrunk, grown)]  # (slab, slot) of each send
        shrunk.untyped_storage().resize_(0)
        grown.resize_(2000)
        grown.resize_(3000)  # the memory of the first resize was not sent: freed
        torch.accelerator.empty_cache()
        self.assertEqual(_kept_count(), kept + 2)
        self.assertEqual(torch.accelerator.memory_allocated() - base, 4096 + 4096 + 12288)  # sent + grown
        for slab, slot in slots:
            slab[slot] = 0  # what the receiver's storage does when it dies
        torch.accelerator.empty_cache()
        self.assertEqual(_kept_count(), kept)
        self.assertEqual(torch.accelerator.memory_allocated() - base, 12288)
        del shrunk, grown
        self.assertEqual(torch.accelerator.memory_allocated(), base)

    def test_a_sent_storage_sharing_its_memory_with_a_lazy_clone_keeps_it_too(self):
        # review33: the resize first gave a copy-on-write storage its own copy (set_data_ptr
        # materializes), kept that copy, and freed the sent memory with the lazy clone.
        from multiprocessing.reduction import ForkingPickler

        from torch_openreg.openreg.ipc import _kept_count

        torch.accelerator.empty_cache()
        kept, base = _kept_count(), torch.accelerator.memory_allocated()
        t = torch.ones(1000, device="openreg")
        slab, slot = ForkingPickler._extra_reducers[torch.Tensor](t)[1][3:5]
        clone = torch._lazy_clone(t)
        t.untyped_storage().resize_(0)
        self.assertEqual(torch.accelerator.memory_allocated() - base, 4096)  # no copy was made
        del clone
        torch.accelerator.empty_cache()
        self.assertEqual(torch.accelerator.memory_allocated() - base, 4096)  # kept for the receiver
        slab[slot] = 0
        torch.accelerator.empty_cache()
        self.assertEqual((_kept_count(), torch.accelerator.memory_allocated()), (kept, base))

    def test_a_receiver_reads_what_was_sent_after_the_sender_freed_the_storage(self):
        # The same, end to end: the receiver's tensor keeps its values after the sender's
        # resize_(0) and new allocations (which took the freed block before).
        with spawned(_holding_reader_of_tensors) as (queue, results, go, proc):
            t = torch.full((1024,), 7.0, device="openreg")
            queue.put(t)
            self.assertEqual(results.get(timeout=120), [7.0, 7.0])
            t.untyped_storage().resize_(0)
            others = reuse_freed_memory()
            go.set()
            self.assertEqual(results.get(timeout=60), [7.0, 7.0])
            del others
        self.assertEqual(proc.exitcode, 0)

    def test_an_allocation_frees_what_receivers_released_before_it_reports_out_of_memory(self):
        # As CUDA's allocator runs its free-memory callbacks (the IPC collect) before an
        # out-of-memory error: a storage kept for a receiver that let go is given back first.
        r = run_python(
            """
            import torch
            from multiprocessing.reduction import ForkingPickler
            from torch_openreg.openreg.ipc import _kept_count
            t = torch.empty(32 << 20, dtype=torch.uint8, device="openreg")
            _, (_, _, _, slab, slot, _, _) = ForkingPickler._extra_reducers[torch.Tensor](t)
            del t
            def counts():
                stats = torch.openreg.memory_stats()
                return stats["num_ooms"], stats["num_alloc_retries"]
            before = counts()
            try:
                torch.empty(32 << 20, dtype=torch.uint8, device="openreg")
            except torch.OutOfMemoryError as e:
                print("kept:", _kept_count(), str(e).split(".")[0], [a - b for a, b in zip(counts(), before)])
            before = counts()
            slab[slot] = 0  # the receiver let go
            u = torch.empty(32 << 20, dtype=torch.uint8, device="openreg")
            print("released:", _kept_count(), [a - b for a, b in zip(counts(), before)],
                  torch.openreg.memory_allocated())
            """,
            env={"OPENREG_DEVICE_MEMORY": "48M"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        # One out-of-memory error and one retry (the cache released once), as without a sent
        # storage; then the callback alone makes room: no retry.
        self.assertEqual(
            r.stdout.splitlines(),
            ["kept: 1 openreg out of memory on device 0 [1, 1]", f"released: 0 [0, 0] {32 << 20}"],
        )

    def test_a_child_forked_from_the_receiver_does_not_release_what_the_receiver_reads(self):
        # The child inherits the received storage; its copy dying in the child zeroed the sender's
        # slot, so the sender freed the memory and its next tensor overwrote what the receiver read.
        # The runtime refuses a forked child's calls: the slot is zeroed only after a successful close.
        with spawned(_forking_consumer) as (queue, results, go, proc):
            t = torch.full((1024,), 7.0, device="openreg")
            queue.put(t)
            del t
            self.assertEqual(results.get(timeout=120), "child exited")
            others = reuse_freed_memory()
            go.set()
            self.assertEqual(results.get(timeout=60), [7.0, 7.0])
            del others
        self.assertEqual(proc.exitcode, 0)

    def test_a_message_read_back_in_its_own_process(self):
        # The runtime does not open a process's own handle: the sender hands back the storage it
        # kept for the send (as torch's CUDA path finds its own storage in its cache), and frees
        # the slot. It raised, and the storage stayed kept for a receiver that never came.
        from multiprocessing.reduction import ForkingPickler

        from torch_openreg.openreg.ipc import _kept_count

        torch.openreg.empty_cache()
        kept = _kept_count()
        t = torch.arange(6.0, device="openreg:1").view(2, 3)[:, 1:]
        back = pickle.loads(ForkingPickler.dumps(t))
        self.assertEqual((back.device, back.shape, back.stride()), (t.device, t.shape, t.stride()))
        self.assertEqual(back.untyped_storage().data_ptr(), t.untyped_storage().data_ptr())  # the same memory
        self.assertEqual(_kept_count(), kept)
        s = pickle.loads(ForkingPickler.dumps(t.untyped_storage()))
        self.assertEqual(s.data_ptr(), t.untyped_storage().data_ptr())
        self.assertEqual(_kept_count(), kept)

    def test_a_message_read_twice_gives_one_storage(self):
        # As torch's shared_cache does for the storages it shares: a message read again while a
        # tensor read from it lives gives that tensor's storage. Before, each reading opened the
        # memory again, and the first one dying released the sender's memory while the second still
        # read it: the sender's next tensor overwrote it.
        from multiprocessing.reduction import ForkingPickler

        with file_system_sharing(), spawned(_twice_reading_consumer) as (queue, results, go, proc):
            t = torch.full((1024,), 7.0, device="openreg")
            queue.put(bytes(ForkingPickler.dumps(t)))
            del t
            self.assertEqual(results.get(timeout=120), ("read twice", True))
            others = reuse_freed_memory()
            go.set()
            self.assertEqual(results.get(timeout=60), [7.0, 7.0])
            del others
        self.assertEqual(proc.exitcode, 0)

    def test_a_message_read_twice_leaves_the_slab_to_the_next_message(self):
        # torch's transport of a CPU storage under file_system counts a reference on its file per
        # sending and drops one per reading: the release slab of a message read twice lost its file
        # once the receiver dropped what it read, and the sender's next message could not be opened
        # ("unable to open shared memory object"). The slab now travels by name (ipc.py::_SlabByName).
        from multiprocessing.reduction import ForkingPickler

        with file_system_sharing(), spawned(_reader_of_two_messages) as (queue, results, go, proc):
            queue.put(bytes(ForkingPickler.dumps(torch.full((1024,), 7.0, device="openreg"))))
            self.assertEqual(results.get(timeout=120), [7.0, 7.0])
            queue.put(bytes(ForkingPickler.dumps(torch.full((1024,), 8.0, device="openreg"))))
            self.assertEqual(results.get(timeout=60), [8.0, 8.0])
        self.assertEqual(proc.exitcode, 0)

    def test_a_receiver_maps_a_slab_once_for_all_its_messages(self):
        # Each message opened the slab's file again: one mapping per held tensor, until the process
        # ran out of mappings (vm.max_map_count) at ~65k tensors.
        from multiprocessing.reduction import ForkingPickler

        with file_system_sharing(), spawned(_holder_of_many) as (queue, results, go, proc):
            for i in range(20):
                queue.put(bytes(ForkingPickler.dumps(torch.full((4,), float(i), device="openreg"))))
            self.assertEqual(results.get(timeout=120), ([float(i) for i in range(20)], 1))
        self.assertEqual(proc.exitcode, 0)

    def test_a_release_slot_that_lost_its_generation_is_refused(self):
        # A slot holds its send's generation until the receiver releases it; then the sender may
        # reuse the memory, or the slot for a later send. A message read after that (its bytes
        # loaded again once its tensors died) is refused before anything is opened. (Across
        # processes torch's own file_system transport of the slab may fail first: it counts one
        # reading per message.)
        t = torch.ones(4, device="openreg")
        h = torch.openreg.get_ipc_handle(t)
        slab = torch.zeros(8, dtype=torch.int64)
        for value in (0, 6 << 21):  # released, or taken by a later send (generation 6)
            slab[3] = value
            with self.assertRaisesRegex(RuntimeError, "^this openreg tensor was received before and released since"):
                torch.openreg.ipc._C._ipc_open(h.handle, h.device, h.offset, h.nbytes, slab, 3, 5)
            self.assertEqual(slab[3].item(), value)

    def test_a_message_read_by_its_sender_while_a_receiver_holds_it(self):
        # The sender's reading took the kept storage back and freed the slot: once the sender
        # dropped its tensor, its next one overwrote what the receiver still read. A receiver now
        # counts itself in the slot when it opens the message, and the sender's reading shares
        # the kept storage with it instead.
        from multiprocessing.reduction import ForkingPickler

        from torch_openreg.openreg.ipc import _kept_count

        with file_system_sharing(), spawned(_holding_reader) as (queue, results, go, proc):
            torch.openreg.empty_cache()
            kept = _kept_count()
            t = torch.full((1024,), 7.0, device="openreg")
            buf = bytes(ForkingPickler.dumps(t))
            del t
            queue.put(buf)
            self.assertEqual(results.get(timeout=120), [7.0, 7.0])
            mine = ForkingPickler.loads(buf)
            self.assertEqual((mine[:2].cpu().tolist(), _kept_count()), ([7.0, 7.0], kept + 1))  # still kept
            del mine
            gc.collect()
            others = reuse_freed_memory()
            go.set()
            self.assertEqual(results.get(timeout=60), [7.0, 7.0])
            del others
        self.assertEqual(proc.exitcode, 0)

    def test_a_failed_opening_gives_its_hold_back(self):
        # The receiver counts itself in the slot before it opens the memory; an opening that fails
        # (here: the runtime does not open a process's own handle) takes that count back, or the
        # sender would keep the storage forever. The last holder gone, the slot is released.
        h = torch.openreg.get_ipc_handle(torch.ones(4, device="openreg"))
        slab = torch.zeros(8, dtype=torch.int64)
        kept, opened = 5 << 21, 1 << 20  # generation 5 (Module.cpp::ipc_slot)
        for before, after in ((kept, 0), (kept | opened | 1, kept | opened | 1)):  # alone; another receiver holds it
            slab[3] = before
            with self.assertRaisesRegex(RuntimeError, "made by this process"):
                torch.openreg.ipc._C._ipc_open(h.handle, h.device, h.offset, h.nbytes, slab, 3, 5)
            self.assertEqual(slab[3].item(), after)

    def test_a_change_of_sharing_strategy_leaves_earlier_receivers_releases_seen(self):
        # A slab shared by file name, sent again under file_descriptor, is moved by torch to new
        # memory: the receivers of the earlier messages released their storages into the old one,
        # and the sender kept those storages for ever. Slabs are per strategy (Module.cpp).
        from torch_openreg.openreg.ipc import _kept_count

        torch.openreg.empty_cache()
        kept = _kept_count()
        with file_system_sharing(), spawned(_holding_reader_of_tensors) as (queue, results, go, proc):
            queue.put(torch.full((4,), 3.0, device="openreg"))
            self.assertEqual(results.get(timeout=60), [3.0, 3.0])
            with spawned(_holding_reader_of_tensors) as (queue2, results2, go2, proc2):
                mp.set_sharing_strategy("file_descriptor")
                queue2.put(torch.full((4,), 4.0, device="openreg"))
                self.assertEqual(results2.get(timeout=60), [4.0, 4.0])
        self.assertEqual((proc.exitcode, proc2.exitcode), (0, 0))
        torch.openreg.empty_cache()  # takes the released storages back
        self.assertEqual(_kept_count(), kept)

    def test_a_message_read_back_twice_in_its_own_process(self):
        # The sender read its own message twice: the second reading found the slot that a later
        # send had taken over, and returned that send's storage (zeros here instead of 0..9).
        from multiprocessing.reduction import ForkingPickler

        with file_system_sharing():
            t = torch.arange(10.0, device="openreg")
            buf = ForkingPickler.dumps(t)
            del t
            first = pickle.loads(buf)
            later = ForkingPickler.dumps(torch.zeros(10, device="openreg"))
            second = pickle.loads(buf)
        self.assertEqual(second.untyped_storage().data_ptr(), first.untyped_storage().data_ptr())
        self.assertEqual(second.cpu().tolist(), list(range(10)))
        del first, second
        gc.collect()
        with self.assertRaisesRegex(RuntimeError, "sent by this process and released since"):
            pickle.loads(buf)
        self.assertEqual(pickle.loads(later).cpu().tolist(), [0.0] * 10)

    def test_empty_tensors_and_storages_travel(self):
        # They have no memory to share: get_ipc_handle refuses them, and the reducer raised in the
        # queue's feeder thread, so the whole message was lost and the consumer waited forever.
        from multiprocessing.reduction import ForkingPickler

        for t in (
            torch.empty(0, device="openreg"),
            torch.empty(3, 0, dtype=torch.int64, device="openreg:1"),
            torch.nn.Parameter(torch.empty(0, device="openreg")),
        ):
            back = pickle.loads(ForkingPickler.dumps(t))
            self.assertEqual((type(back), back.shape, back.dtype, back.device), (type(t), t.shape, t.dtype, t.device))
        back = pickle.loads(ForkingPickler.dumps(torch.empty(0, dtype=torch.complex64, device="openreg").conj().imag))
        self.assertEqual((back.shape, back.is_neg(), back.dtype), ((0,), True, torch.float32))
        s = pickle.loads(ForkingPickler.dumps(torch.empty(0, device="openreg:1").untyped_storage()))
        self.assertEqual((s.nbytes(), s.device), (0, torch.device("openreg:1")))

    def test_sparse_and_nested_tensors_read_back_in_their_own_process(self):
        from multiprocessing.reduction import ForkingPickler

        x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]], device="openreg")
        for t in (x.to_sparse(), x.to_sparse_csr(), x.to_sparse_csc(), x.to_sparse_bsr((1, 1))):
            back = pickle.loads(ForkingPickler.dumps(t))
            self.assertEqual((back.layout, back.device, back.shape), (t.layout, t.device, t.shape))
            self.assertEqual(back.to_dense().cpu(), x.cpu())
        self.assertTrue(pickle.loads(ForkingPickler.dumps(x.to_sparse().coalesce())).is_coalesced())
        nested = torch.nested.nested_tensor([x[0], x[1, :2]])
        back = pickle.loads(ForkingPickler.dumps(nested))
        self.assertTrue(back.is_nested)
        self.assertEqual([p.cpu() for p in back.unbind()], [x[0].cpu(), x[1, :2].cpu()])

    def test_non_leaf_requiring_grad_is_refused_like_on_cpu(self):
        from multiprocessing.reduction import ForkingPickler

        x = torch.ones(2, device="openreg", requires_grad=True) * 2
        with self.assertRaisesRegex(RuntimeError, "Cowardly refusing to serialize non-leaf tensor"):
            ForkingPickler.dumps(x)
        # CPU tensors still take torch's own path (shared memory file descriptors).
        self.assertIn(b"rebuild_storage_fd", ForkingPickler.dumps(torch.ones(2)).tobytes())
