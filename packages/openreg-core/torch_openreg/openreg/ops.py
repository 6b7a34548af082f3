"""Registration form: a custom operator defined in Python with ``torch.library``.

``openreg::scaled_square(x, scale) = scale * x * x`` is defined with
``torch.library.custom_op``; ``register_fake`` gives its shape function (used by
FakeTensor and torch.compile), ``register_autograd`` its backward. Its device
implementation is ordinary torch code, so on openreg it runs through the
generic operator path. The C++ custom operators live in
``csrc/aten/OpenRegCustomOps.cpp``.
"""

import torch


@torch.library.custom_op("openreg::scaled_square", mutates_args=())
def scaled_square(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * x * x``, computed on the tensor's own device."""
    return x * x * scale


@scaled_square.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    # The real op promotes as x * x * scale does: an integer x gives a float result.
    return torch.empty_like(x, dtype=torch.result_type(x, scale))


def _setup_context(ctx, inputs, output) -> None:
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _backward(ctx, grad: torch.Tensor):
    (x,) = ctx.saved_tensors
    return grad * 2 * ctx.scale * x, None


scaled_square.register_autograd(_backward, setup_context=_setup_context)
