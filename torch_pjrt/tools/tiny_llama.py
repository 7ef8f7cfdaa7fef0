"""A Llama-style decoder with a static KV cache, in plain PyTorch: the decode step of the
host-overhead benchmark and of the fast-path tests (RMSNorm, rotary embeddings, grouped-query
attention over a preallocated cache written with index_copy_, SwiGLU, greedy argmax).

Nothing pjrt-specific: the same code runs on "cpu" and "pjrt", so tokens and logits compare.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int = 256
    dim: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 2
    hidden: int = 128
    max_len: int = 64
    batch: int = 1


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.dim // cfg.n_head
        self.q = nn.Linear(cfg.dim, cfg.n_head * self.head_dim, bias=False)
        self.k = nn.Linear(cfg.dim, cfg.n_kv_head * self.head_dim, bias=False)
        self.v = nn.Linear(cfg.dim, cfg.n_kv_head * self.head_dim, bias=False)
        self.o = nn.Linear(cfg.n_head * self.head_dim, cfg.dim, bias=False)
        shape = (cfg.batch, cfg.n_kv_head, cfg.max_len, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x, cos, sin, pos, mask):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        self.k_cache.index_copy_(2, pos, k)  # the static cache: written in place at this step's positions
        self.v_cache.index_copy_(2, pos, v)
        groups = self.n_head // self.n_kv_head
        keys = self.k_cache.repeat_interleave(groups, dim=1)
        values = self.v_cache.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(cfg.dim, eps=1e-6), nn.RMSNorm(cfg.dim, eps=1e-6)
        self.attn = Attention(cfg)
        self.gate = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x, cos, sin, pos, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, pos, mask)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.dim, eps=1e-6)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        head_dim = cfg.dim // cfg.n_head
        inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(cfg.max_len).float(), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.register_buffer("positions", torch.arange(cfg.max_len), persistent=False)

    def forward(self, tokens, pos):
        """Logits of `tokens` (batch, T) at positions `pos` (a T-long tensor), the cache written there."""
        x = self.embed(tokens)
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        mask = self.positions[None, :] <= pos[:, None]  # (T, max_len): each position sees the cache up to itself
        for block in self.blocks:
            x = block(x, cos, sin, pos, mask)
        return self.head(self.norm(x))


class Decoder:
    """Greedy decoding one token per step(); the token and position stay on the device."""

    def __init__(self, device, cfg: LlamaConfig | None = None, seed: int = 0, prompt_length: int = 4):
        cfg = cfg or LlamaConfig()
        torch.manual_seed(seed)
        self.model = TinyLlama(cfg).to(device).eval()
        generator = torch.Generator().manual_seed(seed + 1)
        prompt = torch.randint(cfg.vocab_size, (cfg.batch, prompt_length), generator=generator).to(device)
        self.device, self.start = device, prompt_length
        with torch.no_grad():
            logits = self.model(prompt, torch.arange(prompt_length, device=device))
        self.token = logits[:, -1:].argmax(-1)
        self.pos = torch.tensor([prompt_length], device=device)
        self.at = prompt_length  # self.pos on the host: no device read decides when to wrap

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """One decode step: the next token's logits (batch, vocab); self.token takes the argmax.
        Wraps back to the prompt's end when the cache is full, so a benchmark can run forever."""
        logits = self.model(self.token, self.pos)[:, -1]
        self.token = logits.argmax(-1, keepdim=True)
        self.at += 1
        if self.at < self.model.cfg.max_len:
            self.pos.add_(1)
        else:
            self.at = self.start
            self.pos.fill_(self.start)
        return logits
