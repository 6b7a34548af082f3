"""openreg's ONNX translation table for the dynamo exporter (``torch.onnx.export(dynamo=True)``).

One translation per operator in core's ``openreg`` namespace, one for the openreg-specific
ATen op an exported graph can hold: ``aten._scaled_dot_product_fused_attention_overrideable``
(what ``scaled_dot_product_attention`` becomes on openreg after ``run_decompositions()``, since
core's SDPA choice answers OVERRIDEABLE), and ones replacing torchlib's
``quantized_decomposed.quantize_per_tensor`` (which drops a ``quant_min``/``quant_max`` narrower
than the dtype, as ``OpenRegQuantizer(reduce_range=True)`` gives) and
``dequantize_per_tensor.tensor`` (which failed). Two modes:

- ``portable``: standard ONNX ops only; any runtime runs the model.
- ``vendor``: one node per op in the ``com.openreg`` domain (``_vendor.py``: schemas, and the
  function bodies attached after export), the place a vendor's execution provider hooks in.

The translations are trace-only onnxscript functions, the form torchlib and torchvision use:
plain Python that calls ONNX ops on the values; annotated ``float``/``bool`` parameters become
attributes of the torch op's schema, unannotated ones inputs. ``SIGNATURES`` is each op's
schema as this file was written against; the coverage test compares it with the live schemas.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import onnx_ir as ir
import torch
from onnxscript import opset18 as op
from onnxscript.values import Opset

from . import _vendor

MODES = ("portable", "vendor")
openreg_ops = Opset(_vendor.DOMAIN, _vendor.VERSION)

_SDPA = "aten::_scaled_dot_product_fused_attention_overrideable"
_QUANTIZE = "quantized_decomposed::quantize_per_tensor"
_QUANTIZE_TENSOR = "quantized_decomposed::quantize_per_tensor.tensor"
_DEQUANTIZE = "quantized_decomposed::dequantize_per_tensor"
_DEQUANTIZE_TENSOR = "quantized_decomposed::dequantize_per_tensor.tensor"
_DEQUANTIZE_CHANNEL = "quantized_decomposed::dequantize_per_channel"
# The schemas the translations implement (torch op name -> str(schema) without the name).
SIGNATURES = {
    "openreg::custom_abs": "(Tensor input) -> Tensor",
    "openreg::custom_autograd_fn_returns_self": "(Tensor(a) input) -> Tensor(a)",
    "openreg::custom_autograd_fn_aliasing": "(Tensor(a) input) -> Tensor(a)",
    "openreg::scaled_square": "(Tensor x, float scale) -> Tensor",
    _SDPA: "(Tensor query, Tensor key, Tensor value, Tensor? attn_bias=None, float dropout_p=0., "
    "bool is_causal=False, bool return_debug_mask=False, *, float? scale=None) -> (Tensor output, "
    "Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, Tensor philox_seed, "
    "Tensor philox_offset, Tensor debug_attn_mask)",
    _QUANTIZE: "(Tensor input, float scale, int zero_point, int quant_min, int quant_max, ScalarType dtype) -> Tensor",
    _QUANTIZE_TENSOR: "(Tensor input, Tensor scale, Tensor zero_point, int quant_min, int quant_max, "
    "ScalarType dtype) -> Tensor",
    _DEQUANTIZE: "(Tensor input, float scale, int zero_point, int quant_min, int quant_max, ScalarType dtype, *, "
    "ScalarType? out_dtype=None) -> Tensor",
    _DEQUANTIZE_TENSOR: "(Tensor input, Tensor scale, Tensor zero_point, int quant_min, int quant_max, "
    "ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
    _DEQUANTIZE_CHANNEL: "(Tensor input, Tensor scales, Tensor? zero_points, int axis, int quant_min, int quant_max, "
    "ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
}

_FLOATING = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE)


def _default_float() -> ir.DataType:
    """The type ``x * x * scale`` promotes an integer or bool x to: torch's default float type."""
    default = {
        torch.float16: ir.DataType.FLOAT16,
        torch.bfloat16: ir.DataType.BFLOAT16,
        torch.float64: ir.DataType.DOUBLE,
    }
    return default.get(torch.get_default_dtype(), ir.DataType.FLOAT)


# --- openreg:: operators ------------------------------------------------------------------


