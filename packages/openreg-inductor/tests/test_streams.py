"""Asynchrony and streams, proven by the runtime's counters and a kernel that holds a stream:
compiled calls return while the device is busy, copy nothing between host and device, launch
exactly the generated kernels, run on the current (or in-region) stream and honour wait_stream.
Kernel failures surface at the next synchronisation, naming the kernel."""

import re
import threading

import torch
import torch._dynamo.testing
from conftest import hold_stream, release
from torch._inductor.utils import run_and_get_code
from torch.testing._internal.common_utils import TestCase, run_tests


def hold():
    """Holds the current stream (of the current device) until ``release`` is set; returns at once."""
    token = torch.zeros(1, device="openreg")
    warm = hold.__dict__.setdefault("warm", set())
    if token.device not in warm:  # an op signature's first call on a device is synchronous
        release.set()
        hold_stream(token)
        torch.openreg.synchronize()
        warm.add(token.device)
    release.clear()
    return hold_stream(token)


def call_while_held(fn, *args):
    """Calls ``fn(*args)`` while the current stream is held: returns its output, whether the stream
    was still busy when the call returned, and what the runtime's counters counted during the call."""
    held = hold()
    before = torch.openreg._runtime_counters()
    out = fn(*args)
    after = torch.openreg._runtime_counters()
    busy = not torch.openreg.current_stream().query()
    release.set()
    del held
    return out, busy, {name: after[name] - before[name] for name in after}


# A call of an openreg launcher in generated code.
LAUNCH_LINE = re.compile(r"^\s*openreg_\w+\(raw_stream\w*, ", flags=re.M)


def launches_in(code: str) -> int:
    """Kernel launches in one run of generated code: calls of openreg launchers."""
    return len(LAUNCH_LINE.findall(code))


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
        out, busy, counted = call_while_held(compiled, x, w)
        self.assertTrue(busy, "the compiled call waited for the device")
        self.assertEqual(counted["memcpy_h2d"], 0)
        self.assertEqual(counted["memcpy_d2h"], 0)
        self.assertGreaterEqual(launches_in(code), 1)
        self.assertEqual(counted["kernels_launched"], launches_in(code))
        self.assertEqual([t.cpu() for t in out], list(expected))

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
        # The last kernel of this graph runs in a user's stream context; its call must stay
        # inside that context (torch 2.13 emits it after the guard: _torch213.WrapperFixes).
        # Nothing in the region waits for the current stream, which is held: a kernel launched
        # there instead of on s2 has not run when s2's work is done.
        s1, s2 = torch.openreg.Stream(), torch.openreg.Stream()

        def f(x):
            with s1:
                y = x.sum()
            s2.wait_stream(s1)
            with s2:
                z = x * 2 + y
            return z

        compiled = torch.compile(f, fullgraph=True)
        compiled(torch.randn(100, device="openreg"))
        x = torch.randn(100, device="openreg")  # not the values the first call's buffers hold
        s1.wait_stream(torch.openreg.current_stream())  # x's producer (before the hold)
        held = hold()  # the current stream is held
        out = compiled(x)
        with torch.openreg.stream(s2):
            got = out.cpu()  # waits for s2 only: the kernel must have run there
        release.set()
        self.assertEqual(got, x.cpu() * 2 + x.cpu().sum(), rtol=1e-4, atol=1e-4)
        del held

    def test_a_stream_context_is_part_of_the_graph_cache_key(self):
        # The same operations inside a stream context and outside one are different entries of
        # Inductor's FX-graph cache (_torch213.py, workaround 14). Outside after inside, the cached
        # code looked up the first call's stream (AssertionError "Index not registered in
        # index_to_user_object_weakref"); inside after outside, the kernel ran on the current stream.
        # Constants of their own keep these graphs apart from other tests' in the shared cache.
        s = torch.openreg.Stream()

        def inside(x):
            with s:
                y = x * 3.0625 + 0.8125
            return y

        def outside(x):
            return x * 3.0625 + 0.8125

        def inside2(x):
            with s:
                y = x * 5.0625 - 0.4375
            return y

        def outside2(x):
            return x * 5.0625 - 0.4375

        x = torch.randn(64, device="openreg")
        want = x.cpu()
        with torch._inductor.config.patch(fx_graph_cache=True):
            torch.compile(inside, fullgraph=True)(x)
            s.synchronize()
            torch._dynamo.reset()
            self.assertEqual(torch.compile(outside, fullgraph=True)(x).cpu(), want * 3.0625 + 0.8125)
            torch._dynamo.reset()
            torch.compile(outside2, fullgraph=True)(x)
            torch._dynamo.reset()
            compiled = torch.compile(inside2, fullgraph=True)
            compiled(x)
            s.wait_stream(torch.openreg.current_stream())  # x's producer (before the hold)
            held = hold()  # the current stream is held: a kernel launched there has not run
            out = compiled(x)
            with torch.openreg.stream(s):
                got = out.cpu()  # waits for s only
            release.set()
            del held
        self.assertEqual(got, want * 5.0625 - 0.4375)

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

    def test_wait_stream_for_a_device_that_is_not_current(self):
        # openreg:0 is current, everything else is on openreg:1: the traced wait must be on
        # openreg:1's current stream (workaround 17), not on openreg:0's.
        s1 = torch.openreg.Stream(device=1)

        def f(x):
            with s1:
                z = x * 3
            torch.accelerator.current_stream(1).wait_stream(s1)
            return z + 1

        x = torch.randn(1000, device="openreg:1")
        compiled = torch.compile(f, fullgraph=True)
        self.assertEqual(compiled(x).cpu(), x.cpu() * 3 + 1)
        self.assertEqual(torch.openreg.current_device(), 0)
        with torch.openreg.stream(s1):  # makes openreg:1 current
            held = hold()  # s1 is held: z is not written until released
        side = torch.openreg.Stream(device=1)
        with torch.openreg.stream(side):  # current at the call: the wait is looked up then
            out = compiled(x)
        states = {
            "side": side.query(),
            "openreg:1 default": torch.openreg.default_stream(1).query(),
            "openreg:0": torch.openreg.default_stream(0).query(),
        }
        release.set()
        side.synchronize()  # out was written on side
        self.assertEqual(states, {"side": False, "openreg:1 default": True, "openreg:0": True})
        self.assertEqual(out.cpu(), x.cpu() * 3 + 1)
        del held


