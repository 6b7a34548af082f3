// Scaled dot-product attention through the "overrideable" fused backend.
//
// torch.nn.functional.scaled_dot_product_attention asks the backend which
// implementation to use through the _fused_sdp_choice_stub DispatchStub (the
// aten::_fused_sdp_choice operator answers direct calls; without the stub,
// PyTorch picks MATH for every call). openreg answers OVERRIDEABLE
// when it can (no dropout, no grouped-query attention) and MATH otherwise,
// and implements _scaled_dot_product_fused_attention_overrideable and its
// backward as device kernels:
//   S = scale * Q K^T + bias (causal: -inf above the diagonal), P = softmax(S), O = P V
//   dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q
// The forward returns logsumexp(S), in float32 (the CPU's flash backward reads
// it, recomputed in float64 for float64 inputs); the composed backward rebuilds
// P from the scores instead of storing it.
// Without a mask (the common case: causal or none) and with one head size for
// Q, K and V, both run the CPU's own fused flash-attention kernels on the
// kernel views instead
// (_scaled_dot_product_flash_attention_for_cpu and its backward, which return
// the same logsumexp): 4-5x faster than the composed form above, which stays
// for masks (whose gradient the flash backward does not give) and rows that
// a mask leaves empty (0, as MATH's _safe_softmax gives).
#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/TensorOperators.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_safe_softmax.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/_transformer_encoder_layer_fwd_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "OpenRegLaunch.h"

