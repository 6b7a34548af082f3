// Quantized tensors on openreg: the storage layer (QuantizedPrivateUse1).
//
// A quantized tensor is a QTensorImpl: integer data plus a Quantizer (the
// scheme, and the scale/zero point, or per-channel scale and zero-point
// tensors). Core owns what needs no quantized arithmetic, so that a quantized
// tensor can live on openreg, be moved, viewed and saved whether or not a
// plugin provides kernels:
//  - allocation in openreg device memory with the caching allocator
//    (empty_quantized, _empty_affine_quantized, _empty_per_channel_affine_quantized,
//    empty with a quantized dtype); per-channel scales and zero points live on
//    the tensor's device;
//  - clone, empty_like, views (as_strided, view, _reshape_alias, squeeze, unsqueeze, unfold;
//    slicing, select, transpose... are composite on top of those), set_ (torch.load) and record_stream
//    (both in OpenRegNativeOps.cpp) and the host-side
//    metadata (q_scale, q_per_channel_scales, qscheme...);
//  - copies between quantized tensors (CPU <-> openreg, openreg <-> openreg):
//    the integer data moves as plain bytes with core's copy, and the
//    destination takes the source's quantizer (its per-channel tensors moved to
//    the destination's device), as the CPU's copy_ does.
// Kernels that compute on quantized values (quantize, dequantize, int_repr,
// quantized::linear) are openreg-quant's. Any other operator reaching the
// QuantizedPrivateUse1 key hits the fallback below: an error naming the
// operator, never a crash.
#include "OpenRegQuantized.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_quantized_native.h>
#include <ATen/ops/empty_strided_native.h>
#include <ATen/ops/q_per_channel_axis_native.h>
#include <ATen/ops/q_per_channel_scales_native.h>
#include <ATen/ops/q_per_channel_zero_points_native.h>
#include <ATen/ops/q_scale_native.h>
#include <ATen/ops/q_zero_point_native.h>
#include <ATen/ops/qscheme_native.h>
#include <ATen/ops/squeeze_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include "../runtime/OpenRegCachingAllocator.h"

