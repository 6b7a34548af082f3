"""Quantization benchmarks (openreg-quant): native q/dq and fused int8 kernels on openreg.

Rows (openreg column / reference column; ratio = openreg / reference):

- quant-qdq-256k: quantize + dequantize per tensor of 256K float32 on openreg, native kernels
  against the decomposition run op by op on openreg (goal <= 0.2, i.e. at least 5x faster);
- quant-qlinear-m{1,32,256}: openreg_quant.qlinear (K = N = 1024, uint8 in, uint8 out; the
  activations 7-bit on CPUs whose int8 products saturate, as OpenRegQuantizer makes them) on openreg
  against the CPU's own int8 path (oneDNN qlinear_pointwise on CPU tensors, in a CPU process; goal
  <= 1.05);
- quant-fp32-m{1,32,256}: the same qlinear on openreg against the float32 linear on openreg (report:
  what int8 buys on this CPU);
- quant-cnn: the PT2E-lowered small CNN (openreg_quant.pt2e) against the float32 CNN, both on
  openreg (report);
- quant-cnn-int8: the same lowered CNN on openreg against the CPU's own int8 CNN: the x86 PT2E flow
  (X86InductorQuantizer, convert_pt2e, with the activations' range OpenRegQuantizer picks on this
  CPU) compiled by Inductor with freezing, which lowers it to oneDNN's int8 convolutions and
  linear (goal <= 1.05, as qlinear's; its compile is ~20 s of the CPU process).

Each device runs in a process of its own (this file with --serve DEVICE), as in eager.py.

    python tools/bench/quant.py [--quick]     prints one dict per measure
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, List

from rows import module_main, ratio_rows, serve_each_device, time_per_call

MS = (1, 32, 256)
IDS = (
    "quant-qdq-256k",
    *(f"quant-qlinear-m{m}" for m in MS),
    *(f"quant-fp32-m{m}" for m in MS),
    "quant-cnn",
    "quant-cnn-int8",
)
NAMES = {
    "quant-qdq-256k": "q+dq per tensor 256K: native vs decomposed (both openreg)",
    **{f"quant-qlinear-m{m}": f"qlinear M={m} K=N=1024: openreg vs CPU int8 (oneDNN)" for m in MS},
    **{f"quant-fp32-m{m}": f"qlinear M={m} K=N=1024 vs float32 linear (both openreg)" for m in MS},
    "quant-cnn": "PT2E-lowered CNN vs float32 CNN (both openreg, batch 8)",
    "quant-cnn-int8": "PT2E-lowered CNN on openreg vs the CPU's int8 CNN (x86 PT2E + Inductor, batch 8)",
}
GOALS = {"quant-qdq-256k": 0.2, **{f"quant-qlinear-m{m}": 1.05 for m in MS}, "quant-cnn-int8": 1.05}


def _weights(n: int, k: int, device: str):
    import torch

    qd = torch.ops.quantized_decomposed
    g = torch.Generator().manual_seed(0)
    # Drawn on the CPU (the same numbers in both processes), computed on the device: a CPU kernel
    # large enough to run in parallel on the openreg process's host thread would open an OpenMP
    # team there, and every later openreg kernel would pay for it (benchmarks.md, "Thread budget").
    w = torch.randn(n, k, generator=g).to(device) * 0.05
    scales = w.abs().amax(1) / 127.5
    zps = torch.zeros(n, dtype=torch.long, device=device)
    wq = qd.quantize_per_channel(w, scales, zps, 0, -128, 127, torch.int8)
    return w, wq, scales, zps, torch.randn(n, generator=g).to(device)


def serve(device: str, quick: bool) -> Dict[str, float]:
    import torch
    import torch.ao.quantization.fx._decomposed as decomposed

    qd = torch.ops.quantized_decomposed
    sync = torch.openreg.synchronize if device == "openreg" else (lambda: None)
    iters, reps = (5, 3) if quick else (50, 7)
    out: Dict[str, float] = {}
    if device == "openreg":
        x = torch.randn(256 * 1024, device=device)

        def native():
            q = qd.quantize_per_tensor(x, 0.02, 3, -128, 127, torch.int8)
            return qd.dequantize_per_tensor(q, 0.02, 3, -128, 127, torch.int8)

        def decomposed_qdq():  # the Python decomposition itself, op by op on openreg
            q = decomposed.quantize_per_tensor(x, 0.02, 3, -128, 127, torch.int8)
            return decomposed.dequantize_per_tensor(q, 0.02, 3, -128, 127, torch.int8)

        out["quant-qdq-256k:openreg"] = time_per_call(native, sync, iters, reps)
        out["quant-qdq-256k:cpu"] = time_per_call(decomposed_qdq, sync, max(1, iters // 5), reps)
    w, wq, ws, wz, b = _weights(1024, 1024, device)
    import openreg_quant  # noqa: F401  (int8_pairs_saturate)

    # Activations as OpenRegQuantizer makes them on this CPU: 7-bit where oneDNN's int8 products
    # saturate (above 127 openreg's kernels take their exact path, and the CPU's oneDNN call would
    # give wrong results: the two would not compute the same thing), else 8-bit.
    seven_bit = bool(torch.ops.openreg_quant.int8_pairs_saturate())
    top = 128 if seven_bit else 256
    for m in MS:
        xq = torch.randint(0, top, (m, 1024), dtype=torch.uint8, generator=torch.Generator().manual_seed(m))
        xq = xq.to(device)
        if device == "openreg":
            packed = torch.ops.openreg_quant.qlinear_prepack(wq, ws, wz)

            def int8():
                return torch.ops.openreg_quant.qlinear(xq, 0.02, 128, packed, b, 0.05, 100, None, "none")

            xf = torch.randn(m, 1024, device=device)
            t = time_per_call(int8, sync, iters, reps)
            out[f"quant-qlinear-m{m}:openreg"] = t
            out[f"quant-fp32-m{m}:openreg"] = t
            out[f"quant-fp32-m{m}:cpu"] = time_per_call(lambda: torch.nn.functional.linear(xf, w, b), sync, iters, reps)
        else:  # packed for this M, as the CPU's own lowering (x86 Inductor) does
            packed = torch.ops.onednn.qlinear_prepack(wq, [m, 1024])

            def cpu_int8():
                return torch.ops.onednn.qlinear_pointwise(
                    xq, 0.02, 128, packed, ws, wz, b, 0.05, 100, None, "none", [], ""
                )

            out[f"quant-qlinear-m{m}:cpu"] = time_per_call(cpu_int8, sync, iters, reps)
    if device == "openreg":
        out.update(_cnn(device, sync, max(1, iters // 5), reps))
        out["quant-cnn-int8:openreg"] = out["quant-cnn:openreg"]
    else:
        out["quant-cnn-int8:cpu"] = _cpu_int8_cnn(max(1, iters // 5), reps, reduce_range=seven_bit)
    return out


def _cnn_model(device: str):
    """The benchmark's small CNN and its input (batch 8, 32 x 32)."""
    import torch

    torch.manual_seed(0)
    model = (
        torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(64 * 16 * 16, 10),
        )
        .eval()
        .to(device)
    )
    return model, torch.randn(8, 3, 32, 32, device=device)


