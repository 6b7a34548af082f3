"""Loading openreg tensors that have no storage of their own (sparse compressed, nested) that
require grad.

torch 2.13 pickles a ``PrivateUse1`` tensor without a storage as a CPU copy and the device's name
(``torch/_tensor.py::Tensor._reduce_ex_internal``). The copy, ``self.cpu()``, is made with autograd
on, so it is saved with ``requires_grad=True``; ``torch._utils._rebuild_device_tensor_from_cpu_tensor``
then moves it to the device, which records the move in autograd, and sets ``requires_grad`` on the
result, which is not a leaf: ``RuntimeError: you can only change requires_grad flags of leaf
variables`` for every such checkpoint (a sparse CSR parameter, say), with any ``map_location`` and
through plain ``pickle`` too. The CPU's and CUDA's sparse tensors take another path.

:func:`install` wraps the rebuild function while torch's is broken (a probe on the CPU): the CPU
copy is detached before it moves, so the tensor loads as a leaf with the saved ``requires_grad``.
torch's ``weights_only`` unpickler keeps the functions it allows in a cache filled at its first
load, which may have happened before openreg was imported: the cache is cleared, so that it takes
the wrapper.
"""

import functools

import torch

_MARK = "_openreg_rebuild_wrapper"


def _torch_is_broken(rebuild) -> bool:
    # A move that copies (a dtype change on the CPU) gives a non-leaf, as a device move does; with
    # autograd on, as a load may run (an import under no_grad would have answered "not broken").
    try:
        with torch.enable_grad():
            rebuild(torch.zeros(1, requires_grad=True), torch.float64, "cpu", True)
    except RuntimeError:
        return True
    return False


def install() -> None:
    original = torch._utils._rebuild_device_tensor_from_cpu_tensor
    if getattr(original, _MARK, False) or not _torch_is_broken(original):
        return

    @functools.wraps(original)
    def _rebuild_device_tensor_from_cpu_tensor(data, dtype, device, requires_grad):
        return original(data.detach(), dtype, device, requires_grad)

    setattr(_rebuild_device_tensor_from_cpu_tensor, _MARK, True)
    torch._utils._rebuild_device_tensor_from_cpu_tensor = _rebuild_device_tensor_from_cpu_tensor
    torch._weights_only_unpickler._get_allowed_globals.cache_clear()
