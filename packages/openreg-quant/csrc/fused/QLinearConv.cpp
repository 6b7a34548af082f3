// Fused int8 operators in the openreg_quant namespace: qlinear and qconv2d
// (torch.ops.openreg_quant.*), with an optional relu and a quantized (optionally
// clamped to a narrower range) or float output, and their prepack ops.
//
// On the device they run the CPU's fastest int8 path over kernel views: oneDNN's
// qlinear_pointwise / qconv2d_pointwise (measured on this machine's AVX2 CPU:
// 1024x1024 linear at M=32 ~0.06 ms vs 0.43 ms in float32; fbgemm's
// quantized::linear and _int_mm were slower than float32). oneDNN wants its
// weight reordered once: the prepack ops return a PackedWeight
// (torch.classes.openreg_quant.PackedWeight) that owns device copies of the
// weight and its parameters and, as device-side state, oneDNN's form of it;
// qlinear and qconv2d take that object as their weight, as oneDNN's own ops take
// a prepacked weight. The ops take symmetric weights only: w_zero_points must be zeros.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cpu/Utils.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "../QuantCommon.h"

namespace openreg_quant {
namespace {

// ---- the packed weight: what the prepack ops return and qlinear/qconv2d take ----

// oneDNN's form of a packed weight: device-side state, made by a kernel (the prepack's, or the
// first call that finds it missing) and read by kernels only. Kernels capture it, not the
// PackedWeight: dropping the object frees its device tensors at once, as dropping any tensor does
// while its kernels are queued (PackedWeight::record_current_stream makes that safe for kernels
// queued on other streams).
struct OneDnnForm {
  std::mutex mutex;      // kernels of several streams may use one packed weight
  bool checked = false;  // the zero points were found all zero
  at::Tensor onednn;
  // The prepack's kernel is queued and has not run: only it may keep the form it makes. A call on
  // another stream that ran before it (without waiting for it: a missing wait_stream) read a
  // weight not copied yet; the form it made was kept, and every later call used it.
  bool prepack_pending = false;
};

// torch.classes.openreg_quant.PackedWeight: an int8 weight packed once on the device. It owns its
// own copies of the weight and its per-channel parameters (made on the device by the prepack op),
// so nothing the host does to the tensors it was made from can leave oneDNN's form stale. A conv
// weight is packed for one geometry and one quantization of its activations, as oneDNN packs it.
struct PackedWeight : torch::CustomClassHolder {
  std::string kind;  // "qlinear" or "qconv2d": the op it was packed for
  at::Tensor weight, w_scales, w_zero_points;
  double x_scale = 0;  // conv2d only, from here on
  int64_t x_zero_point = 0;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  std::shared_ptr<OneDnnForm> form = std::make_shared<OneDnnForm>();

  // What pickling and copy.deepcopy keep: the tensors and the packing parameters (the oneDNN form
  // is made again on the device).
  using State = std::tuple<std::string, at::Tensor, at::Tensor, at::Tensor, double, int64_t, std::vector<int64_t>,
                           std::vector<int64_t>, std::vector<int64_t>, int64_t>;
  State state() const {
    return {kind, weight, w_scales, w_zero_points, x_scale, x_zero_point, stride, padding, dilation, groups};
  }
  // A call's kernel reads the tensors on the caller's stream. On another stream than the one they
  // were made on, their memory would go to new tensors as soon as the object is dropped, while
  // the kernel is still queued: the caller cannot record_stream them (they are private), so the
  // call records its stream for them, as the caching allocator asks of any cross-stream use (a
  // lookup when the stream is theirs).
  void record_current_stream() const {
    const c10::Stream stream = c10::openreg::getCurrentOpenRegStream(weight.device().index());
    c10::DeviceAllocator* allocator = c10::getDeviceAllocator(c10::DeviceType::PrivateUse1);
    for (const at::Tensor* t : {&weight, &w_scales, &w_zero_points})
      allocator->recordStream(t->storage().data_ptr(), stream);
  }

