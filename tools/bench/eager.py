"""Eager-mode benchmarks: openreg against the CPU, measured in the same process.

Each measure runs the same Python function with device="cpu" and device="openreg", with
warm-up, several repetitions and medians; openreg timings include the device synchronisation
that makes the result observable. The repetitions of the two devices are interleaved
(cpu, openreg, openreg, cpu, ...) so that a change in background load during the run affects
both sides alike. ratio = openreg / cpu.

    python tools/bench/eager.py [--quick]     prints one dict per measure
    python tools/bench/run.py                 the full report (this module plus the runtime bench)
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

DEVICES = ("cpu", "openreg")


def _sync(device: str) -> Callable[[], None]:
    return torch.openreg.synchronize if device == "openreg" else (lambda: None)


def _one_rep(fn: Callable[[], None], sync: Callable[[], None], iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def time_pair(fns: Dict[str, Callable[[], None]], iters: int, reps: int) -> Dict[str, List[float]]:
    """Seconds per iteration of each device's `fn`, `reps` samples each, repetitions interleaved.

    Each device is warmed up (iters // 10 calls, at least one, then a synchronize) before any
    sample is taken. The garbage collector is off while timing, as in timeit.
    """
    for device, fn in fns.items():
        for _ in range(max(1, iters // 10)):
            fn()
        _sync(device)()
    samples: Dict[str, List[float]] = {device: [] for device in fns}
    order = list(fns)
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rep in range(reps):
            for device in order if rep % 2 == 0 else reversed(order):
                samples[device].append(_one_rep(fns[device], _sync(device), iters))
    finally:
        if was_enabled:
            gc.enable()
    return samples


# ---- the workloads: factory(device) -> a function doing one iteration ----


def tiny_add(device: str):
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    return lambda: torch.add(a, b)  # no synchronisation between iterations


def large_add(device: str):
    a, b = torch.ones(16 << 20, device=device), torch.ones(16 << 20, device=device)
    return lambda: torch.add(a, b)  # allocates a fresh 64 MiB result each time


def large_add_out(device: str):
    a, b = torch.ones(16 << 20, device=device), torch.ones(16 << 20, device=device)
    out = torch.empty(16 << 20, device=device)
    return lambda: torch.add(a, b, out=out)


def matmul(device: str):
    a, b = torch.randn(2048, 2048, device=device), torch.randn(2048, 2048, device=device)
    return lambda: torch.mm(a, b)


def alloc_free(device: str):
    # A torch.device object: parsing the device string on every call would time Python, not allocators.
    dev = torch.device(device)
    return lambda: torch.empty(256 * 1024, device=dev)  # 1 MiB, freed at once


def mlp_step(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 1024, device=device), torch.randn(64, 1024, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return step


def mlp_step_bf16_autocast(device: str):
    # Without openreg-amp autocast on openreg casts nothing: that would compare fp32 with CPU bf16.
    if device == "openreg" and not torch.openreg.plugins().get("amp", {}).get("loaded"):
        raise RuntimeError("openreg-amp is not loaded (pip install --no-build-isolation packages/openreg-amp)")
    step = mlp_step(device)

    def autocast_step():
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            step()

    return autocast_step


@dataclass(frozen=True)
class Measure:
    id: str  # short name for --only
    name: str
    factory: Callable[[str], Callable[[], None]]
    iters: int  # iterations per repetition (full run)
    goal: Optional[float]  # openreg/cpu must be <= goal; None: no goal yet
    # openreg may not support this yet: an exception on the openreg side is reported, not raised.
    may_be_unsupported: bool = False


MEASURES: List[Measure] = [
    Measure("alloc-free", "alloc+free 1 MiB (cached)", alloc_free, 20000, 1.0),
    Measure("add-tiny", "add 1-element, no sync between ops", tiny_add, 2000, 2.0),
    Measure("add-16m", "add 16M float32", large_add, 10, 1.10),
    Measure("add-16m-out", "add 16M float32 into out= (info)", large_add_out, 10, None),
    Measure("matmul", "matmul 2048x2048 float32", matmul, 3, 1.05),
    Measure("mlp-step", "MLP step 3x1024, batch 64, fwd+bwd+SGD", mlp_step, 10, 1.0),
    Measure(
        "mlp-step-bf16",
        "MLP step under bf16 autocast (openreg-amp)",
        mlp_step_bf16_autocast,
        10,
        None,
        may_be_unsupported=True,
    ),
]


class Unsupported(Exception):
    """openreg raised where `may_be_unsupported` allows it; `cause` is the original exception."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


def run_measure(m: Measure, quick: bool = False) -> Dict:
    """Times one measure on both devices; raises Unsupported, or any error of the workload."""
    iters = max(1, m.iters // 4) if quick else m.iters
    reps = 3 if quick else 7
    fns = {}
    for device in DEVICES:
        try:
            fns[device] = m.factory(device)
            if device == "openreg" and m.may_be_unsupported:
                fns[device]()  # surface "not supported" here, not in the middle of the timing
                torch.openreg.synchronize()
        except Exception as e:
            if device == "openreg" and m.may_be_unsupported:
                raise Unsupported(e) from e
            raise
    samples = time_pair(fns, iters, reps)
    cpu_s, openreg_s = statistics.median(samples["cpu"]), statistics.median(samples["openreg"])
    return {
        "id": m.id,
        "measure": m.name,
        "openreg_s": openreg_s,
        "cpu_s": cpu_s,
        "ratio": openreg_s / cpu_s,
        "goal": m.goal,
        "met": None if m.goal is None else openreg_s / cpu_s <= m.goal,
        "iters": iters,
        "reps": reps,
        "samples_s": samples,
    }


def run(quick: bool = False) -> List[Dict]:
    """Runs every eager measure; returns rows with times, ratio and goal (unsupported ones skipped)."""
    rows = []
    for m in MEASURES:
        try:
            rows.append(run_measure(m, quick))
        except Unsupported as e:
            print(f"{m.name}: not supported yet ({type(e.cause).__name__})", file=sys.stderr)
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv[1:]):
        row.pop("samples_s")
        print(row)
