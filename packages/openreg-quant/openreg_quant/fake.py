"""Fake kernels of the fused ops and the fake class of their packed weight.

``torch.export`` and ``torch.compile`` trace a lowered model with fake tensors, and a
``torch.classes.openreg_quant.PackedWeight`` (a torchbind object) with a fake of it: a
``FakePackedWeight`` made from the object's ``__obj_flatten__`` fields, its tensors fake. The fake
kernels of ``qlinear`` and ``qconv2d`` below read the weight's shapes and packing parameters from it
and give the output's shape, dtype and layout. They serve the meta device as well (they take the
place of a ``Meta`` kernel), where a packed weight of meta tensors is a real object: ``_fields``
reads the same fields from either.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch
from torch._library.fake_class_registry import FakeScriptObject

__all__ = ["FakePackedWeight"]


@torch._library.register_fake_class("openreg_quant::PackedWeight")
class FakePackedWeight:
    """The fields of a PackedWeight (csrc/fused/QLinearConv.cpp), with fake tensors."""

    def __init__(self, kind, weight, w_scales, w_zero_points, x_scale, x_zero_point, stride, padding, dilation, groups):
        self.kind_ = kind
        self.weight, self.w_scales, self.w_zero_points = weight, w_scales, w_zero_points
        self.x_scale, self.x_zero_point = x_scale, x_zero_point
        self.stride, self.padding, self.dilation, self.groups = list(stride), list(padding), list(dilation), groups

    @classmethod
    def __obj_unflatten__(cls, flat):
        return cls(**dict(flat))

    def kind(self) -> str:
        return self.kind_

    def unpack(self):
        return self.weight.clone(), self.w_scales.clone(), self.w_zero_points.clone()


def _fields(packed: Any) -> FakePackedWeight:
    if isinstance(packed, FakeScriptObject):
        return packed.wrapped_obj
    return FakePackedWeight.__obj_unflatten__(packed.__obj_flatten__())  # a real one (meta device)


def _check(
    x: torch.Tensor,
    x_zero_point,
    w: FakePackedWeight,
    kind: str,
    bias: Optional[torch.Tensor],
    output_scale,
    output_zero_point,
    output_dtype,
    post_op: str,
) -> None:
    """csrc/fused/QLinearConv.cpp::check_call's host checks, in its order, same messages (the real
    op's checks are C++ only: tests/test_fused.py::TestFakeKernels runs each case on both)."""
    name = f"openreg_quant::{kind}"
    for value, what in ((x_zero_point, "x_zero_point"), (output_zero_point, "output_zero_point")):
        if not -(2**31) <= value < 2**31:
            raise RuntimeError(f"{name}: {what} must fit in 32 bits, got {value}.")
    if w.kind_ != kind:
        raise RuntimeError(
            f"{name}: weight was packed by openreg_quant::{w.kind_}_prepack; pack it with "
            f"openreg_quant::{kind}_prepack."
        )
    if x.dtype not in (torch.uint8, torch.int8):
        raise RuntimeError(f"{name}: x must be uint8 or int8 (quantized activations), got {x.dtype}.")
    where = w.weight.device
    if where.type not in ("openreg", "meta"):  # meta: a packed weight of meta tensors stands for one
        raise RuntimeError(f"{name}: the packed weight is on {where}; pack (or load) it on openreg.")
    if x.device != where:
        raise RuntimeError(
            f"{name}: the input must be on {where}, where the packed weight is, got a tensor on {x.device}."
        )
    if bias is not None:
        if bias.device != x.device:
            raise RuntimeError(
                f"{name}: bias must be on {x.device} (the input's device), got a tensor on {bias.device}."
            )
        out_channels = w.weight.shape[0]
        if not (bias.dtype == torch.float32 and bias.dim() == 1 and bias.numel() == out_channels):
            raise RuntimeError(f"{name}: bias must be float32 with one value per output channel ({out_channels}).")
    if output_dtype not in (None, torch.float32, torch.bfloat16):
        raise RuntimeError(
            f"{name}: output_dtype must be None (quantized output), torch.float32 or torch.bfloat16, "
            f"got {output_dtype}."
        )
    if output_dtype is not None and (output_scale != 1.0 or output_zero_point != 0):
        raise RuntimeError(
            f"{name}: a float output (output_dtype {output_dtype}) takes output_scale 1.0 and output_zero_point 0, "
            f"got {output_scale} and {output_zero_point}."
        )
    if post_op not in ("none", "relu"):
        raise RuntimeError(f"{name}: post_op must be 'none' or 'relu', got '{post_op}'.")