def _const(value: float, like):
    """A 0-d constant of ``like``'s type, made from the Python float directly (a float32 constant
    cast to float64 would lose torch's double precision)."""
    return op.Constant(value=ir.tensor(value, dtype=like.dtype))


def custom_abs(input):
    return op.Abs(input)


# Eager computes ``x * x`` in x's own type, so an integer square wraps before it becomes a float
# (int8 -100: 10000 wraps to 16). onnxruntime has no Mul for the narrow integers: they square in a
# wider type that holds every product, and the Cast back wraps as the integer product does.
_SQUARE_IN = {
    ir.DataType.INT8: ir.DataType.INT32,
    ir.DataType.UINT8: ir.DataType.INT32,
    ir.DataType.INT16: ir.DataType.INT32,
    ir.DataType.UINT16: ir.DataType.INT64,
    ir.DataType.INT32: ir.DataType.INT64,
}


def _square(x):
    """``x * x`` in x's type, as eager computes it."""
    if x.dtype == ir.DataType.BOOL:
        return x  # True * True is True
    wide = _SQUARE_IN.get(x.dtype)
    if wide is None:
        return op.Mul(x, x)
    w = op.Cast(x, to=wide)
    return op.Cast(op.Mul(w, w), to=x.dtype)


_16_BIT = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _scale_factor(scale: float, dtype: ir.DataType):
    """``scale`` as eager multiplies by it: in float32 for 16-bit data (opmath), else in the
    data's own type (a float64 model keeps torch's double)."""
    return op.Constant(value=ir.tensor(scale, dtype=ir.DataType.FLOAT if dtype in _16_BIT else dtype))


def _times_scale(y, scale: float, dtype: ir.DataType):
    """``y * scale`` for a ``y`` of float type ``dtype``, rounded as eager rounds it: a 16-bit
    ``y`` is multiplied in float32 and rounded once to its type (a 16-bit constant gave inf for a
    scale beyond 65504 in float16, and bfloat16 kept 8 bits of it)."""
    if dtype in _16_BIT:
        return op.Cast(op.Mul(op.Cast(y, to=ir.DataType.FLOAT), _scale_factor(scale, dtype)), to=dtype)
    return op.Mul(y, _scale_factor(scale, dtype))


def scaled_square(x, scale: float):
    # Decided by x's type: the type of a value computed here is not known while tracing.
    if x.dtype in _FLOATING:
        return _times_scale(op.Mul(x, x), scale, x.dtype)
    to = _default_float()
    return _times_scale(op.Cast(_square(x), to=to), scale, to)


def custom_autograd_fn_returns_self(input):
    return op.Identity(input)


def custom_autograd_fn_aliasing(input):
    return op.Identity(input)


def vendor_custom_abs(input):
    return openreg_ops.custom_abs(input)


def vendor_scaled_square(x, scale: float):
    if x.dtype not in _FLOATING:  # the vendor kernel takes floats: an integer square is portable
        return scaled_square(x, scale)
    # SCALE in float32 for 16-bit x: the body multiplies in SCALE's type and rounds once to x's.
    return openreg_ops.scaled_square(x, _scale_factor(scale, x.dtype))


def vendor_custom_autograd_fn_returns_self(input):
    return openreg_ops.custom_autograd_fn_returns_self(input)


def vendor_custom_autograd_fn_aliasing(input):
    return openreg_ops.custom_autograd_fn_aliasing(input)


# --- aten._scaled_dot_product_fused_attention_overrideable ----------------------------------


def _check_attention(query, key, value, dropout_p):
    if dropout_p != 0.0:
        raise ValueError("openreg's fused attention has no dropout (core refuses it too): export the model in eval()")
    if len(query.shape) != 4 or len(key.shape) != 4 or len(value.shape) != 4:
        raise ValueError("openreg's fused attention takes 4-D [batch, heads, seq, dim] query, key and value")


def _scale(query, scale):
    """The factor of Q K^T: ``scale``, else 1/sqrt(E) (from the shape when E is symbolic)."""
    if scale is not None:
        return _const(scale, query)
    e = query.shape[-1]
    if isinstance(e, int):
        return _const(1.0 / math.sqrt(e), query)
    # In double for a double query (torch's scale is a double); in float for the others.
    wide = ir.DataType.DOUBLE if query.dtype == ir.DataType.DOUBLE else ir.DataType.FLOAT
    e = op.Cast(op.Shape(query, start=-1), to=wide)
    return op.CastLike(op.Reciprocal(op.Sqrt(e)), query)


