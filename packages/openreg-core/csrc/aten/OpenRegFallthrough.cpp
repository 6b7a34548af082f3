// Registration form: fallthrough.
//
// A dispatch key with no kernel for an operator is an error, unless the key
// falls through. Every tensor on an accelerator carries its Autocast key
// (AutocastPrivateUse1 for openreg), so without this, any operator called
// inside torch.autocast("openreg") would fail with "Could not run ... with
// arguments from the 'AutocastPrivateUse1' backend". The fallthrough makes
// the dispatcher skip the key; openreg-amp registers real autocast kernels
// on top (an operator's own kernel wins over a key's fallback).
#include <torch/library.h>

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }
