"""First use of common operators in a fresh process: openreg against the CPU.

A new process (a script, a DataLoader worker, a distributed rank) pays for every operator's first
call. Each round starts a fresh interpreter per device that imports torch, then times the first
call of each operator of issue #15's list (factories, random, reductions, indexing, normalisation,
attention), one after the other, including the device synchronisation that makes the result
observable. One row: the summed first-call time, openreg against the CPU (goal: <= 1.5x, or at
most 20 ms more in total). The rows' details list each operator's time and the heavy modules
(sympy, torch._dynamo) the calls imported, which should be none.

    python tools/bench/first_use.py [--quick]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Callable, Dict, List

from rows import ratio_row

IDS = ("first-use",)
NAMES = {"first-use": "first call of 22 common ops in a fresh process (sum)"}
GOAL_RATIO, GOAL_EXTRA_S = 1.5, 0.020

CALLS = """
import json, sys, time

import torch
from torch_openreg.utils.testing import first_use_calls

dev = sys.argv[1]
sync = torch.openreg.synchronize if dev == "openreg" else (lambda: None)
calls = first_use_calls(dev)
times = {}
before = set(sys.modules)
for name, call in calls.items():
    t0 = time.perf_counter()
    call()
    sync()
    times[name] = time.perf_counter() - t0
heavy = sorted(m for m in set(sys.modules) - before if m.startswith(("sympy", "torch._dynamo", "torch._inductor")))
print(json.dumps({"times": times, "heavy": heavy[:5]}))
"""


def _one(device: str) -> Dict:
    proc = subprocess.run([sys.executable, "-c", CALLS, device], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{device} process failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(ids: List[str], quick: bool, log: Callable[[str], None]) -> List[Dict]:
    """Rows for run.py (same keys as its eager rows)."""
    if "first-use" not in ids:
        return []
    rounds = 1 if quick else 3
    totals: Dict[str, List[float]] = {"cpu": [], "openreg": []}
    last: Dict[str, Dict] = {}
    for r in range(rounds):
        for device in ("cpu", "openreg") if r % 2 == 0 else ("openreg", "cpu"):
            log(f"[first-use] round {r + 1}/{rounds}: {device} process ...")
            result = _one(device)
            totals[device].append(sum(result["times"].values()))
            last[device] = result
    o, c = statistics.median(totals["openreg"]), statistics.median(totals["cpu"])
    log(f"[first-use] openreg {o * 1e3:.1f} ms, cpu {c * 1e3:.1f} ms")
    details = {
        "rounds": rounds,
        "goal": f"<= {GOAL_RATIO}x or <= {GOAL_EXTRA_S * 1e3:.0f} ms more",
        "per_op_ms": {d: {k: round(v * 1e3, 2) for k, v in last[d]["times"].items()} for d in last},
        "heavy_imports": {d: last[d]["heavy"] for d in last},
    }
    row = ratio_row("first-use", "first-use", NAMES["first-use"], o, c, GOAL_RATIO, details)
    row["met"] = row["met"] or o - c <= GOAL_EXTRA_S  # or at most 20 ms more in all
    return [row]


if __name__ == "__main__":
    for row in run(list(IDS), "--quick" in sys.argv, log=lambda s: print(s, file=sys.stderr)):
        print(row)
