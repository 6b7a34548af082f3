"""C shims for openreg's fallback operators in C++ wrapper code, generated from torch's own lists.

Code written by Inductor's C++ wrapper (``cpp_wrapper=True``, and AOTInductor) calls a fallback
operator through a C function ``aoti_torch_<device>_<op>`` (``CppWrapperCpu.get_c_shim_func_name``)
for every operator in ``torchgen.aoti.fallback_ops.inductor_fallback_ops`` (about 180). libtorch
has them for cpu/cuda/xpu/mps only. openreg's are generated here, with torchgen's own shim
generator (``torchgen.gen_aoti_c_shim.gen_declaration_and_definition``) over the schemas in the
``native_functions.yaml`` that torch ships (``torchgen/packaged``); each calls the operator's
``at::`` function, i.e. the dispatcher, which runs openreg's kernel on the current stream.

Nothing is compiled ahead of time: the wrapper emits the definitions of the shims a graph uses
into its own source (``cpp_wrapper.OpenRegCppWrapper``), so a graph compiles only what it calls.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

DEVICE = "openreg"


@dataclass(frozen=True)
class Shim:
    op: str  # "aten.mm.out"
    include: str  # the operator's ATen header
    definition: str  # C++: every version of the shim function, static (local to the wrapper)


@functools.cache
def all_shims() -> dict[str, Shim]:
    """Every ``aoti_torch_openreg_*`` function name (with its ``_vN`` versions) -> its shim."""
    import torchgen
    from torchgen.aoti.fallback_ops import inductor_fallback_ops
    from torchgen.context import native_function_manager
    from torchgen.gen import parse_native_yaml
    from torchgen.gen_aoti_c_shim import (
        gen_declaration_and_definition,
        gen_static_dispatch_backend_call,
        get_fallback_op_name,
    )
    from torchgen.model import Variant

    native = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    parsed = parse_native_yaml(os.path.join(native, "native_functions.yaml"), os.path.join(native, "tags.yaml"))
    shims: dict[str, Shim] = {}
    for func in parsed.native_functions:
        op = get_fallback_op_name(func)
        if op not in inductor_fallback_ops:
            continue
        with native_function_manager(func):
            backend_call = gen_static_dispatch_backend_call(func, None)  # at::<op>: the dispatcher
            if Variant.function not in func.variants and not backend_call.startswith("at::symint::"):
                # A method-only operator (view.dtype, bernoulli_, set_) has no at:: function: its
                # method, on `self`, the first argument (the method's const: in-place methods are).
                method = backend_call.removeprefix("at::")
                backend_call = (
                    "[](const at::Tensor& self, auto&&... args) -> decltype(auto) "
                    f"{{ return self.{method}(std::forward<decltype(args)>(args)...); }}"
                )
            try:
                declarations, definition = gen_declaration_and_definition(
                    func.func, DEVICE, backend_call, inductor_fallback_ops[op]
                )
            except NotImplementedError:  # an argument type the C ABI cannot express
                continue
        definition = definition.replace("\nAOTITorchError aoti_torch_", "\nstatic AOTITorchError aoti_torch_")
        shim = Shim(op, f"#include <ATen/ops/{func.root_name}.h>", definition)
        for line in declarations.splitlines():
            if line.startswith("AOTI_TORCH_EXPORT AOTITorchError "):
                name = line.split("AOTITorchError ", 1)[1].split("(", 1)[0]
                shims[name] = shim
    return shims


def shim_for(function_name: str) -> Shim | None:
    return all_shims().get(function_name)
