"""Shared helpers for openreg-core's tests."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for autoload, fork, faults and env-dependent behaviour)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=os.path.dirname(__file__),
    )


@pytest.fixture(autouse=True)
def _sync_and_reset_device():
    """Every test starts on device 0 and leaves no queued work behind."""
    torch.openreg.set_device(0)
    yield
    for i in range(torch.openreg.device_count()):
        torch.openreg.synchronize(i)
    torch.openreg.set_device(0)
