// Fused int8 operators in the openreg_quant namespace: qlinear and qconv2d
// (torch.ops.openreg_quant.*), with an optional relu and a quantized or float
// output, and their prepack ops.
//
// On the device they run the CPU's fastest int8 path over kernel views: oneDNN's
// qlinear_pointwise / qconv2d_pointwise (measured on this machine's AVX2 CPU:
// 1024x1024 linear at M=32 ~0.06 ms vs 0.43 ms in float32; fbgemm's
// quantized::linear and _int_mm were slower than float32). oneDNN wants its
// weight reordered once ("prepacked"): the packed form is device-side state
// owned by the weight tensor (a cache entry that dies with the weight's
// TensorImpl and is rebuilt when the weight is written), made by the first
// kernel that needs it, or ahead of time by the prepack ops (qlinear_prepack, qconv2d_prepack).
// The op takes symmetric weights only: w_zero_points must be zeros.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cpu/Utils.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "../QuantCommon.h"

namespace openreg_quant {
namespace {

// ---- the packed-weight cache: one entry per (weight, packing parameters) ----

struct Packed {
  std::mutex mutex;  // kernels of several streams may pack the same weight
  at::Tensor onednn;
};

// What the host sees of a weight: a write through the tensor moves the version; `.data = t`
// and `set_` change the storage or the geometry without moving it.
struct WeightState {
  uint32_t version;
  const void* data;
  int64_t offset;
  std::vector<int64_t> sizes, strides;
  bool operator==(const WeightState& o) const {
    return version == o.version && data == o.data && offset == o.offset && sizes == o.sizes && strides == o.strides;
  }
};

WeightState state_of(const at::Tensor& weight) {
  return {weight.unsafeGetTensorImpl()->version_counter().current_version(), weight.storage().data(),
          weight.storage_offset(), weight.sizes().vec(), weight.strides().vec()};
}

struct CacheEntry {
  c10::weak_intrusive_ptr<c10::TensorImpl> owner;
  const c10::TensorImpl* impl;
  WeightState state;
  std::string key;
  std::shared_ptr<Packed> packed;
};

std::mutex cache_mutex;
std::vector<CacheEntry> cache;

// Host side: the packed form for `weight` under `key`; a new (empty) one when the weight changed
// in a way the host sees (WeightState) or was never packed with these parameters.
std::shared_ptr<Packed> packed_for(const at::Tensor& weight, const std::string& key) {
  WeightState state = state_of(weight);
  std::lock_guard<std::mutex> lock(cache_mutex);
  // Entries of weights that no longer exist go first (their TensorImpl address may be reused).
  cache.erase(std::remove_if(cache.begin(), cache.end(), [](const CacheEntry& e) { return e.owner.expired(); }),
              cache.end());
  for (auto& e : cache) {
    if (e.impl != weight.unsafeGetTensorImpl() || e.key != key) continue;
    if (!(e.state == state)) e.packed = std::make_shared<Packed>(), e.state = std::move(state);
    return e.packed;
  }
  cache.push_back({c10::weak_intrusive_ptr<c10::TensorImpl>(weight.getIntrusivePtr()), weight.unsafeGetTensorImpl(),
                   std::move(state), key, std::make_shared<Packed>()});
  return cache.back().packed;
}

// Device side: packs with `pack` (given contiguous `sources`) unless `packed` holds a form
// already. Whether it is still the form of these values is the host's to say (packed_for's key):
// comparing the bytes here would cost a pass over the weight in every call.
template <typename Pack>
at::Tensor ensure_packed(Packed& packed, const std::vector<at::Tensor>& sources, Pack pack) {
  std::lock_guard<std::mutex> lock(packed.mutex);
  if (!packed.onednn.defined()) {
    std::vector<at::Tensor> contiguous;
    for (const auto& t : sources) contiguous.push_back(t.contiguous());
    packed.onednn = pack(contiguous);
  }
  return packed.onednn;
}

// Calls a CPU operator (oneDNN's) through the dispatcher, boxed: its handle is looked up once.
c10::IValue call_boxed(const c10::OperatorHandle& op, std::vector<c10::IValue> args) {
  op.callBoxed(&args);
  return std::move(args.at(0));
}

// The oneDNN operators the kernels run, looked up on first use.
#define OPENREG_QUANT_ONEDNN_OP(fn, name)                                                               \
  const c10::OperatorHandle& fn() {                                                                     \
    static const c10::OperatorHandle handle = c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); \
    return handle;                                                                                      \
  }
OPENREG_QUANT_ONEDNN_OP(onednn_linear_prepack, "onednn::qlinear_prepack")
OPENREG_QUANT_ONEDNN_OP(onednn_linear, "onednn::qlinear_pointwise")
OPENREG_QUANT_ONEDNN_OP(onednn_conv_prepack, "onednn::qconv_prepack")
OPENREG_QUANT_ONEDNN_OP(onednn_conv, "onednn::qconv2d_pointwise")
#undef OPENREG_QUANT_ONEDNN_OP

std::string key_of(std::initializer_list<std::string> parts) {
  std::string key;
  for (const auto& p : parts) key += p + ";";
  return key;
}

std::string str(c10::IntArrayRef v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void check_common(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& w_scales,
                  const at::Tensor& w_zero_points, const std::optional<at::Tensor>& bias,
                  std::optional<at::ScalarType> output_dtype, c10::string_view post_op, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kByte || x.scalar_type() == at::kChar, name,
              ": x must be uint8 or int8 (quantized activations), got ", py_dtype(x.scalar_type()), ".");
  TORCH_CHECK(weight.scalar_type() == at::kChar, name, ": weight must be int8, got ", py_dtype(weight.scalar_type()),
              ".");
  for (const at::Tensor* t : {&weight, &w_scales, &w_zero_points})
    check_on_device(*t, x, "weight and its qparams", name);
  TORCH_CHECK(w_scales.scalar_type() == at::kFloat && w_scales.dim() == 1 && w_scales.numel() == weight.size(0), name,
              ": w_scales must be float32 with one value per output channel (", weight.size(0), "), got ",
              py_dtype(w_scales.scalar_type()), " of shape ", str(w_scales.sizes()), ".");
  TORCH_CHECK(
      w_zero_points.scalar_type() == at::kLong && w_zero_points.dim() == 1 && w_zero_points.numel() == weight.size(0),
      name, ": w_zero_points must be int64 with one value per output channel (", weight.size(0), "), got ",
      py_dtype(w_zero_points.scalar_type()), " of shape ", str(w_zero_points.sizes()), ".");
  if (bias && bias->defined()) {
    check_on_device(*bias, x, "bias", name);
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->numel() == weight.size(0), name,
                ": bias must be float32 with one value per output channel (", weight.size(0), ").");
  }
  if (output_dtype)
    TORCH_CHECK(*output_dtype == at::kFloat || *output_dtype == at::kBFloat16, name,
                ": output_dtype must be None (quantized output), torch.float32 or torch.bfloat16, got ",
                py_dtype(*output_dtype), ".");
  TORCH_CHECK(post_op == "none" || post_op == "relu", name, ": post_op must be 'none' or 'relu', got '", post_op, "'.");
}

