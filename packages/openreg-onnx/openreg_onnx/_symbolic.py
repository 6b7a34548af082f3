"""Symbolic functions of openreg's operators for the TorchScript exporter (``dynamo=False``).

The TorchScript exporter traces ``aten::scaled_dot_product_attention`` itself (torch ships its
symbolic), so only the ``openreg::`` operators need one here. They emit standard ONNX ops, the
same computation as the portable translations in ``_table.py``. Registered for opset 9, which
covers every later opset; a user's own ``torch.onnx.register_custom_op_symbolic`` for the same
name, made later, replaces ours.
"""

from __future__ import annotations

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils
from torch.onnx._internal.torchscript_exporter.symbolic_helper import parse_args

OPSET = 9
_FLOATING = {
    _type_utils.JitScalarType.HALF,
    _type_utils.JitScalarType.BFLOAT16,
    _type_utils.JitScalarType.FLOAT,
    _type_utils.JitScalarType.DOUBLE,
}
_16_BIT = {_type_utils.JitScalarType.HALF, _type_utils.JitScalarType.BFLOAT16}


@parse_args("v")
def custom_abs(g, input):
    return g.op("Abs", input)


@parse_args("v", "f")
def scaled_square(g, x, scale):
    dtype = _type_utils.JitScalarType.from_value(x, _type_utils.JitScalarType.FLOAT)
    if dtype in _FLOATING:
        square = g.op("Mul", x, x)
    else:  # x * x in x's type (an integer square wraps, as _table.py::_square), then promoted
        square = x
        if dtype == _type_utils.JitScalarType.INT64:
            square = g.op("Mul", x, x)
        elif dtype != _type_utils.JitScalarType.BOOL:
            wide = g.op("Cast", x, to_i=_type_utils.JitScalarType.INT64.onnx_type())
            square = g.op("Cast", g.op("Mul", wide, wide), to_i=dtype.onnx_type())
        dtype = _type_utils.JitScalarType.from_dtype(torch.get_default_dtype())
        square = g.op("Cast", square, to_i=dtype.onnx_type())
    if dtype in _16_BIT:  # the scale in float32, rounded once, as eager (_table.py::_times_scale)
        s = g.op("Constant", value_t=torch.tensor(scale, dtype=torch.float32))
        wide = g.op("Cast", square, to_i=_type_utils.JitScalarType.FLOAT.onnx_type())
        return g.op("Cast", g.op("Mul", wide, s), to_i=dtype.onnx_type())
    s = g.op("Constant", value_t=torch.tensor(scale, dtype=dtype.dtype()))
    return g.op("Mul", square, s)


@parse_args("v")
def identity(g, input):
    return g.op("Identity", input)


SYMBOLICS = {
    "openreg::custom_abs": custom_abs,
    "openreg::scaled_square": scaled_square,
    "openreg::custom_autograd_fn_returns_self": identity,
    "openreg::custom_autograd_fn_aliasing": identity,
}


def register() -> None:
    for name, fn in SYMBOLICS.items():
        torch.onnx.register_custom_op_symbolic(name, fn, OPSET)
