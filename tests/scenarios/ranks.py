"""Two ranks on openreg, spawned once per test class: rank r uses openreg:r in a default group that
carries openreg tensors over occl and CPU tensors over Gloo (openreg-distributed)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest


class TwoRanks(MultiProcContinuousTest):
    world_size = 2
    timeout = timedelta(seconds=120)

    @classmethod
    def device_type(cls) -> str:
        return "openreg"

    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        os.environ["LOCAL_RANK"] = str(rank)
        torch.openreg.set_device(rank)
        dist.init_process_group(
            "cpu:gloo,openreg:occl",
            world_size=world_size,
            rank=rank,
            store=dist.FileStore(rdvz_file, world_size),
            timeout=cls.timeout,
            device_id=torch.device("openreg", rank),
        )

    @property
    def device(self) -> torch.device:
        return torch.device("openreg", self.rank)

    def mine(self, batch: int) -> slice:
        """This rank's half of a full batch of `batch` rows."""
        half = batch // self.world_size
        return slice(self.rank * half, (self.rank + 1) * half)

    def mean_over_ranks(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)  # over Gloo: a CPU tensor
        return t.item() / self.world_size
