// quantized_decomposed dequantize ops as native openreg kernels: per tensor
// (.default, .tensor, .tensor2), per channel (any axis), per token. Same shape
// as Quantize.cpp: host checks, output like the meta kernel, one launch; a
// fused loop for the common types, the decomposition's ATen ops otherwise.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "Loops.h"
#include "Params.h"

namespace openreg_quant {
namespace {

// ---- per tensor ----

// The decomposition subtracts a bool zero point tensor, which PyTorch refuses: refused at the call
// with its words (it was read as 1; hunt33e). Its other zero points it reads as numbers (.item()).
void check_not_bool(const at::Tensor& zero_point) {
  TORCH_CHECK(zero_point.scalar_type() != at::kBool,
              "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a "
              "mask, use the `~` or `logical_not()` operator instead.");
}

at::Tensor dequantize_per_tensor_impl(const at::Tensor& input, ScalarParam scale, ScalarParam zp, c10::ScalarType dtype,
                                      std::optional<c10::ScalarType> out_dtype, const char* name) {
  TORCH_CHECK(input.scalar_type() == dtype, "Expecting input to have dtype: ", py_dtype(dtype), ", but got ",
              py_dtype(input.scalar_type()));
  const c10::ScalarType out_t = dequantize_out_dtype(out_dtype, name);
  int64_t lo = 0, hi = 0;
  TORCH_CHECK_VALUE(qvalue_bounds(dtype, lo, hi), "Unsupported dtype in dequantize_per_tensor: ", py_dtype(dtype));
  at::Tensor out = at::empty_like(input, input.options().dtype(out_t));
  if (input.numel() == 0) return out;
  OPENREG_CHECK(::openreg::launch(
      stream_of(input), name, [x_arg = KernelTensorArg(input), y_arg = KernelTensorArg(out), scale, zp] {
        const c10::Scalar s = scale.get(), z = zp.get();
        at::Tensor x = x_arg.materialize(), y = y_arg.materialize();
        bool fused = false;
        visit_ftype(
            y.scalar_type(),
            [&](auto out_v) {
              fused = visit_qtype(x.scalar_type(), [&](auto in_v) {
                FlatPair p(x, y);
                dequantize_tensor_loop<decltype(in_v), decltype(out_v)>(p.x, p.y, s.toDouble(), z.toDouble());
                p.finish();
              });
            },
            /*with_double=*/true);
        if (!fused) y.copy_((x.to(y.scalar_type()) - z) * s);
      }));
  return out;
}

at::Tensor dequantize_per_tensor(const at::Tensor& input, double scale, int64_t zero_point, int64_t quant_min,
                                 int64_t quant_max, at::ScalarType dtype, std::optional<at::ScalarType> out_dtype) {
  return dequantize_per_tensor_impl(input, ScalarParam::of(scale), ScalarParam::of(zero_point), dtype, out_dtype,
                                    "quantized_decomposed::dequantize_per_tensor");
}

at::Tensor dequantize_per_tensor_tensor(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
                                        int64_t quant_min, int64_t quant_max, at::ScalarType dtype,
                                        std::optional<at::ScalarType> out_dtype) {
  const char* name = "quantized_decomposed::dequantize_per_tensor.tensor";
  check_one_element(scale, zero_point);
  check_not_bool(zero_point);
  // Named, in the arguments' order: a refusal names the first wrong argument (the order in which
  // a call's arguments are evaluated is the compiler's).
  const ScalarParam s = ScalarParam::of(scale, input, "scale", name);
  const ScalarParam z = ScalarParam::of(zero_point, input, "zero_point", name);
  return dequantize_per_tensor_impl(input, s, z, dtype, out_dtype, name);
}

// quant_min/quant_max are metadata here (the decomposition does not read them either).
at::Tensor dequantize_per_tensor_tensor2(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
                                         const at::Tensor& quant_min, const at::Tensor& quant_max, at::ScalarType dtype,
                                         std::optional<at::ScalarType> out_dtype) {
  const char* name = "quantized_decomposed::dequantize_per_tensor.tensor2";
  check_one_element(scale, zero_point);
  check_not_bool(zero_point);
  // Named, in the arguments' order: a refusal names the first wrong argument (the order in which
  // a call's arguments are evaluated is the compiler's).
  const ScalarParam s = ScalarParam::of(scale, input, "scale", name);
  const ScalarParam z = ScalarParam::of(zero_point, input, "zero_point", name);
  return dequantize_per_tensor_impl(input, s, z, dtype, out_dtype, name);
}

// ---- per channel and per token: one (scale, zero point) per group of elements ----

// The decomposition subtracts an integer zero point in the type input and zero point promote to,
// which wraps when that is narrower than 32 bits (uint8 3 - 128 is 131 there). The fused loops
// subtract in float: such zero points take the decomposition in the kernel instead, to be bit-exact.
// The decomposition subtracts the zero points from the integer input (with `zp_dims` dimensions: a
// 0-dim one per token takes no part in the promotion). What PyTorch refuses there (a promotion it
// does not make, uint16 with int64; a bool; a type its subtraction is not compiled for) is refused at
// the call, for an empty input too, by the same subtraction on one-element CPU tensors, with
// PyTorch's own error. The usual types skip it.
void check_zero_point_subtraction(const at::Tensor& input, const at::Tensor& zero_points, int64_t zp_dims) {
  if (!zero_points.defined()) return;
  auto usual = [](c10::ScalarType t) {
    return t == at::kChar || t == at::kByte || t == at::kShort || t == at::kInt || t == at::kLong ||
           c10::isFloatingType(t);
  };
  if (usual(input.scalar_type()) && usual(zero_points.scalar_type())) return;
  const at::Tensor x = at::zeros(std::vector<int64_t>(input.dim(), 1), at::TensorOptions().dtype(input.dtype()));
  const at::Tensor z = at::zeros(std::vector<int64_t>(zp_dims, 1), at::TensorOptions().dtype(zero_points.dtype()));
  (void)at::sub(x, z);
}

bool wrapping_zero_point(const at::Tensor& input, const at::Tensor& zero_points) {
  if (!zero_points.defined() || !c10::isIntegralType(zero_points.scalar_type(), /*includeBool=*/true)) return false;
  return c10::elementSize(c10::promoteTypes(input.scalar_type(), zero_points.scalar_type())) < 4;
}

// Device side: whether the fused loop, which subtracts the zero points in the scales' type `T`, gives
// the decomposition's result. The decomposition subtracts an integral zero point from the integer
// input first, in the type the two promote to; that matches while `T` holds every zero point exactly
// (up to 2^24 in float32: 1 - 16777217 is -16777216 in integers, -16777215 in float32) and the
// integer subtraction does not wrap (below 2^30 when the two promote to 32 bits).
bool zero_points_exact_in(const at::Tensor& x, const at::Tensor& z, c10::ScalarType T) {
  if (!z.defined() || !c10::isIntegralType(z.scalar_type(), /*includeBool=*/false)) return true;
  int64_t limit = int64_t{1} << (T == at::kDouble ? 53 : 24);
  if (c10::elementSize(c10::promoteTypes(x.scalar_type(), z.scalar_type())) == 4)
    limit = std::min(limit, int64_t{1} << 30);
  const at::Tensor v = z.to(at::kLong).reshape(-1).contiguous();
  const int64_t* p = v.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < v.numel(); ++i)
    if (p[i] > limit || p[i] < -limit) return false;
  return true;
}

// Launches the fused loop (or, when `fusable` is false or the types are not the loops',
// `reference` on the kernel views). `groups`/`inner` follow for_each_group; with
// `axis` >= 0 the inner size is the (flattened) input's stride along that axis.
template <typename Ref>
void launch_dequantize_groups(const char* name, const at::Tensor& input, const at::Tensor& out,
                              const at::Tensor& scales, const at::Tensor& zero_points, int64_t axis, bool fusable,
                              Ref reference) {
  std::optional<KernelTensorArg> z_arg;
  if (zero_points.defined()) z_arg.emplace(zero_points);
  OPENREG_CHECK(::openreg::launch(
      stream_of(input), name,
      [x_arg = KernelTensorArg(input), y_arg = KernelTensorArg(out), s_arg = KernelTensorArg(scales), z_arg, axis,
       fusable, reference] {
        at::Tensor x = x_arg.materialize(), y = y_arg.materialize(), s = s_arg.materialize();
        at::Tensor z = z_arg ? z_arg->materialize() : at::Tensor();
        bool fused = false;
        if (fusable && zero_points_exact_in(x, z, s.scalar_type())) {
          visit_ftype(
              y.scalar_type(),
              [&](auto out_v) {
                fused = visit_qtype(x.scalar_type(), [&](auto in_v) {
                  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "openreg_quant_dequantize_groups", [&] {
                    const at::Tensor sc = s.reshape(-1).contiguous();
                    const at::Tensor zp = z.defined() ? z.to(s.scalar_type()).reshape(-1).contiguous()
                                                      : at::zeros({sc.numel()}, sc.options());
                    FlatPair p(x, y, /*contiguous=*/axis < 0);
                    const int64_t groups = sc.numel();
                    const int64_t inner =
                        axis >= 0 ? (groups == 1 ? 1 : p.x.stride(axis)) : (x.dim() == 0 ? 1 : x.size(-1));
                    dequantize_group_loop<decltype(in_v), decltype(out_v), scalar_t>(
                        p.x, p.y, sc.const_data_ptr<scalar_t>(), zp.const_data_ptr<scalar_t>(), groups, inner);
                    p.finish();
                  });
                });
              },
              /*with_double=*/true);
        }
        if (!fused) y.copy_(reference(x, s, z, y.scalar_type()));
      }));
}

