// The five batch-norm operators nn.SyncBatchNorm calls (torch/nn/modules/_functions.py): per-rank
// statistics, their merge across ranks, the normalisation and the two halves of its backward.
// PyTorch has them for CUDA, XPU and MPS only, not for the CPU, so the generic path (which runs the
// CPU's kernels) cannot serve them, and SyncBatchNorm, which accepts the PrivateUse1 device, failed
// on openreg. Each is one launch computing with ATen's CPU operators on kernel views, with CUDA's
// semantics (aten/src/ATen/native/cuda/Normalization.cu): statistics in the accumulate type (float
// for half and bfloat16), invstd = 1 / sqrt(var + eps) of the biased variance, the running variance
// updated with the unbiased one.
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "OpenRegLaunch.h"

namespace c10::openreg {

namespace {

// The dimensions reduced per channel (all but 1) and the shape that broadcasts a [C] tensor.
std::vector<int64_t> reduced_dims(const at::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}
std::vector<int64_t> channel_shape(const at::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = -1;
  return shape;
}

c10::ScalarType acc_type(const at::Tensor& x) { return at::toAccumulateType(x.scalar_type(), /*is_cuda=*/true); }

void check_input(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() >= 2, name, ": expected an input with at least 2 dimensions (N, C, ...), got ", x.dim(), "-D");
}

// 1 / sqrt(var + eps), and 0 where both are 0 (CUDA's convention).
at::Tensor inverse_std(const at::Tensor& var, double eps) {
  at::Tensor invstd = (var + eps).rsqrt();
  if (eps == 0) invstd.masked_fill_(var == 0, 0);
  return invstd;
}

std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps) {
  check_input(input, "batch_norm_stats");
  const auto options = input.options().dtype(acc_type(input));
  at::Tensor mean = at::empty({input.size(1)}, options), invstd = at::empty({input.size(1)}, options);
  launch_cpu_function("aten::batch_norm_stats", {input}, {mean, invstd}, [eps](const std::vector<at::Tensor>& in) {
    const at::Tensor x = in[0].to(acc_type(in[0]));
    const auto dims = reduced_dims(x);
    at::Tensor m = x.mean(dims);
    at::Tensor var = (x - m.view(channel_shape(x))).square().mean(dims);
    return std::vector<at::Tensor>{m, inverse_std(var, eps)};
  });
  return {mean, invstd};
}