namespace c10::openreg {

void reject_quantized(const c10::OperatorName& op, c10::ScalarType dtype) {
  // openreg-quant registers aten::quantize_per_tensor for PrivateUse1: that tells whether it is loaded.
  // Asked at each refusal, not once: the plugin may be imported after a first refusal
  // (OPENREG_PLUGINS left it out, then `import openreg_quant`).
  auto handle = c10::Dispatcher::singleton().findOp({"aten::quantize_per_tensor", ""});
  const bool plugin = handle.has_value() && handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
  std::string name = op.name + (op.overload_name.empty() ? "" : "." + op.overload_name);
  C10_THROW_ERROR(NotImplementedError,
                  c10::str(name, ": openreg has no kernel for this operator on quantized tensors (", dtype, "). ",
                           plugin ? "openreg-quant provides the quantized-tensor operators that "
                                    "docs/mechanisms/quantization.md lists; this is not one of them."
                                  : "Quantized kernels come from the openreg-quant plugin, which is not loaded; "
                                    "see docs/mechanisms/quantization.md."));
}

namespace {

bool is_sub_byte(c10::ScalarType t) { return t == c10::kQUInt4x2 || t == c10::kQUInt2x4; }

// A QTensorImpl in openreg memory (ATen's new_qtensor does the same for the CPU and CUDA).
at::Tensor new_device_qtensor(c10::IntArrayRef sizes, const c10::TensorOptions& options, at::QuantizerPtr quantizer) {
  const c10::Device device = options.device();
  c10::OptionalDeviceGuard guard(device.has_index() ? std::optional<c10::Device>(device) : std::nullopt);
  const auto dtype = options.dtype();
  const auto scalar_type = c10::typeMetaToScalarType(dtype);
  TORCH_CHECK(c10::isQIntType(scalar_type), "ScalarType ", scalar_type, " is not a quantized dtype.");
  TORCH_CHECK_NOT_IMPLEMENTED(!is_sub_byte(scalar_type), "quantized tensors of the sub-byte dtype ", scalar_type,
                              " are not supported on openreg; see docs/mechanisms/quantization.md.");
  at::detail::check_size_nonnegative(sizes);
  const int64_t nbytes = c10::multiply_integers(sizes) * static_cast<int64_t>(dtype.itemsize());
  auto* allocator = allocator::get();
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                       allocator->allocate(nbytes), allocator, /*resizable=*/true);
  auto tensor = at::detail::make_tensor<at::QTensorImpl>(c10::Storage(std::move(storage)),
                                                         c10::DispatchKeySet(c10::DispatchKey::QuantizedPrivateUse1),
                                                         dtype, std::move(quantizer));
  auto* impl = tensor.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(sizes);
  impl->empty_tensor_restride(options.memory_format_opt().value_or(c10::MemoryFormat::Contiguous));
  return tensor;
}

c10::TensorOptions options_of(std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                              std::optional<c10::Device> device, std::optional<bool> pin_memory,
                              std::optional<c10::MemoryFormat> memory_format) {
  auto options = c10::TensorOptions().dtype(dtype).layout(layout).device(device).pinned_memory(pin_memory);
  TORCH_CHECK(!(options.has_memory_format() && memory_format.has_value()),
              "Cannot set memory_format both in TensorOptions and explicit argument; please delete "
              "the redundant setter.");
  options = options.merge_memory_format(memory_format);
  TORCH_CHECK(options.has_dtype(), "Must provide data type for Tensor creation functions.");
  return options;
}

at::Tensor empty_affine_quantized(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                  std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                  std::optional<bool> pin_memory, double scale, int64_t zero_point,
                                  std::optional<c10::MemoryFormat> memory_format) {
  auto options = options_of(dtype, layout, device, pin_memory, memory_format);
  return new_device_qtensor(
      size, options,
      at::make_per_tensor_affine_quantizer(scale, zero_point, c10::typeMetaToScalarType(options.dtype())));
}

// Per-channel scales and zero points live on the tensor's device. Reached also for a CPU result
// (tensor.cpu() dispatches here when the scales are openreg tensors): the parameters move to the
// CPU and the CPU allocates.
at::Tensor empty_per_channel_affine_quantized(c10::IntArrayRef size, const at::Tensor& scales,
                                              const at::Tensor& zero_points, int64_t axis,
                                              std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                                              std::optional<c10::Device> device, std::optional<bool> pin_memory,
                                              std::optional<c10::MemoryFormat> memory_format) {
  auto options = options_of(dtype, layout, device, pin_memory, memory_format);
  const c10::Device target = options.device();
  if (!target.is_privateuseone())
    return at::_empty_per_channel_affine_quantized(size, scales.to(target), zero_points.to(target), axis, options,
                                                   std::nullopt);
  auto quantizer = at::make_per_channel_affine_quantizer(scales.to(target), zero_points.to(target), axis,
                                                         c10::typeMetaToScalarType(options.dtype()));
  return new_device_qtensor(size, options, std::move(quantizer));
}

// torch.empty(..., dtype=torch.qint8): no quantizer yet, as on the CPU.
at::Tensor empty_unknown_quantized(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                   std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                   std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  auto options = c10::TensorOptions().dtype(dtype).layout(layout).device(device).pinned_memory(pin_memory);
  if (memory_format) options = options.memory_format(memory_format);
  TORCH_CHECK(options.has_dtype(), "Must provide data type for Tensor creation functions.");
  return new_device_qtensor(size, options, at::make_unknown_quantizer(c10::typeMetaToScalarType(options.dtype())));
}

// `quantizer` with its per-channel tensors on `device` (copied if they are elsewhere).
at::QuantizerPtr quantizer_on(const at::QuantizerPtr& quantizer, c10::Device device) {
  const auto scheme = quantizer->qscheme();
  if (scheme != c10::kPerChannelAffine && scheme != c10::kPerChannelAffineFloatQParams) return quantizer;
  const auto* per_channel = static_cast<const at::PerChannelAffineQuantizer*>(quantizer.get());
  if (per_channel->scales().device() == device) return quantizer;
  return at::make_per_channel_affine_quantizer(per_channel->scales().to(device), per_channel->zero_points().to(device),
                                               per_channel->axis(), quantizer->scalar_type());
}

// The same memory seen as a plain tensor of the underlying integer type (qint8 -> int8).
at::Tensor plain_alias(const at::Tensor& q) {
  const auto key = q.is_privateuseone() ? c10::DispatchKey::PrivateUse1 : c10::DispatchKey::CPU;
  TORCH_CHECK(q.is_privateuseone() || q.is_cpu(), "openreg copies quantized tensors to and from the CPU only, got ",
              q.device(), ".");
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(q.storage()),
                                                      c10::DispatchKeySet(key),
                                                      c10::scalarTypeToTypeMeta(c10::toUnderlying(q.scalar_type())));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(q.sizes(), q.strides(), q.storage_offset());
  return out;
}

// _copy_from(src, dst) where either is a quantized openreg tensor (copy_, .to(), .cpu(), clone).
at::Tensor quantized_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(dst.is_quantized() || !self.is_quantized(),
              "Copying from quantized Tensor to non-quantized Tensor is not allowed, please use dequantize to get a "
              "float Tensor from a quantized Tensor");
  TORCH_CHECK_NOT_IMPLEMENTED(self.is_quantized(), "copy_: copying a non-quantized tensor into a quantized ",
                              dst.device(),
                              " tensor is not supported on openreg; quantize it with torch.quantize_per_tensor "
                              "(see docs/mechanisms/quantization.md).");
  const auto source = at::get_qtensorimpl(self)->quantizer();
  // A destination made by empty() has no quantizer yet (tensor.to() of a strided view makes one).
  const auto target = at::get_qtensorimpl(dst)->quantizer();
  const bool unknown = dynamic_cast<const at::UnknownQuantizer*>(target.get()) != nullptr;
  TORCH_CHECK(unknown || source->qscheme() == target->qscheme(), "Quantized Copy only works with same qscheme");
  TORCH_CHECK(self.scalar_type() == dst.scalar_type(), "Quantized Copy only works with the same dtype, got ",
              self.scalar_type(), " and ", dst.scalar_type(), ".");
  at::set_quantizer_(dst, quantizer_on(source, dst.device()));
  at::_copy_from(plain_alias(self), plain_alias(dst), non_blocking);
  return dst;
}

