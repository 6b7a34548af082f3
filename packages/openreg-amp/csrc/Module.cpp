// openreg_amp._C: an empty Python module. Loading it runs the static
// registrations in AutocastPolicies.cpp and GradScalerKernels.cpp; nothing is
// bound to Python, so this unit needs only <Python.h>, not <torch/extension.h>.
#include <Python.h>

static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "openreg_amp._C",
                                 "openreg-amp's C++ registrations (autocast policies, GradScaler kernels).", -1,
                                 nullptr};

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module_def); }
