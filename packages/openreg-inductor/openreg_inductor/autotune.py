"""``max-autotune`` on openreg: what it chooses among, and how a choice is timed.

For a matrix product on openreg Inductor offers two kinds of choice:

- the ATen extern kernel (``extern_kernels.mm/addmm/bmm``): openreg's eager operator, which runs
  the CPU's BLAS on kernel views;
- Inductor's C++ GEMM templates (``CppGemmTemplate``, ``CppBmmTemplate``): the CPU's register-blocked
  micro-kernels, with pointwise epilogues fused in. They are generated exactly as for the CPU and
  packaged as openreg launchers like every other kernel (``codegen.scheduling``). As on the CPU,
  ``mm``/``addmm`` get them for constant weights only (``torch._inductor.config.freezing``),
  ``bmm`` for any operands.

Each choice is timed on the device, the way a GPU's are: it is launched on the current openreg
stream between two timing events (``benchmark_with_events``, registered as Inductor's benchmarker
for device type "openreg"), so the times are the kernels' and not the host's. A template's benchmark
run compiles it with the same launcher as the final kernel (``OpenRegCppBenchmarkRequest``):
Inductor's own CPU request calls the kernel on the host over ``data_ptr()``, which on openreg is
device memory the host cannot read.

The torch 2.13 lines that keep these choices from a device other than the CPU are worked around in
``_torch213`` (workarounds 8 to 11).
"""

from __future__ import annotations

import functools
import re
import statistics

import torch
from torch._inductor.autotune_process import CppBenchmarkRequest

from . import DEVICE
from .codegen import launch


def benchmark_with_events(benchmarker, fn, *, warmup: float, rep: float, **kwargs) -> float:
    """Median device time of ``fn`` in milliseconds, timed with openreg events on the current
    stream after about ``warmup`` ms of warm-up, over about ``rep`` ms of runs (the meanings of
    Inductor's GPU benchmarker). ``fn`` only enqueues work, so the host runs ahead and the events
    time the kernels back to back."""

    def timing_event():
        return torch.Event(device=DEVICE, enable_timing=True)

    fn()  # the first call may compile or allocate
    torch.openreg.synchronize()
    start, end = timing_event(), timing_event()
    start.record()
    for _ in range(5):
        fn()
    end.record()
    end.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup / estimate))):
        fn()
    pairs = [(timing_event(), timing_event()) for _ in range(max(1, min(int(rep / estimate), 1000)))]
    for begin, finish in pairs:
        begin.record()
        fn()
        finish.record()
    torch.openreg.synchronize()
    return statistics.median(begin.elapsed_time(finish) for begin, finish in pairs)


# `extern "C" void <name>(<arguments>)`: a C++ template kernel's entry, as CppTemplateKernel.def_kernel
# writes it (the export macro and a line break may sit between the two).
_ENTRY = r'extern "C"[^(]*?\bvoid\s+{name}\(([^)]*)\)'


class OpenRegCppBenchmarkRequest(CppBenchmarkRequest):
    """A C++ template's benchmark on openreg: the rendered kernel becomes the body of an openreg
    launcher (``launch.launcher_source``), called through Inductor's Python binding with the current
    raw stream and timed with openreg events. Picklable, like the CPU request it replaces (strings
    and integers only): ``autotune_in_subproc`` benchmarks it in a tuning process."""

    def __init__(self, kernel_name, input_tensor_meta, output_tensor_meta, extra_args, source_code):
        super().__init__(kernel_name, input_tensor_meta, output_tensor_meta, extra_args, source_code)
        entry = re.search(_ENTRY.format(name=re.escape(kernel_name)), source_code)
        if entry is None:
            raise RuntimeError(f"openreg-inductor: no entry {kernel_name}(...) in the C++ template's code")
        arg_defs = [arg.strip() for arg in entry.group(1).split(",") if arg.strip()]
        arg_types = [arg.rsplit(" ", 1)[0] for arg in arg_defs]
        body = source_code[: entry.start()] + source_code[entry.start() :].replace(
            f"void {kernel_name}(", f"void {launch.KERNEL_BODY}(", 1
        )
        # Template kernels take device buffers and sizes only: no CPU scalars.
        host_scalars = [False] * len(arg_types)
        self.launcher = body + launch.launcher_source(kernel_name, arg_defs, arg_types, host_scalars)
        self.argtypes = ["uintptr_t", *arg_types]
        self.sizes = [int(arg.value) for arg in extra_args]  # ctypes.c_ulonglong, as for the CPU

    def _load(self):
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        return CppPythonBindingsCodeCache.load_pybinding(
            self.argtypes, self.launcher, device_type="cpu", extra_flags=launch.link_flags()
        )

    def precompile(self):
        self._load()

    def make_run_fn(self, *input_tensors: torch.Tensor, out: torch.Tensor):
        stream = torch.openreg.current_raw_stream(out.device.index)
        return functools.partial(self._load(), stream, *input_tensors, out, *self.sizes)

    def do_bench(self, fn, *tensors: torch.Tensor, out: torch.Tensor | None = None) -> float:
        from torch._inductor.runtime.benchmarking import benchmarker

        register()  # a tuning process (autotune_in_subproc) has not loaded the backend
        with torch.openreg.device(tensors[-1].device.index if out is None else out.device.index):
            return benchmarker.benchmark(fn, device=DEVICE)


def benchmark_request(**kwargs):
    """What ``CppTemplate.generate`` constructs in place of ``CppBenchmarkRequest`` (workaround 10):
    openreg's request for a kernel whose output lives on openreg, the CPU's otherwise."""
    meta = kwargs["output_tensor_meta"]
    meta = meta[0] if isinstance(meta, list) else meta
    if meta.device.type == DEVICE:
        return OpenRegCppBenchmarkRequest(**kwargs)
    return CppBenchmarkRequest(**kwargs)


_registered = False


def register() -> None:
    """Makes openreg events time every autotuning choice on openreg (idempotent)."""
    global _registered
    if _registered:
        return
    from torch._inductor.runtime.benchmarking import register_benchmarker

    register_benchmarker(DEVICE, benchmark_with_events, override=True)
    _registered = True
