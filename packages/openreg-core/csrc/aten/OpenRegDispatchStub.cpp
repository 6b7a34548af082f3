// Registration form: DispatchStub (REGISTER_PRIVATEUSE1_DISPATCH).
//
// Many ATen operators are written once, device-generically, over a per-device
// function pointer: at::native::abs_out builds a TensorIterator (shapes,
// dtypes, output allocation, all on the host) and calls
// abs_stub(iter.device_type(), iter). A backend that reuses such an operator
// only fills the stub for its device. openreg's stub launches a kernel that
// runs the CPU operator over kernel views of the iterator's operands (a stub
// cannot be called from outside libtorch: DispatchStub's lookup is not
// exported).
#include <ATen/TensorIterator.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/abs_native.h>
#include <ATen/ops/kaiser_window.h>
#include <torch/library.h>

#include "../runtime/OpenRegException.h"
#include "../runtime/OpenRegStream.h"
#include "OpenRegLaunch.h"

namespace c10::openreg {

namespace {

void abs_kernel(at::TensorIteratorBase& iter) {
  check_abs_dtype(iter.dtype());
  const at::Tensor& out = iter.output();
  OPENREG_CHECK(::openreg::launch(current_stream_handle(out.device().index()), "openreg::abs_stub",
                                  [out = KernelTensorArg(out), in = KernelTensorArg(iter.input())] {
                                    at::Tensor o = out.materialize();
                                    at::abs_out(o, in.materialize());
                                  }));
}

// torch.kaiser_window's only kernel is composite: it builds the iterator over arange(n) and calls
// the stub itself, so no fallback sees it (without this: "DispatchStub: missing kernel for openreg",
// an internal assert). The window of n points, as the CPU computes it (n already counts the point
// a periodic window drops).
void kaiser_window_kernel(at::TensorIteratorBase& iter, int64_t n, double beta) {
  const at::Tensor& out = iter.output();
  OPENREG_CHECK(::openreg::launch(current_stream_handle(out.device().index()), "openreg::kaiser_window_stub",
                                  [out = KernelTensorArg(out), n, beta] {
                                    at::Tensor o = out.materialize();
                                    o.copy_(at::kaiser_window(n, /*periodic=*/false, beta, o.options()));
                                  }));
}

}  // namespace

}  // namespace c10::openreg

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(abs_stub, &c10::openreg::abs_kernel)
REGISTER_PRIVATEUSE1_DISPATCH(kaiser_window_stub, &c10::openreg::kaiser_window_kernel)
}  // namespace at::native

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("abs.out", at::native::abs_out); }
