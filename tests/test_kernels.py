"""Shipped kernels (Pallas in interpret mode on the CPU platform) against their references.

`kernels.check` compares each kernel with its pure-JAX reference forward and backward and
runs torch.library.opcheck; the SDPA and _grouped_mm hookups are compared with torch's own
CPU implementations. Shapes are small (interpret mode is slow); ragged sizes are chosen so
that no dimension is a whole number of blocks.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_pjrt import kernels
from torch_pjrt.kernels.cross_entropy import softmax_cross_entropy_kernel
from torch_pjrt.kernels.attention import flash_attention_kernel

torch.manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


# ---------------------------------------------------------------------------------- RMSNorm
def test_rms_norm_equals_reference_on_ragged_shapes():
    kernels.check(kernels.rms_norm, [
        (randn(3, 5, 40), randn(40), 1e-5),  # 15 rows: not a whole block
        (randn(130, 64, dtype=torch.float64), randn(64, dtype=torch.float64), 1e-6),  # 130 rows: 3 blocks of 64, padded
    ], opcheck=False)


def test_rms_norm_bfloat16_and_opcheck():
    kernels.check(kernels.rms_norm, [(randn(9, 32, dtype=torch.bfloat16), randn(32, dtype=torch.bfloat16), 1e-6)])


def test_rms_norm_matches_torch():
    x, w = randn(4, 7, 48, dtype=torch.float64), randn(48, dtype=torch.float64)
    got = kernels.rms_norm(x.to("pjrt"), w.to("pjrt"), 1e-5).cpu()
    torch.testing.assert_close(got, F.rms_norm(x, (48,), w, 1e-5))


# ---------------------------------------------------------------------------------- flash attention
def test_flash_attention_gqa_ragged_equals_reference():
    # GQA 4:2, L != S, Dv != D, neither length a whole block
    sample = (randn(2, 4, 33, 16), randn(2, 2, 47, 16), randn(2, 2, 47, 8), False)
    kernels.check(flash_attention_kernel, [sample], opcheck=False, atol=2e-5, rtol=2e-5)


def test_flash_attention_causal_multiblock_and_opcheck():
    # 70 queries / 130 keys with 64-wide blocks: several blocks per axis, so the causal loop bounds matter
    q, k, v = randn(1, 4, 70, 16, dtype=torch.float64), randn(1, 1, 130, 16, dtype=torch.float64), \
        randn(1, 1, 130, 16, dtype=torch.float64)
    kernels.check(flash_attention_kernel, [(q, k, v, True, 0.3)])


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 2, 20, 20, 16), (2, 8, 2, 100, 64, 32), (1, 4, 4, 129, 257, 64)])
def test_flash_attention_sweep(causal, shape):
    b, hq, hk, l, s, d = shape
    kernels.check(flash_attention_kernel, [(randn(b, hq, l, d), randn(b, hk, s, d), randn(b, hk, s, d), causal)],
                  opcheck=False, atol=5e-5, rtol=5e-5)


def test_flash_attention_matches_torch_sdpa():
    q, k, v = randn(2, 4, 24, 16), randn(2, 2, 24, 16), randn(2, 2, 24, 16)
    got = kernels.flash_attention(q.to("pjrt"), k.to("pjrt"), v.to("pjrt"), True).cpu()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)


# ---------------------------------------------------------------------------------- cross-entropy
def test_softmax_cross_entropy_equals_reference():
    t = torch.randint(0, 300, (70,))
    t[3] = -100  # ignored row
    kernels.check(softmax_cross_entropy_kernel, [(randn(70, 300), t, -100)], opcheck=False)
    t2 = torch.randint(0, 10, (5,))
    kernels.check(softmax_cross_entropy_kernel, [(randn(5, 10, dtype=torch.float64), t2, -100)])


def test_softmax_cross_entropy_matches_torch():
    x, t = randn(33, 3000, dtype=torch.float64), torch.randint(0, 3000, (33,))  # vocabulary: 2 chunks, padded
    t[0] = 7
    t[1] = -1
    for reduction in ("mean", "sum", "none"):
        px = x.to("pjrt").requires_grad_()
        got = kernels.softmax_cross_entropy(px, t.to("pjrt"), ignore_index=-1, reduction=reduction)
        xc = x.clone().requires_grad_()
        want = F.cross_entropy(xc, t, ignore_index=-1, reduction=reduction)
        torch.testing.assert_close(got.detach().cpu(), want.detach())
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(px.grad.cpu(), xc.grad)


# ---------------------------------------------------------------------------------- grouped matmul
def _torch_grouped(a, b, offs):
    starts = [0] + offs[:-1]
    rows = [a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, offs))]
    rows.append(torch.zeros(a.shape[0] - offs[-1], b.shape[-1], dtype=a.dtype))  # rows of no group: zeros
    return torch.cat(rows)


def test_grouped_mm_equals_reference_with_ragged_and_empty_groups():
    offs = torch.tensor([10, 10, 40, 66], dtype=torch.int32)  # group 1 empty; rows 66..69 in no group
    kernels.check(kernels.grouped_mm, [(randn(70, 16), randn(4, 16, 24), offs)], opcheck=False)
    kernels.check(kernels.grouped_mm, [(randn(9, 8, dtype=torch.float64), randn(3, 8, 8, dtype=torch.float64),
                                        torch.tensor([0, 3, 9], dtype=torch.int32))])


def test_grouped_mm_matches_loop():
    a, b, offs = randn(70, 16, dtype=torch.float64), randn(4, 16, 24, dtype=torch.float64), [10, 10, 40, 66]
    got = kernels.grouped_mm(a.to("pjrt"), b.to("pjrt"), torch.tensor(offs, dtype=torch.int32).to("pjrt"))
    torch.testing.assert_close(got.cpu(), _torch_grouped(a, b, offs))


def test_aten_grouped_mm_on_pjrt_uses_the_kernel_and_matches_cpu():
    a, b = randn(64, 16, dtype=torch.bfloat16), randn(4, 16, 32, dtype=torch.bfloat16)
    offs = torch.tensor([8, 24, 24, 64], dtype=torch.int32)
    g = randn(64, 32, dtype=torch.bfloat16)
    pa, pb = a.to("pjrt").requires_grad_(), b.to("pjrt").requires_grad_()
    got = torch._grouped_mm(pa, pb, offs.to("pjrt"))
    got.backward(g.to("pjrt"))  # torch's formula: _grouped_mm again, in the 2-D x 3-D and 2-D x 2-D layouts
    ca, cb = a.clone().requires_grad_(), b.clone().requires_grad_()
    want = torch._grouped_mm(ca, cb, offs)
    want.backward(g)
    assert "_grouped_mm" not in str(__import__("torch_pjrt").fallback_ops())
    torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(pa.grad.cpu(), ca.grad, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(pb.grad.cpu(), cb.grad, atol=1e-2, rtol=1e-2)


def test_aten_grouped_mm_batched_layout():
    a, b = randn(3, 8, 16), randn(3, 16, 8)
    torch.testing.assert_close(torch._grouped_mm(a.to("pjrt"), b.to("pjrt")).cpu(), torch.bmm(a, b), atol=1e-5,
                               rtol=1e-5)


# ---------------------------------------------------------------------------------- SDPA on pjrt
def _sdpa_inputs(hk=2, dtype=torch.float32):
    return randn(2, 4, 20, 16, dtype=dtype), randn(2, hk, 24, 16, dtype=dtype), randn(2, hk, 24, 16, dtype=dtype)


@pytest.fixture
def flash_on_cpu(monkeypatch):
    """The kernel serves SDPA on the CPU platform only when asked (there Pallas is interpreted)."""
    monkeypatch.setenv("TORCH_PJRT_FLASH_SDPA", "1")


def test_sdpa_on_the_cpu_platform_is_one_op_without_the_flash_kernel(monkeypatch):
    """By default the CPU platform runs SDPA as one op written out in XLA (the flash kernel's
    Pallas would be interpreted there); forward and backward equal torch's math path."""
    from torch_pjrt.kernels import sdpa

    monkeypatch.delenv("TORCH_PJRT_FLASH_SDPA", raising=False)
    q, k, v = _sdpa_inputs()
    assert not sdpa.suits_flash(q, k, v, None, 0.0)
    pq, pk, pv = (t.to("pjrt").requires_grad_() for t in (q, k, v))
    got = F.scaled_dot_product_attention(pq, pk, pv, enable_gqa=True)
    assert type(got.grad_fn).__name__ == "ScaledDotProductFusedAttentionOverrideableBackward0"
    cq, ck, cv = (t.clone().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(cq, ck, cv, enable_gqa=True)
    torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=2e-6, rtol=2e-5)
    g = randn(*want.shape)
    got.backward(g.to("pjrt"))
    want.backward(g)
    for p, c in ((pq, cq), (pk, ck), (pv, cv)):
        torch.testing.assert_close(p.grad.cpu(), c.grad, atol=1e-5, rtol=1e-5)


