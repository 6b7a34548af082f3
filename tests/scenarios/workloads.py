"""The scenarios' models and data, shared by the tests in this folder and by the `scenarios` bench
group (tools/bench/scenarios.py). Everything is small: a scenario must run in seconds on 2 cores.
Data is made on the CPU from fixed seeds, so every device and every rank sees the same batches."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, HEADS, LAYERS, CONTEXT = 64, 32, 4, 2, 16


class Block(nn.Module):
    """A pre-norm GPT block: causal attention (F.scaled_dot_product_attention) and a GELU MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.randn(CONTEXT, WIDTH) * 0.02)
        self.blocks = nn.Sequential(*[Block(WIDTH, HEADS) for _ in range(LAYERS)])
        self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, idx):
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos[: idx.shape[1]])))


def make_gpt(seed: int = 0) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT()


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


class SmallCNN(nn.Module):
    """conv-relu x2 + linear, for quantization and export."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        return self.fc(torch.flatten(x, 1))


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
