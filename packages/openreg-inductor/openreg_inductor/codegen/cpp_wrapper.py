"""The C++ wrapper for openreg graphs (``torch.compile(..., options={"cpp_wrapper": True})``).

Inductor's ``CppWrapperCpu`` writes the graph's ``call`` in C++ and compiles it, with the kernels,
into one library. For openreg it differs from the CPU's in five places:

- the header: the CPU's wrapper header (the kernels are Inductor's CPU C++), core's C ABI
  ``<torch_openreg/runtime/OpenRegCApi.h>`` and a small prelude (``PRELUDE``): a device guard
  for ``DeviceOpOverrides.cpp_aoti_device_guard`` and the current-stream accessor;
- kernel calls: ``openreg_fused_..._0(openreg_inductor::current_stream(0), ptrs...)``: the launcher
  (``launch.launcher_source``, with names unique in the translation unit) enqueues the kernel on
  the calling thread's current stream (``openregCurrentStream``, core's C ABI);
- kernel sources: every C++ kernel of the library, CPU Inductor's too, shares one integer-division
  flag; each goes through ``launch.one_division_flag_user_at_a_time`` (``define_kernel``);
- fallback operators: their ``aoti_torch_openreg_*`` C shims are generated from torch's schemas
  (``shims``) and their definitions written into the wrapper's source, once per shim used;
- building: as CPU code (the CPU's flags and -O3, as for the Python wrapper's kernels), linked to
  ``libopenreg`` and ``libtorch_openreg``.

A stream context inside the compiled region is refused at code generation (``STREAMS_UNSUPPORTED``):
Inductor's C++ wrappers have no code for it.

Buffers are allocated with ``aoti_torch_empty_strided`` on device type PrivateUse1 (the plugin maps
"openreg" to ``at::kPrivateUse1`` in ``torch._inductor.codegen.cpp_utils.DEVICE_TO_ATEN``).
"""

from __future__ import annotations

import re

from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.virtualized import V
from torch_openreg.utils.cpp_extension import link_flag

from .. import _torch213
from . import launch, shims

DEVICE = "openreg"
_SHIM_CALL = re.compile(rf"\baoti_torch_{DEVICE}_\w+")

PRELUDE = r"""
#include <torch_openreg/runtime/OpenRegCApi.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
using namespace torch::aot_inductor;

namespace openreg_inductor {
// The device guard generated code enters (DeviceOpOverrides.cpp_aoti_device_guard).
class DeviceGuard {
 public:
  explicit DeviceGuard(int32_t index) : guard_(c10::Device(c10::DeviceType::PrivateUse1, index)) {}
  void set_index(int32_t index) { guard_.set_index(static_cast<c10::DeviceIndex>(index)); }

 private:
  c10::DeviceGuard guard_;
};

// AOTInductor's model entry guards the stream it is given (DeviceOpOverrides.cpp_aoti_stream_guard).
// openreg kernels run on the calling thread's current stream: a given stream is not made current
// (core has no C ABI for that yet), only the device is.
class StreamGuard {
 public:
  StreamGuard(void* /*stream*/, int32_t index)
      : guard_(c10::Device(c10::DeviceType::PrivateUse1, index < 0 ? 0 : index)) {}

 private:
  c10::DeviceGuard guard_;
};

// The calling thread's current stream on `device`, as the launchers take it.
inline uintptr_t current_stream(int32_t device) { return reinterpret_cast<uintptr_t>(openregCurrentStream(device)); }
}  // namespace openreg_inductor
"""


STREAMS_UNSUPPORTED = (
    "openreg-inductor: cpp_wrapper=True does not support a stream context inside the compiled region "
    "(torch 2.13's C++ wrappers write it as Python); use the Python wrapper (the default) for this "
    "function, or enter the stream context around the compiled call, which the C++ wrapper follows"
)