// Device side: the op is symmetric-only. Reading the zero points on the host would make it wait
// for the device, so the kernel checks them and the next synchronising call reports a failure.
void check_symmetric(const at::Tensor& zero_points, const char* name) {
  TORCH_CHECK(!zero_points.any().item<bool>(), name,
              ": w_zero_points must be all zero: the op takes symmetric int8 weights only (dequantize the weight, "
              "or requantize it symmetrically, for an asymmetric one).");
}

// The output's dtype: the activations' (quantized output) or the requested float type.
at::ScalarType out_type(const at::Tensor& x, std::optional<at::ScalarType> output_dtype) {
  return output_dtype.value_or(x.scalar_type());
}

// ---- oneDNN's int8 products on CPUs without VNNI ----

// On x86 CPUs without VNNI oneDNN multiplies u8 activations by s8 weights with vpmaddubsw, which
// sums the products in pairs into 16 bits, saturating: an activation above 127 next to a large
// weight gives a result off by several quanta (5 to 12 in the tests, on an AVX2 EPYC; PyTorch's x86
// quantization configs reduce activations to 7 bits on such CPUs for this reason). s8 activations
// are shifted to u8 first, so they can saturate too. These calls take an exact path instead.
bool int8_pairs_saturate() {
  static const bool saturate = [] {
    const auto caps = at::cpu::get_cpu_capabilities();
    auto has = [&](const char* k) {
      auto it = caps.find(k);
      return it != caps.end() && it->second.isBool() && it->second.toBool();
    };
    auto arch = caps.find("architecture");
    const bool x86 = arch != caps.end() && arch->second.isString() && arch->second.toStringRef() == "x86_64";
    return x86 && !has("avx512_vnni") && !has("avx_vnni") && !has("amx_int8");
  }();
  return saturate;
}

