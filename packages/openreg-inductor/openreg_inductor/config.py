"""openreg-inductor's Inductor config (``device_custom_config`` of ``register_backend_for_device``).

Inductor hashes a device's custom config into the FX-graph cache key, so bumping
``codegen_version`` whenever the generated code changes (launcher layout, wrapper calls)
makes a new plugin never reuse code cached by an older one.
"""

import os
import sys
import warnings

from torch.utils._config_module import install_config_module

# Bump when the generated code (launch.py, scheduling.py, wrapper.py) changes shape.
codegen_version: int = 18


# Elements per thread below which an openreg pointwise kernel runs its loops on the stream's worker alone
# instead of opening an OpenMP parallel region (Inductor's ``cpp.min_chunk_size``, 512, for openreg
# kernels only). A region wakes the worker's OpenMP team, whose threads compete with the host thread
# and the worker for the cores: on 2 cores a 1K-element fused kernel took 56 to 67 us per call
# with the region and 36 to 41 us without (docs/mechanisms/compiler.md, "Benchmark"). Reductions
# keep Inductor's threshold: splitting one over threads changes its rounding.
def _min_chunk_size(default: int = 4096) -> int:
    # A value that is not a positive integer is named and ignored: parsed bare, "abc" failed the plugin's
    # registration, and every compile then failed with a KeyError naming the device (hunt36b).
    text = os.environ.get("OPENREG_INDUCTOR_MIN_CHUNK_SIZE")
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        warnings.warn(
            f"OPENREG_INDUCTOR_MIN_CHUNK_SIZE={text!r} is not a positive integer; openreg-inductor uses {default}",
            stacklevel=2,
        )
        return default
    return value


min_chunk_size: int = _min_chunk_size()

install_config_module(sys.modules[__name__])
