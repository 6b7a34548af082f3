"""torch.onnx helpers that assume host tensors, made to keep the device of an openreg model.

- ``torch.onnx.ops.symbolic`` / ``symbolic_multi_out`` (the ``onnx_symbolic::_symbolic*``
  custom ops) return ``torch.zeros(shape)``, on the CPU, both eagerly and as fake tensors: an
  openreg model that uses them fails eagerly and in ``torch.export`` with a device mismatch. An
  openreg kernel and a fake implementation that put the zeros on the device of the first tensor
  input fix both (CPU inputs, or none, keep the CPU, as torch does).
- ``InputObserver.check_discrepancies`` subtracts its captured outputs (on the model's device)
  from onnxruntime's (host) ones: ``check_discrepancies`` below copies the captured outputs to
  the host first.

Registered with the TorchScript symbolics when ``torch.onnx`` is imported (``_hooks.py``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

_OPS = ("onnx_symbolic::_symbolic", "onnx_symbolic::_symbolic_multi_out")


def _device(inputs: Sequence[Optional[torch.Tensor]]) -> torch.device:
    for t in inputs:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _dtype(onnx_dtype: int) -> torch.dtype:
    from torch.onnx.ops import _dtype_mappings

    torch._check(
        onnx_dtype in _dtype_mappings.ONNX_DTYPE_TO_TORCH_DTYPE,
        lambda: (
            f"{onnx_dtype} is invalid as an ONNX data type. "
            f"Valid values are {list(_dtype_mappings.ONNX_DTYPE_TO_TORCH_DTYPE)}"
        ),
    )
    return _dtype_mappings.ONNX_DTYPE_TO_TORCH_DTYPE[onnx_dtype]


def _symbolic(inputs, op_type, onnx_dtype, *, shape, **_):
    return torch.zeros(shape, dtype=_dtype(onnx_dtype), device=_device(inputs))


def _symbolic_multi_out(inputs, op_type, onnx_dtypes, *, shapes, **_):
    torch._check(
        len(shapes) == len(onnx_dtypes),
        lambda: f"Number of shapes ({len(shapes)}) must match number of ONNX dtypes ({len(onnx_dtypes)})",
    )
    device = _device(inputs)
    return [torch.zeros(s, dtype=_dtype(d), device=device) for s, d in zip(shapes, onnx_dtypes)]


def register() -> None:
    """Device-keeping kernels (openreg) and fake implementations (all devices) for torch's
    ``onnx_symbolic`` ops."""
    import torch.onnx.ops  # noqa: F401  (defines the onnx_symbolic ops)

    for name, fn in zip(_OPS, (_symbolic, _symbolic_multi_out)):
        torch.library.register_kernel(name, "openreg", fn)
        torch.library.register_fake(name, fn, allow_override=True)


def check_discrepancies(observer, onnx_program, **kwargs):
    """``InputObserver.check_discrepancies`` for a model on openreg: the captured outputs are
    copied to the host (in the observer, in place) before torch's comparison runs."""
    info = observer.info
    if info is not None:
        info.flat_outputs = [
            [t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in outputs] for outputs in info.flat_outputs
        ]
    return observer.check_discrepancies(onnx_program, **kwargs)
