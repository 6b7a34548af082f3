"""Eager-mode benchmarks: openreg against the CPU, each device in a process of its own.

Each measure runs the same Python function with device="cpu" and device="openreg", with
warm-up, several repetitions and medians; openreg timings include the device synchronisation
that makes the result observable. The repetitions of the two devices are interleaved
(cpu, openreg, openreg, cpu, ...) so that a change in background load during the run affects
both sides alike. ratio = openreg / cpu.

Each device runs in its own Python process (`DeviceProcess`, this file with --serve DEVICE), as a
CPU user's program and an openreg user's program would. In one process the two devices slow each
other down: both run their kernels' parallel regions on OpenMP thread pools, one per thread that
starts a region (the CPU's on the main thread, openreg's on its stream worker), and once a
process has more pool threads than CPUs libgomp lets idle pool threads spin only briefly, so a
parallel region often waits for a thread to wake up: an add of 64K-element tensors took 15 to 19
us instead of 3.4 to 4.9 us on the 2-core VM, on both devices (docs/benchmarks.md). Each process
runs the measures in the same order, so state that carries over from one measure to the next
(glibc's malloc thresholds) does so on both sides.

    python tools/bench/eager.py [--quick]     prints one dict per measure
    python tools/bench/run.py                 the full report (this module plus the runtime bench)
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

DEVICES = ("cpu", "openreg")
# Pause before each repetition. After its last parallel region an OpenMP pool thread spins before it
# sleeps (libgomp: 7.7 ms on the 2-core VM); without the pause the device that just ran would take
# a core from the one whose repetition starts.
SETTLE_S = 0.03
ROUNDS = 3  # rounds of fresh device processes in a full run (see run); --quick: 1


def _sync(device: str) -> Callable[[], None]:
    return torch.openreg.synchronize if device == "openreg" else (lambda: None)


def _one_rep(fn: Callable[[], None], sync: Callable[[], None], iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


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


def mlp(device: str) -> torch.nn.Module:
    """Three 1024 x 1024 linear layers with ReLUs between them (the MLP step's model)."""
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
    ).to(device)


def mlp_step(device: str):
    torch.manual_seed(0)
    model = mlp(device)
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


def make_gpt() -> torch.nn.Module:
    """A small decoder-only transformer (issue #15's): hundreds of small ops per step, where the
    per-op host cost shows (embedding, LayerNorm, causal SDPA, GELU MLP, cross-entropy). The
    model is the one core's and the plugins' tests use (torch_openreg.utils.models), at this size."""
    from torch_openreg.utils.models import TinyGPT

    return TinyGPT(vocab=100, d=128, heads=4, layers=2, context=64)


def gpt_training(device: str):
    """The GPT step's state: the model, its AdamW, a batch of 16 x 64 tokens and their targets."""
    torch.manual_seed(0)
    model = make_gpt().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 100, (16, 64), device=device)
    target = torch.randint(0, 100, (16, 64), device=device)
    return model, opt, idx, target


def gpt_step(device: str):
    model, opt, idx, target = gpt_training(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), target.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def gpt_forward_b1(device: str):
    torch.manual_seed(0)
    model = make_gpt().to(device).eval()
    idx = torch.randint(0, 100, (1, 64), device=device)
    sync = _sync(device)

    def forward():
        # Latency: each forward's result is waited for, as a caller that needs the logits would.
        # Without the wait the host queues the next forward while the device runs this one, which
        # measures throughput (and the host's issuing then competes with the kernels for a core).
        with torch.no_grad():
            model(idx)
        sync()

    return forward


@dataclass(frozen=True)
class Measure:
    id: str  # short name for --only
    name: str
    factory: Callable[[str], Callable[[], None]]
    iters: int  # iterations per repetition (full run)
    goal: Optional[float]  # openreg/cpu must be <= goal; None: no goal yet
    # openreg may not support this yet: an exception on the openreg side is reported, not raised.
    may_be_unsupported: bool = False
    reps: int = 5  # repetitions per device and round (full run; --quick: 3)


