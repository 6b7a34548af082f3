"""Scenario benchmarks: one step of each cross-package scenario (tests/scenarios, whose models and
data this imports from tests/scenarios/workloads.py), openreg against the CPU. Report only, no goals.

- scenario-gpt-step: a training step of the small GPT under bfloat16 autocast, compiled (forward,
  backward, SGD), on one device (the scenario's DDP needs two ranks; its step is this plus occl's
  all-reduce);
- scenario-checkpoint: torch.save of the GPT's model and AdamW state into memory, then torch.load
  back onto the device;
- scenario-int8-serve: the quantized CNN's forward, lowered to openreg-quant's fused int8 kernels on
  openreg; the reference column is the same quantized program exported to ONNX and run in
  onnxruntime's CPU provider (what the scenario serves);
- scenario-loader: a batch of the input pipeline (2 pinned DataLoader workers, side-stream H2D copy,
  compiled MLP on openreg:1) against the same pipeline on the CPU (no copy).

A process per device (this file with --serve DEVICE), each with a fresh Inductor cache. --quick leaves
out scenario-gpt-step (FULL_ONLY): its cold compile in both processes was most of the group's time;
the compiled step is tested by openreg-inductor's tests and tests/scenarios.

    python tools/bench/scenarios.py [--quick]     prints one dict per measure
"""

from __future__ import annotations

import io
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

from rows import module_main, ratio_rows, serve_each_device

SCENARIOS = Path(__file__).resolve().parents[2] / "tests" / "scenarios"
IDS = ("scenario-gpt-step", "scenario-checkpoint", "scenario-int8-serve", "scenario-loader")
# Measured in full runs only (run.py leaves them out of a --quick run).
FULL_ONLY = ("scenario-gpt-step",)
NAMES = {
    "scenario-gpt-step": "GPT step, bf16 autocast, compiled: openreg vs CPU",
    "scenario-checkpoint": "GPT + AdamW torch.save/torch.load: openreg vs CPU",
    "scenario-int8-serve": "int8 CNN forward: openreg lowered vs onnxruntime (CPU EP)",
    "scenario-loader": "pinned loader -> compiled MLP on openreg:1 vs CPU, per batch",
}


def _median(fn: Callable[[], object], sync: Callable[[], None], reps: int) -> float:
    fn()
    sync()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def serve(device: str, quick: bool) -> Dict[str, float]:
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    sys.path.insert(0, str(SCENARIOS))
    import torch
    import workloads as w

    dev = torch.device(device)
    sync = torch.openreg.synchronize if device == "openreg" else (lambda: None)
    reps = 3 if quick else 15
    out: Dict[str, float] = {}

    # GPT training step, bf16 autocast, compiled.
    model = w.make_gpt().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx, target = (t.to(dev) for t in w.gpt_batch(0))

    @torch.compile
    def fwd_bwd(idx, target):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = w.gpt_loss(model, idx, target)
        loss.backward()
        return loss

    def gpt_step():
        fwd_bwd(idx, target)
        opt.step()
        opt.zero_grad()

    if not (quick and "scenario-gpt-step" in FULL_ONLY):
        gpt_step()
        out[f"scenario-gpt-step:{device}"] = _median(gpt_step, sync, reps)

    # Checkpoint round trip.
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    w.gpt_loss(model, idx, target).backward()
    adamw.step()
    state = {"model": model.state_dict(), "optim": adamw.state_dict()}

    def checkpoint():
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        torch.load(buf, map_location=dev)

    out[f"scenario-checkpoint:{device}"] = _median(checkpoint, sync, reps)

    # Input pipeline: a batch per step, the copy on a side stream on openreg.
    target_dev = torch.device("openreg", 1) if device == "openreg" else dev
    mlp = torch.compile(w.make_mlp().eval().to(target_dev))
    batches = 4 if quick else 16
    loader = torch.utils.data.DataLoader(
        w.Samples(64 * batches), batch_size=64, num_workers=2, pin_memory=device == "openreg"
    )

    def pipeline():
        with torch.no_grad():
            if device != "openreg":
                for x, _ in loader:
                    mlp(x)
                return
            with torch.openreg.device(target_dev):
                side, compute = torch.openreg.Stream(), torch.openreg.current_stream()
                for x, _ in loader:
                    with torch.openreg.stream(side):
                        xd = x.to(target_dev, non_blocking=True)
                    compute.wait_stream(side)
                    xd.record_stream(compute)
                    mlp(xd)
                torch.openreg.synchronize(target_dev)

    pipeline()
    out[f"scenario-loader:{device}"] = _median(pipeline, sync, max(1, reps // 3)) / batches

    if device == "openreg":
        import onnxruntime as ort
        from openreg_quant import OpenRegQuantizer, lower_pt2e
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        cnn = w.SmallCNN().eval().to(dev)
        x = w.cnn_images(0).to(dev)
        prepared = prepare_pt2e(torch.export.export(cnn, (x,)).module(), OpenRegQuantizer())
        for seed in range(1, 5):
            prepared(w.cnn_images(seed).to(dev))
        converted = convert_pt2e(prepared)
        proto = torch.onnx.export(converted, (x,), dynamo=True, verbose=False).model_proto
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x.cpu().numpy()}
        lowered = lower_pt2e(converted)
        with torch.no_grad():
            out["scenario-int8-serve:openreg"] = _median(lambda: lowered(x), sync, reps * 3)
        out["scenario-int8-serve:cpu"] = _median(lambda: session.run(None, feed), lambda: None, reps * 3)
    return out


def run(ids: List[str], quick: bool, log: Callable[[str], None]) -> List[Dict]:
    """Rows for run.py (same keys as its eager rows)."""
    samples = serve_each_device(__file__, "scenarios", quick, log, timeout=1800, fresh_inductor_cache=True)
    return ratio_rows("scenarios", ids, NAMES, {}, samples)  # no goals: the scenarios are reported


def main(argv: List[str]) -> None:
    module_main(argv, serve, run, IDS)


if __name__ == "__main__":
    main(sys.argv[1:])
