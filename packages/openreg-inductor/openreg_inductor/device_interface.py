"""Dynamo's view of the openreg device (``register_interface_for_device("openreg", ...)``).

Dynamo and Inductor reach a device's runtime only through this class: device and stream
queries while tracing, ``get_raw_stream`` in generated wrappers, device properties for
heuristics (``multi_processor_count`` is required), events for benchmarking. Everything
delegates to ``torch.openreg``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface


def _index(device: torch.types.Device) -> int:
    if device is None:
        return torch.openreg.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return torch.openreg.current_device() if device.index is None else device.index


class OpenRegInterface(DeviceInterface):
    device = torch.openreg.device
    # Dynamo requires torch.Stream/torch.Event subclasses (it traces them); openreg's are.
    Event = torch.openreg.Event
    Stream = torch.openreg.Stream

    class Worker:
        """Queries that compile workers may make; openreg has no fork restriction on them."""

        @staticmethod
        def set_device(device: int) -> None:
            torch.openreg.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.openreg.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> Any:
            return torch.openreg.get_device_properties(_index(device))

    @staticmethod
    def current_device() -> int:
        return torch.openreg.current_device()

    @staticmethod
    def set_device(device: torch.types.Device) -> None:
        torch.openreg.set_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return torch.openreg._C._exchange_device(device)

    @staticmethod
    def exchange_device(device: int) -> int:
        return torch.openreg._C._exchange_device(device)

    @staticmethod
    def device_count() -> int:
        return torch.openreg.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.openreg.is_available()

    @staticmethod
    def stream(stream: torch.Stream) -> Any:
        return torch.openreg.stream(stream)

    @staticmethod
    def current_stream() -> torch.Stream:
        return torch.openreg.current_stream()

    @staticmethod
    def set_stream(stream: torch.Stream) -> None:
        torch.openreg.set_stream(stream)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.openreg.set_stream(torch.openreg.Stream(stream_id=stream_id, device_index=device_index))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return torch.openreg.current_raw_stream(device_idx)

    @staticmethod
    def synchronize(device: torch.types.Device = None) -> None:
        torch.openreg.synchronize(device)

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> Any:
        major, minor = torch.openreg.get_device_capability(_index(device))
        return major * 10 + minor

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def memory_allocated(device: torch.types.Device = None) -> int:
        return torch.openreg.memory_allocated(device)

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False  # openreg's kernels are C++; Inductor must never pick Triton for it
