"""Shared helpers for openreg-amp's tests."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (plugin selection is fixed at import time)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=timeout
    )


@pytest.fixture(autouse=True)
def _clean_device_state():
    """Every test starts outside autocast with the default autocast dtype and an idle device."""
    dtype = torch.get_autocast_dtype("openreg")
    yield
    torch.set_autocast_dtype("openreg", dtype)
    torch.openreg.set_strict_mode(False)
    torch.openreg.synchronize()
