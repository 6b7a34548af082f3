"""openreg-amp: automatic mixed precision for the openreg device.

Installed, it is loaded by openreg-core's plugin discovery (entry point ``amp`` in
the ``torch_openreg.plugins`` group) right after ``import torch`` has set up the
device; ``import openreg_amp`` also works and loads core first.

Loading the C++ extension registers, for openreg:

- the autocast policies on the ``AutocastPrivateUse1`` key: the same lists torch
  2.13 uses for CUDA (lower precision, fp32, fp32 with a set or appended dtype,
  promote) and the ban on ``binary_cross_entropy``; every other op falls through;
- native kernels for GradScaler's ``_amp_foreach_non_finite_check_and_unscale_`` and
  ``_amp_update_scale_``.

``torch.autocast("openreg", dtype=torch.float16 or torch.bfloat16)`` and
``torch.amp.GradScaler("openreg")`` then behave as they do on CUDA. See
``docs/mechanisms/amp.md`` in the repository.
"""

__version__ = "0.1.0"


def _load() -> None:
    """Entry point of core's plugin group: loads the extension (its static registrations)."""
    from . import _C  # noqa: F401, F811


# Defined before this import: `import openreg_amp` first imports core, whose plugin discovery
# then calls _load on this (still importing) module.
import torch_openreg  # noqa: E402, F401  (the device, and the libraries the extension links against)

from . import _C  # noqa: E402, F401  (static registrations run when the library loads)

# Last: `import openreg_amp` loads the plugin also when OPENREG_PLUGINS left it out (core's
# discovery ran _load already otherwise, and plugins() reports it loaded either way).
torch_openreg.openreg._plugins.imported("amp", _load)
