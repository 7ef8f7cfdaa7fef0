"""The kernel interface: a user's Pallas kernel as a custom op in eager, autograd and
torch.compile(backend="pjrt"), platform variants and fallback, the autotuner, errors; and a
small model built on the shipped kernels that trains the same eager and compiled."""
from __future__ import annotations

import functools
import json

import jax
import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt import kernels
from torch_pjrt.compiler import reset_compile_stats
from torch_pjrt.kernels import autotune

# ------------------------------------------------------------------ a user's kernel: scaled multiply
TRACED: list = []  # (kernel, platform or block) each time a body is traced: which implementation ran


def scaled_mul_reference(x, y, alpha: float):
    return x * y * alpha


def _scaled_mul_block(x_ref, y_ref, o_ref, *, alpha):
    o_ref[...] = x_ref[...] * y_ref[...] * alpha


@kernels.kernel("test_kernels::scaled_mul", reference=scaled_mul_reference)
def scaled_mul(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    TRACED.append(("scaled_mul", kernels.target(), kernels.interpret()))
    return kernels.pallas_call(functools.partial(_scaled_mul_block, alpha=alpha),
                               jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    reset_compile_stats()
    TRACED.clear()
    yield


def test_user_pallas_kernel_eager_autograd_from_reference():
    x, y = torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    px, py = x.to("pjrt").requires_grad_(), y.to("pjrt").requires_grad_()
    out = scaled_mul(px, py, 2.5)
    assert out.device.type == "pjrt"
    assert ("scaled_mul", "cpu", True) in TRACED  # Pallas chose interpret mode on the CPU platform by itself
    torch.testing.assert_close(out.detach().cpu(), x * y * 2.5)
    g = torch.randn(4, 8, dtype=torch.float64)
    out.backward(g.to("pjrt"))  # no backward= given: jax.vjp of the reference
    torch.testing.assert_close(px.grad.cpu(), g * y * 2.5)
    torch.testing.assert_close(py.grad.cpu(), g * x * 2.5)


def test_user_kernel_on_cpu_tensors_and_check_helper():
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    torch.testing.assert_close(scaled_mul(x, y, 3.0), x * y * 3.0)  # host tensors: the same JAX function on CPU
    kernels.check(scaled_mul, [(x, y, 3.0), (torch.randn(2, 7, dtype=torch.float64), torch.randn(2, 7, dtype=torch.float64), -1.0)])


def test_check_helper_fails_on_a_wrong_kernel():
    @kernels.kernel("test_kernels::wrong_mul", reference=scaled_mul_reference)
    def wrong_mul(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * y * alpha + 1e-3  # off by a little: the check must notice

    with pytest.raises(AssertionError, match="output 0"):
        kernels.check(wrong_mul, [(torch.randn(3, 3), torch.randn(3, 3), 1.0)], opcheck=False)


def test_compiled_graph_with_a_kernel_is_one_executable():
    def f(x, y):
        return torch.sin(scaled_mul(x.cos(), y, 3.0)).sum(dim=0)

    x, y = torch.randn(4, 8, device="pjrt"), torch.randn(4, 8, device="pjrt")
    got = torch.compile(f, backend="pjrt")(x, y)
    stats = torch_pjrt.compile_stats()
    assert stats["dynamo_graphs"] == 1 and stats["graphs"] == 1 and stats["executables"] == 1
    torch.testing.assert_close(got.cpu(), f(x, y).cpu())


def test_platform_variant_is_chosen_at_dispatch():
    @kernels.kernel("test_kernels::variant_mul", reference=scaled_mul_reference)
    def variant_mul(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        TRACED.append(("main", kernels.target()))
        return x * y * alpha

    @variant_mul.variant("cpu")
    def _(x, y, alpha):
        TRACED.append(("cpu variant", kernels.target()))
        return x * y * alpha

    x = torch.randn(3, 3, device="pjrt")
    torch.testing.assert_close(variant_mul(x, x, 2.0).cpu(), (x * x * 2.0).cpu())
    assert TRACED == [("cpu variant", "cpu")]


def test_unsupported_platform_falls_back_to_the_reference_or_raises():
    @kernels.kernel("test_kernels::tpu_only", reference=scaled_mul_reference, platforms=("tpu",))
    def tpu_only(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        TRACED.append("tpu body")
        return x * y * alpha

    x = torch.randn(3, 3, device="pjrt")
    torch.testing.assert_close(tpu_only(x, x, 2.0).cpu(), (x * x * 2.0).cpu())
    assert TRACED == []  # the reference ran on the CPU platform

    @kernels.kernel("test_kernels::tpu_only_no_reference", platforms=("tpu",))
    def tpu_only_no_reference(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(kernels.KernelError, match="test_kernels::tpu_only_no_reference: no implementation for "
                                                  "platform 'cpu'"):
        tpu_only_no_reference(x)


def test_backward_kernel_is_used_when_given():
    def backward(x, scale: float, *, outputs, grad_outputs):
        TRACED.append("backward kernel")
        return (grad_outputs[0] * scale,)

    @kernels.kernel("test_kernels::scale", reference=lambda x, scale: x * scale, backward=backward)
    def scale_op(x: torch.Tensor, scale: float) -> torch.Tensor:
        return x * scale

    x = torch.randn(6, device="pjrt", requires_grad=True)
    scale_op(x, 4.0).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((6,), 4.0))
    assert TRACED == ["backward kernel"]


def test_kernel_errors_name_op_and_devices():
    x = torch.randn(3, 3, device="pjrt")
    with pytest.raises(RuntimeError, match=r"pjrt:0 and cpu.*scaled_mul"):
        scaled_mul(x, torch.randn(3, 3), 1.0)
    with pytest.raises(ValueError, match="namespace::name"):
        kernels.kernel("no_namespace")(scaled_mul_reference)
    with pytest.raises(ValueError, match="not parameters"):
        kernels.kernel("test_kernels::bad_tune", tune={"block": (8,)})(scaled_mul_reference)


def test_autotuner_picks_and_caches_per_shape(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_PJRT_AUTOTUNE", "1")
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path))
    autotune.clear()

    @kernels.kernel("test_kernels::tuned_double", reference=lambda x: x * 2, tune={"block": (8, 16)})
    def tuned_double(x: torch.Tensor, *, block: int = 8) -> torch.Tensor:
        TRACED.append(block)
        return kernels.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                                   jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // block,),
                                   in_specs=[_rows(block)], out_specs=_rows(block))(x)

    x = torch.randn(32, 4, device="pjrt")
    torch.testing.assert_close(tuned_double(x).cpu(), (x * 2).cpu())
    assert set(TRACED[:2]) == {8, 16}  # both candidates measured, then the winner traced for the call
    saved = json.loads((tmp_path / "autotune.json").read_text())
    (key, choice), = saved.items()
    assert key.startswith("test_kernels::tuned_double|cpu|") and "[32, 4]" in key and choice["block"] in (8, 16)
    assert TRACED[2] == choice["block"]
    autotune.clear()  # memory only: the next process (simulated) reads the file instead of measuring
    TRACED.clear()
    tuned_double(torch.randn(32, 4, device="pjrt") + 1)  # same shape, new executable? no: same cached one
    assert TRACED == []
    assert autotune.lookup(key) == choice
    autotune.clear(disk=True)
    assert not (tmp_path / "autotune.json").exists()


def test_kernel_no_candidate_compiles_runs_its_reference(monkeypatch, tmp_path):
    """A kernel with no block size that builds (a new GPU, a jax whose Pallas lowering changed: seen
    on the first H200 session) runs its reference with a warning naming the first failure, forward
    and backward, and is not tuned again for the same shapes."""
    monkeypatch.setenv("TORCH_PJRT_AUTOTUNE", "1")
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path))
    autotune.clear()
    tried = []

    @kernels.kernel("test_kernels::never_builds", reference=lambda x: x * 3, tune={"block": (8, 16)})
    def never_builds(x: torch.Tensor, *, block: int = 8) -> torch.Tensor:
        tried.append(block)
        raise ValueError(f"block {block} does not lower here")

    x = torch.randn(32, 4, requires_grad=True)
    xp = x.detach().to("pjrt").requires_grad_()
    with pytest.warns(RuntimeWarning, match="runs its reference .* ValueError: block 8 does not lower here"):
        out = never_builds(xp)
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), x.detach() * 3)
    torch.testing.assert_close(xp.grad.cpu(), torch.full_like(x, 3.0))
    assert tried == [8, 16]  # tuned once: the backward and later calls reuse the finding
    with pytest.raises(autotune.NoWorkingConfig, match="every candidate failed"):
        autotune.best(next(iter(autotune._failed)), [{"block": 8}], lambda c: 0.0)
    autotune.clear()


