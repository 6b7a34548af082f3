"""First use of an operator costs what it costs on the CPU: no heavy module is imported.

The generic path needs each operator's output metadata. Many ATen meta kernels on the Meta dispatch
key are Python (torch/_meta_registrations.py), and the first call of one imports sympy and
torch._dynamo (0.5-2.5 s). openreg calls PyTorch's C++ meta functions instead (OpenRegNativeMeta.cpp),
so a fresh process pays for none of that; the CPU and CUDA never run a meta kernel at all.
"""

import json

from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests

# Modules that only tracing and compiling need (torch._refs and torch._decomp are imported by
# `import torch` itself, on the CPU too). symbolic_shapes is what imports sympy.
HEAVY = ("torch._dynamo", "torch._inductor", "sympy", "torch.fx.experimental.symbolic_shapes")

FIRST_CALLS = """
import json, sys
import torch
from torch_openreg.utils.testing import first_use_calls

dev = "openreg"
calls = first_use_calls(dev)
calls["add"] = lambda: torch.ones(2, device=dev) + 2
calls["exp"] = lambda: torch.ones(2, device=dev).exp()
heavy = %r
imported = {}
for name, call in calls.items():
    before = set(sys.modules)
    call().cpu()
    new = [m for m in set(sys.modules) - before if m.startswith(heavy)]
    if new:
        imported[name] = sorted(new)[:3]
print(json.dumps(imported))
""" % (HEAVY,)


class TestFirstUse(TestCase):
    def test_common_operators_import_nothing_heavy(self):
        r = run_python(FIRST_CALLS)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout.strip().splitlines()[-1]), {})

    def test_native_meta_kernels_agree_with_the_meta_key(self):
        """The C++ meta kernels the generic path uses give the geometry PyTorch's Meta key gives
        (Python or C++) for a spread of operators, including every op of the first-use list."""
        import torch
        import torch_openreg

        names = set(torch_openreg._C._native_meta_operators())
        for op in ("aten::add.Tensor", "aten::normal_", "aten::arange.start_out", "aten::cat", "aten::_softmax"):
            self.assertIn(op, names)
        self.assertGreater(len(names), 500)
        cases = [
            (torch.ops.aten.add.Tensor, (torch.randn(3, 1), torch.randn(1, 4).to(torch.float64)), {}),
            (torch.ops.aten.mul.Tensor, (torch.randn(2, 3).t(), torch.tensor(2)), {}),
            (torch.ops.aten.cat.default, ([torch.randn(2, 3), torch.randn(4, 3)],), {}),
            (torch.ops.aten._softmax.default, (torch.randn(2, 5).to(torch.bfloat16), 1, False), {}),
            (torch.ops.aten.argmax.default, (torch.randn(4, 6), 1, True), {}),
            (torch.ops.aten.index_select.default, (torch.randn(4, 6), 1, torch.tensor([0, 5, 5])), {}),
            (
                torch.ops.aten.native_layer_norm.default,
                (torch.randn(2, 3, 4).bfloat16(), [4], torch.ones(4), None, 1e-5),
                {},
            ),
            (torch.ops.aten.nll_loss_forward.default, (torch.randn(3, 5), torch.tensor([0, 4, 1]), None, 1, -100), {}),
            (torch.ops.aten.sum.dim_IntList, (torch.randn(2, 3, 4), [0, 2], False), {"dtype": torch.float64}),
        ]
        for op, args, kwargs in cases:
            on_device = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("openreg"), args)
            result = op(*on_device, **kwargs)
            on_meta = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), args)
            reference = op(*on_meta, **kwargs)  # the Meta key, as FakeTensor and torch.compile see it
            cpu = op(*args, **kwargs)
            for r, m, c in zip(*(x if isinstance(x, tuple) else (x,) for x in (result, reference, cpu))):
                self.assertEqual((r.shape, r.dtype), (m.shape, m.dtype), msg=str(op))
                self.assertEqual(r.cpu(), c, msg=str(op))

    def test_native_meta_kernels_raise_the_cpu_errors(self):
        import torch

        x = torch.ones(4, 6, device="openreg")
        with self.assertRaisesRegex(IndexError, "Index is supposed to be a vector"):
            x.index_select(0, torch.zeros(2, 2, dtype=torch.long, device="openreg"))
        with self.assertRaisesRegex(RuntimeError, "Expected dtype int32 or int64 for index"):
            x.index_select(0, torch.zeros(2, device="openreg"))
        with self.assertRaisesRegex(RuntimeError, r"Given normalized_shape=\[5\], expected input with shape \[\*, 5\]"):
            torch.nn.functional.layer_norm(x, (5,))
        with self.assertRaisesRegex(RuntimeError, "normal expects std >= 0.0"):
            x.normal_(0, -1)
        with self.assertRaisesRegex(RuntimeError, "Sizes of tensors must match"):
            torch.cat([x, torch.ones(4, 5, device="openreg")])


if __name__ == "__main__":
    run_tests()
