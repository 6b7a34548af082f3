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
import sys
from collections.abc import Sequence

import torch_openreg

KERNEL_BODY = "openreg_body"


@functools.cache
def link_flags() -> tuple[str, ...]:
    """Compiler/linker flags that make a kernel library find openreg/runtime.h and libopenreg."""
    (include,) = torch_openreg.include_paths()
    (libdir,) = torch_openreg.library_paths()
    if sys.platform == "win32":
        return (f"/I{include}", f"/LIBPATH:{libdir}", "openreg.lib")
    rpath = f"-Wl,-rpath,{libdir}"
    return (f"-I{include}", f"-L{libdir}", "-lopenreg", rpath)


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
