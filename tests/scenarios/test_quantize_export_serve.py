"""Scenario: quantize -> export -> serve. A small CNN on openreg is quantized with openreg-quant's PT2E
flow (OpenRegQuantizer, convert_pt2e) and lowered to its fused int8 kernels (lower_pt2e); the float
and the quantized (Q/DQ) programs are exported to ONNX from openreg (openreg-onnx) and served in
onnxruntime's CPU provider. The outputs agree with openreg eager, and openreg eager with the CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # torchao's CUDA-only libraries

import onnxruntime as ort  # noqa: E402
import openreg_onnx  # noqa: E402
import torch  # noqa: E402
from openreg_onnx._export import UnsupportedOperatorError  # noqa: E402
from openreg_quant import OpenRegQuantizer, lower_pt2e  # noqa: E402
from report import report  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch.testing._internal.common_utils import TestCase, run_tests  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from workloads import SmallCNN, cnn_images  # noqa: E402

qd = torch.ops.quantized_decomposed


def serve(model, x: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Exports `model` (on openreg, called on `x`) with openreg-onnx and runs the ONNX model in
    onnxruntime on the CPU: its output, and the ONNX op types of the graph."""
    program = openreg_onnx.export(model, (x,))
    proto = program.model_proto
    options = ort.SessionOptions()
    # On x86 CPUs without VNNI onnxruntime's u8 x s8 products overflow their 16-bit pair sums, as
    # oneDNN's do (docs/mechanisms/quantization.md): this entry makes it take its exact u8 x u8 path
    # there (it changes nothing on CPUs with VNNI). Without it, 8 quanta off on an AVX2 EPYC.
    options.add_session_config_entry("session.x64quantprecision", "1")
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    [out] = session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()})
    return torch.from_numpy(out), sorted({n.op_type for n in proto.graph.node})


def last_quantum(gm) -> float:
    """The scale of the last activation quantization before the output: one step of its int8 grid."""
    return float([n.args[1] for n in gm.graph.nodes if n.target == qd.quantize_per_tensor.default][-1])


class TestQuantizeExportServe(TestCase):
    def test_cnn(self):
        torch.manual_seed(0)
        cpu_model = SmallCNN().eval()
        model = SmallCNN().eval().to("openreg")
        model.load_state_dict(cpu_model.state_dict())
        x = cnn_images(0).to("openreg")

        # Float: openreg eager against the CPU, and the exported model in onnxruntime.
        with torch.no_grad():
            eager = model(x).cpu()
            self.assertEqual(eager, cpu_model(x.cpu()), atol=1e-5, rtol=1e-5)
        float_ort, float_ops = serve(model, x)
        self.assertEqual(float_ort, eager, atol=1e-4, rtol=1e-4)
        self.assertIn("Conv", float_ops)

        # Quantized on openreg: calibrate, convert (Q/DQ graph), export that, then lower it.
        prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), OpenRegQuantizer())
        for seed in range(1, 5):
            prepared(cnn_images(seed).to("openreg"))
        converted = convert_pt2e(prepared)
        quantum = last_quantum(converted)
        with torch.no_grad():
            qdq = converted(x).cpu()
        int8_ort, int8_ops = serve(converted, x)
        self.assertTrue({"QuantizeLinear", "DequantizeLinear"} <= set(int8_ops), int8_ops)
        lowered = lower_pt2e(converted)
        self.assertTrue(any(str(n.target).startswith("openreg_quant.qconv2d") for n in lowered.graph.nodes))
        # The fused int8 kernels on packed weights have no ONNX form: named, with what to export
        # instead (torch's exporter failed on the packed weights with an internal error).
        with self.assertRaisesRegex(
            UnsupportedOperatorError,
            r"^openreg_quant::qconv2d\.default has no ONNX translation: .* Export the model before lower_pt2e",
        ):
            openreg_onnx.export(lowered, (x,))
        with torch.no_grad():
            int8 = lowered(x).cpu()
            # and compiled by Inductor (openreg-inductor), the fused ops with their packed weights
            # as extern calls: the same values
            compiled = torch.compile(lowered, fullgraph=True)(x).cpu()
        self.assertEqual(compiled, int8, atol=0, rtol=0)
        # and replayed as an openreg graph (mode="reduce-overhead"), the packed weights part of the
        # recording's key by identity: they turned graphs off
        counters.clear()
        graphed = torch.compile(lowered, mode="reduce-overhead")
        with torch.no_grad():
            for seed in (5, 6, 7):
                images = cnn_images(seed).to("openreg")
                self.assertEqual(graphed(images).cpu(), lowered(images).cpu(), atol=0, rtol=0)
        self.assertEqual(dict(counters["openreg_graphs"]), {"recorded": 1, "replayed": 2})

        # Served int8 against openreg's fused int8 kernels: onnxruntime's int8 arithmetic may round an
        # output to the neighbouring step of its grid (measured: 0.2 of a step); both near the float model.
        diff_lowered = (int8_ort - int8).abs().max().item()
        diff_qdq = (int8_ort - qdq).abs().max().item()
        rel = ((int8 - eager).norm() / eager.norm()).item()
        self.assertLessEqual(diff_lowered, quantum)
        self.assertLessEqual(diff_qdq, quantum)
        self.assertLess(rel, 0.05)
        report(
            f"quantize->export->serve: CNN float ORT vs openreg max |diff| {(float_ort - eager).abs().max():.1e}; "
            f"int8 ORT vs openreg lowered {diff_lowered:.1e} (quantum {quantum:.1e}); int8 vs float rel {rel:.3f}"
        )

    def test_reduce_range_model_matches_beyond_the_calibration_range(self):
        # With OpenRegQuantizer(reduce_range=True) (the default on x86 CPUs without VNNI) the
        # activation quantizes clamp to uint8 0..127; on inputs 3x the calibration batch the exported
        # convert_pt2e model was off by 0.195 on every output, before openreg-onnx's quantize
        # translation clamped (a Clip after QuantizeLinear).
        class ConvLinear(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.fc = torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(8, 5)

            def forward(self, x):
                return self.fc(torch.relu(self.conv(x)).mean((2, 3)))

        torch.manual_seed(0)
        calibration = torch.randn(4, 3, 8, 8, device="openreg")
        model = ConvLinear().eval().to("openreg")
        prepared = prepare_pt2e(
            torch.export.export(model, (calibration,)).module(), OpenRegQuantizer(reduce_range=True)
        )
        prepared(calibration)
        converted = convert_pt2e(prepared)
        ranges = {(n.args[3], n.args[4]) for n in converted.graph.nodes if n.target == qd.quantize_per_tensor.default}
        self.assertEqual(ranges, {(0, 127)})
        result = openreg_onnx.verify(converted, (calibration * 3,))
        self.assertTrue(result.ok, result.report())


if __name__ == "__main__":
    run_tests()
