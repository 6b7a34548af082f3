"""Shared models and helpers for openreg-onnx's tests.

Exports cost about a second each (the exporter rebuilds its registry every time), so tests
that look at one exported model share it through module-scoped fixtures. Most of that second is
onnxscript listing torchlib's functions (``get_torchlib_ops`` parses the source of each of its
~500 functions to read their domain); the list depends only on the installed onnxscript, so the
tests compute it once per process (``_torchlib_ops_once``): the exporter still builds its registry,
and openreg-onnx still adds its translations, on every export.
"""

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_openreg.utils.testing import run_python  # noqa: F401  (used by the tests)


def _torchlib_ops_once() -> None:
    # torch calls it through the module of its version (onnxscript._framework_apis.torch_2_11 for
    # torch 2.13), which re-exports torch_2_5's function: every module that has it gets the cached one.
    import importlib
    import pkgutil

    import onnxscript._framework_apis as apis

    original = importlib.import_module("onnxscript._framework_apis.torch_2_5").get_torchlib_ops
    cached = functools.cache(original)
    for info in pkgutil.iter_modules(apis.__path__):
        module = importlib.import_module(f"{apis.__name__}.{info.name}")
        if getattr(module, "get_torchlib_ops", None) is original:
            module.get_torchlib_ops = cached


_torchlib_ops_once()


def pytest_configure(config):
    # torch's own deprecation chatter (pytree, the TorchScript exporter) is not under test here.
    config.addinivalue_line("filterwarnings", "ignore:.*LeafSpec.*:FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore:.*legacy TorchScript-based ONNX export.*:DeprecationWarning")


@pytest.fixture(autouse=True)
def _idle_device():
    yield
    torch.openreg.synchronize()


class MLP(nn.Module):
    def __init__(self, d_in=8, d_hidden=16, d_out=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out))

    def forward(self, x):
        return self.net(x)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1)


class Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(8, 12, num_layers=2, batch_first=True)

    def forward(self, x):
        out, _ = self.rnn(x)
        return out


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class AllOps(nn.Module):
    """Every openreg operator and every form of the fused attention, one output each."""

    NAMES = (
        "custom_abs",
        "scaled_square",
        "scaled_square_int",
        "sdpa",
        "sdpa_causal",
        "sdpa_bool_mask",
        "sdpa_float_mask",
        "sdpa_scale",
        "sdpa_causal_cross",
    )

    def forward(self, x, xi, q, k, v, bool_mask, float_mask):
        return (
            torch.ops.openreg.custom_abs(x),
            torch.ops.openreg.scaled_square(x, 0.37),
            torch.ops.openreg.scaled_square(xi, 1.5),
            F.scaled_dot_product_attention(q, k, v),
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask),
            F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask),
            F.scaled_dot_product_attention(q, k, v, scale=0.2),
            # fewer queries than keys: the causal mask is the top-left triangle, as in torch
            F.scaled_dot_product_attention(q[:, :, :3], k, v, is_causal=True),
        )


def all_ops_inputs(dtype=torch.float32, device="openreg"):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g) for _ in range(3))
    bool_mask = torch.rand(5, 5, generator=g) > 0.3
    bool_mask[:, 0] = True  # no row left without a position
    float_mask = torch.randn(2, 1, 5, 5, generator=g)
    tensors = (torch.randn(3, 4, generator=g), torch.randint(-4, 5, (3, 4), generator=g), q, k, v)
    tensors = tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)
    return tuple(t.to(device) for t in (*tensors, bool_mask, float_mask.to(dtype)))


def decomposed_program(model, args, **kw):
    """The openreg program after run_decompositions(): SDPA is the fused overrideable op here."""
    return torch.export.export(model, args, **kw).run_decompositions()
