"""Memory statistics and cache control, shaped like ``torch.cuda.memory``.

The numbers come from the caching allocator (``csrc/runtime/OpenRegCachingAllocator.cpp``).
"""

from typing import Any, Dict, List, Tuple

from .. import _C
from ._utils import _device_index, _DeviceLike, _package


def memory_stats(device: _DeviceLike = None) -> Dict[str, Any]:
    """All caching-allocator statistics of a device, keyed like ``torch.cuda.memory_stats``. Before
    openreg is initialised nothing was allocated, and the answer is ``{}`` (the functions below
    answer 0), as torch.cuda's: asking does not initialise, so a process may still fork."""
    if not _package()._initialized:
        return {}
    return dict(sorted(_C._memory_stats(_device_index(device)).items()))


def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes currently occupied by tensors on a device."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: _DeviceLike = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last reset."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: _DeviceLike = None) -> int:
    """Bytes held by the caching allocator on a device (in use or cached)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: _DeviceLike = None) -> int:
    """Peak of :func:`memory_reserved` since start or the last reset."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    """Reset the peaks of the memory statistics of a device."""
    _C._reset_peak_memory_stats(_device_index(device))


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    """Reset the accumulated (allocated/freed totals) memory statistics of a device."""
    _C._reset_accumulated_memory_stats(_device_index(device))


def empty_cache() -> None:
    """Give all cached, unused device and pinned-host memory back to the runtime (with the storages
    sent to other processes that their receivers released)."""
    _C._empty_cache()


def memory_snapshot() -> List[Dict[str, Any]]:
    """The allocator's segments and their blocks, for every device."""
    return _C._memory_snapshot()


def mem_get_info(device: _DeviceLike = None) -> Tuple[int, int]:
    """(free, total) bytes of a device as the runtime sees them."""
    return tuple(_C._mem_get_info(_device_index(device)))
