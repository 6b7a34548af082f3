"""Shared helpers for openreg-amp's tests."""

import pytest
import torch
from torch_openreg.utils.testing import run_python  # noqa: F401  (used by the tests)


@pytest.fixture(autouse=True)
def _clean_device_state():
    """Every test starts outside autocast with the default autocast dtype and an idle device."""
    dtype = torch.get_autocast_dtype("openreg")
    yield
    torch.set_autocast_dtype("openreg", dtype)
    torch.openreg.set_strict_mode(False)
    torch.openreg.synchronize()