def _rows(block):
    from jax.experimental import pallas as pl

    return pl.BlockSpec((block, 4), lambda i: (i, 0))


def test_autotuner_is_off_on_cpu_by_default(monkeypatch):
    monkeypatch.delenv("TORCH_PJRT_AUTOTUNE", raising=False)
    assert not autotune.enabled("cpu") and autotune.enabled("gpu") and autotune.enabled("tpu")
    assert autotune.candidates({"a": (1, 2), "b": (3,)}) == [{"a": 1, "b": 3}, {"a": 2, "b": 3}]


# ------------------------------------------------------------------ a model on the shipped kernels
class TinyMoELM(torch.nn.Module):
    """Embedding -> RMSNorm -> causal GQA attention (SDPA: flash kernel) -> 2-expert MoE (grouped matmul)
    -> RMSNorm -> logits -> fused cross-entropy. (torch._grouped_mm's meta kernel demands bfloat16,
    so this float32 model calls the kernel's op directly; the aten route is tested below.)"""

    def __init__(self, vocab=40, d=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.emb = torch.nn.Embedding(vocab, d)
        self.norm1, self.norm2 = torch.nn.Parameter(torch.ones(d)), torch.nn.Parameter(torch.ones(d))
        self.q = torch.nn.Linear(d, d, bias=False)
        self.kv = torch.nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.experts = torch.nn.Parameter(torch.randn(2, d, d) * d ** -0.5)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, tokens, targets):
        b, t = tokens.shape
        x = self.emb(tokens)
        h = kernels.rms_norm(x, self.norm1, 1e-6)
        q = self.q(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        flat = x.reshape(b * t, -1)  # tokens routed by position: first half to expert 0, the rest to expert 1
        offs = torch.tensor([b * t // 2, b * t], dtype=torch.int32, device=x.device)
        x = x + kernels.grouped_mm(flat, self.experts, offs).view(b, t, -1)
        logits = self.head(kernels.rms_norm(x, self.norm2, 1e-6))
        return kernels.softmax_cross_entropy(logits.view(b * t, -1), targets.view(-1))


def _train(model, step_fn, tokens, targets, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = step_fn(tokens, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_model_on_kernels_trains_the_same_eager_and_compiled():
    torch.manual_seed(0)
    base = TinyMoELM()
    tokens, targets = torch.randint(0, 40, (2, 16)), torch.randint(0, 40, (2, 16))
    eager = TinyMoELM().to("pjrt")
    eager.load_state_dict(base.state_dict())
    compiled = TinyMoELM().to("pjrt")
    compiled.load_state_dict(base.state_dict())
    dt, dg = tokens.to("pjrt"), targets.to("pjrt")
    eager_losses = _train(eager, eager, dt, dg)
    compiled_losses = _train(compiled, torch.compile(compiled, backend="pjrt"), dt, dg)
    stats = torch_pjrt.compile_stats()
    assert stats["dynamo_graphs"] == 1 and stats["graphs"] == 2  # no graph break: forward + backward graphs
    assert eager_losses[-1] < eager_losses[0]
    torch.testing.assert_close(compiled_losses, eager_losses, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach().cpu(), atol=1e-5, rtol=1e-5, msg=name)
    cpu_losses = _train(base, base, tokens, targets)  # and both equal torch's own CPU kernels
    torch.testing.assert_close(eager_losses, cpu_losses, atol=1e-4, rtol=1e-4)


def test_compiled_aten_grouped_mm_equals_eager():
    a, b = torch.randn(48, 16, dtype=torch.bfloat16), torch.randn(3, 16, 32, dtype=torch.bfloat16)
    offs = torch.tensor([5, 30, 48], dtype=torch.int32)

    def f(a, b, offs):
        return torch._grouped_mm(a, b, offs).float().square().sum()

    pa, pb = a.to("pjrt").requires_grad_(), b.to("pjrt").requires_grad_()
    loss = torch.compile(f, backend="pjrt")(pa, pb, offs.to("pjrt"))
    loss.backward()
    assert torch_pjrt.compile_stats()["graphs"] == 2
    ea, eb = a.to("pjrt").requires_grad_(), b.to("pjrt").requires_grad_()
    want = f(ea, eb, offs.to("pjrt"))
    want.backward()
    torch.testing.assert_close(loss.detach().cpu(), want.detach().cpu(), atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(pa.grad.cpu(), ea.grad.cpu(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(pb.grad.cpu(), eb.grad.cpu(), atol=1e-2, rtol=1e-2)


def test_tutorial_in_docs_runs():
    """docs/kernels.md's tutorial (write the kernel, then its test) runs as written."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[1] / "docs" / "kernels.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    namespace: dict = {}
    exec(compile(blocks[0] + "\n" + blocks[1], "docs/kernels.md", "exec"), namespace)  # noqa: S102
    namespace["test_swiglu"]()
    gate, up = torch.randn(64, 16, device="pjrt"), torch.randn(64, 16, device="pjrt")
    torch.testing.assert_close(namespace["swiglu"](gate, up).cpu(), (F.silu(gate) * up).cpu())


def test_supports_predicate_routes_unsuitable_shapes_to_the_reference():
    @kernels.kernel("test_kernels::even_rows_only", reference=lambda x: x * 3,
                    supports=lambda platform, x: x.shape[0] % 2 == 0)
    def even_rows_only(x: torch.Tensor) -> torch.Tensor:
        TRACED.append(("kernel", x.shape[0]))
        return x * 3

    for rows in (4, 5):
        x = torch.randn(rows, 2, device="pjrt", requires_grad=True)
        even_rows_only(x).sum().backward()
        torch.testing.assert_close(x.grad.cpu(), torch.full((rows, 2), 3.0))
    assert TRACED == [("kernel", 4)]  # 5 rows: the reference ran
    assert kernels.rms_norm.supports("gpu", jax.ShapeDtypeStruct((3, 48), "float32"), None) is False
    assert kernels.rms_norm.supports("gpu", jax.ShapeDtypeStruct((3, 64), "float32"), None) is True


def test_kernel_runs_on_the_inputs_device():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    out = scaled_mul(x.to("pjrt:1"), y.to("pjrt:1"), 2.0)
    assert out.device == torch.device("pjrt:1")
    torch.testing.assert_close(out.cpu(), x * y * 2.0)
    with pytest.raises(RuntimeError, match=r"pjrt:1 and pjrt:0"):
        scaled_mul(x.to("pjrt:1"), y.to("pjrt:0"), 2.0)