// tensor.to(device) of a quantized tensor, either way between the CPU and openreg. PyTorch's _to_copy
// allocates the result of a quantized tensor that is not dense, or given a memory format, on the
// source's device (empty_like): here the result is on the target, laid out as _to_copy lays it out
// (contiguous for a dense source, its suggested format otherwise).
at::Tensor to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                   std::optional<c10::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<c10::MemoryFormat> memory_format) {
  const c10::Device target = device.value_or(self.device());
  if (!self.is_quantized() || target == self.device() || (dtype && *dtype != self.scalar_type()) ||
      (layout && *layout != c10::kStrided))
    return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
  auto format = memory_format.value_or(c10::MemoryFormat::Preserve);
  if (format == c10::MemoryFormat::Preserve)
    format = self.is_non_overlapping_and_dense() ? c10::MemoryFormat::Contiguous : self.suggest_memory_format();
  const auto options = c10::TensorOptions().dtype(self.scalar_type()).device(target);
  const auto quantizer = at::get_qtensorimpl(self)->quantizer();
  at::Tensor out;
  if (quantizer->qscheme() == c10::kPerTensorAffine) {
    const auto* p = static_cast<const at::PerTensorAffineQuantizer*>(quantizer.get());
    out = at::_empty_affine_quantized(self.sizes(), options, p->scale(), p->zero_point(), format);
  } else {
    const auto* p = static_cast<const at::PerChannelAffineQuantizer*>(quantizer.get());
    out = at::_empty_per_channel_affine_quantized(self.sizes(), p->scales(), p->zero_points(), p->axis(), options,
                                                  format);
  }
  out.copy_(self, non_blocking);
  return out;
}

// Every other operator on a quantized openreg tensor: an error that names it.
void quantized_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size() && dtype == c10::ScalarType::Undefined; ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_quantized()) dtype = v.toTensor().scalar_type();
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (t.defined() && t.is_quantized()) dtype = t.scalar_type();
  }
  reject_quantized(op.operator_name(), dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("empty.memory_format", empty_unknown_quantized);
  m.impl("empty_quantized", at::native::empty_quantized);
  m.impl("_empty_affine_quantized", empty_affine_quantized);
  m.impl("_empty_per_channel_affine_quantized", empty_per_channel_affine_quantized);
  // The CPU's: empty_like takes the source's quantizer (the composite one called empty_strided,
  // which has none, and refused); empty_strided refuses with the CPU's message.
  m.impl("empty_like", at::native::empty_like_quantized);
  m.impl("empty_strided", at::native::empty_strided_unknown_quantized);
  // Views that add or drop a dimension move a per-channel quantizer's axis (the composite
  // as_strided path refused per-channel tensors: "Setting strides is possible only on uniformly
  // quantized tensor").
  m.impl("squeeze", static_cast<at::Tensor (*)(const at::Tensor&)>(at::native::squeeze_quantized));
  m.impl("squeeze.dim", static_cast<at::Tensor (*)(const at::Tensor&, int64_t)>(at::native::squeeze_quantized));
  m.impl("squeeze.dims",
         static_cast<at::Tensor (*)(const at::Tensor&, at::IntArrayRef)>(at::native::squeeze_quantized));
  m.impl("unsqueeze", at::native::unsqueeze_quantized);
  m.impl("unfold", at::native::unfold);
  // The CPU's clone of quantized tensors (the composite one would call empty_strided, which takes no quantizer).
  m.impl("clone", at::native::quantized_clone);
  m.impl("as_strided", at::native::as_strided_qtensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("q_scale", at::native::q_scale_quant);
  m.impl("q_zero_point", at::native::q_zero_point_quant);
  m.impl("q_per_channel_scales", at::native::q_per_channel_scales);
  m.impl("q_per_channel_zero_points", at::native::q_per_channel_zero_points);
  m.impl("q_per_channel_axis", at::native::q_per_channel_axis);
  m.impl("qscheme", at::native::qscheme_quant);
  m.impl("_copy_from", quantized_copy_from);
  m.impl("_to_copy", to_copy);
}

// Operators whose composite kernel would run on a quantized openreg tensor before the fallback sees
// it, and fail inside with an upstream message that names something else ("empty_strided not
// supported on quantized tensors", "could not infer output dtype", "promoteTypes with quantized
// numbers"): the CPU has quantized kernels for them (QuantizedCPU), openreg names them as the
// fallback does. Found by calling each operator QuantizedCPU implements on a quantized openreg tensor.
TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  for (const char* name : {"sort", "sort.stable", "mean", "mean.dim", "eq.Scalar", "ne.Scalar", "lt.Scalar",
                           "le.Scalar", "gt.Scalar", "ge.Scalar"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&quantized_fallback>());
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&quantized_fallback>());
}

}  // namespace c10::openreg
