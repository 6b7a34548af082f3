"""Per-device generators with CUDA's state: a Philox seed and offset (csrc/runtime/OpenRegGenerator.h).

An op's numbers depend only on the (seed, offset) it got at launch; the offset advances by the
values the op may draw, rounded up to a multiple of 4. Random results need not equal the CPU's,
only be reproducible and correctly distributed.
"""

import math
import threading

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests


def state_of(device="openreg"):
    state = torch.openreg.get_rng_state(device)
    return int(state[:8].view(torch.int64)), int(state[8:].view(torch.int64))


def make_state(seed, offset):
    return torch.tensor([seed, offset], dtype=torch.int64).view(torch.uint8)


def ks_statistic(sample: torch.Tensor, cdf) -> float:
    """Kolmogorov-Smirnov distance between a sample and a distribution's CDF."""
    x, _ = sample.double().sort()
    n = x.numel()
    f = cdf(x)
    above = torch.arange(1, n + 1, dtype=torch.float64) / n - f
    below = f - torch.arange(0, n, dtype=torch.float64) / n
    return max(above.max().item(), below.max().item())


class TestState(TestCase):
    def test_layout_is_cudas(self):
        torch.openreg.manual_seed(1234)
        state = torch.openreg.get_rng_state()
        self.assertEqual((state.dtype, state.numel(), state.device.type), (torch.uint8, 16, "cpu"))
        self.assertEqual(state_of(), (1234, 0))
        self.assertEqual(torch.openreg.initial_seed(), 1234)

    def test_offset_advances_by_values_rounded_to_four(self):
        torch.openreg.manual_seed(0)
        expected = 0
        for numel in (1, 4, 10, 1000):
            torch.randn(numel, device="openreg")
            expected += max(4, (numel + 3) // 4 * 4)
            self.assertEqual(state_of(), (0, expected))
        x = torch.empty(6, device="openreg")
        x.uniform_()  # in place: the tensor's numel
        self.assertEqual(state_of()[1], expected + 8)
        g = torch.Generator(device="openreg")
        g.manual_seed(5)
        torch.rand(9, device="openreg", generator=g)
        self.assertEqual((g.initial_seed(), g.get_offset()), (5, 12))
        self.assertEqual(state_of()[1], expected + 8)  # the default generator did not move

    def test_save_restore_and_set_state(self):
        torch.openreg.manual_seed(7)
        torch.rand(5, device="openreg")
        saved = torch.openreg.get_rng_state()
        a = torch.randn(50, device="openreg").cpu()
        torch.openreg.set_rng_state(saved)
        self.assertEqual(torch.randn(50, device="openreg").cpu(), a)
        # The same (seed, offset) written by hand gives the same numbers; another offset others.
        torch.openreg.set_rng_state(make_state(7, 8))
        self.assertEqual(torch.randn(50, device="openreg").cpu(), a)
        torch.openreg.set_rng_state(make_state(7, 12))
        self.assertNotEqual(torch.randn(50, device="openreg").cpu(), a)
        torch.openreg.set_rng_state(make_state(8, 8))
        self.assertNotEqual(torch.randn(50, device="openreg").cpu(), a)

    def test_a_seed_only_state_has_offset_zero(self):
        # CUDA's set_state takes 8 bytes as the seed alone; openreg refused them.
        torch.openreg.manual_seed(7)
        a = torch.randn(50, device="openreg").cpu()
        torch.randn(3, device="openreg")
        torch.openreg.set_rng_state(make_state(7, 0)[:8].clone())
        self.assertEqual(torch.openreg.get_rng_state(), make_state(7, 0))
        self.assertEqual(torch.randn(50, device="openreg").cpu(), a)

    def test_bad_states(self):
        before = torch.openreg.get_rng_state()
        with self.assertRaisesRegex(
            RuntimeError, r"RNG state is wrong size: expected 16 bytes \(seed and offset\) or 8"
        ):
            torch.openreg.set_rng_state(torch.zeros(5056, dtype=torch.uint8))  # the old Mersenne Twister state
        with self.assertRaisesRegex(TypeError, "RNG state must be a torch.ByteTensor"):
            torch.openreg.set_rng_state(torch.zeros(2, dtype=torch.int64))
        with self.assertRaisesRegex(RuntimeError, "offset must be a multiple of 4, got 6"):
            torch.openreg.set_rng_state(make_state(1, 6))
        self.assertEqual(torch.openreg.get_rng_state(), before)

    def test_kernel_seeds_sharing_their_low_32_bits_draw_different_numbers(self):
        # The kernel's CPU generator kept 32 of the launch's 64-bit seed: these two seeds' first
        # launches (Philox of (seed, 0)) share their low 32 bits, and drew bit-identical numbers
        # (found by rebuilding the Philox seeds in numpy; hunt36c). Within one run, seeds repeated
        # after about 77,000 random operators.
        draws = []
        for seed in (166851, 341310):
            torch.openreg.manual_seed(seed)
            draws.append(torch.randn(1000, device="openreg").cpu())
        self.assertNotEqual(draws[0], draws[1])
        self.assertLess((draws[0] == draws[1]).sum().item(), 5)

    def test_queued_random_ops_keep_their_own_numbers(self):
        # Kernel generators are reused once no launch holds them: with more ops queued than the
        # eight a thread keeps, each op still draws its own numbers, the same as one at a time.
        from torch_openreg.utils.testing import StreamHold

        torch.empty(64, device="openreg").uniform_()  # the signature's first call, verified synchronously
        torch.openreg.synchronize()

        def draw(hold):
            torch.openreg.manual_seed(5)
            xs = [torch.empty(64, device="openreg") for _ in range(20)]
            if hold:
                with StreamHold() as held:
                    for x in xs:
                        x.uniform_()
                    self.assertFalse(held.stream.query())  # all twenty queued behind the hold
            else:
                for x in xs:
                    x.uniform_()
                    torch.openreg.synchronize()
            return torch.stack(xs).cpu()

        queued, one_by_one = draw(hold=True), draw(hold=False)
        self.assertEqual(queued, one_by_one)
        self.assertEqual(len({tuple(row.tolist()) for row in queued}), 20)

    def test_a_call_its_kernel_refuses_takes_no_numbers(self):
        # The CPU and CUDA check these arguments before they draw: a caught refusal moved every later
        # number of the device (the offset had advanced by the refused call's draw; hunt36c).
        x = torch.empty(16, device="openreg")
        refused = {
            "uniform_(3, 2)": lambda: x.uniform_(3, 2),
            "normal_(0, -1)": lambda: x.normal_(0, -1),
            "exponential_(-1)": lambda: x.exponential_(-1),
            "geometric_(0)": lambda: x.geometric_(0),
            "cauchy_(0, -1)": lambda: x.cauchy_(0, -1),
        }
        torch.openreg.manual_seed(3)
        expected = torch.randn(8, device="openreg").cpu()
        for name, call in refused.items():
            torch.openreg.manual_seed(3)
            with self.assertRaises(RuntimeError, msg=name):
                call()
            self.assertEqual(state_of(), (3, 0), msg=name)
            self.assertEqual(torch.randn(8, device="openreg").cpu(), expected, msg=name)

    def test_state_is_real_under_a_fake_mode(self):
        """AOTAutograd reads the state inside a FakeTensorMode (its graph-safe RNG functionalisation):
        the state is made on the host directly, not through the dispatcher the mode intercepts."""
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

        torch.openreg.manual_seed(13)
        torch.rand(3, device="openreg")
        with FakeTensorMode():
            state = torch.openreg.get_rng_state()
        self.assertNotIsInstance(state, FakeTensor)
        self.assertEqual(state, make_state(13, 4))

    def test_fork_rng_restores_the_device_state(self):
        torch.openreg.manual_seed(3)
        before = torch.openreg.get_rng_state()
        with torch.random.fork_rng(devices=[0], device_type="openreg"):
            torch.randn(100, device="openreg")
        self.assertEqual(torch.openreg.get_rng_state(), before)

    def test_default_generators(self):
        # As torch.cuda.default_generators: one per device, the generators the device's ops use.
        gens = torch.openreg.default_generators
        self.assertEqual(len(gens), torch.openreg.device_count())
        self.assertEqual([g.device for g in gens], [torch.device("openreg", i) for i in range(len(gens))])
        gens[1].manual_seed(7)
        a = torch.randn(8, device="openreg:1")
        torch.openreg.manual_seed_all(0)
        gens[1].manual_seed(7)
        self.assertEqual(torch.randn(8, device="openreg:1"), a)
        self.assertEqual(gens[1].initial_seed(), 7)
        # Built once, as CUDA's tuple: the same objects at every access.
        self.assertIs(torch.openreg.default_generators, gens)
        self.assertIs(torch.openreg.default_generators[0], gens[0])


class TestReproducibility(TestCase):
    def draw(self):
        torch.openreg.manual_seed(11)
        dev = "openreg"
        return [
            torch.randn(1000, device=dev),
            torch.rand(37, device=dev),
            torch.randint(0, 100, (64,), device=dev),
            torch.bernoulli(torch.full((200,), 0.3, device=dev)),
            F.dropout(torch.ones(300, device=dev), 0.5),
        ]

    def test_independent_of_stream_and_threads(self):
        reference = [t.cpu() for t in self.draw()]
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            self.assertEqual([t.cpu() for t in self.draw()], reference)
        finally:
            torch.set_num_threads(threads)
        with torch.openreg.stream(torch.openreg.Stream()):
            self.assertEqual([t.cpu() for t in self.draw()], reference)
        seen = []
        worker = threading.Thread(target=lambda: seen.append([t.cpu() for t in self.draw()]))
        worker.start()
        worker.join()
        self.assertEqual(seen[0], reference)

    def test_different_seeds_differ(self):
        torch.openreg.manual_seed(1)
        a = torch.randn(100, device="openreg").cpu()
        torch.openreg.manual_seed(2)
        self.assertNotEqual(torch.randn(100, device="openreg").cpu(), a)


class TestDistributions(TestCase):
    def test_uniform_and_normal(self):
        torch.openreg.manual_seed(0)
        u = torch.rand(20000, device="openreg", dtype=torch.float64).cpu()
        self.assertLess(abs(u.mean().item() - 0.5), 0.01)
        self.assertLess(abs(u.var().item() - 1 / 12), 0.005)
        self.assertLess(ks_statistic(u, lambda x: x.clamp(0, 1)), 1.63 / math.sqrt(u.numel()))  # 1% level
        n = torch.randn(20000, device="openreg", dtype=torch.float64).cpu()
        self.assertLess(abs(n.mean().item()), 0.03)
        self.assertLess(abs(n.var().item() - 1), 0.04)
        self.assertLess(ks_statistic(n, torch.special.ndtr), 1.63 / math.sqrt(n.numel()))

    def test_dropout_refuses_complex_inputs_as_the_cpu_does(self):
        # openreg's native_dropout drew a bool mask and returned a result (found by tests/fuzz).
        for device in ("cpu", "openreg"):
            x = torch.ones(4, dtype=torch.complex64, device=device)
            with self.assertRaisesRegex(
                NotImplementedError, "\"bernoulli_scalar_cpu_\" not implemented for 'ComplexFloat'"
            ):
                F.dropout(x, 0.5, training=True)
            self.assertEqual(F.dropout(x, 0.5, training=False).cpu(), x.cpu())  # no mask drawn: allowed

    def test_bernoulli_takes_p_from_any_device(self):
        # As the CPU's and CUDA's kernels do (bernoulli_.Tensor is device_check: NoCheck): p moves
        # to self's device. A CPU p, or one on another openreg device, was refused (hunt36c).
        p = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0])
        for where in ("cpu", "openreg:1", "openreg:0"):
            x = torch.full((5,), 7.0, device="openreg:0")
            x.bernoulli_(p.to(where))
            self.assertEqual(x.device, torch.device("openreg:0"))
            self.assertEqual(x.cpu(), p, msg=where)
            functional = torch.ops.aten.bernoulli.Tensor(torch.zeros(5, device="openreg:0"), p.to(where))
            self.assertEqual((functional.device, functional.cpu()), (torch.device("openreg:0"), p), msg=where)

    def test_bernoulli_randperm_dropout(self):
        torch.openreg.manual_seed(0)
        rate = torch.bernoulli(torch.full((20000,), 0.3, device="openreg")).mean().item()
        self.assertLess(abs(rate - 0.3), 0.015)
        perm = torch.randperm(1000, device="openreg").cpu()
        self.assertEqual(perm.sort().values, torch.arange(1000))
        x = F.dropout(torch.ones(20000, device="openreg", dtype=torch.float64), 0.25).cpu()
        self.assertEqual(set(x.unique().tolist()), {0.0, 1 / 0.75})
        self.assertLess(abs((x == 0).double().mean().item() - 0.25), 0.015)


