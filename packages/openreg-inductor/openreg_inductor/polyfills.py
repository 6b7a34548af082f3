"""What Dynamo traces of ``torch.openreg``.

Dynamo knows the device modules of CUDA, XPU and MPS: ``torch.cuda.synchronize()`` or
``torch.cuda.current_stream()`` inside a compiled region become graph operations. It does not know
``torch.openreg``, and stops at the binding the module calls (a graph break, an error under
``fullgraph=True``). The device-generic ``torch.accelerator`` functions it does know, so the device
module's functions get their ``torch.accelerator`` equivalents as traceable stand-ins, through
``torch.compiler.substitute_in_graph`` (the public hook for functions Dynamo cannot trace). Outside
a compiled region the real functions run, unchanged.

What differs while tracing: ``current_stream()`` gives a ``torch.Stream`` (the base class of
``torch.openreg.Stream``, with the same id, device and methods), as ``torch.accelerator`` does.
"""

from __future__ import annotations

import torch

from . import DEVICE

_registered = False


def _device(device) -> torch.device:
    """``torch.openreg``'s device argument as an indexed openreg device (None: the current one).
    Core's ``_get_device_index`` does this through a binding Dynamo cannot trace."""
    if isinstance(device, int):
        return torch.device(DEVICE, device)
    device = torch.device(DEVICE if device is None else device)
    if device.type != DEVICE:
        raise ValueError(f"Expected an openreg device, got {device}")
    return device if device.index is not None else torch.device(DEVICE, torch.accelerator.current_device_index())


def register() -> None:
    """Installs the stand-ins (idempotent)."""
    global _registered
    if _registered:
        return
    from torch.compiler import substitute_in_graph

    @substitute_in_graph(torch.openreg.synchronize)
    def synchronize(device=None):
        # Without a device: the current device, as read at the trace (and guarded). Inside a stream
        # context of another device this is not the context's device (see compiler.md).
        torch.accelerator.synchronize(_device(device))

    @substitute_in_graph(torch.openreg.current_stream)
    def current_stream(device=None):
        if device is None:
            # The stream of the innermost stream context, as eagerly (a context makes its stream's
            # device current). Reading the current device first guards on it: a set_device between
            # calls recompiles, as with a device given.
            torch.accelerator.current_device_index()
            return torch.accelerator.current_stream()
        return torch.accelerator.current_stream(_device(device))

    @substitute_in_graph(torch.openreg.current_device)
    def current_device():
        return torch.accelerator.current_device_index()

    _registered = True
