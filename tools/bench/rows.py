"""What the benchmark groups share: the result row they give run.py (openreg against a reference,
as a ratio), timing a call, and running a device's measures in a process of its own."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence


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


def ratio_rows(
    group: str, ids: Sequence[str], names: Dict[str, str], goals: Dict[str, float], samples: Dict[str, float]
) -> List[Dict]:
    """The rows of the measures in `ids` whose samples ``ID:openreg`` and ``ID:cpu`` both exist."""
    rows = []
    for id_ in ids:
        o, c = samples.get(f"{id_}:openreg"), samples.get(f"{id_}:cpu")
        if o is not None and c is not None:
            rows.append(ratio_row(group, id_, names[id_], o, c, goals.get(id_)))
    return rows


def time_per_call(
    fn: Callable[[], object],
    sync: Callable[[], None],
    iters: int,
    reps: int,
    start: Callable[[], None] = lambda: None,
) -> float:
    """Median seconds per call over `reps` repetitions of `iters` calls (synchronised at the end),
    after one call to warm up. `start` runs before each repetition (a barrier that lines ranks up)."""
    return time_interleaved({"fn": fn}, sync, iters, reps, start)["fn"]


def time_interleaved(
    fns: Dict[str, Callable[[], object]],
    sync: Callable[[], None],
    iters: int,
    reps: int,
    start: Callable[[], None] = lambda: None,
) -> Dict[str, float]:
    """time_per_call for several functions in one process: each is warmed up once, then their
    repetitions take turns in alternating order, so that a slow phase of a shared machine weighs on
    each alike. Median seconds per call, by key."""
    for fn in fns.values():
        fn()
        sync()
    samples: Dict[str, List[float]] = {k: [] for k in fns}
    for rep in range(reps):
        for k in list(fns) if rep % 2 == 0 else reversed(list(fns)):
            start()
            t0 = time.perf_counter()
            for _ in range(iters):
                fns[k]()
            sync()
            samples[k].append((time.perf_counter() - t0) / iters)
    return {k: statistics.median(v) for k, v in samples.items()}


def serve_in_process(script: str, device: str, quick: bool, timeout: float, env: Optional[Dict] = None) -> Dict:
    """Runs `script --serve DEVICE [--quick]` in a fresh interpreter (each device measures in a
    process of its own) and returns the JSON its last line of output holds."""
    cmd = [sys.executable, script, "--serve", device] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{device} process failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def serve_devices(
    script: str,
    group: str,
    quick: bool,
    log: Callable[[str], None],
    timeout: float,
    fresh_inductor_cache: bool = False,
    devices: Sequence[str] = ("cpu", "openreg"),
) -> Dict[str, Dict]:
    """Each device's samples from a process of its own (`serve_in_process`), by device; with
    `fresh_inductor_cache` each process compiles into an empty Inductor cache of its own.

    A full run takes the processes one after the other, so that none measures while another runs.
    --quick (a smoke run whose timings mean nothing) runs them side by side: the groups that compile
    cold spent minutes of CI's time otherwise."""

    def one(device: str) -> Dict:
        if not fresh_inductor_cache:
            return serve_in_process(script, device, quick, timeout=timeout)
        with tempfile.TemporaryDirectory(prefix=f"openreg-bench-{group}-") as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            return serve_in_process(script, device, quick, timeout=timeout, env=env)

    if not quick:
        results = {}
        for device in devices:
            log(f"[{group}] {device} process ...")
            results[device] = one(device)
        return results
    log(f"[{group}] {' and '.join(devices)} processes side by side ...")
    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
        return dict(zip(devices, pool.map(one, devices)))


def serve_each_device(*args, **kwargs) -> Dict:
    """The samples of `serve_devices`' processes (its arguments), merged into one dict."""
    samples: Dict = {}
    for result in serve_devices(*args, **kwargs).values():
        samples.update(result)
    return samples


def module_main(argv: List[str], serve: Callable[[str, bool], Dict], run: Callable[..., List[Dict]], ids) -> None:
    """A group module's command line: `--serve DEVICE [--quick]` prints that device's samples as
    JSON (what serve_in_process reads); otherwise the group runs and prints its rows."""
    if len(argv) >= 2 and argv[0] == "--serve":
        print(json.dumps(serve(argv[1], "--quick" in argv)))
        return
    for row in run(list(ids), "--quick" in argv, log=lambda m: print(m, file=sys.stderr)):
        print(row)
