"""``UntypedStorage.byteswap`` for openreg storages, done on the device.

torch 2.13's ``UntypedStorage._byteswap`` (``torch/csrc/StorageMethods.cpp::THPStorage_byteswap``)
swaps the bytes through ``storage.mutable_data()`` on the host, whatever the storage's device: on
an openreg storage the host touched device memory, which it cannot reach, and the process died
(SIGSEGV; a CUDA storage crashes the same way). ``torch.load`` swaps the bytes of a big-endian
checkpoint on its CPU storages, before they move to a device, so loading never reaches this.

:func:`install` wraps the method: for an openreg storage the swap runs as device kernels on the
storage's current stream (each element's bytes reversed in place); anything else goes to torch's
method, which also keeps the argument checks and their messages.
"""

import functools

import torch

_MARK = "_openreg_byteswap_wrapper"


def install() -> None:
    original = torch.UntypedStorage._byteswap
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def _byteswap(self, elem_size):
        if self.device.type != torch._C._get_privateuse1_backend_name():
            return original(self, elem_size)
        original(torch.UntypedStorage(0), elem_size)  # torch's checks of elem_size; nothing to swap
        if elem_size == 1:
            return None
        torch._check(self.nbytes() % elem_size == 0, lambda: f"the length of data is not a multiple of {elem_size}")
        data = torch.empty(0, dtype=torch.uint8, device=self.device).set_(self).view(-1, elem_size)
        data.copy_(data.flip(-1))
        return None

    setattr(_byteswap, _MARK, True)
    torch.UntypedStorage._byteswap = _byteswap
