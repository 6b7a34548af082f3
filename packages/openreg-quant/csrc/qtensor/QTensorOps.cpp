// Quantized tensors on openreg: the kernels that compute on quantized values
// (torch.quantize_per_tensor / quantize_per_channel of openreg tensors,
// dequantize, int_repr, _make_per_tensor/channel_quantized_tensor).
//
// Core allocates, views, copies and saves quantized openreg tensors
// (packages/openreg-core/csrc/aten/OpenRegQuantized.cpp). The arithmetic reuses
// ATen's own device-generic layer: ATen's quantize/dequantize wrappers
// (at::native::quantize_tensor_per_tensor_affine and friends) run their checks
// on the host and then call a DispatchStub for the tensor's device. openreg
// fills the stubs' PrivateUse1 slots: each launches one kernel on the current
// stream that runs the same wrapper on the CPU over the kernel views, so the
// results are the CPU's bit for bit and the host never waits.
#include <ATen/core/Tensor.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/quantized/AffineQuantizer.h>
#include <ATen/ops/_empty_affine_quantized.h>
#include <ATen/ops/_empty_per_channel_affine_quantized.h>
#include <ATen/ops/dequantize_native.h>
#include <ATen/ops/empty.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "KernelQTensor.h"

namespace openreg_quant {
namespace {

// ---- the stubs: one launch each, the CPU's kernel on the kernel views ----

void quantize_per_tensor_kernel(const at::Tensor& rtensor, at::Tensor& qtensor, double scale, int64_t zero_point) {
  if (qtensor.numel() == 0) return;
  OPENREG_CHECK(::openreg::launch(stream_of(qtensor), "openreg_quant::quantize_per_tensor_affine",
                                  [r = KernelTensorArg(rtensor), q = KernelQTensorArg(qtensor), scale, zero_point] {
                                    at::Tensor qv = q.materialize();
                                    at::native::quantize_tensor_per_tensor_affine(r.materialize(), qv, scale,
                                                                                  zero_point);
                                  }));
}

void dequantize_per_tensor_kernel(const at::Tensor& qtensor, at::Tensor& rtensor, double scale, int64_t zero_point) {
  if (qtensor.numel() == 0) return;
  OPENREG_CHECK(::openreg::launch(stream_of(rtensor), "openreg_quant::dequantize_per_tensor_affine",
                                  [q = KernelQTensorArg(qtensor), r = KernelTensorArg(rtensor), scale, zero_point] {
                                    at::Tensor rv = r.materialize();
                                    at::native::dequantize_tensor_per_tensor_affine(q.materialize(), rv, scale,
                                                                                    zero_point);
                                  }));
}

// Per channel: the scales and zero points are device tensors, read by the kernel. The host-side
// wrapper leaves the zero points' range check to the device (it reads their values): a bad one
// fails the kernel, and the next synchronising call reports it.
template <bool float_qparams>
void quantize_per_channel_kernel(const at::Tensor& rtensor, at::Tensor& qtensor, const at::Tensor& scales,
                                 const at::Tensor& zero_points, int64_t axis) {
  if (qtensor.numel() == 0) return;
  OPENREG_CHECK(::openreg::launch(stream_of(qtensor), "openreg_quant::quantize_per_channel",
                                  [r = KernelTensorArg(rtensor), q = KernelQTensorArg(qtensor),
                                   s = KernelTensorArg(scales), z = KernelTensorArg(zero_points), axis] {
                                    at::Tensor qv = q.materialize();
                                    if constexpr (float_qparams)
                                      at::native::quantize_tensor_per_channel_float_qparams(
                                          r.materialize(), qv, s.materialize(), z.materialize(), axis);
                                    else
                                      at::native::quantize_tensor_per_channel_affine(
                                          r.materialize(), qv, s.materialize(), z.materialize(), axis);
                                  }));
}

template <bool float_qparams>
void dequantize_per_channel_kernel(const at::Tensor& qtensor, at::Tensor& rtensor, const at::Tensor& scales,
                                   const at::Tensor& zero_points, int64_t axis) {
  if (qtensor.numel() == 0) return;
  // The CPU's kernel refuses this layout: the same error at the call, not from the kernel.
  TORCH_CHECK(rtensor.is_contiguous() || axis <= 1,
              "If tensor is channels_last contig then per channel quantization is supported only for axis = 0 or 1.");
  OPENREG_CHECK(::openreg::launch(stream_of(rtensor), "openreg_quant::dequantize_per_channel",
                                  [q = KernelQTensorArg(qtensor), r = KernelTensorArg(rtensor),
                                   s = KernelTensorArg(scales), z = KernelTensorArg(zero_points), axis] {
                                    at::Tensor rv = r.materialize();
                                    if constexpr (float_qparams)
                                      at::native::dequantize_tensor_per_channel_float_qparams(
                                          q.materialize(), rv, s.materialize(), z.materialize(), axis);
                                    else
                                      at::native::dequantize_tensor_per_channel_affine(
                                          q.materialize(), rv, s.materialize(), z.materialize(), axis);
                                  }));
}

// ---- the operators ----

// Options for a result on `t`'s device without a memory format (it is passed on its own).
at::TensorOptions result_options(const at::Tensor& t, at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(t.device());
}

at::Tensor quantize_per_tensor_op(const at::Tensor& self, double scale, int64_t zero_point, at::ScalarType dtype) {
  // The CPU's PerTensorAffineQuantizer::quantize, with the result allocated by core.
  TORCH_CHECK(self.scalar_type() == at::kFloat, "Quantize only works on Float Tensor, got ", self.scalar_type());
  c10::DeviceGuard guard(self.device());
  const auto format = self.suggest_memory_format();
  at::Tensor q = at::_empty_affine_quantized(self.sizes(), result_options(self, dtype), scale, zero_point, format);
  at::native::quantize_tensor_per_tensor_affine(*self.expect_contiguous(format), q, scale, zero_point);
  return q;
}

// Scale and zero point as tensors: a quantized tensor keeps them on the host (q_scale() returns a
// Python float), so their values are read here, as the CPU and CUDA do (a wait if they are on the device).
at::Tensor quantize_per_tensor_tensor_qparams_op(const at::Tensor& self, const at::Tensor& scale,
                                                 const at::Tensor& zero_point, at::ScalarType dtype) {
  return quantize_per_tensor_op(self, scale.item().toDouble(), zero_point.item().toLong(), dtype);
}

at::Tensor quantize_per_channel_op(const at::Tensor& self, const at::Tensor& scales, const at::Tensor& zero_points,
                                   int64_t axis, at::ScalarType dtype) {
  const char* name = "aten::quantize_per_channel";
  check_on_device(scales, self, "scales", name);
  check_on_device(zero_points, self, "zero_points", name);
  c10::DeviceGuard guard(self.device());
  // The quantizer's checks (1-D parameters of one length, floating scales) and its parameter types
  // (double scales and int64 zero points, or float and float), converted on the device.
  const at::QuantizerPtr quantizer = at::make_per_channel_affine_quantizer(scales, zero_points, axis, dtype);
  const auto* p = static_cast<const at::PerChannelAffineQuantizer*>(quantizer.get());
  const at::Tensor s = p->scales(), z = p->zero_points();
  // ATen's own check, made before openreg's layout check below (the CPU names a negative axis so).
  TORCH_CHECK(0 <= axis && axis < self.dim(),
              "Channel axis out of range in per channel affine quantization. Got: ", axis, "Expected: [0, ", self.dim(),
              ")");
  if (quantizer->qscheme() == c10::kPerChannelAffineFloatQParams) {
    TORCH_CHECK(self.scalar_type() == at::kFloat, "Quantize only works on Float Tensor, got ", self.scalar_type());
    // The CPU's kernel has no qint32 case for float zero points and dies of an illegal
    // instruction (the CPU's process too): refused at the call instead of killing a stream worker.
    TORCH_CHECK(dtype != at::kQInt32,
                "quantize_per_channel with floating-point zero points supports torch.quint8 and torch.qint8, "
                "got torch.qint32.");
    at::Tensor q = at::_empty_per_channel_affine_quantized(self.sizes(), s, z, axis, result_options(self, dtype),
                                                           at::MemoryFormat::Contiguous);
    at::native::quantize_tensor_per_channel_float_qparams(*self.expect_contiguous(), q, s, z, axis);
    return q;
  }
  const auto format = self.suggest_memory_format();
  // The CPU's kernel refuses this layout (on the device it would fail in the kernel): the same error, at the call.
  TORCH_CHECK(format != at::MemoryFormat::ChannelsLast || axis == 0 || axis == 1,
              "If tensor is channels_last contig then per channel quantization is supported only for axis = 0 or 1.");
  at::Tensor q = at::_empty_per_channel_affine_quantized(self.sizes(), s, z, axis, result_options(self, dtype), format);
  at::native::quantize_tensor_per_channel_affine(*self.expect_contiguous(format), q, s, z, axis);
  return q;
}

// The integer values: a plain tensor of the underlying type, copied on the device (one launch).
at::Tensor int_repr_op(const at::Tensor& self) {
  at::Tensor out = at::empty(self.sizes(), result_options(self, c10::toUnderlying(self.scalar_type())),
                             self.suggest_memory_format());
  out.copy_(plain_alias(self));
  return out;
}

// uint8/int8/int32 -> quint8/qint8/qint32, as the CPU names them.
at::ScalarType quantized_type_of(const at::Tensor& self, const char* name) {
  const at::ScalarType t = c10::toQIntType(self.scalar_type());
  TORCH_CHECK(c10::isQIntType(t), name, ": expected a uint8, int8 or int32 tensor, got ", self.scalar_type(), ".");
  return t;
}

// An integer tensor taken as the values of a quantized one (the inverse of int_repr).
at::Tensor make_per_tensor_quantized_tensor_op(const at::Tensor& self, double scale, int64_t zero_point) {
  const auto dtype = quantized_type_of(self, "aten::_make_per_tensor_quantized_tensor");
  c10::DeviceGuard guard(self.device());
  at::Tensor q = at::_empty_affine_quantized(self.sizes(), result_options(self, dtype), scale, zero_point,
                                             self.suggest_memory_format());
  plain_alias(q).copy_(self);
  return q;
}

at::Tensor make_per_channel_quantized_tensor_op(const at::Tensor& self, const at::Tensor& scales,
                                                const at::Tensor& zero_points, int64_t axis) {
  const auto dtype = quantized_type_of(self, "aten::_make_per_channel_quantized_tensor");
  c10::DeviceGuard guard(self.device());
  // Contiguous whatever self's layout, as the CPU's kernel makes it (its per-tensor sibling keeps
  // self's layout: so does openreg's, above).
  at::Tensor q = at::_empty_per_channel_affine_quantized(self.sizes(), scales, zero_points, axis,
                                                         result_options(self, dtype), at::MemoryFormat::Contiguous);
  plain_alias(q).copy_(self);
  return q;
}

}  // namespace

// Dense openreg inputs: the quantizing operators.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("quantize_per_tensor", TORCH_FN(quantize_per_tensor_op));
  m.impl("quantize_per_tensor.tensor_qparams", TORCH_FN(quantize_per_tensor_tensor_qparams_op));
  m.impl("quantize_per_channel", TORCH_FN(quantize_per_channel_op));
  m.impl("_make_per_tensor_quantized_tensor", TORCH_FN(make_per_tensor_quantized_tensor_op));
  m.impl("_make_per_channel_quantized_tensor", TORCH_FN(make_per_channel_quantized_tensor_op));
}