namespace c10::openreg {

namespace {

// The dtypes the CPU's flash attention is compiled for; the others (float8) take MATH, whose CPU
// ops raise the CPU's error at the call (the fused kernel failed at a later synchronisation).
bool is_flash_dtype(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// The mask must broadcast to the scores' shape (not the scores to a larger one), as the CPU's
// in-place add into the scores requires. With symbolic sizes: the backend choice checks with it under
// fake tensors too (a guard per dim, as the CPU's MATH ops install).
void check_mask_broadcasts(const at::Tensor& query, const at::Tensor& key, const at::Tensor& mask) {
  auto scores = query.sym_sizes().vec();
  scores.back() = key.sym_size(-2);
  const auto shape = at::infer_size_symint(scores, mask.sym_sizes());
  TORCH_CHECK(c10::SymIntArrayRef(shape) == c10::SymIntArrayRef(scores), "output with shape ",
              c10::SymIntArrayRef(scores), " doesn't match the broadcast shape ", c10::SymIntArrayRef(shape));
}

int64_t sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                   const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa) {
  // sym_size, not size: under export or torch.compile(dynamic=True) the inputs are fake tensors with
  // symbolic sizes, and size() would turn every dim of the query into a constant (a guard per dim).
  // Comparing the head counts guards on that equality alone.
  // Under torch.func.vmap functorch has no batching rule for the overrideable op (it returns SymInts,
  // so none can be generated): MATH, whose ops all batch (per-sample gradients of an attention model
  // failed with "Batching rule not implemented"). A batched input may sit inside an inner
  // transform's wrapper (vmap(grad(f)) hands the composite grad wrappers of batched tensors), which
  // only functorch's headers could open (they need nlohmann/json): any torch.func input takes MATH.
  const auto functorch = [](const at::Tensor& t) {
    return t.key_set().has_any(
        c10::DispatchKeySet({c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper}));
  };
  // The fused kernels take one batch and head count for Q, K and V and one head size for Q and K, as
  // the CPU's flash attention does, and compared as it compares them (so the same guards under
  // export); broadcasting sizes (a K and V of batch 1, a V of one head) take MATH, as on the CPU,
  // which also refuses sizes that do not broadcast at the call. (The flash kernel read past the end
  // of a broadcast K and V: wrong results, and a corrupted heap in the backward.) K's and V's
  // sequence lengths are not compared here, as the CPU does not (an export with a dim of each would
  // get a guard equating them): the kernel checks them at the call. Nested tensors take MATH, as on
  // the CPU (their sequence dimension has no single size).
  const char* unsupported = nullptr;
  if (dropout_p != 0.0)
    unsupported = "dropout";
  else if (enable_gqa)
    unsupported = "grouped-query attention";
  else if (query.is_nested() || key.is_nested() || value.is_nested())
    unsupported = "nested tensors";
  else if (!is_flash_dtype(query.scalar_type()))  // MATH raises the CPU's error, under fake tensors too
    unsupported = "inputs that are not float32, float64, float16 or bfloat16";
  else if (query.dim() != 4 || key.dim() != 4 || value.dim() != 4)
    unsupported = "inputs that are not 4-D (batch, heads, sequence, head size)";
  else if (functorch(query) || functorch(key) || functorch(value) || (attn_mask.has_value() && functorch(*attn_mask)))
    unsupported = "torch.func transforms";
  else if (query.sym_size(0) != key.sym_size(0) || key.sym_size(0) != value.sym_size(0) ||
           query.sym_size(1) != key.sym_size(1) || key.sym_size(1) != value.sym_size(1) ||
           query.sym_size(3) != key.sym_size(3))
    unsupported = "batch sizes, head counts or head sizes that differ between query, key and value";
  // Checked here too, as the kernel checks it at the call: under fake tensors the overrideable op's
  // meta kernel checks nothing, and an export took a mask that does not broadcast, and left its dims
  // unrelated to the key's length (the CPU's MATH ops raise, and guard each dim).
  if (unsupported == nullptr && attn_mask.has_value() && attn_mask->defined())
    check_mask_broadcasts(query, key, *attn_mask);
  const auto& ctx = at::globalContext();  // torch.nn.attention.sdpa_kernel selects the allowed backends
  if (unsupported == nullptr && ctx.userEnabledOverrideableSDP())
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  // A disabled backend is the reason whatever the inputs: what it would not support is beside the point.
  TORCH_CHECK(ctx.userEnabledMathSDP(), "No available kernel for scaled_dot_product_attention on openreg: ",
              unsupported == nullptr || !ctx.userEnabledOverrideableSDP()
                  ? "the OVERRIDEABLE backend is disabled"
                  : std::string("the OVERRIDEABLE backend does not support ") + unsupported,
              ", and the MATH backend is disabled");
  return static_cast<int64_t>(at::SDPBackend::math);
}

// The output follows the query's memory layout (the order of its strides), as the meta kernel in
// torch/_meta_registrations.py (alloc_with_matching_layout) says: compiled and exported graphs are
// traced with the meta kernel's strides and may view the result accordingly.
at::Tensor empty_with_layout_of(const at::Tensor& query, at::IntArrayRef shape) {
  if (query.sizes() == shape) return at::empty_like(query);
  std::vector<int64_t> order(query.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return query.stride(a) > query.stride(b); });
  std::vector<int64_t> strides(query.dim());
  int64_t stride = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    strides[*it] = stride;
    stride *= shape[*it];
  }
  return at::empty_strided(shape, strides, query.options());
}

// Whether the CPU's flash-attention kernels serve a call: no mask, one head size for Q, K and V, and
// no empty input (the CPU's own choice, sdp::use_flash_attention_cpp, asks the same). They read
// their inputs as contiguous in the last dimension: flash_input makes them so (on the device).
bool flash_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias) {
  return !bias.defined() && q.size(-1) == k.size(-1) && q.size(-1) == v.size(-1) && q.numel() > 0 && k.numel() > 0;
}

at::Tensor flash_input(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// Scores S = scale * Q K^T + bias, with the causal mask applied (CPU tensors).
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& bias, bool is_causal, double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (bias.defined())
    s = bias.scalar_type() == at::kBool ? at::where(bias, s, -std::numeric_limits<double>::infinity()) : s + bias;
  if (is_causal) {
    at::Tensor keep = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).tril();
    s = at::where(keep, s, -std::numeric_limits<double>::infinity());
  }
  return s;
}

