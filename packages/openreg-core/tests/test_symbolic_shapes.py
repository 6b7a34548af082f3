"""Symbolic shapes stay symbolic on openreg: torch.export, ONNX export and torch.compile(dynamic=True)
trace openreg models with fake tensors whose sizes are symbols; core's C++ code that sees them (the
SDPA backend choice, custom ops' fake kernels) must not turn a symbol into a constant."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_symbols
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.models import GPTBlock


def batch_and_seq_symbols(ep) -> list:
    """The free symbols of the exported program's user input, in dim order (0, 1, ...)."""
    (name,) = ep.graph_signature.user_inputs
    (x,) = [n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder" and n.name == name]
    return [free_symbols(s) for s in x.shape]


class TestExport(TestCase):
    DYNAMIC = ({0: Dim("batch"), 1: Dim("seq")},)

    def check_export(self, model, x):
        ep = torch.export.export(model, (x,), dynamic_shapes=self.DYNAMIC)  # raised "Constraints violated"
        batch, seq, width = batch_and_seq_symbols(ep)
        self.assertEqual(len(batch), 1)
        self.assertEqual(len(seq), 1)
        self.assertEqual(width, set())
        # No guard pins either symbol: the program runs at other sizes and matches eager.
        for shape in ((3, 5, 32), (1, 11, 32)):
            y = torch.randn(shape, device="openreg")
            self.assertEqual(ep.module()(y), model(y), atol=1e-5, rtol=1e-5)
        return ep

    def test_sdpa_block(self):
        torch.manual_seed(0)
        model = GPTBlock().to("openreg").eval()
        ep = self.check_export(model, torch.randn(2, 8, 32, device="openreg"))
        targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
        self.assertIn(torch.ops.aten.scaled_dot_product_attention.default, targets)
        # After decompositions the openreg-specific fused op remains, with symbolic sizes.
        ep = ep.run_decompositions()
        fused = [
            n
            for n in ep.graph.nodes
            if n.target is torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
        ]
        self.assertEqual(len(fused), 1)
        self.assertTrue(free_symbols(fused[0].meta["val"][0].shape[0]))

    def test_sdpa_with_a_dim_for_each_input(self):
        # The backend choice compares what the CPU's compares, nothing more: a comparison of key's and
        # value's lengths equated their two dims ("Constraints violated (lv)"), where the CPU exports.
        class Attention(nn.Module):
            def forward(self, q, k, v):
                return F.scaled_dot_product_attention(q, k, v)

        b, lq, lk, lv = Dim("b"), Dim("lq"), Dim("lk"), Dim("lv")
        dims = ({0: b, 2: lq}, {0: b, 2: lk}, {0: b, 2: lv})
        for device in ("cpu", "openreg"):
            q, k, v = (torch.randn(2, 2, n, 8, device=device) for n in (5, 7, 7))
            ep = torch.export.export(Attention(), (q, k, v), dynamic_shapes=dims)
            self.assertEqual(len(ep.range_constraints), 4, msg=device)  # b, lq, lk, lv stay four symbols

    def test_transformer_encoder_layer(self):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.check_export(layer.to("openreg").eval(), torch.randn(2, 8, 32, device="openreg"))

    def test_gru_cell_with_a_dynamic_batch(self):
        # On an accelerator nn.GRUCell calls aten::_thnn_fused_gru_cell, which torch 2.13 gives no
        # shape function (the LSTM cell has one): the export failed (UnsupportedOperatorException).
        torch.manual_seed(0)
        cell = nn.GRUCell(8, 16).to("openreg")
        x, h = torch.randn(3, 8, device="openreg"), torch.randn(3, 16, device="openreg")
        batch = Dim("batch")
        ep = torch.export.export(cell, (x, h), dynamic_shapes=({0: batch}, {0: batch}))
        self.assertEqual(len(ep.range_constraints), 1)
        targets = {str(n.target) for n in ep.run_decompositions().graph.nodes}
        self.assertIn("aten._thnn_fused_gru_cell.default", targets)
        for n in (1, 5):
            x, h = torch.randn(n, 8, device="openreg"), torch.randn(n, 16, device="openreg")
            self.assertEqual(ep.module()(x, h), cell(x, h), atol=1e-6, rtol=1e-6)

    def test_attention_masks_are_checked_while_tracing(self):
        # The CPU's MATH ops refuse, while tracing, a mask that does not broadcast to the scores, and
        # relate a mask's dims to the key's length; openreg's exports took both and failed at run time.
        class Attention(nn.Module):
            def forward(self, q, k, v, mask):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        for device in ("cpu", "openreg"):
            q = torch.randn(2, 2, 4, 8, device=device)
            # (the CPU's words come from a Python reference, openreg's from ATen's infer_size)
            with self.assertRaisesRegex(
                RuntimeError, "Attempting to broadcast a dimension|must match the size", msg=device
            ):
                torch.export.export(Attention(), (q, q, q, torch.randn(3, 4, device=device)))
            k = torch.randn(2, 2, 6, 8, device=device)
            s, m = Dim("s"), Dim("m")
            with self.assertRaisesRegex(torch._dynamo.exc.UserError, "Constraints violated \\(m\\)", msg=device):
                torch.export.export(
                    Attention(),
                    (q, k, k, torch.zeros(4, 6, device=device)),
                    dynamic_shapes=(None, {2: s}, {2: s}, {1: m}),
                )


class TestCompileDynamic(TestCase):
    def test_gru_cell_training_compiles_once_for_three_batch_sizes(self):
        # Without the GRU cell's shape functions the recompile for a dynamic batch failed, and every
        # later batch size ran eagerly (one graph on openreg, two on the CPU).
        torch._dynamo.reset()
        torch.manual_seed(0)
        cell = nn.GRUCell(8, 16).to("openreg")
        graphs = []

        def counting_backend(gm, example_inputs):
            graphs.append(gm)
            return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

        compiled = torch.compile(cell, backend=counting_backend, dynamic=True, fullgraph=True)
        for n in (3, 5, 7):
            x = torch.randn(n, 8, device="openreg")
            h = torch.randn(n, 16, device="openreg", requires_grad=True)
            out = compiled(x, h)
            out.square().sum().backward()
            ref_h = h.detach().clone().requires_grad_()
            ref = cell(x, ref_h)
            ref.square().sum().backward()
            self.assertEqual(out, ref, atol=1e-6, rtol=1e-6)
            self.assertEqual(h.grad, ref_h.grad, atol=1e-5, rtol=1e-5)
        self.assertEqual(len(graphs), 1)
        torch._dynamo.reset()

    def test_three_sequence_lengths_compile_once(self):
        torch._dynamo.reset()
        graphs = []

        def counting_backend(gm, example_inputs):
            graphs.append(gm)
            return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

        torch.manual_seed(0)
        model = GPTBlock().to("openreg")
        compiled = torch.compile(model, backend=counting_backend, dynamic=True)
        after_first = None
        for seq in (8, 13, 21):
            x = torch.randn(2, seq, 32, device="openreg", requires_grad=True)
            out = compiled(x)
            out.sum().backward()  # the backward (the fused op's backward) is traced with symbols too
            ref_x = x.detach().clone().requires_grad_()
            ref = model(ref_x)
            ref.sum().backward()
            self.assertEqual(out, ref, atol=1e-5, rtol=1e-5)
            self.assertEqual(x.grad, ref_x.grad, atol=1e-4, rtol=1e-4)
            after_first = after_first or len(graphs)
        # Dynamo splits this model in two graphs (as on the CPU); new lengths compile nothing more.
        self.assertEqual(len(graphs), after_first)
        self.assertGreater(after_first, 0)
        torch._dynamo.reset()


def _args_for(schema, x):
    """Arguments for an operator from its schema: every Tensor is `x`, numbers are small constants."""
    args = []
    for a in schema.arguments:
        kind = str(a.type)
        if kind == "Tensor":
            args.append(x)
        elif kind == "float":
            args.append(2.0)
        elif kind == "int":
            args.append(1)
        elif kind == "bool":
            args.append(False)
        else:
            raise AssertionError(f"{schema.name}: add an example for argument type {kind}")
    return args


class TestFakeKernels(TestCase):
    def test_core_operators_keep_symbols(self):
        """Each operator of core's `openreg` namespace, and the openreg-specific attention operators,
        run on a fake tensor with symbolic sizes: the results' sizes are those symbols, no guard added."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

        names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("openreg::"))
        self.assertIn("openreg::custom_abs", names)
        self.assertIn("openreg::scaled_square", names)
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 4)
        real = torch.randn(2, 4, 6, 8, device="openreg")
        with mode:
            x = mode.from_tensor(real, symbolic_context=dynamic)
        symbols = [s.node.expr for s in x.shape]
        checked = []
        with mode:
            for name in names:
                op = getattr(torch.ops.openreg, name.split("::")[1])
                out = op.default(*_args_for(op.default._schema, x))
                self.assertEqual([s.node.expr for s in out.shape], symbols, msg=name)
                checked.append(name)
            out, lse, *_ = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(x, x, x, is_causal=True)
            self.assertEqual([s.node.expr for s in out.shape], symbols)
            self.assertEqual([s.node.expr for s in lse.shape], symbols[:3])
            choice = torch.ops.aten._fused_sdp_choice(x, x, x)
            F.scaled_dot_product_attention(x, x, x, is_causal=True)
        self.assertIsInstance(choice, int)
        self.assertEqual(len(checked), len(names))
        # A guard that pinned a size would show as a replacement of its symbol by a number.
        self.assertEqual({s: v for s, v in shape_env.replacements.items() if s in symbols}, {})
        self.assertEqual(shape_env.guards, [])


if __name__ == "__main__":
    run_tests()
