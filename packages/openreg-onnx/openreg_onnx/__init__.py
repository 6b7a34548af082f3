"""openreg-onnx: ONNX export of models on the openreg device, verified in onnxruntime.

Installed, it is loaded by openreg-core's plugin discovery (entry point ``onnx`` in the
``torch_openreg.plugins`` group). Loading imports none of onnx, onnxscript, onnxruntime: it
only arranges (``_hooks.py``) that

- the first ``torch.onnx.export(..., dynamo=True)`` in the process finds translations for every
  ``openreg::`` operator and for ``aten._scaled_dot_product_fused_attention_overrideable``
  (portable: standard ONNX ops); a ``custom_translation_table`` the caller passes wins;
- ``torch.onnx.export(..., dynamo=False)`` finds TorchScript symbolic functions for them.

The API (each imports the ONNX packages on first use):

- ``translation_table(mode="portable"|"vendor")``: the table itself (``_table.py``);
- ``export(model, args, ...)``: export with the table, dynamic dims checked, provenance
  recorded, ``com.openreg`` function bodies attached in vendor mode (``_export.py``);
- ``verify(model_or_program, args, ...)``: openreg eager against onnxruntime (``_verify.py``);
- ``export_without_weights(build_model, build_args, weights)``: export under FakeTensorMode, no
  device memory touched, the real weights attached after (``_fake.py``);
- ``openreg_session(model)``: onnxruntime running ``com.openreg`` nodes with openreg's own kernels
  (``_ort.py``);
- ``python -m openreg_onnx export|verify``.

See ``docs/mechanisms/onnx.md`` in the repository.
"""

__version__ = "0.1.0"


def _load() -> None:
    """Entry point of core's plugin group: attach the lazy export hooks."""
    from . import _hooks

    _hooks.install()


# Defined before this import: `import openreg_onnx` first imports core, whose plugin discovery
# then calls _load on this (still importing) module.
import torch_openreg  # noqa: E402, F401  (the device and its operators)

from . import _hooks  # noqa: E402


def hooks_status():
    """Which hooks have attached so far: ``installed``, ``registry_patched`` (dynamo exporter),
    ``symbolics_registered`` (TorchScript exporter)."""
    return _hooks.status()


def translation_table(mode: str = "portable"):
    """``{OpOverload: onnxscript translation}`` for openreg's operators; see ``_table.py``."""
    from ._table import translation_table as table

    return table(mode)


def attach_functions(model):
    """Adds the ``com.openreg`` function bodies a vendor-mode model needs (an ``onnx.ModelProto``
    or an ``ONNXProgram``, changed in place)."""
    from ._export import attach_functions as attach

    return attach(model)


def export(model, args=(), f=None, **kwargs):
    """``torch.onnx.export`` of an openreg model with openreg's table; see ``_export.py``."""
    from ._export import export as run

    return run(model, args, f, **kwargs)


def export_without_weights(build_model, build_args, weights=None, f=None, **kwargs):
    """Export of a model built on fake openreg tensors, real weights attached after; see ``_fake.py``."""
    from ._fake import export_without_weights as run

    return run(build_model, build_args, weights, f, **kwargs)


def openreg_session(model, device="openreg"):
    """onnxruntime session whose ``com.openreg`` nodes run openreg's kernels; see ``_ort.py``
    (needs onnxruntime-extensions)."""
    from ._ort import openreg_session as make

    return make(model, device)


def check_discrepancies(observer, onnx_program, **kwargs):
    """``torch.onnx.InputObserver.check_discrepancies`` for a model on openreg (its captured
    outputs are copied to the host first); see ``_device_fixes.py``."""
    from ._device_fixes import check_discrepancies as run

    return run(observer, onnx_program, **kwargs)


def verify(model_or_program, args=(), **kwargs):
    """Compares openreg eager with onnxruntime; see ``_verify.py``."""
    from ._verify import verify as run

    return run(model_or_program, args, **kwargs)


_hooks.install()  # `import openreg_onnx` alone attaches the hooks too

# Last: `import openreg_onnx` loads the plugin also when OPENREG_PLUGINS left it out (core's
# discovery ran _load already otherwise, and plugins() reports it loaded either way).
torch_openreg.openreg._plugins.imported("onnx", _load)
