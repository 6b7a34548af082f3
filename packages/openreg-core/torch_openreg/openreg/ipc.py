"""Sharing openreg tensors between processes (runtime IPC handles).

``get_ipc_handle(t)`` describes where ``t`` lives (the runtime's handle of its
allocation, plus the tensor's geometry); another process of the same user passes
it to ``open_ipc_handle`` and gets a tensor over *the same device memory*: a write
in either process is seen by the other. The handle names no shared-memory object
(nothing in ``/dev/shm``, nothing to guess): the runtime reaches the memory through
the exporting process, so it is valid while that process lives, and only for
processes of the same user (``libopenreg/src/platform_posix.cpp``).

With these two functions the producer must keep the tensor alive while consumers
use it. The handle is taken after the producer's queued work on the tensor's
device has finished, so consumers see its final values.

``torch.multiprocessing`` queues, pipes and process arguments carry openreg
tensors and storages this way: :func:`_install_reducers` registers reducers with
its ``ForkingPickler`` (torch 2.13 special-cases CUDA only and would try to share
an openreg storage as CPU memory). As torch does for CUDA tensors, a storage sent
that way is kept alive by the sender until the receiver's copy is gone
(:func:`_keep`), so a producer may drop what it sent: a DataLoader
worker's next batch took the memory of the batch the main process was reading.
"""

import os
import threading
from typing import NamedTuple, Optional, Tuple

import torch
from torch.multiprocessing import reductions

from .. import _C
from ..utils.fork import renewed_at_fork


class IpcHandle(NamedTuple):
    """Everything another process needs to open a shared openreg tensor (picklable)."""

    handle: bytes  # the runtime's orIpcMemHandle_t of the allocation
    device: int
    offset: int  # of the storage in the allocation, in bytes
    nbytes: int  # of the storage
    dtype: torch.dtype
    size: Tuple[int, ...]
    stride: Tuple[int, ...]
    storage_offset: int  # in elements
    # A lazily conjugated or negated view (x.conj(), its imaginary part) reads the same memory as its
    # base; without these bits the other process would read the base's values. torch 2.13 drops them
    # for CPU tensors sent through torch.multiprocessing (a conj view arrives unconjugated).
    conj: bool = False
    neg: bool = False


def get_ipc_handle(tensor: torch.Tensor) -> IpcHandle:
    """A handle to ``tensor``'s device memory for another process (see the module doc)."""
    if tensor.device.type != "openreg":
        raise ValueError(f"get_ipc_handle takes an openreg tensor, got one on {tensor.device}")
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        raise ValueError("get_ipc_handle: the tensor has no device memory (an empty storage)")
    torch.openreg.synchronize(tensor.device)  # consumers see the finished values
    handle, offset, _ = _C._ipc_export(storage.data_ptr())
    return IpcHandle(
        handle,
        tensor.device.index,
        offset,
        storage.nbytes(),
        tensor.dtype,
        tuple(tensor.size()),
        tuple(tensor.stride()),
        tensor.storage_offset(),
        tensor.is_conj(),
        tensor.is_neg(),
    )


def _open_storage(
    h: IpcHandle,
    release=None,  # the slab: a tensor, or a _SlabByName
    slot: int = -1,
    sender: Optional[Tuple[int, int]] = None,
    generation: int = 0,
) -> torch.UntypedStorage:
    def opened() -> torch.UntypedStorage:  # the runtime maps the exporter's memory
        try:
            slab = _slab(release)
            return _C._ipc_open(h.handle, h.device, h.offset, h.nbytes, slab, slot, generation).untyped_storage()
        except RuntimeError as e:
            # The runtime refuses a handle of its own process (as CUDA's does): here a tensor that
            # another process received from this one and sent back. CUDA refuses to send it at all.
            if sender is None or "made by this process" not in str(e):
                raise
            raise RuntimeError(
                "this openreg tensor was allocated by this process and sent back to it by the process that "
                "received it, which torch.multiprocessing cannot share again (nor can it for CUDA tensors): "
                "send a clone instead (t.clone()), or send it on to another process"
            ) from None

    if sender is None:  # open_ipc_handle: the caller keeps the producer's tensor alive
        return opened()
    # One storage per message and process, as torch does for the storages it shares
    # (reductions.shared_cache): a message read again while a tensor read from it lives gives that
    # tensor's storage. A second opening would release the sender's memory when the first dies.
    key = ("openreg", *sender, slot, generation, h.handle)  # the handle names the exporter's start time too
    with _opening:  # two threads reading one message open it once
        cached = reductions.storage_from_cache(torch.UntypedStorage, key)
        if cached is not None:
            return cached
        storage = _take(sender, slot, generation)
        if storage is None:
            storage = opened()
        reductions.shared_cache[key] = reductions.StorageWeakRef(storage)
        return storage


