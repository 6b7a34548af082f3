// quantized_decomposed quantize ops as native openreg kernels: per tensor
// (.default, .tensor, .tensor2), per channel (any axis), per token.
//
// Each call checks its arguments on the host (the decomposition's messages),
// allocates the output like the op's meta kernel (empty_like(input, dtype))
// and launches one kernel on the current stream. The kernel runs a fused loop
// (Loops.h) for the common types; any other combination (float8 outputs,
// 16-bit scales, broadcast parameters...) runs the decomposition's own ATen ops
// on the kernel views, still in that one kernel: bit-exact either way.
//
// Python defines the quantized_decomposed namespace (torch.ao.quantization.fx.
// _decomposed) with CompositeExplicitAutograd kernels; these PrivateUse1 kernels
// take precedence for openreg tensors whichever registers first.
#include <ATen/ATen.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include "Loops.h"
#include "Params.h"

namespace openreg_quant {
namespace {

constexpr const char* kDivisionByZero = "float division by zero";

// A zero per-tensor scale: the decomposition's `1.0 / scale` raises Python's ZeroDivisionError,
// so the call does too when Python is there (the torch.ops binding passes the error through);
// elsewhere, and in a kernel (reported by the next synchronising call), a RuntimeError.
[[noreturn]] void raise_division_by_zero() {
  if (Py_IsInitialized()) {
    pybind11::gil_scoped_acquire gil;
    PyErr_SetString(PyExc_ZeroDivisionError, kDivisionByZero);
    throw pybind11::error_already_set();
  }
  TORCH_CHECK(false, kDivisionByZero);
}

// ---- per tensor ----

at::Tensor quantize_per_tensor_reference(at::Tensor x, double scale, const c10::Scalar& zp, const c10::Scalar& qmin,
                                         const c10::Scalar& qmax, c10::ScalarType dtype) {
  if (x.scalar_type() != at::kFloat) x = x.to(at::kFloat);
  return at::clamp(at::round(x * (1.0 / scale)) + zp, qmin, qmax).to(dtype);
}

at::Tensor quantize_per_tensor_impl(const at::Tensor& input, ScalarParam scale, ScalarParam zp, ScalarParam qmin,
                                    ScalarParam qmax, c10::ScalarType dtype, const char* name) {
  check_quantize_input(input);
  // Bounds known on the host are checked at the call; bounds in device memory (.tensor2)
  // are checked by the kernel, whose failure the next synchronising call reports.
  const bool host_bounds = qmin.host && qmax.host;
  int64_t lo = 0, hi = 0;
  TORCH_CHECK_VALUE(qvalue_bounds(dtype, lo, hi), "Unsupported dtype: ", py_dtype(dtype));
  if (host_bounds) check_bounds(qmin.host->toLong(), qmax.host->toLong(), dtype);
  // The decomposition divides after its bounds check, even for an empty input.
  if (host_bounds && scale.host && scale.host->toDouble() == 0.0) raise_division_by_zero();
  at::Tensor out = at::empty_like(input, input.options().dtype(dtype));
  // An empty input still needs the kernel when a scale or bounds to check are in device memory.
  if (input.numel() == 0 && host_bounds && scale.host) return out;
  OPENREG_CHECK(::openreg::launch(stream_of(input), name,
                                  [x_arg = KernelTensorArg(input), y_arg = KernelTensorArg(out), scale, zp, qmin, qmax,
                                   dtype, host_bounds, empty = input.numel() == 0] {
                                    const c10::Scalar s = scale.get(), z = zp.get(), lo = qmin.get(), hi = qmax.get();
                                    if (!host_bounds) check_bounds(lo.toLong(), hi.toLong(), dtype);
                                    TORCH_CHECK(s.toDouble() != 0.0, kDivisionByZero);
                                    if (empty) return;
                                    at::Tensor x = x_arg.materialize(), y = y_arg.materialize();
                                    bool fused = false;
                                    visit_ftype(
                                        x.scalar_type(),
                                        [&](auto in_v) {
                                          fused = visit_qtype(dtype, [&](auto out_v) {
                                            FlatPair p(x, y);
                                            quantize_tensor_loop<decltype(in_v), decltype(out_v)>(
                                                p.x, p.y, static_cast<float>(1.0 / s.toDouble()),
                                                static_cast<float>(z.toDouble()), static_cast<float>(lo.toDouble()),
                                                static_cast<float>(hi.toDouble()));
                                            p.finish();
                                          });
                                        },
                                        /*with_double=*/false);
                                    if (!fused)
                                      y.copy_(quantize_per_tensor_reference(x, s.toDouble(), z, lo, hi, dtype));
                                  }));
  return out;
}

at::Tensor quantize_per_tensor(const at::Tensor& input, double scale, int64_t zero_point, int64_t quant_min,
                               int64_t quant_max, at::ScalarType dtype) {
  return quantize_per_tensor_impl(input, ScalarParam::of(scale), ScalarParam::of(zero_point),
                                  ScalarParam::of(quant_min), ScalarParam::of(quant_max), dtype,
                                  "quantized_decomposed::quantize_per_tensor");
}

at::Tensor quantize_per_tensor_tensor(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
                                      int64_t quant_min, int64_t quant_max, at::ScalarType dtype) {
  const char* name = "quantized_decomposed::quantize_per_tensor.tensor";
  check_one_element(scale, zero_point);
  // Named, in the arguments' order: a refusal names the first wrong argument (the order in which
  // a call's arguments are evaluated is the compiler's).
  const ScalarParam s = ScalarParam::of(scale, input, "scale", name);
  const ScalarParam z = ScalarParam::of(zero_point, input, "zero_point", name);
  return quantize_per_tensor_impl(input, s, z, ScalarParam::of(quant_min), ScalarParam::of(quant_max), dtype, name);
}

at::Tensor quantize_per_tensor_tensor2(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
                                       const at::Tensor& quant_min, const at::Tensor& quant_max, at::ScalarType dtype) {
  const char* name = "quantized_decomposed::quantize_per_tensor.tensor2";
  check_one_element(scale, zero_point);
  const ScalarParam s = ScalarParam::of(scale, input, "scale", name);  // in order, as above
  const ScalarParam z = ScalarParam::of(zero_point, input, "zero_point", name);
  const ScalarParam lo = ScalarParam::of(quant_min, input, "quant_min", name);
  const ScalarParam hi = ScalarParam::of(quant_max, input, "quant_max", name);
  return quantize_per_tensor_impl(input, s, z, lo, hi, dtype, name);
}

// ---- per channel ----

// The decomposition's layout trick: the channel axis is swapped with axis 0 and the
// parameters are viewed as [C, 1, 1, ...].
std::vector<int64_t> axis_to_front(int64_t dim, int64_t axis) {
  std::vector<int64_t> perm(dim);
  for (int64_t i = 0; i < dim; ++i) perm[i] = i;
  std::swap(perm[0], perm[axis]);
  return perm;
}

std::vector<int64_t> param_shape(int64_t dim, int64_t n) {
  std::vector<int64_t> shape(dim, 1);
  shape[0] = n;
  return shape;
}

int64_t check_axis(const at::Tensor& input, int64_t axis) {
  TORCH_CHECK(axis < input.dim(), "Expecting axis to be < ", input.dim());
  TORCH_CHECK_INDEX(axis >= -input.dim(), "axis ", axis, " is out of range for a tensor of ", input.dim(),
                    " dimensions.");
  return axis < 0 ? axis + input.dim() : axis;
}

// Scales (and zero points) hold one value per channel, or one for all: [S] with S in {1, C}.
void check_channel_params(const at::Tensor& input, int64_t axis, const at::Tensor& scales,
                          const at::Tensor& zero_points, const char* name) {
  check_on_device(scales, input, "scales", name);
  TORCH_CHECK(scales.dim() >= 1, name, ": scales must have at least one dimension, got a 0-dim tensor.");
  const int64_t n = scales.size(0), channels = input.size(axis);
  TORCH_CHECK(scales.numel() == n && (n == channels || n == 1), name, ": scales must hold one value per channel (",
              channels, " along axis ", axis, "), got shape ", py_size(scales.sizes()), ".");
  TORCH_CHECK(c10::isFloatingType(scales.scalar_type()), name, ": scales must be floating point, got ",
              py_dtype(scales.scalar_type()), ".");
  if (zero_points.defined()) {
    check_on_device(zero_points, input, "zero_points", name);
    TORCH_CHECK(zero_points.numel() == n, name, ": zero_points must hold as many values as scales (", n, "), got ",
                zero_points.numel(), ".");
  }
}

at::Tensor quantize_per_channel(const at::Tensor& input, const at::Tensor& scales, const at::Tensor& zero_points,
                                int64_t axis, int64_t quant_min, int64_t quant_max, at::ScalarType dtype) {
  const char* name = "quantized_decomposed::quantize_per_channel";
  check_quantize_input(input);
  axis = check_axis(input, axis);
  check_bounds(quant_min, quant_max, dtype);
  check_channel_params(input, axis, scales, zero_points, name);
  at::Tensor out = at::empty_like(input, input.options().dtype(dtype));
  if (input.numel() == 0) return out;
  const auto T = scales.scalar_type();
  const bool fusable =
      (T == at::kFloat || T == at::kDouble) && scales.size(0) == input.size(axis) && fused_zero_point(zero_points, T);
  OPENREG_CHECK(::openreg::launch(
      stream_of(input), name,
      [x_arg = KernelTensorArg(input), y_arg = KernelTensorArg(out), s_arg = KernelTensorArg(scales),
       z_arg = KernelTensorArg(zero_points), axis, quant_min, quant_max, dtype, fusable] {
        at::Tensor x = x_arg.materialize(), y = y_arg.materialize();
        at::Tensor s = s_arg.materialize().reshape(-1), z = z_arg.materialize().reshape(-1);
        bool fused = false;
        if (fusable) {
          visit_ftype(
              x.scalar_type(),
              [&](auto in_v) {
                fused = visit_qtype(dtype, [&](auto out_v) {
                  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "openreg_quant_per_channel", [&] {
                    const at::Tensor recip = at::reciprocal(s).contiguous();
                    const at::Tensor zp = z.to(s.scalar_type()).contiguous();
                    FlatPair p(x, y);
                    const int64_t channels = x.size(axis);
                    quantize_group_loop<false, decltype(in_v), decltype(out_v), scalar_t>(
                        p.x, p.y, recip.const_data_ptr<scalar_t>(), zp.const_data_ptr<scalar_t>(), channels,
                        channels == 1 ? 1 : p.x.stride(axis), static_cast<scalar_t>(quant_min),
                        static_cast<scalar_t>(quant_max));
                    p.finish();
                  });
                });
              },
              /*with_double=*/false);
        }
        if (!fused) {  // the decomposition's ops
          const auto perm = axis_to_front(x.dim(), axis);
          at::Tensor xp = (x.scalar_type() == at::kFloat ? x : x.to(at::kFloat)).permute(perm);
          const auto shape = param_shape(x.dim(), s.size(0));
          at::Tensor r =
              at::clamp(at::round(xp * (at::reciprocal(s.view(shape)) * 1.0)) + z.view(shape), quant_min, quant_max);
          y.copy_(r.permute(perm).to(dtype));
        }
      }));
  return out;
}

// ---- per token ----

int64_t num_tokens(const at::Tensor& input) {
  int64_t n = 1;
  for (int64_t d = 0; d + 1 < input.dim(); ++d) n *= input.size(d);
  return n;
}

at::Tensor quantize_per_token(const at::Tensor& input, const at::Tensor& scales, const at::Tensor& zero_points,
                              int64_t quant_min, int64_t quant_max, at::ScalarType dtype) {
  const char* name = "quantized_decomposed::quantize_per_token";
  check_bounds(quant_min, quant_max, dtype);
  const int64_t tokens = num_tokens(input);
  TORCH_CHECK(tokens == scales.numel(), "num_tokens: ", tokens, " scales: ", py_size(scales.sizes()));
  TORCH_CHECK(tokens == zero_points.numel(), "num_tokens: ", tokens, " zero_points: ", py_size(zero_points.sizes()));
  check_on_device(scales, input, "scales", name);
  check_on_device(zero_points, input, "zero_points", name);
  // The decomposition broadcasts the parameters: the same shape errors, at the call.
  check_token_shapes(input, scales, zero_points, name);
  // Integer scales are taken, as the decomposition takes them (its reciprocal is floating point):
  // they were refused (hunt33e).
  TORCH_CHECK(c10::isFloatingType(input.scalar_type()), name, ": input must be floating point, got ",
              py_dtype(input.scalar_type()), ".");
  at::Tensor out = at::empty_like(input, input.options().dtype(dtype));
  if (input.numel() == 0) return out;
  const auto T = scales.scalar_type();
  const bool fusable = (T == at::kFloat || T == at::kDouble) && at::result_type(input, scales) == T &&
                       per_row(input, scales) && per_row(input, zero_points) && fused_zero_point(zero_points, T);
  OPENREG_CHECK(::openreg::launch(
      stream_of(input), name,
      [x_arg = KernelTensorArg(input), y_arg = KernelTensorArg(out), s_arg = KernelTensorArg(scales),
       z_arg = KernelTensorArg(zero_points), tokens, quant_min, quant_max, dtype, fusable] {
        at::Tensor x = x_arg.materialize(), y = y_arg.materialize();
        at::Tensor s = s_arg.materialize(), z = z_arg.materialize();
        bool fused = false;
        if (fusable) {
          visit_ftype(
              x.scalar_type(),
              [&](auto in_v) {
                fused = visit_qtype(dtype, [&](auto out_v) {
                  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "openreg_quant_per_token", [&] {
                    const at::Tensor recip = at::reciprocal(s).reshape(-1).contiguous();
                    const at::Tensor zp = z.to(s.scalar_type()).reshape(-1).contiguous();
                    FlatPair p(x, y, /*contiguous=*/true);
                    quantize_group_loop<true, decltype(in_v), decltype(out_v), scalar_t>(
                        p.x, p.y, recip.const_data_ptr<scalar_t>(), zp.const_data_ptr<scalar_t>(), tokens, x.size(-1),
                        static_cast<scalar_t>(quant_min), static_cast<scalar_t>(quant_max));
                    p.finish();
                  });
                });
              },
              /*with_double=*/false);
        }
        if (!fused) y.copy_(x.mul(at::reciprocal(s) * 1.0).add(z).round().clamp(quant_min, quant_max).to(dtype));
      }));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(quantized_decomposed, PrivateUse1, m) {
  m.impl("quantize_per_tensor", TORCH_FN(quantize_per_tensor));
  m.impl("quantize_per_tensor.tensor", TORCH_FN(quantize_per_tensor_tensor));
  m.impl("quantize_per_tensor.tensor2", TORCH_FN(quantize_per_tensor_tensor2));
  m.impl("quantize_per_channel", TORCH_FN(quantize_per_channel));
  m.impl("quantize_per_token", TORCH_FN(quantize_per_token));
}

}  // namespace openreg_quant