class TestGraphSafeState(TestCase):
    """graphsafe_get_state/graphsafe_set_state share a state between generators and clone_state copies
    one, as CUDA's generators do; AOTAutograd's graph-safe RNG functionalisation relies on both."""

    def gen(self, device=0):
        return torch.openreg.default_generators[device]

    def test_get_state_shares_the_state(self):
        g = self.gen()
        g.manual_seed(5)
        view = g.graphsafe_get_state()
        self.assertEqual((view.device, view.initial_seed(), view.get_offset()), (g.device, 5, 0))
        torch.randn(10, device="openreg")  # draws from the default generator: the shared state moves
        self.assertEqual(view.get_offset(), 12)
        view.manual_seed(6)  # and the other way round
        self.assertEqual(state_of(), (6, 0))

    def test_set_state_points_at_another_state_and_back(self):
        g = self.gen()
        g.manual_seed(1)
        torch.rand(3, device="openreg")
        saved = g.graphsafe_get_state()
        other = torch.Generator(device="openreg")
        other.manual_seed(9)
        g.graphsafe_set_state(other)
        drawn = torch.randn(10, device="openreg").cpu()
        self.assertEqual((other.initial_seed(), other.get_offset()), (9, 12))  # the op drew from other's state
        g.graphsafe_set_state(saved)
        self.assertEqual(state_of(), (1, 4))  # the default state did not move meanwhile
        reference = torch.Generator(device="openreg")
        reference.manual_seed(9)
        self.assertEqual(torch.randn(10, device="openreg", generator=reference).cpu(), drawn)

    def test_clone_state_is_a_copy(self):
        g = self.gen()
        g.manual_seed(4)
        torch.rand(4, device="openreg")
        copy = g.clone_state()
        self.assertEqual((copy.initial_seed(), copy.get_offset()), (4, 4))
        a = torch.randn(20, device="openreg").cpu()
        self.assertEqual(copy.get_offset(), 4)  # the default generator moved, the copy did not
        self.assertEqual(torch.randn(20, device="openreg", generator=copy).cpu(), a)
        self.assertEqual(state_of(), (4, 24))

    def test_set_state_refuses_other_devices_generators(self):
        g = self.gen()
        before = state_of()
        with self.assertRaisesRegex(TypeError, "expected an openreg generator, got one for device cpu"):
            g.graphsafe_set_state(torch.Generator())
        with self.assertRaisesRegex(RuntimeError, "graphsafe_set_state: the generator is for openreg:1, this one for"):
            g.graphsafe_set_state(self.gen(1).graphsafe_get_state())
        self.assertEqual(state_of(), before)

    def test_a_graph_replay_advances_the_state_captured(self):
        """As a CUDA graph registers generator states: a random op captured while the default
        generator pointed at another state draws from that state on every replay."""
        g = self.gen()
        g.manual_seed(2)
        out = torch.empty(8, device="openreg")
        s = torch.openreg.Stream()
        other = torch.Generator(device="openreg")
        other.manual_seed(30)
        saved = g.graphsafe_get_state()
        with torch.openreg.stream(s):
            out.copy_(torch.rand(8, device="openreg"))  # warm-up outside the capture
        s.synchronize()
        graph = torch.accelerator.Graph()
        g.graphsafe_set_state(other)
        with torch.openreg.stream(s):
            graph.capture_begin()
            out.copy_(torch.rand(8, device="openreg"))
            graph.capture_end()
        g.graphsafe_set_state(saved)
        default_before, other_before = state_of(), other.get_offset()
        results = []
        for _ in range(2):
            graph.replay()
            results.append(out.cpu())
        self.assertEqual(other.get_offset(), other_before + 16)  # 8 values per replay
        self.assertEqual(state_of(), default_before)
        self.assertNotEqual(results[0], results[1])
        graph.reset()


