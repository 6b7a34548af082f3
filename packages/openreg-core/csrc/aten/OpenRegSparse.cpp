// Sparse layouts on openreg: COO tensors (dispatch key SparsePrivateUse1) and compressed ones
// (CSR, CSC, BSR, BSC: SparseCsrPrivateUse1). A sparse openreg tensor is a SparseTensorImpl or a
// SparseCsrTensorImpl whose member tensors (indices and values; compressed indices, plain
// indices and values) are ordinary dense openreg tensors: they live in device memory.
//
// 1. Structure operators (construction, the member accessors, nnz, dimensions, the coalesced
//    flag, resizes, copies) only read or set the TensorImpl and call other operators on the
//    members: the CPU's kernels for them are device-generic (the same function serves SparseCPU
//    and SparseCUDA). openreg registers them by redispatching to the CPU's sparse key: they run
//    on the host, with no kernel and no wait, and their member operators reach openreg's dense
//    paths.
// 2. Every other operator with a sparse openreg argument takes the sparse path, the boxed fallback
//    of both keys (sparse_kernel in OpenRegFallback.cpp): the generic path's synchronous branch.
//    On the device each sparse argument becomes a CPU sparse tensor over the kernel views of its
//    members (kernel_tensor), the CPU's sparse kernel runs, and the host gets sparse results back
//    as device sparse tensors whose members were copied into device memory on the device
//    (assemble); an in-place operator's argument takes its new members (reassign). It waits for
//    the device, as CUDA's sparse operators mostly do: a result's nnz depends on the data.
// 3. Dense operators with a sparse result (to_sparse of a dense tensor) take the dense generic
//    path's synchronous branch, which brings sparse results back the same way.
// 4. Host code of those device-generic operators may call a DispatchStub for the members' device
//    directly, bypassing the dispatcher: flatten_indices_stub (torch.sparse_coo_tensor(...,
//    is_coalesced=True) checks its indices with it under torch.sparse.check_sparse_tensor_invariants)
//    gets an openreg entry below, made of dense operators on the device; without it, an internal
//    assert ("DispatchStub: missing kernel for openreg").
#include "OpenRegSparse.h"

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/stack.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/ops/_sparse_compressed_tensor_unsafe.h>
#include <ATen/ops/_sparse_coo_tensor_unsafe.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "OpenRegFallback.h"

namespace c10::openreg::sparse {

namespace {

at::SparseTensorImpl* coo(const at::Tensor& t) { return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl()); }
at::SparseCsrTensorImpl* compressed(const at::Tensor& t) {
  return static_cast<at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
}

// The layout as Python spells it.
const char* layout_name(c10::Layout layout) {
  switch (layout) {
    case c10::kSparse:
      return "torch.sparse_coo";
    case c10::kSparseCsr:
      return "torch.sparse_csr";
    case c10::kSparseCsc:
      return "torch.sparse_csc";
    case c10::kSparseBsr:
      return "torch.sparse_bsr";
    case c10::kSparseBsc:
      return "torch.sparse_bsc";
    default:
      return "torch.strided";
  }
}

// A structure operator: the CPU's sparse kernel, device-generic, run on the openreg tensors
// themselves, under a guard of the operator's device, as CUDA's generated kernels have (the CPU's
// kernel makes the members on the current device): its `device` argument, else its first tensor's.
template <c10::DispatchKey CPUKey>
void on_cpu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::optional<c10::Device> device;
  for (const c10::IValue& v : torch::jit::last(*stack, n))
    if (v.isDevice()) {
      device = v.toDevice();
      break;
    }
  if (!device)
    for (const c10::IValue& v : torch::jit::last(*stack, n))
      if (v.isTensor() && v.toTensor().defined()) {
        device = v.toTensor().device();
        break;
      }
  // A COO tensor's members on two devices: ATen checks this only for CUDA's (SparseTensorImpl's
  // set_indices_and_values_unsafe), and an internal assert ("please report a bug") fired instead.
  if (op.schema().name() == "aten::_sparse_coo_tensor_with_dims_and_tensors") {
    const at::Tensor& idx = torch::jit::peek(*stack, *op.schema().argumentIndexWithName("indices"), n).toTensor();
    const at::Tensor& val = torch::jit::peek(*stack, *op.schema().argumentIndexWithName("values"), n).toTensor();
    TORCH_CHECK(idx.device() == val.device(), "device of indices (", idx.device(), ") must match device of values (",
                val.device(), ")");
  }
  c10::OptionalDeviceGuard guard;
  if (device && device->is_privateuseone() && device->has_index()) guard.reset_device(*device);
  op.redispatchBoxed(c10::DispatchKeySet(CPUKey), stack);
}

}  // namespace

std::vector<at::Tensor> members(const at::Tensor& t) {
  if (t.is_sparse()) return {coo(t)->indices(), coo(t)->values()};
  const auto* impl = compressed(t);
  return {impl->compressed_indices(), impl->plain_indices(), impl->values()};
}

at::Tensor kernel_tensor(const at::Tensor& t, KernelStorages* storages) {
  std::vector<at::Tensor> views = members(t);
  for (at::Tensor& m : views) m = c10::openreg::kernel_tensor(m, storages);
  at::Tensor out = assemble(t, views, c10::Device(c10::kCPU));
  // Some CPU sparse kernels ask (sparse.mm with reduce="amax" computes the argmax its backward
  // needs only for an input that requires grad); they run below autograd, so nothing is recorded.
  if (t.requires_grad()) out.set_requires_grad(true);
  return out;
}

