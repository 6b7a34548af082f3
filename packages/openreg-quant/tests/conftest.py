"""Shared helpers for openreg-quant's tests."""

from typing import Any, Callable, Set, Tuple

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch_openreg.utils.testing import run_python  # noqa: F401  (used by the tests)


@pytest.fixture(autouse=True)
def _clean_device_state():
    """Every test ends outside strict mode with an idle device."""
    yield
    torch.openreg.set_strict_mode(False)
    torch.openreg.synchronize()


class _RecordOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def run_recorded(fn: Callable[[], Any]) -> Tuple[Any, Set[str], Set[str], int]:
    """Runs ``fn`` and returns its result, the operators it dispatched ("aten._int_mm.default"), those
    that took core's generic path (a CPU kernel over the kernel views: "aten::mul.Tensor") and how
    many device-to-host copies it made (counted after a synchronize)."""
    torch.openreg.synchronize()
    torch.openreg.reset_fallback_op_counts()
    before = torch.openreg._runtime_counters()["memcpy_d2h"]
    recorder = _RecordOps()
    with recorder:
        result = fn()
    torch.openreg.synchronize()
    copies = torch.openreg._runtime_counters()["memcpy_d2h"] - before
    return result, recorder.ops, set(torch.openreg.fallback_op_counts()), copies
