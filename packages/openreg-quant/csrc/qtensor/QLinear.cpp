// quantized::linear / quantized::linear_relu on quantized openreg tensors, with
// weights packed on openreg by quantized::linear_prepack (the ops
// torch.ao.nn.quantized.Linear calls).
//
// The packed parameters are an OpenRegLinearPackedParams: a
// LinearPackedParamsBase (the class the quantized ops take) that keeps the
// openreg weight and bias (for unpack) and device-side state: the CPU's own
// packed form of a copy of the weight, made by a kernel on the device (the
// prepack's launch, or the first linear that finds it missing). Each linear is
// one launch that runs the CPU's packed apply (fbgemm or oneDNN, as the CPU
// engine chooses) on the kernel views, so results are the CPU's bit for bit.
//
// A weight packed by the CPU (an nn.quantized.Linear built on the CPU and moved
// with .to("openreg"), which does not move packed parameters) is a CPU packed
// object: given an openreg input it raises, naming the op, and the other way round.
//
// Unpickling (copy.deepcopy, torch.load of a module) rebuilds packed parameters
// with the class's __setstate__, which torch binds to the CPU engine's prepack;
// for openreg weights it is routed to the dispatcher here (see the end of the file).
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/quantized/PackedParams.h>
#include <ATen/ops/_empty_affine_quantized.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "KernelQTensor.h"

namespace openreg_quant {
namespace {

using PackedPtr = c10::intrusive_ptr<LinearPackedParamsBase>;

// Device side: the CPU's packed form, made by whichever kernel needs it first, and again when the
// bias's memory changed (see packed).
struct DeviceState {
  std::mutex mutex;
  PackedPtr cpu;
  // Where the bias was when the form was made: its device storage and offset.
  const void* bias_storage = nullptr;
  int64_t bias_offset = 0;
};

// quantized::linear_prepack through the dispatcher: the CPU's kernel for CPU tensors, this file's
// for openreg tensors.
const c10::TypedOperatorHandle<PackedPtr(at::Tensor, std::optional<at::Tensor>)>& linear_prepack_op() {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("quantized::linear_prepack", "")
                                 .typed<PackedPtr(at::Tensor, std::optional<at::Tensor>)>();
  return handle;
}

// Device side. The CPU packs a copy of the weight, and the bias itself (over its kernel view), as
// the CPU's prepack keeps its bias tensor: a change of the bias in place shows in later calls, as
// on the CPU (a copy of it was packed, and unpack() returned the changed bias while the calls used
// the old one). The form reads the bias's memory only inside a call, whose own bias argument is that
// memory; a bias given new memory (`bias.data = t`, set_) is packed again at its next call, as the
// CPU's form follows its tensor to new memory. A reference of the caller's own: a kernel of another
// stream may pack again (for a bias given new memory) while this one applies the form it got.
// `force`: the prepack's own kernel packs every time it runs (replayed from a graph, it packs the
// weight copied in since: it kept the first replay's form).
PackedPtr packed(DeviceState& state, const KernelQTensorArg& weight, const std::optional<KernelTensorArg>& bias,
                 bool force = false) {
  std::lock_guard<std::mutex> lock(state.mutex);
  const void* storage = bias ? bias->storage : nullptr;
  const int64_t offset = bias ? bias->offset : 0;
  if (force || !state.cpu || storage != state.bias_storage || offset != state.bias_offset) {
    std::optional<at::Tensor> b;
    if (bias) b = bias->materialize();
    state.cpu = linear_prepack_op().call(weight.owned_copy(), b);
    state.bias_storage = storage;
    state.bias_offset = offset;
  }
  return state.cpu;
}

[[noreturn]] void unsupported(const char* op) {
  C10_THROW_ERROR(NotImplementedError,
                  c10::str(op,
                           ": not supported with openreg packed parameters (openreg-quant implements "
                           "quantized::linear and quantized::linear_relu; see docs/mechanisms/quantization.md)."));
}

struct OpenRegLinearPackedParams : LinearPackedParamsBase {
  OpenRegLinearPackedParams(at::Tensor weight, std::optional<at::Tensor> bias)
      : weight_(std::move(weight)), bias_(std::move(bias)) {}

