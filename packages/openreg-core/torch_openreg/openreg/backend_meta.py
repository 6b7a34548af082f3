"""Backend metadata on openreg tensors (C++: ``csrc/tensor/OpenRegBackendMeta.h``).

A vendor keeps per-tensor data beyond sizes, strides and dtype in a
``c10::BackendMeta`` on the TensorImpl (Ascend keeps its storage format there).
openreg's has two example fields, ``format`` (0..15) and ``compressed``. It travels
with the tensor:

- shallow copies (``detach()``, ``.data``, ``Parameter(t)``) get their own copy;
- ``torch.save``/``torch.load`` keep it through PyTorch's PrivateUse1 serialization
  hooks (also with ``weights_only=True``); loading onto the CPU drops it;
- FakeTensors made from an openreg tensor carry it (torch 2.13 does not copy backend
  metadata into FakeTensors: :func:`_install_propagation` adds that),
  and so do functional tensors (``FunctionalTensorWrapper`` copies it in C++).

New tensors computed from one (``t + 1``, ``t.clone()``, ``t.to(...)``) start without it,
as on every PyTorch backend: metadata describes one tensor, not a value.
"""

from typing import NamedTuple, Optional

import torch

from .. import _C


class BackendMeta(NamedTuple):
    format: int
    compressed: bool


def set_backend_meta(tensor: torch.Tensor, format: int = 0, compressed: bool = False) -> None:
    """Attaches (replaces) openreg backend metadata on an openreg tensor."""
    _C._set_backend_meta(tensor, format, compressed)


def get_backend_meta(tensor: torch.Tensor) -> Optional[BackendMeta]:
    """The tensor's openreg backend metadata, or None."""
    found = _C._get_backend_meta(tensor)
    return None if found is None else BackendMeta(*found)


def clear_backend_meta(tensor: torch.Tensor) -> None:
    _C._clear_backend_meta(tensor)


def _copy_meta(src: torch.Tensor, dst: torch.Tensor) -> None:
    found = _C._get_backend_meta(src)
    if found is not None and _C._get_backend_meta(dst) is None:
        _C._set_backend_meta(dst, *found)


def _skipped_by_dynamo(fn) -> None:
    """Dynamo runs ``fn``'s frames as they are, as it does torch's own code. These wrappers stand in
    for torch functions that Dynamo never compiles (its skip rules cover files under ``torch/``),
    but they live in this package, so with a compiled region's frame callback active (compiled
    autograd fakifies the backward's inputs from such a frame) Dynamo tried to compile them and
    failed. ``set_code_exec_strategy`` is the C half of ``torch._dynamo.eval_frame.skip_code``:
    importing ``torch._dynamo`` here would add about a second to ``import torch``."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

    set_code_exec_strategy(fn.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))


def _install_propagation() -> None:
    """Makes FakeTensors and Python FunctionalTensors carry the metadata of what they wrap.

    torch 2.13 builds a FakeTensor from a fresh meta tensor and a FunctionalTensor as a
    new wrapper subclass; neither copies the real tensor's ``BackendMeta`` (only the C++
    ``FunctionalTensorWrapper`` inside a FunctionalTensor does). The two constructors are
    wrapped once, and only add metadata when the source is an openreg tensor that has some.
    """
    from torch._subclasses import fake_tensor, functional_tensor

    converter = fake_tensor.FakeTensorConverter
    if not getattr(converter.from_real_tensor, "_openreg_backend_meta", False):
        from_real_tensor = converter.from_real_tensor

        def from_real_tensor_with_meta(self, fake_mode, t, *args, **kwargs):
            out = from_real_tensor(self, fake_mode, t, *args, **kwargs)
            if isinstance(t, torch.Tensor) and t.device.type == "openreg":
                _copy_meta(t, out)
            return out

        from_real_tensor_with_meta._openreg_backend_meta = True
        _skipped_by_dynamo(from_real_tensor_with_meta)
        # What the wrappers call is a frame of its own: Dynamo compiled it, graph-broke on
        # _get_backend_meta with a warning, and recompiled it per shape up to its limit (hunt36b).
        _skipped_by_dynamo(_copy_meta)
        converter.from_real_tensor = from_real_tensor_with_meta

    functional = functional_tensor.FunctionalTensor
    if not getattr(functional.__new__, "_openreg_backend_meta", False):
        new = functional.__new__

        def new_with_meta(cls, elem, *args, **kwargs):
            out = new(cls, elem, *args, **kwargs)
            if elem.device.type == "openreg":
                _copy_meta(elem, out)
            return out

        new_with_meta._openreg_backend_meta = True
        _skipped_by_dynamo(new_with_meta)
        functional.__new__ = staticmethod(new_with_meta)
