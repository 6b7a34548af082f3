// Host-side handling of the decomposed ops' quantization parameters.
#pragma once

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../QuantCommon.h"

namespace openreg_quant {

// A per-tensor parameter (scale, zero point, quant_min/max): known on the host (a Python
// number, or a CPU tensor) or read by the kernel from device memory (an openreg tensor), so
// that the .tensor/.tensor2 variants never make the host wait for the device.
struct ScalarParam {
  std::optional<c10::Scalar> host;
  std::optional<KernelTensorArg> device;

  static ScalarParam of(c10::Scalar v) { return {v, std::nullopt}; }
  static ScalarParam of(const at::Tensor& t, const at::Tensor& input, const char* what, const char* op) {
    if (t.is_privateuseone()) {
      check_on_device(t, input, what, op);
      return {std::nullopt, KernelTensorArg(t)};
    }
    TORCH_CHECK(t.is_cpu(), op, ": ", what, " must be an openreg or a CPU tensor, got one on ", t.device(), ".");
    return {t.item(), std::nullopt};
  }
  // Device side (or host side for known values): the value, as Tensor.item() gives it.
  c10::Scalar get() const { return host ? *host : device->materialize().item(); }
};

// "torch.Size([4, 1])", as Python prints a shape.
inline std::string py_size(c10::IntArrayRef sizes) {
  std::ostringstream s;
  s << "torch.Size([";
  for (size_t i = 0; i < sizes.size(); ++i) s << (i ? ", " : "") << sizes[i];
  s << "])";
  return s.str();
}

// The decomposition's .tensor variants: one-element scale and zero point.
inline void check_one_element(const at::Tensor& scale, const at::Tensor& zero_point) {
  TORCH_CHECK(zero_point.numel() == 1,
              "Expecting zero_point tensor to be one element, but received : ", zero_point.numel());
  TORCH_CHECK(scale.numel() == 1, "Expecting scale tensor to be one element, but received : ", scale.numel());
}

// Quantize inputs: float32, or float16/bfloat16 (widened to float32 first).
inline void check_quantize_input(const at::Tensor& input) {
  const auto t = input.scalar_type();
  TORCH_CHECK(t == c10::kFloat || t == c10::kHalf || t == c10::kBFloat16,
              "Expecting input to have dtype torch.float32, but got dtype: ", py_dtype(t));
}

// Per token: the decomposition broadcasts the parameters against the input, so a shape it cannot
// broadcast fails at the call with its error. Parameters that broadcast the input to a larger shape
// are refused: PyTorch's meta kernel gives these ops the input's shape (empty_like), which the
// kernel writes; the decomposition on CPU tensors would return the larger shape.
inline void check_token_shapes(const at::Tensor& input, const at::Tensor& scales, const at::Tensor& zero_points,
                               const char* op) {
  const std::vector<int64_t> shape = at::infer_size(input.sizes(), at::infer_size(scales.sizes(), zero_points.sizes()));
  TORCH_CHECK(c10::IntArrayRef(shape) == input.sizes(), op, ": scales ", py_size(scales.sizes()), " and zero_points ",
              py_size(zero_points.sizes()), " would broadcast the input ", py_size(input.sizes()), " to ",
              py_size(shape), "; the output has the input's shape.");
}

// Per-token parameters of the shape choose_qparams_per_token gives: input.shape[:-1] + [1] (what
// the fused loops take).
inline bool per_row(const at::Tensor& input, const at::Tensor& p) {
  if (p.dim() != input.dim() || input.dim() == 0 || p.size(-1) != 1) return false;
  for (int64_t d = 0; d + 1 < input.dim(); ++d)
    if (p.size(d) != input.size(d)) return false;
  return true;
}

inline c10::ScalarType dequantize_out_dtype(std::optional<c10::ScalarType> out_dtype, const char* op) {
  const c10::ScalarType out = out_dtype.value_or(c10::kFloat);
  TORCH_CHECK(c10::isFloatingType(out), op, ": out_dtype must be a floating dtype, got ", py_dtype(out), ".");
  return out;
}

// Zero points the fused loops take: integers, or floats of the computation's type T.
inline bool fused_zero_point(const at::Tensor& zp, c10::ScalarType T) {
  return !zp.defined() || c10::isIntegralType(zp.scalar_type(), /*includeBool=*/false) || zp.scalar_type() == T;
}

}  // namespace openreg_quant
