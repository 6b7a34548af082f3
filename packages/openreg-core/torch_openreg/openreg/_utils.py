"""Small helpers shared by the ``torch.openreg`` submodules."""

from typing import Any, Optional, Union

import torch

_DeviceLike = Union[torch.device, str, int, None]


def _get_device_index(device: _DeviceLike = None, optional: bool = True) -> int:
    """The index of an openreg device given as a device, string, int or None (current)."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "openreg":
            raise ValueError(f"Expected an openreg device, but got: {device}")
        index: Optional[int] = device.index
    else:
        index = device
    if index is None:
        if not optional:
            raise ValueError(f"Expected an openreg device with a specified index, got: {device}")
        from . import current_device

        return current_device()
    if not isinstance(index, int):
        raise TypeError(f"Expected a device index as int, got {type(index).__name__}")
    from .. import _C
    from . import _lazy_init

    _lazy_init()
    if index < 0:
        raise ValueError(f"Invalid openreg device index {index}: indices start at 0")
    _C._check_device_index(index)
    return index


def _dummy_type(name: str) -> Any:
    return type(name, (object,), {})
