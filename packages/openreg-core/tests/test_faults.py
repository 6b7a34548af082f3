"""Fault injection (OPENREG_FAULTS, torch.openreg._inject_faults): each fault surfaces as the
documented Python exception at the documented point, the device stays usable, memory statistics
return to their baseline, and other streams and devices are not affected.

Faults are armed at run time in this process (after the operators' first, synchronous calls);
what only the environment can do (arming at start-up, a malformed value) runs in a subprocess.
"""

import gc

import torch
from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests

MiB = 1 << 20


def handle(stream: torch.Stream) -> str:
    """A stream as a fault target: its runtime handle in hex."""
    return hex(stream.openreg_stream)


class FaultTestCase(TestCase):
    def setUp(self):
        super().setUp()
        self.addCleanup(torch.openreg._inject_faults, "")  # even when the test fails
        gc.collect()
        for d in (0, 1):
            torch.openreg.synchronize(d)
        self.baseline = [torch.openreg.memory_allocated(d) for d in (0, 1)]

    def assert_back_to_baseline(self):
        gc.collect()
        for d in (0, 1):
            torch.openreg.synchronize(d)  # no error left behind
            self.assertEqual(torch.openreg.memory_allocated(d), self.baseline[d], f"memory_allocated({d})")


class TestFaultInjection(FaultTestCase):
    def test_malformed_spec_is_refused_at_the_call(self):
        with self.assertRaisesRegex(RuntimeError, r"orErrorInvalidValue: clause 'alloc:0': '0' is not N or N:K"):
            torch.openreg._inject_faults("alloc:0")
        with self.assertRaisesRegex(RuntimeError, r"clause 'explode:1': unknown fault 'explode'.*expected comma"):
            torch.openreg._inject_faults("explode:1")
        self.assertEqual((torch.ones(3, device="openreg") * 2).cpu(), torch.full((3,), 2.0))

    def test_allocation_fails_with_out_of_memory_at_the_call(self):
        torch.openreg.empty_cache()  # the next large request needs a new segment (a device allocation)
        stats = torch.openreg.memory_stats(0)
        # The 1st device allocation on device 0 and the caching allocator's retry after it
        # released its cache: torch.OutOfMemoryError at the call.
        torch.openreg._inject_faults("alloc@0:1:2")
        on1 = torch.ones(64 * MiB // 4, device="openreg:1")  # device 1 is not counted
        with self.assertRaisesRegex(
            torch.OutOfMemoryError,
            r"openreg out of memory on device 0\. Tried to allocate 64\.00 MiB(.|\n)*"
            r"fault injected by OPENREG_FAULTS \(alloc@0:1:2\): allocation 2 on openreg device 0",
        ):
            torch.empty(64 * MiB, dtype=torch.uint8, device="openreg:0")
        after = torch.openreg.memory_stats(0)
        self.assertEqual(after["num_ooms"], stats["num_ooms"] + 1)
        self.assertEqual(after["num_alloc_retries"], stats["num_alloc_retries"] + 1)
        self.assertEqual(torch.openreg.memory_allocated(0), self.baseline[0])
        # The device stays usable: the 3rd allocation is not injected.
        x = torch.arange(16 * MiB, dtype=torch.float32).to("openreg:0")
        self.assertEqual(x.sum().item(), torch.arange(16 * MiB, dtype=torch.float32).sum().item())
        self.assertEqual(on1.sum().item(), 16 * MiB)
        del x, on1
        self.assert_back_to_baseline()

    def test_one_failed_allocation_is_absorbed_by_the_retry(self):
        torch.openreg.empty_cache()
        stats = torch.openreg.memory_stats(0)
        torch.openreg._inject_faults("alloc@0:1")
        x = torch.full((16 * MiB,), 3.0, device="openreg:0")
        after = torch.openreg.memory_stats(0)
        self.assertEqual(after["num_alloc_retries"], stats["num_alloc_retries"] + 1)
        self.assertEqual(after["num_ooms"], stats["num_ooms"])
        self.assertEqual(x[-4:].cpu(), torch.full((4,), 3.0))
        del x
        self.assert_back_to_baseline()

    def test_kernel_fails_at_the_next_synchronisation_naming_it(self):
        a = torch.randn(257, device="openreg:0")
        b = torch.randn(257, device="openreg:0")
        x1 = torch.randn(257, device="openreg:1")
        side = torch.openreg.Stream(device=0)
        for s in (torch.openreg.current_stream(0), side):  # first calls of the signatures
            side.wait_stream(torch.openreg.current_stream(0))
            with torch.openreg.stream(s):
                a * b
        x1 * x1
        for d in (0, 1):
            torch.openreg.synchronize(d)
        main = torch.openreg.current_stream(0)
        torch.openreg._inject_faults(f"kernel@{handle(main)}:aten::mul")
        bad = a * b  # queued; fails on the device, not here
        with torch.openreg.stream(side):
            good = a * b  # another stream of the same device: runs
        y1 = x1 * x1  # another device: runs, and reports nothing
        torch.openreg.synchronize(1)
        self.assertEqual(y1.cpu(), x1.cpu() * x1.cpu())
        with self.assertRaisesRegex(
            RuntimeError,
            r"kernel 'aten::mul' failed on openreg device 0: fault injected by OPENREG_FAULTS "
            rf"\(kernel@{handle(main)}:aten::mul\)",
        ):
            torch.openreg.synchronize(0)
        torch.openreg.synchronize(0)  # reported once
        self.assertEqual(good.cpu(), a.cpu() * b.cpu())
        # Once: the device and the stream work again.
        self.assertEqual((a * b).cpu(), a.cpu() * b.cpu())
        del bad, good, y1, a, b, x1
        self.assert_back_to_baseline()

    def failed_mul_then_pending_event(self, also=""):
        """A failed aten::mul on the current stream, and a block the caching allocator holds until an
        event recorded after it: the allocator's own wait for that event takes the kernel's error.
        `also`: more fault clauses, armed with the kernel's (nothing is allocated after arming);
        `{side}` in it is the side stream."""
        a = torch.randn(257, device="openreg:0")
        out, side_out = torch.empty_like(a), torch.empty_like(a)
        torch.mul(a, a, out=out)  # the signatures' first calls (synchronous)
        torch.add(a, a, out=side_out)
        used = torch.ones(4096, device="openreg:0")
        torch.openreg.synchronize(0)
        main = torch.openreg.current_stream(0)
        side = torch.openreg.Stream(device=0)
        also = also.format(side=handle(side))
        torch.openreg._inject_faults(",".join(filter(None, (f"kernel@{handle(main)}:aten::mul", also))))
        torch.mul(a, a, out=out)  # queued; fails on the device
        side.wait_stream(main)  # the event below completes after the failure
        with torch.openreg.stream(side):
            torch.add(a, a, out=side_out)  # a kernel a slow fault on the side stream delays
        used.record_stream(side)
        del used  # held until the side stream's event completes
        return a, out, side_out

    def test_empty_cache_reports_a_failed_kernel_once_its_caches_are_empty(self):
        # Its waits are synchronising calls: the failure is reported by empty_cache (as by a CUDA
        # program's), and the caches are emptied all the same. It was dropped by the pinned cache's
        # wait, and the device cache's left its cache half emptied.
        kept = self.failed_mul_then_pending_event()
        pinned = torch.ones(1024).pin_memory()
        on_device = pinned.to("openreg:0", non_blocking=True)  # the pinned block's use is an event
        del pinned
        with self.assertRaisesRegex(RuntimeError, r"kernel 'aten::mul' failed on openreg device 0"):
            torch.openreg.empty_cache()
        torch.openreg.synchronize(0)  # reported once
        reserved = torch.openreg.memory_reserved(0)
        counters = torch.openreg._runtime_counters()
        torch.openreg.empty_cache()  # nothing was left for a second call: no event, no block
        self.assertEqual(torch.openreg.memory_reserved(0), reserved)
        after = torch.openreg._runtime_counters()
        for key in ("events_destroyed", "device_frees"):
            self.assertEqual(after[key], counters[key], key)
        self.assertEqual(on_device.cpu(), torch.ones(1024))
        del kept, on_device
        self.assert_back_to_baseline()

    def test_pinned_cache_reports_a_failed_kernel(self):
        a = torch.randn(257, device="openreg:0")
        a * a
        torch.openreg.synchronize(0)
        pinned = torch.ones(1024).pin_memory()
        main = torch.openreg.current_stream(0)
        torch.openreg._inject_faults(f"kernel@{handle(main)}:aten::mul")
        a * a
        on_device = pinned.to("openreg:0", non_blocking=True)  # recorded after the failure
        del pinned
        with self.assertRaisesRegex(RuntimeError, r"kernel 'aten::mul' failed on openreg device 0"):
            torch.openreg.empty_cache()  # the pinned cache's wait for the copy took the failure
        torch.openreg.synchronize(0)  # reported once
        del a, on_device
        self.assert_back_to_baseline()

    def test_allocation_retry_reports_a_failed_kernel(self):
        # The retry after a failed device allocation waits for the cache's events: a synchronising
        # call, which reports the failure at the allocation (as cudaMalloc returns a sticky error).
        # The failure was dropped.
        torch.openreg.empty_cache()  # the large request below needs a new segment
        stats = torch.openreg.memory_stats(0)
        # The side stream is slowed down, so that its event is still pending at the retry (an
        # allocation first retires the events that completed, without waiting).
        kept = self.failed_mul_then_pending_event(also="alloc@0:1,slow@{side}:1500")
        with self.assertRaisesRegex(RuntimeError, r"kernel 'aten::mul' failed on openreg device 0"):
            torch.empty(64 * MiB, dtype=torch.uint8, device="openreg:0")
        after = torch.openreg.memory_stats(0)
        self.assertEqual(after["num_alloc_retries"], stats["num_alloc_retries"] + 1)
        self.assertEqual(after["num_ooms"], stats["num_ooms"])
        torch.openreg.synchronize(0)  # reported once
        x = torch.full((64 * MiB // 4,), 2.0, device="openreg:0")  # the device works
        self.assertEqual(x[-2:].cpu(), torch.full((2,), 2.0))
        del kept, x
        self.assert_back_to_baseline()

    def test_graph_reset_leaves_a_failed_kernel_to_the_next_synchronisation(self):
        x = torch.zeros(64, device="openreg")
        s = torch.openreg.Stream()
        warm_up = torch.randn(8, device="openreg")
        warm_up * warm_up
        s.wait_stream(torch.openreg.current_stream())
        with torch.openreg.stream(s):
            x.add_(1)
        s.synchronize()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            x.add_(1)
            g.capture_end()
        g.replay()
        main = torch.openreg.current_stream(0)
        torch.openreg._inject_faults(f"kernel@{handle(main)}:aten::mul")
        warm_up * warm_up  # fails on the device
        g.reset()  # waits for the replay: it took the failure and dropped it
        with self.assertRaisesRegex(RuntimeError, r"kernel 'aten::mul' failed on openreg device 0"):
            torch.openreg.synchronize(0)
        self.assertEqual(x.cpu(), torch.full((64,), 2.0))  # the warm-up's 1, then the replay's
        del x, warm_up
        self.assert_back_to_baseline()

    def test_copy_to_the_host_fails_at_the_call(self):
        x = torch.arange(1000.0, device="openreg:0")
        torch.openreg.synchronize(0)
        torch.openreg._inject_faults("copy@0:1")
        with self.assertRaisesRegex(
            RuntimeError,
            r"kernel 'openreg::memcpy' failed on openreg device 0: fault injected by OPENREG_FAULTS \(copy@0:1\)",
        ):
            x.cpu()  # a blocking copy synchronises, and so reports its own failure
        self.assertEqual(x.cpu(), torch.arange(1000.0))  # the next copy works
        del x
        self.assert_back_to_baseline()

    def test_copy_to_the_device_fails_at_the_next_synchronisation(self):
        host = torch.arange(1000.0)
        pinned = host.pin_memory()
        x = torch.zeros(1000, device="openreg:0")
        y = torch.zeros(1000, device="openreg:1")
        for d in (0, 1):
            torch.openreg.synchronize(d)
        torch.openreg._inject_faults("copy@0:1")
        y.copy_(host)  # device 1: copies
        x.copy_(pinned, non_blocking=True)  # returns: the copy fails on the device
        self.assertEqual(y.cpu(), host)
        with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg::memcpy' failed on openreg device 0"):
            torch.openreg.synchronize(0)
        self.assertEqual(x.cpu(), torch.zeros(1000))  # not written
        # From pageable memory the copy is done when the call returns (as on CUDA), and so reports its
        # failure there, non_blocking or not.
        torch.openreg._inject_faults("copy@0:1")
        with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg::memcpy' failed on openreg device 0"):
            x.copy_(host, non_blocking=True)
        torch.openreg.synchronize(0)  # reported once
        self.assertEqual(x.cpu(), torch.zeros(1000))
        x.copy_(host)
        self.assertEqual(x.cpu(), host)
        del x, y
        self.assert_back_to_baseline()

    def test_slow_stream_delays_only_that_stream(self):
        # No timing assumption: the slowed work waits a minute unless disarming ends the wait.
        x = torch.randn(1000, device="openreg:0")
        x1 = torch.randn(1000, device="openreg:1")
        slow = torch.openreg.Stream(device=0)
        other = torch.openreg.Stream(device=0)
        for s in (slow, other):
            s.wait_stream(torch.openreg.current_stream(0))
            with torch.openreg.stream(s):
                x * x, x + x  # first calls of the signatures run synchronously
        x1 + x1
        for d in (0, 1):
            torch.openreg.synchronize(d)
        torch.openreg._inject_faults(f"slow@{handle(slow)}:60000")
        with torch.openreg.stream(slow):
            late = x * x
        with torch.openreg.stream(other):
            soon = x + x
        on1 = x1 + x1
        other.synchronize()
        self.assertEqual(soon.cpu(), x.cpu() * 2)
        self.assertEqual(on1.cpu(), x1.cpu() * 2)
        self.assertFalse(slow.query())
        torch.openreg._inject_faults("")  # ends the wait
        slow.synchronize()
        self.assertEqual(late.cpu(), x.cpu() * x.cpu())
        del late, soon, on1, x, x1
        self.assert_back_to_baseline()

    def test_a_slow_stream_holds_back_only_the_blocks_it_used(self):
        # The allocator kept one queue of record_stream events for all streams and stopped at the
        # first pending one: a block used by a slow stream kept every block freed after it from
        # reuse, and each step took new memory (100 MiB for 50 steps of 2 MiB). One queue per
        # stream now, as CUDA's allocator keeps: the steps reuse one block.
        n = 2 * MiB // 4
        slow, fast = torch.openreg.Stream(), torch.openreg.Stream()
        x = torch.ones(n, device="openreg")
        for s in (slow, fast):
            s.wait_stream(torch.openreg.current_stream())
            with torch.openreg.stream(s):
                x * 2  # first calls of the signature run synchronously
        torch.openreg.synchronize()
        torch.openreg._inject_faults(f"slow@{handle(slow)}:60000")
        with torch.openreg.stream(slow):
            late = x * 2
        x.record_stream(slow)
        del x
        addresses = set()
        for _ in range(50):
            t = torch.ones(n, device="openreg")
            addresses.add(t.data_ptr())
            fast.wait_stream(torch.openreg.current_stream())
            with torch.openreg.stream(fast):
                t * 2
            t.record_stream(fast)
            del t
            fast.synchronize()  # the fast stream is done with the block before the next step
        self.assertFalse(slow.query())
        torch.openreg._inject_faults("")  # ends the wait
        slow.synchronize()
        self.assertLessEqual(len(addresses), 2)
        self.assertEqual(late.cpu(), torch.full((n,), 2.0))
        del late
        self.assert_back_to_baseline()


class TestFaultsFromEnvironment(TestCase):
    def test_armed_at_start_up(self):
        r = run_python(
            """
            import torch
            print("device 0:", torch.ones(4, device="openreg:0").sum().item())
            try:
                torch.ones(4, device="openreg:1")
            except torch.OutOfMemoryError as e:
                print("OOM:", str(e).splitlines()[-1])
            print("device 1:", torch.ones(4, device="openreg:1").sum().item())
            """,
            env={"OPENREG_FAULTS": "alloc@1:1:2"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("device 0: 4.0", r.stdout)
        self.assertIn("fault injected by OPENREG_FAULTS (alloc@1:1:2): allocation 2 on openreg device 1", r.stdout)
        self.assertIn("device 1: 4.0", r.stdout)

    def test_malformed_value_is_named(self):
        r = run_python(
            """
            import torch
            try:
                torch.ones(1, device="openreg")
            except RuntimeError as e:
                print(e)
            """,
            env={"OPENREG_FAULTS": "slow@0:soon"},
        )
        self.assertIn(
            "No openreg device is available: orErrorInitialization: OPENREG_FAULTS='slow@0:soon' is malformed: "
            "clause 'slow@0:soon': 'soon' is not a whole number of milliseconds",
            r.stdout,
        )


if __name__ == "__main__":
    run_tests()
