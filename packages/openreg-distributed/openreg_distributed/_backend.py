"""Registration of occl with torch.distributed, and the creator it calls for each group."""

import atexit

import torch.distributed as dist

BACKEND_NAME = "occl"
# Prefix of the private Gloo group's keys in the group's store (it shares the store and the ranks).
_TRANSPORT_PREFIX = "occl-transport/"


def _make_transport(store, rank, size, timeout):
    """A Gloo backend of `size` ranks that rendezvouses on `store`, under occl's prefix (the group
    may have a Gloo backend of its own on the same store)."""
    return dist.ProcessGroupGloo(dist.PrefixStore(_TRANSPORT_PREFIX, store), rank, size, timeout)


def create_occl_backend(opts, backend_options=None):
    """The creator torch.distributed calls (extended API) for every group that uses occl on openreg.

    The transport is a Gloo backend of the same ranks, made with torch.distributed's public
    ProcessGroupGloo on the group's own store (under a prefix), so it rendezvouses wherever the
    group does (multi-node included; GLOO_SOCKET_IFNAME selects the interface as for Gloo).
    """
    from . import _C

    gloo = _make_transport(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    gloo.options.global_ranks_in_group = list(opts.global_ranks_in_group)
    gloo.options.group_name = f"{opts.group_id}:occl-transport"
    return _C.OcclBackend(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        gloo,
        _make_transport,
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
