"""torch.onnx helpers that assumed host tensors keep an openreg model's device with the plugin."""

import openreg_onnx
import torch
from torch.testing._internal.common_utils import TestCase


class UsesSymbolic(torch.nn.Module):
    def forward(self, x):
        y = torch.onnx.ops.symbolic("custom_domain::CustomOp", (x,), dtype=x.dtype, shape=x.shape, version=1)
        a, b = torch.onnx.ops.symbolic_multi_out(
            "custom_domain::Split", (x,), dtypes=(x.dtype, torch.int64), shapes=(x.shape, [2]), version=1
        )
        return y + x + a, b


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


class TestSymbolic(TestCase):
    def test_eager_results_on_the_inputs_device(self):
        for device in ("openreg", "openreg:1", "cpu"):
            x = torch.randn(2, 3, device=device)
            out, b = UsesSymbolic()(x)
            self.assertEqual(out.device, x.device)
            self.assertEqual(b.device, x.device)
            self.assertEqual(out.cpu(), x.cpu())  # the symbolic results are zeros
            self.assertEqual(b.dtype, torch.int64)

    def test_export_on_openreg(self):
        x = torch.randn(2, 3, device="openreg")
        program = torch.onnx.export(UsesSymbolic().eval(), (x,), dynamo=True, verbose=False)
        nodes = [(n.domain, n.op_type) for n in program.model.graph]
        self.assertIn(("custom_domain", "CustomOp"), nodes)
        self.assertIn(("custom_domain", "Split"), nodes)


class TestInputObserver(TestCase):
    def test_check_discrepancies(self):
        model = Linear().to("openreg").eval()
        observer = torch.onnx.InputObserver()
        with observer(model):
            model(torch.randn(2, 3, device="openreg"))
            model(torch.randn(4, 3, device="openreg"))
        program = torch.onnx.export(
            model, observer.infer_arguments(), dynamic_shapes=observer.infer_dynamic_shapes(), verbose=False
        )
        with self.assertRaisesRegex(RuntimeError, "Expected all tensors to be on the same device"):
            observer.check_discrepancies(program)  # torch's, as it is
        rows = openreg_onnx.check_discrepancies(observer, program)
        self.assertEqual([r["SUCCESS"] for r in rows], [True, True])
        self.assertLess(max(r["abs"] for r in rows), 1e-5)
