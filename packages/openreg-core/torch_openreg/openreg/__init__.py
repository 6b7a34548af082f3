"""``torch.openreg``: the device module, shaped like ``torch.cuda``.

Devices, lazy initialisation and fork safety live here; streams and events in
``streams.py``, memory in ``memory.py``, random numbers in ``random.py``,
plugin discovery in ``_plugins.py``.
"""

import atexit
import os
import threading
import traceback
import warnings
from typing import Any, Dict, List

import torch

from .. import _C
from . import backend_meta as _backend_meta
from . import ipc as _ipc
from . import ops  # noqa: F401  (registers openreg::scaled_square)
from ._plugins import plugins
from ._utils import _device_index, _DeviceLike
from .backend_meta import BackendMeta, clear_backend_meta, get_backend_meta, set_backend_meta
from .ipc import IpcHandle, get_ipc_handle, open_ipc_handle
from .memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)
from .random import _get_generator as _get_generator  # AOTAutograd's graph-safe RNG looks it up
from .random import (
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import (
    Event,
    Stream,
    StreamContext,
    current_raw_stream,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

__all__ = [
    "BackendMeta",
    "Event",
    "IpcHandle",
    "Stream",
    "StreamContext",
    "current_device",
    "current_raw_stream",
    "current_stream",
    "default_stream",
    "clear_backend_meta",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_backend_meta",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_ipc_handle",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "open_ipc_handle",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "plugins",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_backend_meta",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]

_backend_meta._install_propagation()
_ipc._install_reducers()

_initialized = False
_in_bad_fork = False
_init_lock = threading.Lock()
_init_tls = threading.local()  # is_initializing: the queued calls run (they may use the module)
# Calls made before initialisation that need the device, run by _lazy_init (torch.cuda's
# _lazy_call): the seeding functions queue theirs, so that torch.manual_seed does not start openreg
# and a process may still fork after it. Of the seeds, only the last call for each device (manual_seed,
# seed: the device current at the call) and the last for all devices (manual_seed_all, seed_all)
# count, in the order they were made, after the other queued calls (as torch.cuda runs them).
_queued_calls: List[Any] = []  # (callable, the stack that queued it)
_queued_seeds: Dict[Any, Any] = {}  # "all" or a device index -> (callable, stack), in call order


def _lazy_call(callable: Any, seed: Any = None) -> None:
    """Runs ``callable`` now if openreg is initialised (or being initialised by this thread: a queued
    call may queue another), else at its initialisation. The lock is never held while a call runs or
    a stack is formatted (a call that seeds again would wait for itself; a fork meanwhile would give
    the child a held lock). ``seed`` names what a seeding call seeds ("all", or a device index): a
    later call for the same replaces it."""
    if is_initialized() or getattr(_init_tls, "is_initializing", False):
        callable()
        return
    entry = (callable, traceback.format_stack())
    with _init_lock:
        if not _initialized:
            if seed is not None:
                _queued_seeds.pop(seed, None)  # the latest for what it seeds, after the others
                _queued_seeds[seed] = entry
            else:
                _queued_calls.append(entry)
            return
    callable()  # initialised meanwhile


def _after_fork_in_child() -> None:
    global _initialized, _in_bad_fork, _init_lock
    _init_lock = threading.Lock()  # another thread of the parent may have held it at the fork
    if _initialized:
        _initialized = False
        _in_bad_fork = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _finish_queued_work_at_exit() -> None:
    # Kernels written in Python (custom ops) run on the streams' workers and need the
    # interpreter, which is about to shut down: wait for the queued work first.
    #
    # Before that, autograd's device threads. torch's engine runs an openreg backward pass on its
    # device thread for the device index, which lets go of a finished pass only after waking the
    # caller; in torch 2.13 letting go needs the GIL (the pass keeps Python objects: the
    # contextvars context torch.autograd stashes, result tensors). If the program ends first, the
    # thread asks for the GIL while the interpreter finalizes, Python ends it with a forced unwind
    # through a noexcept destructor, and the process aborts ("terminate called without an active
    # exception", pytorch#38228). A backward queued on each device thread behind that release
    # returns only once the thread holds nothing of the user's passes.
    if not is_initialized():
        return
    # A capture still open (an error between capture_begin() and capture_end() that nothing caught)
    # would refuse the synchronisation below, and Python kernels queued before it would run while
    # the interpreter finalizes (a fatal error): it is abandoned first, as reset() abandons one.
    abandoned = _C._abandon_open_captures()
    if abandoned:
        warnings.warn(
            f"openreg: {abandoned} graph capture(s) still open at exit were abandoned", RuntimeWarning, stacklevel=1
        )
    try:
        _C._settle_autograd_device_threads(device_count())
    except Exception as e:  # a broken device: the synchronize below reports its error
        warnings.warn(f"openreg: could not settle autograd's device threads at exit: {e}", RuntimeWarning, stacklevel=1)
    for index in range(device_count()):
        try:
            _C._synchronize(index)
        except Exception as e:  # nobody synchronised after it failed: say so, the program is ending
            warnings.warn(f"openreg:{index}: work queued before exit failed: {e}", RuntimeWarning, stacklevel=1)


atexit.register(_finish_queued_work_at_exit)


def is_available() -> bool:
    """True when at least one openreg device can be used."""
    return device_count() > 0


def device_count() -> int:
    """Number of openreg devices (``OPENREG_DEVICE_COUNT``, default 2)."""
    if _in_bad_fork:
        return 0
    return _C._device_count()


def is_initialized() -> bool:
    """Whether the openreg state of this process has been initialised."""
    return _initialized and not _in_bad_fork


def _lazy_init() -> None:
    global _initialized
    if _initialized or getattr(_init_tls, "is_initializing", False):
        return
    with _init_lock:
        if _initialized:
            return
        if _in_bad_fork:
            raise RuntimeError(
                "Cannot re-initialize openreg in forked subprocess. To use openreg with "
                "multiprocessing, you must use the 'spawn' start method"
            )
        if _C._device_count() <= 0:
            reason = _C._device_count_error() or "check OPENREG_DEVICE_COUNT"
            raise RuntimeError(f"No openreg device is available: {reason}")
        # A malformed OPENREG_SMALL_KERNEL_BYTES fails the initialisation, not only each use after
        # it: an initialised process that never ran a kernel warned about it again at exit.
        _C._small_kernel_bytes()
        # Each queued call runs once: one that fails is reported and dropped (kept, it would fail
        # every use of the process); the calls after it stay queued for the next use, seeds included.
        calls = [*((None, entry) for entry in _queued_calls), *_queued_seeds.items()]
        _queued_calls.clear()
        _queued_seeds.clear()
        _init_tls.is_initializing = True
        try:
            next_call = 0  # the first call not yet run (and not failed): kept queued if this stops
            try:
                for _, (call, stack) in calls:
                    try:
                        call()
                    except Exception as e:
                        next_call += 1  # reported once and dropped
                        raise RuntimeError(
                            f"openreg call failed lazily at initialization with error: {e}\n\n"
                            f"openreg call was originally invoked at:\n\n{''.join(stack)}"
                        ) from e
                    next_call += 1
            except BaseException:  # a failure, or an interrupt (KeyboardInterrupt) during or between calls
                for seed, entry in calls[next_call:]:
                    if seed is None:
                        _queued_calls.append(entry)
                    else:
                        _queued_seeds[seed] = entry
                raise
            _C._register_fork_handler()
            _initialized = True
        finally:
            del _init_tls.is_initializing


def init() -> None:
    """Initialise openreg state now instead of at first use."""
    _lazy_init()


def current_device() -> int:
    """Index of the current openreg device of this thread."""
    _lazy_init()
    return _C._get_device()


def set_device(device: _DeviceLike) -> None:
    """Set the current openreg device of this thread (a negative index does nothing, as in torch.cuda).
    A device without an index (``None``, ``"openreg"``) is refused, as torch.cuda refuses it: it
    names no device to set."""
    if isinstance(device, int) and device < 0:
        return
    index = _device_index(device, optional=False)
    _C._set_device(index)


# The guard openreg-inductor's wrappers enter (``with torch.openreg._DeviceGuard(0):``), as
# ``torch.cuda._DeviceGuard``: a C type taking an index (a negative one leaves the device alone), at
# a third of the cost of a Python class (packages/openreg-core/csrc/python/Module.cpp).
_DeviceGuard = _C._DeviceGuard


class device:
    """Context manager that changes the current openreg device."""

    __slots__ = ("idx", "prev_idx")

    def __init__(self, device: Any):
        # None or a negative index (a CPU tensor's get_device()) leaves the device alone, as in torch.cuda.
        self.idx = -1 if device is None or (isinstance(device, int) and device < 0) else _device_index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = _C._exchange_device(self.idx)

    def __exit__(self, *args: Any) -> None:
        if self.prev_idx >= 0:
            _C._set_device(self.prev_idx)


class device_of(device):
    """Context manager that makes the device of a tensor current."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "openreg" else None)


def synchronize(device: _DeviceLike = None) -> None:
    """Wait for all work queued on all streams of an openreg device."""
    # Without a usable device nothing was queued, and the current device is nothing to wait for:
    # torch's profiler calls this at the end of every profile (it lists openreg's activity whenever
    # the backend is registered), and a CPU-only profile failed with "No openreg device is available".
    if device is None and not _initialized and not is_available():
        return
    _C._synchronize(_device_index(device, negative_is_current=True))


class _DeviceProperties:
    def __init__(self, props: Dict[str, Any]):
        self.name: str = props["name"]
        self.total_memory: int = props["total_memory"]
        self.multi_processor_count: int = props["multi_processor_count"]
        self.major: int = props["major"]
        self.minor: int = props["minor"]

    def __repr__(self) -> str:
        return (
            f"_OpenRegDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


def get_device_properties(device: _DeviceLike = None) -> _DeviceProperties:
    """Properties of an openreg device (name, total memory, ...)."""
    return _DeviceProperties(_C._get_device_properties(_device_index(device)))


def get_device_name(device: _DeviceLike = None) -> str:
    """Name of an openreg device."""
    return get_device_properties(device).name


def get_device_capability(device: _DeviceLike = None) -> tuple:
    """(major, minor) capability of an openreg device."""
    p = get_device_properties(device)
    return (p.major, p.minor)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether bfloat16 works on openreg: always (the device runs the CPU's kernels)."""
    return True


_warned_autocast_without_amp = False


def get_amp_supported_dtype() -> List[torch.dtype]:
    """Data types autocast may use on openreg.

    ``torch.autocast("openreg")`` calls this when it is made: without autocast policies registered
    (the openreg-amp plugin), core's fallthrough lets every operator run in its input dtype, so say
    so once rather than let a user believe a float32 model runs in float16 (CUDA's autocast has its
    policies built in). Asked of the dispatcher, not of plugin discovery: ``import openreg_amp``
    registers them even when ``OPENREG_PLUGINS`` left the plugin out. torch calls this for
    ``enabled=False`` too, where the warning is moot.
    """
    global _warned_autocast_without_amp
    if not _warned_autocast_without_amp and not torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::mm", "AutocastPrivateUse1"
    ):
        _warned_autocast_without_amp = True
        amp = plugins().get("amp")
        if amp is None:  # not on the package index: from the repository or a `nox -s build` wheelhouse
            how = (
                "install it: pip install --no-build-isolation ./packages/openreg-amp, or "
                "pip install --find-links dist 'openreg-core[amp]'"
            )
        elif amp["error"]:
            how = f"it is installed but did not load: {amp['error']}"
        else:
            how = "it is installed but OPENREG_PLUGINS left it out: import openreg_amp"
        warnings.warn(
            "openreg: torch.autocast has no effect without the openreg-amp plugin: operators run in "
            f"their input dtype ({how}; see torch.openreg.plugins())",
            UserWarning,
            stacklevel=3,
        )
    return [torch.float16, torch.bfloat16]


def _is_in_bad_fork() -> bool:
    return _in_bad_fork


def _runtime_counters() -> Dict[str, int]:
    """Counters of the runtime: kernels launched and copies by direction (for tests and tools)."""
    return _C._runtime_counters()


def _inject_faults(spec: str) -> None:
    """Arms the runtime's fault injection with ``spec`` (the ``OPENREG_FAULTS`` syntax, see
    docs/mechanisms/reliability.md; ``""`` disarms). For tests; replaces what was armed."""
    _C._inject_faults(spec)


def fallback_op_counts() -> Dict[str, int]:
    """How many calls of each operator went through the generic (fallback) path."""
    return dict(_C._fallback_counts())


def reset_fallback_op_counts() -> None:
    """Reset the counts returned by :func:`fallback_op_counts`."""
    _C._reset_fallback_counts()


def set_strict_mode(strict: bool) -> None:
    """In strict mode an operator without a native openreg kernel raises instead of running generically."""
    _C._set_strict_mode(bool(strict))


def is_strict_mode() -> bool:
    """Whether strict mode is on."""
    return _C._get_strict_mode()


def __getattr__(name: str) -> Any:
    # Computed at use, as torch.cuda.default_generators is filled at CUDA's initialisation. Handed
    # out after it, so that the seeds queued before it (torch.manual_seed) have run: they ran later,
    # and replaced a state restored directly into a generator (g.set_state) with the seed's. Where
    # initialisation cannot happen (no usable device, a child forked after it) the tuple is given as
    # it was, without raising: hasattr(torch.openreg, "default_generators") must answer.
    if name == "default_generators":
        from .random import _default_generators

        if not _in_bad_fork and is_available():
            _lazy_init()
        return _default_generators()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
