// Sparse layouts on openreg (OpenRegSparse.cpp): what the generic path needs to run CPU sparse
// kernels on the device and to bring sparse results back.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

#include "OpenRegKernelTensor.h"

namespace c10::openreg::sparse {

// A compressed tensor: CSR, CSC, BSR or BSC (Tensor::is_sparse_csr() is true for CSR only).
inline bool is_compressed(const at::Tensor& t) {
  if (!t.defined()) return false;
  const c10::Layout l = t.layout();
  return l == c10::kSparseCsr || l == c10::kSparseCsc || l == c10::kSparseBsr || l == c10::kSparseBsc;
}
// A COO tensor or a compressed one.
inline bool is_sparse(const at::Tensor& t) { return t.defined() && (t.is_sparse() || is_compressed(t)); }

// Its member tensors: COO {indices, values}; compressed {compressed indices, plain indices, values}.
std::vector<at::Tensor> members(const at::Tensor& t);

// Device side: a CPU sparse tensor of the same structure over the kernel views of t's members.
at::Tensor kernel_tensor(const at::Tensor& t, KernelStorages* storages);

// Host side: a sparse tensor on `device` structured as `like` (layout, sizes, coalesced flag), made
// of `members` (device tensors shaped as like's members).
at::Tensor assemble(const at::Tensor& like, const std::vector<at::Tensor>& members, c10::Device device);

// Host side: the device sparse tensor `t` takes like's structure and `members` (an in-place sparse
// operator, whose CPU kernel may have given its argument new members of another nnz).
void reassign(const at::Tensor& t, const at::Tensor& like, const std::vector<at::Tensor>& members);

// Raises NotImplementedError naming the operator and the layout if the CPU has no sparse kernel
// for the call (the sparse path runs the CPU's kernels).
void check_cpu_kernel(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);

// Registers the sparse path for the operators whose CompositeExplicitAutograd kernel would
// outrank the sparse fallback although the CPU has a sparse kernel for them (values, sum, clone,
// ...); once, after every static registration. Returns how many.
size_t route_sparse_ops();

}  // namespace c10::openreg::sparse
