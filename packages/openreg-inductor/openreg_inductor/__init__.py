"""openreg-inductor: ``torch.compile`` for the openreg device.

Installed, it is loaded by openreg-core's plugin discovery (entry point ``inductor`` in the
``torch_openreg.plugins`` group) right after ``import torch`` has set up the device;
``import openreg_inductor`` also works and loads core first. Loading registers:

- the Dynamo device interface (``device_interface.OpenRegInterface``) and traceable stand-ins for
  ``torch.openreg.synchronize``/``current_stream``/``current_device`` (``polyfills``);
- Inductor's device op overrides (``codegen.op_overrides``) and backend for "openreg":
  ``codegen.scheduling.OpenRegScheduling`` (Inductor's CPU C++ kernels, packaged as
  launchers that run on openreg streams, see ``codegen.launch``), the Python wrapper
  ``codegen.wrapper.OpenRegPythonWrapper``, the C++ wrapper ``codegen.cpp_wrapper.OpenRegCppWrapper``
  (``cpp_wrapper=True``) and the config ``config`` (its
  ``codegen_version`` is part of Inductor's FX-graph cache key);
- the torch 2.13 workarounds in ``_torch213``;
- ``max-autotune``'s choices for openreg and their timing with openreg events (``autotune``);
- Inductor's graph policy ``graphs.OpenRegGraphPolicy``: ``mode="reduce-overhead"`` replays
  openreg graphs as openreg device graphs (``torch.accelerator.Graph``).

``torch.compile(model)`` with the default backend then compiles openreg graphs into C++
kernels launched asynchronously on the current openreg stream. See
``docs/mechanisms/compiler.md`` in the repository.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

DEVICE = "openreg"
_registered = False


def register_dynamo() -> None:
    """Registers the Dynamo device interface (idempotent)."""
    import torch_openreg  # noqa: F811  (this module's own import of it may not have run yet: see the end)
    from torch._dynamo.device_interface import register_interface_for_device

    from . import polyfills
    from .device_interface import OpenRegInterface

    register_interface_for_device(DEVICE, OpenRegInterface)
    polyfills.register()
    for index in range(torch_openreg.openreg.device_count()):
        register_interface_for_device(f"{DEVICE}:{index}", OpenRegInterface)


def register() -> None:
    """Registers the device interface and the Inductor backend for openreg (idempotent)."""
    global _registered
    if _registered:
        return
    # Called before Inductor is imported, this import runs the whole registration itself (the
    # hook of _load). Without this check the outer call then applied every workaround a second
    # time: argmax's logical-index loader wrapped twice returned ((value, index), index).
    importlib.import_module("torch._inductor.compile_fx")
    if _registered:
        return
    from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides
    from torch._inductor.codegen.cpp_utils import DEVICE_TO_ATEN

    from . import _torch213, autotune, config, graphs
    from .codegen.cpp_wrapper import OpenRegCppWrapper
    from .codegen.op_overrides import OpenRegDeviceOpOverrides
    from .codegen.scheduling import OpenRegScheduling
    from .codegen.wrapper import OpenRegPythonWrapper

    _torch213.apply()
    register_dynamo()
    autotune.register()
    register_device_op_overrides(DEVICE, OpenRegDeviceOpOverrides())
    register_backend_for_device(
        DEVICE,
        OpenRegScheduling,
        OpenRegPythonWrapper,
        device_cpp_wrapper_codegen=OpenRegCppWrapper,
        device_custom_config=config,
    )
    # The C++ wrapper's device table (allocations, device checks): openreg is PrivateUse1.
    DEVICE_TO_ATEN[DEVICE] = "at::kPrivateUse1"
    graphs.install()
    _registered = True


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``action`` right after the module ``name`` has been imported: registration waits for
    the import of Dynamo (the device interface) and of Inductor's ``compile_fx`` (the backend),
    so ``import torch`` does not pay for importing them (about a second) in processes that never
    compile. ``compile_fx`` is imported by every Inductor compile and imports everything the
    backend needs, so when it is done no module the registration touches is half-initialised."""

    def __init__(self, name, action):
        self.name, self.action = name, action

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader  # the module looks untouched
        try:
            self.action()
        except Exception as e:  # a broken plugin must not break torch.compile for other devices
            warnings.warn(f"openreg-inductor failed to register: {type(e).__name__}: {e}", RuntimeWarning)


def _when_imported(name, action) -> None:
    if name in sys.modules:
        action()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, action))


def _load() -> None:
    """Entry point of core's plugin group."""
    _when_imported("torch._dynamo", register_dynamo)
    _when_imported("torch._inductor.compile_fx", register)


# Imported after _load is defined: `import openreg_inductor` first imports core, whose plugin
# discovery then calls _load on this (still importing) module.
import torch_openreg  # noqa: E402, F401  (the device)
