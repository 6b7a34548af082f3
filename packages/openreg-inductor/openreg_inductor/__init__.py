"""openreg-inductor: ``torch.compile`` for the openreg device.

Installed, it is loaded by openreg-core's plugin discovery (entry point ``inductor`` in the
``torch_openreg.plugins`` group) right after ``import torch`` has set up the device;
``import openreg_inductor`` also works and loads core first. Loading registers:

- the Dynamo device interface (``device_interface.OpenRegInterface``);
- Inductor's device op overrides (``codegen.op_overrides``) and backend for "openreg":
  ``codegen.scheduling.OpenRegScheduling`` (Inductor's CPU C++ kernels, packaged as
  launchers that run on openreg streams, see ``codegen.launch``), the Python wrapper
  ``codegen.wrapper.OpenRegPythonWrapper`` and the config ``config`` (its
  ``codegen_version`` is part of Inductor's FX-graph cache key);
- the torch 2.13 workarounds in ``_torch213``.

``torch.compile(model)`` with the default backend then compiles openreg graphs into C++
kernels launched asynchronously on the current openreg stream. See
``docs/mechanisms/compiler.md`` in the repository.
"""

import importlib.abc
import importlib.util
import sys
import warnings

import torch_openreg  # noqa: F401  (the device)

__version__ = "0.1.0"

DEVICE = "openreg"
_registered = False


def register() -> None:
    """Registers the device interface and the Inductor backend for openreg (idempotent)."""
    global _registered
    if _registered:
        return
    from torch._dynamo.device_interface import register_interface_for_device
    from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides

    from . import _torch213, config
    from .codegen.op_overrides import OpenRegDeviceOpOverrides
    from .codegen.scheduling import OpenRegScheduling
    from .codegen.wrapper import OpenRegPythonWrapper
    from .device_interface import OpenRegInterface

    _torch213.apply()
    register_interface_for_device(DEVICE, OpenRegInterface)
    for index in range(torch_openreg.openreg.device_count()):
        register_interface_for_device(f"{DEVICE}:{index}", OpenRegInterface)
    register_device_op_overrides(DEVICE, OpenRegDeviceOpOverrides())
    register_backend_for_device(
        DEVICE,
        OpenRegScheduling,
        OpenRegPythonWrapper,
        device_custom_config=config,
    )
    _registered = True


class _RegisterAfterDynamo(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``register()`` right after ``torch._dynamo`` is imported (by ``torch.compile``,
    ``torch._dynamo`` or ``torch._inductor``), so that ``import torch`` does not pay for
    importing Dynamo and Inductor (about a second) in processes that never compile."""

    def find_spec(self, name, path, target=None):
        if name != "torch._dynamo":
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
            register()
        except Exception as e:  # a broken plugin must not break torch.compile for other devices
            warnings.warn(f"openreg-inductor failed to register: {type(e).__name__}: {e}", RuntimeWarning)


def _load() -> None:
    """Entry point of core's plugin group: registers now if Dynamo is already imported, else
    when it is."""
    if "torch._dynamo" in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterAfterDynamo) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterDynamo())