def _check_range(x: torch.Tensor, kind: str, output_dtype, qmin: Optional[int], qmax: Optional[int]) -> None:
    """csrc/fused/QLinearConv.cpp::out_range's checks, same messages."""
    if qmin is None and qmax is None:
        return
    name = f"openreg_quant::{kind}"
    if output_dtype is not None:
        raise RuntimeError(
            f"{name}: output_quant_min/output_quant_max apply to a quantized output only (output_dtype None), "
            f"got output_dtype {output_dtype}."
        )
    lo, hi = torch.iinfo(x.dtype).min, torch.iinfo(x.dtype).max
    a, b = lo if qmin is None else qmin, hi if qmax is None else qmax
    if not lo <= a <= b <= hi:
        raise RuntimeError(
            f"{name}: the output range [{a}, {b}] must lie inside {x.dtype}'s [{lo}, {hi}] with min <= max."
        )


def _linear_output(x, x_scale, x_zero_point, w: FakePackedWeight, output_dtype):
    out_features, in_features = w.weight.shape
    torch._check(
        x.dim() >= 1 and x.shape[-1] == in_features,
        lambda: (
            f"openreg_quant::qlinear: x's last dimension ({x.shape[-1] if x.dim() else 0}) must equal "
            f"in_features ({in_features})."
        ),
    )
    return x.new_empty((*x.shape[:-1], out_features), dtype=output_dtype or x.dtype)


def _conv2d_output(x, x_scale, x_zero_point, w: FakePackedWeight, output_dtype):
    name = "openreg_quant::qconv2d"
    # In the device kernel's order (QLinearConv.cpp::qconv2d): the activations' parameters, then
    # the shape (conv_shape); a call wrong in both failed with another message under export.
    torch._check(
        x_scale == w.x_scale and x_zero_point == w.x_zero_point,
        lambda: (
            f"{name}: the weight was packed for activations of scale {w.x_scale} and zero point "
            f"{w.x_zero_point}, got {x_scale} and {x_zero_point}."
        ),
    )
    torch._check(x.dim() == 4, lambda: f"{name}: x must be 4-D (NCHW), got {x.dim()}-D.")
    out_channels, in_per_group, kh, kw = w.weight.shape
    torch._check(
        x.shape[1] == in_per_group * w.groups,
        lambda: (
            f"{name}: x has {x.shape[1]} channels; weight {list(w.weight.shape)} with groups={w.groups} "
            f"expects {in_per_group * w.groups}."
        ),
    )
    shape: List[Any] = [x.shape[0], out_channels]
    for d, k in enumerate((kh, kw)):
        span = w.dilation[d] * (k - 1) + 1
        size = (x.shape[2 + d] + 2 * w.padding[d] - span) // w.stride[d] + 1
        torch._check(size > 0, lambda: f"{name}: the kernel ({span} with dilation) is larger than the padded input.")
        shape.append(size)
    # oneDNN computes channels-last; so is the output, as x86's quantized conv gives it.
    return x.new_empty(shape, dtype=output_dtype or x.dtype).contiguous(memory_format=torch.channels_last)


def _fake_kernel(kind: str, output: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The fake kernel of ``openreg_quant::<kind>`` (both ops have the same arguments)."""

    def fake(
        x,
        x_scale,
        x_zero_point,
        weight,
        bias,
        output_scale,
        output_zero_point,
        output_dtype: Optional[torch.dtype],
        post_op,
        output_quant_min: Optional[int] = None,
        output_quant_max: Optional[int] = None,
    ):
        w = _fields(weight)
        _check(x, x_zero_point, w, kind, bias, output_scale, output_zero_point, output_dtype, post_op)
        _check_range(x, kind, output_dtype, output_quant_min, output_quant_max)
        return output(x, x_scale, x_zero_point, w, output_dtype)

    return fake


torch.library.register_fake("openreg_quant::qlinear", _fake_kernel("qlinear", _linear_output))
torch.library.register_fake("openreg_quant::qconv2d", _fake_kernel("qconv2d", _conv2d_output))
