"""openreg: a CUDA-like accelerator emulated on the CPU, integrated into PyTorch
through the PrivateUse1 mechanism.

``import torch`` loads this package through the ``torch.backends`` entry point
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that off). Importing it:

1. loads the C++ layer (``_C`` and ``lib/libtorch_openreg``), whose static
   initialisers register the device guard, the hooks, the allocator and the
   operator kernels for PrivateUse1;
2. renames PrivateUse1 to ``openreg`` and registers ``torch.openreg``;
3. generates the ``Tensor.openreg()``-style convenience methods;
4. loads the installed openreg plugins (see ``torch.openreg.plugins()``).
"""

import os
import sys
from typing import List


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: importing the package does the work.

    Defined before ``import torch``: when a user imports this package first, torch's
    autoload finds it partly initialised and calls this; the import then carries on.
    """


import torch  # noqa: E402

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

if sys.platform == "win32":  # no rpath: _C's libraries are found through the process's DLL folders
    os.add_dll_directory(os.path.join(_PACKAGE_DIR, "lib"))

from . import _C  # noqa: E402, F401  (registers the backend in C++)

__version__ = "0.1.0"


def include_paths() -> List[str]:
    """Header folders for C++ plugins built against core: ``openreg/runtime.h`` (the device
    runtime) and ``torch_openreg/...`` (the PyTorch layer: streams, kernel tensors, ...)."""
    return [os.path.join(_PACKAGE_DIR, "include")]


def library_paths() -> List[str]:
    """Folders of core's shared libraries (``libopenreg``, ``libtorch_openreg``): link plugins
    against these so that the process has one device runtime and one allocator."""
    return [os.path.join(_PACKAGE_DIR, "lib")]


def library_file(name: str) -> str:
    """Path of one of core's shared libraries, ``"openreg"`` or ``"torch_openreg"``, under the file
    name the platform gives it (for ctypes: the C API of a library the process already loaded)."""
    file = {"win32": f"{name}.dll", "darwin": f"lib{name}.dylib"}.get(sys.platform, f"lib{name}.so")
    return os.path.join(library_paths()[0], file)


def _register() -> None:
    if getattr(torch.utils.backend_registration, "_privateuse1_backend_name", "") != "openreg":
        torch.utils.rename_privateuse1_backend("openreg")
    from . import openreg

    torch._register_device_module("openreg", openreg)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    from .openreg import _dlpack  # Tensor.__dlpack_device__/__dlpack__ fixes for the renamed backend

    _dlpack.install()
    from .openreg import _byteswap  # UntypedStorage.byteswap on the device, not through host memory

    _byteswap.install()
    from .openreg import _serialization  # storage-less tensors that require grad load as leaves

    _serialization.install()
    from .openreg import _optim_capture  # a non-capturable optimizer step is refused in a capture, as on CUDA

    _optim_capture.install()
    openreg.random._register_graphsafe_rng()
    openreg._plugins.load_plugins()


_register()
