"""openreg-inductor's Inductor config (``device_custom_config`` of ``register_backend_for_device``).

Inductor hashes a device's custom config into the FX-graph cache key, so bumping
``codegen_version`` whenever the generated code changes (launcher layout, wrapper calls)
makes a new plugin never reuse code cached by an older one.
"""

import sys

from torch.utils._config_module import install_config_module

# Bump when the generated code (launch.py, scheduling.py, wrapper.py) changes shape.
codegen_version: int = 2

install_config_module(sys.modules[__name__])
