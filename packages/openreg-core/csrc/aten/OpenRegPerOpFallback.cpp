// Registration form: a per-operator boxed kernel.
//
// A boxed kernel sees any operator's arguments as a stack of IValues, so one
// function can serve many operators; registered with m.impl(name, ...) it
// serves exactly the ones named. openreg registers its synchronous generic
// kernel for the operators whose output shape depends on the data: they
// would otherwise try (and fail) their meta kernel first on every call.
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
}
