"""mode="reduce-overhead" on openreg (openreg_inductor/graphs.py): compiled graphs recorded as openreg
device graphs and replayed with one graph launch per call, each call compared with CPU Inductor on
the same inputs; new input signatures record new graphs; graph-unsafe graphs run as ordinary compiled
code with a warning that says why."""

import copy

import torch
from conftest import hold_stream, release
from torch._dynamo.utils import counters
from torch._inductor import config
from torch.testing._internal.common_utils import TestCase, run_tests

RO = dict(mode="reduce-overhead")


COUNTED = ("graphs_launched", "kernels_launched", "memcpy_h2d", "memcpy_d2h", "memcpy_d2d")


def delta(before, after):
    return {k: after[k] - before[k] for k in COUNTED}


@torch.library.custom_op("openreg_inductor_test::host_round_trip", mutates_args=())
def host_round_trip(x: torch.Tensor) -> torch.Tensor:
    """Reads the tensor on the host: an openreg graph cannot capture that (the copy waits)."""
    return x.cpu().to(x.device) + 1


@host_round_trip.register_fake
def _(x):
    return torch.empty_like(x)


class GraphModeTest(TestCase):
    def setUp(self):
        super().setUp()
        torch._dynamo.reset()
        counters.clear()

    def graphs(self):
        return {k: counters["openreg_graphs"][k] for k in ("recorded", "replayed", "skipped")}


