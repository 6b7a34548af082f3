"""openreg_onnx.export_without_weights: export under FakeTensorMode touches no device memory, and
the model with the real weights attached matches openreg eager."""

import gc

import onnx
import pytest
import torch
import torch.nn as nn
from conftest import MLP
from openreg_onnx import export_without_weights
from openreg_onnx._verify import run_onnx


class CustomOpModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return torch.ops.openreg.scaled_square(torch.ops.openreg.custom_abs(self.norm(self.fc(x))), 0.5)


def _encoder():
    return nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)


CASES = {
    "mlp": (MLP, lambda: (torch.randn(3, 8),)),
    "custom_ops": (CustomOpModel, lambda: (torch.randn(3, 8),)),
    "encoder_layer": (_encoder, lambda: (torch.randn(2, 5, 16),)),
}


@pytest.mark.parametrize("mode", ["portable", "vendor"])
@pytest.mark.parametrize("name", list(CASES))
def test_export_without_materialising_weights(name, mode):
    build, build_args = CASES[name]
    torch.manual_seed(0)
    real = build().to("openreg").eval()
    # Earlier tests' garbage must not be freed (and its memory reused) during the measurement.
    gc.collect()
    gc.disable()
    try:
        torch.openreg.synchronize()
        torch.openreg.reset_peak_memory_stats()
        before = torch.openreg.memory_allocated()
        program = export_without_weights(build, build_args, real.state_dict(), mode=mode)
        # Nothing was allocated on the device by the export (the peak would show even a freed block).
        assert torch.openreg.max_memory_allocated() == before
        assert torch.openreg.memory_allocated() == before
    finally:
        gc.enable()
    assert program.model.metadata_props["openreg_onnx.weights"] == "applied after a fake-tensor export"
    assert program.model.metadata_props["openreg_onnx.source_device"] == "openreg:0"
    x = tuple(a.to("openreg") for a in build_args())
    feeds = {i.name: a.cpu().numpy() for i, a in zip(program.model_proto.graph.input, x)}
    (got,), backend, _ = run_onnx(program.model_proto, feeds)
    assert backend == "onnxruntime"
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), real(*x).cpu(), rtol=1e-4, atol=1e-5)


def test_missing_weights_are_named():
    with pytest.raises(KeyError, match=r"weights lack 2 of the model's initializers: net.2.bias, net.2.weight"):
        weights = {k: v for k, v in MLP().state_dict().items() if not k.startswith("net.2")}
        export_without_weights(MLP, lambda: (torch.randn(3, 8),), weights)


def test_without_weights_the_graph_saves_without_initializers(tmp_path):
    program = export_without_weights(MLP, lambda: (torch.randn(3, 8),))
    assert program.model.metadata_props["openreg_onnx.weights"] == "none (fake at export)"
    path = tmp_path / "graph.onnx"
    program.save(str(path), include_initializers=False)
    model = onnx.load(str(path))
    assert [n.op_type for n in model.graph.node].count("Gemm") + [n.op_type for n in model.graph.node].count(
        "MatMul"
    ) == 2
    assert len(model.graph.initializer) == 0
