"""Building a C++ extension against openreg-core, as every C++ plugin does.

``OpenRegExtension`` is ``torch.utils.cpp_extension.CppExtension`` with core's headers and
libraries added, and an rpath to core's ``lib/`` folder: the extension links the one
``libopenreg`` (device runtime) and ``libtorch_openreg`` (allocator, streams, kernel launch)
that core loaded, so the process keeps one runtime. ``build_ext`` is torch's BuildExtension
with Ninja. A plugin's ``setup.py``::

    from torch_openreg.utils.cpp_extension import OpenRegExtension, build_ext
    setup(ext_modules=[OpenRegExtension("my_plugin._C", ["csrc/Module.cpp"])],
          cmdclass={"build_ext": build_ext})

Build with ``pip install --no-build-isolation`` (an isolated build would fetch another torch);
``MAX_JOBS`` (default 2) sets the parallel compile jobs.
"""

import os
import sys
from typing import Any, List

os.environ.setdefault("MAX_JOBS", "2")

from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

from .. import include_paths, library_paths  # noqa: E402

# Plugins are installed next to core (same site-packages); the loader finds core's libraries
# through this rpath, and in practice through the copies core already loaded.
_RPATH = "@loader_path/../torch_openreg/lib" if sys.platform == "darwin" else "$ORIGIN/../torch_openreg/lib"

build_ext = BuildExtension.with_options(use_ninja=True)


def OpenRegExtension(name: str, sources: List[str], **kwargs: Any):  # noqa: N802  (named like CppExtension)
    """A CppExtension compiled against core's headers and linked with core's libraries."""
    kwargs["include_dirs"] = [*kwargs.get("include_dirs", []), *include_paths()]
    kwargs["library_dirs"] = [*kwargs.get("library_dirs", []), *library_paths()]
    kwargs["libraries"] = [*kwargs.get("libraries", []), "torch_openreg", "openreg"]
    # -g0 first: Python's own CFLAGS carry -g, and debug information for code built on torch's
    # headers doubled the plugins' compile time and quadrupled their size. A plugin's own flags
    # come after it, so a "-g" there brings it back.
    flags = kwargs.get("extra_compile_args", ["-O2", "-Wall", "-Wno-unused-parameter"])
    kwargs["extra_compile_args"] = ["-g0", *flags]
    kwargs["extra_link_args"] = [*kwargs.get("extra_link_args", []), f"-Wl,-rpath,{_RPATH}"]
    return CppExtension(name, sources, **kwargs)
