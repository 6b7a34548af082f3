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
    return device if device.index is not None else _current_device()


def _current_device() -> torch.device:
    """The device current in eager code at this point of the region: the device of the innermost
    context's stream (a stream context makes its stream's device current; inside a device context
    it is that device's current stream, ``_torch213`` workaround 18), else the current device, read
    at the trace. Reading the current device index guards on it: a ``set_device`` between calls
    recompiles. A stream's device is a constant of the trace (workaround 19)."""
    torch.accelerator.current_device_index()
    return torch.accelerator.current_stream().device


def register() -> None:
    """Installs the stand-ins (idempotent)."""
    global _registered
    if _registered:
        return
    from torch.compiler import substitute_in_graph

    @substitute_in_graph(torch.openreg.synchronize)
    def synchronize(device=None):
        torch.accelerator.synchronize(_device(device))

    @substitute_in_graph(torch.openreg.current_stream)
    def current_stream(device=None):
        if device is None:
            # The stream of the innermost context, as eagerly (see _current_device).
            torch.accelerator.current_device_index()
            return torch.accelerator.current_stream()
        return torch.accelerator.current_stream(_device(device))

    @substitute_in_graph(torch.openreg.current_device)
    def current_device():
        return _current_device().index

    _registered = True
