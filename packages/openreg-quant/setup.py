"""Builds openreg-quant's C++ extension against the installed torch and openreg-core.

Install with ``pip install --no-build-isolation .`` (a build-isolation environment
would fetch another torch). MAX_JOBS (default 2) sets the parallel compile jobs.
"""

import os

# Importing torch must not autoload an installed openreg before we ask for it.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch_openreg.utils.cpp_extension import OpenRegExtension, build_ext  # noqa: E402

# -ffp-contract=off: the kernels must round like the decomposition's separate ops (no fused multiply-add).
# -fno-trapping-math: lets GCC vectorize the loops' compares and selects (results are the same; only
# floating-point exception flags, which nothing reads, may differ).
FLAGS = ["-O3", "-Wall", "-Wno-unused-parameter", "-ffp-contract=off", "-fno-trapping-math"]

setup(
    ext_modules=[
        OpenRegExtension(
            "openreg_quant._C",
            [
                "csrc/Module.cpp",
                "csrc/decomposed/Quantize.cpp",
                "csrc/decomposed/Dequantize.cpp",
                "csrc/decomposed/ChooseQParams.cpp",
                "csrc/fused/QLinearConv.cpp",
                "csrc/fused/IntMM.cpp",
                "csrc/qtensor/QTensorOps.cpp",
                "csrc/qtensor/QLinear.cpp",
            ],
            extra_compile_args=FLAGS,
            unity=True,  # one unit: 109 s against 235 s for the eight (torch_openreg.utils.cpp_extension)
        )
    ],
    cmdclass={"build_ext": build_ext},
)