// Quantized openreg inputs. dequantize is ATen's device-generic one: the quantizer allocates the
// float result and calls the dequantize stubs below.
TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("dequantize.self", TORCH_FN(at::native::dequantize_quantized));
  m.impl("int_repr", TORCH_FN(int_repr_op));
}

}  // namespace openreg_quant

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(quantize_tensor_per_tensor_affine_stub, &openreg_quant::quantize_per_tensor_kernel)
REGISTER_PRIVATEUSE1_DISPATCH(dequantize_tensor_per_tensor_affine_stub, &openreg_quant::dequantize_per_tensor_kernel)
REGISTER_PRIVATEUSE1_DISPATCH(quantize_tensor_per_channel_affine_stub,
                              &openreg_quant::quantize_per_channel_kernel<false>)
REGISTER_PRIVATEUSE1_DISPATCH(dequantize_tensor_per_channel_affine_stub,
                              &openreg_quant::dequantize_per_channel_kernel<false>)
REGISTER_PRIVATEUSE1_DISPATCH(quantize_tensor_per_channel_float_qparams_stub,
                              &openreg_quant::quantize_per_channel_kernel<true>)
REGISTER_PRIVATEUSE1_DISPATCH(dequantize_tensor_per_channel_float_qparams_stub,
                              &openreg_quant::dequantize_per_channel_kernel<true>)
}  // namespace at::native