class TestCrossStreamBuffers(TestCase):
    """A buffer made on one stream and read by a kernel on another at its last use. Inductor frees
    it right there (``del buf0``) and torch 2.13 may give its memory to the next buffer of the graph
    (``buf4 = buf0  # reuse``), while the reading stream can still be behind: the caching allocator
    then hands the block to the other stream's next allocation. Eager code keeps the tensor until the
    function returns. The wrapper records such a buffer on the streams that use it before freeing
    it and never reuses it (codegen/wrapper.py, ``_CrossStreamBuffers``)."""

    N = 768  # 2.25 MiB: the allocator's large pool, one segment after empty_cache()

    def tearDown(self):
        release.set()
        super().tearDown()

    def compile(self, fn, reuse, *args):
        """``fn`` compiled with ``allow_buffer_reuse=reuse``, run once (nothing held), and its code."""
        torch._dynamo.reset()
        release.set()
        with torch._inductor.config.patch(allow_buffer_reuse=reuse):
            compiled = torch.compile(fn, fullgraph=True)
            _, (code,) = run_and_get_code(compiled, *args)
        torch.openreg.synchronize()
        return compiled, code

    def assert_recorded_not_reused(self, code, stream):
        recorded = re.findall(rf"^\s*(buf\d+)\.record_stream\({stream}\)", code, flags=re.M)
        self.assertTrue(recorded, f"no buffer recorded on {stream}:\n{code}")
        for name in recorded:
            self.assertNotRegex(code, rf"= {name}\b.*# reuse", f"{name} is reused")
            self.assertRegex(code, rf"{name}\.record_stream\({stream}\)[^\n]*\n\s*del {name}\n")

    def assert_compiled_as_eager(self, f, args, expected, held_stream, drain, recorded_on):
        """With buffer reuse on and off: the compiled code records the shared buffer on
        ``recorded_on`` and never reuses it, and, run with ``held_stream`` held, gives what eager
        openreg gives, which is ``expected``."""
        for reuse in (True, False):
            with self.subTest(allow_buffer_reuse=reuse):
                compiled, code = self.compile(f, reuse, *args)
                self.assert_recorded_not_reused(code, recorded_on)
                eager = self.run_held(f, args, held_stream, drain)
                got = self.run_held(compiled, args, held_stream, drain)
                self.assertEqual(eager, expected, rtol=1e-4, atol=1e-3)
                self.assertEqual(got, eager, rtol=1e-4, atol=1e-3)

    def run_held(self, fn, args, held_stream, drain):
        """``fn(*args)`` with ``held_stream`` held until ``drain`` (the other stream) finished."""
        fn(*args)  # an op signature's first call is synchronous: not while a stream is held
        torch.openreg.synchronize()
        torch.openreg.empty_cache()  # the freed buffer's block is the next one of its size
        with torch.openreg.stream(held_stream):
            held = hold()
        out = fn(*args)
        drain.synchronize()
        self.assertFalse(held_stream.query(), "the held stream ran before release")
        release.set()
        torch.openreg.synchronize()
        del held
        return [t.cpu() for t in out]

    def test_side_stream_reads_a_buffer_at_its_last_use(self):
        s = torch.openreg.Stream()

        def f(x, w):
            t = x * 2  # current stream
            s.wait_stream(torch.accelerator.current_stream())
            with s:
                u = (t + 1).sum(0)  # t's last use, on s (held)
            v = torch.mm(w, w)  # the current stream's next buffer of t's size
            return u, v

        x, w = torch.randn(self.N, self.N), torch.randn(self.N, self.N) / 30
        expected = [(x * 2 + 1).sum(0), w @ w]
        args = (x.to("openreg"), w.to("openreg"))
        self.assert_compiled_as_eager(f, args, expected, s, torch.openreg.current_stream(), "stream1")

    def test_extern_kernel_on_side_stream_reads_a_buffer_at_its_last_use(self):
        # The reader is a fallback operator (an extern call, not a generated kernel) that holds s.
        s = torch.openreg.Stream()

        def f(x, w):
            t = x * 2
            s.wait_stream(torch.accelerator.current_stream())
            with s:
                u = hold_stream(t)  # holds s until released, then copies t: t's last use
            v = torch.mm(w, w)
            return u, v

        x, w = torch.randn(self.N, self.N), torch.randn(self.N, self.N) / 30
        args = (x.to("openreg"), w.to("openreg"))
        default = torch.openreg.current_stream()
        for reuse in (True, False):
            with self.subTest(allow_buffer_reuse=reuse):
                compiled, code = self.compile(f, reuse, *args)
                self.assert_recorded_not_reused(code, "stream1")
                for fn in (f, compiled):
                    fn(*args)  # an op signature's first call is synchronous
                    torch.openreg.synchronize()
                    torch.openreg.empty_cache()
                    release.clear()
                    u, v = fn(*args)
                    default.synchronize()  # v is written; s still holds
                    self.assertFalse(s.query())
                    release.set()
                    torch.openreg.synchronize()
                    self.assertEqual([u.cpu(), v.cpu()], [x * 2, w @ w], rtol=1e-4, atol=1e-3)

    def test_current_stream_reads_a_side_stream_buffer_at_its_last_use(self):
        # The other way round: t is made on s, its last reader runs on the (held) current stream,
        # and s allocates a buffer of t's size next.
        s = torch.openreg.Stream()

        def f(x, y):
            with s:
                t = x * 2
            torch.accelerator.current_stream().wait_stream(s)
            a = (t + 1).sum(0)  # t's last use, on the held current stream
            with s:
                b = y * 3  # s's next buffer of t's size
            return a, b

        x, y = torch.randn(self.N, self.N), torch.randn(self.N, self.N)
        expected = [(x * 2 + 1).sum(0), y * 3]
        args = (x.to("openreg"), y.to("openreg"))
        s.wait_stream(torch.openreg.current_stream())  # the inputs' copies
        self.assert_compiled_as_eager(f, args, expected, torch.openreg.current_stream(), s, "default_stream")

    def test_a_temporary_is_not_reused_across_a_join(self):
        # Fork and join (s.wait_stream(cur) ... cur.wait_stream(s)): Dynamo orders a join by having
        # streams.wait_stream "mutate" the buffers it orders, and 2.13's reuse key takes a buffer's
        # stream through that rename, so t, made and last read on the current stream, was given to
        # s's next buffer of its size while the current stream was still to read it (workaround 26).
        s = torch.openreg.Stream()

        def f(x, w):
            cur = torch.accelerator.current_stream()
            s.wait_stream(cur)
            t = x * 2
            c = hold_stream(t) @ w  # t's last use: the current stream holds until released
            with s:
                b = (x @ w).cos()  # s's buffers of t's size
            cur.wait_stream(s)
            return b + c

        x, w = torch.randn(self.N, self.N), torch.randn(self.N, self.N) / 30
        expected = (x @ w).cos() + (x * 2) @ w
        args = (x.to("openreg"), w.to("openreg"))
        for reuse in (True, False):
            with self.subTest(allow_buffer_reuse=reuse):
                compiled, _ = self.compile(f, reuse, *args)
                for fn in (f, compiled):
                    fn(*args)  # an op signature's first call is synchronous
                    torch.openreg.synchronize()
                    torch.openreg.empty_cache()
                    release.clear()
                    out = fn(*args)
                    s.synchronize()  # s's work is done; the current stream still holds t unread
                    release.set()
                    self.assertEqual(out.cpu(), expected, rtol=1e-4, atol=1e-3, msg=fn.__name__)

    def test_kernels_of_two_streams_stay_apart(self):
        # C++ kernels are grouped until a flush; a stream switch must end the group, or the side
        # stream's reduction runs in the current stream's kernel.
        s = torch.openreg.Stream()

        def f(x, w):
            a = x.sum(1)
            with s:
                u = (x.sin() * 3).sum(0)
            return u, w.cos().sum(1) + a

        x, w = torch.randn(256, 256, device="openreg"), torch.randn(256, 64, device="openreg")
        compiled, code = self.compile(f, True, x, w)
        self.assertEqual(launches_in(code), 2)
        x = torch.randn(256, 256, device="openreg")  # not the values of the first call's buffers
        s.wait_stream(torch.openreg.current_stream())
        held = hold()  # the current stream
        u, _ = compiled(x, w)
        with torch.openreg.stream(s):
            got = u.cpu()  # waits for s only
        release.set()
        self.assertEqual(got, (x.cpu().sin() * 3).sum(0), rtol=1e-4, atol=1e-4)
        del held


