// Registration form: a custom operator defined in C++.
//
// TORCH_LIBRARY(openreg, ...) defines operators in the `openreg` namespace
// (torch.ops.openreg.*); TORCH_LIBRARY_IMPL gives them kernels per dispatch
// key. custom_abs has a device kernel for openreg, a CPU kernel, a Meta
// kernel (what FakeTensor, torch.compile and export use to learn the output's
// shape without running it) and one Autograd kernel for every backend, whose
// backward is made of ATen ops that each device has: without it the op records
// no backward, and every gradient upstream of it is silently None (the CPU only
// looked right because its kernel, at::abs, recorded one). torch.func
// transforms and forward AD refuse a C++ autograd Function, as torch 2.13's
// transforms refuse a Python custom op's register_autograd (scaled_square, ops.py).
// The autograd functions of
// OpenRegAutogradFunctions.cpp and the Python custom op of
// torch_openreg/openreg/ops.py live in the same namespace.
#include <ATen/ops/abs.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sgn.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "../runtime/OpenRegException.h"
#include "../runtime/OpenRegStream.h"
#include "OpenRegLaunch.h"

namespace c10::openreg {

namespace {

// |x| of a complex tensor is real, as torch.abs's (the output was complex here and in the meta kernel).
at::Tensor empty_abs_result(const at::Tensor& input) {
  return at::empty_like(input, input.options().dtype(c10::toRealValueType(input.scalar_type())));
}

at::Tensor custom_abs_openreg(const at::Tensor& input) {
  check_abs_dtype(input.scalar_type());
  at::Tensor out = empty_abs_result(input);
  OPENREG_CHECK(::openreg::launch(current_stream_handle(input.device().index()), "openreg::custom_abs",
                                  [out = KernelTensorArg(out), in = KernelTensorArg(input)] {
                                    at::Tensor o = out.materialize();
                                    at::abs_out(o, in.materialize());
                                  }));
  return out;
}

at::Tensor custom_abs_cpu(const at::Tensor& input) { return at::abs(input); }

at::Tensor custom_abs_meta(const at::Tensor& input) { return empty_abs_result(input); }

// d|x|/dx = sgn(x), as aten::abs's derivative (0 at 0; x / |x| for complex inputs).
struct CustomAbs : public torch::autograd::Function<CustomAbs> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input) {
    ctx->save_for_backward({input});
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("openreg::custom_abs", "")
                               .typed<at::Tensor(const at::Tensor&)>();
    return op.call(input);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * ctx->get_saved_variables()[0].sgn()};
  }
};

at::Tensor custom_abs_autograd(const at::Tensor& input) { return CustomAbs::apply(input); }

}  // namespace

TORCH_LIBRARY(openreg, m) {
  m.def("custom_abs(Tensor input) -> Tensor");
  m.def("custom_autograd_fn_returns_self(Tensor(a) input) -> Tensor(a)");
  m.def("custom_autograd_fn_aliasing(Tensor(a) input) -> Tensor(a)");
}

TORCH_LIBRARY_IMPL(openreg, PrivateUse1, m) { m.impl("custom_abs", custom_abs_openreg); }
TORCH_LIBRARY_IMPL(openreg, CPU, m) { m.impl("custom_abs", custom_abs_cpu); }
TORCH_LIBRARY_IMPL(openreg, Meta, m) { m.impl("custom_abs", custom_abs_meta); }
TORCH_LIBRARY_IMPL(openreg, Autograd, m) { m.impl("custom_abs", custom_abs_autograd); }

}  // namespace c10::openreg
