"""Builds openreg-amp's C++ extension against the installed torch and openreg-core.

Install with ``pip install --no-build-isolation .`` (a build-isolation environment
would fetch another torch). MAX_JOBS (default 2) sets the parallel compile jobs.
The extension links against core's libraries, so the process keeps one device
runtime: see ``torch_openreg.utils.cpp_extension``.
"""

import os

# Importing torch must not autoload an installed openreg before we ask for it.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch_openreg.utils.cpp_extension import OpenRegExtension, build_ext  # noqa: E402

setup(
    ext_modules=[
        OpenRegExtension(
            "openreg_amp._C",
            ["csrc/Module.cpp", "csrc/AutocastPolicies.cpp", "csrc/GradScalerKernels.cpp"],
            unity=True,  # one unit: torch's headers parsed once (torch_openreg.utils.cpp_extension)
        )
    ],
    cmdclass={"build_ext": build_ext},
)
