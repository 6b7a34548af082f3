"""DLPack export of openreg tensors: two fixes to ``torch.Tensor``'s Python protocol methods.

The C++ conversion is right already: ATen maps PrivateUse1 to ``kDLExtDev`` (12) with the device
index as ``device_id``, both ways, so ``torch.utils.dlpack.to_dlpack`` and ``torch.from_dlpack``
of a capsule work. The Python protocol methods are not:

1. ``Tensor.__dlpack_device__`` (torch 2.13, ``torch/_tensor.py``) compares the device type with
   the literal ``"privateuse1"``. A tensor's device type is the backend's name (``"openreg"``,
   or ``"privateuseone"`` before a rename), so it never matches and the method raises
   ``ValueError: Unknown device type openreg for Dlpack``; ``torch.from_dlpack(tensor)`` calls it
   first and fails the same way. Upstream fix: pytorch/pytorch#195815.
2. ``Tensor.__dlpack__`` synchronises streams only for CUDA. openreg kernels run asynchronously
   on streams, so a consumer could read the memory before the kernels that write it have run.

:func:`install` wraps both methods. Each wrapper changes the behaviour only for tensors whose
device type is the PrivateUse1 backend's name and delegates everything else to torch's method.
"""

import functools
from typing import Any, Callable, Tuple

import torch
from torch.overrides import handle_torch_function, has_torch_function_unary
from torch.utils.dlpack import DLDeviceType

_MARK = "_openreg_dlpack_wrapper"


def _backend_name() -> str:
    return torch._C._get_privateuse1_backend_name()


class _DevicePretender:
    """Just enough of a tensor for ``Tensor.__dlpack_device__``: a device and ``is_pinned``.

    Checking torch's method with a real openreg tensor would initialise the device runtime at
    import time (and make a later fork unusable), so the check feeds it this object instead.
    """

    def __init__(self, device: torch.device):
        self.device = device

    def is_pinned(self) -> bool:
        return False


def _handles_backend(dlpack_device: Callable[[Any], Tuple[int, int]]) -> bool:
    """Whether torch's ``__dlpack_device__`` already maps the renamed backend to (kDLExtDev, index).

    True on a torch that has the upstream fix; then :func:`install` leaves the method alone. Any
    failure (the ``ValueError`` of torch 2.13, or a future version needing more of a tensor than
    the pretender offers) counts as "not handled": the wrapper is correct either way.
    """
    try:
        return tuple(dlpack_device(_DevicePretender(torch.device(_backend_name(), 1)))) == (DLDeviceType.kDLExtDev, 1)
    except Exception:
        return False


def _wrap_dlpack_device(original: Callable) -> Callable:
    @functools.wraps(original)
    def __dlpack_device__(self: torch.Tensor) -> Tuple[DLDeviceType, int]:
        if has_torch_function_unary(self):
            return handle_torch_function(__dlpack_device__, (self,), self)
        device = self.device
        if device.type == _backend_name():
            return (DLDeviceType.kDLExtDev, device.index if device.index is not None else 0)
        return original(self)

    setattr(__dlpack_device__, _MARK, True)
    return __dlpack_device__


def _wrap_dlpack(original: Callable) -> Callable:
    @functools.wraps(original)
    def __dlpack__(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if has_torch_function_unary(self):
            return handle_torch_function(__dlpack__, (self,), self, *args, **kwargs)
        # torch's checks (requires_grad, conjugate bit, layout, ``stream`` must be int or None)
        # and the capsule; building the capsule does not touch the data.
        capsule = original(self, *args, **kwargs)
        if self.device.type == _backend_name():
            # Make the data ready before a consumer sees it. DLPack's ``stream`` names the
            # consumer's stream: None means "the legacy default stream", and for CUDA torch then
            # makes that stream wait for the current one. torch documents that on other devices
            # -1 (its default, and what torch.from_dlpack passes for kDLExtDev) is treated like
            # None. No DLPack consumer can name an openreg stream, and kDLExtDev gives stream
            # integers no meaning, so for every value we do what "the consumer uses the default
            # stream" needs without knowing the consumer's stream: wait on the host until the
            # current stream of the tensor's device (where torch queued the kernels that wrote
            # it, as the CUDA path assumes) has run everything queued so far.
            from .streams import current_stream

            current_stream(self.device.index).synchronize()
        return capsule

    setattr(__dlpack__, _MARK, True)
    return __dlpack__


def install() -> None:
    """Wrap ``torch.Tensor.__dlpack_device__`` and ``__dlpack__`` (idempotent).

    ``__dlpack_device__`` is wrapped only while torch's own method does not handle the backend
    (see :func:`_handles_backend`); ``__dlpack__`` always, since no torch version synchronises
    PrivateUse1 streams.
    """
    tensor = torch.Tensor
    if not getattr(tensor.__dlpack_device__, _MARK, False) and not _handles_backend(tensor.__dlpack_device__):
        tensor.__dlpack_device__ = _wrap_dlpack_device(tensor.__dlpack_device__)
    if not getattr(tensor.__dlpack__, _MARK, False):
        tensor.__dlpack__ = _wrap_dlpack(tensor.__dlpack__)