class OpenRegCppWrapper(_torch213.WrapperFixes, CppWrapperCpu):
    def __init__(self):
        self.device = DEVICE
        super().__init__()
        self.needs_vec_isa = True  # the kernels are Inductor's CPU C++
        self._shims_defined: set[str] = set()
        for flag in (*launch.link_flags(), link_flag("torch_openreg")):
            self.external_kernel_libs.add(flag)

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        return OpenRegCppWrapper()

    def add_device_include(self, device: str) -> None:
        if device != DEVICE:
            return super().add_device_include(device)
        if device in self.included_devices:
            return
        super().add_device_include("cpu")
        self.included_devices.add(device)
        self.header.splice(PRELUDE)

    def codegen_device_guard_enter(self, device_idx, num_streams=1, stream_idx_to_user_obj_idx=None) -> None:
        if num_streams > 1:
            # Every C++ wrapper, CUDA's too, writes a stream context as the Python line `with stream1:`
            # and never fetches the stream (a Python object, get_external_object_by_index): the C++
            # would only fail to build, half a minute later.
            raise NotImplementedError(STREAMS_UNSUPPORTED)
        super().codegen_device_guard_enter(device_idx, num_streams, stream_idx_to_user_obj_idx)

    def define_kernel(self, kernel_name, kernel_body, metadata=None, gpu=True, cpp_definition=None):
        if not gpu:
            # The graph's CPU kernels share this library, and with it the openreg kernels' division
            # flag: they take its lock too (launch.one_division_flag_user_at_a_time, _DIVISION_LOCK).
            kernel_body = launch.one_division_flag_user_at_a_time(kernel_body)
        super().define_kernel(kernel_name, kernel_body, metadata, gpu, cpp_definition)

    def _generate_kernel_call_helper(
        self, kernel_name, call_args, *, device=None, triton=True, arg_types=None, **kwargs
    ):
        device = device or V.graph.get_current_device_or_throw()
        if triton or device.type != DEVICE:
            return super()._generate_kernel_call_helper(
                kernel_name, call_args, device=device, triton=triton, arg_types=arg_types, **kwargs
            )
        args = [f"openreg_inductor::current_stream({device.index or 0})"]
        for arg, arg_type in zip(call_args, arg_types, strict=True):
            is_pointer = isinstance(arg_type, str) and "*" in arg_type
            args.append(f"({arg_type})({arg}.data_ptr())" if is_pointer else str(arg))
        self.writeline(self.wrap_kernel_call(kernel_name, args))

    def _define_shim(self, name: str) -> None:
        """Writes the definition of the C shim `name` into the wrapper's source, once."""
        if name in self._shims_defined:
            return
        shim = shims.shim_for(name)
        if shim is None:
            raise NotImplementedError(f"openreg-inductor has no C shim {name}")
        self.add_device_include(DEVICE)
        self.header.splice(shim.include)
        self.header.splice(shim.definition)
        self._shims_defined.add(name)

    def generate_c_shim_extern_kernel_call(self, kernel, args, device, **kwargs) -> None:
        if device == DEVICE:
            self._define_shim(self.get_c_shim_func_name(kernel, device))
        super().generate_c_shim_extern_kernel_call(kernel, args, device, **kwargs)

    def generate_return(self, output_refs) -> None:
        super().generate_return(output_refs)
        # The graph's code is complete, its header not yet assembled. Some torch 2.13 paths write a
        # shim's call themselves, past generate_c_shim_extern_kernel_call: the scatter fallback
        # (CppWrapperCpu._generate_scatter_fallback), the in-place bernoulli fallback
        # (ir.InplaceBernoulliFallback.codegen) and dtype views (CppWrapperCpu.create_dtypeview_call).
        # Their shims were not defined, and the C++ failed to build. Every shim the code calls is.
        for buf in (self.prefix, self.wrapper_call, self.subgraph_definitions):
            for name in sorted(set(_SHIM_CALL.findall(buf.getvalue()))):
                self._define_shim(name)

    def _generate_end_jit(self, result) -> None:
        # Build the wrapper library as CPU code (CPU flags, -O3; Inductor builds other device types at -O1).
        self.device = "cpu"
        try:
            super()._generate_end_jit(result)
        finally:
            self.device = DEVICE
