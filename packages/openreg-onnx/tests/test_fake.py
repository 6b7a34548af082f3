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


def test_weights_of_another_shape_or_dtype_are_refused():
    # The model's own load_state_dict refuses them; onnxruntime would broadcast a bias of shape
    # [1] (a wrong result) and refuse a file whose weight changed dtype.
    weights = MLP().state_dict()
    for key, value, said in (
        ("net.2.bias", torch.zeros(1), r"net.2.bias: \(1,\) torch.float32 instead of \(4,\) torch.float32"),
        ("net.0.weight", weights["net.0.weight"].double(), r"net.0.weight: \(16, 8\) torch.float64 instead of"),
    ):
        with pytest.raises(ValueError, match="weights do not fit the model's initializers: " + said):
            export_without_weights(MLP, lambda: (torch.randn(3, 8),), {**weights, key: value})
    # the non-persistent buffer and the tensor attribute are checked too
    real = WithNonPersistent()
    with pytest.raises(ValueError, match=r"pos: \(3,\) torch.float32 instead of \(4,\)"):
        export_without_weights(
            WithNonPersistent,
            _with_non_persistent_args,
            {**real.state_dict(), "pos": torch.zeros(3), "scale": real.scale},
        )


class WithNonPersistent(nn.Module):
    """A non-persistent buffer and a plain tensor attribute (neither in ``state_dict()``), and a
    tensor ``forward`` makes from data (a real constant of the program)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("pos", torch.arange(4.0) * 10, persistent=False)
        self.scale = torch.full((4,), 3.0)

    def forward(self, x):
        return (self.fc(x) + self.pos) * self.scale + torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)


def _with_non_persistent_args():
    return (torch.randn(2, 4),)


def test_non_persistent_buffer_and_tensor_attribute_are_applied():
    torch.manual_seed(0)
    real = WithNonPersistent().to("openreg").eval()
    real.scale = real.scale.to("openreg")
    weights = {**real.state_dict(), "pos": real.pos, "scale": real.scale}
    assert "pos" not in real.state_dict()
    program = export_without_weights(WithNonPersistent, _with_non_persistent_args, weights)
    x = torch.randn(2, 4, device="openreg")
    (got,), backend, _ = run_onnx(program.model_proto, {program.model_proto.graph.input[0].name: x.cpu().numpy()})
    assert backend == "onnxruntime"
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), real(x).cpu(), rtol=1e-4, atol=1e-5)


def test_missing_non_persistent_buffer_is_named():
    # Left out, they would stay fake initializers and fail in the optimizer (".numpy() is not
    # supported for tensor subclasses"); the forward's constant is real and is not asked for.
    weights = WithNonPersistent().state_dict()
    message = (
        r"weights lack 2 of the model's initializers: pos \(a non-persistent buffer, not in state_dict\(\)\), "
        r"scale \(a tensor attribute, not in state_dict\(\)\); "
        r"pass those outside state_dict\(\) by the same dotted names"
    )
    with pytest.raises(KeyError, match=message):
        export_without_weights(WithNonPersistent, _with_non_persistent_args, weights)


def test_saves_with_external_data(tmp_path):
    real = MLP().to("openreg").eval()
    path = tmp_path / "mlp.onnx"
    export_without_weights(MLP, lambda: (torch.randn(3, 8),), real.state_dict(), str(path), external_data=True)
    assert (tmp_path / "mlp.onnx.data").exists()
    model = onnx.load(str(path))
    x = torch.randn(3, 8, device="openreg")
    (got,), backend, _ = run_onnx(model, {model.graph.input[0].name: x.cpu().numpy()})
    assert backend == "onnxruntime"
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), real(x).cpu(), rtol=1e-4, atol=1e-5)


def test_a_file_without_weights_needs_export_params_false(tmp_path):
    path = tmp_path / "graph.onnx"
    with pytest.raises(ValueError, match=r"without weights the initializers are fake and cannot be written to f"):
        export_without_weights(MLP, lambda: (torch.randn(3, 8),), None, str(path))
    assert not path.exists()
    export_without_weights(MLP, lambda: (torch.randn(3, 8),), None, str(path), export_params=False)
    assert len(onnx.load(str(path)).graph.initializer) == 0
