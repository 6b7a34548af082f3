"""Eager-mode benchmarks: openreg against the CPU, measured in the same process.

Each measure runs the same Python function with device="cpu" and device="openreg",
with warm-up, several repetitions and medians; openreg timings include the device
synchronisation that makes the result observable. Prints ratio = openreg / cpu.
"""

import statistics
import time
from typing import Callable, Dict, List

import torch


def _time(fn: Callable[[], None], sync: Callable[[], None], iters: int, reps: int) -> float:
    """Median seconds per iteration of `fn` over `reps` repetitions."""
    for _ in range(max(1, iters // 10)):
        fn()
    sync()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def _sync(device: str) -> Callable[[], None]:
    return torch.openreg.synchronize if device == "openreg" else (lambda: None)


def tiny_add(device: str):
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    return lambda: torch.add(a, b)


def large_add(device: str):
    a, b = torch.ones(16 << 20, device=device), torch.ones(16 << 20, device=device)
    return lambda: torch.add(a, b)


def matmul(device: str):
    a, b = torch.randn(2048, 2048, device=device), torch.randn(2048, 2048, device=device)
    return lambda: torch.mm(a, b)


def alloc_free(device: str):
    return lambda: torch.empty(256 * 1024, device=device)  # 1 MiB, freed at once


def mlp_step(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 1024, device=device), torch.randn(64, 1024, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return step


MEASURES = {
    # name: (factory, iterations, goal ratio)
    "add 1-element": (tiny_add, 2000, 2.0),
    "add 16M float32": (large_add, 10, 1.10),
    "matmul 2048x2048": (matmul, 3, 1.05),
    "alloc+free 1 MiB": (alloc_free, 2000, 1.0),
    "MLP training step": (mlp_step, 10, 1.0),
}


def run(quick: bool = False) -> List[Dict]:
    """Runs every eager measure; returns rows with times, ratio and goal."""
    rows = []
    reps = 3 if quick else 7
    for name, (factory, iters, goal) in MEASURES.items():
        iters = max(1, iters // 4) if quick else iters
        times = {}
        for device in ("cpu", "openreg"):
            times[device] = _time(factory(device), _sync(device), iters, reps)
        ratio = times["openreg"] / times["cpu"]
        rows.append({"measure": name, "openreg_s": times["openreg"], "cpu_s": times["cpu"], "ratio": ratio,
                     "goal": goal, "met": ratio <= goal})
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
