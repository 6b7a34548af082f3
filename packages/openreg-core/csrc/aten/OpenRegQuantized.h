// Quantized tensors on openreg (QuantizedPrivateUse1): what core provides
// (OpenRegQuantized.cpp) and the one error every unsupported path raises.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/ScalarType.h>

namespace c10::openreg {

// Raises NotImplementedError: `op` has no openreg kernel for quantized tensors of `dtype`. The
// message names the operator, says whether openreg-quant (which provides the quantized kernels) is
// loaded, and points to docs/mechanisms/quantization.md. Used by the QuantizedPrivateUse1 fallback
// and by the generic path, which never makes a quantized result.
[[noreturn]] void reject_quantized(const c10::OperatorName& op, c10::ScalarType dtype);

}  // namespace c10::openreg
