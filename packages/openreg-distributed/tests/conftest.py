"""Shared helpers for openreg-distributed's tests."""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest
from torch_openreg.utils.testing import run_python  # noqa: F401  (used by the tests)


def loopback_interface() -> str:
    """The network interface that carries 127.0.0.1: "lo" on Linux, "lo0" on macOS."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addresses):
            return name
    raise RuntimeError("no network interface carries 127.0.0.1")


class OcclTestCase(MultiProcContinuousTest):
    """Two ranks spawned once per class; rank r uses openreg:r, in a default group that carries CPU
    tensors over Gloo and openreg tensors over occl (``cpu:gloo,openreg:occl``), bound to its device."""

    world_size = 2
    timeout = timedelta(seconds=60)
    # None: what init_process_group(device_id=...) picks alone, i.e. "openreg:occl".
    backend = "cpu:gloo,openreg:occl"

    @classmethod
    def device_type(cls) -> str:
        return "openreg"

    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        os.environ["LOCAL_RANK"] = str(rank)
        # Each process has its own emulated devices: with more ranks than devices, ranks share indices.
        torch.openreg.set_device(rank % torch.openreg.device_count())
        store = dist.FileStore(rdvz_file, world_size)
        dist.init_process_group(
            cls.backend,
            world_size=world_size,
            rank=rank,
            store=store,
            timeout=cls.timeout,
            device_id=torch.device("openreg", rank % torch.openreg.device_count()),
        )
        cls.pg = dist.distributed_c10d._get_default_group()

    @property
    def device(self) -> torch.device:
        return torch.device("openreg", self.rank % torch.openreg.device_count())


def sgd_step(model, opt, x, y):
    """One training step of the DDP and FSDP2 tests (and of their single-process references)."""
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


# Fault tests use groups of their own with a short timeout.
TIMEOUT = timedelta(seconds=3)


def fault_group(handling: str, timeout: timedelta = TIMEOUT, **env: str):
    """A group of its own whose operations time out after `timeout`, created under
    TORCH_OCCL_ASYNC_ERROR_HANDLING=handling (and `env`): the backend reads its controls when it is
    made. It is made with a long timeout, lowered once made: the transport's rendezvous in new_group
    waits for the other rank, which a loaded machine may hold back longer than the operations'
    timeout (no test is about the rendezvous)."""
    env = dict(env, TORCH_OCCL_ASYNC_ERROR_HANDLING=handling)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        group = dist.new_group(backend="occl", timeout=timedelta(seconds=60))
        dist.distributed_c10d._set_pg_timeout(timeout, group)  # reaches occl (openreg_distributed/_backend.py)
        return group
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def wait_until_failed(work, limit=30.0):
    """Polls the Work (no synchronisation) until it has failed (the watchdog or the transport failed
    it); returns its error."""
    t0 = time.monotonic()
    while work.is_success():
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"the operation did not fail within {limit} s")
        time.sleep(0.05)
    return str(work.exception())
