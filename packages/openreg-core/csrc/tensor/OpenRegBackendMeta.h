// Backend metadata on openreg tensors: what a vendor attaches to a tensor
// beyond sizes, strides and dtype (e.g. the device memory format a kernel
// chose), and how it travels with the tensor.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <optional>

namespace c10::openreg {

// Two example fields. openreg's kernels do not read them; they stand for the
// data a real backend keeps here (Ascend keeps its storage format, for one).
struct OpenRegBackendMeta final : c10::BackendMeta {
  static constexpr int64_t kMaxFormat = 15;  // serialised as 4 bits

  int64_t format = 0;       // a device memory-format id, 0..kMaxFormat
  bool compressed = false;  // a flag the device may set on its storage

  OpenRegBackendMeta(int64_t format, bool compressed) : format(format), compressed(compressed) {}

  // TensorImpl copies its extra metadata with clone(): the default shares one
  // object between tensors; each copy of an openreg tensor gets its own.
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>&) const override {
    return c10::make_intrusive<OpenRegBackendMeta>(format, compressed);
  }
};

// Sets (replaces) the metadata of an openreg tensor; checks the device and the format's range.
void set_backend_meta(const at::Tensor& t, int64_t format, bool compressed);
// The metadata of `t`, or nothing when it has none (or is not an openreg tensor's impl).
const OpenRegBackendMeta* get_backend_meta(const at::Tensor& t);
void clear_backend_meta(const at::Tensor& t);

}  // namespace c10::openreg
