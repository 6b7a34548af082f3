// Registration form: a custom operator defined in C++.
//
// TORCH_LIBRARY(openreg, ...) defines operators in the `openreg` namespace
// (torch.ops.openreg.*); TORCH_LIBRARY_IMPL gives them kernels per dispatch
// key. custom_abs has a device kernel for openreg, a CPU kernel, and a Meta
// kernel: the meta kernel is what FakeTensor, torch.compile and export use to
// learn the output's shape without running it. The autograd functions of
// OpenRegAutogradFunctions.cpp and the Python custom op of
// torch_openreg/openreg/ops.py live in the same namespace.
#include <ATen/ops/abs.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "../runtime/OpenRegException.h"
#include "../runtime/OpenRegStream.h"
#include "OpenRegLaunch.h"

namespace c10::openreg {

namespace {

at::Tensor custom_abs_openreg(const at::Tensor& input) {
  check_abs_dtype(input.scalar_type());
  at::Tensor out = at::empty_like(input);
  OPENREG_CHECK(::openreg::launch(current_stream_handle(input.device().index()), "openreg::custom_abs",
                                  [out = KernelTensorArg(out), in = KernelTensorArg(input)] {
                                    at::Tensor o = out.materialize();
                                    at::abs_out(o, in.materialize());
                                  }));
  return out;
}

at::Tensor custom_abs_cpu(const at::Tensor& input) { return at::abs(input); }

at::Tensor custom_abs_meta(const at::Tensor& input) { return at::empty_like(input); }

}  // namespace

TORCH_LIBRARY(openreg, m) {
  m.def("custom_abs(Tensor input) -> Tensor");
  m.def("custom_autograd_fn_returns_self(Tensor(a) input) -> Tensor(a)");
  m.def("custom_autograd_fn_aliasing(Tensor(a) input) -> Tensor(a)");
}

TORCH_LIBRARY_IMPL(openreg, PrivateUse1, m) { m.impl("custom_abs", custom_abs_openreg); }
TORCH_LIBRARY_IMPL(openreg, CPU, m) { m.impl("custom_abs", custom_abs_cpu); }
TORCH_LIBRARY_IMPL(openreg, Meta, m) { m.impl("custom_abs", custom_abs_meta); }

}  // namespace c10::openreg
