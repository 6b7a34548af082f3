"""Three ranks: the collectives whose results depend on the group's size, and DDP and FSDP2
training equal to single-process training on the full batch (FSDP2's shards uneven: 16 rows over 3
ranks). Each process has its own emulated devices; rank 2 uses its process's openreg:0."""

import torch
import torch.distributed as dist
from conftest import OcclTestCase
from test_ddp import DDPTraining
from test_mesh import FSDPTraining
from torch.testing._internal.common_utils import run_tests

R = dist.ReduceOp
WORLD = 3


def values(rank, n=6, dtype=torch.float64):
    """Rank `rank`'s input: 10 rank + 0, 1, ..., n - 1."""
    return (torch.arange(n, dtype=torch.float64) + 10 * rank).to(dtype)


class TestThreeRanks(DDPTraining, FSDPTraining, OcclTestCase):
    world_size = WORLD

    def test_collectives(self):
        r, d = self.rank, self.device
        every = [values(q) for q in range(WORLD)]
        product = every[0] * every[1] * every[2]
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            reductions = [(R.SUM, sum(every)), (R.MAX, every[2]), (R.MIN, every[0])]
            if dtype.is_floating_point:
                reductions += [(R.AVG, sum(every) / 3), (R.PRODUCT, product)]
            for op, want in reductions:
                x = values(r, dtype=dtype).to(d)
                dist.all_reduce(x, op=op)
                self.assertEqual(x.cpu(), want.to(dtype), msg=f"all_reduce {op} {dtype}")
        # all-gather into one tensor, reduce-scatter of one
        out = torch.empty(3 * 6, device=d)
        dist.all_gather_into_tensor(out, values(r, dtype=torch.float32).to(d))
        self.assertEqual(out.cpu(), torch.cat(every).float())
        mine = torch.empty(6, device=d)
        dist.reduce_scatter_tensor(mine, (torch.cat(every) * (r + 1)).float().to(d))
        self.assertEqual(mine.cpu(), (every[r] * (1 + 2 + 3)).float())
        # uneven all-to-all: rank q sends rank s (s + 1) elements of value 10 q + s
        got = torch.empty(3 * (r + 1), device=d)
        sent = torch.cat([torch.full((s + 1,), 10.0 * r + s) for s in range(WORLD)]).to(d)
        dist.all_to_all_single(got, sent, output_split_sizes=[r + 1] * 3, input_split_sizes=[1, 2, 3])
        self.assertEqual(got.cpu(), torch.cat([torch.full((r + 1,), 10.0 * q + r) for q in range(WORLD)]))
        # rooted operations at the last rank and at the middle one
        x = values(r, dtype=torch.float32).to(d)
        dist.broadcast(x, src=2)
        self.assertEqual(x.cpu(), every[2].float())
        x = values(r, dtype=torch.float32).to(d)
        dist.reduce(x, dst=1)
        if r == 1:
            self.assertEqual(x.cpu(), sum(every).float())

    def test_ddp_equals_full_batch_training(self):
        model, ref = self.train()
        # the mean over 3 ranks' gradients is not the full batch's bit for bit (a division by 3)
        self.assert_same_parameters(model, ref, atol=1e-6, rtol=1e-5)

    def test_fsdp2_equals_full_batch_training(self):
        self.assert_fsdp2_equals_full_batch_training()


if __name__ == "__main__":
    run_tests()
