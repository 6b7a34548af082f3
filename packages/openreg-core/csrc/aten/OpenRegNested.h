// Nested tensors (strided layout) on openreg (OpenRegNested.cpp): what the generic path needs to
// run the CPU's nested kernels on the device and to bring nested results back.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstddef>

#include "OpenRegKernelTensor.h"

namespace c10::openreg::nested {

inline bool is_nested(const at::Tensor& t) { return t.defined() && t.is_nested(); }

// The whole storage of nested tensor `t` as a 1-D tensor of its dtype (on t's device).
at::Tensor storage_as_tensor(const at::Tensor& t);

// Device side: a CPU nested tensor with t's nested sizes, strides and offsets over the kernel
// view of t's storage.
at::Tensor kernel_tensor(const at::Tensor& t, KernelStorages* storages);

// Device side: nested result `t` of a CPU kernel with metadata of its own (the kernel may have
// taken an argument's, a kernel view of device memory, as its nested sizes).
at::Tensor owning_metadata(const at::Tensor& t);

// Host side: a nested tensor on `device` with host's structure over `buffer` (a 1-D device tensor
// as large as host's storage, which the caller fills from storage_as_tensor(host)).
at::Tensor assemble(const at::Tensor& host, const at::Tensor& buffer);

// Host side: a nested view of device nested tensor `base` with the structure of `host` (a result
// of the CPU kernel that shares the kernel view of base's storage).
at::Tensor view_of(const at::Tensor& base, const at::Tensor& host);

// Raises NotImplementedError naming the operator if the CPU has no nested kernel for it.
void check_cpu_kernel(const c10::OperatorHandle& op);

// Registers the nested path for the operators whose CPU nested kernel sits beside a composite kernel
// (which would outrank the fallback); once, after every static registration. Returns how many.
size_t route_nested_ops();

}  // namespace c10::openreg::nested
