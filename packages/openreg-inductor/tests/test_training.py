"""Training on openreg with torch.compile: a small GPT's training step (forward, backward through
AOTAutograd, AdamW) compiled whole, dynamic shapes and graph breaks, each against CPU Inductor on
the same inputs."""

import copy

import torch
from compile_check import compare_with_cpu_inductor
from torch._dynamo.utils import counters
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.models import TinyGPT


class TestGPT(TestCase):
    def test_compiled_training_step(self):
        """Forward, backward (AOTAutograd) and the AdamW step in one compiled function, three steps."""
        torch.manual_seed(0)
        cpu_model = TinyGPT()
        or_model = copy.deepcopy(cpu_model).to("openreg")
        idx, target = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))

        def make_step(model):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

            @torch.compile
            def step(idx, target):
                loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), target.flatten())
                loss.backward()
                opt.step()
                opt.zero_grad()
                return loss

            return step

        cpu_step, or_step = make_step(cpu_model), make_step(or_model)
        for _ in range(3):
            expected = cpu_step(idx, target)
            actual = or_step(idx.to("openreg"), target.to("openreg"))
            self.assertEqual(actual.cpu(), expected, atol=1e-4, rtol=1e-4)
        self.assertLess(actual.item(), 4.2)  # it learns: ln(64) = 4.16 at the start
        # AdamW divides by sqrt(v): for near-zero gradients a rounding difference (matmul order,
        # reciprocal multiplies) becomes a step of up to lr, hence a looser bound on the parameters.
        for p_cpu, p_or in zip(cpu_model.parameters(), or_model.parameters()):
            self.assertEqual(p_or.detach().cpu(), p_cpu.detach(), atol=2e-3, rtol=1e-3)

    def test_custom_pointwise_backward(self):
        def f(x, y):
            return (torch.sigmoid(x) * y.tanh()).sum()

        x, y = torch.randn(50, requires_grad=True), torch.randn(50, requires_grad=True)
        xo, yo = (t.detach().to("openreg").requires_grad_() for t in (x, y))
        torch.compile(f)(x, y).backward()
        torch.compile(f)(xo, yo).backward()
        self.assertEqual(xo.grad.cpu(), x.grad, atol=0, rtol=0)
        self.assertEqual(yo.grad.cpu(), y.grad, atol=0, rtol=0)


class TestDynamic(TestCase):
    def test_one_compile_for_several_sizes(self):
        def f(x, w):
            return torch.softmax(x @ w, dim=-1).sum(0) + x.mean()

        w = torch.randn(8, 5)
        compiled = torch.compile(f, dynamic=True)
        counters.clear()
        for n in (3, 7, 20):
            x = torch.randn(n, 8)
            self.assertEqual(compiled(x.to("openreg"), w.to("openreg")).cpu(), f(x, w), atol=1e-5, rtol=1e-5)
        self.assertEqual(counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"], 1)

    def test_dynamic_matches_cpu_inductor(self):
        compare_with_cpu_inductor(self, lambda x: (x * x.shape[0]).cumsum(0), torch.randn(9, 4), dynamic=True)


class TestGraphBreaks(TestCase):
    def test_graph_break_between_compiled_regions(self):
        def f(x):
            y = torch.relu(x) * 2
            torch._dynamo.graph_break()
            return (y + 1).sum()

        counters.clear()
        out = compare_with_cpu_inductor(self, f, torch.randn(40))
        self.assertEqual(out.device.type, "openreg")
        self.assertEqual(counters["stats"]["unique_graphs"], 4)  # two regions, for each device


if __name__ == "__main__":
    run_tests()
