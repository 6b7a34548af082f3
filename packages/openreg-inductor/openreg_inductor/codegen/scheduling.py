"""Inductor's scheduling for openreg: CPU C++ kernel generation, openreg launch.

Everything about *what* a kernel computes (fusion, loop nests, vectorisation, reductions,
indirect indexing, random numbers) is Inductor's ``CppScheduling``. This subclass changes how
small a pointwise kernel must be to run without an OpenMP parallel region
(``config.min_chunk_size``) and how a finished kernel is packaged (``define_kernel``): the
generated function becomes the body of a launcher (``launch.launcher_source``) that runs it on an
openreg stream. A vendor with its own code generator replaces this class (see
docs/mechanisms/compiler.md).
"""

from __future__ import annotations

from torch._inductor import config
from torch._inductor.codegen.cpp import (
    CppKernel,
    CppKernelProxy,
    CppOverrides,
    CppScheduling,
    CppTile2DKernel,
    CppTile2DOverrides,
    CppVecKernel,
    CppVecOverrides,
)
from torch._inductor.utils import Placeholder, get_fused_kernel_name
from torch._inductor.virtualized import V

from .. import _torch213
from .. import config as openreg_config
from . import launch


def _is_host_scalar(name: str) -> bool:
    """A kernel argument that lives in host memory: only CPU 0-dim tensors may (Dynamo lifts
    Python scalars and ``cpu_tensor.sum()``-like values into a graph that runs on openreg)."""
    buf = V.graph.try_get_buffer(name)
    device = buf.get_device() if buf is not None else None
    if device is None or device.type != "cpu":
        return False
    if not V.graph.sizevars.statically_known_equals(buf.get_numel(), 1):
        raise RuntimeError(
            f"an openreg kernel reads the CPU tensor {name} of {buf.get_numel()} elements (an input of the "
            "compiled function, or a value computed from one inside openreg's kernel); openreg's compiled "
            "kernels take only CPU scalars (0-dim tensors) from the host: move that tensor to openreg"
        )
    return True


# Integer truncation division through a helper that reports a zero divisor (launch._TRUNCDIV): the
# CPU's kernels divide with a plain `/`, which ends the process. Through the kernel classes
# CppKernelProxy lets a scheduling swap (kernel_cls, vec_kernel_cls, tile2d_kernel_cls).
def _checked_truncdiv(truncdiv):
    """`truncdiv` (an overrides' method) with its `a / b` turned into the helper's call."""

    def checked(a, b):
        expr = truncdiv(a, b)
        left, sep, right = str(expr).partition(" / ")
        if not sep or " " in left:  # not a plain division of two operands: as it is
            return expr
        return f"openreg_truncdiv_integral({left}, {right})"

    return checked


class _Overrides(CppOverrides):
    truncdiv = staticmethod(_checked_truncdiv(CppOverrides.truncdiv))


def _with_checked_truncdiv(base):
    """A ``__new__`` for a subclass of ``base`` (a CppVecOverrides): CppVecOverrides.__new__ sets each
    of its ops on the instance, wrapped (scalar arguments broadcast, or all-scalar calls sent to
    CppOverrides), which hides a subclass's method; so the instance's own truncdiv is wrapped in
    turn (the vector form divides by `set(1, b, n)`: lanes past the loop's end by 1)."""

    def __new__(cls, *args, **kwargs):
        self = base.__new__(cls, *args, **kwargs)
        self.truncdiv = _checked_truncdiv(self.truncdiv)
        return self

    return __new__


class _VecOverrides(CppVecOverrides):
    __new__ = _with_checked_truncdiv(CppVecOverrides)


class _Tile2DOverrides(CppTile2DOverrides):
    __new__ = _with_checked_truncdiv(CppTile2DOverrides)


class _Kernel(CppKernel):
    overrides = _Overrides

    def codegen_conditions(self, code, prefix=None, var=None):
        # _torch213.py, 23: torch's method narrows a tile's tail block by the exact class.
        self.__class__ = CppKernel
        try:
            return CppKernel.codegen_conditions(self, code, prefix, var)
        finally:
            self.__class__ = _Kernel


class _VecKernel(CppVecKernel):
    overrides = _VecOverrides


class _Tile2DKernel(CppTile2DKernel, _VecKernel):  # a vector kernel of the proxy, as torch's is (_torch213.py, 22)
    overrides = _Tile2DOverrides


class _KernelProxy(CppKernelProxy):
    kernel_cls = _Kernel
    vec_kernel_cls = _VecKernel
    tile2d_kernel_cls = _Tile2DKernel


class OpenRegScheduling(CppScheduling):
    kernel_proxy_cls = _KernelProxy

    # Loop nests are generated (and their parallel depth decided, CppKernelProxy.decide_parallel_depth)
    # when a node is code-generated: openreg's threshold for small kernels applies there, to
    # pointwise kernels only. A reduction split over threads sums in another order, so reductions
    # keep the CPU's choice, and with it CPU Inductor's results bit for bit.
    def codegen_node(self, node):
        if node.is_reduction():
            return super().codegen_node(node)
        with config.patch({"cpp.min_chunk_size": openreg_config.min_chunk_size}):
            return super().codegen_node(node)

    def define_kernel(self, src_code, nodes, kernel_args=None):
        wrapper = V.graph.wrapper_code
        args = self.kernel_group.args if kernel_args is None else kernel_args
        arg_defs, call_args, arg_types = args.cpp_argdefs()
        host = [t.endswith("*") and _is_host_scalar(c) for c, t in zip(call_args, arg_types, strict=True)]
        # The wrapper's one table of kernels by source is shared with CPU Inductor's kernels of the
        # graph: a CPU kernel of the same source has another calling convention (no stream), and
        # the launcher reads host scalars on the host. Keyed by both, a kernel is reused only with
        # its own launcher (a CPU and an openreg `x.sin() * 2` in one graph called each other's).
        key = "openreg launcher, host scalars " + "".join("1" if h else "0" for h in host) + "\n" + src_code
        if key in wrapper.src_to_kernel:
            return wrapper.src_to_kernel[key]
        fused = get_fused_kernel_name(nodes, config.cpp.descriptive_names) if config.cpp.descriptive_names else ""
        kernel_name = "_".join(["openreg", fused, wrapper.next_kernel_suffix()])
        wrapper.src_to_kernel[key] = kernel_name
        # The C++ wrapper compiles every kernel into its own translation unit: names must be unique.
        names = dict(body=f"{kernel_name}_body", entry=kernel_name, namespace=f"{kernel_name}_launch")
        if not V.graph.cpp_wrapper:
            names = {}
        body = src_code.replace(str(Placeholder.KERNEL_NAME), names.get("body", launch.KERNEL_BODY))
        body = body.replace(str(Placeholder.DESCRIPTIVE_NAME), kernel_name).replace("#pragma CMT", "//")
        body = _torch213.fix_masked_index_asserts(body)
        body = launch.with_checked_truncdiv(body)
        body = launch.catch_in_parallel_regions(launch.one_division_flag_user_at_a_time(body))
        source = body + launch.launcher_source(kernel_name, arg_defs, arg_types, host, **names)
        if V.graph.cpp_wrapper:
            wrapper.define_kernel(kernel_name, source, gpu=False)
            return kernel_name
        argtypes = ["uintptr_t", *arg_types]
        wrapper.define_kernel(kernel_name, f"openreg_kernel(async_compile, {argtypes!r}, r'''\n{source}''')", gpu=False)
        return kernel_name
