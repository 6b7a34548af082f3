// Convolutions: on a PrivateUse1 device PyTorch calls convolution_overrideable
// and convolution_backward_overrideable (the CPU kernels of those throw), so
// they are registered here. Shapes come from the meta kernels; the device
// runs the CPU convolution on kernel tensors and writes into the outputs.
#include <ATen/core/Tensor.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <sstream>
#include <string>

#include "OpenRegLaunch.h"

namespace c10::openreg {

namespace {

at::Tensor meta_of(const at::Tensor& t) {
  if (!t.defined()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

at::Tensor alloc_like(const at::Tensor& meta, c10::Device device) {
  if (!meta.defined()) return meta;
  return at::empty_strided(meta.sizes(), meta.strides(), meta.options().device(device));
}

// The layout of the results is the one PyTorch predicts for this backend: FakeTensor (torch.compile,
// export) asks _determine_backend_memory_format for the Overrideable backend (contiguous for every
// input), and compiled graphs assert the strides they were traced with. The CPU gives channels-last
// for channels-last 2-d inputs; openreg follows the prediction instead (values are equal).
at::MemoryFormat result_format(const at::Tensor& input, const at::Tensor& weight) {
  return at::native::_determine_backend_memory_format(input, weight, at::native::ConvBackend::Overrideable);
}

// What the CPU's convolution kernels refuse besides the data (the meta kernel checks shapes only):
// the dtypes, the dimensions, the path (transposed, dilated, grouped) and the arguments' values.
std::string conv_signature(const std::string& op, const std::vector<at::Tensor>& tensors, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                           c10::IntArrayRef output_padding, int64_t groups) {
  std::ostringstream key;
  key << op;
  for (const auto& t : tensors) {
    key << ' ';
    if (t.defined()) key << t.scalar_type() << t.dim();
  }
  key << ' ' << stride << padding << dilation << transposed << output_padding << groups;
  return key.str();
}

at::Tensor conv_forward(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                        c10::IntArrayRef output_padding, int64_t groups) {
  c10::DeviceGuard guard(input.device());
  const at::Tensor b = bias.value_or(at::Tensor());
  at::Tensor geometry = at::convolution(meta_of(input), meta_of(weight), meta_of(b), stride, padding, dilation,
                                        transposed, output_padding, groups);
  geometry = geometry.contiguous(result_format(input, weight));
  at::Tensor out = alloc_like(geometry, input.device());
  launch_cpu_function_verified(
      "aten::convolution_overrideable",
      conv_signature("forward", {input, weight, b}, stride, padding, dilation, transposed, output_padding, groups),
      {input, weight, b}, {out},
      [st = stride.vec(), pa = padding.vec(), di = dilation.vec(), transposed, op = output_padding.vec(),
       groups](const std::vector<at::Tensor>& a) {
        return std::vector<at::Tensor>{at::convolution(a[0], a[1], a[2], st, pa, di, transposed, op, groups)};
      });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                             const at::Tensor& weight, c10::IntArrayRef stride,
                                                             c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                                             bool transposed, c10::IntArrayRef output_padding,
                                                             int64_t groups, std::array<bool, 3> output_mask) {
  c10::DeviceGuard guard(input.device());
  std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  auto [gi, gw, gb] =
      at::convolution_backward(meta_of(grad_output), meta_of(input), meta_of(weight), bias_sizes, stride, padding,
                               dilation, transposed, output_padding, groups, output_mask);
  const auto format = result_format(input, weight);  // FakeTensor converts both gradients to it
  if (gi.defined()) gi = gi.contiguous(format);
  if (gw.defined()) gw = gw.contiguous(format);
  at::Tensor grad_input = alloc_like(gi, input.device()), grad_weight = alloc_like(gw, input.device()),
             grad_bias = alloc_like(gb, input.device());
  launch_cpu_function_verified(
      "aten::convolution_backward_overrideable",
      conv_signature(std::string("backward ") + (output_mask[0] ? 'i' : '-') + (output_mask[1] ? 'w' : '-') +
                         (output_mask[2] ? 'b' : '-'),
                     {grad_output, input, weight}, stride, padding, dilation, transposed, output_padding, groups),
      {grad_output, input, weight}, {grad_input, grad_weight, grad_bias},
      [bias_sizes, st = stride.vec(), pa = padding.vec(), di = dilation.vec(), transposed, op = output_padding.vec(),
       groups, output_mask](const std::vector<at::Tensor>& a) {
        auto [ci, cw, cb] =
            at::convolution_backward(a[0], a[1], a[2], bias_sizes, st, pa, di, transposed, op, groups, output_mask);
        return std::vector<at::Tensor>{ci, cw, cb};
      });
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", conv_forward);
  m.impl("convolution_backward_overrideable", conv_backward);
}

}  // namespace c10::openreg
