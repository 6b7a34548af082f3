"""openreg configs for torchao's ``quantize_``, registered through torchao's public extension point
(``register_quantize_module_handler``).

torchao's stock ``Int8DynamicActivationInt8WeightConfig`` cannot run on openreg without host copies:
its int8 matmul (``torchao.kernel.intmm.safe_int_mm``) formats the input with ``__repr__()`` to
detect FakeTensors, which copies the tensor's data to the host on any device, and copies both
operands to the host when a width is not a multiple of 8. ``OpenRegInt8DynamicActivationInt8WeightConfig``
uses the same scheme (int8 per-token symmetric activations chosen at run time, int8 per-channel
symmetric weights) with openreg's native kernels only: ``quantize_per_token``, ``aten::_int_mm`` and
elementwise ops; nothing waits for or copies from the device. It follows ``quantized_decomposed``'s
rounding conventions ([-127, 127], amax / 127), not torchao's ``Int8Tensor``'s ([-128, 127],
amax / 127.5): as accurate, not the same bits.
(torchao's ``Int8WeightOnlyConfig`` already runs on openreg without host copies.)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # torchao's CUDA-only libraries

import torch  # noqa: E402
from torchao.core.config import AOBaseConfig  # noqa: E402
from torchao.quantization.transform_module import register_quantize_module_handler  # noqa: E402

__all__ = ["OpenRegInt8DynamicActivationInt8WeightConfig", "Int8DynamicActivationLinear"]

qd = torch.ops.quantized_decomposed


@dataclass
class OpenRegInt8DynamicActivationInt8WeightConfig(AOBaseConfig):
    """int8 dynamic activations (per token, symmetric) x int8 weights (per output channel, symmetric)."""


class Int8DynamicActivationLinear(torch.nn.Module):
    """What the config puts in place of an ``nn.Linear``: the int8 weight (transposed, [in, out], as
    ``_int_mm`` takes it), its per-channel scales, the float bias."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        scales = w.abs().amax(dim=1).clamp(min=1e-5) / 127
        zeros = torch.zeros_like(scales, dtype=torch.long)
        w_int8 = qd.quantize_per_channel(w, scales, zeros, 0, -127, 127, torch.int8)
        self.register_buffer("weight_int8_t", w_int8.t().contiguous())
        self.register_buffer("weight_scales", scales)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Checked before the reshape, which would otherwise fail first with a message about sizes (a
        # plain raise: Dynamo cannot trace a torch._check message that reads x).
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            m, k = math.prod(x.shape[:-1]), x.shape[-1] if x.dim() else 0
            raise RuntimeError(
                f"mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {self.in_features}x{self.out_features})"
            )
        rows = x.reshape(-1, self.in_features)
        # quantized_decomposed.choose_qparams_per_token's numbers, bit for bit, as elementwise ops: the
        # op's meta kernel (upstream) says float64 scales where the kernels return the input's float
        # type, so Inductor read the float32 scales as float64 (garbage) and exported programs failed
        # their dtype check.
        scales = rows.abs().amax(-1, keepdim=True)
        if scales.dtype == torch.float16:
            scales = scales.float()
        scales = scales.clamp(min=1e-5) / 127
        zeros = torch.zeros_like(scales)
        x_int8 = qd.quantize_per_token(rows, scales, zeros, -127, 127, torch.int8)
        acc = torch._int_mm(x_int8, self.weight_int8_t)
        y = acc.float() * scales.float() * self.weight_scales
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 x int8 -> _int_mm"


@register_quantize_module_handler(OpenRegInt8DynamicActivationInt8WeightConfig)
def _transform(module: torch.nn.Module, config: OpenRegInt8DynamicActivationInt8WeightConfig) -> torch.nn.Module:
    return Int8DynamicActivationLinear(module) if isinstance(module, torch.nn.Linear) else module