class TestDeviceCallsInTheRegion(TestCase):
    def tearDown(self):
        release.set()
        super().tearDown()

    def test_synchronize_between_kernels(self):
        # A synchronize in the region is a fallback call without a device (streams.synchronize_device):
        # its call used to be written before the deferred kernel that precedes it, after that kernel's
        # input was freed (UnboundLocalError when run). Workaround 12 in openreg_inductor/_torch213.py.
        def f(x):
            y = x.sin() + 1
            torch.accelerator.synchronize()
            return y * 2

        # Compared with eager: CPU Inductor has the same defect (a CPU graph with this synchronize of
        # the accelerator fails the same way), which openreg's wrapper classes do not reach.
        x = torch.randn(64)
        torch._dynamo.reset()
        out, (code,) = run_and_get_code(torch.compile(f), x.to("openreg"))
        self.assertEqual(out.cpu(), f(x))
        launch = LAUNCH_LINE.search(code)
        sync = code.index("torch.ops.streams.synchronize_device")
        self.assertLess(launch.start(), sync)

    def test_device_module_calls_trace_in_a_full_graph(self):
        # torch.openreg.synchronize/current_stream/current_device under fullgraph=True
        # (openreg_inductor/polyfills.py): each behaves as the eager call.
        def f(x):
            y = x + 1
            torch.openreg.synchronize()
            return y * 2, torch.openreg.current_stream(), torch.openreg.current_device()

        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True)
        x = torch.randn(8, device="openreg")
        compiled(x)  # compiles; the stream is not held yet
        side = torch.openreg.Stream()
        with torch.openreg.stream(side):
            held = hold()
            timer = threading.Timer(1.0, release.set)  # the synchronize returns once this fires
            timer.start()
            out, stream, index = compiled(x)
            done = side.query()
            timer.join()
        del held
        self.assertTrue(done, "torch.openreg.synchronize() in the region did not wait for the device")
        self.assertEqual(out.cpu(), (x.cpu() + 1) * 2)
        self.assertEqual((stream.device_index, stream.stream_id), (0, side.stream_id))
        self.assertEqual(index, 0)
        torch.openreg.set_device(1)
        _, stream, index = compiled(torch.randn(8, device="openreg:1"))
        self.assertEqual((index, stream.device_index), (1, 1))

    def test_calls_without_a_device_follow_set_device(self):
        # Without a device, the stand-ins read the current device, so a set_device between calls
        # recompiles: current_stream() is the new device's and synchronize() waits for it.
        stream_of = torch.compile(lambda x: (x + 1, torch.openreg.current_stream()), fullgraph=True)

        def sync(x):
            y = x + 1
            torch.openreg.synchronize()
            return y

        torch._dynamo.reset()
        synced = torch.compile(sync, fullgraph=True)
        x0 = torch.ones(4, device="openreg")
        self.assertEqual(stream_of(x0)[1].device_index, 0)
        synced(x0)
        try:
            torch.openreg.set_device(1)
            x1 = torch.ones(4, device="openreg:1")
            self.assertEqual(stream_of(x1)[1].device_index, 1)
            synced(x1)  # compiled for openreg:1
            held = hold()  # openreg:1's current stream, for about a second
            timer = threading.Timer(1.0, release.set)
            timer.start()
            synced(x1)
            waited = torch.openreg.current_stream(1).query()
            timer.join()
            del held
        finally:
            torch.openreg.set_device(0)
        self.assertTrue(waited, "torch.openreg.synchronize() did not wait for openreg:1 after set_device(1)")

    def test_a_negative_index_is_the_current_device(self):
        # As eagerly (a CPU tensor's get_device() is -1, and code passes it on): the stand-ins made
        # torch.device("openreg", -1) of it, and the compile failed.
        def f(x):
            y = x * 2
            torch.openreg.synchronize(-1)
            return y, torch.openreg.current_stream(-1)

        torch._dynamo.reset()
        compiled = torch.compile(f, backend="eager", fullgraph=True)
        try:
            torch.openreg.set_device(1)
            x = torch.ones(4, device="openreg:1")
            for fn in (f, compiled):
                y, stream = fn(x)
                self.assertEqual((y.cpu().tolist(), stream), ([2.0] * 4, torch.openreg.current_stream(1)))
        finally:
            torch.openreg.set_device(0)

    def test_current_stream_inside_a_stream_context_of_another_device(self):
        # A stream context makes the stream's device current: torch.openreg.current_stream() inside
        # `with s1:` is s1, as eagerly. The stand-in read the device at trace time and answered
        # openreg:0's stream.
        s1 = torch.openreg.Stream(device=1)

        def f(x):
            with s1:
                inside = torch.openreg.current_stream()
                y = x + 1
            return y, inside, torch.openreg.current_stream()

        x = torch.ones(4, device="openreg:1")
        s1.wait_stream(torch.openreg.current_stream(1))  # x's producer
        torch._dynamo.reset()
        for fn in (f, torch.compile(f, backend="eager", fullgraph=True)):
            y, inside, after = fn(x)
            s1.synchronize()
            self.assertEqual(y.cpu(), torch.full((4,), 2.0))
            self.assertEqual((inside.device_index, inside.stream_id), (1, s1.stream_id))
            self.assertEqual((after.device_index, after.stream_id), (0, torch.openreg.default_stream(0).stream_id))


