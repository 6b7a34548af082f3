"""Builds openreg-distributed's C++ extension (occl) against the installed torch and openreg-core.

Install with ``pip install --no-build-isolation .`` (a build-isolation environment would fetch
another torch). MAX_JOBS (default 2) sets the parallel compile jobs. Two translation units on
purpose: c10d's headers cost ~30 s per unit.
"""

import os

# Importing torch must not autoload an installed openreg before we ask for it.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch_openreg.utils.cpp_extension import OpenRegExtension, build_ext  # noqa: E402

setup(
    ext_modules=[OpenRegExtension("openreg_distributed._C", ["csrc/Module.cpp", "csrc/OcclBackend.cpp"])],
    cmdclass={"build_ext": build_ext},
)
