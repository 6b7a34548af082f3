"""Shared helpers for openreg-quant's tests."""

import pytest
import torch
from torch_openreg.utils.testing import run_python  # noqa: F401  (used by the tests)


@pytest.fixture(autouse=True)
def _clean_device_state():
    """Every test ends outside strict mode with an idle device."""
    yield
    torch.openreg.set_strict_mode(False)
    torch.openreg.synchronize()
