// Convolutions: on a PrivateUse1 device PyTorch calls convolution_overrideable
// and convolution_backward_overrideable (the CPU kernels of those throw), so
// they are registered here. Shapes come from the meta kernels; the device
// runs the CPU convolution on kernel tensors and writes into the outputs.
#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "../runtime/OpenRegException.h"
#include "../runtime/OpenRegStream.h"
#include "OpenRegKernelTensor.h"

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

at::Tensor conv_forward(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                        c10::IntArrayRef output_padding, int64_t groups) {
  c10::DeviceGuard guard(input.device());
  const at::Tensor b = bias.value_or(at::Tensor());
  at::Tensor meta = at::convolution(meta_of(input), meta_of(weight), meta_of(b), stride, padding, dilation, transposed,
                                    output_padding, groups);
  at::Tensor out = alloc_like(meta, input.device());
  std::vector<int64_t> st(stride.begin(), stride.end()), pa(padding.begin(), padding.end()),
      di(dilation.begin(), dilation.end()), op(output_padding.begin(), output_padding.end());
  OPENREG_CHECK(::openreg::launch(current_stream_handle(input.device().index()), "aten::convolution_overrideable",
                                  [=, out = launch_tensor(out), input = launch_tensor(input),
                                   weight = launch_tensor(weight), b = launch_tensor(b)] {
                                    kernel_tensor(out).copy_(at::convolution(kernel_tensor(input),
                                                                             kernel_tensor(weight), kernel_tensor(b),
                                                                             st, pa, di, transposed, op, groups));
                                  }));
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
  at::Tensor grad_input = alloc_like(gi, input.device()), grad_weight = alloc_like(gw, input.device()),
             grad_bias = alloc_like(gb, input.device());
  std::vector<int64_t> st(stride.begin(), stride.end()), pa(padding.begin(), padding.end()),
      di(dilation.begin(), dilation.end()), op(output_padding.begin(), output_padding.end());
  OPENREG_CHECK(::openreg::launch(
      current_stream_handle(input.device().index()), "aten::convolution_backward_overrideable",
      [=, grad_output = launch_tensor(grad_output), input = launch_tensor(input), weight = launch_tensor(weight),
       grad_input = launch_tensor(grad_input), grad_weight = launch_tensor(grad_weight),
       grad_bias = launch_tensor(grad_bias)] {
        auto [ci, cw, cb] =
            at::convolution_backward(kernel_tensor(grad_output), kernel_tensor(input), kernel_tensor(weight),
                                     bias_sizes, st, pa, di, transposed, op, groups, output_mask);
        if (grad_input.defined()) kernel_tensor(grad_input).copy_(ci);
        if (grad_weight.defined()) kernel_tensor(grad_weight).copy_(cw);
        if (grad_bias.defined()) kernel_tensor(grad_bias).copy_(cb);
      }));
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", conv_forward);
  m.impl("convolution_backward_overrideable", conv_backward);
}

}  // namespace c10::openreg