def _bool_mask_with_a_fully_masked_row():
    mask = torch.rand(20, 24, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[5] = False  # torch's _safe_softmax: a query that sees no key gets zeros, and zero gradients
    return mask


@pytest.mark.parametrize("backend", ["overrideable", "efficient"])
@pytest.mark.parametrize("case", ["bool_mask", "float_mask_with_grad", "causal_float64", "scale", "three_dims",
                                  "bfloat16"])
def test_sdpa_one_op_matches_torch_math(case, backend, monkeypatch):
    """Masks (bool, float, with its own gradient), causal, float64, scale, 3-D and bfloat16
    through the one-op attention, forward and backward against CPU torch; "efficient": the
    efficient-attention op (sdpa_kernel(EFFICIENT_ATTENTION), and context parallel's ring
    attention), whose backward works from the given output and logsumexp."""
    monkeypatch.delenv("TORCH_PJRT_FLASH_SDPA", raising=False)
    q, k, v = _sdpa_inputs(hk=4)
    kwargs, tol = {}, dict(atol=2e-6, rtol=2e-5)
    if case == "bool_mask":
        kwargs["attn_mask"] = _bool_mask_with_a_fully_masked_row()
    elif case == "float_mask_with_grad":
        kwargs["attn_mask"] = randn(2, 1, 20, 24).requires_grad_()
    elif case == "causal_float64":
        q, k, v = (t.double() for t in (q, k, v))
        kwargs["is_causal"] = True
        # the efficient-attention op's logsumexp is float32 (its schema), and its backward starts from it
        tol = dict(atol=1e-12, rtol=1e-12) if backend == "overrideable" else dict(atol=1e-7, rtol=1e-7)
    elif case == "scale":
        kwargs["scale"] = 0.3
    elif case == "three_dims":
        q, k, v = q[0], k[0], v[0]
    else:
        q, k, v = (t.bfloat16() for t in (q, k, v))
        tol = dict(atol=1e-2, rtol=1.6e-2)
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    dev = [t.detach().to("pjrt").requires_grad_() for t in (q, k, v)]
    mask = kwargs.get("attn_mask")
    dev_kwargs = dict(kwargs)
    if mask is not None:
        dev_kwargs["attn_mask"] = mask.detach().to("pjrt").requires_grad_(mask.requires_grad)
    if backend == "efficient":
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            got = F.scaled_dot_product_attention(*dev, **dev_kwargs)
        assert type(got.grad_fn).__name__ == "ScaledDotProductEfficientAttentionBackward0"
    else:
        got = F.scaled_dot_product_attention(*dev, **dev_kwargs)
        assert type(got.grad_fn).__name__ == "ScaledDotProductFusedAttentionOverrideableBackward0"
    want = F.scaled_dot_product_attention(*cpu, **kwargs)
    torch.testing.assert_close(got.detach().cpu(), want.detach(), **tol)
    g = randn(*want.shape, dtype=want.dtype)
    got.backward(g.to("pjrt"))
    want.backward(g)
    for p, c in zip(dev, cpu):
        torch.testing.assert_close(p.grad.cpu(), c.grad, **{k_: 10 * v_ for k_, v_ in tol.items()})
    if mask is not None and mask.requires_grad:
        torch.testing.assert_close(dev_kwargs["attn_mask"].grad.cpu(), mask.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_on_pjrt_uses_flash_attention(causal, flash_on_cpu):
    q, k, v = _sdpa_inputs()
    pq, pk, pv = (t.to("pjrt").requires_grad_() for t in (q, k, v))
    got = F.scaled_dot_product_attention(pq, pk, pv, is_causal=causal, enable_gqa=True)
    assert type(got.grad_fn).__name__ == "ScaledDotProductFusedAttentionOverrideableBackward0"
    cq, ck, cv = (t.clone().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(cq, ck, cv, is_causal=causal, enable_gqa=True)
    g = randn(*want.shape)
    got.backward(g.to("pjrt"))
    want.backward(g)
    torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=2e-6, rtol=2e-5)
    for p, c in ((pq, cq), (pk, ck), (pv, cv)):
        torch.testing.assert_close(p.grad.cpu(), c.grad, atol=1e-5, rtol=1e-5)


def test_sdpa_with_dropout_a_causal_mask_or_the_math_backend_takes_the_math_path():
    q, k, v = _sdpa_inputs(hk=4)
    p = tuple(t.to("pjrt").requires_grad_() for t in (q, k, v))
    got = F.scaled_dot_product_attention(*p, dropout_p=0.5)  # random draws: torch's decomposition
    assert "Overrideable" not in type(got.grad_fn).__name__
    with sdpa_kernel(SDPBackend.MATH):  # the user's choice of backend is honoured, as on CUDA
        got = F.scaled_dot_product_attention(*p)
    assert "Overrideable" not in type(got.grad_fn).__name__
    torch.testing.assert_close(got.detach().cpu(), F.scaled_dot_product_attention(q, k, v), atol=2e-6, rtol=2e-5)


def test_sdpa_with_a_mask_and_is_causal_applies_both_as_cpu_torch_does():
    q, k, v = _sdpa_inputs(hk=4)
    mask = _bool_mask_with_a_fully_masked_row()
    got = F.scaled_dot_product_attention(q.to("pjrt"), k.to("pjrt"), v.to("pjrt"), attn_mask=mask.to("pjrt"),
                                         is_causal=True)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    torch.testing.assert_close(got.cpu(), want, atol=2e-6, rtol=2e-5)


def test_sdpa_mismatched_heads_without_gqa_raises_torchs_error():
    q, k, v = _sdpa_inputs(hk=2)
    with pytest.raises(RuntimeError) as pjrt_error:
        F.scaled_dot_product_attention(q.to("pjrt"), k.to("pjrt"), v.to("pjrt"))
    with pytest.raises(RuntimeError) as cpu_error:
        F.scaled_dot_product_attention(q, k, v)
    assert str(pjrt_error.value).split("!")[0] == str(cpu_error.value).split("!")[0]


def test_compiled_sdpa_inlines_flash_attention(tmp_path, flash_on_cpu):
    import torch_pjrt

    torch._dynamo.reset()
    torch_pjrt.compiler.reset_compile_stats()
    q, k, v = _sdpa_inputs()

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sin().sum()

    pq, pk, pv = (t.to("pjrt").requires_grad_() for t in (q, k, v))
    loss = torch.compile(f, backend="pjrt", options={"dump_dir": str(tmp_path)})(pq, pk, pv)
    loss.backward()
    fx = {p.name: p.read_text() for p in tmp_path.glob("*.fx.txt")}
    assert len(fx) == 2 and all("_scaled_dot_product_fused_attention_overrideable" in t for t in fx.values()), fx.keys()
    assert torch_pjrt.compile_stats()["executables"] == 2  # forward and backward, the kernel inside each
    cq, ck, cv = (t.clone().requires_grad_() for t in (q, k, v))
    want = f(cq, ck, cv)
    want.backward()
    torch.testing.assert_close(loss.detach().cpu(), want.detach(), atol=1e-5, rtol=1e-5)
    for p, c in ((pq, cq), (pk, ck), (pv, cv)):
        torch.testing.assert_close(p.grad.cpu(), c.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(1, 8), (257, 96), (3, 100, 128), (1000, 512)])
def test_rms_norm_sweep(shape):
    kernels.check(kernels.rms_norm, [(randn(*shape), randn(shape[-1]), 1e-5)], opcheck=False)


@pytest.mark.slow
@pytest.mark.parametrize("rows,vocab", [(1, 2), (31, 129), (300, 5000), (64, 16384)])
def test_softmax_cross_entropy_sweep(rows, vocab):
    t = torch.randint(0, vocab, (rows,))
    t[0] = -100
    kernels.check(softmax_cross_entropy_kernel, [(randn(rows, vocab), t, -100)], opcheck=False)


@pytest.mark.slow
@pytest.mark.parametrize("offs", [[0, 0, 300], [1, 2, 3, 200], [64, 128, 192, 256], [17, 100, 250]])
def test_grouped_mm_sweep(offs):
    m = 300 if offs[-1] <= 300 else offs[-1]
    kernels.check(kernels.grouped_mm, [(randn(m, 32), randn(len(offs), 32, 48), torch.tensor(offs, dtype=torch.int32))],
                  opcheck=False, atol=1e-4, rtol=1e-4)


def test_dtype_errors_name_the_kernel_and_dtypes():
    q = torch.randn(1, 2, 8, 16, device="pjrt")
    with pytest.raises(ValueError, match="flash_attention: query, key and value must have one dtype, got float32, "
                                         "bfloat16 and float32"):
        kernels.flash_attention(q, q.bfloat16(), q)
    a, b = torch.randn(8, 16, device="pjrt"), torch.randn(2, 16, 16, device="pjrt", dtype=torch.float64)
    with pytest.raises(ValueError, match="grouped_mm: both operands must have one dtype, got float32 and float64"):
        kernels.grouped_mm(a, b, torch.tensor([4, 8], dtype=torch.int32, device="pjrt"))


def test_eager_sdpa_int_returns_follow_each_calls_shapes():
    """SDPA's int returns (max_q, max_k) come from torch's meta kernel, cached by the arguments'
    geometry: a call of other shapes gets its own, and the same shapes again the same."""
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    ints = [i for i, r in enumerate(op._schema.returns) if str(r.type) in ("int", "SymInt")]
    assert len(ints) == 2
    g = torch.Generator().manual_seed(0)
    for lq, lk in ((1, 40), (3, 40), (1, 41), (1, 40)):
        q, k = torch.randn(1, 2, lq, 8, generator=g), torch.randn(1, 2, lk, 8, generator=g)
        got = op(q.to("pjrt"), k.to("pjrt"), k.to("pjrt"))
        want = op(q.to("meta"), k.to("meta"), k.to("meta"))
        assert [got[i] for i in ints] == [want[i] for i in ints] == [lq, lk]
        torch.testing.assert_close(got[0].cpu(), F.scaled_dot_product_attention(q, k, k))