// Device side: whether oneDNN would saturate on these activations.
bool needs_exact_path(const at::Tensor& x) {
  if (!int8_pairs_saturate()) return false;
  return x.scalar_type() != at::kByte || (x.numel() > 0 && x.max().item<uint8_t>() > 127);
}

// The exact path: the integer products summed in float64 (exact: |sum| < 2^53), then what oneDNN
// does with its int32 sums: scaled by x_scale * w_scale in float32, bias, post-op, and the output
// rounded half to even and clamped (quantized) or cast (float).
at::Tensor exact_int8(const at::Tensor& acc, double x_scale, const at::Tensor& w_scales,
                      const std::optional<at::Tensor>& bias, double output_scale, int64_t output_zero_point,
                      std::optional<at::ScalarType> output_dtype, const std::string& post_op, at::ScalarType x_dtype) {
  std::vector<int64_t> per_channel(acc.dim(), 1);
  per_channel[1] = -1;  // [M, N] or [N, C, H, W]: the channels are dimension 1
  at::Tensor y = acc.to(at::kFloat) * (w_scales.to(at::kFloat) * static_cast<float>(x_scale)).view(per_channel);
  if (bias) y = y + bias->to(at::kFloat).view(per_channel);
  if (post_op == "relu") y = y.relu();
  if (output_dtype) return y.to(*output_dtype);
  const bool u8 = x_dtype == at::kByte;
  return (at::round(y * static_cast<float>(1.0 / output_scale)) + output_zero_point)
      .clamp(u8 ? 0 : -128, u8 ? 255 : 127)
      .to(x_dtype);
}

// ---- qlinear ----

// Device side: the oneDNN form of a linear weight (packed now unless already from these values).
at::Tensor pack_linear(Packed& packed, const at::Tensor& weight) {
  return ensure_packed(packed, {weight}, [](const std::vector<at::Tensor>& src) {
    return call_boxed(onednn_linear_prepack(), {src[0], c10::IValue()}).toTensor();
  });
}

void check_linear_weight_rank(const at::Tensor& weight, const char* name) {
  TORCH_CHECK(weight.dim() == 2, name, ": weight must be 2-D [out_features, in_features], got ", weight.dim(), "-D.");
}

std::vector<int64_t> linear_shape(const at::Tensor& x, const at::Tensor& weight, const char* name) {
  check_linear_weight_rank(weight, name);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), name, ": x's last dimension (", x.dim() ? x.size(-1) : 0,
              ") must equal in_features (", weight.size(1), ").");
  // oneDNN has no empty reduction: on the CPU the same call dies with SIGFPE.
  TORCH_CHECK(weight.size(1) > 0, name, ": in_features must be at least 1, got weight of shape ", str(weight.sizes()),
              ".");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  return shape;
}