at::Tensor assemble(const at::Tensor& like, const std::vector<at::Tensor>& members, c10::Device device) {
  const auto options = like.options().device(device);
  if (like.is_sparse())
    return at::_sparse_coo_tensor_unsafe(members[0], members[1], like.sizes(), options, coo(like)->coalesced());
  return at::_sparse_compressed_tensor_unsafe(members[0], members[1], members[2], like.sizes(), options);
}

void reassign(const at::Tensor& t, const at::Tensor& like, const std::vector<at::Tensor>& members) {
  if (t.is_sparse()) {
    auto* impl = coo(t);
    impl->raw_resize_(coo(like)->sparse_dim(), coo(like)->dense_dim(), like.sizes());
    impl->set_indices_and_values_unsafe(members[0], members[1]);
    impl->set_coalesced(coo(like)->coalesced());
  } else {
    compressed(t)->set_member_tensors(members[0], members[1], members[2], like.sizes());
  }
}

void check_cpu_kernel(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Layout> layout;  // the layout that selects the kernel: compressed over COO, as in dispatch
  for (const c10::IValue& v : args) {
    auto note = [&](const at::Tensor& t) {
      if (is_sparse(t) && (!layout || is_compressed(t))) layout = t.layout();
    };
    if (v.isTensor())
      note(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) note(t);
  }
  if (!layout) return;  // a factory that asked for a sparse layout: the CPU decides
  // c10d's operators hand their tensors to a process group: on the sparse path's CPU copies of the
  // members, a collective would reduce the copies and leave the openreg tensor as it was.
  TORCH_CHECK_NOT_IMPLEMENTED(op.schema().name().rfind("c10d::", 0) != 0, "'", op.operator_name(),
                              "' is not supported for ", layout_name(*layout),
                              " tensors on openreg: its process groups take dense tensors (use to_dense())");
  const auto key = *layout == c10::kSparse ? c10::DispatchKey::SparseCPU : c10::DispatchKey::SparseCsrCPU;
  TORCH_CHECK_NOT_IMPLEMENTED(
      op.hasKernelForDispatchKey(key) || op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd), "'",
      op.operator_name(), "' is not supported for ", layout_name(*layout),
      " tensors on openreg: openreg runs the CPU's sparse kernels, and the CPU has no ", key,
      " kernel for this operator");
}

size_t route_sparse_ops() {
  static size_t routed = [] {
    static auto* coo_lib =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
    static auto* csr_lib =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::SparseCsrPrivateUse1, __FILE__, __LINE__);
    const std::tuple<c10::DispatchKey, c10::DispatchKey, torch::Library*> keys[] = {
        {c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1, coo_lib},
        {c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1, csr_lib}};
    size_t n = 0;
    for (const auto& [cpu_key, own_key, lib] : keys)
      for (const std::string& op : shadowed_by_composite(cpu_key, own_key,
                                                         {c10::DispatchKey::CompositeExplicitAutograd,
                                                          c10::DispatchKey::CompositeExplicitAutogradNonFunctional})) {
        lib->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&sparse_kernel>());
        ++n;
      }
    return n;
  }();
  return routed;
}

// The row-major linear index of each indices column: what the CPU's and CUDA's kernels of
// flatten_indices_stub compute (`size` is the sparse dimensions' sizes), as queued device work.
at::Tensor flatten_indices(const at::Tensor& indices, c10::IntArrayRef size) {
  at::Tensor flat = at::zeros({indices.size(1)}, indices.options().dtype(at::kLong));
  int64_t stride = 1;
  for (int64_t d = indices.size(0) - 1; d >= 0; --d) {
    flat.add_(indices.select(0, d), stride);
    stride *= size[d];
  }
  return flat;
}

}  // namespace c10::openreg::sparse

// torch 2.13 does not install the header that declares this stub
// (aten/src/ATen/native/sparse/FlattenIndicesCommon.h): the same declaration names the same object.
namespace at::native {
using flatten_indices_fn = Tensor (*)(const Tensor& indices, IntArrayRef size);
DECLARE_DISPATCH(flatten_indices_fn, flatten_indices_stub)
REGISTER_PRIVATEUSE1_DISPATCH(flatten_indices_stub, &c10::openreg::sparse::flatten_indices)
}  // namespace at::native

// 1. Structure operators, on the host.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  for (const char* op :
       {"empty.memory_format", "_sparse_coo_tensor_with_dims", "_sparse_coo_tensor_with_dims_and_tensors", "_indices",
        "_values", "indices", "values", "_nnz", "sparse_dim", "dense_dim", "_dimI", "_dimV", "is_coalesced",
        "_coalesced_", "sparse_resize_", "sparse_resize_and_clear_", "copy_", "copy_sparse_to_sparse_"})
    m.impl(
        op,
        torch::CppFunction::makeFromBoxedFunction<&c10::openreg::sparse::on_cpu_kernel<c10::DispatchKey::SparseCPU>>());
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  for (const char* op : {"empty.memory_format", "values", "crow_indices", "col_indices", "ccol_indices", "row_indices",
                         "_nnz", "sparse_dim", "dense_dim", "copy_"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<
                   &c10::openreg::sparse::on_cpu_kernel<c10::DispatchKey::SparseCsrCPU>>());
}

// 2. Every other operator with a sparse openreg argument: the sparse path.
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&c10::openreg::sparse_kernel>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&c10::openreg::sparse_kernel>());
}
