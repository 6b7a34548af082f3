"""Device graphs: torch.accelerator.Graph captures the work launched on a stream and replays it."""

import os
import tempfile
import time

import torch
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import StreamHold, run_python


def warm_up(fn, stream):
    """As on CUDA: run the work once before capturing it (first calls of an op signature synchronise).

    The inputs were made on the current stream: the side stream waits for it first, as a CUDA program's
    must (without the wait, in-place work of the warm-up could run before the inputs' fill)."""
    stream.wait_stream(torch.openreg.current_stream(stream.device_index))
    with torch.openreg.stream(stream):
        fn()
    stream.synchronize()


def captured(step, stream):
    """A graph of ``step()``, warmed up and captured on ``stream``."""
    warm_up(step, stream)
    graph = torch.accelerator.Graph()
    with torch.openreg.stream(stream):
        graph.capture_begin()
        step()
        graph.capture_end()
    return graph


def replay_each(graph, stream, values, load):
    """For each value: ``load(value)``, then a replay on ``stream``, waited for."""
    for value in values:
        load(value)
        with torch.openreg.stream(stream):
            graph.replay()
        stream.synchronize()
        yield value


class TestGraphs(TestCase):
    def test_capture_and_replay(self):
        x = torch.zeros(1000, device="openreg")
        s = torch.openreg.Stream()

        def step():
            x.add_(1)
            return x * 2

        warm_up(step, s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = step()
            g.capture_end()
        s.synchronize()
        self.assertEqual(x.cpu(), torch.full((1000,), 1.0))  # capturing recorded the work, it did not run it
        before = torch.openreg._runtime_counters()
        for _ in range(3):
            g.replay()
        torch.openreg.synchronize()
        after = torch.openreg._runtime_counters()
        # A replay is one graph launch; its items are counted apart from kernel launches.
        self.assertEqual(after["graphs_launched"] - before["graphs_launched"], 3)
        self.assertEqual(after["kernels_launched"] - before["kernels_launched"], 0)
        items = after["graph_items_launched"] - before["graph_items_launched"]
        self.assertEqual(items % 3, 0)
        self.assertGreaterEqual(items // 3, 2)  # at least the add_ and the mul
        self.assertEqual(x.cpu(), torch.full((1000,), 4.0))
        self.assertEqual(y.cpu(), torch.full((1000,), 8.0))  # the captured output is rewritten by each replay
        g.reset()

    def test_an_op_warmed_up_with_one_offset_is_captured_with_another(self):
        # The generic path's first-call verdict is shared by a coarse signature without sizes and
        # offsets: keyed for a while with every small integer, narrow_copy warmed up at start 0
        # and captured at start 5 was a new signature, whose synchronous first call a capture
        # refuses. Only arguments the schema declares int (a mode, a dim) are keyed, not SymInts.
        x = torch.arange(48.0, device="openreg").reshape(3, 16)
        s = torch.openreg.Stream()
        warm_up(lambda: x.narrow_copy(1, 0, 8), s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x.narrow_copy(1, 5, 8)
            g.capture_end()
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(y.cpu(), torch.arange(48.0).reshape(3, 16).narrow_copy(1, 5, 8))
        g.reset()

    def test_a_masked_assignment_of_one_value_is_captured(self):
        # x[mask] = 0.0 is a masked fill on every device (no nonzero(), no wait): the shape checks
        # index_put_ gained for other forms must leave it asynchronous, so a warmed-up capture takes it.
        x = torch.arange(-4.0, 4.0, device="openreg")
        s = torch.openreg.Stream()

        def step():
            x[x < 0] = 0.0

        g = captured(step, s)
        x.copy_(torch.arange(-8.0, 0.0, 1.0, device="openreg"))
        torch.openreg.synchronize()
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(x.cpu(), torch.zeros(8))
        g.reset()

    def test_a_refused_capture_leaves_the_capture_under_way_alone(self):
        # A second capture_begin() on a stream that captures (another thread's recording, say) is
        # refused; its cleanup erased the first capture's pool from the allocator, so what that
        # capture freed afterwards went back to everyone, and its replays overwrote others' tensors.
        x = torch.arange(1000.0, device="openreg")
        s = torch.openreg.Stream()

        def step():
            t = x + 1  # freed inside the capture: its block belongs to the graph
            return t * 3

        warm_up(step, s)
        g1, g2 = torch.accelerator.Graph(), torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g1.capture_begin()
            with self.assertRaisesRegex(RuntimeError, "the stream is already capturing"):
                g2.capture_begin()
            y = step()
            g1.capture_end()
        s.synchronize()
        others = [torch.full((1000,), 7.0, device="openreg") for _ in range(4)]  # may not take t's block
        for _ in range(2):
            g1.replay()
        torch.openreg.synchronize()
        for o in others:
            self.assertEqual(o.cpu(), torch.full((1000,), 7.0))
        self.assertEqual(y.cpu(), (torch.arange(1000.0) + 1) * 3)
        g1.reset()

    def test_a_program_that_exits_with_a_capture_open_ends_cleanly(self):
        # An uncaught error between capture_begin() and capture_end() left the capture open: the exit
        # handler's synchronisation was refused, and the Python kernels still queued ran while the
        # interpreter finalized ("Fatal Python error", status 134 or 139).
        r = run_python(
            """
            import time, torch

            @torch.library.custom_op("exit_test::slow", mutates_args=(), device_types="cpu")
            def slow(x: torch.Tensor) -> torch.Tensor:
                time.sleep(0.2)
                return x + 1

            @slow.register_fake
            def _(x):
                return torch.empty_like(x)

            x = torch.zeros(4, device="openreg")
            slow(x)
            torch.openreg.synchronize()
            queued = [slow(x) for _ in range(6)]
            g = torch.accelerator.Graph()
            with torch.openreg.stream(torch.openreg.Stream()):
                g.capture_begin()
                x.nonzero()  # refused in a capture: uncaught
            """
        )
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("RuntimeError: aten::nonzero", r.stderr)
        self.assertIn("openreg: 1 graph capture(s) still open at exit were abandoned", r.stderr)
        self.assertNotIn("Fatal Python error", r.stderr)

    def test_a_graph_with_random_ops_is_not_replayed_inside_a_capture(self):
        # Its random ops are re-seeded by the host at each replay: captured into another graph, the
        # seeds became that graph's constants, and its replays repeated the same numbers. Refused, as
        # CUDA refuses; a graph without random ops nests.
        x, y = torch.empty(64, device="openreg"), torch.zeros(64, device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: (x.normal_(), y.add_(1)), s)
        random, plain = torch.accelerator.Graph(), torch.accelerator.Graph()
        with torch.openreg.stream(s):
            random.capture_begin()
            x.normal_()
            random.capture_end()
            plain.capture_begin()
            y.add_(1)
            plain.capture_end()
        outer = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            outer.capture_begin()
            with self.assertRaisesRegex(RuntimeError, "Cannot prepare for replay during capturing stage"):
                random.replay()
            plain.replay()
            outer.capture_end()
        s.synchronize()
        before = y.cpu()
        outer.replay()
        self.assertEqual(y.cpu(), before + 1)
        for g in (outer, plain, random):
            g.reset()

    def test_a_graph_replayed_into_another_keeps_its_memory_for_it_after_a_reset(self):
        # The outer graphs' replays run the inner graph's work on the inner graph's pool: resetting
        # the inner graph gave that pool's blocks to new tensors, which the outer graphs' replays then
        # overwrote with the inner graph's temporaries. Each capture holds the pools of the graphs it
        # replays, and of the graphs they replay in turn (three levels here).
        n = 1 << 16
        torch.openreg.empty_cache()
        reserved = torch.openreg.memory_reserved()
        inputs = [torch.arange(float(n), device="openreg")]
        s = torch.openreg.Stream()

        def f():  # its temporaries are freed during the capture, into the inner graph's pool
            return (inputs[0].sin() * 2) + 1

        warm_up(f, s)
        inner, middle, outer = torch.accelerator.Graph(), torch.accelerator.Graph(), torch.accelerator.Graph()
        with torch.openreg.stream(s):
            inner.capture_begin()
            z = f()
            inner.capture_end()
            middle.capture_begin()
            inner.replay()
            middle.capture_end()
            outer.capture_begin()
            middle.replay()
            outer.capture_end()
        s.synchronize()
        inner.reset()
        middle.reset()
        with torch.openreg.stream(s):
            fresh = [torch.full((n,), 7.0, device="openreg") for _ in range(6)]
            outer.replay()
        s.synchronize()
        self.assertEqual(z.cpu(), torch.arange(float(n)).sin() * 2 + 1)
        for t in fresh:
            self.assertEqual(t.cpu(), torch.full((n,), 7.0))
        del fresh, t, z
        inputs.clear()
        torch.openreg.empty_cache()
        self.assertGreater(torch.openreg.memory_reserved(), reserved)  # the inner pool, held by outer
        outer.reset()  # ... until the outer graph goes too
        torch.openreg.empty_cache()
        self.assertEqual(torch.openreg.memory_reserved(), reserved)

    def test_a_capture_begins_after_the_work_queued_on_its_stream(self):
        # The capture may take a block that eager work queued on its stream freed and still uses; a
        # replay on another stream ran at once and wrote it, and the queued eager work then wrote it
        # again (the graph's output read x * 2, not x * 3; through a graph replayed inside another,
        # and with the capture stream capturing the next graph, too). capture_begin() now waits for
        # the stream's queued work, as the `with graph:` form synchronises the device.
        import threading

        n = 1 << 16
        x = torch.arange(float(n), device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: (x * 2 + 1, x * 3), s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            hold = StreamHold().__enter__()  # s is busy: what follows on it is queued behind
        release = threading.Timer(0.3, hold.release)  # capture_begin() waits for it now
        release.start()
        try:
            with torch.openreg.stream(s):
                tmp = x * 2
                tmp_block = tmp.data_ptr()
                kept = tmp + 1
                del tmp  # freed on s, its kernels still queued
                queued = torch.openreg.Event()
                queued.record(s)
                g.capture_begin()
                waited = queued.query()  # what was queued has run
                y = x * 3
                g.capture_end()
            self.assertTrue(waited)
            self.assertEqual(y.data_ptr(), tmp_block)  # the premise: the capture took tmp's block
            g.replay()  # on the default stream
        finally:
            hold.release()
            release.join()
        torch.openreg.synchronize()
        self.assertEqual(y.cpu(), torch.arange(float(n)) * 3)
        self.assertEqual(kept.cpu(), torch.arange(float(n)) * 2 + 1)
        g.reset()

    def test_a_graph_beginning_its_capture_is_capturing_while_it_waits(self):
        # capture_begin() waits for the stream's queued work without the graph's lock: the graph was
        # not yet marked capturing, and a second capture_begin() on it from another thread was
        # accepted (the first capture's stream then stayed capturing).
        import threading

        s = torch.openreg.Stream()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            hold = StreamHold().__enter__()
        errors = []

        def begin():
            with torch.openreg.stream(s):
                g.capture_begin()  # waits for the hold

        first = threading.Thread(target=begin)
        first.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until the first call waits in the runtime (s captures)
                try:
                    s.query()  # refused while s captures, without voiding the capture
                except RuntimeError:
                    break
                time.sleep(0.01)
            try:
                with torch.openreg.stream(s):
                    g.capture_begin()
            except RuntimeError as e:
                errors.append(str(e))
        finally:
            hold.release()
            first.join()
        self.assertIn("This openreg graph has already been captured", errors[0])
        with torch.openreg.stream(s):
            g.capture_end()
        g.reset()

    def test_a_graph_sharing_the_pool_of_the_graph_it_replays_gives_the_pool_back(self):
        # The outer graph held the inner graph's pool, its own: counted twice for one capture, the
        # pool never went back (34 MiB kept for reset graphs, for the life of the process).
        torch.openreg.empty_cache()
        reserved = torch.openreg.memory_reserved()
        s = torch.openreg.Stream()
        inputs = [torch.ones(1 << 18, device="openreg")]

        def f():
            return (inputs[0] * 2 + 1).sum()

        warm_up(f, s)
        inner = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            inner.capture_begin()
            total = f()
            inner.capture_end()
        outer = torch.accelerator.Graph(pool=inner.pool())
        with torch.openreg.stream(s):
            outer.capture_begin()
            inner.replay()
            outer.capture_end()
            outer.replay()
        s.synchronize()
        self.assertEqual(total.item(), 3.0 * (1 << 18))
        del total
        inputs.clear()
        inner.reset()
        outer.reset()
        torch.openreg.empty_cache()
        self.assertEqual(torch.openreg.memory_reserved(), reserved)

    def test_the_pool_of_a_graph_not_captured_yet_is_refused(self):
        # It was (0, 0), which capture_begin reads as "a pool of its own": a graph meant to share the
        # pool silently got another. CUDA refuses too.
        message = "Called pool\\(\\) without a preceding successful capture"
        with self.assertRaisesRegex(RuntimeError, message):
            torch.accelerator.Graph().pool()
        g = torch.accelerator.Graph()
        with self.assertRaisesRegex(RuntimeError, "a graph cannot be captured on a device's default stream"):
            g.capture_begin()  # a failed capture: its pool went back, none to share
        with self.assertRaisesRegex(RuntimeError, message):
            g.pool()
        s = torch.openreg.Stream()
        with torch.openreg.stream(s):
            g.capture_begin()
            with self.assertRaisesRegex(RuntimeError, message):  # not yet: as CUDA's
                g.pool()
            g.capture_end()
        self.assertNotEqual(g.pool(), (0, 0))
        g.reset()

    def test_random_ops_draw_fresh_numbers_on_each_replay(self):
        """Graph-safe RNG, as CUDA graphs have: each replay re-seeds the captured random ops from the
        generator's current (seed, offset), so replays differ, and the sequence is reproducible."""
        x = torch.empty(256, device="openreg")
        s = torch.openreg.Stream()

        def step():
            x.normal_()
            return torch.nn.functional.dropout(x + 10, 0.5)

        warm_up(step, s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = step()
            g.capture_end()

        def replays(n):
            torch.openreg.manual_seed(21)
            out = []
            for _ in range(n):
                g.replay()
                out.append((x.cpu(), y.cpu()))  # .cpu() waits for the replay
            return out

        first = replays(3)
        self.assertNotEqual(first[0][0], first[1][0])
        self.assertNotEqual(first[1][1], first[2][1])
        x0, y0 = first[0]  # y is dropout of x + 10: zero where dropped, 2 (x + 10) where kept
        kept = y0 != 0
        self.assertEqual(y0[kept], (x0[kept] + 10) * 2)
        self.assertTrue(0.3 < kept.float().mean().item() < 0.7)
        self.assertEqual(replays(3), first)
        # Each replay advanced the offset as the two launches would have: (256 + 256) values per replay.
        torch.openreg.manual_seed(21)
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(torch.openreg.get_rng_state()[8:].view(torch.int64).item(), 512)
        g.reset()

    def test_a_capture_takes_no_numbers_from_the_generator(self):
        """As a CUDA capture (its ops take intragraph offsets): the captured ops' kernels do not run,
        so the generator's offset stays where it was, and a draw made meanwhile on another stream is
        not handed out again. Before, the capture advanced the offset, and openreg-inductor's
        reduce-overhead recording put the generator back after it, repeating such draws."""
        x = torch.empty(256, device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: x.normal_(), s)
        torch.openreg.manual_seed(5)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            x.normal_()
            other = torch.openreg.Stream()
            with torch.openreg.stream(other):  # not capturing: draws now
                during = torch.rand(8, device="openreg")
            g.capture_end()
        other.synchronize()  # `during` is read on the default stream below
        self.assertEqual(torch.openreg.get_rng_state()[8:].view(torch.int64).item(), 8)  # the draw's own
        after = torch.rand(8, device="openreg")
        torch.openreg.manual_seed(5)
        self.assertEqual(torch.rand(8, device="openreg"), during)
        self.assertEqual(torch.rand(8, device="openreg"), after)  # the generator went on from the draw
        g.replay()  # takes the numbers: 256 from offset 16 on
        self.assertEqual(torch.openreg.get_rng_state()[8:].view(torch.int64).item(), 16 + 256)
        torch.openreg.manual_seed(5)
        torch.rand(16, device="openreg")
        self.assertEqual(x.cpu(), torch.empty(256, device="openreg").normal_().cpu())
        g.reset()

    def test_context_manager_form(self):
        x = torch.ones(8, device="openreg")
        s = torch.Stream(device="openreg")
        warm_up(lambda: x.mul_(2), s)
        g = torch.accelerator.Graph()
        self.assertFalse(s.is_capturing())
        with s, g:
            x.mul_(2)
            # torch.Stream.is_capturing asks the device guard (its default answered False here)
            self.assertTrue(s.is_capturing())
            self.assertFalse(torch.openreg.default_stream().is_capturing())
        self.assertFalse(s.is_capturing())
        g.replay()
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(x.cpu(), torch.full((8,), 8.0))

    def test_a_step_of_a_non_capturable_optimizer_is_refused_in_a_capture(self):
        # Its step count and bias corrections live on the host: captured, every replay applied the
        # captured step's again, silently (Adam's parameters off by up to 0.04 after four replays).
        # torch refuses it only when the accelerator is cuda or xpu (_optim_capture.py; hunt36a).
        def make(capturable):
            p = torch.nn.Parameter(torch.ones(4, device="openreg"))
            p.grad = torch.full((4,), 0.5, device="openreg")
            return p, torch.optim.Adam([p], lr=0.1, foreach=True, capturable=capturable)

        s = torch.openreg.Stream()
        p, opt = make(capturable=False)
        warm_up(opt.step, s)
        before = p.detach().cpu()
        g = torch.accelerator.Graph()
        with self.assertRaisesRegex(
            RuntimeError,
            "^Attempting OPENREG graph capture of step\\(\\) for an instance of Adam "
            "but param_groups' capturable is False",
        ):
            with s, g:
                opt.step()
        self.assertFalse(s.is_capturing())
        torch.openreg.synchronize()
        self.assertEqual(p.detach().cpu(), before)  # nothing ran
        self.assertEqual(opt.state[p]["step"].item(), 1.0)
        # A capturable one is captured: its replays advance the step count on the device.
        p, opt = make(capturable=True)
        warm_up(opt.step, s)
        warm_up(opt.step, s)
        g = torch.accelerator.Graph()
        with s, g:
            opt.step()
        for _ in range(3):
            g.replay()
        torch.openreg.synchronize()
        q = torch.nn.Parameter(torch.ones(4))
        q.grad = torch.full((4,), 0.5)
        reference = torch.optim.Adam([q], lr=0.1)
        for _ in range(5):
            reference.step()
        self.assertEqual(p.detach().cpu(), q.detach())
        self.assertEqual(opt.state[p]["step"].item(), 5.0)
        g.reset()

    def test_waiting_inside_capture_is_refused(self):
        x = torch.ones(4, device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: x + 1, s)
        g = torch.accelerator.Graph()
        allocated = torch.openreg.memory_allocated()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x + 1
            with self.assertRaisesRegex(RuntimeError, "captured into a graph"):
                y.cpu()
            # A refused call invalidates the capture, as on CUDA: the graph held the work captured
            # around it and replayed it as if nothing had been refused.
            with self.assertRaisesRegex(RuntimeError, "the capture was invalidated by a call it refused"):
                g.capture_end()
        del y
        self.assertEqual(torch.openreg.memory_allocated(), allocated)  # the capture's memory went back
        g.reset()
        self.assertEqual((x + 1).cpu(), torch.full((4,), 2.0))  # the device works on

    def test_a_capturing_stream_waiting_for_outside_work_is_refused(self):
        # Captured, the wait held the event's generation at capture time: every replay passed it
        # at once and read inputs the producer had not written yet. CUDA refuses such a wait too.
        producer, s = torch.openreg.Stream(), torch.openreg.Stream()
        x = torch.ones(4, device="openreg")
        warm_up(lambda: x * 2, s)
        ready = producer.record_event()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            for wait in (lambda: s.wait_event(ready), lambda: s.wait_stream(producer)):
                g.capture_begin()
                with self.assertRaisesRegex(RuntimeError, "cannot wait for an event recorded outside the capture"):
                    wait()
                with self.assertRaisesRegex(RuntimeError, "the capture was invalidated"):
                    g.capture_end()
            g.capture_begin()
            y = x * 2
            g.capture_end()
        # the wait is made outside, before the replay, as on CUDA
        with torch.openreg.stream(producer):
            x.fill_(5)
        s.wait_stream(producer)
        with torch.openreg.stream(s):
            g.replay()
        s.synchronize()
        self.assertEqual(y.cpu(), torch.full((4,), 10.0))
        g.reset()

    def test_an_operator_that_always_needs_the_host_is_refused_without_warm_up_advice(self):
        # nonzero's result size depends on the data: warmed up three times, it was still refused with
        # the advice to warm it up.
        x = torch.tensor([0.0, 1.0, 0.0, 2.0], device="openreg")
        s = torch.openreg.Stream()
        for _ in range(3):
            warm_up(lambda: x.nonzero(), s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            with self.assertRaisesRegex(RuntimeError, "aten::nonzero: this call needs the host at every call") as e:
                x.nonzero()
            self.assertNotIn("capture_begin", str(e.exception))
            with self.assertRaises(RuntimeError):  # the refusal invalidated the capture
                g.capture_end()
        g.reset()
        self.assertEqual(x.nonzero().cpu(), torch.tensor([[1], [3]]))

    def test_an_operator_not_warmed_up_is_refused_before_it_launches(self):
        # Its first call runs synchronously: the kernel was captured, then the wait for it refused
        # with a message about synchronising a stream that named no operator.
        x = torch.ones(4, device="openreg")
        z = torch.ones(3, 7, dtype=torch.float64, device="openreg")  # a signature no other test calls
        s = torch.openreg.Stream()
        warm_up(lambda: x + 1, s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x + 1
            with self.assertRaisesRegex(
                RuntimeError, r"aten::special_i1e: this call runs synchronously .* before capture_begin"
            ):
                torch.special.i1e(z)
            # refused, it invalidates the capture as any refused call does: a caller that caught
            # the error does not get a graph without the operator
            with self.assertRaisesRegex(RuntimeError, "the capture was invalidated .*cannot synchronize a stream"):
                g.capture_end()
        self.assertEqual(torch.special.i1e(z).cpu(), torch.special.i1e(z.cpu()))  # warmed up
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x + 1
            w = torch.special.i1e(z)
            g.capture_end()
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(y.cpu(), torch.full((4,), 2.0))
        self.assertEqual(w.cpu(), torch.special.i1e(z.cpu()))
        g.reset()

    def test_an_invalidated_capture_gives_memory_back_after_the_streams_that_used_it(self):
        # It ends without a graph, so without the wait a graph's destruction makes: a block of its
        # pool that another stream used (record_stream) went straight back, and the next tensor
        # got it while that stream's queued fill still wrote it.
        n = 1 << 20
        s, t = torch.openreg.Stream(), torch.openreg.Stream()
        for stream in (s, t):
            warm_up(lambda: (torch.empty(n, device="openreg").fill_(7.0), torch.zeros(n, device="openreg")), stream)
        torch.openreg.synchronize()
        torch.openreg._inject_faults(f"slow@{hex(t.openreg_stream)}:300")  # t's next items start late
        self.addCleanup(torch.openreg._inject_faults, "")
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            buf = torch.empty(n, device="openreg")  # a block of the capture's pool
            with torch.openreg.stream(t):  # t does not capture: this runs
                buf.fill_(7.0)
            buf.record_stream(t)
            del buf  # kept for the graph
            with self.assertRaisesRegex(RuntimeError, "cannot synchronize a stream"):
                s.synchronize()
            with self.assertRaisesRegex(RuntimeError, "the capture was invalidated"):
                g.capture_end()
            fresh = torch.zeros(n, device="openreg")
        t.synchronize()  # its fill of the old block ran
        torch.openreg._inject_faults("")
        s.synchronize()
        self.assertEqual(fresh.cpu(), torch.zeros(n))

    def test_captured_memory_is_kept_until_reset(self):
        s = torch.openreg.Stream()
        x = torch.ones(256 * 1024, device="openreg")
        warm_up(lambda: (x * 3) + 1, s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            tmp = x * 3
            out = tmp + 1
            g.capture_end()
        tmp_ptr = tmp.data_ptr()
        del tmp  # a replay still writes there
        with torch.openreg.stream(s):
            other = torch.empty(256 * 1024, device="openreg")
        self.assertNotEqual(other.data_ptr(), tmp_ptr)
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(out.cpu(), torch.full((256 * 1024,), 4.0))
        g.reset()
        del other, out

    def test_a_stream_being_captured_refuses_a_query(self):
        # It answered True (all work done) for work that runs only at replay, from the capturing
        # thread and from others; CUDA refuses the query (hunt33b). The capture goes on.
        import threading

        x = torch.zeros(1000, device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: x.add_(1), s)
        message = "cannot query an openreg stream while it is being captured into a graph"
        g = torch.accelerator.Graph()
        errors = []

        def query_elsewhere():
            try:
                s.query()
            except RuntimeError as e:
                errors.append(str(e))

        with torch.openreg.stream(s):
            g.capture_begin()
            x.add_(1)
            with self.assertRaisesRegex(RuntimeError, message):
                s.query()
            thread = threading.Thread(target=query_elsewhere)
            thread.start()
            thread.join()
            g.capture_end()
        self.assertEqual(len(errors), 1)
        self.assertIn(message, errors[0])
        self.assertTrue(s.query())
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(x.cpu(), torch.full((1000,), 2.0))  # the warm-up, then the captured add_ once
        g.reset()

    def test_replays_on_two_streams_are_ordered(self):
        # As CUDA orders the launches of one graph exec: before, replays on two streams ran at once
        # on the same memory, so read-modify-writes lost updates (hunt33b: 8 to 16 of 2^20 elements
        # short), and a replay's re-seeding could run before the previous replay's random ops.
        s, a, b = torch.openreg.Stream(), torch.openreg.Stream(), torch.openreg.Stream()
        buf = torch.zeros(1 << 20, device="openreg")
        warm_up(lambda: buf.add_(1).zero_(), s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            for _ in range(20):
                buf.add_(1)
            g.capture_end()
        for _ in range(5):
            for stream in (a, b):
                with torch.openreg.stream(stream):
                    g.replay()
        torch.openreg.synchronize()
        self.assertEqual(buf.cpu(), torch.full((1 << 20,), 200.0))
        g.reset()

        acc = torch.zeros(1 << 16, device="openreg")
        warm_up(lambda: acc.add_(torch.randn(1 << 16, device="openreg")).zero_(), s)
        noisy = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            noisy.capture_begin()
            for _ in range(10):
                acc.add_(torch.randn(1 << 16, device="openreg"))
            noisy.capture_end()

        def replays(streams):
            acc.zero_()
            torch.openreg.manual_seed(7)
            for stream in streams:
                stream.wait_stream(torch.openreg.current_stream())
                with torch.openreg.stream(stream):
                    noisy.replay()
            torch.openreg.synchronize()
            return acc.cpu()

        self.assertEqual(replays((a, b, a, b)), replays((a, a, a, a)))
        noisy.reset()

    def test_temporaries_freed_during_a_capture_are_reused_by_it(self):
        # As CUDA's private pools: a block freed during the capture goes to the graph's pool, where
        # the capture's later allocations on that stream take it (a replay runs in capture order).
        # Kept out of the pool, a chain of 40 temporaries of 1 MiB reserved 40 MiB.
        s = torch.openreg.Stream()
        x = torch.ones(1 << 18, device="openreg")  # 1 MiB
        warm_up(lambda: x * 1.5 + 1, s)
        torch.openreg.empty_cache()
        reserved = torch.openreg.memory_reserved()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x
            for _ in range(40):
                y = y * 1.5 + 1
            g.capture_end()
        self.assertLessEqual(torch.openreg.memory_reserved() - reserved, 4 << 20)
        want = torch.ones(1 << 18)
        for _ in range(40):
            want = want * 1.5 + 1
        for _ in range(2):
            g.replay()
            torch.openreg.synchronize()
            self.assertEqual(y.cpu(), want)
        # Free in the graph's pool, those blocks are inactive; nothing outside the graph takes them.
        snapshot = torch.openreg.memory_snapshot()
        active = sum(b["size"] for seg in snapshot for b in seg["blocks"] if b["state"] != "inactive")
        self.assertEqual(active, torch.openreg.memory_stats(0)["active_bytes.all.current"])
        self.assertEqual(active, torch.openreg.memory_allocated())  # nothing freed is kept active
        # The inactive-split statistics count them as the snapshot shows them (they were left out).
        split = [
            b["size"]
            for seg in snapshot
            if seg["device"] == 0 and len(seg["blocks"]) > 1
            for b in seg["blocks"]
            if b["state"] == "inactive"
        ]
        stats = torch.openreg.memory_stats(0)
        self.assertGreater(len(split), 0)
        self.assertEqual(
            (stats["inactive_split.all.current"], stats["inactive_split_bytes.all.current"]), (len(split), sum(split))
        )
        with torch.openreg.stream(s):
            outside = [torch.empty(1 << 18, device="openreg") for _ in range(2)]
        self.assertTrue(all(t.data_ptr() != y.data_ptr() for t in outside))
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(y.cpu(), want)
        del y, outside
        g.reset()

    def test_graph_pool_reuse_keeps_small_and_large_blocks_apart(self):
        # A small request took a large block freed during the capture: counted in the small pool at
        # its allocation and taken off the large one at its free, the pools' statistics drifted.
        s = torch.openreg.Stream()
        x, xs = torch.ones(1536 << 8, device="openreg"), torch.ones(800 << 8, device="openreg")  # 1.5, 0.78 MiB
        warm_up(lambda: (x + 1, xs + 1), s)

        def pools():
            stats = torch.openreg.memory_stats(0)
            return [stats[f"allocated_bytes.{p}.current"] for p in ("small_pool", "large_pool", "all")]

        before = pools()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            big = x + 1  # large pool
            big_ptr = big.data_ptr()
            del big  # into the graph's pool
            small = xs + 1  # a small request: not the large block
            g.capture_end()
        self.assertNotEqual(small.data_ptr(), big_ptr)
        del small
        self.assertEqual(pools(), before)
        g.reset()
        self.assertEqual(pools(), before)

    def test_a_graph_sharing_the_pool_reuses_its_free_blocks(self):
        s = torch.openreg.Stream()
        x = torch.ones(1 << 18, device="openreg")
        warm_up(lambda: (x + 1) * 2, s)
        g1 = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g1.capture_begin()
            tmp = x + 1
            a = tmp * 2
            g1.capture_end()
        tmp_ptr = tmp.data_ptr()
        del tmp  # free in g1's pool
        g2 = torch.accelerator.Graph(pool=g1.pool())
        with torch.openreg.stream(s):
            g2.capture_begin()
            b = x + 3  # takes the freed temporary: g2 replays after g1, in order, on one stream
            g2.capture_end()
        self.assertEqual(b.data_ptr(), tmp_ptr)
        with torch.openreg.stream(s):
            g1.replay()
            g2.replay()
        torch.openreg.synchronize()
        self.assertEqual((a.cpu(), b.cpu()), (torch.full((1 << 18,), 4.0), torch.full((1 << 18,), 4.0)))
        del a, b
        g1.reset()
        g2.reset()

    def test_adjacent_captured_blocks_freed_before_the_graph(self):
        # Two blocks of one segment, both kept for the graph, released when it goes: neither may
        # be merged into the other while it is still kept (that freed one block twice).
        s = torch.openreg.Stream()
        x = torch.ones(4, device="openreg")
        warm_up(lambda: x * 2 + 1, s)
        torch.openreg.empty_cache()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x * 2 + 1  # the temporary x * 2 and y are neighbours
            g.capture_end()
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(y.cpu(), torch.full((4,), 3.0))
        del y
        allocated = torch.openreg.memory_allocated()
        g.reset()
        self.assertEqual(torch.openreg.memory_allocated(), allocated)
        torch.openreg.empty_cache()
        self.assertEqual([z.cpu().tolist() for z in (x * 2, x + 5)], [[2.0] * 4, [6.0] * 4])

    def test_graph_alive_at_interpreter_exit(self):
        from conftest import run_python

        r = run_python(
            """
            import torch
            s = torch.openreg.Stream()
            x = torch.ones(4, device="openreg")
            with torch.openreg.stream(s):
                x * 2 + 1
            s.synchronize()
            g = torch.accelerator.Graph()
            with torch.openreg.stream(s):
                g.capture_begin()
                y = x * 2 + 1
                g.capture_end()
            g.replay()
            torch.openreg.synchronize()
            print(y.cpu().tolist())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "[3.0, 3.0, 3.0, 3.0]")

    def test_out_of_memory_names_the_memory_kept_for_graphs(self):
        # Freed blocks a graph keeps are neither allocated nor releasable by empty_cache(): the
        # message pointed only at tensors and the cache, which cannot help; reset() does.
        from conftest import run_python

        r = run_python(
            """
            import torch
            s = torch.openreg.Stream()
            graphs = []
            for _ in range(4):
                g = torch.accelerator.Graph()
                with torch.openreg.stream(s):
                    g.capture_begin()
                    t = torch.empty(12 << 20, dtype=torch.uint8, device="openreg")
                    del t  # kept for the graph: a replay would write it
                    g.capture_end()
                graphs.append(g)
            try:
                torch.empty(30 << 20, dtype=torch.uint8, device="openreg")
            except torch.OutOfMemoryError as e:
                print(e)
            for g in graphs:
                g.reset()
            print(torch.empty(30 << 20, dtype=torch.uint8, device="openreg").numel())
            """,
            env={"OPENREG_DEVICE_MEMORY": "64M"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        message, after = r.stdout.strip().splitlines()
        self.assertIn(
            "0.00 KiB allocated by PyTorch, 48.00 MiB freed but kept for captured graphs "
            "(reset() the graphs you no longer replay), 48.00 MiB reserved by PyTorch",
            message,
        )
        self.assertEqual(after, str(30 << 20))

    def test_capture_on_the_default_stream_is_refused(self):
        # Every thread's current stream is the default one unless set: capturing there swallowed
        # other threads' work into the graph, which then never ran.
        import threading

        x = torch.ones(4, device="openreg")
        (x + 1).cpu()
        g = torch.accelerator.Graph()
        with self.assertRaisesRegex(RuntimeError, "cannot be captured on a device's default stream"):
            g.capture_begin()
        result = {}
        t = threading.Thread(target=lambda: result.update(y=(x + 1).cpu()))
        t.start()
        t.join()
        self.assertEqual(result["y"], torch.full((4,), 2.0))
        s = torch.openreg.Stream()
        warm_up(lambda: x * 3, s)
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x * 3
            g.capture_end()
        g.replay()  # on the default stream: fine
        torch.openreg.synchronize()
        self.assertEqual(y.cpu(), torch.full((4,), 3.0))
        g.reset()

    def test_synchronizing_the_device_during_a_capture_is_refused(self):
        x = torch.ones(4, device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: x * 2, s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x * 2
            with self.assertRaisesRegex(RuntimeError, "cannot synchronize a device while one of its streams is being"):
                torch.openreg.synchronize()
            # the refusal invalidated the capture, as on CUDA: it ends without a graph
            with self.assertRaisesRegex(RuntimeError, "the capture was invalidated by a call it refused"):
                g.capture_end()
            with self.assertRaisesRegex(RuntimeError, "replay\\(\\) needs a captured graph"):
                g.replay()
            g.capture_begin()
            y = x * 2
            g.capture_end()
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(y.cpu(), torch.full((4,), 2.0))
        g.reset()

    def test_tensor_used_by_another_stream_freed_during_capture(self):
        # Its events cannot be recorded while a stream captures: the free threw inside the
        # tensor's deleter and the process aborted. They are recorded when the capture ends.
        s, other = torch.openreg.Stream(), torch.openreg.Stream()
        x = torch.ones(1000, device="openreg")
        warm_up(lambda: torch.ones(1000, device="openreg") * 2, s)
        x.record_stream(other)
        ptr = x.data_ptr()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x * 2
            del x
            g.capture_end()
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(y.cpu(), torch.full((1000,), 2.0))
        g.reset()
        torch.openreg.synchronize()
        z = torch.empty(1000, device="openreg")  # the freed block is reusable after its events
        self.assertEqual(z.data_ptr(), ptr)

    def test_source_of_a_copy_to_a_capturing_device_freed_during_the_capture(self):
        # A copy from device 0 queued on a stream of device 1 records its source there; the source
        # died while that stream captured, device 0's free recorded an event on the capturing stream
        # inside the tensor's deleter, and the process aborted. Its event now waits for the capture's end.
        s1 = torch.openreg.Stream(device=1)
        y = torch.ones(1024, device="openreg:1")
        torch.openreg.empty_cache()
        base = torch.openreg.memory_reserved(0)
        src = torch.randn(4 << 20, device="openreg:0")  # a segment of its own
        expected = src.cpu()
        with torch.openreg.stream(s1):
            dst = src.to("openreg:1")
            y.mul_(2)
        s1.synchronize()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s1):
            g.capture_begin()
            y.mul_(2)
            del src
            g.capture_end()
        with torch.openreg.stream(s1):
            g.replay()
        s1.synchronize()
        self.assertEqual(y.cpu(), torch.full((1024,), 4.0))  # eager, then one replay
        self.assertEqual(dst.cpu(), expected)
        torch.openreg.empty_cache()  # the source's block came back once its event could be recorded
        self.assertEqual(torch.openreg.memory_reserved(0), base)
        g.reset()

    def test_pinned_copies_are_captured(self):
        # The refusal of a pageable copy says to use pinned memory and a non-blocking copy; that
        # was refused too (the pinned block's event cannot be recorded on a capturing stream). A
        # pinned block a captured copy used is never handed out again: every replay uses it.
        s = torch.openreg.Stream()
        host = {"in": torch.empty(4, pin_memory=True), "out": torch.empty(4, pin_memory=True)}
        dev = torch.zeros(4, device="openreg")

        def step():
            dev.copy_(host["in"], non_blocking=True)
            host["out"].copy_(dev * 2, non_blocking=True)

        host["in"].fill_(1)
        g = captured(step, s)
        for value in replay_each(g, s, (3.0, 5.0), host["in"].fill_):
            self.assertEqual(host["out"], torch.full((4,), 2 * value))
        kept = {t.data_ptr() for t in host.values()}
        host.clear()
        again = [torch.empty(4, pin_memory=True) for _ in range(4)]
        self.assertFalse(kept & {t.data_ptr() for t in again})
        g.reset()

    def test_pinned_copies_that_convert_are_captured(self):
        # As CUDA's: a non-blocking copy between pinned memory and the device that changes the dtype
        # or the layout moves the bytes as they are and converts on the device. It converted on the
        # host into pageable memory, and a capture refused it, saying to use pinned memory (hunt36d).
        s = torch.openreg.Stream()
        host = {
            "in": torch.empty(4, 2, pin_memory=True),
            "out": torch.empty(4, 2, dtype=torch.float64, pin_memory=True),
        }
        dev = torch.zeros(2, 4, dtype=torch.float64, device="openreg")

        def step():
            dev.t().copy_(host["in"], non_blocking=True)  # float32 into a transposed float64 view
            host["out"].copy_(dev.t() * 2, non_blocking=True)  # a strided source

        host["in"].copy_(torch.arange(8.0).view(4, 2))
        g = captured(step, s)
        for value in replay_each(g, s, (3.0, 5.0), lambda v: host["in"].copy_(torch.arange(8.0).view(4, 2) + v)):
            self.assertEqual(host["out"], (torch.arange(8.0).view(4, 2) + value).double() * 2)
        g.reset()

    def test_graphs_sharing_a_pool_keep_it_until_the_last_is_reset(self):
        # Resetting one graph released every block of the shared pool, so the other graph's
        # replay wrote into memory that had been handed out again.
        n = 1 << 16
        s = torch.openreg.Stream()
        x = torch.ones(n, device="openreg")
        warm_up(lambda: (x + 1, x * 2), s)
        g1 = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g1.capture_begin()
            a = x + 1
            g1.capture_end()
        g2 = torch.accelerator.Graph(pool=g1.pool())
        with torch.openreg.stream(s):
            g2.capture_begin()
            b = x * 2
            g2.capture_end()
        b_ptr = b.data_ptr()
        g1.reset()
        del a, b
        with torch.openreg.stream(s):
            c = torch.full((n,), 7.0, device="openreg")
            self.assertNotEqual(c.data_ptr(), b_ptr)
            g2.replay()
        torch.openreg.synchronize()
        self.assertEqual(c.cpu(), torch.full((n,), 7.0))
        g2.reset()

    def test_replay_captured_into_another_graph_outlives_the_first(self):
        # g2 replays g1's work: deleting g1 freed the arguments g2's copy of that work reads.
        s = torch.openreg.Stream()
        x = torch.arange(1000.0, device="openreg")
        warm_up(lambda: x.sin(), s)
        with torch.openreg.stream(s):
            g1 = torch.accelerator.Graph()
            g1.capture_begin()
            z = x.sin()
            g1.capture_end()
            g2 = torch.accelerator.Graph()
            g2.capture_begin()
            g1.replay()
            g2.capture_end()
            del g1
            junk = [torch.randn(1000, device="openreg").cos() for _ in range(20)]  # reuse freed memory
            x.mul_(2)
            g2.replay()
        torch.openreg.synchronize()
        self.assertEqual(z.cpu(), (torch.arange(1000.0) * 2).sin())
        del junk
        g2.reset()

    def test_memory_kept_for_a_graph_is_active_in_the_snapshot(self):
        s = torch.openreg.Stream()
        x = torch.ones(3 << 18, device="openreg")  # 3 MiB
        warm_up(lambda: x + 1, s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            w = x + 1
            g.capture_end()
        del w  # freed, kept for the graph's replays
        active = sum(
            b["size"]
            for seg in torch.openreg.memory_snapshot()
            for b in seg["blocks"]
            if b["state"] != "inactive" and seg["device"] == 0
        )
        self.assertEqual(active, torch.openreg.memory_stats(0)["active_bytes.all.current"])
        g.reset()

    def test_warmed_up_op_is_captured_after_the_meta_cache_fills(self):
        # The generic path caches meta results per exact signature (16,384 of them) and drops the
        # cache when it is full. The flush dropped the first-call verdicts too, so a warmed-up op
        # whose exact signature had gone was verified again, synchronously, inside the capture:
        # "cannot synchronize a stream while the stream is being captured".
        x = torch.zeros(1000, device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: x.add_(1), s)
        pool = torch.zeros(100_000, device="openreg")
        for n in range(16_400):  # as many new exact signatures as the cache holds, and more
            pool.as_strided((n % 97 + 1,), (1,), n // 97).neg()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            x.add_(1)
            g.capture_end()
        s.synchronize()
        self.assertEqual(x.cpu(), torch.full((1000,), 1.0))  # recorded, not run
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(x.cpu(), torch.full((1000,), 2.0))
        g.reset()

    def test_debug_dump_and_errors(self):
        g = torch.accelerator.Graph()
        with self.assertRaisesRegex(RuntimeError, "needs a captured graph"):
            g.replay()
        x = torch.zeros(4, device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: x.add_(1), s)
        g.enable_debug_mode()
        with torch.openreg.stream(s):
            g.capture_begin()
            x.add_(1)
            g.capture_end()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "graph.txt")
            g.debug_dump(path)
            with open(path) as f:
                text = f.read()
        self.assertIn("1 work items", text)
        self.assertIn("aten::add", text)
        with torch.openreg.stream(s), self.assertRaisesRegex(RuntimeError, "already been captured"):
            g.capture_begin()
        g.reset()


if __name__ == "__main__":
    run_tests()
