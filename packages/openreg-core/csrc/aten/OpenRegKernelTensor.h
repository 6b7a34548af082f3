// Device side: CPU tensors that alias openreg device memory.
//
// Inside a kernel, an openreg tensor is turned into a CPU tensor over the
// kernel view of the same storage (same sizes, strides and storage offset),
// so CPU kernels read and write device memory in place, with no copy.
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/COW.h>

#include <type_traits>

#include "../runtime/OpenRegStream.h"
#include "openreg/runtime.hpp"

namespace c10::openreg {

// Host side, at launch, for each device tensor a kernel or copy takes:
// - refuses a tensor its storage no longer holds (the storage was resized smaller after the tensor
//   was made; untyped_storage().resize_(0) frees it, as FSDP does). Its kernel used to compute on
//   memory that is not the tensor's: a storage without memory gave it uninitialised host memory,
//   silently (CUDA faults, the CPU reads freed memory);
// - gives a copy-on-write storage (torch._lazy_clone) its own memory, as the CPU's and CUDA's
//   kernels do when they take a mutable pointer on the host. Kernels take the device pointer on
//   the host without that, so a write to a lazy clone used to write its original too. Reads copy
//   as well: which arguments a kernel writes is the kernel's business.
// Sparse and nested tensors: their members (sparse::members, nested::storage_as_tensor) go through
// this one by one.
inline const at::Tensor& ready_for_launch(const at::Tensor& t) {
  const auto& storage = t.storage();
  const size_t needed = at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize(), t.storage_offset());
  TORCH_CHECK(needed <= storage.nbytes() && (needed == 0 || storage.data() != nullptr), "an openreg tensor of size ",
              t.sizes(), " needs ", needed, " bytes of its storage, which holds ", storage.nbytes(),
              ": the storage was resized after the tensor was made (untyped_storage().resize_(0) frees it); "
              "resize the storage back before using the tensor");
  if (C10_UNLIKELY(c10::impl::cow::is_cow_data_ptr(storage.data_ptr()))) {
    // The copy's memory comes from the tensor's device, and the copy runs on that device's current
    // stream after the work queued there, without the host waiting (the allocator's copy_data).
    c10::DeviceGuard guard(storage.device());
    storage.unsafeGetStorageImpl()->mutable_data();  // materializes
  }
  return t;
}

// Host side, at launch: an openreg tensor over the same memory that does not
// own it. Kernels capture these, so a tensor the user drops while its kernel
// is still queued is freed at once, as on CUDA: the caching allocator only
// reuses the block for work queued later on the same stream. It counts no
// bytes toward the launch (OpenRegStream.h): its caller does.
inline at::Tensor launch_tensor(const at::Tensor& t) {
  if (!t.defined() || !t.is_privateuseone()) return t;
  ready_for_launch(t);
  const auto& storage = t.storage();
  c10::Storage alias(c10::Storage::use_byte_size_t(), storage.nbytes(),
                     c10::DataPtr(const_cast<void*>(storage.data()), storage.device()), /*allocator=*/nullptr,
                     /*resizable=*/false);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(alias), t.key_set(), t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return out;
}

// Device side: the CPU storages of one launch's kernel tensors, one per device
// storage, so that tensors sharing device memory share a CPU storage too. The
// CPU kernels' own aliasing checks (an in-place or out= op whose input overlaps
// its output raises) compare storages: with a storage per tensor they would
// pass, and the kernel would read what it had already overwritten.
class KernelStorages {
 public:
  // A CPU storage over `nbytes` of kernel-view memory at `base`, which it does not own. It is
  // resizable with the CPU allocator (see KernelTensorArg::materialize).
  static c10::Storage alias(void* base, size_t nbytes) {
    return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(base, c10::Device(c10::kCPU)),
                        c10::GetCPUAllocator(), /*resizable=*/true);
  }

  c10::Storage get(const void* device_storage, void* base, size_t nbytes) {
    for (const auto& [key, storage] : seen_)
      if (key == device_storage) return storage;
    return seen_.emplace_back(device_storage, alias(base, nbytes)).second;
  }

 private:
  c10::SmallVector<std::pair<const void*, c10::Storage>, 4> seen_;
};

// Host side, at launch: what a kernel needs to see one device tensor (its
// geometry and memory), without owning the memory and without allocating:
// cheaper than launch_tensor() for the common case of a plain tensor argument.
struct KernelTensorArg {
  const void* storage;
  size_t nbytes;
  caffe2::TypeMeta dtype;
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t offset;
  bool conj, neg;       // lazily conjugated / negated views stay so on the device
  LaunchBytes counted;  // sizes the launch's thread team (OpenRegStream.h)

  // uncounted: for a tensor no launch takes (made on the device side, kernel_tensor below).
  enum Uncounted { uncounted };
  // Readied (ready_for_launch) before the memory is taken.
  explicit KernelTensorArg(const at::Tensor& t) : KernelTensorArg(ready_for_launch(t), uncounted) {
    counted = LaunchBytes(t.nbytes());
  }
  KernelTensorArg(const at::Tensor& t, Uncounted)
      : storage(t.storage().data()),
        nbytes(t.storage().nbytes()),
        dtype(t.dtype()),
        sizes(t.sizes().begin(), t.sizes().end()),
        strides(t.strides().begin(), t.strides().end()),
        offset(t.storage_offset()),
        conj(t.is_conj()),
        neg(t.is_neg()) {}

  // Device side: the CPU tensor over the kernel view. Its storage is
  // resizable with the CPU allocator: a CPU out= kernel that reallocates its
  // output writes to host memory, and the generic path then copies the result
  // into the device output (see land() in OpenRegFallback.cpp). With `storages`,
  // tensors of one launch that share device memory share their CPU storage.
  at::Tensor materialize(KernelStorages* storages = nullptr) const {
    void* base = ::openreg::kernel_pointer(storage);
    if (base == nullptr) return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype).device(c10::kCPU));
    c10::Storage alias =
        storages != nullptr ? storages->get(storage, base, nbytes) : KernelStorages::alias(base, nbytes);
    auto out =
        at::detail::make_tensor<c10::TensorImpl>(std::move(alias), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
    out.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
    out._set_conj(conj);
    out._set_neg(neg);
    return out;
  }
};
// Moved, not copied, when a vector of them grows: a copy would not carry the count (LaunchBytes).
static_assert(std::is_nothrow_move_constructible_v<KernelTensorArg>);

// Device side: the CPU tensor over the kernel view of an openreg tensor
// (other tensors are returned as they are).
inline at::Tensor kernel_tensor(const at::Tensor& t, KernelStorages* storages = nullptr) {
  if (!t.defined() || !t.is_privateuseone()) return t;
  return KernelTensorArg(t, KernelTensorArg::uncounted).materialize(storages);
}

}  // namespace c10::openreg
