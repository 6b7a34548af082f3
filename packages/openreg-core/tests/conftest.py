"""Shared helpers for openreg-core's tests."""

import os
from typing import Optional

import pytest
import torch
from torch_openreg.utils.testing import run_python as _run_python


def run_python(code: str, env: Optional[dict] = None, timeout: float = 120):
    """Runs `code` in a fresh interpreter (for autoload, fork, faults and env-dependent behaviour)."""
    return _run_python(code, env=env, timeout=timeout, cwd=os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _sync_and_reset_device():
    """Every test starts on device 0 and leaves no queued work behind."""
    torch.openreg.set_device(0)
    yield
    for i in range(torch.openreg.device_count()):
        torch.openreg.synchronize(i)
    torch.openreg.set_device(0)