at::Tensor dequantize_per_channel(const at::Tensor& input, const at::Tensor& scales,
                                  const std::optional<at::Tensor>& zero_points_opt, int64_t axis, int64_t quant_min,
                                  int64_t quant_max, at::ScalarType dtype, std::optional<at::ScalarType> out_dtype) {
  const char* name = "quantized_decomposed::dequantize_per_channel";
  const at::Tensor zero_points = zero_points_opt.value_or(at::Tensor());
  TORCH_CHECK(input.scalar_type() == dtype, "Expecting input to have dtype: ", py_dtype(dtype),
              ", but got dtype: ", py_dtype(input.scalar_type()));
  const c10::ScalarType out_t = dequantize_out_dtype(out_dtype, name);
  TORCH_CHECK(axis < input.dim(), "Expecting axis to be < ", input.dim());
  TORCH_CHECK_INDEX(axis >= -input.dim(), "axis ", axis, " is out of range for a tensor of ", input.dim(),
                    " dimensions.");
  if (axis < 0) axis += input.dim();
  check_bounds(quant_min, quant_max, dtype);
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
  check_zero_point_subtraction(input, zero_points, input.dim());  // the decomposition views them to the input's dims
  at::Tensor out = at::empty_like(input, input.options().dtype(out_t));
  if (input.numel() == 0) return out;
  const auto T = scales.scalar_type();
  const bool fusable = (T == at::kFloat || T == at::kDouble) && n == channels && fused_zero_point(zero_points, T) &&
                       !wrapping_zero_point(input, zero_points);
  launch_dequantize_groups(
      name, input, out, scales, zero_points, axis, fusable,
      [axis](const at::Tensor& x, const at::Tensor& s, const at::Tensor& z, c10::ScalarType out_t) {
        std::vector<int64_t> perm(x.dim()), shape(x.dim(), 1);
        for (int64_t i = 0; i < x.dim(); ++i) perm[i] = i;
        std::swap(perm[0], perm[axis]);
        shape[0] = s.size(0);
        at::Tensor xp = x.permute(perm);
        at::Tensor r = z.defined() ? (xp - z.view(shape)) * s.view(shape) : xp * s.view(shape);
        return r.to(out_t).permute(perm);
      });
  return out;
}