// The composed attention runs in float32 for 16-bit inputs (scores, softmax and both products, as
// the CPU's MATH and flash kernels do: computed in bfloat16, the scores were rounded before the
// softmax, and the forward's error was 3 to 10 times the CPU's) and in the input's type otherwise
// (float64 stays float64, so gradcheck works).
at::ScalarType accumulate_type(const at::Tensor& q) { return at::promote_types(q.scalar_type(), at::kFloat); }

// `t` in the accumulation type `acc`, if it is a floating tensor (a boolean mask stays as it is).
at::Tensor widened(const at::Tensor& t, at::ScalarType acc) {
  return t.defined() && t.is_floating_point() ? t.to(acc) : t;
}

// P = softmax(S), as the MATH backend's _safe_softmax: a row that the masks leave no position for
// is all zeros, not NaN. Not exp(S - logsumexp(S)): a row masked with the dtype's lowest value (a
// padding mask of finfo.min) has a logsumexp that rounds to that value, and P was 1 everywhere
// (the sum of V instead of its mean); and the backward would depend on the rounding of the
// forward's float32 logsumexp (float64 gradients were off by up to e^32 for a row masked with -1e9).
at::Tensor probabilities(const at::Tensor& s) { return at::_safe_softmax(s, -1); }

// A direct call of the fused ops with sizes their kernels do not take (sdp_choice sends them to MATH).
void check_sizes(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4,
              "openreg's fused attention takes 4-D query, key and value (batch, heads, sequence, head size)");
  TORCH_CHECK(query.size(0) == key.size(0) && key.size(0) == value.size(0) && query.size(1) == key.size(1) &&
                  key.size(1) == value.size(1) && key.size(2) == value.size(2) && query.size(3) == key.size(3),
              "openreg's fused attention takes one batch and head count for query, key and value, one sequence "
              "length for key and value and one head size for query and key; got query ",
              query.sizes(), ", key ", key.sizes(), " and value ", value.sizes(), " (the MATH backend broadcasts)");
}