class TestReplay(GraphModeTest):
    def test_graphs_in_another_thread(self):
        # Inductor options set by assignment hold in the assigning thread only (torch 2.13): the
        # policy the plugin installed at import did not reach other threads, where
        # mode="reduce-overhead" ran without openreg graphs and without a warning
        # (_torch213.set_inductor_default).
        import threading

        f = torch.compile(lambda x: (x.sin() * 2).sum(0), **RO)
        x = torch.randn(8, 4, device="openreg")
        got = []
        worker = threading.Thread(target=lambda: got.extend(f(x).cpu() for _ in range(4)))
        worker.start()
        worker.join()
        self.assertEqual(len(got), 4)
        for g in got:
            self.assertEqual(g, (x.cpu().sin() * 2).sum(0), atol=1e-5, rtol=1e-5)
        self.assertEqual(self.graphs(), {"recorded": 1, "replayed": 3, "skipped": 0})

    def test_one_graph_launch_per_call(self):
        """After the warm-up and the recording, a call is: the non-static input copied into the graph's
        buffer, one graph launch, the outputs copied out; no kernel launched one by one, nothing copied
        between host and device. Parameters are static inputs: used in place, not copied."""
        torch.manual_seed(0)

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(32, 48)

            def forward(self, x):
                y = self.lin(x)
                return torch.softmax(y, dim=-1) * 2, y.relu().sum()

        cpu_model = M()
        or_model = copy.deepcopy(cpu_model).to("openreg")
        cpu_compiled, or_compiled = torch.compile(cpu_model, **RO), torch.compile(or_model, **RO)
        with torch.no_grad():
            for i in range(4):
                x = torch.randn(16, 32)
                expected = cpu_compiled(x)
                x_or = x.to("openreg")
                torch.openreg.synchronize()
                before = torch.openreg._runtime_counters()
                out = or_compiled(x_or)
                after = torch.openreg._runtime_counters()
                self.assertEqual([t.cpu() for t in out], list(expected), atol=1e-5, rtol=1e-5)
        self.assertEqual(self.graphs(), {"recorded": 1, "replayed": 3, "skipped": 0})
        # The last call replayed: one graph launched, 1 input + 2 outputs copied on the device, no kernel
        # launched one by one.
        expected_delta = {
            "graphs_launched": 1,
            "kernels_launched": 0,
            "memcpy_h2d": 0,
            "memcpy_d2h": 0,
            "memcpy_d2d": 3,
        }
        self.assertEqual(delta(before, after), expected_delta)

    def test_new_shapes_record_new_graphs(self):
        """dynamic=True: one compile, one graph per size, each size replayed afterwards."""

        def f(x, y):
            return (x.sin() * y + 1).sum(-1), x.cos()

        cpu_f, or_f = torch.compile(f, dynamic=True, **RO), torch.compile(f, dynamic=True, **RO)
        for n in (8, 8, 5, 5, 5, 8, 8):
            x, y = torch.randn(n, 24), torch.randn(n, 24)
            out = or_f(x.to("openreg"), y.to("openreg"))
            self.assertEqual([t.cpu() for t in out], list(cpu_f(x, y)))
        self.assertEqual(counters["stats"]["unique_graphs"], 2)  # one graph each for openreg and the CPU
        self.assertEqual(self.graphs(), {"recorded": 2, "replayed": 5, "skipped": 0})

    def test_input_mutation(self):
        """A mutated input that is not static is copied into the graph and back to the caller's tensor."""

        def f(x, y):
            x.mul_(2).add_(y)
            return x * y

        cpu_f, or_f = torch.compile(f, **RO), torch.compile(f, **RO)
        for _ in range(4):
            x, y = torch.randn(40), torch.randn(40)
            x_or, y_or = x.to("openreg"), y.to("openreg")
            self.assertEqual(or_f(x_or, y_or).cpu(), cpu_f(x, y))
            self.assertEqual(x_or.cpu(), x)
        self.assertEqual(self.graphs(), {"recorded": 1, "replayed": 3, "skipped": 0})

    def test_training_step(self):
        """Forward and backward graphs (AOTAutograd) and the optimizer step, each replayed as a graph,
        four SGD steps against CPU Inductor."""
        torch.manual_seed(0)
        cpu_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        or_model = copy.deepcopy(cpu_model).to("openreg")

        def make(model):
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            forward = torch.compile(model, **RO)

            @torch.compile(**RO)
            def step():
                opt.step()
                opt.zero_grad()

            def train(x, y):
                loss = torch.nn.functional.mse_loss(forward(x), y)
                loss.backward()
                step()
                return loss.detach()

            return train

        cpu_train, or_train = make(cpu_model), make(or_model)
        for _ in range(4):
            x, y = torch.randn(8, 16), torch.randn(8, 4)
            self.assertEqual(or_train(x.to("openreg"), y.to("openreg")).cpu(), cpu_train(x, y), atol=1e-5, rtol=1e-5)
        for p_or, p_cpu in zip(or_model.parameters(), cpu_model.parameters(), strict=True):
            self.assertEqual(p_or.cpu(), p_cpu, atol=1e-5, rtol=1e-5)
        self.assertGreaterEqual(counters["openreg_graphs"]["recorded"], 3)  # forward, backward, step
        self.assertEqual(counters["openreg_graphs"]["skipped"], 0)

    def test_random_numbers_fresh_and_as_without_graphs(self):
        """Replays draw fresh random numbers (core re-seeds captured random ops from the generator),
        the same ones the ordinary compiled code draws under the same seed."""

        def f(x):
            return torch.nn.functional.dropout(x, 0.5, training=True) + 1

        x = torch.randn(512, device="openreg")
        graphed, plain = torch.compile(f, **RO), torch.compile(f)
        graphed(x), graphed(x)  # warm-up, recording
        torch.openreg.manual_seed(5)
        replays = [graphed(x).cpu() for _ in range(3)]
        torch.openreg.manual_seed(5)
        ordinary = [plain(x).cpu() for _ in range(3)]
        self.assertNotEqual(replays[0], replays[1])
        self.assertEqual(replays, ordinary)
        self.assertEqual(counters["openreg_graphs"]["recorded"], 1)

    def test_recording_call_draws_as_without_graphs(self):
        """Seeded before every call: the warm-up, the recording call and the replays draw the numbers the
        ordinary compiled code draws, and leave every device's generator where it does (the capture's
        draws are put back: before, the recording call drew at other offsets and advanced the generator
        twice, shifting every later draw), so the next eager draw matches too. Several random ops, one
        offset for all (Inductor's seeds) or one each (fallback_random), and a graph on the second device."""

        def f(x):
            return torch.rand_like(x) + torch.randn_like(x) * torch.nn.functional.dropout(x + 1, 0.5)

        def calls(mode, device):
            torch._dynamo.reset()
            compiled = torch.compile(f, mode=mode)
            x = torch.ones(64, device=device)
            results = []
            for _ in range(4):  # warm-up, recording, two replays
                torch.openreg.manual_seed_all(7)
                out = compiled(x).cpu()
                results.append((out, torch.rand(8, device=device).cpu(), torch.openreg.get_rng_state_all()))
            return results

        for device, fallback_random in (("openreg", False), ("openreg", True), ("openreg:1", False)):
            with config.patch({"fallback_random": fallback_random}):
                counters.clear()
                graphed = calls("reduce-overhead", device)
                self.assertEqual(self.graphs(), {"recorded": 1, "replayed": 3, "skipped": 0})
                ordinary = calls(None, device)
            for i, ((out, eager, states), expected) in enumerate(zip(graphed, ordinary, strict=True)):
                msg = f"{device}, fallback_random={fallback_random}, call {i}"
                self.assertEqual(out, expected[0], atol=0, rtol=0, msg=msg)
                self.assertEqual(eager, expected[1], atol=0, rtol=0, msg=msg)
                self.assertEqual(states, expected[2], msg=msg)
            self.assertNotEqual(graphed[0][0], graphed[0][1])

    def test_checkpointed_dropout_replays_recompute_the_forward_mask(self):
        """Activation checkpointing of a random op: AOTAutograd passes the forward and backward graphs
        generator states (core's graph-safe RNG); the recorded graphs draw from those states, so each
        replayed backward recomputes the mask its forward drew, and each call draws a fresh one."""
        from torch.utils.checkpoint import checkpoint

        def f(x):
            return checkpoint(lambda t: torch.nn.functional.dropout(t * 1.0, 0.5), x, use_reentrant=False)

        compiled = torch.compile(f, **RO)
        torch.openreg.manual_seed(0)
        masks, recorded = [], []
        for _ in range(5):
            x = torch.ones(2048, device="openreg", requires_grad=True)
            y = compiled(x)
            y.sum().backward()  # the gradient is the recomputed mask times 2
            y, grad = y.detach().cpu(), x.grad.cpu()
            self.assertEqual(set(y.unique().tolist()), {0.0, 2.0})
            self.assertEqual(grad, y)
            masks.append(y)
            recorded.append(counters["openreg_graphs"]["recorded"])
        self.assertTrue(all(not torch.equal(a, b) for a, b in zip(masks, masks[1:])))
        # Forward and backward recorded (the backward's saved activations may record it once more,
        # as their buffers move); then only replays.
        self.assertGreaterEqual(recorded[1], 2)
        self.assertEqual(recorded[-1], recorded[-3])
        self.assertGreaterEqual(counters["openreg_graphs"]["replayed"], 6)

    def test_outputs_that_share_storage_still_do(self):
        """An output and views of it: the ordinary compiled code returns views of one storage, so an
        in-place change to one shows in the others. Replays copy such outputs out once, into one new
        storage, each a view on it at its offset (before, each was copied on its own from the recording
        call on). An output that is a view of an input stays a view of the caller's tensor."""

        def f(x):
            y = x.sin()
            return y, y.view(-1), y[1:, 1], x[1:]

        def calls(mode):
            torch._dynamo.reset()
            compiled = torch.compile(f, mode=mode)
            results = []
            for i in range(4):  # warm-up, recording, two replays
                x = torch.arange(15.0, device="openreg").view(5, 3)[1:] + i  # a storage offset of 3
                outs = compiled(x)
                outs[0].add_(1)  # seen through the views of it
                x.mul_(2)  # seen through the view of x
                storages = [o.untyped_storage().data_ptr() for o in outs]
                layout = [(o.size(), o.stride(), o.storage_offset()) for o in outs]
                shared = [s == storages[0] for s in storages] + [storages[3] == x.untyped_storage().data_ptr()]
                results.append(([o.cpu() for o in outs], layout, shared))
            return results

        graphed = calls("reduce-overhead")
        self.assertEqual(self.graphs(), {"recorded": 1, "replayed": 3, "skipped": 0})
        ordinary = calls(None)
        for i, (got, expected) in enumerate(zip(graphed, ordinary, strict=True)):
            self.assertEqual(got, expected, atol=0, rtol=0, msg=f"call {i}")
            self.assertEqual(got[2], [True, True, True, False, True], msg=f"call {i}")

    def test_view_of_an_input_at_a_symbolic_offset(self):
        """x[n:] with n symbolic: AOTAutograd rebuilds the view of the caller's x with as_strided at the
        storage offset of the graph's output, so a replay's output must be that view of the caller's x,
        not of the graph's input buffer (before, a copy at offset 0: the values of x[0:])."""

        def f(x, n):
            return x.sin(), x[n:]

        def calls(mode):
            torch._dynamo.reset()
            compiled = torch.compile(f, mode=mode, dynamic=True)
            results = []
            for n in (1, 1, 1, 2, 2, 2):
                x = torch.arange(18.0, device="openreg").view(6, 3)[1:]
                sin, view = compiled(x, n)
                x.add_(1)
                shares = view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
                results.append((sin.cpu(), view.cpu(), view.storage_offset(), shares))
            return results

        graphed = calls("reduce-overhead")
        self.assertEqual(self.graphs(), {"recorded": 2, "replayed": 4, "skipped": 0})
        self.assertEqual(graphed, calls(None), atol=0, rtol=0)

    def test_replays_on_two_streams_keep_their_inputs(self):
        """One recording has one set of input buffers: a replay on another stream waits until the
        running replay has copied its results out before it copies its own input in."""

        def f(x):
            return hold_stream(x).sin() * 2 + x

        graphed = torch.compile(f, **RO)
        a, b = torch.randn(64, device="openreg"), torch.randn(64, device="openreg")
        release.set()
        expected = [f(a).cpu(), f(b).cpu()]
        graphed(a), graphed(a)  # warm-up, recording
        first, second = torch.openreg.Stream(), torch.openreg.Stream()
        first.wait_stream(torch.openreg.current_stream())
        second.wait_stream(torch.openreg.current_stream())
        release.clear()
        try:
            with torch.openreg.stream(first):
                out_a = graphed(a)  # held inside the graph, after its input was copied in
            with torch.openreg.stream(second):
                out_b = graphed(b)
        finally:
            release.set()
        torch.openreg.synchronize()
        self.assertEqual([out_a.cpu(), out_b.cpu()], expected)
        self.assertEqual(self.graphs(), {"recorded": 1, "replayed": 3, "skipped": 0})

    def test_training_recordings_and_memory_stay_bounded(self):
        """Inductor calls a backward graph's saved activations static (CUDA graph trees keep them at
        fixed addresses), and an optimizer graph's gradients; here both move every step. 60 SGD steps
        on new batches: no recording after the first steps, memory flat, every step's loss and the
        final parameters equal to eager openreg's."""
        torch.manual_seed(0)
        eager_model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        eager_model = eager_model.to("openreg")
        graphed_model = copy.deepcopy(eager_model)

        def make(model, compile):
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            forward = torch.compile(model, **RO) if compile else model

            def step():
                opt.step()
                opt.zero_grad()  # the gradients are None until the next backward makes new ones

            step = torch.compile(step, **RO) if compile else step

            def train(x):
                loss = forward(x).square().mean()
                loss.backward()
                step()
                return loss.item()

            return train

        eager_train, graphed_train = make(eager_model, False), make(graphed_model, True)
        for i in range(60):
            x = torch.randn(32, 64, device="openreg")
            self.assertEqual(graphed_train(x), eager_train(x), atol=1e-5, rtol=1e-5, msg=f"step {i}")
            del x
            torch.openreg.synchronize()
            if i == 10:
                recorded, allocated = counters["openreg_graphs"]["recorded"], torch.openreg.memory_allocated()
                replayed = counters["openreg_graphs"]["replayed"]
            elif i > 10:
                self.assertEqual(torch.openreg.memory_allocated(), allocated, msg=f"step {i}")
        self.assertEqual(counters["openreg_graphs"]["recorded"], recorded)
        self.assertLessEqual(recorded, 5)  # a few, of the forward, backward and optimizer step graphs
        self.assertEqual(counters["openreg_graphs"]["replayed"] - replayed, 3 * 49)  # every later call replayed
        for p_graphed, p_eager in zip(graphed_model.parameters(), eager_model.parameters(), strict=True):
            self.assertEqual(p_graphed, p_eager, atol=1e-5, rtol=1e-5)

    def test_warning_names_why_a_graph_has_many_recordings(self):
        with config.patch({"triton.cudagraph_dynamic_shape_warn_limit": 2}):
            by_shape = torch.compile(lambda x: x.sin() + 1, dynamic=True, **RO)
            with self.assertWarnsRegex(UserWarning, r"this graph has 3 recordings, .* for 3 input signatures \(shapes"):
                for n in (3, 3, 4, 4, 5, 5):
                    by_shape(torch.randn(n, device="openreg"))
            torch._dynamo.reset()
            # With nn modules inlined, every Linear shares one compiled graph; its parameters are used in place.
            by_parameters = torch.compile(lambda m, x: m(x), **RO)
            x = torch.randn(4, 8, device="openreg")
            with self.assertWarnsRegex(UserWarning, r"this graph has 3 recordings, .* for other parameter tensors"):
                for m in [torch.nn.Linear(8, 8).to("openreg") for _ in range(3)]:
                    self.assertEqual(by_parameters(m, x), m(x))
                    self.assertEqual(by_parameters(m, x), m(x))


