"""Small helpers shared by the ``torch.openreg`` submodules."""

import sys
from typing import Any, Optional, Union

import torch

from .. import _C

_DeviceLike = Union[torch.device, str, int, None]


def _parsed_index(device: _DeviceLike, allow_cpu: bool = False) -> Optional[int]:
    """The index a device, string or int names, None for a device without one (or None), -1 for the
    CPU with ``allow_cpu``; not checked against the device count."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if allow_cpu and device.type == "cpu":
            return -1
        if device.type != "openreg":
            raise ValueError(f"Expected an openreg device, but got: {device}")
        return device.index
    if device is not None and not isinstance(device, int):
        raise TypeError(f"Expected a device index as int, got {type(device).__name__}")
    return device


def _current_unless_required(device: _DeviceLike, optional: bool) -> int:
    """The current device, for a device given without an index where ``optional`` allows it."""
    if not optional:
        raise ValueError(f"Expected an openreg device with a specified index, got: {device}")
    return _package().current_device()


def _device_index(device: _DeviceLike = None, optional: bool = True, negative_is_current: bool = False) -> int:
    """The index of an openreg device given as a device, string, int or None (current), checked
    against the device count. With ``negative_is_current``, a negative int means the current device,
    as the stream and synchronisation functions of torch.cuda take it (a CPU tensor's
    ``get_device()`` is -1, and code passes it on)."""
    if type(device) is int and device >= 0:
        # The common case, and the one on compiled code's per-call path (its device guard and stream
        # query): a plain index needs no conversion, only the checks below (~0.2 us, was ~1 us).
        index = device
    else:
        index = _parsed_index(device)
        if index is None:
            return _current_unless_required(device, optional)
        if index < 0:
            if negative_is_current:
                return _package().current_device()
            _package()._lazy_init()
            raise ValueError(f"Invalid openreg device index {index}: indices start at 0")
    package = _package()
    if not package._initialized:
        package._lazy_init()
    _C._check_device_index(index)
    return index


def _get_device_index(device: _DeviceLike, optional: bool = False, allow_cpu: bool = False) -> int:
    """torch.cuda._utils._get_device_index's contract, which torch.serialization relies on: parses a
    device, string, int or None (current, with ``optional``) without checking the index against the
    device count, so that torch.load of a tensor saved on a device this process lacks reaches
    torch's own error, which names map_location. openreg's functions use _device_index."""
    index = _parsed_index(device, allow_cpu)
    return _current_unless_required(device, optional) if index is None else index


def _package() -> Any:
    """torch_openreg.openreg, which imports this module first (so it cannot be imported at the top)."""
    global _PACKAGE
    if _PACKAGE is None:
        _PACKAGE = sys.modules[__package__]
    return _PACKAGE


_PACKAGE: Any = None


def _dummy_type(name: str) -> Any:
    return type(name, (object,), {})
