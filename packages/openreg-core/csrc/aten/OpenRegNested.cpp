// Nested tensors (torch.nested, strided layout) on openreg: dispatch key NestedTensorPrivateUse1.
//
// A nested openreg tensor is a NestedTensorImpl whose storage is device memory; its nested sizes,
// strides and offsets are CPU tensors, as on CUDA. Creating one from openreg tensors needs no
// kernel of openreg's (the constructors are device-generic); every operator on one takes the
// nested path, the boxed fallback of NestedTensorPrivateUse1 (nested_kernel in
// OpenRegFallback.cpp): the generic path's synchronous branch. On the device each nested argument
// becomes a CPU nested tensor over the kernel view of its storage (kernel_tensor), the CPU's nested
// kernel runs, and the host gets nested results back as device nested tensors whose storage was
// copied into device memory on the device (assemble), or as views of their argument (view_of).
// Dense operators with a nested result (_nested_tensor_from_mask, which nn.TransformerEncoder's
// inference fast path calls) take the dense generic path's synchronous branch, which brings nested
// results back the same way. It waits for the device: a nested result's structure is data.
// Operators whose CPU nested kernel sits beside a composite one (linear, matmul: the composite would
// outrank the fallback and call sizes() on the nested tensor) are registered for the nested path
// one by one (route_nested_ops), as CUDA's are by name in native_functions.yaml.
#include "OpenRegNested.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/native_dropout_native.h>
#include <ATen/ops/ones_like_native.h>
#include <torch/library.h>

#include <string>

#include "OpenRegFallback.h"

namespace c10::openreg::nested {

at::Tensor storage_as_tensor(const at::Tensor& t) {
  return at::native::get_nested_tensor_impl(t)->get_unsafe_storage_as_tensor();
}

at::Tensor kernel_tensor(const at::Tensor& t, KernelStorages* storages) {
  const auto* impl = at::native::get_nested_tensor_impl(t);
  at::Tensor buffer = c10::openreg::kernel_tensor(impl->get_unsafe_storage_as_tensor(), storages);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(buffer, impl->get_nested_sizes(),
                                                               impl->get_nested_strides(), impl->get_storage_offsets());
}

at::Tensor assemble(const at::Tensor& host, const at::Tensor& buffer) {
  const auto* impl = at::native::get_nested_tensor_impl(host);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(buffer, impl->get_nested_sizes(),
                                                               impl->get_nested_strides(), impl->get_storage_offsets());
}

at::Tensor view_of(const at::Tensor& base, const at::Tensor& host) {
  const auto* impl = at::native::get_nested_tensor_impl(host);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(c10::TensorImpl::VIEW, base, impl->get_nested_sizes(),
                                                               impl->get_nested_strides(), impl->get_storage_offsets());
}

at::Tensor owning_metadata(const at::Tensor& t) {
  const auto* impl = at::native::get_nested_tensor_impl(t);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      impl->get_unsafe_storage_as_tensor(), impl->get_nested_sizes().clone(), impl->get_nested_strides().clone(),
      impl->get_storage_offsets().clone());
}

void check_cpu_kernel(const c10::OperatorHandle& op) {
  TORCH_CHECK_NOT_IMPLEMENTED(op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU), "'", op.operator_name(),
                              "' is not supported for nested tensors on openreg: openreg runs the CPU's nested "
                              "kernels, and the CPU has no NestedTensorCPU kernel for this operator");
}

size_t route_nested_ops() {
  static size_t routed = [] {
    static auto* lib =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::NestedTensorPrivateUse1, __FILE__, __LINE__);
    const auto ops =
        shadowed_by_composite(c10::DispatchKey::NestedTensorCPU, c10::DispatchKey::NestedTensorPrivateUse1,
                              {c10::DispatchKey::CompositeImplicitAutograd, c10::DispatchKey::CompositeExplicitAutograd,
                               c10::DispatchKey::CompositeExplicitAutogradNonFunctional});
    for (const std::string& op : ops)
      lib->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&c10::openreg::nested_kernel>());
    return ops.size();
  }();
  return routed;
}

namespace {
// The metadata accessors read the CPU tensors a nested tensor carries: on the host, with no kernel,
// returning CPU tensors as CUDA's do (on the nested path their results became device tensors, which
// the CPU kernels that take sizes, such as _nested_from_padded, then kept as kernel views).
void metadata_on_host(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU), stack);
}
}  // namespace

}  // namespace c10::openreg::nested

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  for (const char* op : {"_nested_tensor_size", "_nested_tensor_strides", "_nested_tensor_storage_offsets"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&c10::openreg::nested::metadata_on_host>());
  // The host-side nested kernel CUDA registers too: dense native_dropout of the buffer, which is
  // openreg's (its mask from openreg's generator). On the nested path the CPU's ran on the kernel
  // view and drew from the CPU's global generator (its schema has no Generator argument to
  // substitute): torch.openreg.manual_seed did not reproduce the mask, and the device consumed
  // the host's random stream.
  m.impl("native_dropout", TORCH_FN(at::native::native_dropout_nested));
  // Host-side too, as CUDA's (device-generic ATen functions): a copy to another device or dtype is
  // an empty nested tensor of the target's options plus a copy of the buffer, a dense tensor that
  // openreg's copy moves between devices. On the nested path the result stayed on the source's
  // device (x.to("openreg:1"), empty_like(x, device="cpu"), ones_like(x, device="openreg:1")), and
  // a copy_ between two devices was refused as a mix of devices.
  m.impl("_to_copy", TORCH_FN(at::native::_to_copy_nested));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_nested));
  m.impl("ones_like", TORCH_FN(at::native::ones_like));
  m.impl("copy_", TORCH_FN(at::native::copy_nested_));
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&c10::openreg::nested_kernel>());
}
