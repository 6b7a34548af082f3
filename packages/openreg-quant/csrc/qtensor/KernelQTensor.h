// Quantized openreg tensors inside a kernel.
//
// Core keeps a quantized openreg tensor as a QTensorImpl over openreg memory
// (packages/openreg-core/csrc/aten/OpenRegQuantized.cpp). A kernel that computes
// on one needs it as a CPU quantized tensor over the kernel view of the same
// memory, with the same quantizer, so that the CPU's quantized kernels run on
// it in place: KernelQTensorArg captures what that takes at launch (geometry,
// scheme, parameters; per-channel scales and zero points as kernel views too).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/_make_per_channel_quantized_tensor.h>
#include <ATen/ops/_make_per_tensor_quantized_tensor.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>

#include <optional>

#include "../QuantCommon.h"

namespace openreg_quant {

// The memory of quantized tensor `q` (openreg or CPU) seen as a plain tensor of the underlying
// integer type (quint8 -> uint8): what copies and int_repr move.
inline at::Tensor plain_alias(const at::Tensor& q) {
  const auto key = q.is_privateuseone() ? c10::DispatchKey::PrivateUse1 : c10::DispatchKey::CPU;
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(q.storage()),
                                                      c10::DispatchKeySet(key),
                                                      c10::scalarTypeToTypeMeta(c10::toUnderlying(q.scalar_type())));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(q.sizes(), q.strides(), q.storage_offset());
  return out;
}

// Host side, at launch: a quantized openreg tensor as its kernel will see it.
struct KernelQTensorArg {
  KernelTensorArg data;  // the integer data, with the quantized dtype
  c10::QScheme scheme;
  c10::ScalarType dtype;
  double scale = 0;
  int64_t zero_point = 0;
  std::optional<KernelTensorArg> scales, zero_points;  // per channel, on the device
  int64_t axis = 0;

  explicit KernelQTensorArg(const at::Tensor& q) : data(q), dtype(q.scalar_type()) {
    const at::QuantizerPtr quantizer = at::get_qtensorimpl(q)->quantizer();
    scheme = quantizer->qscheme();
    if (scheme == c10::kPerTensorAffine) {
      const auto* p = static_cast<const at::PerTensorAffineQuantizer*>(quantizer.get());
      scale = p->scale();
      zero_point = p->zero_point();
    } else {
      TORCH_CHECK(scheme == c10::kPerChannelAffine || scheme == c10::kPerChannelAffineFloatQParams,
                  "openreg-quant: unsupported quantization scheme ", c10::toString(scheme), ".");
      const auto* p = static_cast<const at::PerChannelAffineQuantizer*>(quantizer.get());
      TORCH_CHECK(p->scales().device() == q.device() && p->zero_points().device() == q.device(),
                  "openreg-quant: the per-channel scales and zero points of a quantized ", q.device(),
                  " tensor must be on its device, got ", p->scales().device(), ".");
      scales.emplace(p->scales());
      zero_points.emplace(p->zero_points());
      axis = p->axis();
    }
  }

  // Device side: the CPU quantized tensor over the kernel view, with an equal quantizer.
  at::Tensor materialize() const {
    const at::Tensor plain = data.materialize();
    at::QuantizerPtr quantizer =
        scheme == c10::kPerTensorAffine
            ? at::make_per_tensor_affine_quantizer(scale, zero_point, dtype)
            : at::make_per_channel_affine_quantizer(scales->materialize(), zero_points->materialize(), axis, dtype);
    auto q = at::detail::make_tensor<at::QTensorImpl>(c10::Storage(plain.storage()),
                                                      c10::DispatchKeySet(c10::DispatchKey::QuantizedCPU),
                                                      plain.dtype(), std::move(quantizer));
    q.unsafeGetTensorImpl()->set_sizes_and_strides(plain.sizes(), plain.strides(), plain.storage_offset());
    return q;
  }

  // Device side: a CPU quantized tensor with the same values that owns its data and parameters
  // (materialize()'s view does not: it lives only as long as the device memory it aliases).
  at::Tensor owned_copy() const {
    const at::Tensor values = plain_alias(materialize()).clone();
    if (scheme == c10::kPerTensorAffine) return at::_make_per_tensor_quantized_tensor(values, scale, zero_point);
    return at::_make_per_channel_quantized_tensor(values, scales->materialize().clone(),
                                                  zero_points->materialize().clone(), axis);
  }
};

}  // namespace openreg_quant
