"""What the benchmark groups share: the result row they give run.py (openreg against a reference,
as a ratio) and running a device's measures in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Dict, Optional


def ratio_row(
    group: str,
    id_: str,
    measure: str,
    openreg_s: float,
    reference_s: float,
    goal: Optional[float] = None,
    details: Optional[Dict] = None,
) -> Dict:
    """A row of times (seconds in, microseconds out); ratio = openreg / reference, lower is better;
    `goal`, if any, is the highest ratio that meets it."""
    ratio = openreg_s / reference_s
    row = {
        "id": id_,
        "group": group,
        "measure": measure,
        "openreg": openreg_s * 1e6,
        "cpu": reference_s * 1e6,
        "unit": "us",
        "ratio": ratio,
        "goal_spec": None if goal is None else {"on": "ratio", "op": "<=", "value": goal},
        "met": None if goal is None else ratio <= goal,
        "status": "ok",
    }
    if details is not None:
        row["details"] = details
    return row


def serve_in_process(script: str, device: str, quick: bool, timeout: float, env: Optional[Dict] = None) -> Dict:
    """Runs `script --serve DEVICE [--quick]` in a fresh interpreter (each device measures in a
    process of its own) and returns the JSON its last line of output holds."""
    cmd = [sys.executable, script, "--serve", device] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{device} process failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
