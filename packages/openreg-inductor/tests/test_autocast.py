"""Autocast inside a compiled region on openreg (needs openreg-amp, which `nox -s inductor` installs):
the traced graph follows openreg's autocast policies (CUDA's lists), so compiled and eager openreg
agree on every output's dtype and, within bfloat16 rounding, on its values."""

import openreg_amp  # noqa: F401  (the autocast policies for openreg; fails loudly if missing)
import torch
from torch.testing._internal.common_utils import TestCase, run_tests


def f(x, w):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        y = x @ w  # lower precision
        return y, torch.softmax(y, -1), y.relu() + 1  # softmax: float32 on openreg (CUDA's list)


class TestAutocast(TestCase):
    def test_compiled_matches_eager_policies(self):
        x, w = torch.randn(16, 32, device="openreg"), torch.randn(32, 8, device="openreg")
        expected = f(x, w)
        actual = torch.compile(f)(x, w)
        self.assertEqual([t.dtype for t in actual], [torch.bfloat16, torch.float32, torch.bfloat16])
        self.assertEqual([t.dtype for t in actual], [t.dtype for t in expected])
        for a, e in zip(actual, expected):
            self.assertEqual(a.cpu(), e.cpu(), atol=1e-2, rtol=1e-2)


if __name__ == "__main__":
    run_tests()
