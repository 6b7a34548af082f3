// Registration form: torch::autograd::Function in C++, registered for
// AutogradPrivateUse1.
//
// An operator's autograd kernel decides what is recorded for backward. Here
// two operators in the `openreg` namespace get one: one returns its input
// itself, one returns a view of it; both backwards scale the incoming
// gradient by 0.5. Their forward is registered as CompositeExplicitAutograd
// too, so every backend (and Meta, hence FakeTensor and torch.compile) runs it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace c10::openreg {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor returns_self_forward(const at::Tensor& input) { return input; }
at::Tensor aliasing_forward(const at::Tensor& input) { return input.view_as(input); }

struct ReturnsSelf : public torch::autograd::Function<ReturnsSelf> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& input) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return returns_self_forward(input);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0].mul(0.5)}; }
};

struct Aliasing : public torch::autograd::Function<Aliasing> {
  // No AutoDispatchBelowADInplaceOrView here: the ADInplaceOrView kernel is what makes the
  // result a view autograd knows of (sharing its input's version counter), so that an
  // in-place change of either one is caught instead of silently corrupting the gradient.
  static at::Tensor forward(AutogradContext*, const at::Tensor& input) { return aliasing_forward(input); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0].mul(0.5)}; }
};

at::Tensor returns_self_autograd(const at::Tensor& input) { return ReturnsSelf::apply(input); }
at::Tensor aliasing_autograd(const at::Tensor& input) { return Aliasing::apply(input); }

}  // namespace

TORCH_LIBRARY_IMPL(openreg, AutogradPrivateUse1, m) {
  m.impl("custom_autograd_fn_returns_self", returns_self_autograd);
  m.impl("custom_autograd_fn_aliasing", aliasing_autograd);
}

TORCH_LIBRARY_IMPL(openreg, CompositeExplicitAutograd, m) {
  m.impl("custom_autograd_fn_returns_self", returns_self_forward);
  m.impl("custom_autograd_fn_aliasing", aliasing_forward);
}

}  // namespace c10::openreg