class TestFallback(GraphModeTest):
    def test_cpu_scalar_graph_runs_without_a_graph(self):
        def f(x, s):
            return x * s + 1

        cpu_f, or_f = torch.compile(f, **RO), torch.compile(f, **RO)
        with self.assertWarnsRegex(UserWarning, "runs this graph without an openreg graph: it uses cpu tensors"):
            or_f(torch.ones(10, device="openreg"), torch.tensor(2.0))
        for value in (3.0, 4.0, 5.0):  # a recorded graph would have kept the first scalar
            x, s = torch.randn(10), torch.tensor(value)
            self.assertEqual(or_f(x.to("openreg"), s).cpu(), cpu_f(x, s))
        self.assertEqual(self.graphs(), {"recorded": 0, "replayed": 0, "skipped": 1})

    def test_refused_capture_runs_without_a_graph(self):
        """An operation that waits for the device inside the graph: the runtime refuses the capture,
        the graph runs as ordinary compiled code from then on."""

        def f(x):
            return host_round_trip(x.sin()) * 2

        cpu_f, or_f = torch.compile(f, **RO), torch.compile(f, **RO)
        x = torch.randn(64)
        self.assertEqual(or_f(x.to("openreg")).cpu(), cpu_f(x))  # warm-up
        with self.assertWarnsRegex(UserWarning, "runs this graph without an openreg graph: the capture failed: "):
            out = or_f(x.to("openreg"))
        self.assertEqual(out.cpu(), cpu_f(x))
        x = torch.randn(64)
        self.assertEqual(or_f(x.to("openreg")).cpu(), cpu_f(x))
        self.assertEqual(self.graphs(), {"recorded": 0, "replayed": 0, "skipped": 1})

    def test_user_stream_in_the_region_runs_without_a_graph(self):
        """A graph captures one stream: the kernels of a `with s:` block in the region ran once, during
        the capture, and every replay returned their stale results."""
        s = torch.openreg.Stream()

        def f(x):
            y = x * 2
            s.wait_stream(torch.accelerator.current_stream())
            with s:
                z = y.sin() + 1
                t = z.sum()
            torch.accelerator.current_stream().wait_stream(s)
            return z * t + y

        # f without the streams, eager on the CPU: a CPU Inductor compile would double the test's
        # time, and the sum's rounding is within eager tolerances.
        def reference(x):
            y = x * 2
            z = y.sin() + 1
            return z * z.sum() + y

        cpu_f, or_f = reference, torch.compile(f, fullgraph=True, **RO)
        x = torch.randn(100)
        with self.assertWarnsRegex(UserWarning, "without an openreg graph: it runs kernels on a user stream"):
            self.assertEqual(or_f(x.to("openreg")).cpu(), cpu_f(x))
        for _ in range(3):
            x = torch.randn(100)
            self.assertEqual(or_f(x.to("openreg")).cpu(), cpu_f(x))
        self.assertEqual(self.graphs(), {"recorded": 0, "replayed": 0, "skipped": 1})

    def test_wait_stream_in_the_region_runs_without_a_graph(self):
        """`current_stream().wait_stream(s)` in the region ran once, at the capture: replays did not
        wait for s and read an input that s was still writing."""
        s = torch.openreg.Stream()

        def f(x):
            torch.accelerator.current_stream().wait_stream(s)
            return x * 2 + 1

        cpu_f, or_f = torch.compile(f), torch.compile(f, fullgraph=True, **RO)
        x = torch.zeros(64, device="openreg")
        release.set()
        hold_stream(x)  # an operator signature's first call is synchronous
        with self.assertWarnsRegex(UserWarning, "without an openreg graph: it calls stream or event operators"):
            or_f(x)
        or_f(x), or_f(x)  # would record and replay
        for _ in range(2):
            values = torch.randn(64)
            source = values.to("openreg")
            s.wait_stream(torch.openreg.current_stream())
            release.clear()
            try:
                with torch.openreg.stream(s):
                    hold_stream(x)  # s is busy until released
                    x.copy_(source)  # the input the compiled call must wait for
                out = or_f(x)
            finally:
                release.set()
            self.assertEqual(out.cpu(), cpu_f(values))
        self.assertEqual(self.graphs(), {"recorded": 0, "replayed": 0, "skipped": 1})

    def test_or_error(self):
        from torch._inductor import config

        with config.patch({"triton.cudagraph_or_error": True}):
            f = torch.compile(lambda x, s: x + s, **RO)
            with self.assertRaisesRegex(Exception, "runs this graph without an openreg graph: it uses cpu tensors"):
                f(torch.ones(4, device="openreg"), torch.tensor(2.0))


if __name__ == "__main__":
    run_tests()
