"""openreg-distributed: occl, the c10d collective backend for openreg tensors.

Installed, it is loaded by openreg-core's plugin discovery (entry point ``distributed`` in the
``torch_openreg.plugins`` group) right after ``import torch`` has set up the device;
``import openreg_distributed`` also works and loads core first. Loading it:

- registers the backend ``occl`` with ``torch.distributed`` for device type ``openreg``, so that
  ``init_process_group(device_id=torch.device("openreg", rank))`` picks ``cpu:gloo,openreg:occl``
  and ``torch.distributed.get_default_backend_for_device("openreg") == "occl"``;
- registers DDP's reducer timer for openreg (C++, ``csrc/Module.cpp``).

``openreg_distributed.OcclOptions`` (``pg_options`` of ``init_process_group``/``new_group``) says
where a group's transport connects: the network interface or address, and its threads.

``openreg_distributed.comm_hooks`` has DDP's bfloat16 compression hook for openreg (torch's own is
allowed on CUDA and XPU only).

occl runs every collective as a kernel on a communication stream of the tensors' device, ordered
with the caller's stream by events, over kernel views of device memory (no copies), with a private
Gloo group as the transport (``csrc/Transport.hpp`` is the seam a vendor's fabric replaces). See
``docs/mechanisms/distributed.md`` in the repository.
"""

__version__ = "0.1.0"
__all__ = ["BACKEND_NAME", "OcclOptions", "comm_hooks", "create_occl_backend", "flight_recorder", "register"]


def _load() -> None:
    """Entry point of core's plugin group: registers occl with torch.distributed (once)."""
    from ._backend import register

    register()


# Defined before this import: `import openreg_distributed` first imports core, whose plugin
# discovery then calls _load on this (still importing) module.
import torch_openreg  # noqa: E402, F401  (the device, and the libraries the extension links against)

from . import comm_hooks, flight_recorder  # noqa: E402
from ._backend import BACKEND_NAME, OcclOptions, create_occl_backend, register  # noqa: E402

# Last: `import openreg_distributed` loads the plugin also when OPENREG_PLUGINS left it out (core's
# discovery ran _load already otherwise, and plugins() reports it loaded either way).
torch_openreg.openreg._plugins.imported("distributed", _load)
