"""Dynamic shapes compiled per bucket (torch_pjrt/compiler/dynamic.py, padding.py) against eager CPU.

Sizes are rounded up to buckets, inputs padded, padding masked where it would reach real
elements, outputs sliced back: results must equal the unpadded computation (tight tolerances),
and executables are bounded by the buckets touched. Graphs that cannot be padded exactly fall
back to exact sizes with the reason recorded.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt.compiler  # noqa: F401
from torch_pjrt.compiler import compile_stats
from torch_pjrt.compiler.dynamic import bucket_of

ATOL = RTOL = 2e-5


pytestmark = pytest.mark.usefixtures("fresh_compile")


def close(actual, expected, atol=ATOL, rtol=RTOL):
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), atol=atol, rtol=rtol)


class Block(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CharGPT(nn.Module):
    def __init__(self, vocab=20, d=16, block_size=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block_size, d)
        self.block, self.ln, self.head = Block(d), nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        logits = self.head(self.ln(self.block(x)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def _buckets_touched(sizes, buckets="pow2"):
    return {tuple(bucket_of(n, buckets) for n in s) for s in sizes}


def _run_training(ref, compiled_model, batches):
    model = compiled_model
    for inputs in batches:
        loss = model(*[t.to("pjrt") for t in inputs])
        expected = ref(*inputs)
        close(loss, expected)
        loss.backward()
        expected.backward()


def test_char_gpt_ten_shapes_forward_backward_equal_eager_bounded_by_buckets():
    torch.manual_seed(0)
    ref = CharGPT()
    model = copy.deepcopy(ref).to("pjrt")
    compiled = torch.compile(model, backend="pjrt", dynamic=True)
    shapes = [(3, 5), (3, 7), (2, 9), (4, 6), (3, 11), (2, 13), (4, 3), (3, 16), (2, 17), (3, 31)]
    batches = []
    for B, T in shapes:
        idx = torch.randint(0, 20, (B, T))
        batches.append((idx, torch.roll(idx, -1, 1)))
    _run_training(ref, compiled, batches)
    for p, q in zip(model.parameters(), ref.parameters()):
        close(p.grad, q.grad)
    s = compile_stats()
    assert [g["bucketed"] for g in s["dynamic_graphs"]] == [True, True], s["dynamic_graphs"]
    touched = len(_buckets_touched(shapes))
    assert touched < len(shapes)
    assert s["executables"] <= 2 * touched, s["recompiles"]
    assert [n.split("_", 1)[1] for n in s["graph_names"]] == ["forward", "backward"]
    assert all(r["reason"].startswith("new bucket") for r in s["recompiles"]), s["recompiles"]


def test_mlp_ten_batch_sizes_with_mean_losses():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 5))
    model = copy.deepcopy(ref).to("pjrt")

    def loss_fn(m, x, y, z):
        out = m(x)
        return F.cross_entropy(out, y) + F.mse_loss(out, z) + out.softmax(-1).amax(0).sum() + out.var(0).mean()

    compiled = torch.compile(loss_fn, backend="pjrt", dynamic=True)
    sizes = [3, 5, 6, 7, 9, 12, 15, 17, 20, 33]
    for n in sizes:
        x, y, z = torch.randn(n, 6), torch.randint(0, 5, (n,)), torch.randn(n, 5)
        loss = compiled(model, x.to("pjrt"), y.to("pjrt"), z.to("pjrt"))
        expected = loss_fn(ref, x, y, z)
        close(loss, expected)
        loss.backward()
        expected.backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        close(p.grad, q.grad)
    s = compile_stats()
    assert all(g["bucketed"] for g in s["dynamic_graphs"]), s["dynamic_graphs"]
    assert s["executables"] <= 2 * len(_buckets_touched([(n,) for n in sizes])), s["recompiles"]


def test_user_bucket_list_and_sizes_used_as_values():
    def f(x):
        n = x.shape[0]
        return x * n + x.sum(0) / n, x.mean(0), torch.arange(n, device=x.device) * 2

    compiled = torch.compile(f, backend="pjrt", dynamic=True, options={"buckets": [8, 16]})
    sizes = [3, 5, 8, 9, 16, 20]
    for n in sizes:
        x = torch.randn(n, 4)
        for a, b in zip(compiled(x.to("pjrt")), f(x)):
            assert a.shape == b.shape
            close(a, b)
    s = compile_stats()
    assert s["dynamic_graphs"][0]["bucketed"], s["dynamic_graphs"]
    # 3, 5, 8 -> 8; 9, 16 -> 16; 20 is beyond the list: its own executable
    assert s["executables"] == 3, s["recompiles"]


def test_unpaddable_graph_falls_back_to_exact_sizes_with_the_reason():
    def f(x):
        return x[:, -2:].sum(1) + x.sort(1).values[:, 0]  # slices from the end of the padded dim, sort

    compiled = torch.compile(f, backend="pjrt", dynamic=True)
    sizes = [3, 5, 6]
    for n in sizes:
        x = torch.randn(2, n)
        close(compiled(x.to("pjrt")), f(x))
    s = compile_stats()
    (g,) = s["dynamic_graphs"]
    assert not g["bucketed"] and g["reason"], g
    assert s["executables"] == len(sizes)


def test_buckets_none_means_exact_sizes():
    compiled = torch.compile(lambda x: x.sum(0), backend="pjrt", dynamic=True, options={"buckets": None})
    for n in (3, 5):
        x = torch.randn(n, 2)
        close(compiled(x.to("pjrt")), x.sum(0))
    s = compile_stats()
    assert s["dynamic_graphs"][0] == {**s["dynamic_graphs"][0], "bucketed": False, "reason": "option buckets=None"}
    assert s["executables"] == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.bool])
def test_sizes_used_as_values_promote_like_python_numbers(dtype):
    # a size reaches the padded executable as a traced value; it must promote as the Python
    # int (or float, after sym_float or true division) it is in torch: x * n keeps x's dtype
    def f(x):
        n = x.shape[0]
        return x * n, x + (n - 1) * 2, n * n * x, x * float(n), x * (n / 2)

    compiled = torch.compile(f, backend="pjrt", dynamic=True)
    for n in (3, 5, 6):
        x = (torch.randn(n, 4) * 4).to(dtype) if dtype != torch.bool else torch.randn(n, 4) > 0
        for a, b in zip(compiled(x.to("pjrt")), f(x)):
            assert a.dtype == b.dtype, (a.dtype, b.dtype)
            torch.testing.assert_close(a.cpu(), b)
    s = compile_stats()
    assert all(g["bucketed"] for g in s["dynamic_graphs"]), s["dynamic_graphs"]