at::Tensor qlinear(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& weight,
                   const at::Tensor& w_scales, const at::Tensor& w_zero_points, const std::optional<at::Tensor>& bias,
                   double output_scale, int64_t output_zero_point, std::optional<at::ScalarType> output_dtype,
                   c10::string_view post_op) {
  const char* name = "openreg_quant::qlinear";
  check_linear_weight_rank(weight, name);  // before the per-channel checks, which read size(0)
  check_common(x, weight, w_scales, w_zero_points, bias, output_dtype, post_op, name);
  at::Tensor out = at::empty(linear_shape(x, weight, name), x.options().dtype(out_type(x, output_dtype)));
  if (out.numel() == 0) return out;
  auto packed = packed_for(weight, "linear");
  std::optional<KernelTensorArg> b_arg;
  if (bias && bias->defined()) b_arg.emplace(*bias);
  OPENREG_CHECK(::openreg::launch(
      stream_of(x), name,
      [x_arg = KernelTensorArg(x), w_arg = KernelTensorArg(weight), s_arg = KernelTensorArg(w_scales),
       z_arg = KernelTensorArg(w_zero_points), b_arg, y_arg = KernelTensorArg(out), packed, x_scale, x_zero_point,
       output_scale, output_zero_point, output_dtype, post_op = std::string(post_op)] {
        at::Tensor xv = x_arg.materialize().contiguous();
        at::Tensor zero_points = z_arg.materialize();
        check_symmetric(zero_points, "openreg_quant::qlinear");
        at::Tensor y = y_arg.materialize();
        if (needs_exact_path(xv)) {
          at::Tensor x2 = xv.reshape({-1, xv.size(-1)}).to(at::kDouble) - static_cast<double>(x_zero_point);
          at::Tensor acc = at::mm(x2, w_arg.materialize().to(at::kDouble).t());
          std::optional<at::Tensor> b;
          if (b_arg) b = b_arg->materialize();
          y.copy_(exact_int8(acc, x_scale, s_arg.materialize(), b, output_scale, output_zero_point, output_dtype,
                             post_op, xv.scalar_type())
                      .view(y.sizes()));
          return;
        }
        at::Tensor onednn = pack_linear(*packed, w_arg.materialize());
        c10::List<std::optional<at::Scalar>> no_args;
        at::Tensor r = call_boxed(onednn_linear(),
                                  {xv.reshape({-1, xv.size(-1)}), x_scale, x_zero_point, onednn,
                                   s_arg.materialize().contiguous(), zero_points.contiguous(),
                                   b_arg ? c10::IValue(b_arg->materialize().contiguous()) : c10::IValue(), output_scale,
                                   output_zero_point, output_dtype ? c10::IValue(*output_dtype) : c10::IValue(),
                                   post_op, no_args, std::string()})
                           .toTensor();
        y.copy_(r.view(y.sizes()));
      }));
  return out;
}

at::Tensor qlinear_meta(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& weight,
                        const at::Tensor& w_scales, const at::Tensor& w_zero_points,
                        const std::optional<at::Tensor>& bias, double output_scale, int64_t output_zero_point,
                        std::optional<at::ScalarType> output_dtype, c10::string_view post_op) {
  return at::empty(linear_shape(x, weight, "openreg_quant::qlinear"), x.options().dtype(out_type(x, output_dtype)));
}

// ---- qconv2d ----

void check_conv_ranks(const at::Tensor& x, const at::Tensor& weight, const char* name) {
  TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, name, ": x and weight must be 4-D (NCHW), got ", x.dim(), "-D and ",
              weight.dim(), "-D.");
}

std::vector<int64_t> conv_shape(const at::Tensor& x, const at::Tensor& weight, c10::IntArrayRef stride,
                                c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups, const char* name) {
  check_conv_ranks(x, weight, name);
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2, name,
              ": stride, padding and dilation must have two values each.");
  TORCH_CHECK(groups >= 1 && x.size(1) == weight.size(1) * groups && weight.size(0) % groups == 0, name, ": x has ",
              x.size(1), " channels; weight ", str(weight.sizes()), " with groups=", groups, " expects ",
              weight.size(1) * groups, ".");
  // oneDNN cannot build an empty convolution (on the CPU: "could not create a primitive descriptor").
  TORCH_CHECK(weight.size(1) > 0 && weight.size(2) > 0 && weight.size(3) > 0, name,
              ": weight must have at least one input channel per group and a non-empty kernel, got ",
              str(weight.sizes()), ".");
  std::vector<int64_t> shape{x.size(0), weight.size(0), 0, 0};
  for (int d = 0; d < 2; ++d) {
    const int64_t span = dilation[d] * (weight.size(2 + d) - 1) + 1;
    shape[2 + d] = (x.size(2 + d) + 2 * padding[d] - span) / stride[d] + 1;
    TORCH_CHECK(shape[2 + d] > 0, name, ": the kernel (", span, " with dilation) is larger than the padded input.");
  }
  return shape;
}

// The packed conv weight depends on the input's quantization and the geometry.
// oneDNN's packing takes the weight's scales too: their state as the host sees it is part of it.
std::string conv_key(double x_scale, int64_t x_zero_point, c10::IntArrayRef stride, c10::IntArrayRef padding,
                     c10::IntArrayRef dilation, int64_t groups, const at::Tensor& scales) {
  const WeightState sc = state_of(scales);
  std::ostringstream where;
  where << sc.data << "+" << sc.offset << "@v" << sc.version;
  return key_of({"conv", std::to_string(x_scale), std::to_string(x_zero_point), str(stride), str(padding),
                 str(dilation), std::to_string(groups), where.str()});
}