@renewed_at_fork
def _new_opening_lock() -> None:
    global _opening
    _opening = threading.Lock()


def open_ipc_handle(h: IpcHandle) -> torch.Tensor:
    """The tensor a handle from :func:`get_ipc_handle` describes, over the shared memory."""
    return _open_tensor(h)


def _open_tensor(
    h: IpcHandle,
    release=None,  # the slab: a tensor, or a _SlabByName
    slot: int = -1,
    sender: Optional[Tuple[int, int]] = None,
    generation: int = 0,
) -> torch.Tensor:
    out = torch.empty(0, dtype=h.dtype, device=torch.device("openreg", h.device))
    out = out.set_(_open_storage(h, release, slot, sender, generation), h.storage_offset, h.size, h.stride)
    return _with_bits(out, h.conj, h.neg)  # lazy views again: the bits, no copy


# ---- torch.multiprocessing ----


class _SlabByName(NamedTuple):
    """A file_system slab as it travels: its shared-memory file's name, opened by each reading
    (:func:`_slab`). torch's own transport of a CPU storage under file_system counts a reference on
    the file at each sending and drops one at each reading, so a message read twice (which openreg's
    receivers allow) dropped one too many: the file was unlinked when the receiver exited, and the
    sender's next message named a file that no longer existed. An opening here counts itself and
    its closing uncounts itself; the sender's own mapping keeps the file while it keeps the slab."""

    manager: bytes
    name: bytes
    nbytes: int


