"""The launch design: how a generated C++ kernel runs on an openreg stream.

Inductor's CPU codegen writes ``extern "C" void kernel(const float* in_ptr0, float* out_ptr0,
int64_t ks0)``: a function that dereferences its pointers on the calling thread. On openreg that
thread is the host, which cannot read device memory, and the call would be synchronous. So each
kernel library gets, next to the generated body (renamed ``openreg_body``):

- an argument block (``LaunchArgs``) holding the device pointers and sizes by value, and the
  values of CPU 0-dim scalar inputs, read on the host at launch time (as eager copies them);
- a device-side entry (``run``) that turns every device pointer into a kernel view with
  ``orKernelPointer`` on the stream's worker, calls the body, and reports a C++ exception
  (an index assert, an integer division by zero) with ``orKernelFail``: the runtime then
  fails the next synchronisation of the device, naming the kernel;
- the exported ``kernel(stream, args...)``: fills a block and ``orLaunchKernel``s it on the
  raw stream the wrapper passes (``torch.openreg.current_raw_stream``), then returns.

The wrapper calls ``kernel`` through Inductor's fast Python binding (``CppPythonBindingsCodeCache``),
the same glue CPU Inductor uses; only the link line (core's ``libopenreg``) and the first argument
(``uintptr_t`` stream) differ. Kernels are compiled with ``device_type="cpu"`` so they get the CPU
flags and full optimisation (Inductor compiles any other device type at -O1, see
``torch/_inductor/codecache.py``, ``CppCodeCache.load_async``: ``min_optimize``).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Sequence

import torch_openreg
from torch_openreg.utils.cpp_extension import link_flag

KERNEL_BODY = "openreg_body"


@functools.cache
def link_flags() -> tuple[str, ...]:
    """Compiler/linker flags that make a kernel library find openreg/runtime.h and libopenreg."""
    (include,) = torch_openreg.include_paths()
    (libdir,) = torch_openreg.library_paths()
    if sys.platform == "win32":
        return (f"/I{include}", link_flag("openreg"))
    rpath = f"-Wl,-rpath,{libdir}"
    flags = (f"-I{include}", f"-L{libdir}", link_flag("openreg"), rpath)
    from torch._inductor.cpp_builder import is_gcc

    # GCC makes an inline variable of a shared library a GNU unique symbol, one for the whole
    # process: cpp_prefix.h's integer-division flag, and the lock beside it (_DIVISION_LOCK), would
    # be shared with every kernel library, CPU Inductor's too, whose kernels use the flag unlocked.
    return (*flags, "-fno-gnu-unique") if is_gcc() else flags


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def launcher_source(
    kernel_name: str,
    arg_defs: Sequence[str],
    arg_types: Sequence[str],
    host_scalars: Sequence[bool],
    *,
    body: str = KERNEL_BODY,
    entry: str = "kernel",
    namespace: str = "",
) -> str:
    """C++ appended to the generated body: argument block, device-side entry, host launcher.

    ``arg_defs``/``arg_types`` are Inductor's (``KernelArgs.cpp_argdefs``); ``host_scalars[i]``
    says that pointer argument ``i`` is a CPU 0-dim tensor, passed by value. A kernel library of
    its own (the Python wrapper) uses the default names; kernels that share one translation unit
    (the C++ wrapper) pass their own ``body``/``entry`` function names and ``namespace``.
    """
    fields, fill, view, body_args = [], [], [], []
    params = ["uintptr_t openreg_stream"]
    for i, (arg_def, arg_type, on_host) in enumerate(zip(arg_defs, arg_types, host_scalars, strict=True)):
        name = arg_def.rsplit(" ", 1)[1]
        params.append(arg_def)
        if not arg_type.endswith("*"):
            fields.append(f"{arg_type.replace('const ', '')} {name};")
            fill.append(name)
            body_args.append(f"a->{name}")
        elif on_host:
            value_type = arg_type.replace("const ", "")[:-1]
            fields.append(f"{value_type} {name};")
            fill.append(f"*{name}")  # read now, on the host: the tensor lives in host memory
            body_args.append(f"&a->{name}")
        else:
            plain = arg_type.replace("const ", "")
            fields.append(f"{arg_type} {name};")
            fill.append(name)
            view.append(f"void* v{i} = nullptr;")
            view.append(f"if (a->{name} != nullptr && orKernelPointer(a->{name}, &v{i}) != orSuccess)")
            view.append(
                f"  return orKernelFail({_c_string(kernel_name + ': argument ' + name + ' is not device memory')});"
            )
            body_args.append(f"static_cast<{plain}>(v{i})")
    label = _c_string(kernel_name)
    nl = "\n"
    return f"""