// Packs a conv weight on the device (the kernel's first step, shared by qconv2d and qconv2d_prepack);
// oneDNN's packing takes the weight's scales too, so they are part of what must match.
at::Tensor pack_conv(Packed& packed, const at::Tensor& weight, const at::Tensor& scales, double x_scale,
                     int64_t x_zero_point, const std::vector<int64_t>& st, const std::vector<int64_t>& pad,
                     const std::vector<int64_t>& dil, int64_t groups) {
  return ensure_packed(packed, {weight, scales}, [&](const std::vector<at::Tensor>& src) {
    return call_boxed(onednn_conv_prepack(),
                      {src[0], src[1], x_scale, x_zero_point, st, pad, dil, groups, c10::IValue()})
        .toTensor();
  });
}

at::Tensor qconv2d(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& weight,
                   const at::Tensor& w_scales, const at::Tensor& w_zero_points, const std::optional<at::Tensor>& bias,
                   c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                   double output_scale, int64_t output_zero_point, std::optional<at::ScalarType> output_dtype,
                   c10::string_view post_op) {
  const char* name = "openreg_quant::qconv2d";
  check_conv_ranks(x, weight, name);  // before the per-channel checks, which read size(0)
  check_common(x, weight, w_scales, w_zero_points, bias, output_dtype, post_op, name);
  // oneDNN computes channels-last; the output is channels-last, as x86's quantized conv gives it.
  at::Tensor out =
      at::empty(conv_shape(x, weight, stride, padding, dilation, groups, name),
                x.options().dtype(out_type(x, output_dtype)).memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  // The packed conv weight depends on the input's quantization and the geometry.
  auto packed = packed_for(weight, conv_key(x_scale, x_zero_point, stride, padding, dilation, groups, w_scales));
  std::optional<KernelTensorArg> b_arg;
  if (bias && bias->defined()) b_arg.emplace(*bias);
  std::vector<int64_t> st(stride.begin(), stride.end()), pad(padding.begin(), padding.end()),
      dil(dilation.begin(), dilation.end());
  OPENREG_CHECK(::openreg::launch(
      stream_of(x), name,
      [x_arg = KernelTensorArg(x), w_arg = KernelTensorArg(weight), s_arg = KernelTensorArg(w_scales),
       z_arg = KernelTensorArg(w_zero_points), b_arg, y_arg = KernelTensorArg(out), packed, x_scale, x_zero_point, st,
       pad, dil, groups, output_scale, output_zero_point, output_dtype, post_op = std::string(post_op)] {
        at::Tensor xv = x_arg.materialize().contiguous(at::MemoryFormat::ChannelsLast);
        at::Tensor scales = s_arg.materialize().contiguous();
        at::Tensor zero_points = z_arg.materialize();
        check_symmetric(zero_points, "openreg_quant::qconv2d");
        if (needs_exact_path(xv)) {
          at::Tensor acc = at::conv2d(xv.to(at::kDouble) - static_cast<double>(x_zero_point),
                                      w_arg.materialize().to(at::kDouble), {}, st, pad, dil, groups);
          std::optional<at::Tensor> b;
          if (b_arg) b = b_arg->materialize();
          y_arg.materialize().copy_(exact_int8(acc, x_scale, scales, b, output_scale, output_zero_point, output_dtype,
                                               post_op, xv.scalar_type()));
          return;
        }
        at::Tensor onednn =
            pack_conv(*packed, w_arg.materialize(), scales, x_scale, x_zero_point, st, pad, dil, groups);
        c10::List<std::optional<at::Scalar>> no_args;
        at::Tensor r =
            call_boxed(onednn_conv(),
                       {xv, x_scale, x_zero_point, onednn, scales, zero_points.contiguous(),
                        b_arg ? c10::IValue(b_arg->materialize().contiguous()) : c10::IValue(), st, pad, dil, groups,
                        output_scale, output_zero_point, output_dtype ? c10::IValue(*output_dtype) : c10::IValue(),
                        post_op, no_args, c10::IValue(std::string())})
                .toTensor();
        y_arg.materialize().copy_(r);
      }));
  return out;
}

at::Tensor qconv2d_meta(const at::Tensor& x, double x_scale, int64_t x_zero_point, const at::Tensor& weight,
                        const at::Tensor& w_scales, const at::Tensor& w_zero_points,
                        const std::optional<at::Tensor>& bias, c10::IntArrayRef stride, c10::IntArrayRef padding,
                        c10::IntArrayRef dilation, int64_t groups, double output_scale, int64_t output_zero_point,
                        std::optional<at::ScalarType> output_dtype, c10::string_view post_op) {
  return at::empty(conv_shape(x, weight, stride, padding, dilation, groups, "openreg_quant::qconv2d"),
                   x.options().dtype(out_type(x, output_dtype)).memory_format(at::MemoryFormat::ChannelsLast));
}

// ---- prepack: pack now (one kernel) instead of in the first call ----

void qlinear_prepack(const at::Tensor& weight) {
  TORCH_CHECK(weight.is_privateuseone() && weight.scalar_type() == at::kChar && weight.dim() == 2,
              "openreg_quant::qlinear_prepack: weight must be a 2-D int8 openreg tensor.");
  auto packed = packed_for(weight, "linear");
  OPENREG_CHECK(
      ::openreg::launch(stream_of(weight), "openreg_quant::qlinear_prepack",
                        [w_arg = KernelTensorArg(weight), packed] { pack_linear(*packed, w_arg.materialize()); }));
}

void qconv2d_prepack(const at::Tensor& weight, const at::Tensor& w_scales, double x_scale, int64_t x_zero_point,
                     c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  TORCH_CHECK(weight.is_privateuseone() && weight.scalar_type() == at::kChar && weight.dim() == 4,
              "openreg_quant::qconv2d_prepack: weight must be a 4-D int8 openreg tensor.");
  check_on_device(w_scales, weight, "w_scales", "openreg_quant::qconv2d_prepack");
  auto packed = packed_for(weight, conv_key(x_scale, x_zero_point, stride, padding, dilation, groups, w_scales));
  std::vector<int64_t> st(stride.begin(), stride.end()), pad(padding.begin(), padding.end()),
      dil(dilation.begin(), dilation.end());
  OPENREG_CHECK(::openreg::launch(stream_of(weight), "openreg_quant::qconv2d_prepack",
                                  [w_arg = KernelTensorArg(weight), s_arg = KernelTensorArg(w_scales), packed, x_scale,
                                   x_zero_point, st, pad, dil, groups] {
                                    pack_conv(*packed, w_arg.materialize(), s_arg.materialize().contiguous(), x_scale,
                                              x_zero_point, st, pad, dil, groups);
                                  }));
}

int64_t packed_weight_count() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  cache.erase(std::remove_if(cache.begin(), cache.end(), [](const CacheEntry& e) { return e.owner.expired(); }),
              cache.end());
  return static_cast<int64_t>(cache.size());
}

}  // namespace

