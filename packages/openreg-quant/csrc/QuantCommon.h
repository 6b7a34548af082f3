// Helpers shared by openreg-quant's kernels: Python-style dtype names for
// messages that match the decomposition's, the quantized dtypes' bounds, the
// rounding the decomposition uses, and how a kernel reaches its launch stream.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "openreg/runtime.hpp"
#include "torch_openreg/aten/OpenRegKernelTensor.h"
#include "torch_openreg/runtime/OpenRegException.h"
#include "torch_openreg/runtime/OpenRegStream.h"

namespace openreg_quant {

using c10::openreg::KernelTensorArg;

// "torch.int8", as Python prints a dtype (the decomposition's messages name dtypes so).
inline std::string py_dtype(c10::ScalarType t) { return "torch." + std::string(c10::getDtypeNames(t).first); }

// The quantized dtypes of the decomposition's _DTYPE_TO_QVALUE_BOUNDS and their (min, max).
inline bool qvalue_bounds(c10::ScalarType t, int64_t& lo, int64_t& hi) {
  switch (t) {
    case c10::kByte:
      lo = 0, hi = 255;
      return true;
    case c10::kChar:
      lo = -128, hi = 127;
      return true;
    case c10::kUInt16:
      lo = 0, hi = 65535;
      return true;
    case c10::kShort:
      lo = -32768, hi = 32767;
      return true;
    case c10::kInt:
      lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
      return true;
    case c10::kFloat8_e5m2:
      lo = -57344, hi = 57344;
      return true;
    case c10::kFloat8_e4m3fn:
      lo = -448, hi = 448;
      return true;
    default:
      return false;
  }
}

// The decomposition's _quant_min_max_bounds_check, same messages.
inline void check_bounds(int64_t quant_min, int64_t quant_max, c10::ScalarType dtype) {
  int64_t lo = 0, hi = 0;
  TORCH_CHECK_VALUE(qvalue_bounds(dtype, lo, hi), "Unsupported dtype: ", py_dtype(dtype));
  TORCH_CHECK(quant_min >= lo, "quant_min out of bounds for dtype, quant_min_lower_bound: ", lo,
              " quant_min: ", quant_min);
  TORCH_CHECK(quant_max <= hi, "quant_max out of bounds for dtype, quant_max_upper_bound: ", hi,
              " quant_max: ", quant_max);
}

// Round half to even, as torch.round: std::nearbyint under the default rounding mode. In the
// loops' AVX2 clones (Loops.h) GCC makes it one vroundps per vector; in the baseline (SSE2)
// build it is a library call.
inline float round_even(float v) { return std::nearbyint(v); }
inline double round_even(double v) { return std::nearbyint(v); }

// torch.clamp's order: max with the lower bound, then min with the upper one.
template <typename T>
inline T clamp_to(T v, T lo, T hi) {
  return std::min(std::max(v, lo), hi);
}

// The current stream of `t`'s device, where a call's one kernel runs.
inline orStream_t stream_of(const at::Tensor& t) { return c10::openreg::current_stream_handle(t.device().index()); }

// A tensor argument that must live on the input's openreg device.
inline void check_on_device(const at::Tensor& t, const at::Tensor& input, const char* what, const char* op) {
  TORCH_CHECK(t.device() == input.device(), op, ": ", what, " must be on ", input.device(),
              " (the input's device), got a tensor on ", t.device(), ".");
}

}  // namespace openreg_quant