def streams_of(values):
    """(device index, stream id) of each stream among ``values``."""
    return [(v.device_index, v.stream_id) for v in values if isinstance(v, torch.Stream)]


class TestDeviceContexts(TestCase):
    """Contexts in the region: inside ``torch.accelerator.device_index(i)`` (workaround 18 in
    openreg_inductor/_torch213.py) and inside a stream context of another device (workaround 19),
    calls without a device answer as eagerly."""

    def tearDown(self):
        release.set()
        super().tearDown()

    def test_nested_contexts_answer_as_eagerly(self):
        # The innermost context decides, whichever kind it is.
        s0, s1 = torch.openreg.Stream(device=0), torch.openreg.Stream(device=1)
        cs = torch.openreg.current_stream

        def f(x):
            with torch.accelerator.device_index(1):
                a = cs()
                with s0:
                    b = cs()
                    with torch.accelerator.device_index(1):
                        c = cs()
                    d = cs()
                with s1:
                    e = cs()
                    with torch.accelerator.device_index(0):
                        g = cs()
                    h = cs()
                i = cs()
                j = torch.accelerator.current_stream("openreg")  # a device without an index: the current one
            return x + 1, a, b, c, d, e, g, h, i, j, cs(), torch.accelerator.current_stream()

        x = torch.ones(4, device="openreg")
        expected = streams_of(f(x))
        self.assertEqual(
            expected,
            [
                (1, 0),
                (0, s0.stream_id),
                (1, 0),
                (0, s0.stream_id),
                (1, s1.stream_id),
                (0, 0),
                (1, s1.stream_id),
                (1, 0),
                (1, 0),
                (0, 0),
                (0, 0),
            ],
        )
        for backend in ("eager", "inductor"):
            torch._dynamo.reset()
            out = torch.compile(f, backend=backend, fullgraph=True)(x)
            self.assertEqual(streams_of(out), expected, backend)
            self.assertEqual(out[0].cpu(), torch.full((4,), 2.0))

    def test_an_input_mutation_inside_a_device_context_is_keyed_by_its_stream(self):
        # Dynamo refuses an event recorded on the stream an input was mutated on (the mutation is
        # applied after the graph); inside a device context that stream is the context's device's
        # (workaround 18 for cur_stream_id). It keyed the outer stream: the refusal was skipped, and
        # a record on the outer stream after a mutation inside the context was refused.
        def inside(x):
            with torch.accelerator.device_index(1):
                x.add_(1)
                torch.openreg.current_stream().record_event()
            return x * 2

        def record_outside(x):
            with torch.accelerator.device_index(1):
                x.add_(1)
            torch.openreg.current_stream().record_event()
            return x * 2

        torch._dynamo.reset()
        with self.assertRaisesRegex(
            RuntimeError, "An event was recorded on a stream where a graph input was previously mutated"
        ):
            torch.compile(inside, backend="eager", fullgraph=True)(torch.ones(2, device="openreg:1"))
        x = torch.ones(2, device="openreg:1")
        out = torch.compile(record_outside, backend="eager", fullgraph=True)(x)
        self.assertEqual((x.cpu(), out.cpu()), (torch.full((2,), 2.0), torch.full((2,), 4.0)))

    def test_a_device_context_alone_adds_no_stream_lookup(self):
        # The device context's stream is looked up only if the region asks for it: each lookup is a
        # graph node and a call at each run of the compiled code.
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm

        def lookups(gm):
            return sum(
                node.op == "call_function" and "get_external_object_by_index" in str(node.target)
                for node in gm.graph.nodes
            )

        def plain(x):
            with torch.accelerator.device_index(1):
                return x + 1

        def asking(x):
            with torch.accelerator.device_index(1):
                return x + 1, torch.openreg.current_stream()

        x = torch.ones(2, device="openreg:1")
        torch._dynamo.reset()
        y = torch.compile(plain, backend=backend, fullgraph=True)(x)
        y, stream = torch.compile(asking, backend=backend, fullgraph=True)(x)
        self.assertEqual((stream.device_index, stream.stream_id), (1, 0))
        self.assertEqual([lookups(gm) for gm in graphs], [0, 1])

    def test_a_stream_from_outside_entered_around_a_device_context(self):
        # Whether the stream entered is on the device context's device decides the answer, so its
        # device is guarded: a stream of another device at the next call recompiles.
        def make(index):
            def f(x, s):
                with s:
                    with torch.accelerator.device_index(index):
                        return x + 1, torch.openreg.current_stream()

            return f

        x = torch.ones(2, device="openreg")
        for index, devices in ((1, (1, 0, 1, 0)), (0, (1, 0, 1, 0)), (0, (0, 1, 0, 1))):
            f = make(index)
            torch._dynamo.reset()
            compiled = torch.compile(f, fullgraph=True)
            for device in devices:
                s = torch.openreg.Stream(device=device)
                s.wait_stream(torch.openreg.current_stream(0))  # x's producer
                expected = f(x, s)[1]
                y, stream = compiled(x, s)
                torch.openreg.synchronize(0)
                self.assertEqual(
                    (stream.device_index, stream.stream_id),
                    (expected.device_index, expected.stream_id),
                    (index, devices),
                )
                self.assertEqual(y.cpu(), torch.full((2,), 2.0))

    def test_a_factory_inside_a_device_context_is_cached_apart(self):
        # torch's fake-tensor cache keyed `device="openreg"` as written: the same factory traced
        # inside and outside a device context (or after a set_device) shared one fake tensor
        # (workaround 20 in openreg_inductor/_torch213.py).
        from torch._subclasses.fake_tensor import FakeTensorMode

        def inside(x):
            with torch.accelerator.device_index(1):
                y = torch.ones(2, device="openreg")
            return x + 1, y

        def outside(x):
            return x + torch.ones(2, device="openreg")

        for order in ((inside, outside), (outside, inside)):
            FakeTensorMode.cache_clear()
            for fn in order:
                x = torch.ones(2, device="openreg")
                torch._dynamo.reset()
                expected = [t.device for t in torch.utils._pytree.tree_leaves(fn(x))]
                out = torch.compile(fn, fullgraph=True)(x)
                self.assertEqual([t.device for t in torch.utils._pytree.tree_leaves(out)], expected, fn.__name__)
                self.assertEqual(
                    [t.cpu() for t in torch.utils._pytree.tree_leaves(out)],
                    [torch.full((2,), 2.0)] + [torch.ones(2)] * (fn is inside),
                )
        FakeTensorMode.cache_clear()
        torch._dynamo.reset()
        compiled = torch.compile(outside, fullgraph=True)
        compiled(torch.ones(2, device="openreg"))
        try:
            torch.openreg.set_device(1)
            out = compiled(torch.ones(2, device="openreg:1"))  # recompiled for openreg:1
        finally:
            torch.openreg.set_device(0)
        self.assertEqual((out.device, out.cpu()), (torch.device("openreg:1"), torch.full((2,), 2.0)))

    def test_openreg_device_context_traces(self):
        # `with torch.openreg.device(i):` in a full graph (its Dynamo variable is registered by
        # openreg_inductor/polyfills.py), with each kind of argument eager code takes: factories
        # without an index, current_device() and current_stream() as eagerly, inside and after.
        def make(arg):
            def f(x):
                with torch.openreg.device(arg):
                    y = torch.ones(2, device="openreg")
                    index, stream = torch.openreg.current_device(), torch.openreg.current_stream()
                return x + 1, y.device, index, (stream.device_index, stream.stream_id), torch.openreg.current_device()

            return f

        x = torch.ones(2, device="openreg")
        for arg, inside in (
            (1, 1),
            ("openreg:1", 1),
            (torch.device("openreg", 1), 1),
            (None, 0),
            (-1, 0),
            ("openreg", 0),
        ):
            f = make(arg)
            torch._dynamo.reset()
            expected = (torch.device("openreg", inside), inside, (inside, 0), 0)
            self.assertEqual(f(x)[1:], expected, arg)
            out = torch.compile(f, fullgraph=True)(x)
            self.assertEqual(out[1:], expected, arg)
            self.assertEqual(out[0].cpu(), torch.full((2,), 2.0))
            self.assertEqual(torch.openreg.current_device(), 0)

    def test_an_index_less_openreg_device_context_follows_set_device(self):
        # torch.openreg.device("openreg") names the current device at the call: it switches nothing,
        # rather than the device read at the trace. Under the eager backend the region's factory
        # then follows a set_device between calls (Inductor fixes a factory's device at the compile;
        # see compiler.md, "Not done yet").
        def f(x):
            with torch.openreg.device("openreg"):
                y = torch.ones(2, device="openreg")
            return x + 1, y

        x = torch.ones(2, device="openreg")
        torch._dynamo.reset()
        compiled = torch.compile(f, backend="eager", fullgraph=True)
        self.assertEqual(compiled(x)[1].device, torch.device("openreg:0"))
        try:
            torch.openreg.set_device(1)
            expected, out = f(x)[1], compiled(x)[1]
        finally:
            torch.openreg.set_device(0)
        self.assertEqual((out.device, out.cpu()), (expected.device, torch.ones(2)))
        self.assertEqual(out.device, torch.device("openreg:1"))

    def test_openreg_device_context_with_a_graph_break(self):
        # Dynamo writes the context back around the break, as torch.openreg.device(1): the code after
        # it is compiled too, and still runs on openreg:1.
        def make(arg):
            def f(x):
                with torch.openreg.device(arg):
                    a = torch.openreg.current_device()
                    torch._dynamo.graph_break()
                    y = torch.ones(2, device="openreg")
                    b = torch.openreg.current_stream().device_index
                return x + 1, a, y.device, b, torch.openreg.current_device()

            return f

        x = torch.ones(2, device="openreg")
        # "openreg" leaves the device alone: the context is written back as torch.openreg.device(-1),
        # which eager code takes (torch.accelerator.device_index(-1) would refuse it).
        for arg, inside in ((1, 1), ("openreg", 0)):
            f = make(arg)
            counter = torch._dynamo.testing.CompileCounter()
            torch._dynamo.reset()
            out = torch.compile(f, backend=counter)(x)
            self.assertEqual(out[1:], (inside, torch.device("openreg", inside), inside, 0), arg)
            self.assertEqual(out[1:], f(x)[1:])
            self.assertEqual(counter.frame_count, 2)  # both sides of the break
            self.assertEqual(torch.openreg.current_device(), 0)

    def test_openreg_device_context_refuses_what_eager_code_refuses(self):
        def make(arg):
            def f(x):
                with torch.openreg.device(arg):
                    return x + 1

            return f

        x = torch.ones(2, device="openreg")
        for arg, error, message in (
            (7, RuntimeError, "Invalid openreg device index 7"),
            ("cpu", ValueError, "Expected an openreg device, but got: cpu"),
        ):
            f = make(arg)
            torch._dynamo.reset()
            with self.assertRaisesRegex(error, message):
                f(x)
            with self.assertRaisesRegex(RuntimeError, message):  # Dynamo wraps the error in its own
                torch.compile(f, fullgraph=True)(x)
            self.assertEqual(torch.openreg.current_device(), 0)

    def test_the_device_of_a_stream_from_outside_is_guarded(self):
        # A stream's device is a constant of the trace (workaround 19): a stream of another device at
        # the next call recompiles.
        def f(x, s):
            with s:
                return x + 1, torch.openreg.current_device()

        x = torch.ones(2, device="openreg")
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True)
        for device in (1, 0, 1):
            s = torch.openreg.Stream(device=device)
            s.wait_stream(torch.openreg.current_stream(0))  # x's producer
            y, index = compiled(x, s)
            s.synchronize()
            self.assertEqual((index, y.cpu()), (device, torch.full((2,), 2.0)))

    def test_current_device_and_synchronize_inside_a_stream_context(self):
        # A stream context makes its stream's device current: inside `with s1:`, current_device() is
        # 1 and synchronize() waits for openreg:1. Both answered openreg:0 before.
        s1 = torch.openreg.Stream(device=1)

        def f(x):
            with s1:
                y = x + 1
                index = torch.openreg.current_device()
                torch.openreg.synchronize()
            return y, index

        x = torch.ones(4, device="openreg:1")
        s1.wait_stream(torch.openreg.current_stream(1))  # x's producer
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True)
        self.assertEqual(compiled(x)[1], 1)
        self.assertEqual(f(x)[1], 1)
        with torch.openreg.stream(s1):
            held = hold()
        timer = threading.Timer(1.0, release.set)  # the synchronize returns once this fires
        timer.start()
        y, index = compiled(x)
        done = s1.query()
        timer.join()
        del held
        self.assertTrue(done, "torch.openreg.synchronize() inside `with s1:` did not wait for openreg:1")
        self.assertEqual((index, y.cpu()), (1, torch.full((4,), 2.0)))


