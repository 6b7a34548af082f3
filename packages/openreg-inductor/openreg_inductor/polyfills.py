"""What Dynamo traces of ``torch.openreg``.

Dynamo knows the device modules of CUDA, XPU and MPS: ``torch.cuda.synchronize()`` or
``torch.cuda.current_stream()`` inside a compiled region become graph operations. It does not know
``torch.openreg``, and stops at the binding the module calls (a graph break, an error under
``fullgraph=True``). The device-generic ``torch.accelerator`` functions it does know, so the device
module's functions get their ``torch.accelerator`` equivalents as traceable stand-ins, through
``torch.compiler.substitute_in_graph`` (the public hook for functions Dynamo cannot trace). Outside
a compiled region the real functions run, unchanged.

The device context ``with torch.openreg.device(i):`` traces as ``torch.accelerator.device_index(i)``
does: its Dynamo variable is registered through ``register_device_context_manager``, Dynamo's
registry of device context managers (which holds ``torch.cuda.device`` and ``torch.xpu.device``).

What differs while tracing: ``current_stream()`` gives a ``torch.Stream`` (the base class of
``torch.openreg.Stream``, with the same id, device and methods), as ``torch.accelerator`` does.
"""

from __future__ import annotations

import torch

from . import DEVICE

_registered = False


def _device(device) -> torch.device:
    """``torch.openreg``'s device argument as an indexed openreg device (None or a negative index:
    the current one, as eager ``synchronize`` and ``current_stream`` take them; a negative index
    failed the compile). Core's ``_device_index`` does this through a binding Dynamo cannot trace."""
    if isinstance(device, int):
        return torch.device(DEVICE, device) if device >= 0 else _current_device()
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


def _device_context_index(device, optional: bool = True) -> int:
    """The index ``torch.openreg.device(device)`` switches to, or -1 to leave the device alone:
    None, a negative index (a CPU tensor's ``get_device()``) and a device without an index (which
    names the current device) switch nothing, in eager code too. Read once, at the trace; a bad
    index fails the trace with the eager error."""
    from torch_openreg.openreg._utils import _device_index

    if device is None or (isinstance(device, int) and device < 0):
        return -1
    if isinstance(device, (str, torch.device)):
        device = torch.device(device)
        if device.type == DEVICE and device.index is None:
            return -1
    return int(_device_index(device))  # the eager errors: another device type, a bad index


def _device_context_variable() -> type:
    """Dynamo's variable of ``torch.openreg.device``: ``torch.accelerator.device_index``'s (openreg
    is the accelerator, and workaround 18 applies), with core's exchange, which leaves the device
    alone for -1, and spelt as openreg's where Dynamo writes the context back at a graph break."""
    from torch._dynamo.variables.ctx_manager import AcceleratorDeviceIndexVariable
    from torch_openreg import _C

    class OpenRegDeviceVariable(AcceleratorDeviceIndexVariable):
        _exchange_fn = staticmethod(_C._exchange_device)
        _get_device_index_fn = staticmethod(_device_context_index)

        def module_name(self) -> str:
            return "torch.openreg"

        def fn_name(self) -> str:
            return "device"

        def python_type(self) -> type:
            return torch.openreg.device

    return OpenRegDeviceVariable


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

    from torch._dynamo.variables import register_device_context_manager

    register_device_context_manager(torch.openreg.device, _device_context_variable())
    _registered = True
