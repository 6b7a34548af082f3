"""Random number generators, one per openreg device, shaped like ``torch.cuda.random``.

Each generator's state is host-side (see ``csrc/runtime/OpenRegGenerator.h``).
"""

import threading
from typing import Any, Iterable, List, Optional

import torch

from .. import _C
from ..utils.fork import renewed_at_fork
from ._utils import _device_index, _DeviceLike, _package


def _generator(device: _DeviceLike = None) -> torch.Generator:
    return _default_generators()[_device_index(device)]


def _get_generator(device: torch.device) -> torch.Generator:
    """A device's default generator, as ``torch.cuda._get_generator``: AOTAutograd's graph-safe RNG
    functionalisation looks it up by this name (see ``_register_graphsafe_rng``)."""
    return _generator(device)


def _register_graphsafe_rng() -> None:
    """Let AOTAutograd functionalise random ops on openreg the graph-safe way.

    A random op recomputed in backward (activation checkpointing under ``torch.compile``) must draw
    the numbers its forward drew. torch 2.13 does this by swapping generator states
    (``graphsafe_run_with_rng_state``) on the device types registered here; on others it calls
    ``run_and_save_rng_state``, which knows only cpu/cuda/hpu/xpu and raises "Backend not supported
    for openreg". The generators implement ``graphsafe_get_state``/``graphsafe_set_state``/
    ``clone_state`` (``csrc/runtime/OpenRegGenerator.h``).
    """
    from torch._functorch._aot_autograd.utils import register_graphsafe_rng_device_type

    register_graphsafe_rng_device_type("openreg")


def _count() -> int:
    return _C._device_count()


_DEFAULT_GENERATORS: Optional[tuple] = None


@renewed_at_fork
def _new_default_generators_lock() -> None:
    global _DEFAULT_GENERATORS_LOCK
    _DEFAULT_GENERATORS_LOCK = threading.Lock()


def _default_generators() -> tuple:
    """Every device's default generator, as ``torch.cuda.default_generators``: built once, so that
    each device has one Python object (``is`` and identity-keyed caches work, as on CUDA)."""
    global _DEFAULT_GENERATORS
    if _DEFAULT_GENERATORS is None:
        with _DEFAULT_GENERATORS_LOCK:
            if _DEFAULT_GENERATORS is None:
                _DEFAULT_GENERATORS = tuple(_C._get_default_generator(i) for i in range(_count()))
    return _DEFAULT_GENERATORS


def get_rng_state(device: _DeviceLike = "openreg") -> torch.Tensor:
    """The state of a device's generator as a ByteTensor."""
    return _generator(device).get_state()


def get_rng_state_all() -> List[torch.Tensor]:
    """The states of all devices' generators."""
    return [get_rng_state(i) for i in range(_count())]


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "openreg") -> None:
    """Set the state of a device's generator."""
    _generator(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Set the states of all devices' generators."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# The seeding functions do not start openreg (as torch.cuda's): before its initialisation they
# queue their call (torch.openreg._lazy_call), and torch.manual_seed leaves a process free to fork.
# The calls use the default generators (_default_generators), which do not initialise. A seed is checked at the
# call, as the CPU generator checks it, and one for the current device is for the device current at
# the call.


def _checked_seed(seed: Any) -> int:
    seed = int(seed)
    torch.Generator().manual_seed(seed)  # the CPU's error for a seed out of range, now
    return seed


def _current_device() -> int:
    # The thread's index (asking the runtime starts nothing). In a child forked after initialisation
    # the runtime refuses every call and the seed stays queued for good (initialisation is refused
    # there): as torch.cuda's, the call does nothing.
    return 0 if _package()._is_in_bad_fork() else _C._get_device()


def manual_seed(seed: int) -> None:
    """Seed the current device's generator (without a usable device, nothing: as torch.cuda)."""
    seed = _checked_seed(seed)
    if _count() <= 0:
        return
    device = _current_device()
    _package()._lazy_call(lambda: _default_generators()[device].manual_seed(seed), seed=device)


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator."""
    seed = _checked_seed(seed)

    def seed_every_device() -> None:
        for g in _default_generators():
            g.manual_seed(seed)

    _package()._lazy_call(seed_every_device, seed="all")


def seed() -> None:
    """Seed the current device's generator with a random number (without a usable device, nothing)."""
    if _count() <= 0:
        return
    device = _current_device()
    _package()._lazy_call(lambda: _default_generators()[device].seed(), seed=device)


def seed_all() -> None:
    """Seed every device's generator with one random number."""

    def seed_every_device() -> None:
        first, *others = _default_generators()
        s = first.seed()
        for g in others:
            g.manual_seed(s)

    _package()._lazy_call(seed_every_device, seed="all")


def initial_seed() -> int:
    """The initial seed of the current device's generator."""
    return _generator().initial_seed()
