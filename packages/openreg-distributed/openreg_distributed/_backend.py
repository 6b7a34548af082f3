"""Registration of occl with torch.distributed, and the creator it calls for each group."""

import atexit
import dataclasses
import functools
from typing import Optional

import torch.distributed as dist

BACKEND_NAME = "occl"
# Prefix of the private Gloo group's keys in the group's store (it shares the store and the ranks).
_TRANSPORT_PREFIX = "occl-transport/"


@dataclasses.dataclass
class OcclOptions:
    """Options of an occl group, given as ``pg_options`` to ``init_process_group`` or ``new_group``:
    where the group's transport (a private Gloo group) connects. A vendor's options would choose its
    fabric here. Groups split from the group (``split_group``, ``new_group`` of a subset) keep them.

    - ``interface``: the network interface to use (as ``GLOO_SOCKET_IFNAME``);
    - ``hostname``: the address or host name to bind to, instead of an interface;
    - ``threads``: the transport's threads (Gloo's default, 2).

    With neither ``interface`` nor ``hostname``, the transport connects as Gloo's default device
    does: ``GLOO_SOCKET_IFNAME`` if set, else the address of the host's name.
    """

    interface: str = ""
    hostname: str = ""
    threads: int = 2

    def __post_init__(self):
        if self.interface and self.hostname:
            raise ValueError("OcclOptions: give interface or hostname, not both")
        if self.threads < 1:
            raise ValueError(f"OcclOptions: threads must be at least 1, got {self.threads}")


def _make_transport(store, rank, size, timeout, options: Optional[OcclOptions] = None):
    """A Gloo backend of `size` ranks that rendezvouses on `store`, under occl's prefix (the group
    may have a Gloo backend of its own on the same store), connected as `options` say (the defaults:
    as ProcessGroupGloo(store, rank, size, timeout) connects)."""
    options = options or OcclOptions()
    store = dist.PrefixStore(_TRANSPORT_PREFIX, store)
    gloo = dist.ProcessGroupGloo
    transport_options = gloo._Options()
    transport_options._timeout = timeout
    transport_options._threads = options.threads
    if options.interface or options.hostname:
        device = gloo.create_device(interface=options.interface, hostname=options.hostname)
    else:
        device = gloo.create_default_device()
    transport_options._devices = [device]
    return gloo(store, rank, size, transport_options)


