"""Small reference models shared by core's and the plugins' test suites, the cross-package scenarios
and the benchmarks: one definition each, so that a fix or a change of shape reaches every suite.

They are what a vendor's first workloads look like: a GPT (embedding, LayerNorm, causal attention
through F.scaled_dot_product_attention, GELU MLP) and a small CNN (conv-relu twice, then linear).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GPTBlock(nn.Module):
    """A pre-norm GPT block: causal self-attention through F.scaled_dot_product_attention (openreg's
    fused attention) and a GELU MLP."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A decoder-only transformer: token embedding plus a learned position table, GPTBlocks, a final
    LayerNorm and a linear head. forward(idx) returns the logits, (batch, time, vocab)."""

    def __init__(self, vocab: int = 64, d: int = 32, heads: int = 4, layers: int = 2, context: int = 16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(context, d) * 0.02)
        self.blocks = nn.Sequential(*[GPTBlock(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos[: idx.shape[1]])))


class SmallCNN(nn.Module):
    """conv-relu twice, then a linear classifier, over 3 x 16 x 16 images (10 classes)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        return self.fc(torch.flatten(x, 1))