  at::Tensor apply(at::Tensor input, double output_scale, int64_t output_zero_point) override {
    return run(input, output_scale, output_zero_point, false);
  }
  at::Tensor apply_relu(at::Tensor input, double output_scale, int64_t output_zero_point) override {
    return run(input, output_scale, output_zero_point, true);
  }
  at::Tensor apply_dynamic(at::Tensor, bool) override { unsupported("quantized::linear_dynamic"); }
  at::Tensor apply_dynamic_relu(at::Tensor, bool) override { unsupported("quantized::linear_relu_dynamic"); }
  std::tuple<at::Tensor, std::optional<at::Tensor>> unpack() override { return {weight_, bias_}; }
  std::optional<at::Tensor> bias() override { return bias_; }

  // One launch: packs on the device (unless packed already).
  void prepack() {
    if (weight_.numel() == 0) return;
    OPENREG_CHECK(::openreg::launch(
        stream_of(weight_), "quantized::linear_prepack",
        [w = KernelQTensorArg(weight_), b = bias_arg(), state = state_] { packed(*state, w, b, /*force=*/true); }));
  }

 private:
  std::optional<KernelTensorArg> bias_arg() const {
    std::optional<KernelTensorArg> b;
    if (bias_ && bias_->defined()) b.emplace(*bias_);
    return b;
  }

  at::Tensor run(const at::Tensor& input, double output_scale, int64_t output_zero_point, bool relu) {
    const char* name = relu ? "quantized::linear_relu" : "quantized::linear";
    TORCH_CHECK(input.device() == weight_.device(), name, ": the weight was packed on ", weight_.device(),
                " but the input is on ", input.device(), ".");
    TORCH_CHECK(input.is_quantized() && input.qscheme() == c10::kPerTensorAffine && input.scalar_type() == at::kQUInt8,
                name, ": the input must be a per-tensor quantized torch.quint8 tensor, got ",
                input.is_quantized() ? c10::toString(input.qscheme()) + " " : std::string(), input.scalar_type(), ".");
    TORCH_CHECK(input.dim() >= 2, name, ": the input must have at least 2 dimensions, got ", input.dim(), ".");
    TORCH_CHECK(input.size(-1) == weight_.size(1), name, ": the input's last dimension (", input.size(-1),
                ") must equal the weight's in_features (", weight_.size(1), ").");
    // An empty reduction, as the fused qlinear refuses it: the kernel failed on the empty quantized
    // input (the CPU's returns uninitialised memory).
    TORCH_CHECK(weight_.size(1) > 0, name, ": in_features must be at least 1, got a weight of shape ", weight_.sizes(),
                ".");
    std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
    shape.back() = weight_.size(0);
    c10::DeviceGuard guard(input.device());
    at::Tensor out = at::_empty_affine_quantized(shape, at::TensorOptions().dtype(at::kQUInt8).device(input.device()),
                                                 output_scale, output_zero_point);
    if (out.numel() == 0) return out;
    OPENREG_CHECK(::openreg::launch(
        stream_of(input), name,
        [x = KernelQTensorArg(input), w = KernelQTensorArg(weight_), b = bias_arg(),
         y = KernelTensorArg(plain_alias(out)), state = state_, output_scale, output_zero_point, relu] {
          const PackedPtr cpu = packed(*state, w, b);
          at::Tensor r = relu ? cpu->apply_relu(x.materialize(), output_scale, output_zero_point)
                              : cpu->apply(x.materialize(), output_scale, output_zero_point);
          y.materialize().copy_(plain_alias(r).view(y.sizes));
        }));
    return out;
  }

