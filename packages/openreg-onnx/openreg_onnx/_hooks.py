"""How the plugin attaches to torch.onnx without importing it (or onnx, onnxscript, onnxruntime).

``import torch`` does not import ``torch.onnx``; the exporter's registry module imports
onnxscript and onnx, seconds of work. So loading the plugin only asks core's
``torch_openreg.utils.imports.when_imported`` to call it when one of two modules is imported:

- ``torch.onnx`` (cheap; the TorchScript exporter's symbolic registry lives there): when it has
  been imported, openreg's ops get TorchScript symbolic functions (``dynamo=False``), and
  ``torch.onnx.ops.symbolic`` gets device-keeping kernels (``_device_fixes.py``);
- ``torch.onnx._internal.exporter._registration`` (imported by the first ``dynamo=True``
  export): when it has been imported, ``ONNXRegistry.from_torchlib`` is wrapped so that every
  registry the exporter builds also holds openreg's portable translations.

The patch point, for torch 2.13 only (``_SUPPORTED_TORCH``):
``torch/onnx/_internal/exporter/_compat.py``, ``export_compat``::

    registry = _registration.ONNXRegistry().from_torchlib(opset_version=registry_opset_version)
    if custom_translation_table is not None:
        for torch_op, onnx_op in custom_translation_table.items():
            ...
            registry.register_op(torch_op, onnx_op, is_complex=False)

(``_core.export`` builds its registry with the same classmethod when it is given none). Our
entries are added with ``register_op`` inside ``from_torchlib``, before the user's table;
``register_op`` puts each new entry first and the dispatcher takes the first, so the user's
``custom_translation_table`` entries win.
"""

from __future__ import annotations

import threading
import warnings
from typing import Dict

import torch

# The exporter internals the registry patch relies on are private: check them per minor version.
_SUPPORTED_TORCH = ((2, 13),)
_REGISTRATION = "torch.onnx._internal.exporter._registration"
_TORCH_ONNX = "torch.onnx"

_lock = threading.Lock()
_state = {"installed": False, "registry_patched": False, "symbolics_registered": False}


def _torch_minor() -> tuple:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _patch_registry(registration) -> None:
    """Wraps ``ONNXRegistry.from_torchlib`` (see the module docstring for the torch line)."""
    if _torch_minor() not in _SUPPORTED_TORCH or not hasattr(registration, "ONNXRegistry"):
        warnings.warn(
            f"openreg-onnx: torch {torch.__version__} is not a version whose exporter internals it knows; "
            "plain torch.onnx.export gets no openreg translations (pass "
            "custom_translation_table=openreg_onnx.translation_table() instead)",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    cls = registration.ONNXRegistry
    original = cls.__dict__["from_torchlib"].__func__
    if getattr(original, "_openreg_onnx", False):
        return

    def from_torchlib(klass, *args, **kwargs):
        registry = original(klass, *args, **kwargs)
        from ._table import translation_table

        for op, fn in translation_table("portable").items():
            registry.register_op(op, fn)
        return registry

    from_torchlib._openreg_onnx = True
    from_torchlib.__wrapped__ = original
    from_torchlib.__doc__ = original.__doc__
    cls.from_torchlib = classmethod(from_torchlib)
    _state["registry_patched"] = True


def _register_symbolics(torch_onnx) -> None:
    from . import _device_fixes, _symbolic

    _symbolic.register()
    _device_fixes.register()  # torch.onnx.ops.symbolic keeps an openreg model's device
    _state["symbolics_registered"] = True


def install() -> None:
    """Attaches the hooks now if torch.onnx is already imported, else when it gets imported."""
    from torch_openreg.utils.imports import when_imported

    with _lock:
        if _state["installed"]:
            return
        _state["installed"] = True
    when_imported(_TORCH_ONNX, _register_symbolics)
    when_imported(_REGISTRATION, _patch_registry)


def status() -> Dict[str, bool]:
    """What has attached so far (for tests and ``openreg_onnx.hooks_status()``)."""
    return dict(_state)
