"""Builds and runs libopenreg's C++ benchmark (libopenreg/tests/runtime_bench.cpp) and turns its
JSON output into report rows. No torch needed.

The program is built with CMake + Ninja into ``<repo>/build/bench-runtime`` (configured once,
then rebuilt incrementally by ninja, so an edit of the benchmark or the runtime is picked up).

Environment:
  OPENREG_RUNTIME_BENCH_BIN=PATH   use a prebuilt openreg_runtime_bench instead of building
  OPENREG_SPIN_US, ...             passed through to the benchmark (it reads the runtime's settings)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
LIB_DIR = REPO / "packages" / "openreg-core" / "libopenreg"
sys.path.insert(0, str(LIB_DIR))
from build_programs import BuildError, build_program  # noqa: E402

BUILD_DIR = REPO / "build" / "bench-runtime"
TARGET = "openreg_runtime_bench"
COPY_MIB = 64
TIMEOUT_S = 300

# Keys of the benchmark's JSON object that the report needs; anything else is optional.
REQUIRED_KEYS = (
    "launch_latency_us_median",
    "memcpy_gbps",
    "h2d_pageable_gbps",
    "h2d_pinned_gbps",
    "d2h_pageable_gbps",
    "d2h_pinned_gbps",
    "stream_chain_us_median",
)

# Row ids this module produces, in report order.
IDS = ("launch-latency", "stream-chain", "h2d-pageable", "h2d-pinned", "d2h-pageable", "d2h-pinned")


class BenchError(RuntimeError):
    pass


def executable(log: Callable[[str], None] = lambda s: None) -> Path:
    """Builds (incrementally) or locates openreg_runtime_bench."""
    if os.environ.get("OPENREG_RUNTIME_BENCH_BIN"):
        try:
            return build_program(TARGET, BUILD_DIR, prebuilt_env="OPENREG_RUNTIME_BENCH_BIN")
        except BuildError as e:
            raise BenchError(str(e)) from None
    exe = BUILD_DIR / (TARGET + (".exe" if sys.platform == "win32" else ""))
    missing = [tool for tool in ("cmake", "ninja") if shutil.which(tool) is None]
    if missing:
        if exe.is_file():
            log(f"warning: {' and '.join(missing)} not found; using {exe} as built, it may be out of date")
            return exe
        raise BenchError(f"{' and '.join(missing)} needed to build {TARGET} (pip install cmake ninja)")
    try:
        exe = build_program(TARGET, BUILD_DIR)
    except BuildError as e:
        raise BenchError(str(e)) from None
    return exe


def parse_output(stdout: str) -> Dict[str, float]:
    """The benchmark's JSON object (its last line starting with '{'), checked for REQUIRED_KEYS."""
    lines = [line for line in stdout.splitlines() if line.lstrip().startswith("{")]
    if not lines:
        raise BenchError(f"{TARGET} printed no JSON object; its output was:\n{stdout[-2000:]}")
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise BenchError(f"{TARGET} printed invalid JSON ({e}):\n{lines[-1]}") from None
    if not isinstance(data, dict):
        raise BenchError(f"{TARGET} printed JSON that is not an object:\n{lines[-1]}")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise BenchError(
            f"{TARGET}'s JSON lacks {missing} (it has {sorted(data)}); if runtime_bench.cpp renamed them, "
            f"update REQUIRED_KEYS and rows() in tools/bench/runtime_bench.py"
        )
    for k in REQUIRED_KEYS:
        v = data[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise BenchError(f"{TARGET}'s JSON has {k}={v!r}, expected a positive number")
    return data


def run_once(exe: Path, quick: bool) -> Dict[str, float]:
    args = ["--size-mib", str(COPY_MIB)]
    if quick:
        args += ["--iterations", "2000", "--reps", "3"]
    cmd = [str(exe), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(cmd)} timed out after {TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} -> exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return parse_output(proc.stdout)


def _median(runs: List[Dict], key: str) -> Optional[float]:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return statistics.median(values) if values else None


def rows(runs: List[Dict]) -> List[Dict]:
    """Report rows from one or more benchmark outputs: per-key medians across runs; each copy's
    ratio is taken within a run (against that run's memcpy), then the median across runs."""
    latency = _median(runs, "launch_latency_us_median")
    memcpy = _median(runs, "memcpy_gbps")
    out = [
        {
            "id": "launch-latency",
            "measure": "launch-to-completion latency, empty kernel (median)",
            "openreg": latency,
            "cpu": None,
            "unit": "us",
            "ratio": None,
            "goal_spec": {"on": "openreg", "op": "<=", "value": 10.0},
            "met": latency <= 10.0,
            "details": {
                "per_run_median_us": [r["launch_latency_us_median"] for r in runs],
                **{
                    k: _median(runs, k)
                    for k in (
                        "launch_latency_us_p90",
                        "launch_latency_us_p99",
                        "launch_latency_us_min",
                        "launch_latency_us_mean",
                        "launch_enqueue_us",
                        "launch_iterations",
                    )
                    if _median(runs, k) is not None
                },
                "spin_us": runs[-1].get("spin_us"),
                "wait_spin_us": runs[-1].get("wait_spin_us"),
            },
        },
        {
            "id": "stream-chain",
            "measure": "two side streams taking turns through a waiting stream (per turn pair)",
            "openreg": _median(runs, "stream_chain_us_median"),
            "cpu": None,
            "unit": "us",
            "ratio": None,
            "goal_spec": None,
            "met": None,
            "details": {
                "per_run_median_us": [r["stream_chain_us_median"] for r in runs],
                "steps": runs[-1].get("stream_chain_steps"),
            },
        },
    ]
    for direction, goal in (("h2d", 0.8), ("d2h", None)):
        for kind in ("pageable", "pinned"):
            key = f"{direction}_{kind}_gbps"
            per_run_ratio = [r[key] / r["memcpy_gbps"] for r in runs]
            ratio = statistics.median(per_run_ratio)
            out.append(
                {
                    "id": f"{direction}-{kind}",
                    "measure": f"{direction.upper()} {COPY_MIB} MiB {kind} vs host memcpy",
                    "openreg": _median(runs, key),
                    "cpu": memcpy,
                    "unit": "GB/s",
                    "ratio": ratio,
                    "goal_spec": None if goal is None else {"on": "ratio", "op": ">=", "value": goal},
                    "met": None if goal is None else ratio >= goal,
                    "details": {"per_run_gbps": [r[key] for r in runs], "per_run_ratio": per_run_ratio},
                }
            )
    return out


def run(quick: bool, log: Callable[[str], None] = lambda s: None) -> List[Dict]:
    """Builds the benchmark, runs it (once with --quick, else 3 times) and returns its rows."""
    exe = executable(log)
    runs = []
    n = 1 if quick else 3
    for i in range(n):
        runs.append(run_once(exe, quick))
        log(f"runtime bench run {i + 1}/{n}: launch median {runs[-1]['launch_latency_us_median']:.2f} us")
    result = rows(runs)
    for row in result:
        row["details"]["runs"] = n
        row["details"]["copy_bytes"] = runs[-1].get("copy_bytes")
    return result