def _softmax_dtype(query) -> ir.DataType:
    return ir.DataType.FLOAT if query.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16) else query.dtype


def _additive(mask, query):
    """A boolean mask as an additive one (True keeps: 0, False drops: -inf)."""
    if mask.dtype != ir.DataType.BOOL:
        return mask
    zero, neg = _const(0.0, query), _const(float("-inf"), query)
    return op.Where(mask, zero, neg)


def _empty_outputs(query, key):
    """The overrideable op's other results (unused by inference graphs): cumulative sequence
    lengths, the max sequence lengths, RNG state and the debug mask."""
    empty_long = op.Constant(value=ir.tensor([], dtype=ir.DataType.INT64))
    max_q = op.Squeeze(op.Shape(query, start=-2, end=-1))
    max_k = op.Squeeze(op.Shape(key, start=-2, end=-1))
    debug = op.CastLike(op.Constant(value=ir.tensor([], dtype=ir.DataType.FLOAT)), query)
    return empty_long, empty_long, max_q, max_k, empty_long, empty_long, debug


def _int64(value):
    """An int64 Constant as a ``value`` tensor: onnx's version converter (torch converts the
    model down to an ``opset_version`` below 18) fails on ``value_int``/``value_ints``."""
    return op.Constant(value=ir.tensor(value, dtype=ir.DataType.INT64))


def _attention(query, key, value, bias, is_causal: bool, scale):
    """Same math as core's kernel (csrc/aten/OpenRegAttention.cpp): S = scale Q K^T (+ bias,
    causal: -inf above the diagonal), softmax in float for 16-bit inputs with rows left empty
    giving zeros; returns (O, logsumexp(S))."""
    s = op.Mul(op.MatMul(query, op.Transpose(key, perm=[0, 1, 3, 2])), scale)
    if bias is not None:
        s = op.Where(bias, s, op.CastLike(float("-inf"), s)) if bias.dtype == ir.DataType.BOOL else op.Add(s, bias)
    if is_causal:
        zero, one = _int64(0), _int64(1)
        rows = op.Range(zero, op.Squeeze(op.Shape(query, start=-2, end=-1)), one)
        cols = op.Range(zero, op.Squeeze(op.Shape(key, start=-2, end=-1)), one)
        keep = op.LessOrEqual(cols, op.Unsqueeze(rows, [-1]))
        s = op.Where(keep, s, op.CastLike(float("-inf"), s))
    s = op.Cast(s, to=_softmax_dtype(query))
    axis = _int64([-1])
    # No noop_with_empty_axes (None drops the default the tracer fills in): moving the axes into an
    # attribute below opset 18, onnx's version converter keeps it, and ReduceMax-13 has none.
    m = op.ReduceMax(s, axis, keepdims=1, noop_with_empty_axes=None)
    zero = op.CastLike(0.0, m)
    m = op.Where(op.IsInf(m, detect_positive=0), zero, m)
    e = op.Exp(op.Sub(s, m))
    total = op.ReduceSum(e, axis, keepdims=1)
    lse = op.Squeeze(op.Add(op.Log(total), m), axis)
    p = op.Where(op.Equal(total, zero), zero, op.Div(e, total))
    return op.MatMul(op.CastLike(p, query), value), lse


def sdpa_overrideable(
    query,
    key,
    value,
    attn_bias=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    scale: Optional[float] = None,
):
    _check_attention(query, key, value, dropout_p)
    out, lse = _attention(query, key, value, attn_bias, is_causal, _scale(query, scale))
    return (out, lse, *_empty_outputs(query, key))


def vendor_sdpa_overrideable(
    query,
    key,
    value,
    attn_bias=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    scale: Optional[float] = None,
):
    _check_attention(query, key, value, dropout_p)
    factor = _scale(query, scale)
    attrs = dict(is_causal=int(is_causal), softmax_dtype=int(_softmax_dtype(query)))
    if attn_bias is None:
        out, lse = openreg_ops.sdpa(query, key, value, factor, **attrs)
    else:
        out, lse = openreg_ops.sdpa_masked(query, key, value, factor, _additive(attn_bias, query), **attrs)
    # LSE's type variable is bound by no input, so onnxscript leaves it untyped: set it.
    lse.type = ir.TensorType(_softmax_dtype(query))
    return (out, lse, *_empty_outputs(query, key))