def _cnn(device: str, sync, iters: int, reps: int) -> Dict[str, float]:
    import torch
    from openreg_quant import OpenRegQuantizer, lower_pt2e
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model, x = _cnn_model(device)
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), OpenRegQuantizer())
    prepared(x)
    lowered = lower_pt2e(convert_pt2e(prepared))
    with torch.no_grad():
        return {
            "quant-cnn:openreg": time_per_call(lambda: lowered(x), sync, iters, reps),
            "quant-cnn:cpu": time_per_call(lambda: model(x), sync, iters, reps),
        }


def _cpu_int8_cnn(iters: int, reps: int, reduce_range: bool) -> float:
    """The CPU's own int8 path for the same CNN: what PyTorch gives a CPU user (the x86 quantizer,
    then Inductor with freezing, which lowers the q/dq patterns to oneDNN's int8 kernels), with the
    activations' range openreg's quantizer picks on this CPU, so that both sides compute the same
    thing with oneDNN."""
    import torch
    import torch._inductor.config as inductor_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    model, x = _cnn_model("cpu")
    config = get_default_x86_inductor_quantization_config(reduce_range=reduce_range)
    quantizer = X86InductorQuantizer().set_global(config)
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    prepared(x)
    inductor_config.freezing = True  # this process's last measure: the setting stays
    with torch.no_grad():
        compiled = torch.compile(convert_pt2e(prepared))
        return time_per_call(lambda: compiled(x), lambda: None, iters, reps)


def run(ids: List[str], quick: bool, log: Callable[[str], None]) -> List[Dict]:
    """Rows for run.py (same keys as its eager rows)."""
    return ratio_rows("quant", ids, NAMES, GOALS, serve_each_device(__file__, "quant", quick, log, timeout=900))


def main(argv: List[str]) -> None:
    module_main(argv, serve, run, IDS)


if __name__ == "__main__":
    main(sys.argv[1:])
