"""openreg-quant: int8 quantization kernels for the openreg device.

Installed, it is loaded by openreg-core's plugin discovery (entry point ``quant`` in
the ``torch_openreg.plugins`` group) right after ``import torch`` has set up the
device; ``import openreg_quant`` also works and loads core first.

Loading the C++ extension registers, for openreg:

- native kernels for the ``quantized_decomposed`` operators that PT2E graphs and
  torchao use (quantize/dequantize per tensor, per channel and per token, and the
  choose_qparams family): argument checks on the host, one asynchronous launch,
  results bit-exact with the decomposition (``csrc/decomposed/``);
- fused int8 operators ``torch.ops.openreg_quant.qlinear`` / ``qconv2d`` (relu post-op,
  quantized or float output), which take a weight packed on the device by ``qlinear_prepack`` /
  ``qconv2d_prepack`` (a ``torch.classes.openreg_quant.PackedWeight``), and native ``aten::_int_mm`` /
  ``aten::_weight_int8pack_mm`` (``csrc/fused/``);
- quantized tensors on openreg (QuantizedPrivateUse1, allocated and copied by core):
  ``torch.quantize_per_tensor`` / ``quantize_per_channel``, ``dequantize``, ``int_repr`` and
  ``quantized::linear`` / ``linear_relu`` with weights packed on openreg (``csrc/qtensor/``).

``openreg_quant.OpenRegQuantizer`` and ``openreg_quant.lower_pt2e`` (``pt2e.py``) are the PT2E
flow: a torchao quantizer and the FX pass that lowers a converted model to the fused ops
(imported on first use: torchao is not imported with torch).
``openreg_quant.OpenRegInt8DynamicActivationInt8WeightConfig`` (``torchao_configs.py``) is torchao's
int8 dynamic-activation config on openreg's kernels, for ``torchao.quantization.quantize_``.

Importing the package also defines the ``quantized_decomposed`` schemas (Python
owns that namespace), so ``torch.ops.quantized_decomposed.*`` exist right away.
See ``docs/mechanisms/quantization.md`` in the repository.
"""

__version__ = "0.1.0"


def _load() -> None:
    """Entry point of core's plugin group: loads the extension (its static registrations)."""
    from . import _C  # noqa: F401, F811


# Defined before this import: `import openreg_quant` first imports core, whose plugin discovery
# then calls _load on this (still importing) module.
import torch_openreg  # noqa: E402, F401  (the device, and the libraries the extension links against)

from . import _C  # noqa: E402, F401  (static registrations run when the library loads)


def _define_decomposed_schemas() -> None:
    """Python owns the quantized_decomposed namespace our kernels implement; defining it here makes
    torch.ops.quantized_decomposed.* exist after import (the C++ kernels win either way)."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401


_define_decomposed_schemas()

# The fused ops' fake (and meta) kernels and the fake class of their packed weight.
from . import fake  # noqa: E402, F401


def __getattr__(name: str):
    # The PT2E flow needs torchao: imported on first use, not when `import torch` loads the plugin.
    if name in ("OpenRegQuantizer", "lower_pt2e"):
        from . import pt2e

        return getattr(pt2e, name)
    if name == "OpenRegInt8DynamicActivationInt8WeightConfig":
        from . import torchao_configs

        return getattr(torchao_configs, name)
    raise AttributeError(f"module 'openreg_quant' has no attribute '{name}'")


# Last: `import openreg_quant` loads the plugin also when OPENREG_PLUGINS left it out (core's
# discovery ran _load already otherwise, and plugins() reports it loaded either way).
torch_openreg.openreg._plugins.imported("quant", _load)