# --- quantized_decomposed.quantize_per_tensor (and dequantize_per_tensor.tensor) --------------


_INTEGER_RANGE = {
    ir.DataType.UINT8: (0, 255),
    ir.DataType.INT8: (-128, 127),
    ir.DataType.UINT16: (0, 65535),
    ir.DataType.INT16: (-32768, 32767),
    ir.DataType.INT32: (-(2**31), 2**31 - 1),
}


def _quantize(input, scale, zero_point, quant_min: int, quant_max: int, dtype: int):
    """``QuantizeLinear``, then ``Clip`` to ``[quant_min, quant_max]`` when that range is narrower
    than the dtype's: QuantizeLinear saturates to the whole dtype (0..255 for uint8), while the
    torch op clamps to its range (0..127 with ``reduce_range``). torchlib's translation, which
    this replaces, dropped the range; its per-channel one clamps already. Clip takes uint8/int8
    from opset 12. A 16-bit input is quantized from float32, as eager does (QuantizeLinear-18
    takes no float16)."""
    dtype = ir.DataType(dtype)
    if input.dtype in _16_BIT:
        input = op.Cast(input, to=ir.DataType.FLOAT)
    q = op.QuantizeLinear(input, scale, zero_point)
    if dtype not in _INTEGER_RANGE:  # float8: the range is the type's
        return q
    dtype_min, dtype_max = _INTEGER_RANGE[dtype]
    if quant_min <= dtype_min and quant_max >= dtype_max:
        return q
    low = op.Constant(value=ir.tensor(max(quant_min, dtype_min), dtype=dtype))
    high = op.Constant(value=ir.tensor(min(quant_max, dtype_max), dtype=dtype))
    return op.Clip(q, low, high)


_QDQ_TYPES = (ir.DataType.UINT8, ir.DataType.INT8)


def _quantize_arithmetic(input, inv_scale, zero_point, quant_min: int, quant_max: int, dtype: int):
    """The decomposition's own arithmetic, ``clamp(round(x * (1 / scale)) + zero_point, quant_min,
    quant_max).to(dtype)`` in float32, for the dtypes other than uint8/int8: QuantizeLinear takes
    16-bit integers only from opset 21 (onnxruntime then has no 16-bit Clip), never int32, and casts
    to float8 without rounding first (eager rounds to integers). ``inv_scale`` and ``zero_point``
    are float32."""
    if input.dtype != ir.DataType.FLOAT:
        input = op.Cast(input, to=ir.DataType.FLOAT)
    shifted = op.Add(op.Round(op.Mul(input, inv_scale)), zero_point)
    low = op.Constant(value=ir.tensor(float(quant_min), dtype=ir.DataType.FLOAT))
    high = op.Constant(value=ir.tensor(float(quant_max), dtype=ir.DataType.FLOAT))
    return op.Cast(op.Clip(shifted, low, high), to=ir.DataType(dtype))


def quantize_per_tensor(input, scale: float, zero_point: int, quant_min: int, quant_max: int, dtype: int):
    if ir.DataType(dtype) not in _QDQ_TYPES:
        inv = op.Constant(value=ir.tensor(1.0 / scale, dtype=ir.DataType.FLOAT))
        zero = op.Constant(value=ir.tensor(float(zero_point), dtype=ir.DataType.FLOAT))
        return _quantize_arithmetic(input, inv, zero, quant_min, quant_max, dtype)
    scale_value = op.Constant(value=ir.tensor(scale, dtype=ir.DataType.FLOAT))
    zero = op.Constant(value=ir.tensor(zero_point, dtype=ir.DataType(dtype)))
    return _quantize(input, scale_value, zero, quant_min, quant_max, dtype)


def _tensor_qparams(scale, zero_point, dtype: int):
    """One-element tensors (the op takes their ``item()``) as QuantizeLinear's per-tensor form:
    0-d, a float32 scale, a zero point of the quantized dtype."""
    scalar = _int64([])
    return (
        op.Cast(op.Reshape(scale, scalar), to=ir.DataType.FLOAT),
        op.Cast(op.Reshape(zero_point, scalar), to=ir.DataType(dtype)),
    )


def quantize_per_tensor_tensor(input, scale, zero_point, quant_min: int, quant_max: int, dtype: int):
    if ir.DataType(dtype) not in _QDQ_TYPES:
        scale, zero_point = _tensor_qparams(scale, zero_point, ir.DataType.FLOAT)
        return _quantize_arithmetic(input, op.Reciprocal(scale), zero_point, quant_min, quant_max, dtype)
    scale, zero_point = _tensor_qparams(scale, zero_point, dtype)
    return _quantize(input, scale, zero_point, quant_min, quant_max, dtype)


def _out_type(out_dtype: Optional[int]) -> ir.DataType:
    """A dequantize's ``out_dtype`` (None: float32, as the decomposition's default)."""
    return ir.DataType.FLOAT if out_dtype in (None, -1) else ir.DataType(out_dtype)


def dequantize_per_tensor(
    input, scale: float, zero_point: int, quant_min: int, quant_max: int, dtype: int, out_dtype: Optional[int] = None
):
    to = _out_type(out_dtype)
    if to != ir.DataType.FLOAT or ir.DataType(dtype) not in _QDQ_TYPES:
        scale_value = op.Constant(value=ir.tensor(scale, dtype=ir.DataType.DOUBLE))  # torch's double
        return _dequantize_arithmetic(input, scale_value, _int64(zero_point), to)
    scale_value = op.Constant(value=ir.tensor(scale, dtype=ir.DataType.FLOAT))
    return op.DequantizeLinear(input, scale_value, op.Constant(value=ir.tensor(zero_point, dtype=ir.DataType(dtype))))


def dequantize_per_tensor_tensor(
    input, scale, zero_point, quant_min: int, quant_max: int, dtype: int, out_dtype: Optional[int] = None
):
    # torchlib's passed the zero-point tensor where it takes a number and failed on every such node.
    to = _out_type(out_dtype)
    if to != ir.DataType.FLOAT or ir.DataType(dtype) not in _QDQ_TYPES:
        return _dequantize_arithmetic(input, scale, zero_point, to)
    scale, zero_point = _tensor_qparams(scale, zero_point, dtype)
    return op.DequantizeLinear(input, scale, zero_point)


def _dequantize_arithmetic(input, scale, zero_point, to):
    """The decomposition's ``(input.to(out_dtype) - zero_point) * scale`` where DequantizeLinear
    cannot stand for it: data of 16-bit or 32-bit integers (onnxruntime refused the model at the
    default opset), or an ``out_dtype`` other than float32 (DequantizeLinear then a Cast rounded
    differently): float64 in double; float16/bfloat16 in float32, as torch's CPU kernels compute
    them, with the data, the zero point and each step's result rounded to the 16-bit type (the
    scale is not); only Casts touch the 16-bit type: onnxruntime has no 16-bit Sub or Mul."""
    math = ir.DataType.DOUBLE if to == ir.DataType.DOUBLE else ir.DataType.FLOAT
    scalar = _int64([])

    def rounded(value):  # to the output dtype and back to the arithmetic's
        return value if to == math else op.Cast(op.Cast(value, to=to), to=math)

    zero_point = rounded(op.Cast(op.Reshape(zero_point, scalar), to=math))  # 2049 is 2048 in float16
    scale = op.Cast(op.Reshape(scale, scalar), to=math)
    shifted = rounded(op.Sub(rounded(op.Cast(input, to=math)), zero_point))
    return op.Cast(op.Mul(shifted, scale), to=to)


def dequantize_per_channel(
    input,
    scales,
    zero_points,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: int,
    out_dtype: Optional[int] = None,
):
    """torchlib's translation is DequantizeLinear (float32) then a Cast: onnxruntime refused int16
    and int32 data at the default opset, and float64 scales or outputs lost bits. DequantizeLinear
    stays for uint8/int8 data with float32 scales to float32; otherwise the decomposition's own
    ``((input - zero_points) * scales).to(out_dtype)``, in its types: the difference in int64 (or
    in a floating zero point's type), the product in the scales' type (the wider of the two floating
    types)."""
    to = _out_type(out_dtype)
    scale_type = scales.dtype or ir.DataType.FLOAT
    if ir.DataType(dtype) in _QDQ_TYPES and scale_type == ir.DataType.FLOAT and to == ir.DataType.FLOAT:
        zero = None if zero_points is None else op.Cast(zero_points, to=ir.DataType(dtype))
        return op.DequantizeLinear(input, scales, zero, axis=axis)
    rank = len(input.shape)
    shape = _int64([-1 if d == axis % rank else 1 for d in range(rank)])  # scales along `axis`
    zp_type = ir.DataType.INT64 if zero_points is None else zero_points.dtype or ir.DataType.INT64
    diff_type = zp_type if zp_type in _FLOATING else ir.DataType.INT64
    x = op.Cast(input, to=diff_type)
    if zero_points is not None:
        x = op.Sub(x, op.Reshape(op.Cast(zero_points, to=diff_type), shape))
    if diff_type == ir.DataType.DOUBLE:  # promoted with the scales
        scale_type = ir.DataType.DOUBLE
    product = op.Mul(op.Cast(x, to=scale_type), op.Reshape(scales, shape))
    return product if to == scale_type else op.Cast(product, to=to)


