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
}