std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats_with_counts(const at::Tensor& input, const at::Tensor& mean,
                                                                       const at::Tensor& invstd,
                                                                       const std::optional<at::Tensor>& running_mean,
                                                                       const std::optional<at::Tensor>& running_var,
                                                                       double momentum, double eps,
                                                                       const at::Tensor& counts) {
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes() && counts.numel() == mean.size(0),
              "batch_norm_gather_stats_with_counts: expected mean and invstd of shape [world, C] and counts of "
              "[world], got ",
              mean.sizes(), ", ", invstd.sizes(), " and ", counts.sizes());
  at::Tensor out_mean = at::empty({mean.size(1)}, mean.options());
  at::Tensor out_invstd = at::empty({mean.size(1)}, mean.options());
  const at::Tensor rm = running_mean.value_or(at::Tensor()), rv = running_var.value_or(at::Tensor());
  launch_cpu_function("aten::batch_norm_gather_stats_with_counts", {mean, invstd, counts, rm, rv},
                      {out_mean, out_invstd}, [momentum, eps](const std::vector<at::Tensor>& in) {
                        const at::Tensor m = in[0].to(at::kDouble), is = in[1].to(at::kDouble);
                        const at::Tensor n = in[2].to(at::kDouble).view({-1, 1});
                        const at::Tensor total = n.sum();
                        // Each rank's variance back from its invstd; merged as Welford's parallel combination.
                        const at::Tensor var_i = (is.square().reciprocal() - eps).masked_fill(is == 0, 0);
                        const at::Tensor g_mean = (n * m).sum(0) / total;
                        const at::Tensor m2 = (n * var_i).sum(0) + (n * (m - g_mean).square()).sum(0);
                        const at::Tensor var = m2 / total;
                        if (in[3].defined()) in[3].mul_(1 - momentum).add_((g_mean * momentum).to(in[3].scalar_type()));
                        if (in[4].defined())
                          in[4].mul_(1 - momentum).add_((m2 / (total - 1) * momentum).to(in[4].scalar_type()));
                        return std::vector<at::Tensor>{g_mean, inverse_std(var, eps)};
                      });
  return {out_mean, out_invstd};
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                            double /*eps*/) {
  check_input(input, "batch_norm_elemt");
  at::Tensor out = at::empty_like(input);
  launch_cpu_function("aten::batch_norm_elemt",
                      {input, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()), mean, invstd}, {out},
                      [](const std::vector<at::Tensor>& in) {
                        const at::Tensor& x = in[0];
                        const auto shape = channel_shape(x);
                        const auto acc = acc_type(x);
                        at::Tensor y = (x.to(acc) - in[3].to(acc).view(shape)) * in[4].to(acc).view(shape);
                        if (in[1].defined()) y = y * in[1].to(acc).view(shape);
                        if (in[2].defined()) y = y + in[2].to(acc).view(shape);
                        return std::vector<at::Tensor>{y.to(x.scalar_type())};
                      });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  check_input(input, "batch_norm_backward_reduce");
  const int64_t c = input.size(1);
  const auto stats = mean.options();
  const auto params = weight && weight->defined() ? weight->options() : input.options();
  at::Tensor sum_dy = input_g ? at::empty({c}, stats) : at::Tensor();
  at::Tensor sum_dy_xmu = input_g ? at::empty({c}, stats) : at::Tensor();
  at::Tensor grad_weight = weight_g ? at::empty({c}, params) : at::Tensor();
  at::Tensor grad_bias = bias_g ? at::empty({c}, params) : at::Tensor();
  launch_cpu_function("aten::batch_norm_backward_reduce", {grad_out, input, mean, invstd},
                      {sum_dy, sum_dy_xmu, grad_weight, grad_bias}, [](const std::vector<at::Tensor>& in) {
                        const auto acc = acc_type(in[1]);
                        const auto dims = reduced_dims(in[1]);
                        const auto shape = channel_shape(in[1]);
                        const at::Tensor dy = in[0].to(acc);
                        const at::Tensor xmu = in[1].to(acc) - in[2].to(acc).view(shape);
                        at::Tensor s_dy = dy.sum(dims), s_dy_xmu = (dy * xmu).sum(dims);
                        return std::vector<at::Tensor>{s_dy, s_dy_xmu, s_dy_xmu * in[3].to(acc), s_dy};
                      });
  return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
}

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                                     const at::Tensor& invstd, const std::optional<at::Tensor>& weight,
                                     const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu, const at::Tensor& count) {
  check_input(input, "batch_norm_backward_elemt");
  at::Tensor grad_in = at::empty_like(input);
  launch_cpu_function("aten::batch_norm_backward_elemt",
                      {grad_out, input, mean, invstd, weight.value_or(at::Tensor()), sum_dy, sum_dy_xmu, count},
                      {grad_in}, [](const std::vector<at::Tensor>& in) {
                        const at::Tensor& x = in[1];
                        const auto acc = acc_type(x);
                        const auto shape = channel_shape(x);
                        const at::Tensor total = in[7].to(acc).sum();
                        const at::Tensor mean_dy = (in[5].to(acc) / total).view(shape);
                        const at::Tensor mean_dy_xmu = (in[6].to(acc) / total).view(shape);
                        const at::Tensor is = in[3].to(acc).view(shape);
                        at::Tensor scale = in[4].defined() ? is * in[4].to(acc).view(shape) : is;
                        const at::Tensor xmu = x.to(acc) - in[2].to(acc).view(shape);
                        at::Tensor g = (in[0].to(acc) - mean_dy - xmu * is.square() * mean_dy_xmu) * scale;
                        return std::vector<at::Tensor>{g.to(x.scalar_type())};
                      });
  return grad_in;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", batch_norm_stats);
  m.impl("batch_norm_gather_stats_with_counts", batch_norm_gather_stats_with_counts);
  m.impl("batch_norm_elemt", batch_norm_elemt);
  m.impl("batch_norm_backward_reduce", batch_norm_backward_reduce);
  m.impl("batch_norm_backward_elemt", batch_norm_backward_elemt);
}

}  // namespace c10::openreg
