"""Quantized tensors (torch.qint8, QuantizedPrivateUse1) are not supported on openreg yet: every entry
point raises an error that names the operator, and the device keeps working. (openreg-quant works on
plain integer tensors: the quantized_decomposed ops, the fused ops and PT2E.)"""

import torch
from torch.testing._internal.common_utils import TestCase


class TestQuantizedTensorsRaise(TestCase):
    def test_unsupported_entry_points_raise_clearly(self):
        x = torch.randn(2, 4, device="openreg")
        q_cpu = torch.quantize_per_tensor(x.cpu(), 0.1, 0, torch.quint8)
        cases = [
            (
                lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8),
                RuntimeError,
                "quantized tensors .QInt8. are not supported on openreg",
            ),
            (
                lambda: torch.quantize_per_channel(
                    x,
                    torch.ones(2, device="openreg"),
                    torch.zeros(2, dtype=torch.long, device="openreg"),
                    0,
                    torch.qint8,
                ),
                RuntimeError,
                "quantized tensors .QInt8. are not supported on openreg",
            ),
            (
                lambda: q_cpu.to("openreg"),
                NotImplementedError,
                "Could not run 'aten::empty_quantized' with arguments from the 'Quantizedopenreg' backend",
            ),
        ]
        for call, error, message in cases:
            with self.assertRaisesRegex(error, message):
                call()
        self.assertEqual((x + 1).cpu(), x.cpu() + 1)  # the device keeps working

    def test_cpu_packed_module_keeps_its_cpu_weights(self):
        # nn.quantized.Linear holds CPU-packed parameters that .to("openreg") does not move: it keeps
        # working on CPU quantized inputs, and an openreg quantized input cannot be made at all.
        layer = torch.ao.nn.quantized.Linear(4, 3).to("openreg")
        q = torch.quantize_per_tensor(torch.randn(1, 4), 0.1, 0, torch.quint8)
        self.assertEqual(layer(q).device.type, "cpu")
