"""Python snippets Inductor's wrapper writes for openreg (``register_device_op_overrides``)."""

from __future__ import annotations

from torch._inductor.codegen.common import DeviceOpOverrides


class OpenRegDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name: str) -> str:
        # torch.openreg.current_raw_stream's binding: the wrapper passes a device index.
        return f"from torch_openreg._C import _current_raw_stream as {name}"

    def set_device(self, device_idx: int) -> str:
        return "pass  # the device guard above set the device"

    def synchronize(self) -> str:
        return "torch.openreg.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.openreg._DeviceGuard({device_idx})"

    def current_stream(self) -> str:
        return "torch.openreg.current_stream()"

    def stream_handle(self, stream_name: str) -> str:
        return f"{stream_name}.openreg_stream"

    def cpp_aoti_device_guard(self) -> str:
        return "openreg_inductor::DeviceGuard"  # defined in cpp_wrapper.PRELUDE

    def cpp_aoti_stream_guard(self) -> str:
        return "openreg_inductor::StreamGuard"  # AOTInductor's entry; defined in cpp_wrapper.PRELUDE

    def cpp_kernel_type(self) -> str:
        return "void*"  # AOTInductor's kernel table; openreg kernels are called directly, as the CPU's
