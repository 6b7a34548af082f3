"""Builds openreg-amp's C++ extension against the installed torch and openreg-core.

Install with ``pip install --no-build-isolation .`` (a build-isolation environment
would fetch another torch). MAX_JOBS (default 2) sets the parallel compile jobs.
The extension links against core's libraries, so the process keeps one device
runtime: see ``torch_openreg.include_paths()`` / ``library_paths()``.
"""

import os

# Importing torch must not autoload an installed openreg before we ask for it.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
os.environ.setdefault("MAX_JOBS", "2")

import torch_openreg  # noqa: E402
from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

# Core is found next to this package at run time (same site-packages), and
# through the dynamic loader's already-loaded copy in practice.
RPATH = "$ORIGIN/../torch_openreg/lib"

setup(
    ext_modules=[
        CppExtension(
            "openreg_amp._C",
            sources=["csrc/Module.cpp", "csrc/AutocastPolicies.cpp", "csrc/GradScalerKernels.cpp"],
            include_dirs=torch_openreg.include_paths(),
            library_dirs=torch_openreg.library_paths(),
            libraries=["torch_openreg", "openreg"],
            extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"],
            extra_link_args=[f"-Wl,-rpath,{RPATH}"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
