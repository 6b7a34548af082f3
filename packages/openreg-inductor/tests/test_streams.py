"""Asynchrony and streams, proven by the runtime's counters and a kernel that holds a stream:
compiled calls return while the device is busy, copy nothing between host and device, launch
exactly the generated kernels, run on the current (or in-region) stream and honour wait_stream.
Kernel failures surface at the next synchronisation, naming the kernel."""

import re

import torch
from conftest import hold_stream, release
from torch._inductor.utils import run_and_get_code
from torch.testing._internal.common_utils import TestCase, run_tests


def hold():
    """Holds the current stream until ``release`` is set; returns at once."""
    token = torch.zeros(1, device="openreg")
    if not getattr(hold, "warm", False):  # an op signature's first call is synchronous
        release.set()
        hold_stream(token)
        torch.openreg.synchronize()
        hold.warm = True
    release.clear()
    return hold_stream(token)


def launches_in(code: str) -> int:
    """Kernel launches in one run of generated code: calls of openreg launchers."""
    return len(re.findall(r"^\s*openreg_\w+\(raw_stream\w*, ", code, flags=re.M))


def chain(x, w):
    y = torch.softmax(x * 2 + 1, dim=-1)
    return y.sum(0) * w, (y - 1).abs().amax()


class TestAsynchrony(TestCase):
    def tearDown(self):
        release.set()
        super().tearDown()

    def test_call_returns_while_device_busy_without_copies(self):
        x, w = torch.randn(64, 100, device="openreg"), torch.randn(100, device="openreg")
        compiled = torch.compile(chain)
        _, (code,) = run_and_get_code(compiled, x, w)  # compile outside the measured call
        expected = chain(x.cpu(), w.cpu())
        held = hold()
        before = torch.openreg._runtime_counters()
        out = compiled(x, w)
        after = torch.openreg._runtime_counters()
        busy = not torch.openreg.current_stream().query()
        release.set()
        self.assertTrue(busy, "the compiled call waited for the device")
        self.assertEqual(after["memcpy_h2d"] - before["memcpy_h2d"], 0)
        self.assertEqual(after["memcpy_d2h"] - before["memcpy_d2h"], 0)
        self.assertGreaterEqual(launches_in(code), 1)
        self.assertEqual(after["kernels_launched"] - before["kernels_launched"], launches_in(code))
        self.assertEqual([t.cpu() for t in out], list(expected))
        del held

    def test_outer_side_stream(self):
        # A compiled call under `with torch.openreg.stream(s)` launches on s: it completes while
        # the default stream is held.
        s = torch.openreg.Stream()
        x = torch.randn(1000, device="openreg")
        compiled = torch.compile(lambda t: (t.exp() + 1).sum())
        expected = compiled(x).cpu()
        s.wait_stream(torch.openreg.default_stream())  # x's producer (before the hold)
        held = hold()
        with torch.openreg.stream(s):
            out = compiled(x)
            s.synchronize()
        self.assertFalse(torch.openreg.default_stream().query())
        with torch.openreg.stream(s):
            got = out.cpu()
        release.set()
        self.assertEqual(got, expected)
        del held

    def test_stream_context_inside_the_region(self):
        # The last kernel of this graph runs in the user's stream context; its call must stay
        # inside that context (torch 2.13 emits it after the guard: _torch213.WrapperFixes).
        s = torch.openreg.Stream()

        def f(x):
            y = x.sum()
            with s:
                z = x * 2 + y
            return z

        x = torch.randn(100, device="openreg")
        compiled = torch.compile(f, fullgraph=True)
        first = compiled(x)
        torch.openreg.synchronize()  # `first` was made on s: the default stream may not read it before
        expected = first.cpu()
        held = hold()  # the default stream is held
        out = compiled(x)
        with torch.openreg.stream(s):
            got = out.cpu()  # waits for s only: the kernel must have run there
        release.set()
        self.assertEqual(got, expected)
        del held

    def test_wait_stream_in_region(self):
        s = torch.openreg.Stream()

        def f(x):
            with s:
                z = x * 3
            torch.accelerator.current_stream().wait_stream(s)
            return z + 1

        x = torch.randn(100, device="openreg")
        compiled = torch.compile(f, fullgraph=True)
        compiled(x)
        torch.openreg.synchronize()
        with torch.openreg.stream(s):
            held = hold()  # s is held: z is not ready until released
        out = compiled(x)
        pending = not torch.openreg.default_stream().query()
        release.set()
        self.assertTrue(pending, "the default stream did not wait for s")
        self.assertEqual(out.cpu(), x.cpu() * 3 + 1)
        del held


class TestKernelFailures(TestCase):
    def test_integer_division_by_zero(self):
        f = torch.compile(lambda a, b: (a // b) + 1)
        a = torch.arange(10, device="openreg")
        f(a, torch.zeros(10, dtype=torch.int64, device="openreg"))  # returns: the error is asynchronous
        with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*ZeroDivisionError"):
            torch.openreg.synchronize()
        self.assertEqual(f(a, torch.ones_like(a)).cpu(), torch.arange(10) + 1)  # the device recovers

    def test_index_out_of_bounds(self):
        f = torch.compile(lambda w, i: w[i] * 2)
        f(torch.randn(5, device="openreg"), torch.tensor([1, 7], device="openreg"))
        with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*index out of bounds"):
            torch.openreg.synchronize()


if __name__ == "__main__":
    run_tests()