MEASURES: List[Measure] = [
    Measure("alloc-free", "alloc+free 1 MiB (cached)", alloc_free, 20000, 1.0),
    Measure("add-tiny", "add 1-element, no sync between ops", tiny_add, 2000, 2.0),
    Measure("add-16m", "add 16M float32", large_add, 10, 1.10),
    Measure("add-16m-out", "add 16M float32 into out= (info)", large_add_out, 10, None),
    Measure("matmul", "matmul 2048x2048 float32", matmul, 3, 1.05),
    # A repetition of the MLP steps varies by up to 10 % on the 2-core VM: more of them steady the median.
    Measure("mlp-step", "MLP step 3x1024, batch 64, fwd+bwd+SGD", mlp_step, 10, 1.0, reps=9),
    Measure("gpt-step", "small GPT train step (2x128, ctx 64, batch 16, AdamW, clip)", gpt_step, 5, 1.10, reps=7),
    Measure("gpt-fwd-b1", "small GPT forward, batch 1 (latency)", gpt_forward_b1, 20, 1.10, reps=7),
    Measure(
        "mlp-step-bf16",
        "MLP step under bf16 autocast (openreg-amp)",
        mlp_step_bf16_autocast,
        10,
        None,
        may_be_unsupported=True,
        reps=9,
    ),
]


class Unsupported(Exception):
    """openreg raised where `may_be_unsupported` allows it; `cause` is the original exception."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class DeviceError(Exception):
    """A workload raised in a device process; `type_name` is the original exception's type."""

    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name


# ---- one process per device ----


def serve(device: str, proto) -> None:
    """The device process: answers one JSON request per line of stdin on `proto`.

    {"op": "setup", "id", "warmup"}: builds the measure's function (dropping the previous one)
    and warms it up; {"op": "rep", "iters"}: one timed repetition, {"s": seconds per iteration}.
    An exception becomes {"error": type name, "message"}: the process stays usable.
    """
    by_id = {m.id: m for m in MEASURES}
    sync = _sync(device)
    fn = None

    def reply(obj) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    reply({"ready": device, "torch_num_threads": torch.get_num_threads()})
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "setup":
                fn = None
                gc.collect()
                fn = by_id[req["id"]].factory(device)
                for _ in range(req["warmup"]):
                    fn()
                sync()
                reply({"ok": True})
            elif req["op"] == "rep":
                if fn is None:
                    raise RuntimeError("no measure is set up")
                gc.collect()
                gc.disable()  # as in timeit
                try:
                    reply({"s": _one_rep(fn, sync, req["iters"])})
                finally:
                    gc.enable()
            else:
                raise ValueError(f"unknown request {req!r}")
        except Exception as e:
            fn = None
            reply({"error": type(e).__name__, "message": str(e)})


