"""Scenario: a small GPT trained on openreg the way a user combines the plugins: DistributedDataParallel
on 2 ranks (openreg-distributed), mixed precision (openreg-amp) and torch.compile (openreg-inductor).
The losses follow single-process float32 training on the CPU, on the full batch of each step, within
the tolerances stated below (each rank trains on its half; the mean of the two halves' losses is the
full batch's loss).

- bfloat16 autocast, DDP wrapped in torch.compile (Dynamo's DDP optimizer, Inductor kernels on openreg);
- float16 autocast with a GradScaler (eager DDP; the scaler's kernels are openreg-amp's).
"""

from __future__ import annotations

import torch
from ranks import TwoRanks
from report import report
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing._internal.common_utils import run_tests
from workloads import gpt_batch, gpt_loss, make_gpt, train_cpu_reference

STEPS = 6
BATCH = 8  # full batch; 4 per rank
LR = 0.5
# Autocast runs the matmuls in 16 bits against the CPU's float32 (bfloat16 keeps 8 mantissa bits,
# float16 11); measured over these 6 steps: 2.6e-4 (bf16) and 5e-5 (fp16). Stated bounds on
# |loss - CPU float32 loss|, per step:
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-3}


class TestGPTTraining(TwoRanks):
    def train(self, dtype: torch.dtype, compiled: bool, scaler=None) -> list:
        """This rank's DDP training on openreg under autocast(dtype); the full batch's loss per step."""
        model = DDP(make_gpt().to(self.device), device_ids=[self.rank])
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        forward = torch.compile(model) if compiled else model
        losses = []
        for step in range(STEPS):
            idx, target = (t[self.mine(BATCH)].to(self.device) for t in gpt_batch(step, BATCH))
            with torch.autocast("openreg", dtype=dtype):
                loss = gpt_loss(forward, idx, target)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            opt.zero_grad()
            losses.append(self.mean_over_ranks(loss.item()))
        return losses

    def check(self, name: str, losses: list, dtype: torch.dtype, extra: str = "") -> None:
        ref = train_cpu_reference(STEPS, LR, BATCH)
        worst = max(abs(a - b) for a, b in zip(losses, ref))
        if self.rank == 0:
            report(
                f"gpt {name}: 2 ranks x {BATCH // 2}, {STEPS} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f} "
                f"(CPU fp32 {ref[0]:.3f} -> {ref[-1]:.3f}), max |diff| {worst:.1e} <= {TOL[dtype]:.0e}{extra}"
            )
        self.assertLess(losses[-1], losses[0] - 0.2, f"it does not learn: {losses}")
        for step, (a, b) in enumerate(zip(losses, ref)):
            self.assertLessEqual(abs(a - b), TOL[dtype], f"step {step}: openreg {losses} vs CPU {ref}")

    def test_ddp_compiled_bf16_autocast(self):
        losses = self.train(torch.bfloat16, compiled=True)
        self.check("DDP+compile+bf16 autocast", losses, torch.bfloat16)

    def test_ddp_fp16_autocast_grad_scaler(self):
        scaler = torch.amp.GradScaler("openreg", init_scale=2.0**10)
        losses = self.train(torch.float16, compiled=False, scaler=scaler)
        # No inf/nan in these gradients: no step skipped, so the scale never backed off.
        self.assertEqual(scaler.get_scale(), 2.0**10)
        self.check("DDP+fp16 autocast+GradScaler", losses, torch.float16, f", scale {scaler.get_scale():g}")


if __name__ == "__main__":
    run_tests()
