// Turning runtime statuses into PyTorch errors.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include "openreg/runtime.h"

// Checks an orStatus; on failure raises with the runtime's detailed message
// (it names the device, sizes and limits). Out of memory becomes
// torch.OutOfMemoryError, anything else RuntimeError.
#define OPENREG_CHECK(expr)                                                                                \
  do {                                                                                                     \
    orStatus __or_status = (expr);                                                                         \
    if (C10_UNLIKELY(__or_status != orSuccess)) {                                                          \
      TORCH_CHECK_WITH(OutOfMemoryError, __or_status != orErrorMemoryAllocation, orGetLastErrorMessage()); \
      TORCH_CHECK(false, orGetLastErrorMessage());                                                         \
    }                                                                                                      \
  } while (0)

namespace c10::openreg {

// The error CPU and CUDA give when an operator's tensors are on two devices; `op` names the operator.
template <typename Op>
void check_same_device(const c10::Device& a, const c10::Device& b, const Op& op) {
  TORCH_CHECK(a == b, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ", b,
              "! (in ", op, ")");
}

}  // namespace c10::openreg