double scale_of(const at::Tensor& q, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
attention_forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                  const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal, bool return_debug_mask,
                  std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0.0, "openreg's fused attention does not implement dropout (the MATH backend does)");
  // The CPU's kernels refuse these at the call, in these words; the kernel would refuse them at a
  // later synchronising call.
  TORCH_CHECK(is_flash_dtype(query.scalar_type()), "expected scalar type Float but found ", query.scalar_type());
  check_sizes(query, key, value);
  if (attn_bias.has_value() && attn_bias->defined()) check_mask_broadcasts(query, key, *attn_bias);
  c10::DeviceGuard guard(query.device());
  auto sizes = query.sizes().vec();
  sizes.back() = value.size(-1);
  at::Tensor out = empty_with_layout_of(query, sizes);
  // float32, as the op's meta kernel says (compiled graphs read it as that), for float64 inputs too
  // (computed in float64 and rounded; the backward does not read it for them).
  at::Tensor lse = at::empty(query.sizes().slice(0, 3), query.options().dtype(at::kFloat));
  const double s = scale_of(query, scale);
  launch_cpu_function(
      "aten::_scaled_dot_product_fused_attention_overrideable", {query, key, value, attn_bias.value_or(at::Tensor())},
      {out, lse}, [is_causal, s](const std::vector<at::Tensor>& a) {
        if (flash_applies(a[0], a[1], a[2], a[3])) {  // the CPU's flash attention (see the top)
          auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(flash_input(a[0]), flash_input(a[1]),
                                                                        flash_input(a[2]), 0.0, is_causal, {}, s);
          return std::vector<at::Tensor>{o, l};
        }
        const at::ScalarType acc = accumulate_type(a[0]);
        at::Tensor sc = scores(widened(a[0], acc), widened(a[1], acc), widened(a[3], acc), is_causal, s);
        at::Tensor o = at::matmul(probabilities(sc), widened(a[2], acc)).to(a[0].scalar_type());
        return std::vector<at::Tensor>{o, at::logsumexp(sc, -1)};
      });
  // The other results as the meta kernel describes them (compiled graphs assert their sizes): no
  // cumulative sequence lengths and no debug mask (undefined), and 0-dim Philox seed and offset
  // (unused: openreg's fused attention has no dropout).
  const auto philox = query.options().dtype(at::kLong);
  return {out,
          lse,
          at::Tensor(),
          at::Tensor(),
          c10::SymInt(query.size(-2)),
          c10::SymInt(key.size(-2)),
          at::empty({}, philox),
          at::empty({}, philox),
          at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor&, const at::Tensor&, c10::SymInt, c10::SymInt, double dropout_p,
    bool is_causal, const at::Tensor&, const at::Tensor&, std::optional<double> scale) {
  if (!grad_out.defined()) return {};  // no gradient flows in: none flows out (autograd reads them as zeros)
  check_sizes(query, key, value);
  TORCH_CHECK(grad_out.sizes() == out.sizes() && out.size(-1) == value.size(-1) &&
                  out.sizes().slice(0, 3) == query.sizes().slice(0, 3),
              "openreg's fused attention backward: grad_out and out must have the output's sizes");
  c10::DeviceGuard guard(query.device());
  auto maybe = [&](bool wanted, const at::Tensor& like) {
    return wanted && like.defined() ? at::empty_like(like) : at::Tensor();  // as the meta kernel: like the input
  };
  at::Tensor gq = maybe(grad_input_mask[0], query), gk = maybe(grad_input_mask[1], key),
             gv = maybe(grad_input_mask[2], value), gb = maybe(grad_input_mask[3], attn_bias);
  const double s = scale_of(query, scale);
  launch_cpu_function("aten::_scaled_dot_product_fused_attention_overrideable_backward",
                      {grad_out, query, key, value, attn_bias, out, logsumexp}, {gq, gk, gv, gb},
                      [is_causal, s](const std::vector<at::Tensor>& a) {
                        const at::Tensor &dout = a[0], &q = a[1], &k = a[2], &v = a[3], &bias = a[4], &o = a[5];
                        const at::ScalarType acc = accumulate_type(q);
                        // The flash backward reads the logsumexp: the forward's float32 one, exact for
                        // every input but float64, whose logsumexp is recomputed here in float64.
                        if (flash_applies(q, k, v, bias)) {
                          const at::Tensor lse = acc == at::kFloat
                                                     ? a[6].contiguous()
                                                     : at::logsumexp(scores(q, k, at::Tensor(), is_causal, s), -1);
                          auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
                              flash_input(dout), flash_input(q), flash_input(k), flash_input(v), flash_input(o), lse,
                              0.0, is_causal, {}, s);
                          return std::vector<at::Tensor>{dq, dk, dv, at::Tensor()};
                        }
                        const at::Tensor qa = widened(q, acc), ka = widened(k, acc), da = widened(dout, acc);
                        at::Tensor p = probabilities(scores(qa, ka, widened(bias, acc), is_causal, s));
                        at::Tensor dp = at::matmul(da, widened(v, acc).transpose(-2, -1));
                        at::Tensor ds = p * (dp - (da * widened(o, acc)).sum(-1, /*keepdim=*/true));
                        return std::vector<at::Tensor>{
                            (at::matmul(ds, ka) * s).to(q.scalar_type()),
                            (at::matmul(ds.transpose(-2, -1), qa) * s).to(k.scalar_type()),
                            at::matmul(p.transpose(-2, -1), da).to(v.scalar_type()),
                            bias.defined() ? at::sum_to(ds, bias.sizes()).to(bias.scalar_type()) : at::Tensor()};
                      });
  return {gq, gk, gv, gb};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", sdp_choice);
  m.impl("_scaled_dot_product_fused_attention_overrideable", attention_forward);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", attention_backward);
  // nn.TransformerEncoderLayer's inference fast path: ATen's device-generic composite (CPU and CUDA
  // register the same function), run on the host over openreg's operators. On the generic path the
  // whole layer was one kernel on a stream worker, where the caller's autocast region does not
  // reach: it ran in float32 inside torch.autocast("openreg").
  m.impl("_transformer_encoder_layer_fwd", at::native::transformer_encoder_layer_forward);
}

}  // namespace c10::openreg

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &c10::openreg::sdp_choice)
}  // namespace at::native
