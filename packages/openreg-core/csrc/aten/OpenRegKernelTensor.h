// Device side: CPU tensors that alias openreg device memory.
//
// Inside a kernel, an openreg tensor is turned into a CPU tensor over the
// kernel view of the same storage (same sizes, strides and storage offset),
// so CPU kernels read and write device memory in place, with no copy.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include "openreg/runtime.hpp"

namespace c10::openreg {

inline at::Tensor kernel_tensor(const at::Tensor& t) {
  if (!t.defined() || !t.is_privateuseone()) return t;
  const auto& storage = t.storage();
  void* base = ::openreg::kernel_pointer(storage.data());
  if (base == nullptr) return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU));
  return at::for_blob(base, t.sizes())
      .strides(t.strides())
      .storage_offset(t.storage_offset())
      .context(nullptr, [](void*) {})
      .options(t.options().device(c10::kCPU))
      .make_tensor();
}

}  // namespace c10::openreg
