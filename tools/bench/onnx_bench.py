"""ONNX benchmarks (openreg-onnx): export time on openreg against the CPU, onnxruntime against eager.

A process per device and round (this file with --serve DEVICE; the processes alternate cpu,
openreg, openreg, cpu, ... over the rounds):

- first export: the process's first ``torch.onnx.export(dynamo=True)``, of the MLP on its device,
  which imports onnxscript and onnx and builds the exporter's registry (reported, no goal);
- export MLP / transformer block: later exports of the same model, on both devices in every
  process, interleaved, after one warm-up export each; medians (goal <= 1.10x: export runs on
  FakeTensors and must not reach slow device paths; no kernels run, so one process can time both);
- forward MLP / block: openreg eager (synchronised) in the openreg column, the exported model in
  onnxruntime's CPU EP in the reference column (report only);
- import torch: with openreg-onnx loaded, against the same plugins without it (report only; the
  plugin's loading imports no ONNX package).

Module name: ``onnx_bench`` (a tools/bench/onnx.py would shadow the onnx package).

    python tools/bench/onnx_bench.py [--quick]     prints one dict per measure
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from importlib import metadata
from typing import Callable, Dict, List

from rows import module_main, ratio_row, serve_devices

IDS = ("onnx-first-export", "onnx-export-mlp", "onnx-export-block", "onnx-ort-mlp", "onnx-ort-block", "onnx-import")
NAMES = {
    "onnx-first-export": "first export in a process (MLP, imports onnxscript)",
    "onnx-export-mlp": "export MLP",
    "onnx-export-block": "export transformer block",
    "onnx-ort-mlp": "MLP forward: openreg eager vs onnxruntime (CPU EP)",
    "onnx-ort-block": "block forward: openreg eager vs onnxruntime (CPU EP)",
    "onnx-import": "import torch: with openreg-onnx vs without",
}
GOALS = {"onnx-export-mlp": 1.10, "onnx-export-block": 1.10}


def _models(device: str):
    import torch

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 256),
    )
    block = torch.nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0, batch_first=True)
    return {
        "mlp": (mlp.to(device).eval(), (torch.randn(32, 256, device=device),)),
        "block": (block.to(device).eval(), (torch.randn(4, 32, 128, device=device),)),
    }


def _median_time(fn: Callable[[], object], reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def serve(device: str, quick: bool) -> Dict[str, float]:
    """The measures of a process whose first export is on ``device``. Keys without a device
    suffix belong to ``device``; the steady-state export times of both devices are taken here,
    interleaved (cpu, openreg, openreg, cpu, ...), so that background load hits both alike."""
    import torch

    devices = ("cpu", "openreg")
    models = {d: _models(d) for d in devices}
    out: Dict[str, float] = {}
    programs = {}

    def timed_export(d, name):
        model, args = models[d][name]
        t0 = time.perf_counter()
        programs[d, name] = torch.onnx.export(model, args, dynamo=True, verbose=False)
        return time.perf_counter() - t0

    out["onnx-first-export"] = timed_export(device, "mlp")
    reps = 1 if quick else 3
    for name in ("mlp", "block"):
        for d in devices:
            timed_export(d, name)  # warm-up: the first trace of this model on this device
        samples = {d: [] for d in devices}
        for r in range(reps):
            for d in devices if r % 2 == 0 else devices[::-1]:
                samples[d].append(timed_export(d, name))
        for d in devices:
            out[f"onnx-export-{name}:{d}"] = statistics.median(samples[d])
    if device == "openreg":
        import onnxruntime as ort

        iters = 5 if quick else 50
        for name in ("mlp", "block"):
            model, args = models["openreg"][name]
            with torch.no_grad():
                model(*args)
                torch.openreg.synchronize()

                def eager():
                    for _ in range(iters):
                        model(*args)
                    torch.openreg.synchronize()

                out[f"onnx-ort-{name}:openreg"] = _median_time(eager, 3) / iters
            proto = programs["openreg", name].model_proto
            session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
            feeds = {i.name: a.cpu().numpy() for i, a in zip(session.get_inputs(), args)}
            session.run(None, feeds)
            out[f"onnx-ort-{name}:cpu"] = (
                _median_time(lambda: [session.run(None, feeds) for _ in range(iters)], 3) / iters
            )
    return out


def _import_time(plugins: str) -> float:
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    env = dict(os.environ, OPENREG_PLUGINS=plugins)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "import torch failed")
    return float(proc.stdout.strip().splitlines()[-1])


def run(ids: List[str], quick: bool, log: Callable[[str], None]) -> List[Dict]:
    """Rows for run.py (same keys as its eager rows)."""
    rounds = 1 if quick else 2
    samples: Dict[str, List[float]] = {}
    order = ["cpu", "openreg"]
    for r in range(rounds):
        devices = order if r % 2 == 0 else order[::-1]
        log(f"[onnx] round {r + 1}/{rounds}")
        by_device = serve_devices(__file__, "onnx", quick, log, timeout=900, devices=devices)
        for device, got in by_device.items():
            for key, value in got.items():
                key = key if ":" in key else f"{key}:{device}"
                samples.setdefault(key, []).append(value)
    if "onnx-import" in ids:
        installed = sorted(ep.name for ep in metadata.entry_points(group="torch_openreg.plugins"))
        without = ",".join(n for n in installed if n != "onnx") or "none"
        for _ in range(1 if quick else 3):
            samples.setdefault("onnx-import:openreg", []).append(_import_time(",".join(installed) or "none"))
            samples.setdefault("onnx-import:cpu", []).append(_import_time(without))
    rows = []
    for id_ in ids:
        openreg, cpu = samples.get(f"{id_}:openreg"), samples.get(f"{id_}:cpu")
        if not openreg or not cpu:
            continue
        o, c = statistics.median(openreg), statistics.median(cpu)
        details = {
            "rounds": rounds,
            "samples_us": {"openreg": [v * 1e6 for v in openreg], "cpu": [v * 1e6 for v in cpu]},
        }
        rows.append(ratio_row("onnx", id_, NAMES[id_], o, c, GOALS.get(id_), details))
        log(f"[onnx] {NAMES[id_]}: openreg {o * 1e3:.1f} ms, reference {c * 1e3:.1f} ms")
    return rows


if __name__ == "__main__":
    module_main(sys.argv[1:], serve, run, IDS)
