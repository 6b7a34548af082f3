"""The scenarios' models and data, shared by the tests in this folder and by the `scenarios` bench
group (tools/bench/scenarios.py). Everything is small: a scenario must run in seconds on 2 cores.
Data is made on the CPU from fixed seeds, so every device and every rank sees the same batches."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, HEADS, LAYERS, CONTEXT = 64, 32, 4, 2, 16


def _core_models():
    """core's reference models (torch_openreg/utils/models.py, which imports only torch), loaded from
    their file rather than as torch_openreg.utils.models: importing that would import torch_openreg,
    and a scenario resumes a checkpoint in a process that must not (test_checkpoint.py)."""
    package = Path(importlib.util.find_spec("torch_openreg").origin).parent  # finds it, imports nothing
    spec = importlib.util.spec_from_file_location("openreg_reference_models", package / "utils" / "models.py")
    module = importlib.util.module_from_spec(spec)
    # Registered under its name, as an import would: Dynamo imports a compiled function's module by
    # name to read its globals (the scenarios bench group compiles TinyGPT's forward).
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


_models = _core_models()
TinyGPT, SmallCNN = _models.TinyGPT, _models.SmallCNN


def make_gpt(seed: int = 0) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(VOCAB, WIDTH, HEADS, LAYERS, CONTEXT)


def gpt_batch(step: int, batch: int = 8):
    """Token ids and next-token targets of one step, on the CPU: a fixed random walk over the
    vocabulary, so the model has something to learn."""
    g = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, VOCAB, (batch, 1), generator=g)
    steps = torch.randint(1, 4, (batch, CONTEXT), generator=g)
    seq = (start + steps.cumsum(1)) % VOCAB
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def gpt_loss(model, idx, target):
    logits = model(idx)
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten())


def train_steps(model, opt, steps: int, device, first: int = 0, rows=slice(None), batch: int = 8) -> list:
    """`steps` float32 training steps from step `first` on `rows` of each full batch: the losses."""
    losses = []
    for step in range(first, first + steps):
        idx, target = (t[rows].to(device) for t in gpt_batch(step, batch))
        loss = gpt_loss(model, idx, target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def train_cpu_reference(steps: int, lr: float, batch: int = 8, optimizer: str = "sgd") -> list:
    """Single-process float32 CPU training on the full batch of every step: the losses."""
    model = make_gpt()
    return train_steps(model, make_optimizer(model, optimizer, lr), steps, "cpu", batch=batch)


def make_optimizer(model, name: str, lr: float):
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr)
    return torch.optim.AdamW(model.parameters(), lr=lr)


def cnn_images(seed: int, batch: int = 4):
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


FEATURES, HIDDEN, CLASSES = 512, 1024, 16


def make_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, CLASSES)
    )


class Samples(torch.utils.data.Dataset):
    """Deterministic samples made in the DataLoader's worker processes (module level: picklable)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(FEATURES, generator=g), torch.randint(0, CLASSES, (), generator=g)
