"""Small models and data for the examples, the demo, the training tests and the benchmark.

Plain PyTorch, nothing pjrt-specific: every function takes a `device` and runs the same
code on "cpu" and "pjrt". Data is generated on the CPU from a seeded torch.Generator and
then moved, so a run on either device sees the same batches, and losses can be compared.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

CORPUS = "tales.txt"


# -- text ------------------------------------------------------------------------------
def load_text(name: str = CORPUS) -> str:
    """A text file shipped in torch_pjrt/tools/data (see torch_pjrt/tools/data/README.md)."""
    # beside this file, not through the package: benchmarks load this module alone in a torch CUDA
    # peer process, where importing torch_pjrt would register pjrt (benchmarks/train_eager.py)
    return (Path(__file__).parent / "data" / name).read_text(encoding="utf-8")


class CharData:
    """A text as a tensor of character ids, with a seeded random batch sampler."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.data = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> list[int]:
        return [self.stoi[c] for c in s]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, generator: torch.Generator, batch_size: int, block_size: int):
        """(x, y) on the CPU: `batch_size` random windows and the same shifted by one."""
        starts = torch.randint(len(self.data) - block_size - 1, (batch_size,), generator=generator)
        offsets = torch.arange(block_size)
        x = self.data[starts[:, None] + offsets]
        y = self.data[starts[:, None] + offsets + 1]
        return x, y


# -- the char-level GPT (nanoGPT's shape: pre-norm blocks, tied embeddings) --------------
@dataclass
class GPTConfig:
    vocab_size: int = 96
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.dropout(F.softmax(att, dim=-1), self.dropout, self.training)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    @torch.no_grad()
    def generate(self, idx, new_tokens: int, generator: torch.Generator, temperature: float = 0.8,
                 on_token=None):
        """Append `new_tokens` sampled tokens to idx (B, T). The model sees the last
        block_size tokens; give it a prompt of at least block_size tokens and every step has
        the same shapes (one set of executables on pjrt). Sampling draws from a CPU generator
        on CPU probabilities, so the same weights give the same text on every device.
        `on_token()` is called after each token (a progress bar)."""
        was_training = self.training
        self.eval()
        for _ in range(new_tokens):
            logits = self(idx[:, -self.cfg.block_size:])[:, -1, :] / temperature
            probs = F.softmax(logits.float(), dim=-1).cpu()
            nxt = torch.multinomial(probs, 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
            if on_token is not None:
                on_token()
        self.train(was_training)
        return idx


# -- a Llama-style model for training (tensor-parallel ready) ------------------------------
class LlamaBlock(nn.Module):
    """A Llama-style decoder block for training: RMSNorm, causal attention, SwiGLU MLP. Heads
    are read from the projections' widths, so a tensor-parallel shard runs its own heads."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.head_dim = dim // heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (p(h).view(B, T, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, -1))
        h = self.mlp_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """Embedding, LlamaBlocks, RMSNorm, an untied head; forward(tokens, targets) is the cross-entropy."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, hidden: int = 64, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def llama_tensor_parallel(model: Llama, tp_mesh) -> None:
    """torchtitan's plan on each block: attention and MLP inputs column-wise, outputs row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in model.blocks:
        parallelize_module(block, tp_mesh, {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                                            "o": RowwiseParallel(), "gate": ColwiseParallel(),
                                            "up": ColwiseParallel(), "down": RowwiseParallel()})


# -- small classifiers and a recurrent model ----------------------------------------------
class MLP(nn.Module):
    def __init__(self, n_in: int = 32, hidden: int = 128, n_out: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, n_out))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    """A LeNet-sized classifier for 1x16x16 images. (No conv bias before batch norm: its
    gradient is zero up to rounding, and Adam would turn that noise into full-size steps.)"""

    def __init__(self, n_classes: int = 4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, n_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class CharLSTM(nn.Module):
    def __init__(self, vocab_size: int, n_embd: int = 64, hidden: int = 128, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, n_embd)
        self.lstm = nn.LSTM(n_embd, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, idx, targets):
        out, _ = self.lstm(self.emb(idx))
        logits = self.head(out)
        return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


# -- synthetic data ----------------------------------------------------------------------
def blobs(generator: torch.Generator, n: int, n_in: int = 32, n_out: int = 10):
    """A learnable classification set: points around `n_out` random centres."""
    centres = torch.randn(n_out, n_in, generator=generator) * 2
    labels = torch.randint(n_out, (n,), generator=generator)
    return centres[labels] + torch.randn(n, n_in, generator=generator), labels


def shapes(generator: torch.Generator, n: int, size: int = 16):
    """1x16x16 images of four classes (horizontal bar, vertical bar, square, cross) with noise."""
    images = torch.randn(n, 1, size, size, generator=generator) * 0.3
    labels = torch.randint(4, (n,), generator=generator)
    where = torch.randint(3, size - 3, (n, 2), generator=generator)
    for i in range(n):
        r, c = int(where[i, 0]), int(where[i, 1])
        kind = int(labels[i])
        if kind == 0:
            images[i, 0, r, :] += 1.0
        elif kind == 1:
            images[i, 0, :, c] += 1.0
        elif kind == 2:
            images[i, 0, r - 2:r + 2, c - 2:c + 2] += 1.0
        else:
            images[i, 0, r, c - 3:c + 4] += 1.0
            images[i, 0, r - 3:r + 4, c] += 1.0
    return images, labels


# -- the shared training loop --------------------------------------------------------------
def gpt_setup(device, *, seed: int = 0, n_layer: int = 4, n_embd: int = 128, n_head: int = 4,
              block_size: int = 64, lr: float = 1e-3, data: CharData | None = None):
    """(data, model, optimizer) with weights drawn on the CPU from `seed`, then moved."""
    data = data or CharData(load_text())
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=data.vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    return data, model, opt


def training_steps(data: CharData, model: GPT, opt, device, *, batch_size: int = 8, seed: int = 1):
    """AdamW steps with gradient clipping, one per next(): yields each step's loss (detached).
    A generator, so that two runs (the demo's pjrt and CPU) can be interleaved step by step."""
    generator = torch.Generator().manual_seed(seed)
    model.train()
    while True:
        x, y = data.batch(generator, batch_size, model.cfg.block_size)
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        yield loss.detach()


def train_gpt(data: CharData, model: GPT, opt, device, steps: int, *, batch_size: int = 8, seed: int = 1,
              on_step=None) -> list[float]:
    """Train `steps` steps; returns the losses. `on_step(step, loss_tensor)` may report progress."""
    losses = []
    for step, loss in zip(range(steps), training_steps(data, model, opt, device, batch_size=batch_size, seed=seed)):
        losses.append(loss)
        if on_step is not None:
            on_step(step, loss)
    return [float(l) for l in torch.stack(losses).cpu()]