at::Tensor dequantize_per_token(const at::Tensor& input, const at::Tensor& scales, const at::Tensor& zero_points,
                                int64_t quant_min, int64_t quant_max, at::ScalarType dtype,
                                at::ScalarType output_dtype) {
  const char* name = "quantized_decomposed::dequantize_per_token";
  check_bounds(quant_min, quant_max, dtype);
  const c10::ScalarType out_t = dequantize_out_dtype(output_dtype, name);
  check_on_device(scales, input, "scales", name);
  check_on_device(zero_points, input, "zero_points", name);
  check_token_shapes(input, scales, zero_points, name);
  check_zero_point_subtraction(input, zero_points, zero_points.dim());
  at::Tensor out = at::empty_like(input, input.options().dtype(out_t));
  if (input.numel() == 0) return out;
  const auto T = scales.scalar_type();
  const bool fusable = (T == at::kFloat || T == at::kDouble) && per_row(input, scales) && per_row(input, zero_points) &&
                       fused_zero_point(zero_points, T) && !wrapping_zero_point(input, zero_points);
  launch_dequantize_groups(name, input, out, scales, zero_points, /*axis=*/-1, fusable,
                           [](const at::Tensor& x, const at::Tensor& s, const at::Tensor& z, c10::ScalarType out_t) {
                             return ((x - z) * s).to(out_t);
                           });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(quantized_decomposed, PrivateUse1, m) {
  m.impl("dequantize_per_tensor", TORCH_FN(dequantize_per_tensor));
  m.impl("dequantize_per_tensor.tensor", TORCH_FN(dequantize_per_tensor_tensor));
  m.impl("dequantize_per_tensor.tensor2", TORCH_FN(dequantize_per_tensor_tensor2));
  m.impl("dequantize_per_channel", TORCH_FN(dequantize_per_channel));
  m.impl("dequantize_per_token", TORCH_FN(dequantize_per_token));
}

}  // namespace openreg_quant
