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

// A lazily conjugated or negated tensor carries the Conjugate / Negative key.
// Their fallback materialises such inputs with clone(), which copies with
// _copy_from, which would come back to the same fallback: endless recursion.
// _copy_from falls through those keys instead; openreg's copy kernels keep the
// conj/neg bits on the kernel views, so the CPU copy resolves them.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }
