"""Shared helpers for openreg-inductor's tests.

Compiles dominate the suite's time, so every test process shares one Inductor cache: the
nox session sets TORCHINDUCTOR_CACHE_DIR to a per-session folder; run by hand, a temporary
folder is made once per pytest run.
"""

import os
import tempfile
import threading

if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="openreg-inductor-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch_openreg.utils.testing import run_python as _run_python  # noqa: E402

# A kernel that keeps its stream busy until `release` is set (at most 10 s): a compiled call made
# meanwhile that returns before it was set did not wait for the device; captured into a graph, it
# holds every replay of it.
release = threading.Event()


@torch.library.custom_op("openreg_inductor_test::hold_stream", mutates_args=(), device_types="cpu")
def hold_stream(x: torch.Tensor) -> torch.Tensor:
    release.wait(10)
    return x.clone()


@hold_stream.register_fake
def _(x):
    return torch.empty_like(x)


def run_python(code: str, env=None, timeout: float = 300):
    """A fresh interpreter sharing this run's compile cache."""
    return _run_python(code, env=env, timeout=timeout, cwd=os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _idle_device():
    """Every test starts on device 0 and leaves no queued work behind."""
    torch.openreg.set_device(0)
    yield
    for i in range(torch.openreg.device_count()):
        torch.openreg.synchronize(i)
    torch.openreg.set_device(0)
