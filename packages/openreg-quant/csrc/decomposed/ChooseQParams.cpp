// quantized_decomposed choose_qparams ops as native openreg kernels: per tensor
// (asymmetric, symmetric) and per token (symmetric, asymmetric).
//
// The work is a reduction plus a few scalar steps, so the kernel runs the
// decomposition's own ATen ops on the kernel views (determine_qparams of
// torch/ao/quantization/utils.py, step by step): bit-exact by construction, one
// launch instead of a dozen, and the results stay on the device (the Python
// version's min/max validity checks read them on the host).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "../QuantCommon.h"

namespace openreg_quant {
namespace {

void check_choose_input(const at::Tensor& input, int64_t quant_min, int64_t quant_max, c10::ScalarType dtype) {
  const auto t = input.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kHalf || t == at::kBFloat16,
              "Expecting input to have dtype torch.float32/16/b16, but got dtype: ", py_dtype(t));
  int64_t lo = 0, hi = 0;
  TORCH_CHECK(qvalue_bounds(dtype, lo, hi),
              "Expecting target dtype to be one of dict_keys([torch.uint8, torch.int8, torch.uint16, torch.int16, "
              "torch.int32, torch.float8_e5m2, torch.float8_e4m3fn]), but got: ",
              py_dtype(dtype));
  TORCH_CHECK(quant_min <= 0 && 0 <= quant_max, "Used-specified quantization range must include 0.");
  TORCH_CHECK(quant_min < quant_max, "qmin must be strictly less than qmax for user-specified quantization range.");
  TORCH_CHECK(input.numel() > 0,
              "aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity.");
}

// determine_qparams for a per-tensor min/max (0-dim tensors), per_tensor_affine or
// per_tensor_symmetric, has_customized_qrange=False.
std::tuple<at::Tensor, at::Tensor> determine_qparams(const at::Tensor& min_val, const at::Tensor& max_val,
                                                     int64_t quant_min, int64_t quant_max, c10::ScalarType dtype,
                                                     double eps, bool symmetric) {
  const double inf = std::numeric_limits<double>::infinity();
  // check_min_max_valid: an unobserved range gives the defaults; min > max is an error.
  if (min_val.item<double>() == inf && max_val.item<double>() == -inf)
    return {at::tensor({1.0}, at::kFloat).to(at::kDouble), at::tensor({int64_t{0}}, at::kLong)};
  TORCH_CHECK(!(min_val.item<double>() > max_val.item<double>()), "min ", min_val, " should be less than max ",
              max_val);
  at::Tensor min_neg = at::min(min_val, at::zeros_like(min_val));
  at::Tensor max_pos = at::max(max_val, at::zeros_like(max_val));
  const at::Tensor eps_t = at::tensor({static_cast<float>(eps)}, at::kFloat);  // torch.Tensor([eps])
  at::Tensor scale, zero_point = at::zeros(min_neg.sizes(), at::kLong);
  if (symmetric) {
    max_pos = at::max(-min_neg, max_pos);
    scale = at::maximum(max_pos / (static_cast<double>(quant_max - quant_min) / 2), eps_t);
    if (dtype == at::kByte) zero_point = zero_point.new_full(zero_point.sizes(), 128);
  } else {
    scale = at::maximum((max_pos - min_neg) / static_cast<double>(quant_max - quant_min), eps_t);
    zero_point = quant_min - at::round(min_neg / scale).to(at::kInt);
    zero_point = at::clamp(zero_point, quant_min, quant_max);
  }
  if (zero_point.dim() == 0) zero_point = zero_point.reshape({1});
  return {scale.to(at::kDouble), zero_point.to(at::kLong)};
}

std::tuple<at::Tensor, at::Tensor> choose_qparams_impl(const at::Tensor& input, int64_t quant_min, int64_t quant_max,
                                                       double eps, c10::ScalarType dtype, bool symmetric,
                                                       const char* name) {
  check_choose_input(input, quant_min, quant_max, dtype);
  at::Tensor scale = at::empty({1}, input.options().dtype(at::kDouble));
  at::Tensor zero_point = at::empty({1}, input.options().dtype(at::kLong));
  OPENREG_CHECK(::openreg::launch(stream_of(input), name,
                                  [x_arg = KernelTensorArg(input), s_arg = KernelTensorArg(scale),
                                   z_arg = KernelTensorArg(zero_point), quant_min, quant_max, eps, dtype, symmetric] {
                                    auto [mn, mx] = at::aminmax(x_arg.materialize());
                                    auto [s, z] =
                                        determine_qparams(mn, mx, quant_min, quant_max, dtype, eps, symmetric);
                                    s_arg.materialize().copy_(s.reshape({1}));
                                    z_arg.materialize().copy_(z.reshape({1}));
                                  }));
  return {scale, zero_point};
}

std::tuple<at::Tensor, at::Tensor> choose_qparams(const at::Tensor& input, int64_t quant_min, int64_t quant_max,
                                                  double eps, at::ScalarType dtype) {
  return choose_qparams_impl(input, quant_min, quant_max, eps, dtype, false, "quantized_decomposed::choose_qparams");
}

std::tuple<at::Tensor, at::Tensor> choose_qparams_symmetric(const at::Tensor& input, int64_t quant_min,
                                                            int64_t quant_max, double eps, at::ScalarType dtype) {
  return choose_qparams_impl(input, quant_min, quant_max, eps, dtype, true,
                             "quantized_decomposed::choose_qparams_symmetric");
}

// ---- per token: one pair per row of the last dimension ----

// A 0-dim input is one token: 0-dim qparams, as the decomposition's amax(-1, keepdim=True) gives.
std::vector<int64_t> token_shape(const at::Tensor& input, const char* name) {
  TORCH_CHECK(input.dim() == 0 || input.size(-1) > 0 || input.numel() > 0,
              "amax(): Expected reduction dim -1 to have non-zero size.");
  TORCH_CHECK(c10::isFloatingType(input.scalar_type()), name, ": input must be floating point, got ",
              py_dtype(input.scalar_type()), ".");
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  if (!shape.empty()) shape.back() = 1;
  return shape;
}

// Runs `compute` (kernel view -> scales, zero points) in one launch into new device tensors.
template <typename F>
std::tuple<at::Tensor, at::Tensor> launch_token_qparams(const at::Tensor& input, const std::vector<int64_t>& shape,
                                                        c10::ScalarType scale_t, c10::ScalarType zp_t, const char* name,
                                                        F compute) {
  at::Tensor scales = at::empty(shape, input.options().dtype(scale_t));
  at::Tensor zero_points = at::empty(shape, input.options().dtype(zp_t));
  if (scales.numel() == 0) return {scales, zero_points};
  OPENREG_CHECK(::openreg::launch(
      stream_of(input), name,
      [x_arg = KernelTensorArg(input), s_arg = KernelTensorArg(scales), z_arg = KernelTensorArg(zero_points), compute] {
        auto [s, z] = compute(x_arg.materialize());
        s_arg.materialize().copy_(s);
        z_arg.materialize().copy_(z);
      }));
  return {scales, zero_points};
}

std::tuple<at::Tensor, at::Tensor> choose_qparams_per_token(const at::Tensor& input, at::ScalarType dtype) {
  const char* name = "quantized_decomposed::choose_qparams_per_token";
  const auto shape = token_shape(input, name);
  TORCH_CHECK(dtype == at::kChar, "unsupported dtype in choose_qparams_per_token: ", py_dtype(dtype));
  // The decomposition's scales keep the input's dtype, except float16 (widened to float32).
  const auto scale_t = input.scalar_type() == at::kHalf ? at::kFloat : input.scalar_type();
  return launch_token_qparams(input, shape, scale_t, scale_t, name, [](const at::Tensor& x) {
    at::Tensor scales = x.abs().amax(-1, /*keepdim=*/true);
    if (scales.scalar_type() == at::kHalf) scales = scales.to(at::kFloat);
    scales = scales.clamp_min(1e-5).div(127);
    return std::make_tuple(scales, at::zeros_like(scales));
  });
}

std::tuple<at::Tensor, at::Tensor> choose_qparams_per_token_asymmetric(const at::Tensor& input, at::ScalarType dtype) {
  const char* name = "quantized_decomposed::choose_qparams_per_token_asymmetric";
  const auto shape = token_shape(input, name);
  return launch_token_qparams(input, shape, at::kDouble, at::kLong, name, [](const at::Tensor& x) {
    // _choose_qparams_per_token_asymmetric_impl (XNNPACK's scheme), step by step.
    const int64_t qmin = -128, qmax = 127;
    at::Tensor min_val = at::amin(x, -1, true), max_val = at::amax(x, -1, true);
    at::Tensor min_neg = at::min(min_val, at::zeros_like(min_val));
    at::Tensor max_pos = at::max(max_val, at::zeros_like(max_val));
    const double eps = std::numeric_limits<float>::epsilon();
    at::Tensor scale = ((max_pos - min_neg) / static_cast<double>(qmax - qmin)).clamp_min(eps);
    at::Tensor descaled_min = min_neg / scale, descaled_max = max_pos / scale;
    at::Tensor from_min = qmin + descaled_min, from_max = qmax + descaled_max;
    at::Tensor zero_point = at::where(from_min + from_max > 0, qmin - descaled_min, qmax - descaled_max);
    zero_point = at::clamp(zero_point, qmin, qmax).round();
    return std::make_tuple(scale.to(at::kDouble), zero_point.to(at::kLong));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(quantized_decomposed, PrivateUse1, m) {
  m.impl("choose_qparams.tensor", TORCH_FN(choose_qparams));
  m.impl("choose_qparams_symmetric.tensor", TORCH_FN(choose_qparams_symmetric));
  m.impl("choose_qparams_per_token", TORCH_FN(choose_qparams_per_token));
  m.impl("choose_qparams_per_token_asymmetric", TORCH_FN(choose_qparams_per_token_asymmetric));
}

}  // namespace openreg_quant