#include <openreg/runtime.h>
#include <exception>
#include <stdexcept>
#include <string>

namespace {namespace} {{
struct LaunchArgs {{
{nl.join("  " + f for f in fields)}
}};

orStatus run(void* raw) {{
  auto* a = static_cast<LaunchArgs*>(raw);
{nl.join("  " + v for v in view)}
  try {{
    {body}({", ".join(body_args)});
  }} catch (const std::exception& e) {{
    return orKernelFail(e.what());
  }} catch (...) {{
    return orKernelFail("unknown C++ exception");
  }}
  return orSuccess;
}}

void release(void* raw) {{ delete static_cast<LaunchArgs*>(raw); }}
}}  // namespace {namespace}

extern "C" void {entry}({", ".join(params)}) {{
  auto* a = new {namespace}::LaunchArgs{{{", ".join(fill)}}};
  if (orLaunchKernel(reinterpret_cast<orStream_t>(openreg_stream), {label}, {namespace}::run, a,
                     {namespace}::release) != orSuccess)
    throw std::runtime_error(std::string({label}) + ": launch failed: " + orGetLastErrorMessage());
}}
"""


# An exception may not leave an OpenMP region: one thrown inside it (an index assert of a large
# gather) ends the process, with CPU Inductor as on openreg before this. Each iteration of a
# worksharing loop (and each `omp single` block) of a kernel that can throw catches its own; the
# first is rethrown after the body's regions, where `run` reports it like any kernel failure.
# Iterations after a failure are skipped: the asserts precede the accesses they guard, so none of
# them reads or writes out of bounds. A division helper (_DIVIDES) throws too if it finds the
# division flag null, which one_division_flag_user_at_a_time rules out: its blocks are caught as
# well, so that a slip there fails the kernel instead of ending the process.
_FAILURE_SLOT = """
#ifndef OPENREG_PARALLEL_FAILURE
#define OPENREG_PARALLEL_FAILURE
#include <atomic>
#include <exception>
#include <mutex>
struct OpenRegParallelFailure {
  std::atomic<bool> failed{false};
  std::mutex lock;
  std::exception_ptr first;
  void note(std::exception_ptr e) {
    std::lock_guard<std::mutex> guard(lock);
    if (!first) first = e;
    failed.store(true, std::memory_order_relaxed);
  }
  void rethrow() {
    if (first) std::rethrow_exception(first);
  }
};
#endif
"""
_SLOT = "openreg_parallel_failure"
_FLAG_LOCAL = "std::atomic<int> inductor_cpu_integer_div_error{0};"  # the body's first line
_BODY_END = "inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);"
_THROWS = ("TORCH_CHECK(", "AOTI_TORCH_CHECK(")
# cpp_prefix.h's helpers that report a zero divisor through the flag (and throw if it is null), and
# openreg's for truncation division (see _TRUNCDIV).
_DIVIDES = re.compile(r"\b(floor_divide_integral|remainder_integral|mod|openreg_truncdiv_integral)\(")


def _can_throw(text: str) -> bool:
    return any(t in text for t in _THROWS) or _DIVIDES.search(text) is not None


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _block_end(lines: list[str], open_at: int) -> int | None:
    """Index of the ``}`` closing the ``{`` alone on line ``open_at`` (Inductor's BracesBuffer
    writes each brace on a line of its own, at the block's indentation)."""
    closing = lines[open_at].replace("{", "}")
    for j in range(open_at + 1, len(lines)):
        if lines[j] == closing:
            return j
    return None


def catch_in_parallel_regions(source: str) -> str:
    """``source`` with the exceptions of its OpenMP regions caught inside them (see _FAILURE_SLOT).
    Unchanged when nothing in it can throw, or when its layout is not the one this expects."""
    if not _can_throw(source) or "#pragma omp" not in source:
        return source
    lines = source.split("\n")
    if sum(line.strip() == _FLAG_LOCAL for line in lines) != 1 or sum(line.strip() == _BODY_END for line in lines) != 1:
        return source
    wraps = []  # (line of the "{" that opens a per-iteration or single block, skip-after-failure)
    for i, line in enumerate(lines):
        head = line.strip()
        if head.startswith("#pragma omp for"):
            depth = int(head.split("collapse(")[1].split(")")[0]) if "collapse(" in head else 1
            j = i + 1
            for level in range(depth):  # the last of the collapsed loops owns the iteration body
                if not lines[j].strip().startswith("for(") or lines[j + 1].strip() != "{":
                    return source
                j = j + 1 if level == depth - 1 else j + 2
            wraps.append((j, True))
        elif head == "#pragma omp single":
            if lines[i + 1].strip() != "{":
                return source
            wraps.append((i + 1, False))
    edits = {}
    for open_at, skip in wraps:
        close_at = _block_end(lines, open_at)
        if close_at is None:
            return source
        if not _can_throw("\n".join(lines[open_at:close_at])):
            continue  # nothing in this block throws: no cost for it
        pad = _indent(lines[open_at]) + "    "
        first = [f"{pad}if ({_SLOT}.failed.load(std::memory_order_relaxed)) continue;"] if skip else []
        edits[open_at] = [lines[open_at], *first, f"{pad}try {{"]
        edits[close_at] = [f"{pad}}} catch (...) {{ {_SLOT}.note(std::current_exception()); }}", lines[close_at]]
    if not edits:
        return source
    out = [_FAILURE_SLOT]
    for i, line in enumerate(lines):
        out.extend(edits.get(i, [line]))
        if line.strip() == _FLAG_LOCAL:
            out.append(line.replace(_FLAG_LOCAL, f"OpenRegParallelFailure {_SLOT};"))
        elif line.strip() == _BODY_END:
            out.append(line.replace(_BODY_END, f"{_SLOT}.rethrow();"))
    return "\n".join(out)


# Inductor's integer division, modulus and remainder report a zero divisor through one flag per
# kernel library (``inductor_cpu_integer_div_error_flag``, torch/csrc/inductor/cpp_prefix.h; per
# library with GCC only under -fno-gnu-unique, see link_flags). Every kernel, dividing or not,
# points it at a local of its own and sets it back to null at its end. Two calls in flight at once
# share it: one call's reset leaves the other's division by zero to throw inside its OpenMP region
# (the process ends), and one call may report the other's error. That happens with two streams
# running one library, and with the C++ wrapper, whose one library also holds the graph's CPU
# kernels, run on the host while the openreg kernels run on the streams' workers
# (cpp_wrapper.OpenRegCppWrapper.define_kernel passes them all through here). So a dividing
# kernel takes the library's lock before it sets the flag, and a kernel that does not divide
# leaves the flag alone: it runs concurrently as before.
_DIVISION_LOCK = """
#ifndef OPENREG_INTEGER_DIVISION_LOCK
#define OPENREG_INTEGER_DIVISION_LOCK
#include <mutex>
inline std::mutex openreg_integer_division_lock;  // one per library, as the flag
#endif
"""
_DIVISION_GUARD = "std::lock_guard<std::mutex> openreg_division_guard(openreg_integer_division_lock);"
_FLAG_SET = (
    "inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;",
    "inductor_cpu_integer_div_error_flag = nullptr;",
)


def one_division_flag_user_at_a_time(source: str) -> str:
    """``source`` with its dividing kernels' calls serialised and its other kernels off the flag (see
    _DIVISION_LOCK). Idempotent: the C++ wrapper passes openreg's kernels through here a second time."""
    lines = source.split("\n")
    if not any(line.strip() == _FLAG_LOCAL for line in lines) or any(line.strip() == _DIVISION_GUARD for line in lines):
        return source  # no flag (then Inductor's layout changed: nothing to guard), or guarded already
    if not _DIVIDES.search(source):
        return "\n".join(line for line in lines if line.strip() not in _FLAG_SET)  # its local stays 0
    out = [_DIVISION_LOCK]
    for line in lines:
        if line.strip() == _FLAG_LOCAL:
            out.append(_indent(line) + _DIVISION_GUARD)
        out.append(line)
    return "\n".join(out)


# Inductor's integer truncation division (torch.div(..., rounding_mode="trunc")) is a plain `/`
# (CppOverrides.truncdiv, CppVecOverrides.truncdiv in torch/_inductor/codegen/cpp.py), which ends
# the process on a zero divisor (SIGFPE), under CPU Inductor too, where eager raises
# ZeroDivisionError. openreg's kernels divide through this helper instead (scheduling._Overrides),
# which reports a zero divisor through the division flag, as floor division and remainder do, and
# wraps INT_MIN / -1 instead of trapping.
_TRUNCDIV = """
#ifndef OPENREG_TRUNCDIV_INTEGRAL
#define OPENREG_TRUNCDIV_INTEGRAL
template <typename T, typename U>
inline std::common_type_t<T, U> openreg_truncdiv_integral(T a, U b) {
  using C = std::common_type_t<T, U>;
  const C a_c = static_cast<C>(a), b_c = static_cast<C>(b);
  if (C10_UNLIKELY(b_c == 0)) {
    inductor_cpu_note_integer_div_by_zero();
    return C(0);
  }
  if constexpr (std::is_signed_v<C>) {
    if (b_c == C(-1)) return static_cast<C>(-static_cast<std::make_unsigned_t<C>>(a_c));
  }
  return a_c / b_c;
}
#if INDUCTOR_USE_VECTOR_TYPES()
template <typename T>
inline at::vec::Vectorized<T> openreg_truncdiv_integral(const at::vec::Vectorized<T>& a,
                                                         const at::vec::Vectorized<T>& b) {
  constexpr int kLen = at::vec::Vectorized<T>::size();
  alignas(alignof(at::vec::Vectorized<T>)) T x[kLen];
  alignas(alignof(at::vec::Vectorized<T>)) T y[kLen];
  a.store(x);
  b.store(y);
  for (int i = 0; i < kLen; ++i) x[i] = openreg_truncdiv_integral(x[i], y[i]);
  return at::vec::Vectorized<T>::loadu(x);
}
template <typename T, int N>
inline at::vec::VectorizedN<T, N> openreg_truncdiv_integral(const at::vec::VectorizedN<T, N>& a,
                                                            const at::vec::VectorizedN<T, N>& b) {
  at::vec::VectorizedN<T, N> out;
  for (int i = 0; i < N; ++i) out[i] = openreg_truncdiv_integral(a[i], b[i]);
  return out;
}
#endif
#endif
"""


def with_checked_truncdiv(source: str) -> str:
    """``source`` with the definition of ``openreg_truncdiv_integral`` after its includes, if it
    calls it (see _TRUNCDIV)."""
    if "openreg_truncdiv_integral(" not in source:
        return source
    lines = source.split("\n")
    last_include = max((i for i, line in enumerate(lines) if line.startswith("#include")), default=-1)
    return "\n".join(lines[: last_include + 1] + [_TRUNCDIV] + lines[last_include + 1 :])


def load_kernel(async_compile, argtypes: list[str], source: str):
    """What generated wrappers call (``openreg_kernel(...)``) in place of ``async_compile.cpp_pybinding``:
    compiles in Inductor's compile workers when it has them, cached like CPU kernels."""
    from torch._inductor.async_compile import get_compile_threads
    from torch._inductor.codecache import CppPythonBindingsCodeCache, LambdaFuture

    kwargs = dict(device_type="cpu", extra_flags=link_flags())
    if get_compile_threads() <= 1:
        return CppPythonBindingsCodeCache.load_pybinding(argtypes, source, **kwargs)
    future = CppPythonBindingsCodeCache.load_pybinding_async(argtypes, source, submit_fn=async_compile.submit, **kwargs)
    return LambdaFuture(future)
