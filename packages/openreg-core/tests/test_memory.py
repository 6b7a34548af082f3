"""The caching device allocator, its statistics, out of memory, and pinned host memory."""

import gc
import threading

import torch
from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import StreamHold

MiB = 1 << 20


class TestCachingAllocator(TestCase):
    def test_allocated_returns_to_baseline(self):
        gc.collect()
        base = torch.openreg.memory_allocated()
        for i in range(200):
            t = torch.empty(1000 + i * 37, device="openreg")
            u = t * 2
            del t, u
        self.assertEqual(torch.openreg.memory_allocated(), base)
        kept = [torch.empty(256 * 1024, device="openreg") for _ in range(4)]
        self.assertEqual(torch.openreg.memory_allocated(), base + 4 * MiB)
        del kept
        self.assertEqual(torch.openreg.memory_allocated(), base)

    def test_blocks_are_reused_and_cache_emptied(self):
        torch.openreg.empty_cache()
        held = torch.openreg.memory_reserved()  # segments of tensors other tests still hold
        x = torch.empty(MiB, device="openreg")  # 4 MiB: large pool
        reserved = torch.openreg.memory_reserved()
        ptr = x.data_ptr()
        del x
        self.assertEqual(torch.openreg.memory_reserved(), reserved)  # cached, not freed
        y = torch.empty(MiB, device="openreg")
        self.assertEqual(y.data_ptr(), ptr)
        del y
        torch.openreg.empty_cache()
        self.assertEqual(torch.openreg.memory_reserved(), held)

    def test_split_blocks_are_reused_and_merge_back(self):
        # A fresh process: its pools hold no blocks of other tests, so addresses are predictable.
        r = run_python(
            """
            import torch
            KiB, MiB = 1024, 1 << 20

            def blocks(base):
                seg = next(s for s in torch.openreg.memory_snapshot() if s["address"] == base)
                assert seg["total_size"] == 2 * MiB
                return [(b["state"], b["size"] // KiB) for b in seg["blocks"]]

            a = torch.empty(64 * KiB, device="openreg")  # 256 KiB split from a new 2 MiB segment
            base = a.data_ptr()
            del a
            b = torch.empty(64 * KiB, device="openreg")  # the same size again: the same block
            c = torch.empty(64 * KiB, device="openreg")  # split from the rest of the segment
            print("b c", b.data_ptr() - base, c.data_ptr() - base)
            print("live", blocks(base))
            del b
            print("b freed", blocks(base))
            del c
            print("both freed", blocks(base), torch.openreg.memory_stats()["active_bytes.all.current"])
            reserved = torch.openreg.memory_reserved()
            d = torch.empty(192 * KiB, device="openreg")  # 768 KiB: from the merged block
            print("d", d.data_ptr() - base, torch.openreg.memory_reserved() == reserved, blocks(base))
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.splitlines(),
            [
                "b c 0 262144",
                "live [('active_allocated', 256), ('active_allocated', 256), ('inactive', 1536)]",
                "b freed [('inactive', 256), ('active_allocated', 256), ('inactive', 1536)]",
                "both freed [('inactive', 2048)] 0",
                "d 0 True [('active_allocated', 768), ('inactive', 1280)]",
            ],
        )

    def test_stats_and_peaks(self):
        torch.openreg.empty_cache()
        torch.openreg.reset_peak_memory_stats()
        base = torch.openreg.memory_allocated()
        x = torch.empty(2 * MiB, device="openreg")
        self.assertEqual(torch.openreg.max_memory_allocated(), base + 8 * MiB)
        del x
        self.assertEqual(torch.openreg.max_memory_allocated(), base + 8 * MiB)
        torch.openreg.reset_peak_memory_stats()
        self.assertEqual(torch.openreg.max_memory_allocated(), base)
        stats = torch.openreg.memory_stats()
        self.assertIn("allocated_bytes.all.current", stats)
        self.assertIn("reserved_bytes.large_pool.peak", stats)
        self.assertGreaterEqual(torch.openreg.max_memory_reserved(), torch.openreg.memory_reserved())

    def test_reset_peak_recounts_the_inactive_splits_first(self):
        # The inactive-split counts are recounted when read: a reset must recount them first, or
        # their peaks keep the count of the last read (here a split segment since released).
        torch.openreg.empty_cache()
        a = torch.empty(1000, dtype=torch.uint8, device="openreg")  # splits a small segment
        self.assertEqual(torch.openreg.memory_stats()["inactive_split.all.current"], 1)
        del a
        torch.openreg.empty_cache()
        torch.openreg.reset_peak_memory_stats()
        stats = torch.openreg.memory_stats()
        for key in ("inactive_split.all", "inactive_split_bytes.all"):
            self.assertEqual((stats[key + ".current"], stats[key + ".peak"]), (0, 0), key)
        torch.openreg.reset_accumulated_memory_stats()
        stats = torch.openreg.memory_stats()
        self.assertEqual((stats["inactive_split.all.allocated"], stats["inactive_split.all.freed"]), (0, 0))

    def test_profiler_records_device_memory(self):
        # As CUDA's allocator: torch.profiler(profile_memory=True) sees each allocation and free.
        from torch.profiler import ProfilerActivity, profile

        torch.openreg.empty_cache()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
            x = torch.empty(MiB, device="openreg:1")
            del x
        empty = {e.key: e for e in prof.key_averages()}["aten::empty"]
        self.assertEqual((empty.device_memory_usage, empty.cpu_memory_usage), (4 * MiB, 0))
        # The free happens outside any operator: a "[memory]" record of its own.
        records = [e for e in prof.events() if e.name == "[memory]"]
        self.assertEqual([e.device_memory_usage for e in records], [-4 * MiB])
        # Outside a profile nothing is recorded, and allocations work as before.
        self.assertEqual(torch.ones(3, device="openreg").sum().item(), 3.0)

    def test_accelerator_memory_api(self):
        base = torch.accelerator.memory_allocated()
        x = torch.empty(MiB, device="openreg")
        self.assertEqual(torch.accelerator.memory_allocated(), base + 4 * MiB)
        self.assertEqual(torch.accelerator.memory_stats()["allocated_bytes.all.current"], base + 4 * MiB)
        del x

    def test_snapshot(self):
        x = torch.empty(100, device="openreg")
        segs = torch.openreg.memory_snapshot()
        self.assertTrue(any(b["state"] == "active_allocated" for s in segs for b in s["blocks"]))
        self.assertTrue(all(s["total_size"] == sum(b["size"] for b in s["blocks"]) for s in segs))
        del x

    def test_record_stream_delays_reuse(self):
        s = torch.openreg.Stream()
        x = torch.empty(256, 256, device="openreg")
        ptr = x.data_ptr()
        with torch.openreg.stream(s):
            a = torch.randn(384, 384, device="openreg")
            for _ in range(8):
                a = a @ a / 384
            x.record_stream(s)
        del x
        y = torch.empty(256, 256, device="openreg")
        self.assertNotEqual(y.data_ptr(), ptr)  # s may still use the old block
        s.synchronize()
        del a

    def test_out_of_memory(self):
        r = run_python(
            """
            import torch
            keep = torch.empty(16 << 20, dtype=torch.uint8, device="openreg")
            try:
                torch.empty(64 << 20, dtype=torch.uint8, device="openreg")
            except torch.OutOfMemoryError as e:
                print("OOM:", e)
            print("after:", (torch.ones(4, device="openreg") * 2).sum().item(), torch.openreg.memory_allocated())
            """,
            env={"OPENREG_DEVICE_MEMORY": "48M"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("OOM: openreg out of memory on device 0. Tried to allocate 64.00 MiB", r.stdout)
        self.assertIn("Device capacity 48.00 MiB", r.stdout)
        self.assertIn("16.00 MiB allocated by PyTorch", r.stdout)
        self.assertIn("after: 8.0 16777216", r.stdout)

    def test_cache_releases_wait_without_the_cache_lock(self):
        # empty_cache() and the out-of-memory retry wait for the device. They did so holding the
        # device cache's lock, while a thread freeing or allocating a storage (which keeps the GIL)
        # waited for that lock and a queued kernel written in Python waited for the GIL: a deadlock.
        r = run_python(
            """
            import faulthandler, threading, time, torch
            MiB = 1 << 20

            @torch.library.custom_op("memtest::slow", mutates_args=(), device_types="cpu")
            def slow(x: torch.Tensor) -> torch.Tensor:
                time.sleep(0.3)  # the GIL is released while it sleeps and needed again to return
                return x.clone()

            @slow.register_fake
            def _(x):
                return torch.empty_like(x)

            x = torch.ones(4, device="openreg")
            slow(x).cpu()  # a signature's first call is synchronous
            faulthandler.dump_traceback_later(60, exit=True)  # a deadlock fails the test, not the run

            def race(release):
                victim = torch.UntypedStorage(4000, device="openreg")
                y = slow(x)  # queued: runs on the stream's worker for 0.3 s
                t = threading.Thread(target=release)
                t.start()
                time.sleep(0.1)
                del victim  # needs the cache's lock, with the GIL held
                t.join()
                return y.cpu().tolist()

            big = torch.empty(8 * MiB, dtype=torch.uint8, device="openreg")
            del big  # a cached segment for empty_cache to give back
            print("empty_cache:", race(torch.openreg.empty_cache), torch.openreg.memory_reserved() < 8 * MiB)

            s = torch.openreg.Stream()
            with torch.openreg.stream(s):
                cached = torch.empty(30 * MiB, dtype=torch.uint8, device="openreg")
            del cached  # in s's pool: only the retry of an allocation that finds the device full frees it
            got = []
            print("retry:", race(lambda: got.append(torch.empty(30 * MiB, dtype=torch.uint8, device="openreg"))),
                  torch.openreg.memory_stats()["num_alloc_retries"], got[0].numel() == 30 * MiB)
            """,
            env={"OPENREG_DEVICE_MEMORY": "48M"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.splitlines(), ["empty_cache: [1.0, 1.0, 1.0, 1.0] True", "retry: [1.0, 1.0, 1.0, 1.0] 1 True"]
        )

    def test_empty_cache_from_a_kernel_releases_nothing(self):
        # A custom operator's body runs on a stream's worker; giving memory back there waits for
        # every device, its own stream included, which the runtime refuses: the segments and pinned
        # blocks had been taken out of the caches first, and were lost for the process.
        @torch.library.custom_op("memtest::empties", mutates_args=(), device_types="cpu")
        def empties(x: torch.Tensor) -> torch.Tensor:
            torch.openreg.empty_cache()
            return x + 1

        @empties.register_fake
        def _(x):
            return torch.empty_like(x)

        x = torch.ones(4, device="openreg")
        pinned = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
        pinned_ptr = pinned.data_ptr()
        del pinned  # cached by the host allocator
        big = torch.empty(16 << 20, dtype=torch.uint8, device="openreg")
        del big  # a cached segment
        torch.openreg.synchronize()
        free, total = torch.openreg.mem_get_info()
        reserved = torch.openreg.memory_reserved()
        for _ in range(2):  # a signature's first call is synchronous, the second queued
            self.assertEqual(empties(x).cpu().tolist(), [2.0] * 4)
        self.assertEqual((torch.openreg.mem_get_info()[0], torch.openreg.memory_reserved()), (free, reserved))
        again = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
        self.assertEqual(again.data_ptr(), pinned_ptr)  # still cached, not lost
        del again
        torch.openreg.empty_cache()  # on the host: released
        self.assertEqual(torch.openreg.mem_get_info()[0] + torch.openreg.memory_reserved(), free + reserved)
        self.assertLess(torch.openreg.memory_reserved(), reserved)

    def test_out_of_memory_beyond_the_capacity_names_the_request(self):
        # The runtime clamps a request beyond the device's capacity before it looks for a block:
        # its part of the message named the clamped size (8192.00 MiB for a 1 TiB request).
        with self.assertRaises(torch.OutOfMemoryError) as caught:
            torch.empty(1 << 40, dtype=torch.uint8, device="openreg")
        message = str(caught.exception)
        self.assertIn("Tried to allocate 1024.00 GiB", message)
        self.assertIn("tried to allocate 1048576.00 MiB", message)
        self.assertEqual((torch.ones(4, device="openreg") * 2).sum().item(), 8.0)

    def test_out_of_memory_names_the_request_before_its_rounding(self):
        # It named the rounded block as the request ("for a request of 0.50 KiB" for 40 bytes).
        torch._C._accelerator_setAllocatorSettings("roundup_power2_divisions:4")
        try:
            with self.assertRaises(torch.OutOfMemoryError) as caught:
                torch.empty(int(1.2 * (1 << 40)), dtype=torch.uint8, device="openreg")
        finally:
            torch._C._accelerator_setAllocatorSettings("roundup_power2_divisions:1")  # none, the default
        self.assertIn("Tried to allocate 1280.00 GiB (for a request of 1228.80 GiB)", str(caught.exception))


class TestAllocatorSettings(TestCase):
    """PYTORCH_ALLOC_CONF, which torch parses for every accelerator (AcceleratorAllocatorConfig), and
    torch._C._accelerator_setAllocatorSettings, which changes it at run time: openreg's allocator
    follows the settings CUDA's does (it read none of them)."""

    PROBE = """
        import torch, warnings
        warnings.simplefilter("always")
        MiB = 1 << 20
        o = torch.openreg

        def state(label):
            s = o.memory_stats()
            print(label, s["max_split_size"], s["oversize_allocations.current"], s["oversize_segments.current"],
                  o.memory_reserved() // MiB, o.memory_allocated())

        def empty(n):
            return torch.empty(n, dtype=torch.uint8, device="openreg")

        a = empty(100 * MiB)
        state("a")
        del a
        b = empty(10 * MiB)  # not from the cached 100 MiB block when that is above max_split_size
        state("b")
        c = empty(90 * MiB)  # the cached 100 MiB block, whole (within max_non_split_rounding, 20 MiB)
        state("c")
        del c
        d = empty(70 * MiB)  # not the 100 MiB block: 30 MiB more than asked
        state("d")
        del b, d
        o.empty_cache()
        state("empty")
        e = empty(1258291)  # 1.2 MiB
        print("rounded", o.memory_allocated())
    """

    def run_with(self, conf, code=PROBE):
        r = run_python(code, env={"PYTORCH_ALLOC_CONF": conf})
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.splitlines(), r.stderr

    def test_defaults_split_and_round_to_512_bytes(self):
        lines, stderr = self.run_with("")
        MiB = 1 << 20
        self.assertEqual(
            lines,
            [
                f"a -1 0 0 100 {100 * MiB}",  # max_split_size -1: none, as CUDA reports it
                f"b -1 0 0 100 {10 * MiB}",  # split from the cached 100 MiB block
                f"c -1 0 0 100 {100 * MiB}",
                f"d -1 0 0 100 {80 * MiB}",  # with b
                "empty -1 0 0 0 0",
                "rounded 1258496",
            ],
        )
        self.assertNotIn("Warning", stderr)

    def test_max_split_size(self):
        lines, _ = self.run_with("max_split_size_mb:64")
        MiB = 1 << 20
        self.assertEqual(
            lines,
            [
                f"a {64 * MiB} 1 1 100 {100 * MiB}",
                f"b {64 * MiB} 0 1 110 {10 * MiB}",  # a segment of its own
                f"c {64 * MiB} 1 1 110 {110 * MiB}",  # the whole 100 MiB block, not split
                f"d {64 * MiB} 1 2 180 {80 * MiB}",
                f"empty {64 * MiB} 0 0 0 0",
                "rounded 1258496",
            ],
        )

    def test_peak_and_accumulated_oversize_counts_reset(self):
        code = """
            import torch
            t = torch.empty(100 << 20, dtype=torch.uint8, device="openreg")
            del t
            torch.openreg.reset_peak_memory_stats()
            torch.openreg.reset_accumulated_memory_stats()
            s = torch.openreg.memory_stats()
            print([s[f"oversize_{k}.{f}"] for k in ("allocations", "segments") for f in ("peak", "allocated", "freed")])
        """
        lines, _ = self.run_with("max_split_size_mb:64", code)
        self.assertEqual(lines, ["[0, 0, 0, 1, 0, 0]"])  # the cached segment is still current: its peak

    def test_roundup_power2_divisions(self):
        lines, _ = self.run_with("roundup_power2_divisions:4")
        MiB = 1 << 20
        # 100 MiB: the next quarter step between 64 and 128 MiB; 1.2 MiB: between 1 and 2 MiB.
        self.assertEqual(lines[0], f"a -1 0 0 112 {112 * MiB}")
        self.assertEqual(lines[-1], f"rounded {MiB + MiB // 4}")

    def test_settings_changed_at_run_time(self):
        code = """
            import torch
            MiB = 1 << 20
            a = torch.empty(100 * MiB, dtype=torch.uint8, device="openreg")
            del a
            torch._C._accelerator_setAllocatorSettings("max_split_size_mb:64")
            b = torch.empty(10 * MiB, dtype=torch.uint8, device="openreg")
            print(torch.openreg.memory_reserved() // MiB, torch.openreg.memory_stats()["max_split_size"] // MiB)
        """
        lines, _ = self.run_with("", code)
        self.assertEqual(lines, ["110 64"])

    def test_unimplemented_settings_warn_once(self):
        code = """
            import torch, warnings
            warnings.simplefilter("always")
            for _ in range(2):
                torch.empty(30 << 20, dtype=torch.uint8, device="openreg")  # a new segment each time
        """
        _, stderr = self.run_with("expandable_segments:True,garbage_collection_threshold:0.5", code)
        for setting in ("garbage_collection_threshold", "expandable_segments (it has none)"):
            self.assertEqual(stderr.count(f"openreg's allocator ignores PYTORCH_ALLOC_CONF's {setting}"), 1, stderr)


class TestNegativeSizes(TestCase):
    def test_a_negative_storage_size_is_refused(self):
        # It arrived as a huge size_t whose rounding overflowed: a 0-byte block at the address of the
        # next allocation, a write through it overwrote another tensor, and the frees aborted.
        message = "called with (a )?negative number"
        for device in ("cpu", "openreg"):
            with self.subTest(device):
                with self.assertRaisesRegex(RuntimeError, message):
                    torch.UntypedStorage(-1, device=device)
                storage = torch.zeros(4, device=device).untyped_storage()
                with self.assertRaisesRegex(RuntimeError, message):
                    storage.resize_(-1)
                self.assertEqual(storage.nbytes(), 16)  # unchanged
        pinned = torch.zeros(4, pin_memory=True).untyped_storage()  # openreg's host allocator: it hung
        with self.assertRaisesRegex(RuntimeError, message):
            pinned.resize_(-1)
        self.assertEqual(pinned.nbytes(), 16)
        t = torch.zeros(4, device="openreg")
        self.assertEqual((t + 1).cpu(), torch.ones(4))


class TestPinnedMemory(TestCase):
    def test_pin_memory(self):
        t = torch.randn(1000)
        self.assertFalse(t.is_pinned())
        p = t.pin_memory()
        self.assertTrue(p.is_pinned())
        self.assertEqual(p, t)

    def test_non_blocking_copies(self):
        host = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
        d = host.to("openreg", non_blocking=True)
        back = torch.empty_like(host).pin_memory()
        back.copy_(d, non_blocking=True)
        torch.openreg.current_stream().synchronize()
        self.assertEqual(back, host)

    def test_a_reused_pinned_buffer_holds_one_event_per_stream(self):
        # Each non-blocking copy from a pinned block recorded a new runtime event, kept until the
        # block was freed and reused: a staging buffer reused 2^20 times filled the runtime's event
        # table, and from then on every event creation in the process failed. The block now keeps
        # one event per stream it is used on at once, recorded again at each use.
        torch.openreg.empty_cache()  # no cached pinned block: the reuse below finds staging's
        staging, dst = torch.ones(16).pin_memory(), torch.empty(16, device="openreg")
        side = torch.openreg.Stream()
        torch.openreg.synchronize()
        before = torch.openreg._runtime_counters()
        for i in range(300):
            staging.fill_(i)
            with torch.openreg.stream(side if i % 2 else torch.openreg.default_stream()):
                dst.copy_(staging, non_blocking=True)
                torch.openreg.current_stream().synchronize()  # the next fill_ must not race the copy
            self.assertEqual(dst.cpu()[0].item(), i)
        after = torch.openreg._runtime_counters()
        # each copy was over when the other stream's began: the two streams took turns with one event
        self.assertEqual(after["events_created"] - before["events_created"], 1)
        # in flight on both streams at once: one event each
        with StreamHold():  # the current (default) stream's copy stays queued
            dst.copy_(staging, non_blocking=True)
            with torch.openreg.stream(side):
                dst.copy_(staging, non_blocking=True)
        torch.openreg.synchronize()
        after = torch.openreg._runtime_counters()
        self.assertEqual(after["events_created"] - before["events_created"], 2)
        ptr = staging.data_ptr()
        del staging
        # freed, then reused by a pinned allocation of its size: its events are done and destroyed
        self.assertEqual(torch.empty(16).pin_memory().data_ptr(), ptr)
        self.assertEqual(torch.openreg._runtime_counters()["events_destroyed"] - before["events_destroyed"], 2)

    def test_a_tensor_over_pinned_memory_keeps_its_block_in_use(self):
        # A tensor made over pinned memory it does not own (torch.from_numpy(pinned.numpy())) is
        # pinned, so its non-blocking copies are queued; the block was only looked up by the
        # storage's context, which is numpy's here: no event was recorded, and once the owner was
        # freed the block went to the next pinned allocation while the copy still read or wrote it.
        n = 1 << 16
        p = torch.full((n,), 1.0).pin_memory()
        alias = torch.from_numpy(p.numpy())
        self.assertTrue(alias.is_pinned())
        with StreamHold():  # the copy stays queued
            d = alias.to("openreg", non_blocking=True)
            ptr = p.data_ptr()
            del alias, p
            q = torch.empty(n).pin_memory()  # of the freed block's size
            self.assertNotEqual(q.data_ptr(), ptr)  # the block still has a queued copy
            q.fill_(2.0)
        self.assertEqual(d.cpu(), torch.ones(n))
        # Device to host: the queued copy writes the block.
        src = torch.full((n,), 3.0, device="openreg")
        p = torch.empty(n).pin_memory()
        alias = torch.from_numpy(p.numpy())
        with StreamHold():
            alias.copy_(src, non_blocking=True)
            ptr = p.data_ptr()
            del alias, p
            q = torch.zeros(n).pin_memory()
            self.assertNotEqual(q.data_ptr(), ptr)
        torch.openreg.synchronize()
        self.assertEqual(q, torch.zeros(n))

    def test_empty_host_cache_lets_queued_kernels_pin_memory(self):
        # empty_host_cache() waited for the cached blocks' copies holding the allocator's lock: a
        # kernel queued before such a copy that pins memory (a custom operator written in Python)
        # waited for the lock, and neither ever ended.
        r = run_python(
            """
            import ctypes, os, threading, time, torch

            @torch.library.custom_op("pin_test::stage", mutates_args=(), device_types="cpu")
            def stage(x: torch.Tensor) -> torch.Tensor:
                time.sleep(0.2)
                return torch.empty(x.shape, pin_memory=True).copy_(x) + 1

            @stage.register_fake
            def _(x):
                return torch.empty_like(x)

            x = torch.zeros(4, device="openreg")
            stage(x).cpu()  # a signature's first call is synchronous
            p = torch.ones(1024).pin_memory()
            y = stage(x)  # queued: it will pin memory
            d = p.to("openreg", non_blocking=True)  # queued behind it: p's block records an event
            del p  # cached, its copy pending
            t = threading.Thread(target=torch.accelerator.empty_host_cache, daemon=True)
            t.start()
            t.join(30)
            print("hung" if t.is_alive() else y.cpu().tolist(), d.cpu().sum().item(), flush=True)
            # A copy over pinned memory that is no block in use (its owner freed) waits for its
            # stream: it did so holding the same lock.
            q = torch.ones(1024).pin_memory()
            alias = torch.frombuffer((ctypes.c_float * 1024).from_address(q.data_ptr()), dtype=torch.float32)
            del q
            y = stage(x)
            t = threading.Thread(target=lambda: alias.to("openreg", non_blocking=True), daemon=True)
            t.start()
            t.join(30)
            print("hung" if t.is_alive() else "returned", flush=True)
            os._exit(0)
            """,
            timeout=90,
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "[1.0, 1.0, 1.0, 1.0] 1024.0")
        self.assertEqual(lines[1], "returned")

    def test_non_blocking_h2d_is_asynchronous(self):
        host = torch.ones(4 << 20).pin_memory()
        s = torch.openreg.current_stream()
        with StreamHold():  # a copy that waited would block until the hold times out
            d = host.to("openreg", non_blocking=True)
            self.assertFalse(s.query())  # the copy is queued behind the held kernel
        self.assertEqual(d.sum().item(), float(4 << 20))


class TestBlockingCopies(TestCase):
    def test_small_copies_on_an_idle_stream_run_on_the_caller(self):
        # .cpu(), .item() and a pageable host-to-device copy that find the stream idle run on the
        # calling thread: no wake-up of the stream's worker, then of the caller (about 50 us each on
        # the 2-core VM once the worker sleeps; the copies themselves take about 2 us).
        x = torch.arange(16.0, device="openreg")
        (x + 1).cpu()  # the signature's first call, made before the hold below
        torch.openreg.synchronize()
        before = torch.openreg._runtime_counters()
        self.assertEqual(x.cpu(), torch.arange(16.0))
        self.assertEqual(x[5].item(), 5.0)
        y = torch.tensor([1.5, 2.5]).to("openreg")
        after = torch.openreg._runtime_counters()
        self.assertEqual(after["memcpy_on_caller"] - before["memcpy_on_caller"], 3)
        self.assertEqual(after["wait_wakeups"], before["wait_wakeups"])
        self.assertEqual(y.cpu(), torch.tensor([1.5, 2.5]))
        # A busy stream: the copy waits behind the queued work, in stream order.
        with StreamHold() as held:
            z = x + 1  # queued behind the held kernel
            threading.Timer(1.0, held.release).start()  # the copy must find the stream still held
            before = torch.openreg._runtime_counters()
            self.assertEqual(z.cpu(), torch.arange(16.0) + 1)
            after = torch.openreg._runtime_counters()
        self.assertEqual(after["memcpy_on_caller"], before["memcpy_on_caller"])


if __name__ == "__main__":
    run_tests()