class TestQuery(TestCase):
    def tearDown(self):
        release.set()
        super().tearDown()

    def test_query_answers_at_each_call(self):
        def f(x, s, e):
            return x + 1, s.query(), e.query()

        torch._dynamo.reset()
        compiled = torch.compile(f)
        x = torch.randn(4, device="openreg")
        s, e = torch.openreg.Stream(), torch.openreg.Event()
        e.record(s)
        out, *answers = compiled(x, s, e)  # traced while s is idle
        self.assertEqual(answers, [True, True])
        self.assertEqual(out.cpu(), x.cpu() + 1)
        with torch.openreg.stream(s):
            held = hold()
            e.record()
        out, *answers = compiled(x, s, e)
        self.assertEqual(answers, [False, False], "query() gave the answer of the trace")
        self.assertEqual(answers, list(f(x, s, e)[1:]))
        release.set()
        s.synchronize()
        del held
        self.assertEqual(compiled(x, s, e)[1:], (True, True))

        torch._dynamo.reset()  # else the region's cached graphs answer
        with self.assertRaisesRegex(torch._dynamo.exc.Unsupported, "openreg stream or event query"):
            torch.compile(f, fullgraph=True)(x, s, e)


class TestKernelFailures(TestCase):
    def test_integer_division_by_zero(self):
        f = torch.compile(lambda a, b: (a // b) + 1)
        a = torch.arange(10, device="openreg")
        f(a, torch.zeros(10, dtype=torch.int64, device="openreg"))  # returns: the error is asynchronous
        with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*ZeroDivisionError"):
            torch.openreg.synchronize()
        self.assertEqual(f(a, torch.ones_like(a)).cpu(), torch.arange(10) + 1)  # the device recovers

    def test_integer_truncation_division_by_zero(self):
        # Inductor writes it as a plain `/` (CppOverrides.truncdiv, CppVecOverrides.truncdiv): a zero
        # divisor ended the process (SIGFPE), as it does under CPU Inductor. openreg's kernels call
        # a checked helper (launch._TRUNCDIV), for the vector loop (int64, 1024 elements) and the
        # scalar one (int8, 3 elements) alike. INT_MIN / -1 wraps instead of trapping.
        f = torch.compile(lambda a, b: torch.div(a, b, rounding_mode="trunc") + 1)
        for dtype, n in ((torch.int64, 1024), (torch.int8, 3)):
            a = torch.arange(n, device="openreg").to(dtype) - n // 2
            b = (torch.arange(n, device="openreg") % 5 - 2).to(dtype)  # zeros among them
            f(a, b)
            with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*ZeroDivisionError"):
                torch.openreg.synchronize()
            ok = torch.where(b == 0, torch.ones_like(b), b)
            want = torch.div(a.cpu(), ok.cpu(), rounding_mode="trunc") + 1
            self.assertEqual(f(a, ok).cpu(), want, msg=str(dtype))  # the device recovers
        lowest = torch.iinfo(torch.int64).min
        got = f(torch.tensor([lowest, 7], device="openreg"), torch.tensor([-1, -2], device="openreg"))
        self.assertEqual(got.cpu().tolist(), [lowest + 1, -2])
        # A transposed read: a tiled (2-D) kernel, whose operations are wrapped apart.
        g = torch.compile(lambda a, b: torch.div(a.t(), b, rounding_mode="trunc") + 1)
        a = torch.arange(64 * 64, device="openreg").view(64, 64) - 2048
        b = torch.arange(64 * 64, device="openreg").view(64, 64) % 7 - 3
        g(a, b)
        with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*ZeroDivisionError"):
            torch.openreg.synchronize()
        ok = torch.where(b == 0, torch.ones_like(b), b)
        self.assertEqual(g(a, ok).cpu(), torch.div(a.cpu().t(), ok.cpu(), rounding_mode="trunc") + 1)

    def test_integer_division_on_two_streams_at_once(self):
        # One library's division-error flag, two streams running it: without one call at a time
        # (launch.one_division_flag_user_at_a_time) the process ended within a few rounds.
        f = torch.compile(lambda a, b: (a // b) + 1)
        a = torch.arange(1 << 16, device="openreg")
        good = torch.ones_like(a)
        bad = good.clone()
        bad[1000] = 0
        f(a, good)
        torch.openreg.synchronize()
        streams = torch.openreg.Stream(), torch.openreg.Stream()
        for _ in range(40):
            with torch.openreg.stream(streams[0]):
                for _ in range(20):
                    f(a, bad)
            with torch.openreg.stream(streams[1]):
                outs = [f(a, good) for _ in range(20)]
            with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*ZeroDivisionError"):
                torch.openreg.synchronize()
        self.assertEqual(outs[-1].cpu(), torch.arange(1 << 16) + 1)

    def test_index_out_of_bounds(self):
        f = torch.compile(lambda w, i: w[i] * 2)
        f(torch.randn(5, device="openreg"), torch.tensor([1, 7], device="openreg"))
        with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*index out of bounds"):
            torch.openreg.synchronize()

    @torch._inductor.config.patch({"cpp.threads": 2})
    def test_index_out_of_bounds_in_a_parallel_loop(self):
        # The assert fires inside an OpenMP worksharing loop (2 threads, 32K rows): it may not throw
        # out of the region (the process would end, as with CPU Inductor); the iteration catches
        # it, the kernel rethrows the first after the region (launch.catch_in_parallel_regions).
        def gather_then_scatter(w, i):
            return torch.zeros_like(w).index_put_((i,), w[i] * 2, accumulate=True)

        f = torch.compile(gather_then_scatter)
        w = torch.randn(32768, 8)
        good = torch.randint(0, 32768, (32768,))
        bad = good.clone()
        bad[20000] = 32768
        wd, badd = w.to("openreg"), bad.to("openreg")
        _, (code, *_) = run_and_get_code(f, wd, badd)
        with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*index out of bounds"):
            torch.openreg.synchronize()
        self.assertIn("#pragma omp for", code)
        self.assertIn("catch (...) { openreg_parallel_failure.note(", code)
        self.assertEqual(f(wd, good.to("openreg")).cpu(), gather_then_scatter(w, good))  # the device recovers

    @torch._inductor.config.patch({"cpp.threads": 8})
    def test_index_out_of_bounds_in_a_collapsed_parallel_loop(self):
        # 3 x 4096 rows that cannot merge (a transposed index), 3 < 8 threads: `omp for collapse(2)`,
        # whose innermost collapsed loop owns the iteration that catches.
        f = torch.compile(lambda w, i: w[i] * 2)
        w, i = torch.randn(4096, 16), torch.randint(0, 4096, (4096, 3)).t()
        i[2, 100] = 4096
        _, (code, *_) = run_and_get_code(f, w.to("openreg"), i.to("openreg"))
        with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*index out of bounds"):
            torch.openreg.synchronize()
        self.assertIn("#pragma omp for collapse(2)", code)
        self.assertIn("catch (...) { openreg_parallel_failure.note(", code)

    def test_masked_index_out_of_bounds(self):
        # F.pad masks the gather's first and last columns: Inductor's masked check never fired
        # (_torch213, workaround 15). Five columns: no vector of the mask is wholly set.
        f = torch.compile(lambda w, i: torch.nn.functional.pad(w[i], (1, 1)))
        for width in (5, 64):
            w, i = torch.randn(64, width), torch.randint(0, 64, (64,))
            self.assertEqual(f(w.to("openreg"), i.to("openreg")).cpu(), torch.nn.functional.pad(w[i], (1, 1)))
            i[40] = 64
            f(w.to("openreg"), i.to("openreg"))
            with self.assertRaisesRegex(RuntimeError, r"kernel 'openreg_fused_\w+' failed .*index out of bounds"):
                torch.openreg.synchronize()


if __name__ == "__main__":
    run_tests()
