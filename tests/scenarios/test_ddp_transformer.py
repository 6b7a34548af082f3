"""A small transformer trained with DistributedDataParallel on 2 ranks (backend occl, openreg:0 and
openreg:1) equals single-process training on the full batch: losses and parameters.

Each rank is a process of its own (``cpu:gloo,openreg:occl`` over loopback); rank 0 also trains the
single-process reference on the full batch. Runs where openreg-distributed is installed (the
scenarios session installs every plugin).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("openreg_distributed", reason="the DDP scenario needs the openreg-distributed plugin")

RANK_SCRIPT = r"""
import copy, json, os
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

rank, world = int(os.environ["RANK"]), 2
STEPS, BATCH, SEQ, VOCAB = 4, 4, 12, 50  # BATCH sequences per rank


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.pos = nn.Parameter(torch.randn(SEQ, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.encoder(self.embed(tokens) + self.pos, mask=mask, is_causal=True))


def batch(step):
    # One fixed batch of random tokens (so that a few steps visibly lower the loss).
    g = torch.Generator().manual_seed(1000)
    tokens = torch.randint(0, VOCAB, (world * BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


dev = torch.device("openreg", rank)
torch.openreg.set_device(dev)
dist.init_process_group(
    "cpu:gloo,openreg:occl", init_method=os.environ["INIT_METHOD"], rank=rank, world_size=world, device_id=dev
)
torch.manual_seed(0)
ref = TinyTransformer().to(dev)
model = DDP(copy.deepcopy(ref), device_ids=[rank])
# SGD with momentum: Adam's normalised steps would turn last-bit differences in near-zero gradients
# (the order of DDP's sums) into steps of the learning rate's size.
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
losses, ref_losses = [], []
mine = slice(rank * BATCH, (rank + 1) * BATCH)
for step in range(STEPS):
    x, y = (t.to(dev) for t in batch(step))
    opt.zero_grad()
    loss = loss_of(model, x[mine], y[mine])
    loss.backward()
    opt.step()
    # Equal halves: the mean of the ranks' losses is the full batch's loss.
    global_loss = loss.detach().clone()
    dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
    losses.append(global_loss.item())
    ref_opt.zero_grad()
    ref_loss = loss_of(ref, x, y)
    ref_loss.backward()
    ref_opt.step()
    ref_losses.append(ref_loss.item())
max_diff = max((a - b).abs().max().item() for a, b in zip(model.module.parameters(), ref.parameters()))
# Both ranks hold the same parameters.
gathered = [torch.empty(0)] * world
flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()]).cpu()
dist.all_gather_object(gathered, flat)
same = bool(torch.equal(gathered[0], gathered[1]))
dist.destroy_process_group()
if rank == 0:
    print(json.dumps({"losses": losses, "ref_losses": ref_losses, "max_param_diff": max_diff, "ranks_equal": same}))
"""


def test_ddp_transformer_equals_single_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENREG_")}
    # A file store, not a free port found here: another process could take that port first.
    env.update(INIT_METHOD=(tmp_path / "store").as_uri())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT],
            cwd=tmp_path,  # nothing in the checkout shadows the installed packages
            env=dict(env, RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"rank failed ({p.returncode})\n{out}\n{err}"
    result = json.loads(outs[0][0].strip().splitlines()[-1])
    assert result["ranks_equal"], "the two ranks' parameters differ"
    # Same arithmetic up to the order of the gradient sums.
    assert result["losses"] == pytest.approx(result["ref_losses"], rel=1e-4, abs=1e-5)
    assert result["losses"][-1] < result["losses"][0], "the model did not train"
    assert result["max_param_diff"] < 1e-4, result