  static c10::intrusive_ptr<PackedWeight> from_state(State s) {
    auto p = c10::make_intrusive<PackedWeight>();
    std::tie(p->kind, p->weight, p->w_scales, p->w_zero_points, p->x_scale, p->x_zero_point, p->stride, p->padding,
             p->dilation, p->groups) = std::move(s);
    return p;
  }
};
using PackedWeightPtr = c10::intrusive_ptr<PackedWeight>;

// Device side: the op is symmetric-only. Reading the zero points on the host would make the prepack
// wait for the device, so the first kernel that uses the packed weight checks them, and the next
// synchronising call reports a failure (every later kernel that uses it fails the same way).
void check_symmetric(OneDnnForm& form, const at::Tensor& zero_points, const char* name) {
  if (form.checked) return;
  TORCH_CHECK(!zero_points.any().item<bool>(), name,
              ": w_zero_points must be all zero: the op takes symmetric int8 weights only (dequantize the weight, "
              "or requantize it symmetrically, for an asymmetric one).");
  form.checked = true;
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

std::string str(c10::IntArrayRef v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Host side, at prepack: the int8 weight (`rank`-D) and its per-channel parameters.
void check_weight(const at::Tensor& weight, const at::Tensor& w_scales, const at::Tensor& w_zero_points, int64_t rank,
                  const char* name) {
  // A CPU weight reaches here through the CPU kernel below: said first, before its parameters'
  // devices are compared with it (which told a caller with openreg scales to move them to the CPU).
  TORCH_CHECK(weight.is_privateuseone() || weight.is_meta(), name, ": the weight must be on openreg, got a tensor on ",
              weight.device(), "; pack openreg tensors (weight.to('openreg')).");
  TORCH_CHECK(weight.dim() == rank, name, ": weight must be ",
              rank == 2 ? "2-D [out_features, in_features]" : "4-D [out_channels, in_channels / groups, kH, kW]",
              ", got ", weight.dim(), "-D.");
  TORCH_CHECK(weight.scalar_type() == at::kChar, name, ": weight must be int8, got ", py_dtype(weight.scalar_type()),
              ".");
  check_on_device(w_scales, weight, "w_scales", name);
  check_on_device(w_zero_points, weight, "w_zero_points", name);
  TORCH_CHECK(w_scales.scalar_type() == at::kFloat && w_scales.dim() == 1 && w_scales.numel() == weight.size(0), name,
              ": w_scales must be float32 with one value per output channel (", weight.size(0), "), got ",
              py_dtype(w_scales.scalar_type()), " of shape ", str(w_scales.sizes()), ".");
  TORCH_CHECK(
      w_zero_points.scalar_type() == at::kLong && w_zero_points.dim() == 1 && w_zero_points.numel() == weight.size(0),
      name, ": w_zero_points must be int64 with one value per output channel (", weight.size(0), "), got ",
      py_dtype(w_zero_points.scalar_type()), " of shape ", str(w_zero_points.sizes()), ".");
  // oneDNN has no empty reduction and cannot build an empty convolution: on the CPU the same calls
  // die with SIGFPE or fail to build the primitive.
  // A convolution without output channels too (the pack failed in oneDNN, reported by whatever
  // synchronised next); a linear without out_features packs and gives [M, 0].
  bool empty = weight.size(1) == 0;
  if (rank == 4) empty = empty || weight.size(0) == 0 || weight.size(2) == 0 || weight.size(3) == 0;
  TORCH_CHECK(!empty, name,
              rank == 2 ? ": in_features must be at least 1"
                        : ": weight must have at least one output channel, one input channel per "
                          "group and a non-empty kernel",
              ", got weight of shape ", str(weight.sizes()), ".");
}

// Host side: a new packed weight holding device copies of `weight` and its parameters (made on the
// current stream; on the meta device, meta tensors).
PackedWeightPtr new_packed(const char* kind, const at::Tensor& weight, const at::Tensor& w_scales,
                           const at::Tensor& w_zero_points) {
  auto p = c10::make_intrusive<PackedWeight>();
  p->kind = kind;
  p->weight = weight.clone(at::MemoryFormat::Contiguous);
  p->w_scales = w_scales.clone(at::MemoryFormat::Contiguous);
  p->w_zero_points = w_zero_points.clone(at::MemoryFormat::Contiguous);
  return p;
}

// Host side, at the call: the activations, the packed weight and the other arguments.
// oneDNN takes 32-bit zero points and the exact path adds the 64-bit value: outside int32 the two
// paths (chosen by the activations' values) would disagree.
void check_zero_point(int64_t zero_point, const char* what, const char* name) {
  TORCH_CHECK(zero_point >= std::numeric_limits<int32_t>::min() && zero_point <= std::numeric_limits<int32_t>::max(),
              name, ": ", what, " must fit in 32 bits, got ", zero_point, ".");
}

void check_call(const at::Tensor& x, int64_t x_zero_point, const PackedWeight& w, const char* kind,
                const std::optional<at::Tensor>& bias, double output_scale, int64_t output_zero_point,
                std::optional<at::ScalarType> output_dtype, c10::string_view post_op, const char* name) {
  check_zero_point(x_zero_point, "x_zero_point", name);
  check_zero_point(output_zero_point, "output_zero_point", name);
  TORCH_CHECK(w.kind == kind, name, ": weight was packed by openreg_quant::", w.kind,
              "_prepack; pack it with openreg_quant::", kind, "_prepack.");
  TORCH_CHECK(x.scalar_type() == at::kByte || x.scalar_type() == at::kChar, name,
              ": x must be uint8 or int8 (quantized activations), got ", py_dtype(x.scalar_type()), ".");
  // A packed weight cannot move (oneDNN's form of it is device state): the input is the one to move,
  // unless the weight itself is off openreg (unpickled with map_location "cpu").
  const c10::Device where = w.weight.device();
  TORCH_CHECK(where.type() == c10::DeviceType::PrivateUse1, name, ": the packed weight is on ", where,
              "; pack (or load) it on openreg.");
  TORCH_CHECK(x.device() == where, name, ": the input must be on ", where,
              ", where the packed weight is, got a tensor on ", x.device(), ".");
  const int64_t out_channels = w.weight.size(0);
  if (bias && bias->defined()) {
    check_on_device(*bias, x, "bias", name);
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->numel() == out_channels, name,
                ": bias must be float32 with one value per output channel (", out_channels, ").");
  }
  if (output_dtype)
    TORCH_CHECK(*output_dtype == at::kFloat || *output_dtype == at::kBFloat16, name,
                ": output_dtype must be None (quantized output), torch.float32 or torch.bfloat16, got ",
                py_dtype(*output_dtype), ".");
  // A float output is not quantized: oneDNN refuses other values in the kernel, the exact path
  // ignored them, so the same call failed or not depending on the activations' values.
  if (output_dtype)
    TORCH_CHECK(output_scale == 1.0 && output_zero_point == 0, name, ": a float output (output_dtype ",
                py_dtype(*output_dtype), ") takes output_scale 1.0 and output_zero_point 0, got ", output_scale,
                " and ", output_zero_point, ".");
  TORCH_CHECK(post_op == "none" || post_op == "relu", name, ": post_op must be 'none' or 'relu', got '", post_op, "'.");
}

// The output's dtype: the activations' (quantized output) or the requested float type.
at::ScalarType out_type(const at::Tensor& x, std::optional<at::ScalarType> output_dtype) {
  return output_dtype.value_or(x.scalar_type());
}

// The range a quantized output is clamped to: output_quant_min/max, inside the dtype's range, which
// each defaults to (the quantize the op replaces: a 7-bit uint8 0..127 is a narrower one).
struct OutRange {
  int64_t lo, hi;
  bool narrower;  // than the dtype's whole range: the kernel clamps as it writes the output
};

OutRange out_range(const at::Tensor& x, std::optional<at::ScalarType> output_dtype, std::optional<int64_t> qmin,
                   std::optional<int64_t> qmax, const char* name) {
  int64_t lo = 0, hi = 0;
  qvalue_bounds(x.scalar_type(), lo, hi);  // uint8 or int8: check_call checked x
  if (!qmin && !qmax) return {lo, hi, false};
  TORCH_CHECK(!output_dtype, name, ": output_quant_min/output_quant_max apply to a quantized output only (",
              "output_dtype None), got output_dtype ", py_dtype(*output_dtype), ".");
  const int64_t a = qmin.value_or(lo), b = qmax.value_or(hi);
  TORCH_CHECK(lo <= a && a <= b && b <= hi, name, ": the output range [", a, ", ", b, "] must lie inside ",
              py_dtype(x.scalar_type()), "'s [", lo, ", ", hi, "] with min <= max.");
  return {a, b, a != lo || b != hi};
}

// Device side: writes oneDNN's result into the output, clamped to a narrower quantized range.
void write_output(at::Tensor& y, const at::Tensor& r, const OutRange& range) {
  if (range.narrower) {
    at::clamp_out(y, r, range.lo, range.hi);
  } else {
    y.copy_(r);
  }
}

// What a kernel captures of a packed weight: views of its tensors, its packing parameters and its
// oneDNN form.
struct PackedArgs {
  KernelTensorArg weight, w_scales, w_zero_points;
  bool conv;
  double x_scale;
  int64_t x_zero_point;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  std::shared_ptr<OneDnnForm> form;
  explicit PackedArgs(const PackedWeight& p)
      : weight(p.weight),
        w_scales(p.w_scales),
        w_zero_points(p.w_zero_points),
        conv(p.kind == "qconv2d"),
        x_scale(p.x_scale),
        x_zero_point(p.x_zero_point),
        stride(p.stride),
        padding(p.padding),
        dilation(p.dilation),
        groups(p.groups),
        form(p.form) {}

  // Device side, first in every kernel that uses the weight: checks the zero points (once) and, with
  // `pack`, returns oneDNN's form of the weight, made now unless made already (the exact path needs
  // none).
  // `prepack`: this is the prepack's own kernel, which checks and packs every time it runs: replayed
  // from a graph, it packs the weight copied in since (it kept the first replay's form).
  at::Tensor prepare(const char* name, bool pack, bool prepack = false) const {
    at::Tensor zero_points = w_zero_points.materialize();
    std::lock_guard<std::mutex> lock(form->mutex);
    if (prepack) {
      form->prepack_pending = false;
      form->checked = false;
      form->onednn = at::Tensor();  // a kernel applying the old form holds its own reference
    }
    check_symmetric(*form, zero_points, name);
    if (!pack) return at::Tensor();
    if (form->onednn.defined()) return form->onednn;
    at::Tensor w = weight.materialize().contiguous();
    at::Tensor made =
        conv ? call_boxed(onednn_conv_prepack(), {w, w_scales.materialize().contiguous(), x_scale, x_zero_point, stride,
                                                  padding, dilation, groups, c10::IValue()})
                   .toTensor()
             : call_boxed(onednn_linear_prepack(), {w, c10::IValue()}).toTensor();
    if (!form->prepack_pending) form->onednn = made;  // else: this call's alone (see OneDnnForm)
    return made;
  }
};

// Host side: queues the packing of `p` (one kernel) on the current stream of its device; on the meta
// device, nothing.
PackedWeightPtr launch_prepack(PackedWeightPtr p, const char* name) {
  if (p->weight.is_meta()) return p;
  p->form->prepack_pending = true;  // a fresh form: no kernel uses it yet
  OPENREG_CHECK(::openreg::launch(stream_of(p->weight), name,
                                  [w = PackedArgs(*p), name] { w.prepare(name, /*pack=*/true, /*prepack=*/true); }));
  return p;
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

// Device side: whether oneDNN would saturate on these activations. x is dense (contiguous in some
// memory format): its maximum is taken over its memory as one run, since ATen's max over a
// channels-last uint8 tensor takes a strided path ~15x slower than over the same bytes in order.
bool needs_exact_path(const at::Tensor& x) {
  if (!int8_pairs_saturate()) return false;
  if (x.scalar_type() != at::kByte) return true;
  return x.numel() > 0 && x.as_strided({x.numel()}, {1}).max().item<uint8_t>() > 127;
}

// The exact path: the integer products summed in float64 (exact: |sum| < 2^53), then what oneDNN
// does with its int32 sums: scaled by x_scale * w_scale in float32, bias, post-op, then divided by
// the output scale, the zero point added, and only then rounded half to even (rounding before the
// zero point, an odd one moved ties by a quantum: a row's result depended on whether another row of
// the batch took this path) and clamped to its range (quantized), or cast (float).
at::Tensor exact_int8(const at::Tensor& acc, double x_scale, const at::Tensor& w_scales,
                      const std::optional<at::Tensor>& bias, double output_scale, int64_t output_zero_point,
                      std::optional<at::ScalarType> output_dtype, const std::string& post_op, at::ScalarType x_dtype,
                      const OutRange& range) {
  std::vector<int64_t> per_channel(acc.dim(), 1);
  per_channel[1] = -1;  // [M, N] or [N, C, H, W]: the channels are dimension 1
  at::Tensor y = acc.to(at::kFloat) * (w_scales.to(at::kFloat) * static_cast<float>(x_scale)).view(per_channel);
  if (bias) y = y + bias->to(at::kFloat).view(per_channel);
  if (post_op == "relu") y = y.relu();
  if (output_dtype) return y.to(*output_dtype);
  return at::round(y * static_cast<float>(1.0 / output_scale) + static_cast<float>(output_zero_point))
      .clamp(range.lo, range.hi)
      .to(x_dtype);
}

// ---- qlinear ----

std::vector<int64_t> linear_shape(const at::Tensor& x, const PackedWeight& w, const char* name) {
  const at::Tensor& weight = w.weight;
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), name, ": x's last dimension (", x.dim() ? x.size(-1) : 0,
              ") must equal in_features (", weight.size(1), ").");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  return shape;
}

at::Tensor qlinear(const at::Tensor& x, double x_scale, int64_t x_zero_point, const PackedWeightPtr& weight,
                   const std::optional<at::Tensor>& bias, double output_scale, int64_t output_zero_point,
                   std::optional<at::ScalarType> output_dtype, c10::string_view post_op,
                   std::optional<int64_t> output_quant_min, std::optional<int64_t> output_quant_max) {
  const char* name = "openreg_quant::qlinear";
  check_call(x, x_zero_point, *weight, "qlinear", bias, output_scale, output_zero_point, output_dtype, post_op, name);
  const OutRange range = out_range(x, output_dtype, output_quant_min, output_quant_max, name);
  at::Tensor out = at::empty(linear_shape(x, *weight, name), x.options().dtype(out_type(x, output_dtype)));
  if (out.numel() == 0) return out;
  std::optional<KernelTensorArg> b_arg;
  if (bias && bias->defined()) b_arg.emplace(*bias);
  weight->record_current_stream();
  OPENREG_CHECK(::openreg::launch(
      stream_of(x), name,
      [x_arg = KernelTensorArg(x), w = PackedArgs(*weight), b_arg, y_arg = KernelTensorArg(out), x_scale, x_zero_point,
       output_scale, output_zero_point, output_dtype, post_op = std::string(post_op), range] {
        at::Tensor xv = x_arg.materialize().contiguous();
        const bool exact = needs_exact_path(xv);
        at::Tensor onednn = w.prepare("openreg_quant::qlinear", !exact);
        at::Tensor weight = w.weight.materialize(), scales = w.w_scales.materialize();
        at::Tensor zero_points = w.w_zero_points.materialize();
        at::Tensor y = y_arg.materialize();
        std::optional<at::Tensor> b;
        if (b_arg) b = b_arg->materialize().contiguous();
        if (exact) {
          at::Tensor x2 = xv.reshape({-1, xv.size(-1)}).to(at::kDouble) - static_cast<double>(x_zero_point);
          at::Tensor acc = at::mm(x2, weight.to(at::kDouble).t());
          y.copy_(exact_int8(acc, x_scale, scales, b, output_scale, output_zero_point, output_dtype, post_op,
                             xv.scalar_type(), range)
                      .view(y.sizes()));
          return;
        }
        c10::List<std::optional<at::Scalar>> no_args;
        at::Tensor r =
            call_boxed(onednn_linear(),
                       {xv.reshape({-1, xv.size(-1)}), x_scale, x_zero_point, onednn, scales, zero_points,
                        b ? c10::IValue(*b) : c10::IValue(), output_scale, output_zero_point,
                        output_dtype ? c10::IValue(*output_dtype) : c10::IValue(), post_op, no_args, std::string()})
                .toTensor();
        write_output(y, r.view(y.sizes()), range);
      }));
  return out;
}

// Host side: a linear weight packed on the device (the copies and the packing are queued on the
// current stream; nothing waits).
PackedWeightPtr qlinear_prepack(const at::Tensor& weight, const at::Tensor& w_scales, const at::Tensor& w_zero_points) {
  const char* name = "openreg_quant::qlinear_prepack";
  check_weight(weight, w_scales, w_zero_points, 2, name);
  return launch_prepack(new_packed("qlinear", weight, w_scales, w_zero_points), name);
}

// ---- qconv2d ----

std::vector<int64_t> conv_shape(const at::Tensor& x, const PackedWeight& w, const char* name) {
  const at::Tensor& weight = w.weight;
  TORCH_CHECK(x.dim() == 4, name, ": x must be 4-D (NCHW), got ", x.dim(), "-D.");
  TORCH_CHECK(x.size(1) == weight.size(1) * w.groups, name, ": x has ", x.size(1), " channels; weight ",
              str(weight.sizes()), " with groups=", w.groups, " expects ", weight.size(1) * w.groups, ".");
  std::vector<int64_t> shape{x.size(0), weight.size(0), 0, 0};
  for (int d = 0; d < 2; ++d) {
    const int64_t span = w.dilation[d] * (weight.size(2 + d) - 1) + 1;
    const int64_t room = x.size(2 + d) + 2 * w.padding[d] - span;  // checked first: C++ division truncates
    TORCH_CHECK(room >= 0, name, ": the kernel (", span, " with dilation) is larger than the padded input.");
    shape[2 + d] = room / w.stride[d] + 1;
  }
  return shape;
}

at::Tensor qconv2d(const at::Tensor& x, double x_scale, int64_t x_zero_point, const PackedWeightPtr& weight,
                   const std::optional<at::Tensor>& bias, double output_scale, int64_t output_zero_point,
                   std::optional<at::ScalarType> output_dtype, c10::string_view post_op,
                   std::optional<int64_t> output_quant_min, std::optional<int64_t> output_quant_max) {
  const char* name = "openreg_quant::qconv2d";
  check_call(x, x_zero_point, *weight, "qconv2d", bias, output_scale, output_zero_point, output_dtype, post_op, name);
  const OutRange range = out_range(x, output_dtype, output_quant_min, output_quant_max, name);
  // oneDNN packs a conv weight for the activations' scale and zero point: the call must bring those.
  TORCH_CHECK(x_scale == weight->x_scale && x_zero_point == weight->x_zero_point, name,
              ": the weight was packed for activations of scale ", weight->x_scale, " and zero point ",
              weight->x_zero_point, ", got ", x_scale, " and ", x_zero_point, ".");
  // oneDNN computes channels-last; the output is channels-last, as x86's quantized conv gives it.
  at::Tensor out =
      at::empty(conv_shape(x, *weight, name),
                x.options().dtype(out_type(x, output_dtype)).memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  std::optional<KernelTensorArg> b_arg;
  if (bias && bias->defined()) b_arg.emplace(*bias);
  weight->record_current_stream();
  OPENREG_CHECK(::openreg::launch(
      stream_of(x), name,
      [x_arg = KernelTensorArg(x), w = PackedArgs(*weight), b_arg, y_arg = KernelTensorArg(out), x_scale, x_zero_point,
       output_scale, output_zero_point, output_dtype, post_op = std::string(post_op), range] {
        at::Tensor xv = x_arg.materialize().contiguous(at::MemoryFormat::ChannelsLast);
        // oneDNN's qconv2d_pointwise takes uint8 activations only (torch 2.13: "Input tensor should
        // have uint8 (unsigned char) or fp8 data type"): int8 ones take the exact path. On CPUs
        // without VNNI they always did (needs_exact_path), which hid this; on a VNNI/AMX CPU the
        // kernel failed.
        const bool exact = xv.scalar_type() == at::kChar || needs_exact_path(xv);
        at::Tensor onednn = w.prepare("openreg_quant::qconv2d", !exact);
        at::Tensor weight = w.weight.materialize(), scales = w.w_scales.materialize();
        at::Tensor zero_points = w.w_zero_points.materialize();
        const auto &st = w.stride, &pad = w.padding, &dil = w.dilation;
        const int64_t groups = w.groups;
        std::optional<at::Tensor> b;
        if (b_arg) b = b_arg->materialize().contiguous();
        if (exact) {
          at::Tensor acc = at::conv2d(xv.to(at::kDouble) - static_cast<double>(x_zero_point), weight.to(at::kDouble),
                                      {}, st, pad, dil, groups);
          y_arg.materialize().copy_(exact_int8(acc, x_scale, scales, b, output_scale, output_zero_point, output_dtype,
                                               post_op, xv.scalar_type(), range));
          return;
        }
        c10::List<std::optional<at::Scalar>> no_args;
        at::Tensor r =
            call_boxed(onednn_conv(), {xv, x_scale, x_zero_point, onednn, scales, zero_points,
                                       b ? c10::IValue(*b) : c10::IValue(), st, pad, dil, groups, output_scale,
                                       output_zero_point, output_dtype ? c10::IValue(*output_dtype) : c10::IValue(),
                                       post_op, no_args, c10::IValue(std::string())})
                .toTensor();
        at::Tensor y = y_arg.materialize();
        write_output(y, r, range);
      }));
  return out;
}

// Host side: a conv weight packed on the device for this geometry and these activations' scale and
// zero point (the copies and the packing are queued on the current stream; nothing waits).
PackedWeightPtr qconv2d_prepack(const at::Tensor& weight, const at::Tensor& w_scales, const at::Tensor& w_zero_points,
                                double x_scale, int64_t x_zero_point, c10::IntArrayRef stride, c10::IntArrayRef padding,
                                c10::IntArrayRef dilation, int64_t groups) {
  const char* name = "openreg_quant::qconv2d_prepack";
  check_weight(weight, w_scales, w_zero_points, 4, name);
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2, name,
              ": stride, padding and dilation must have two values each.");
  TORCH_CHECK(std::all_of(stride.begin(), stride.end(), [](int64_t v) { return v >= 1; }) &&
                  std::all_of(dilation.begin(), dilation.end(), [](int64_t v) { return v >= 1; }) &&
                  std::all_of(padding.begin(), padding.end(), [](int64_t v) { return v >= 0; }),
              name, ": stride and dilation must be at least 1 and padding at least 0, got stride ", str(stride),
              ", padding ", str(padding), ", dilation ", str(dilation), ".");
  TORCH_CHECK(groups >= 1 && weight.size(0) % groups == 0, name, ": groups (", groups,
              ") must be at least 1 and divide the output channels (", weight.size(0), ").");
  check_zero_point(x_zero_point, "x_zero_point", name);
  PackedWeightPtr p = new_packed("qconv2d", weight, w_scales, w_zero_points);
  p->x_scale = x_scale, p->x_zero_point = x_zero_point, p->groups = groups;
  p->stride = stride.vec(), p->padding = padding.vec(), p->dilation = dilation.vec();
  return launch_prepack(p, name);
}

}  // namespace

TORCH_LIBRARY(openreg_quant, m) {
  m.class_<PackedWeight>("PackedWeight")
      .def("kind", [](const PackedWeightPtr& self) { return self->kind; })
      // Copies: writing to them cannot change the packed form.
      .def("unpack",
           [](const PackedWeightPtr& self) {
             return std::make_tuple(self->weight.clone(), self->w_scales.clone(), self->w_zero_points.clone());
           })
      // Its fields by name, from which torch.export and torch.compile make a fake of it
      // (openreg_quant/fake.py::FakePackedWeight; the fused ops' fake kernels are there too).
      .def("__obj_flatten__",
           [](const PackedWeightPtr& self) {
             return std::make_tuple(std::make_tuple(std::string("kind"), self->kind),
                                    std::make_tuple(std::string("weight"), self->weight),
                                    std::make_tuple(std::string("w_scales"), self->w_scales),
                                    std::make_tuple(std::string("w_zero_points"), self->w_zero_points),
                                    std::make_tuple(std::string("x_scale"), self->x_scale),
                                    std::make_tuple(std::string("x_zero_point"), self->x_zero_point),
                                    std::make_tuple(std::string("stride"), self->stride),
                                    std::make_tuple(std::string("padding"), self->padding),
                                    std::make_tuple(std::string("dilation"), self->dilation),
                                    std::make_tuple(std::string("groups"), self->groups));
           })
      .def_pickle([](const PackedWeightPtr& self) { return self->state(); },
                  [](PackedWeight::State s) { return PackedWeight::from_state(std::move(s)); });
  m.def(
      "qlinear(Tensor x, float x_scale, int x_zero_point, __torch__.torch.classes.openreg_quant.PackedWeight weight, "
      "Tensor? bias, float output_scale, int output_zero_point, ScalarType? output_dtype, str post_op, "
      "int? output_quant_min=None, int? output_quant_max=None) -> Tensor");
  m.def(
      "qconv2d(Tensor x, float x_scale, int x_zero_point, __torch__.torch.classes.openreg_quant.PackedWeight weight, "
      "Tensor? bias, float output_scale, int output_zero_point, ScalarType? output_dtype, str post_op, "
      "int? output_quant_min=None, int? output_quant_max=None) -> Tensor");
  m.def(
      "qlinear_prepack(Tensor weight, Tensor w_scales, Tensor w_zero_points) -> "
      "__torch__.torch.classes.openreg_quant.PackedWeight");
  m.def(
      "qconv2d_prepack(Tensor weight, Tensor w_scales, Tensor w_zero_points, float x_scale, int x_zero_point, "
      "int[] stride, int[] padding, int[] dilation, int groups) -> __torch__.torch.classes.openreg_quant.PackedWeight");
  // Whether this CPU takes the exact path for activations oneDNN would saturate on (see above).
  m.def("int8_pairs_saturate() -> bool", TORCH_FN(int8_pairs_saturate));
}

TORCH_LIBRARY_IMPL(openreg_quant, PrivateUse1, m) {
  m.impl("qlinear", TORCH_FN(qlinear));
  m.impl("qconv2d", TORCH_FN(qconv2d));
  m.impl("qlinear_prepack", TORCH_FN(qlinear_prepack));
  m.impl("qconv2d_prepack", TORCH_FN(qconv2d_prepack));
}

// A CPU input reaches the ops' host checks rather than the dispatcher's "Could not run" (when no bias
// tensor is on openreg): check_call refuses every CPU call, naming the device the input must be on.
TORCH_LIBRARY_IMPL(openreg_quant, CPU, m) {
  m.impl("qlinear", TORCH_FN(qlinear));
  m.impl("qconv2d", TORCH_FN(qconv2d));
  m.impl("qlinear_prepack", TORCH_FN(qlinear_prepack));  // check_weight refuses CPU weights
  m.impl("qconv2d_prepack", TORCH_FN(qconv2d_prepack));
}

// The prepacks' host code on the meta device: checks, and a packed weight of meta tensors. The fused
// ops' meta kernels are their fake kernels (openreg_quant/fake.py), which also take a fake packed weight.
TORCH_LIBRARY_IMPL(openreg_quant, Meta, m) {
  m.impl("qlinear_prepack", TORCH_FN(qlinear_prepack));
  m.impl("qconv2d_prepack", TORCH_FN(qconv2d_prepack));
}

}  // namespace openreg_quant
