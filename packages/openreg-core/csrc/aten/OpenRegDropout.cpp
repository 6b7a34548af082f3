// Dropout, with openreg's random numbers.
//
// On an accelerator F.dropout, nn.Dropout, attention's dropout and the RNNs'
// dropout between layers call aten::native_dropout (ATen's dropout takes that
// fused path for CUDA, XPU and PrivateUse1). Its schema has no generator
// argument, so on the generic path the CPU kernel would draw its mask from the
// CPU's global generator: torch.openreg.manual_seed would not reproduce it, and
// the host's own random calls would race with the queued kernel. Built from
// openreg operators instead, the mask comes from bernoulli_, whose generator
// argument the generic path fills with the device's generator.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include <tuple>

namespace c10::openreg {

namespace {

// The CPU kernel's results, layouts and special cases (aten/src/ATen/native/Dropout.cpp).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) return {input.clone(), at::empty_like(input)};
  if (train.has_value() && !*train) return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  // The CPU draws its mask in the input's dtype and has no bernoulli_ for complex ones (CUDA's fused
  // kernel takes floating types only): refused with the CPU's error, where openreg's bool mask
  // made a result (found by tests/fuzz).
  TORCH_CHECK_NOT_IMPLEMENTED(!c10::isComplexType(input.scalar_type()),
                              "\"bernoulli_scalar_cpu_\" not implemented for '", input.scalar_type(), "'");
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;  // p == 1 drops everything, without dividing by zero
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(keep);
  return {input.mul(mask).mul_(scale), mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("native_dropout", native_dropout); }

}  // namespace c10::openreg
