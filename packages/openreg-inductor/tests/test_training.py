"""Training on openreg with torch.compile: backward through AOTAutograd, a compiled optimizer
step, dynamic shapes and graph breaks, each against CPU Inductor on the same inputs."""

import copy

import torch
from compile_check import compare_with_cpu_inductor
from torch._dynamo.utils import counters
from torch.testing._internal.common_utils import TestCase, run_tests


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 3))


class TestBackward(TestCase):
    def test_mlp_forward_backward(self):
        cpu_model = mlp()
        or_model = copy.deepcopy(cpu_model).to("openreg")
        x, target = torch.randn(16, 12), torch.randint(0, 3, (16,))

        def step(model, x, target):
            loss = torch.nn.functional.cross_entropy(model(x), target)
            loss.backward()
            return loss

        expected = torch.compile(step)(cpu_model, x, target)
        actual = torch.compile(step)(or_model, x.to("openreg"), target.to("openreg"))
        self.assertEqual(actual.cpu(), expected, atol=1e-5, rtol=1e-5)
        for p_cpu, p_or in zip(cpu_model.parameters(), or_model.parameters()):
            self.assertEqual(p_or.grad.cpu(), p_cpu.grad, atol=1e-5, rtol=1e-5)

    def test_custom_pointwise_backward(self):
        def f(x, y):
            return (torch.sigmoid(x) * y.tanh()).sum()

        x, y = torch.randn(50, requires_grad=True), torch.randn(50, requires_grad=True)
        xo, yo = (t.detach().to("openreg").requires_grad_() for t in (x, y))
        torch.compile(f)(x, y).backward()
        torch.compile(f)(xo, yo).backward()
        self.assertEqual(xo.grad.cpu(), x.grad, atol=0, rtol=0)
        self.assertEqual(yo.grad.cpu(), y.grad, atol=0, rtol=0)


class TestOptimizer(TestCase):
    def test_compiled_adamw_step(self):
        cpu_model = mlp()
        or_model = copy.deepcopy(cpu_model).to("openreg")
        for model in (cpu_model, or_model):
            for p in model.parameters():
                p.grad = torch.ones_like(p) * 0.1
        cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=0.01)
        or_opt = torch.optim.AdamW(or_model.parameters(), lr=0.01)
        for opt in (cpu_opt, or_opt):
            step = torch.compile(opt.step)
            for _ in range(2):
                step()
        for p_cpu, p_or in zip(cpu_model.parameters(), or_model.parameters()):
            self.assertEqual(p_or.detach().cpu(), p_cpu.detach(), atol=1e-6, rtol=1e-6)


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