def _slab(release) -> torch.Tensor:
    """The slab a message carries (a tensor, or a :class:`_SlabByName` to open). A process maps a
    slab once while anything it received holds it (a weak entry in torch's ``shared_cache``, as
    torch keeps the storages it shares): one mapping per message exhausted the process's mappings
    (``vm.max_map_count``) at ~65k held tensors. Called under ``_opening``."""
    if not isinstance(release, _SlabByName):
        return release
    key = ("openreg-slab", release.name)
    storage = reductions.storage_from_cache(torch.UntypedStorage, key)
    if storage is None:
        storage = torch.UntypedStorage._new_shared_filename_cpu(release.manager, release.name, release.nbytes)
        reductions.shared_cache[key] = reductions.StorageWeakRef(storage)
    return torch.empty(0, dtype=torch.int64).set_(storage, 0, (release.nbytes // 8,), (1,))


def _keep(storage: torch.UntypedStorage) -> Tuple[object, int, Tuple[int, int], int]:
    """Keeps ``storage`` until its receivers release it (``Module.cpp::SentStorages``, as torch keeps
    a CUDA storage it sent): the slab and slot in which receivers count themselves, the last one
    zeroing it; who sent it (this process and the slab's index, for :func:`_take`); and the send's
    generation, which the slot holds until the release (a message read after that is refused, not
    given a later send's memory). A slab is CPU memory shared with the receivers; it travels with
    the message."""
    over = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    strategy = torch.multiprocessing.get_sharing_strategy()  # slabs are per strategy (Module.cpp)
    key = _C._ipc_keep(over, strategy)
    while key is None:  # every slot is taken; a CPU slab whatever the default device is
        _C._ipc_add_slab(torch.zeros(_C._IPC_SLOTS, dtype=torch.int64, device="cpu").share_memory_(), strategy)
        key = _C._ipc_keep(over, strategy)
    slab, slot, generation = key
    release = _C._ipc_slab(slab)
    if strategy == "file_system":
        release = _SlabByName(*release.untyped_storage()._share_filename_cpu_())
    return release, slot, (os.getpid(), slab), generation


def _take(sender: Tuple[int, int], slot: int, generation: int) -> Optional[torch.UntypedStorage]:
    """In the sending process itself (a message read back where it was written): the storage kept
    for that send, its slot freed unless a receiver holds it (then it stays kept for the receiver);
    the rebuilt tensor holds the storage from then on. The runtime does not open a process's own
    handle (as CUDA's does not)."""
    if sender[0] != os.getpid():
        return None
    over = _C._ipc_take(sender[1], slot, generation)
    if over is None:
        raise RuntimeError(
            "this openreg tensor was sent by this process and released since: its memory may have been freed "
            "(a torch.multiprocessing message is read once, or again while a tensor read from it lives)"
        )
    return over.untyped_storage()


def _kept_count() -> int:
    """How many sent storages this process keeps for their receivers."""
    return _C._ipc_kept_count()


def _as_sent(cls, t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """`t` as the sender's type (a Parameter stays a Parameter) and `requires_grad`."""
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad)


def _rebuild_tensor(
    cls,
    h: IpcHandle,
    requires_grad: bool,
    release=None,  # the slab: a tensor, or a _SlabByName
    slot: int = -1,
    sender: Optional[Tuple[int, int]] = None,
    generation: int = 0,
) -> torch.Tensor:
    return _as_sent(cls, _open_tensor(h, release, slot, sender, generation), requires_grad)


def _rebuild_storage(
    h: IpcHandle,
    release=None,  # the slab: a tensor, or a _SlabByName
    slot: int = -1,
    sender: Optional[Tuple[int, int]] = None,
    generation: int = 0,
) -> torch.UntypedStorage:
    return _open_storage(h, release, slot, sender, generation)


def _with_bits(t: torch.Tensor, conj: bool, neg: bool) -> torch.Tensor:
    """``t`` as a lazy conjugate and/or negative view, as the sender's was (see IpcHandle)."""
    if conj:
        t = t.conj()
    if neg:
        t = torch._neg_view(t)
    return t


def _rebuild_empty_tensor(
    cls, dtype, size, stride, device: int, requires_grad: bool, conj: bool = False, neg: bool = False
) -> torch.Tensor:
    t = torch.empty_strided(size, stride, dtype=dtype, device=torch.device("openreg", device))
    return _as_sent(cls, _with_bits(t, conj, neg), requires_grad)


def _rebuild_empty_storage(device: int) -> torch.UntypedStorage:
    return torch.UntypedStorage(0, device=torch.device("openreg", device))


def _install_reducers() -> None:
    from multiprocessing.reduction import ForkingPickler

    if getattr(ForkingPickler, "_openreg_reducers", False):
        return

    def reduce_tensor(t):
        if t.device.type != "openreg":
            return reductions.reduce_tensor(t)
        if t.requires_grad and not t.is_leaf:  # torch's rule for every device
            raise RuntimeError(
                "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not "
                "support crossing process boundaries.  If you just want to transfer the data, call detach() on "
                "the tensor before serializing (e.g., putting it on the queue)."
            )
        if t.is_nested or t.layout != torch.strided:  # no storage of its own: its parts travel
            return reduce_parts(t)
        if t.untyped_storage().nbytes() == 0:  # no memory to share: rebuilt empty, as torch does for CUDA
            return _rebuild_empty_tensor, (
                type(t),
                t.dtype,
                tuple(t.size()),
                t.stride(),
                t.device.index,
                t.requires_grad,
                t.is_conj(),
                t.is_neg(),
            )
        handle = get_ipc_handle(t.detach())
        return _rebuild_tensor, (type(t), handle, t.requires_grad, *_keep(t.untyped_storage()))

    def reduce_parts(t):
        """A nested or sparse tensor as its dense parts, each shared as above, rebuilt by torch's own
        functions (torch's reduce_sparse_tensor and reduce_nested_tensor would share the parts through
        torch's reducer, which takes an openreg storage for CPU memory). Without this the pickling
        failed in the queue's feeder thread, and the receiver waited forever."""
        if t.is_nested:  # the buffer on the device; sizes, strides and offsets on the host
            parts = (t.values(), t._nested_tensor_size(), t._nested_tensor_strides())
            parts += (t._nested_tensor_storage_offsets(),)
            return reductions.rebuild_nested_tensor, sum((reduce_tensor(p) for p in parts), ())
        if t.layout == torch.sparse_coo:
            parts = reduce_tensor(t._indices()) + reduce_tensor(t._values())
            return reductions.rebuild_sparse_coo_tensor, (*parts, t.shape, t.is_coalesced())
        if t.layout in (torch.sparse_csr, torch.sparse_bsr):
            compressed, plain = t.crow_indices(), t.col_indices()
        elif t.layout in (torch.sparse_csc, torch.sparse_bsc):
            compressed, plain = t.ccol_indices(), t.row_indices()
        else:
            raise NotImplementedError(f"sharing an openreg tensor of layout {t.layout} between processes")
        parts = reduce_tensor(compressed) + reduce_tensor(plain) + reduce_tensor(t.values())
        return reductions.rebuild_sparse_compressed_tensor, (*parts, t.shape, t.layout)

    def reduce_storage(s):
        if s.device.type != "openreg":
            return reductions.reduce_storage(s)
        if s.nbytes() == 0:
            return _rebuild_empty_storage, (s.device.index,)
        handle = get_ipc_handle(torch.empty(0, dtype=torch.uint8, device=s.device).set_(s))
        return _rebuild_storage, (handle, *_keep(s))

    for cls in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(cls, reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)
    ForkingPickler._openreg_reducers = True
