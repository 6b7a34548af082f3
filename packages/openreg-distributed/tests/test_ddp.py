"""DistributedDataParallel over occl on 2 ranks: training equals single-process training on the
full batch, with gradient compression hooks (torch's fp16 and openreg's bf16), no_sync, and DDP's timer
for openreg."""

import copy
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from conftest import OcclTestCase, sgd_step
from openreg_distributed.comm_hooks import occl_bf16_compress_hook
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.common_utils import run_tests

STEPS = 3
BATCH = 8  # per rank


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def full_batch(step, ranks=2):
    """All ranks' batches of one step (the same on every rank), on the CPU."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(ranks * BATCH, 8, generator=g), torch.randn(ranks * BATCH, 4, generator=g)


class DDPTraining:
    """DDP training against the single-process reference, for a class of any number of ranks
    (test_three_ranks.py uses it too)."""

    def train(self, hook=None, accumulate=False):
        """DDP on this rank's half of each batch, and the single-process reference on the full
        batch; returns both models."""
        ref = make_model().to(self.device)
        model = DDP(copy.deepcopy(ref), device_ids=[self.device.index])
        if hook is not None:
            model.register_comm_hook(dist.group.WORLD, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(STEPS):
            x, y = full_batch(step, self.world_size)
            x, y = x.to(self.device), y.to(self.device)
            mine = slice(self.rank * BATCH, (self.rank + 1) * BATCH)
            if accumulate:
                # Two micro-batches: the first under no_sync (no communication), the second syncs.
                opt.zero_grad()
                half = BATCH // 2
                first = slice(mine.start, mine.start + half)
                second = slice(mine.start + half, mine.stop)
                with model.no_sync():
                    (nn.functional.mse_loss(model(x[first]), y[first]) / 2).backward()
                (nn.functional.mse_loss(model(x[second]), y[second]) / 2).backward()
                opt.step()
            else:
                sgd_step(model, opt, x[mine], y[mine])
            sgd_step(ref, ref_opt, x, y)
        return model, ref

    def assert_same_parameters(self, model, ref, **tol):
        for p, q in zip(model.module.parameters(), ref.parameters()):
            self.assertEqual(p.detach().cpu(), q.detach().cpu(), **tol)


class TestDDP(DDPTraining, OcclTestCase):
    def test_equals_full_batch_training(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, ref = self.train()
        self.assert_same_parameters(model, ref)
        # DDP's reducer timer is registered for openreg: no "only CPU and CUDA" warning, timings.
        self.assertFalse([w for w in caught if "Time stats" in str(w.message)], [str(w.message) for w in caught])
        data = model._get_ddp_logging_data()
        self.assertGreater(data.get("avg_backward_compute_time", 0), 0)
        self.assertGreater(data.get("avg_backward_comm_time", 0), 0)

    def test_sync_batch_norm_equals_batch_norm_on_the_full_batch(self):
        """nn.SyncBatchNorm under DDP (its statistics all-gathered over occl, its backward all-reduced):
        outputs, running statistics and parameters equal BatchNorm trained on the full batch in one
        process. It needs core's batch_norm_stats & co., which PyTorch has for CUDA only."""
        torch.manual_seed(0)
        ref = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))
        ref = ref.to(self.device)
        model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref)), device_ids=[self.rank])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(STEPS):
            g = torch.Generator().manual_seed(200 + step)
            x = (torch.randn(2 * 3, 3, 5, 5, generator=g) * 2 + 1).to(self.device)
            mine = x[self.rank * 3 : (self.rank + 1) * 3]
            opt.zero_grad()
            out = model(mine)
            out.square().mean().backward()
            opt.step()
            ref_opt.zero_grad()
            ref_out = ref(x)
            ref_out.square().mean().backward()
            ref_opt.step()
            tol = dict(atol=1e-5, rtol=1e-5)
            self.assertEqual(out.detach().cpu(), ref_out[self.rank * 3 : (self.rank + 1) * 3].detach().cpu(), **tol)
        self.assert_same_parameters(model, ref, **tol)
        bn, ref_bn = model.module[1], ref[1]
        self.assertIsInstance(bn, nn.SyncBatchNorm)
        self.assertEqual(bn.running_mean.cpu(), ref_bn.running_mean.cpu(), **tol)
        self.assertEqual(bn.running_var.cpu(), ref_bn.running_var.cpu(), **tol)

    def test_no_sync_accumulation(self):
        model, ref = self.train(accumulate=True)
        self.assert_same_parameters(model, ref)
        # Under no_sync nothing is communicated: each rank's gradients are those of its own
        # micro-batch alone, which differ between the ranks (averaging them would change them).
        model = DDP(make_model().to(self.device), device_ids=[self.rank])
        local = copy.deepcopy(model.module)
        x, y = (t.to(self.device) for t in full_batch(0))
        mine = slice(self.rank * BATCH, self.rank * BATCH + BATCH // 2)
        with model.no_sync():
            nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        nn.functional.mse_loss(local(x[mine]), y[mine]).backward()
        for p, q in zip(model.module.parameters(), local.parameters()):
            self.assertEqual(p.grad.cpu(), q.grad.cpu())
        grad = model.module[0].weight.grad
        both = torch.empty(2, *grad.shape, device=self.device)
        dist.all_gather_into_tensor(both, grad)
        self.assertFalse(torch.equal(both[0].cpu(), both[1].cpu()))

    def test_compression_hooks(self):
        model, ref = self.train(hook=default_hooks.fp16_compress_hook)
        self.assert_same_parameters(model, ref, atol=2e-2, rtol=2e-2)
        # torch 2.13's DDP allows the bf16 hook only for CUDA/NCCL and XPU/XCCL, by name ...
        with self.assertRaisesRegex(TypeError, "BF16 all reduce communication hook required CUDA"):
            self.train(hook=default_hooks.bf16_compress_hook)
        # ... so openreg ships its own: gradients all-reduced in bfloat16 (not equal to float32
        # DDP's parameters, which equal the reference's), within bfloat16's precision.
        model, ref = self.train(hook=occl_bf16_compress_hook)
        self.assert_same_parameters(model, ref, atol=3e-2, rtol=3e-2)
        exact, _ = self.train()
        differs = any(
            not torch.equal(p.detach().cpu(), q.detach().cpu())
            for p, q in zip(model.module.parameters(), exact.module.parameters())
        )
        self.assertTrue(differs, "the hook did not compress: parameters equal float32 DDP's")


if __name__ == "__main__":
    run_tests()
