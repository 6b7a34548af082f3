#pragma once
// What the Python module calls of the native operator set (OpenRegNativeOps.cpp).
#include <ATen/core/Tensor.h>

namespace c10::openreg {

// openreg's empty_strided kernel on `device`, called directly: without the dispatcher and
// Python's argument parser. Compiled code allocates its buffers with it
// (torch_openreg._C._empty_strided), as CUDA's does with torch._C._dynamo.guards._empty_strided_cuda.
at::Tensor empty_strided_on(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype,
                            c10::DeviceIndex device);

}  // namespace c10::openreg