TORCH_LIBRARY(openreg_quant, m) {
  m.def(
      "qlinear(Tensor x, float x_scale, int x_zero_point, Tensor weight, Tensor w_scales, Tensor w_zero_points, "
      "Tensor? bias, float output_scale, int output_zero_point, ScalarType? output_dtype, str post_op) -> Tensor");
  m.def(
      "qconv2d(Tensor x, float x_scale, int x_zero_point, Tensor weight, Tensor w_scales, Tensor w_zero_points, "
      "Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, float output_scale, "
      "int output_zero_point, ScalarType? output_dtype, str post_op) -> Tensor");
  m.def("qlinear_prepack(Tensor weight) -> ()");
  m.def(
      "qconv2d_prepack(Tensor weight, Tensor w_scales, float x_scale, int x_zero_point, int[] stride, int[] padding, "
      "int[] dilation, int groups) -> ()");
  m.def("packed_weight_count() -> int", TORCH_FN(packed_weight_count));
  // Whether this CPU takes the exact path for activations oneDNN would saturate on (see above).
  m.def("int8_pairs_saturate() -> bool", TORCH_FN(int8_pairs_saturate));
}

TORCH_LIBRARY_IMPL(openreg_quant, PrivateUse1, m) {
  m.impl("qlinear", TORCH_FN(qlinear));
  m.impl("qconv2d", TORCH_FN(qconv2d));
  m.impl("qlinear_prepack", TORCH_FN(qlinear_prepack));
  m.impl("qconv2d_prepack", TORCH_FN(qconv2d_prepack));
}

TORCH_LIBRARY_IMPL(openreg_quant, Meta, m) {
  m.impl("qlinear", TORCH_FN(qlinear_meta));
  m.impl("qconv2d", TORCH_FN(qconv2d_meta));
}

}  // namespace openreg_quant
