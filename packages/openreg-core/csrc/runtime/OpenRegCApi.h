// The PyTorch layer's C ABI: what code that cannot include C++/c10 headers needs from the layer
// (kernels generated at run time by openreg-inductor, ctypes). The device runtime's own C API is
// openreg/runtime.h; this adds only what lives in the PyTorch layer: the current stream, which is
// per host thread and per device (torch.openreg.set_stream / stream contexts).
#pragma once

#include "openreg/runtime.h"

#if defined(_WIN32)
#define OPENREG_TORCH_C_API  // exported with every symbol of the library (CMakeLists.txt)
#else
#define OPENREG_TORCH_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

// The runtime handle of the calling thread's current stream on `device` (-1: the current device),
// for orLaunchKernel; NULL (never a valid handle here: it is resolved) if `device` is not a device.
OPENREG_TORCH_C_API orStream_t openregCurrentStream(int device);

#ifdef __cplusplus
}
#endif