_TRANSLATIONS = {
    "openreg::custom_abs": (custom_abs, vendor_custom_abs),
    "openreg::scaled_square": (scaled_square, vendor_scaled_square),
    "openreg::custom_autograd_fn_returns_self": (
        custom_autograd_fn_returns_self,
        vendor_custom_autograd_fn_returns_self,
    ),
    "openreg::custom_autograd_fn_aliasing": (custom_autograd_fn_aliasing, vendor_custom_autograd_fn_aliasing),
    _SDPA: (sdpa_overrideable, vendor_sdpa_overrideable),
    # Standard QuantizeLinear/Clip in both modes: no com.openreg op.
    _QUANTIZE: (quantize_per_tensor, quantize_per_tensor),
    _QUANTIZE_TENSOR: (quantize_per_tensor_tensor, quantize_per_tensor_tensor),
    _DEQUANTIZE: (dequantize_per_tensor, dequantize_per_tensor),
    _DEQUANTIZE_TENSOR: (dequantize_per_tensor_tensor, dequantize_per_tensor_tensor),
    _DEQUANTIZE_CHANNEL: (dequantize_per_channel, dequantize_per_channel),
}


def _split(qualified: str):
    """``"ns::op.overload"`` -> ``("ns::op", "overload")``; no overload is the default (``""``)."""
    name, _, overload = qualified.partition(".")
    return name, overload


def _define_quantized_decomposed() -> None:
    """The ``quantized_decomposed`` schemas are defined in Python by torch (openreg-quant imports
    them too); cheap once torch is imported."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401


def _overload(qualified: str) -> torch._ops.OpOverload:
    name, overload = _split(qualified)
    namespace, op_name = name.split("::")
    return getattr(getattr(getattr(torch.ops, namespace), op_name), overload or "default")


def translation_table(mode: str = "portable") -> Dict[torch._ops.OpOverload, Callable]:
    """``{OpOverload: translation}`` for every openreg operator and the openreg-specific ATen
    op; pass it as ``torch.onnx.export(..., custom_translation_table=...)`` (installed, the
    plugin adds the portable table to every export by itself). ``mode="vendor"`` emits
    ``com.openreg`` nodes: attach their bodies after export (``openreg_onnx.export`` does, or
    ``openreg_onnx.attach_functions``)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if mode == "vendor":
        _vendor.register_schemas()
    _define_quantized_decomposed()
    index = MODES.index(mode)
    return {_overload(name): fns[index] for name, fns in _TRANSLATIONS.items()}


def translated_op_names():
    """The torch op names the table covers."""
    return list(_TRANSLATIONS)


def _schema_text(qualified: str) -> Optional[str]:
    schema = torch._C._get_schema(*_split(qualified))
    text = str(schema)
    return text[text.index("(") :]


def coverage_problems() -> list:
    """What keeps the table from covering openreg: operators in the ``openreg`` namespace
    without a translation, and translated ops whose live schema differs from ``SIGNATURES``
    (the schema the translation was written against). Empty when all is well."""
    _define_quantized_decomposed()
    problems = []
    live = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("openreg::"))
    for name in live:
        if name not in _TRANSLATIONS:
            problems.append(f"{name}: no translation in openreg_onnx._table (schema {_schema_text(name)})")
    for name, expected in SIGNATURES.items():
        try:
            actual = _schema_text(name)
        except RuntimeError:
            problems.append(f"{name}: translated, but no such operator is registered")
            continue
        if actual != expected:
            problems.append(f"{name}: schema drifted: the translation implements {expected}, the op is now {actual}")
    return problems