  at::Tensor weight_;
  std::optional<at::Tensor> bias_;
  std::shared_ptr<DeviceState> state_ = std::make_shared<DeviceState>();
};

PackedPtr linear_prepack(at::Tensor weight, std::optional<at::Tensor> bias) {
  const char* name = "quantized::linear_prepack";
  TORCH_CHECK(weight.is_privateuseone() && weight.is_quantized(), name,
              ": openreg packs quantized openreg weights, got a ", weight.is_quantized() ? "quantized " : "",
              weight.device(), " weight.");
  TORCH_CHECK(weight.scalar_type() == at::kQInt8, name, ": the weight must be torch.qint8, got ", weight.scalar_type(),
              ".");
  TORCH_CHECK(weight.dim() == 2, name, ": the weight must be 2-D [out_features, in_features], got ", weight.dim(),
              "-D.");
  const auto scheme = weight.qscheme();
  TORCH_CHECK(scheme == c10::kPerTensorAffine || (scheme == c10::kPerChannelAffine && weight.q_per_channel_axis() == 0),
              name, ": the weight must be quantized per tensor or per output channel (axis 0), got ",
              c10::toString(scheme), ".");
  // The oneDNN engine's prepack refuses an asymmetric weight. Per tensor, its zero point is on the
  // host: refused here, at the call, as on the CPU. Per channel, the zero points are in device
  // memory: the packing kernel refuses them, and the next synchronising call reports it.
  if (at::globalContext().qEngine() == at::QEngine::ONEDNN && scheme == c10::kPerTensorAffine)
    TORCH_CHECK(weight.q_zero_point() == 0, name,
                ": ONEDNN only supports symmetric quantization of weight, whose zero point must be 0, but got ",
                weight.q_zero_point());
  if (bias && bias->defined()) {
    check_on_device(*bias, weight, "bias", name);
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == weight.size(0), name,
                ": the bias must be float32 with one value per output channel (", weight.size(0), ").");
  }
  c10::DeviceGuard guard(weight.device());
  auto params = c10::make_intrusive<OpenRegLinearPackedParams>(weight, bias);
  params->prepack();
  return params;
}

template <bool relu>
at::Tensor linear(at::Tensor input, const PackedPtr& packed_weight, double output_scale, int64_t output_zero_point) {
  const char* name = relu ? "quantized::linear_relu" : "quantized::linear";
  auto ours = c10::dynamic_intrusive_pointer_cast<OpenRegLinearPackedParams>(packed_weight);
  TORCH_CHECK(ours, name, ": the input is on ", input.device(),
              " but the weight was packed by the CPU (nn.quantized modules' .to() does not move packed weights); "
              "pack an openreg weight with torch.ops.quantized.linear_prepack(weight.to('openreg'), bias) or "
              "module.set_weight_bias(...).");
  return relu ? ours->apply_relu(input, output_scale, output_zero_point)
              : ours->apply(input, output_scale, output_zero_point);
}

}  // namespace

TORCH_LIBRARY_IMPL(quantized, QuantizedPrivateUse1, m) {
  m.impl("linear_prepack", TORCH_FN(linear_prepack));
  m.impl("linear", TORCH_FN(linear<false>));
  m.impl("linear_relu", TORCH_FN(linear<true>));
}

namespace {

// torch 2.13's __setstate__ of quantized.LinearPackedParamsBase (register_linear_params in
// aten/src/ATen/native/quantized/cpu/fbgemm_utils.cpp) packs the unpickled (weight, bias) with the CPU
// engine's PackedLinearWeight::prepack directly, not through quantized::linear_prepack, so an openreg
// weight (what OpenRegLinearPackedParams::unpack gives __getstate__) would be read as host memory: the
// process dies in deepcopy or torch.load. The method is swapped once, at load, for one that sends openreg
// weights to the dispatcher (quantized::linear_prepack, this file's kernel for them) and everything else to
// torch's own. Same schema, so TorchScript and Python's pickling call it as before.
void route_openreg_setstate_through_the_dispatcher() {
  const c10::ClassTypePtr& cls = c10::getCustomClassType<PackedPtr>();
  torch::jit::Function* torchs = cls->findMethod("__setstate__");
  TORCH_INTERNAL_ASSERT(torchs, "quantized.LinearPackedParamsBase has no __setstate__");
  auto ours = std::make_unique<torch::jit::BuiltinOpFunction>(
      torchs->qualname(), torchs->getSchema(),
      [torchs](torch::jit::Stack& stack) {
        // stack: self, (weight, bias)
        const auto& state = stack.back().toTupleRef().elements();
        const at::Tensor& weight = state.at(0).toTensor();
        if (!weight.is_privateuseone()) {
          torchs->run(stack);
          return;
        }
        PackedPtr packed = linear_prepack_op().call(weight, state.at(1).toOptional<at::Tensor>());
        stack.at(stack.size() - 2).toObject()->setSlot(0, c10::IValue::make_capsule(std::move(packed)));
        torch::jit::drop(stack, 2);
        stack.emplace_back();
      },
      std::string(torchs->doc_string()));
  cls->unsafeRemoveMethod("__setstate__");
  cls->addMethod(ours.get());
  torch::registerCustomClassMethod(std::move(ours));  // owns it, as for methods torch::class_ defines
}

[[maybe_unused]] const bool setstate_routed = (route_openreg_setstate_through_the_dispatcher(), true);

}  // namespace

}  // namespace openreg_quant
