"""Whole models on openreg, exported with openreg_onnx.export and verified against openreg eager."""

import openreg_onnx
import pytest
import torch
import torch.nn as nn
from conftest import MHA, MLP, ConvBN, Recurrent
from openreg_onnx._verify import run_onnx
from torch.export import Dim
from torch_openreg.utils.models import GPTBlock, TinyGPT

MODELS = {
    "mlp": (lambda: MLP(), lambda g: (torch.randn(5, 8, generator=g),)),
    "conv_bn": (lambda: ConvBN(), lambda g: (torch.randn(2, 3, 8, 8, generator=g),)),
    "lstm": (lambda: Recurrent(nn.LSTM), lambda g: (torch.randn(2, 6, 8, generator=g),)),
    "gru": (lambda: Recurrent(nn.GRU), lambda g: (torch.randn(2, 6, 8, generator=g),)),
    "multihead_attention": (lambda: MHA(), lambda g: (torch.randn(2, 5, 16, generator=g),)),
    "transformer_encoder_layer": (
        lambda: nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True),
        lambda g: (torch.randn(2, 5, 16, generator=g),),
    ),
    "gpt_block": (lambda: GPTBlock(32, 4), lambda g: (torch.randn(2, 6, 32, generator=g),)),
}


def _build(name, device="openreg", dtype=torch.float32):
    torch.manual_seed(0)
    make_model, make_args = MODELS[name]
    model = make_model().to(device=device, dtype=dtype).eval()
    args = tuple(a.to(device=device, dtype=dtype) for a in make_args(torch.Generator().manual_seed(1)))
    if name == "conv_bn":  # non-trivial running statistics
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model, args


@pytest.mark.parametrize("name", list(MODELS))
def test_model_matches_openreg_eager(name):
    model, args = _build(name)
    result = openreg_onnx.verify(model, args)
    assert result.ok, result.report()
    assert result.backend == "onnxruntime"


@pytest.mark.parametrize(
    "dtype, backend",
    [(torch.float16, "onnxruntime"), (torch.bfloat16, "onnx.reference"), (torch.float64, "onnx.reference")],
    ids=["float16", "bfloat16", "float64"],
)
def test_mlp_dtypes(dtype, backend):
    # bfloat16: onnxruntime's Python API takes no bfloat16 arrays (and its CPU EP has no bfloat16
    # Gemm); float64: the CPU EP has no double Erf (GELU). The reference evaluator runs those.
    model, args = _build("mlp", dtype=dtype)
    result = openreg_onnx.verify(model, args)
    assert result.ok, result.report()
    assert result.backend == backend
    if dtype == torch.float64:
        assert "Erf" in result.fallback_reason


def test_gpt_block_float16():
    model, args = _build("gpt_block", dtype=torch.float16)
    result = openreg_onnx.verify(model, args)
    assert result.ok, result.report()


def test_second_device():
    model, args = _build("mlp", device="openreg:1")
    result = openreg_onnx.verify(model, args)
    assert result.ok, result.report()
    meta = {p.key: p.value for p in result.onnx_program.model_proto.metadata_props}
    assert meta["openreg_onnx.source_device"] == "openreg:1"


# --- dynamic shapes ---------------------------------------------------------------------------

GPT_DYNAMIC = {"idx": {0: Dim("batch", max=64), 1: Dim("seq", max=16)}}


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    return TinyGPT().to("openreg").eval()


def _symbolic_dims(program):
    (value,) = program.model_proto.graph.input
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_gpt_on_cpu_keeps_dynamic_dims(gpt):
    # The reference point: the same model on the CPU exports with symbolic batch and sequence.
    cpu = TinyGPT().eval()
    cpu.load_state_dict({k: v.cpu() for k, v in gpt.state_dict().items()})
    program = openreg_onnx.export(cpu, (torch.randint(0, 64, (2, 8)),), dynamic_shapes=GPT_DYNAMIC)
    assert _symbolic_dims(program) == ["batch", "seq"]


def test_gpt_dynamic_batch_and_sequence(gpt):
    # Needs core's SDPA backend choice to keep sizes symbolic (core, 14:03); before that the dims
    # came out static and openreg_onnx.export refused with DynamicDimError.
    idx = torch.randint(0, 64, (2, 8), device="openreg")
    program = openreg_onnx.export(gpt, (idx,), dynamic_shapes=GPT_DYNAMIC)
    assert _symbolic_dims(program) == ["batch", "seq"]
    for batch, seq in ((2, 8), (3, 5), (1, 16)):
        new = torch.randint(0, 64, (batch, seq), device="openreg")
        (got,), backend, _ = run_onnx(program.model_proto, {"idx": new.cpu().numpy()})
        assert backend == "onnxruntime"
        with torch.no_grad():
            want = gpt(new).cpu()
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-4, atol=1e-5)