def create_occl_backend(opts, backend_options=None):
    """The creator torch.distributed calls (extended API) for every group that uses occl on openreg.

    The transport is a Gloo backend of the same ranks, made with torch.distributed's public
    ProcessGroupGloo on the group's own store (under a prefix), so it rendezvouses wherever the
    group does (multi-node included). ``backend_options`` (the call's ``pg_options``), an
    :class:`OcclOptions`, say how it connects.
    """
    from . import _C

    if backend_options is not None and not isinstance(backend_options, OcclOptions):
        raise TypeError(
            "occl: pg_options must be an openreg_distributed.OcclOptions, got "
            f"{type(backend_options).__module__}.{type(backend_options).__qualname__}"
        )
    make_transport = functools.partial(_make_transport, options=backend_options)
    gloo = make_transport(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    gloo.options.global_ranks_in_group = list(opts.global_ranks_in_group)
    gloo.options.group_name = f"{opts.group_id}:occl-transport"
    return _C.OcclBackend(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        gloo,
        make_transport,
        global_ranks=list(opts.global_ranks_in_group),
        group_name=str(opts.group_id),
    )


def register() -> None:
    """Registers occl for device type openreg, once (the first registration for a device type
    becomes its default backend, so this runs at plugin load, before any user code)."""
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    from . import _C  # loads the extension: DDP's timer for openreg

    # occl's watchdog drops the tensors of ended operations, taking the GIL when Python owned them:
    # it must stop before the interpreter finalizes (a foreign thread taking the GIL then aborts).
    atexit.register(_C._stop_foreign_releases)
    dist.Backend.register_backend(BACKEND_NAME, create_occl_backend, extended_api=True, devices=["openreg"])
    _name_mixed_groups()
    _set_pg_timeout_reaches_occl()
    _give_gloo_its_ranks()


def _name_mixed_groups() -> None:
    """torch 2.13 bug: for a group like ``cpu:gloo,openreg:occl``, _new_process_group_helper sets
    the group's default backend only if the *first* key of ``Backend._plugins`` (upper-case,
    "OCCL") is among the map's values (lower-case, "occl"): it never is, so such a group is named
    "undefined" and C++ warns. The lower-case key, first, makes the check hit; lookups use
    ``name.upper()`` and still find "OCCL"."""
    plugins = dist.Backend._plugins
    entries = list(plugins.items())
    plugins.clear()
    plugins[BACKEND_NAME] = dict(entries)[BACKEND_NAME.upper()]
    plugins.update(entries)


def _set_pg_timeout_reaches_occl() -> None:
    """torch 2.13's ``_set_pg_timeout`` (torchtitan lowers the timeout with it after the first step;
    ``dist.breakpoint`` raises it) sets the timeouts of a group's Gloo (cpu) and NCCL (cuda)
    backends only (``distributed_c10d._set_pg_timeout``, ``torch.device("cuda") in devices``): in
    a ``cpu:gloo,openreg:occl`` group occl kept its timeout silently, in an occl-only group torch
    warned "Set timeout is now only supported for either nccl or gloo" and did nothing. Wrapped
    so that the group's occl backend gets the timeout too (``OcclBackend.set_timeout``)."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    from . import _C

    original = c10d._set_pg_timeout
    if getattr(original, "_reaches_occl", False):
        return

    @functools.wraps(original)
    def set_pg_timeout(timeout, group=None):
        pg = group if group is not None else c10d._get_default_group()
        occl = None
        if not c10d._rank_not_in_group(pg) and torch.device("openreg") in pg._device_types:
            backend = pg._get_backend(torch.device("openreg"))
            occl = backend if isinstance(backend, _C.OcclBackend) else None
        if occl is None or torch.device("cpu") in pg._device_types:
            original(timeout, group)  # its own backends (and its warning when it has none)
        if occl is not None:
            occl.set_timeout(timeout)

    set_pg_timeout._reaches_occl = True
    c10d._set_pg_timeout = set_pg_timeout


def _give_gloo_its_ranks() -> None:
    """torch 2.13: ``ProcessGroupGloo::groupRanks`` answers the ranks of a Gloo backend made without a
    rank list (the default group's) only if it is the process's first Gloo backend; otherwise
    ``split`` reads an empty list, and ``split_group`` crashed every rank (SIGSEGV). occl's transport
    is a Gloo backend too: in a group named ``openreg:occl,cpu:gloo`` it is made first (so is any
    after a re-initialisation). Wrapped so that a group's Gloo backend without ranks gets its own,
    ``0 .. size - 1`` (what torch's first Gloo backend answers). hunt35a."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    original = c10d._new_process_group_helper
    if getattr(original, "_gives_gloo_ranks", False):
        return

    @functools.wraps(original)
    def new_process_group_helper(group_size, group_rank, global_ranks_in_group, *args, **kwargs):
        pg, prefix_store = original(group_size, group_rank, global_ranks_in_group, *args, **kwargs)
        if not global_ranks_in_group and isinstance(pg, dist.ProcessGroup) and torch.device("cpu") in pg._device_types:
            gloo = pg._get_backend(torch.device("cpu"))
            if isinstance(gloo, dist.ProcessGroupGloo) and not gloo.options.global_ranks_in_group:
                gloo.options.global_ranks_in_group = list(range(group_size))
        return pg, prefix_store

    new_process_group_helper._gives_gloo_ranks = True
    c10d._new_process_group_helper = new_process_group_helper
