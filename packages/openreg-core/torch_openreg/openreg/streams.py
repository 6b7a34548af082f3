"""Streams and events of openreg, shaped like ``torch.cuda.Stream``/``Event``.

Both are thin subclasses of the generic ``torch.Stream``/``torch.Event``: the
work is done by the C++ device guard (``csrc/runtime/OpenRegGuard.cpp``).
"""

import operator
from typing import Any, Optional

import torch

from .. import _C
from ._utils import _device_index, _DeviceLike


class Stream(torch.Stream):
    """An openreg stream: work on it runs in order, asynchronously to the host.

    ``priority`` is 0 (low, default) or negative (high); values outside ``priority_range()`` are
    clamped to it, as on CUDA.
    """

    def __new__(cls, device: _DeviceLike = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if kwargs.get("stream_id") is not None:  # re-wrapping an existing stream
            return super().__new__(cls, **kwargs)
        index = _device_index(device, negative_is_current=True)  # -1: the current device, as torch.cuda.Stream
        # Clamped here: torch.Stream narrows the value to 32 bits first, so 2**31 wrapped around to
        # a high priority and -2**40 to a low one.
        least, greatest = _C._stream_priority_range()
        priority = max(min(operator.index(priority), least), greatest)
        return super().__new__(cls, device=torch.device("openreg", index), priority=priority)

    def wait_event(self, event: "Event") -> None:
        """Make future work on this stream wait for ``event``."""
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        """Make future work on this stream wait for the work queued on ``stream`` so far."""
        self.wait_event(stream.record_event())

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        """Record an event on this stream (a new one if none is given)."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    @property
    def openreg_stream(self) -> int:
        """The runtime handle (``orStream_t``) of this stream as an integer, as ``cuda_stream`` is for
        CUDA: what native code passes to ``orLaunchKernel``."""
        return _C._stream_handle(self.stream_id, self.device_index)

    @property
    def priority(self) -> int:
        """The stream's priority."""
        return _C._stream_priority(self.stream_id, self.device_index)

    @staticmethod
    def priority_range() -> tuple:
        """(least, greatest) priority, as ``torch.cuda.Stream.priority_range()``: (0, -1)."""
        return _C._stream_priority_range()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, torch.Stream) and super().__eq__(other)

    def __hash__(self) -> int:
        # torch.Stream's: equal to a torch.Stream of the same stream, so hashes must agree too.
        return super().__hash__()

    def __repr__(self) -> str:
        return f"<torch.openreg.Stream device=openreg:{self.device_index} stream_id={self.stream_id}>"


def _wrap(packed: tuple) -> Stream:
    stream_id, device_index, device_type = packed
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


class Event(torch.Event):
    """An openreg event: a point in a stream to wait for or to time."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> "Event":
        if interprocess:
            raise NotImplementedError("openreg events cannot be shared between processes")
        return super().__new__(cls, device=torch.device("openreg"), enable_timing=enable_timing, blocking=blocking)

    def record(self, stream: Optional[torch.Stream] = None) -> None:
        """Record the event on ``stream`` (the current stream by default)."""
        super().record(stream if stream is not None else current_stream())

    def wait(self, stream: Optional[torch.Stream] = None) -> None:
        """Make ``stream`` (the current stream by default) wait for this event."""
        super().wait(stream if stream is not None else current_stream())

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds between this event and ``end_event`` (both recorded with timing enabled)."""
        if not isinstance(end_event, torch.Event):
            raise TypeError(f"expected a torch.Event, got {type(end_event).__name__}")
        if end_event.device is not None and end_event.device.type != "openreg":
            raise ValueError(f"Expected an openreg event, got an event of device {end_event.device}")
        return _C._event_elapsed_time(self.event_id, end_event.event_id)

    def __repr__(self) -> str:
        return f"<torch.openreg.Event {id(self):#x}>"


def current_stream(device: _DeviceLike = None) -> Stream:
    """The current stream of an openreg device, for this thread."""
    return _wrap(_C._get_current_stream(_device_index(device, negative_is_current=True)))


def current_raw_stream(device: _DeviceLike = None) -> int:
    """The runtime handle of the current stream of an openreg device, for this thread, as an integer
    (``current_stream(device).openreg_stream`` without building a Stream): compiled code asks it
    once per call. C code gets the same from ``openregCurrentStream`` (``runtime/OpenRegCApi.h``)."""
    return _C._current_raw_stream(_device_index(device, negative_is_current=True))


def default_stream(device: _DeviceLike = None) -> Stream:
    """The default stream of an openreg device."""
    return _wrap(_C._get_default_stream(_device_index(device, negative_is_current=True)))


def _check_openreg_stream(stream: torch.Stream) -> None:
    if str(stream.device.type) != "openreg":
        raise ValueError(f"Expected an openreg stream, got a stream of device {stream.device}")


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` the current stream of its device, and its device the current device (as
    ``torch.cuda.set_stream`` does), for this thread."""
    if stream is None:
        return
    _check_openreg_stream(stream)
    _C._set_current_stream(stream.stream_id, stream.device_index, stream.device_type)


class StreamContext:
    """Context manager that makes a stream current (and its device, while inside)."""

    def __init__(self, stream: Optional[torch.Stream]):
        self.stream = stream
        self.src_prev_stream: Optional[Stream] = None
        self.dst_prev_stream: Optional[Stream] = None
        self.prev_device = -1

    def __enter__(self) -> None:
        if self.stream is None:
            return
        _check_openreg_stream(self.stream)
        prev_device = _C._get_device()
        self.src_prev_stream = current_stream(prev_device)
        self.dst_prev_stream = current_stream(self.stream.device_index)
        set_stream(self.stream)  # a stream it refuses leaves the device and streams as they were
        self.prev_device = prev_device

    def __exit__(self, *args: Any) -> None:
        if self.stream is None:
            return
        set_stream(self.dst_prev_stream)
        set_stream(self.src_prev_stream)
        _C._set_device(self.prev_device)


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    """Context manager that makes ``stream`` current."""
    return StreamContext(stream)
