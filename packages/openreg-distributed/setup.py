"""Builds openreg-distributed's C++ extension (occl) against the installed torch and openreg-core.

Install with ``pip install --no-build-isolation .`` (a build-isolation environment would fetch
another torch). The three sources compile as one unit (``unity=True``): c10d's headers cost ~30 s
per unit to parse. FlightRecorder.cpp needs nlohmann's JSON header (c10d's FlightRecorderDetail.hpp
includes it; torch does not ship it: the pinned nlohmann-json package, a build requirement, does).
"""

import os

# Importing torch must not autoload an installed openreg before we ask for it.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

try:
    import nlohmann_json
except ImportError as e:  # --no-build-isolation does not install build requirements
    raise SystemExit(
        "openreg-distributed's build needs the nlohmann-json package (its JSON header): "
        "pip install nlohmann-json==3.12.0"
    ) from e
from setuptools import setup  # noqa: E402
from torch_openreg.utils.cpp_extension import OpenRegExtension, build_ext  # noqa: E402

NLOHMANN_INCLUDE = os.path.join(os.path.dirname(nlohmann_json.__file__), "include")

setup(
    ext_modules=[
        OpenRegExtension(
            "openreg_distributed._C",
            ["csrc/Module.cpp", "csrc/OcclBackend.cpp", "csrc/FlightRecorder.cpp"],
            include_dirs=[NLOHMANN_INCLUDE],
            unity=True,
        )
    ],
    cmdclass={"build_ext": build_ext},
)
