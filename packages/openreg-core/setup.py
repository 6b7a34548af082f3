"""Builds openreg-core: CMake + Ninja against the installed torch.

Install with ``pip install --no-build-isolation .`` so the build uses the
torch already installed (a build-isolation environment would fetch another
torch). MAX_JOBS (default 2) sets the number of parallel compile jobs; OPENREG_SANITIZER=address
builds all of core with AddressSanitizer (see noxfile.py::core_asan).
"""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    """Configures and builds the C++ parts, installing them into the package."""

    def build_extension(self, ext: Extension) -> None:
        # Importing torch must not autoload an installed (possibly broken) openreg.
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        import torch.utils

        package_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(os.environ.get("OPENREG_BUILD_DIR", ROOT / "build" / "cmake")).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        build_type = os.environ.get("OPENREG_BUILD_TYPE", "Release")
        subprocess.check_call(
            [
                "cmake",
                "-G",
                "Ninja",
                str(ROOT),
                f"-DCMAKE_BUILD_TYPE={build_type}",
                f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                f"-DPython3_EXECUTABLE={sys.executable}",
                f"-DCMAKE_INSTALL_PREFIX={package_dir}",
                # Always passed, so that a build directory configured with a sanitizer is reset.
                f"-DOPENREG_SANITIZER={os.environ.get('OPENREG_SANITIZER', '').strip()}",
                "-Wno-dev",
            ],
            cwd=build_dir,
        )
        jobs = os.environ.get("MAX_JOBS", "2")
        subprocess.check_call(["cmake", "--build", ".", "--", f"-j{jobs}"], cwd=build_dir)
        subprocess.check_call(["cmake", "--install", "."], cwd=build_dir)


setup(
    ext_modules=[Extension("torch_openreg._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