class DeviceProcess:
    """A device's benchmark process (`serve`), started with this interpreter."""

    def __init__(self, device: str, threads: Optional[int] = None):
        self.device = device
        cmd = [sys.executable, os.path.abspath(__file__), "--serve", device]
        if threads:
            cmd += ["--threads", str(threads)]
        # stderr is shared with this process (warnings, tracebacks); stdout carries the protocol.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.info = self._read()

    def _read(self) -> Dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"the {self.device} benchmark process exited with code {code} (its stderr is above)")
        return json.loads(line)

    def call(self, **req) -> Dict:
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # _read reports the exit code
        out = self._read()
        if "error" in out:
            raise DeviceError(out["error"], out["message"])
        return out

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Processes:
    """One DeviceProcess per device, restarted when one has died (a crash fails only its measure)."""

    def __init__(self, threads: Optional[int] = None):
        self.threads = threads
        self.procs: Dict[str, DeviceProcess] = {}

    def __getitem__(self, device: str) -> DeviceProcess:
        p = self.procs.get(device)
        if p is None or not p.alive():
            p = self.procs[device] = DeviceProcess(device, self.threads)
        return p

    def close(self) -> None:
        for p in self.procs.values():
            p.close()
        self.procs.clear()

    def __enter__(self) -> "Processes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _iters(m: Measure, quick: bool) -> int:
    """Calls per repetition: a quarter with --quick."""
    return max(1, m.iters // 4) if quick else m.iters


def time_round(m: Measure, procs: Processes, quick: bool = False) -> Dict[str, List[float]]:
    """One round of a measure: seconds per iteration, `reps` samples per device.

    Each device is warmed up (iters // 10 calls, at least one, then a synchronize) before any
    sample is taken; then `reps` repetitions of `iters` calls per device, interleaved. Raises
    Unsupported, DeviceError or RuntimeError (a device process died).
    """
    iters = _iters(m, quick)
    reps = 3 if quick else m.reps
    for device in DEVICES:
        try:
            procs[device].call(op="setup", id=m.id, warmup=max(1, iters // 10))
        except DeviceError as e:
            if device == "openreg" and m.may_be_unsupported:
                raise Unsupported(e) from e
            raise
    samples: Dict[str, List[float]] = {device: [] for device in DEVICES}
    for rep in range(reps):
        for device in DEVICES if rep % 2 == 0 else reversed(DEVICES):
            time.sleep(SETTLE_S)
            samples[device].append(procs[device].call(op="rep", iters=iters)["s"])
    return samples


def summarize(m: Measure, samples: Dict[str, List[float]], quick: bool, rounds: int) -> Dict:
    """A measure's result from all its samples: medians per device and their ratio."""
    cpu_s, openreg_s = statistics.median(samples["cpu"]), statistics.median(samples["openreg"])
    return {
        "id": m.id,
        "measure": m.name,
        "openreg_s": openreg_s,
        "cpu_s": cpu_s,
        "ratio": openreg_s / cpu_s,
        "goal": m.goal,
        "met": None if m.goal is None else openreg_s / cpu_s <= m.goal,
        "iters": _iters(m, quick),
        "reps": len(samples["cpu"]),
        "rounds": rounds,
        "samples_s": samples,
    }


def run(
    measures: Optional[List[Measure]] = None,
    quick: bool = False,
    rounds: Optional[int] = None,
    threads: Optional[int] = None,
    log: Callable[[str], None] = lambda msg: None,
) -> Tuple[List[Tuple[Measure, object]], Dict]:
    """Times the measures in `rounds` rounds, each with fresh device processes.

    A process's memory layout (and so its cache behaviour) is luck that stays with it: one
    openreg process ran the MLP step at 6.7 ms per step, the next at 7.2 ms, steadily. Rounds
    of fresh processes average that luck out; each measure's medians are over all its rounds.
    Returns, per measure, its summary or the exception that stopped it, and facts about the
    device processes (torch threads per device).
    """
    measures = list(MEASURES if measures is None else measures)
    rounds = 1 if quick else (rounds or ROUNDS)
    samples = {m.id: {device: [] for device in DEVICES} for m in measures}
    failures: Dict[str, BaseException] = {}
    info: Dict = {}
    for r in range(rounds):
        with Processes(threads) as procs:
            for m in measures:
                if m.id in failures:
                    continue
                t0 = time.perf_counter()
                try:
                    got = time_round(m, procs, quick)
                except Exception as e:
                    failures[m.id] = e
                    log(f"[eager round {r + 1}/{rounds}] {m.name}: {type(e).__name__}: {e}")
                    continue
                for device in DEVICES:
                    samples[m.id][device] += got[device]
                ratio = statistics.median(got["openreg"]) / statistics.median(got["cpu"])
                log(f"[eager round {r + 1}/{rounds}] {m.name}: ratio {ratio:.3g} ({time.perf_counter() - t0:.1f} s)")
            info["torch_num_threads"] = {p.device: p.info.get("torch_num_threads") for p in procs.procs.values()}
    return [(m, failures.get(m.id) or summarize(m, samples[m.id], quick, rounds)) for m in measures], info


def _serve_main(argv: List[str]) -> None:
    device = argv[argv.index("--serve") + 1]
    if "--threads" in argv:
        torch.set_num_threads(int(argv[argv.index("--threads") + 1]))
    torch.device(device)  # fails early for an unknown device
    if device == "openreg" and not hasattr(torch, "openreg"):
        raise RuntimeError("torch.openreg is missing: openreg-core was not loaded by `import torch`")
    # The protocol gets its own copy of stdout; fd 1 then points at stderr, so that anything else
    # printed (by Python or C++) cannot corrupt it.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(device, proto)


if __name__ == "__main__":
    if "--serve" in sys.argv:
        _serve_main(sys.argv)
    else:
        results, _ = run(quick="--quick" in sys.argv[1:], log=lambda msg: print(msg, file=sys.stderr))
        for m, result in results:
            if isinstance(result, BaseException):
                print(f"{m.name}: {type(result).__name__}: {result}")
            else:
                result.pop("samples_s")
                print(result)
