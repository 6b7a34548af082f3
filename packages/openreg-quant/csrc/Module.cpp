// openreg_quant._C: an empty Python module. Loading it runs the static
// registrations of the kernels; nothing is bound to Python, so this unit needs
// only <Python.h>.
#include <Python.h>

static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "openreg_quant._C",
                                 "openreg-quant's C++ registrations (quantization kernels).", -1, nullptr};

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module_def); }
