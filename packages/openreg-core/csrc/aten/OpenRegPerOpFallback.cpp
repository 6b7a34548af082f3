// Registration form: a per-operator boxed kernel.
//
// A boxed kernel sees any operator's arguments as a stack of IValues, so one
// function can serve many operators; registered with m.impl(name, ...) it
// serves exactly the ones named. openreg registers its synchronous generic
// kernel for the operators whose output shape depends on the data: they
// would otherwise try (and fail) their meta kernel first on every call.
//
// So do the linear-algebra operators whose errors depend on the values (an SVD or eigen-
// decomposition that does not converge on NaN input, the inverse of a singular Cholesky factor):
// CUDA synchronises to check them too, and raises at the call; asynchronous, the error surfaced at
// a later call as a plain RuntimeError, not torch.linalg.LinAlgError.
//
// mode.values (torch.mode with out=) gets it too: its CompositeExplicitAutograd
// kernel, which outranks the global fallback, refuses any device but CPU, CUDA
// and XPU, and so does its meta kernel. On the device the CPU runs the same
// composite kernel over kernel tensors.
//
// Two in-place operators get the asynchronous generic kernel: their CompositeExplicitAutograd kernel
// (the CPU's and CUDA's too) cannot run on openreg's tensors. conj_physical_ calls its DispatchStub
// directly, which has no openreg entry (an internal assert); addr_ calls addr.out with self as both
// input and out, and the CPU kernel refuses a self that is not already the result's shape only when
// the two are one C++ reference, which a boxed call cannot keep (a 0-dim self became 5 x 10). On the
// device the CPU runs the composite itself over kernel tensors.
#include <torch/library.h>

#include "OpenRegFallback.h"

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  const auto sync = torch::CppFunction::makeFromBoxedFunction<&c10::openreg::synchronous_kernel>;
  for (const char* op : {"nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim", "mode.values"})
    m.impl(op, sync());
  for (const char* op :
       {"_linalg_svd", "_linalg_svd.U", "linalg_pinv.atol_rtol_tensor", "linalg_pinv.atol_rtol_tensor_out",
        "linalg_eig", "linalg_eig.out", "cholesky_inverse", "cholesky_inverse.out"})
    m.impl(op, sync());
  for (const char* op : {"conj_physical_", "addr_"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&c10::openreg::generic_kernel>());
}
