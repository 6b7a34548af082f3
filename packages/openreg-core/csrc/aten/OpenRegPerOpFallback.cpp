// Registration form: a per-operator boxed kernel.
//
// A boxed kernel sees any operator's arguments as a stack of IValues, so one
// function can serve many operators; registered with m.impl(name, ...) it
// serves exactly the ones named. openreg registers its synchronous generic
// kernel for the operators whose output shape depends on the data: they
// would otherwise try (and fail) their meta kernel first on every call.
#include <torch/library.h>

#include "OpenRegFallback.h"

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  const auto sync = torch::CppFunction::makeFromBoxedFunction<&c10::openreg::synchronous_kernel>;
  for (const char* op : {"nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim"})
    m.impl(op, sync());
}
