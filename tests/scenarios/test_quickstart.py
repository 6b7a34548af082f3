"""The README's quick-start runs as printed and gives the CPU's answer on device openreg:0.

Run by `nox -s tests` against the installed openreg-core wheel.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"
README = ROOT / "README.md"


def _run(script: Path, tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENREG_")}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # the quick-start relies on autoload
    # From an empty directory, so that nothing in the checkout shadows the installed packages.
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{script} failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_readme_quickstart_is_examples_quickstart():
    """The README's Python block and examples/quickstart.py are the same code."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no ```python block (the quick-start)"
    assert blocks[0] == QUICKSTART.read_text(), "README.md's quick-start differs from examples/quickstart.py"


def test_quickstart_output(tmp_path: Path):
    out = _run(QUICKSTART, tmp_path)
    expected_cpu = str(torch.tensor([[1.0, 2.0], [3.0, 4.0]]) + 2)  # printed by the CPU in this process
    on_device = expected_cpu[:-1] + ", device='openreg:0') openreg:0"
    assert on_device in out, f"expected the openreg tensor and its device:\n{on_device}\ngot:\n{out}"
    assert out.rstrip().endswith(expected_cpu), f"expected y.cpu() to print:\n{expected_cpu}\ngot:\n{out}"
