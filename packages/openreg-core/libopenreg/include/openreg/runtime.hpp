// C++ conveniences over the C API: launch a lambda as a kernel, and
// translate pointers inside it. Header-only so that the C ABI stays the seam.
#pragma once

#include <exception>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "openreg/runtime.h"

namespace openreg {

// Launches `fn` (a callable taking no arguments) on `stream`. An exception
// thrown by `fn` becomes the kernel's failure message.
template <typename F>
orStatus launch(orStream_t stream, const char* name, F&& fn) {
  using Fn = std::decay_t<F>;
  auto* boxed = new (std::nothrow) Fn(std::forward<F>(fn));
  if (boxed == nullptr) return orErrorMemoryAllocation;
  return orLaunchKernel(
      stream, name,
      [](void* args) -> orStatus {
        try {
          (*static_cast<Fn*>(args))();
          return orSuccess;
        } catch (const std::exception& e) {
          return orKernelFail(e.what());
        } catch (...) {
          return orKernelFail("unknown C++ exception");
        }
      },
      boxed, [](void* args) { delete static_cast<Fn*>(args); });
}

// Device side: the kernel-usable address of a device pointer (nullptr for a
// null pointer). Throws std::runtime_error when called outside a kernel or
// with a pointer that is not device memory.
inline void* kernel_pointer(const void* dev_ptr) {
  if (dev_ptr == nullptr) return nullptr;
  void* out = nullptr;
  if (orKernelPointer(dev_ptr, &out) != orSuccess) throw std::runtime_error(orGetLastErrorMessage());
  return out;
}

template <typename T>
T* kernel_pointer(T* dev_ptr) {
  return static_cast<T*>(kernel_pointer(static_cast<const void*>(dev_ptr)));
}

}  // namespace openreg