class TestGraphSafeFunctionalization(TestCase):
    """Activation checkpointing of a random op under torch.compile: the backward recomputes the
    dropout and must draw the mask the forward drew. AOTAutograd's graph-safe functionalisation does it
    for device types registered with it (torch_openreg/openreg/random.py::_register_graphsafe_rng);
    without the registration the compiled step raised "Backend not supported for openreg"."""

    def test_checkpointed_dropout_recomputes_the_forward_mask(self):
        from torch.utils.checkpoint import checkpoint

        torch._dynamo.reset()

        def f(x):
            return checkpoint(lambda t: F.dropout(t * 1.0, 0.5), x, use_reentrant=False)

        compiled = torch.compile(f, backend="aot_eager")
        torch.openreg.manual_seed(0)
        masks = []
        for _ in range(3):
            x = torch.ones(4096, device="openreg", requires_grad=True)
            y = compiled(x)
            y.sum().backward()  # d(sum(mask * 2 * x)) / dx = mask * 2: the recomputed mask
            y, grad = y.detach().cpu(), x.grad.cpu()
            self.assertEqual(set(y.unique().tolist()), {0.0, 2.0})
            self.assertEqual(grad, y)
            masks.append(y)
        self.assertNotEqual(masks[0], masks[1])  # fresh numbers on every call
        self.assertNotEqual(masks[1], masks[2])


if __name__ == "__main__":
    run_tests()
