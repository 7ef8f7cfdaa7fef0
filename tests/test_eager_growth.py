"""Tensors that grow along one axis (a KV cache, token by token) compile once per capacity.

Eager pads a storage that `cat` keeps appending to (runtime/storage.py `Padded`); cat and
SDPA run over the padded array with the length traced (ops/growth.py), views of it read the
padded array directly, and every other op reads the exact value. These tests count
executables (torch_pjrt.eager_stats) and compare every value with CPU torch.
"""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt.runtime import storage


def _executables(op: str) -> int:
    return torch_pjrt.eager_stats()["by_op"].get(op, 0)


def _grow(steps: int, shape=(2, 3, 5, 4), dim=-2, seed=0):
    """(pjrt, cpu) after `steps` appends of one slice along `dim`."""
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(shape, generator=g)
    dev = ref.to("pjrt")
    piece_shape = list(shape)
    piece_shape[dim] = 1
    for _ in range(steps):
        piece = torch.randn(piece_shape, generator=g)
        ref = torch.cat([ref, piece], dim=dim)
        dev = torch.cat([dev, piece.to("pjrt")], dim=dim)
    return dev, ref


def test_a_growing_cat_compiles_once_per_capacity_and_equals_cpu():
    torch_pjrt.reset_eager_stats()
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(2, 3, 5, 4, generator=g)
    dev = ref.to("pjrt")
    for step in range(100):
        piece = torch.randn(2, 3, 1, 4, generator=g)
        ref = torch.cat([ref, piece], dim=-2)
        dev = torch.cat([dev, piece.to("pjrt")], dim=-2)
        assert dev.shape == ref.shape and dev.is_contiguous() and dev.stride() == ref.stride()
        if step % 9 == 0:
            assert torch.equal(dev.cpu(), ref)  # a host read of a padded storage: no executable
    assert torch.equal(dev.cpu(), ref)
    assert isinstance(storage.whole_buffer(dev), storage.Padded)
    # exact for the first two lengths, then one per capacity (16, 32, 64, 128)
    assert _executables("aten.cat.default") <= 7, torch_pjrt.eager_stats()["by_op"]


def test_appends_onto_a_padded_cache_are_recorded_in_cpp():
    """Fused eager: an append that fits its cache's capacity is the C++ kernel's (recorded with
    the length traced, the result a padded storage of the exact length); the first padding and
    each capacity crossing (16, 32, 64) are the Python kernel's. Appends that are not a cache's
    (the padded tensor appended along another dim, two padded operands, a padded piece) go to
    the Python kernel too. Every value equals the CPU's."""
    if torch_pjrt.eager_mode() != "fused":
        pytest.skip("the C++ recorder serves fused eager; op by op every growing call is the Python kernel's")
    g = torch.Generator().manual_seed(2)
    ref = torch.randn(1, 2, 3, 4, generator=g)
    dev = ref.to("pjrt")
    torch_pjrt.reset_eager_stats()
    for step in range(60):
        piece = torch.randn(1, 2, 1, 4, generator=g, dtype=torch.float64 if step == 30 else torch.float32)
        ref = torch.cat([ref, piece], dim=2)
        dev = torch.cat([dev, piece.to("pjrt")], dim=2)
        assert dev.shape == ref.shape and dev.dtype == ref.dtype and dev.stride() == ref.stride()
    counts = torch_pjrt.eager_stats()["paths"]["aten::cat"]
    # the first append (exact), the first padding, 16 -> 32, 32 -> 64; step 30's float64 piece and
    # step 31's float32 piece onto the float64 cache are the first cats of their dtype pairs, which
    # CPU's own call judges once per process (errors.MixedDtypesRefused: the Python kernel's, its
    # result exact, so the cache is padded once more two steps later). Independent of what the
    # executable store holds (CI's is empty).
    assert counts["python_kernel"] <= 6 and counts["cpp_recorder"] >= 54, counts
    assert isinstance(storage.whole_buffer(dev), storage.Padded)
    torch.testing.assert_close(dev.cpu(), ref, rtol=0, atol=0)
    other = torch.randn(1, 2, ref.shape[2], 1, generator=g, dtype=torch.float64)
    for join in (lambda a, o: torch.cat([a, o], dim=3), lambda a, o: torch.cat([a, a], dim=2),
                 lambda a, o: torch.cat([a[:, :, :2], a], dim=2)):
        torch.testing.assert_close(join(dev, other.to("pjrt")).cpu(), join(ref, other), rtol=0, atol=0)


def test_attention_over_a_padded_cache_is_recorded_in_cpp_with_its_int_returns():
    """Fused eager: SDPA over padded keys and values (an exact result) is the C++ kernel's; its int
    returns (max_q, max_k) are the call's, max_k the keys' exact length every token, as the meta
    kernel gives them at exact sizes. Outputs equal the CPU's."""
    if torch_pjrt.eager_mode() != "fused":
        pytest.skip("the C++ recorder serves fused eager; op by op every growing call is the Python kernel's")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 1, 8, generator=g)
    keys, values = torch.randn(1, 2, 2, 8, generator=g), torch.randn(1, 2, 2, 8, generator=g)
    pk, pv, pq = keys.to("pjrt"), values.to("pjrt"), q.to("pjrt")
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
    torch_pjrt.reset_eager_stats()
    for _ in range(24):
        new_k, new_v = torch.randn(1, 2, 1, 8, generator=g), torch.randn(1, 2, 1, 8, generator=g)
        keys, values = torch.cat([keys, new_k], dim=2), torch.cat([values, new_v], dim=2)
        pk, pv = torch.cat([pk, new_k.to("pjrt")], dim=2), torch.cat([pv, new_v.to("pjrt")], dim=2)
        got = op(pq, pk, pv)
        meta = op(*(t.to("meta") for t in (q, keys, values)))
        assert (got[4], got[5]) == (meta[4], meta[5]) == (1, keys.shape[2])
        torch.testing.assert_close(got[0].cpu(), F.scaled_dot_product_attention(q, keys, values))
    counts = torch_pjrt.eager_stats()["paths"]["aten::_scaled_dot_product_fused_attention_overrideable"]
    assert counts["cpp_recorder"] >= 20, counts


def test_views_of_a_growing_tensor_read_the_padded_array():
    dev, ref = _grow(6)
    torch_pjrt.reset_eager_stats()
    for _ in range(30):
        piece = torch.randn(2, 3, 1, 4)
        ref, dev = torch.cat([ref, piece], -2), torch.cat([dev, piece.to("pjrt")], -2)
        for view in (lambda t: t[:, :, -1:], lambda t: t[:, 1, -1], lambda t: t[:, :, -2].transpose(0, 1),
                     lambda t: t[:, :, 2:5:2]):
            assert torch.equal((view(dev) * 2).cpu(), view(ref) * 2)
    # lengths 12..41: capacities 16, 32 and 64, one executable per view kind and capacity
    assert _executables("aten.mul.Tensor") <= 4 * 3, torch_pjrt.eager_stats()["by_op"]


def test_other_ops_read_the_exact_value():
    dev, ref = _grow(7)
    assert isinstance(storage.whole_buffer(dev), storage.Padded)
    torch.testing.assert_close(dev.sum(-2).cpu(), ref.sum(-2))
    torch.testing.assert_close(dev.softmax(-2).cpu(), ref.softmax(-2))
    torch.testing.assert_close((dev @ dev.transpose(-1, -2)).cpu(), ref @ ref.transpose(-1, -2))
    torch.testing.assert_close(dev.flatten().cpu(), ref.flatten())
    assert torch.equal(dev.clone().cpu(), ref)
    assert torch.equal(dev.to(torch.float64).cpu(), ref.double())
    assert repr(dev.cpu()) == repr(ref) and str(dev).split("device")[0].rstrip(", \n") in str(ref)


def test_writes_into_a_growing_tensor():
    dev, ref = _grow(7)
    alias = dev.clone()  # shares the padded buffer until one of them is written
    for t in (dev, ref):
        t[:, :, 0] = 5.0  # a write through a view
        t.mul_(2)  # a whole write
    assert torch.equal(dev.cpu(), ref)
    assert not torch.equal(alias.cpu(), ref)
    piece = torch.randn(2, 3, 1, 4)
    assert torch.equal(torch.cat([dev, piece.to("pjrt")], -2).cpu(), torch.cat([ref, piece], -2))
    dev2, ref2 = _grow(7, seed=3)
    kept = ref2.numel()
    for t in (dev2, ref2):
        t.resize_(2, 3, 20, 4)  # the storage grows past its padded value; its elements stay
    assert torch.equal(dev2.view(-1)[:kept].cpu(), ref2.view(-1)[:kept])


def test_cat_with_out_promotion_and_other_dims():
    dev, ref = _grow(4, shape=(3, 6), dim=-1)
    out = torch.empty(3, 11, device="pjrt")
    torch.cat([dev, torch.ones(1, 1, device="pjrt").expand(3, 1)], dim=1, out=out)
    assert torch.equal(out.cpu(), torch.cat([ref, torch.ones(3, 1)], dim=1))
    ints, ints_ref = torch.arange(4, dtype=torch.int32).to("pjrt"), torch.arange(4, dtype=torch.int32)
    for i in range(20):
        piece = torch.tensor([i], dtype=torch.int64)
        ints, ints_ref = torch.cat([ints, piece.to("pjrt")]), torch.cat([ints_ref, piece])
        assert ints.dtype == ints_ref.dtype
    assert torch.equal(ints.cpu(), ints_ref)
    rows, rows_ref = _grow(20, shape=(2, 4), dim=0)  # growing along the outermost dim
    assert torch.equal(rows.cpu(), rows_ref)


def test_autograd_through_a_growing_cat():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(4, generator=g)
    w_dev = w.to("pjrt").requires_grad_()
    w_ref = w.clone().requires_grad_()
    dev, ref = torch.zeros(1, 4, device="pjrt"), torch.zeros(1, 4)
    for i in range(12):
        dev, ref = torch.cat([dev, (w_dev * i)[None]]), torch.cat([ref, (w_ref * i)[None]])
    (dev.sin().sum()).backward()
    (ref.sin().sum()).backward()
    torch.testing.assert_close(w_dev.grad.cpu(), w_ref.grad)


def test_save_and_compile_read_a_growing_tensor():
    dev, ref = _grow(9)
    buffer = io.BytesIO()
    torch.save(dev, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer).cpu(), ref)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: (t * 3).sum(-2), backend="pjrt")
    torch.testing.assert_close(fn(dev).cpu(), (ref * 3).sum(-2))


def test_attention_over_a_growing_cache_compiles_once_per_capacity():
    g = torch.Generator().manual_seed(4)
    k_ref, v_ref = torch.randn(1, 2, 6, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g)
    k_dev, v_dev = k_ref.to("pjrt"), v_ref.to("pjrt")
    sdpa = "aten._scaled_dot_product_fused_attention_overrideable.default"
    torch_pjrt.reset_eager_stats()
    for _ in range(40):
        q = torch.randn(1, 4, 1, 16, generator=g)
        nk, nv = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 1, 16, generator=g)
        k_ref, v_ref = torch.cat([k_ref, nk], -2), torch.cat([v_ref, nv], -2)
        k_dev, v_dev = torch.cat([k_dev, nk.to("pjrt")], -2), torch.cat([v_dev, nv.to("pjrt")], -2)
        got = F.scaled_dot_product_attention(q.to("pjrt"), k_dev, v_dev, enable_gqa=True)
        want = F.scaled_dot_product_attention(q, k_ref, v_ref, enable_gqa=True)
        torch.testing.assert_close(got.cpu(), want, atol=2e-6, rtol=2e-5)
    assert _executables(sdpa) <= 5, torch_pjrt.eager_stats()["by_op"]  # two exact lengths, capacities 16, 32, 64


@pytest.mark.parametrize("model", [None, "hf:gpt2"], ids=["llama", "gpt2"])
def test_generate_builds_a_bounded_number_of_executables(model):
    """HF generate() with its default dynamic cache: greedy tokens equal CPU torch; the
    executables of 64 new tokens are a few per capacity, not one set per token."""
    pytest.importorskip("transformers")
    from torch_pjrt.tools import bench_llm

    lm = bench_llm.causal_lm(model, 128)
    torch.manual_seed(0)
    cpu = lm.build().eval()
    dev = lm.build().to("pjrt").eval()
    prompt = torch.randint(0, 500, (1, 12), generator=torch.Generator().manual_seed(5))
    kwargs = dict(do_sample=False, pad_token_id=0)
    dev.generate(prompt.to("pjrt"), max_new_tokens=3, min_new_tokens=3, **kwargs)  # the prompt's shapes
    torch_pjrt.reset_eager_stats()
    got = dev.generate(prompt.to("pjrt"), max_new_tokens=64, min_new_tokens=64, **kwargs).cpu()
    built = torch_pjrt.eager_stats()["executables"]
    want = cpu.generate(prompt, max_new_tokens=64, min_new_tokens=64, **kwargs)
    assert torch.equal(got, want)
    assert built <= 40, torch_pjrt.eager_stats()["by_op"]  # 63 new lengths; at exact sizes several per length
    torch_pjrt.reset_eager_stats()
    dev.generate(prompt.to("pjrt"), max_new_tokens=64, min_new_tokens=64, **kwargs)
    assert torch_pjrt.eager_stats()["executables"] == 0


def _random_view(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """One of the views user code takes: slices with steps, select, transpose, expand,
    unsqueeze, diagonal, unfold, flatten of leading dims, as_strided inside the tensor."""
    def r(n):
        return int(torch.randint(n, (), generator=g))

    kind = r(9)
    if kind == 0:
        d = r(t.dim())
        n = t.shape[d]
        start = r(n)
        return t.narrow(d, start, 1 + r(n - start))
    if kind == 1:
        d = r(t.dim())
        return t.select(d, r(t.shape[d]) - t.shape[d])  # negative indices too
    if kind == 2:
        return t.transpose(r(t.dim()), r(t.dim()))
    if kind == 3:
        return t[:, :, ::2] if t.dim() >= 3 else t[::2]
    if kind == 4:
        return t.unsqueeze(0).expand(2, *t.shape)
    if kind == 5:
        return t.diagonal(0, -2, -1) if t.dim() >= 2 else t
    if kind == 6:
        d = t.dim() - 2
        return t.unfold(d, 2, 1) if t.shape[d] >= 2 else t
    if kind == 7:
        return t.flatten(0, 1) if t.dim() >= 3 else t
    size = [1 + r(n) for n in t.shape]
    offset = sum(r(n - s + 1) * st for n, s, st in zip(t.shape, size, t.stride()))
    return t.as_strided(size, t.stride(), t.storage_offset() + offset)


def test_any_view_of_a_growing_tensor_reads_the_same_values_as_cpu():
    """Views whose geometry carries over to the padded array, and ones that fall back to the
    exact value, read what CPU torch reads (composed views, random choices, fixed seed)."""
    g = torch.Generator().manual_seed(7)
    for case in range(8):
        dim = (-2, -1, 0, 1)[case % 4]
        dev, ref = _grow(5 + case, shape=(2, 3, 6, 4), dim=dim, seed=case)
        assert isinstance(storage.whole_buffer(dev), storage.Padded)
        for _ in range(12):
            views = [(dev, ref)]
            for _ in range(1 + int(torch.randint(3, (), generator=g))):
                state = g.get_state()
                dv = _random_view(views[-1][0], g)
                g.set_state(state)
                rv = _random_view(views[-1][1], g)
                views.append((dv, rv))
            dv, rv = views[-1]
            assert dv.shape == rv.shape and dv.stride() == rv.stride()
            assert torch.equal((dv + 0).cpu(), rv + 0), (case, dv.shape, dv.stride(), dv.storage_offset())
            assert torch.equal(dv.cpu(), rv)


def test_attention_with_a_mask_over_a_growing_cache_runs_at_exact_sizes():
    """A mask has the keys' exact length: with one, SDPA reads the cache's exact value."""
    dev_k, ref_k = _grow(12, shape=(2, 2, 4, 16))
    q = torch.randn(2, 2, 3, 16)
    mask = torch.randn(2, 1, 1, ref_k.shape[-2])
    got = F.scaled_dot_product_attention(q.to("pjrt"), dev_k, dev_k, attn_mask=mask.to("pjrt"))
    torch.testing.assert_close(got.cpu(), F.scaled_dot_product_attention(q, ref_k, ref_k, attn_mask=mask),
                               atol=2e-6, rtol=2e-5)


def test_batched_generate_with_padding_equals_cpu():
    """Left-padded prompts pass a mask to attention (transformers packs the query's GQA groups
    for one token): tokens equal CPU torch's. The mask ops still compile per length."""
    pytest.importorskip("transformers")
    from torch_pjrt.tools import bench_llm

    lm = bench_llm.causal_lm(None, 128)
    cpu, dev = lm.build().eval(), lm.build().to("pjrt").eval()
    ids = torch.randint(1, 500, (2, 10), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 10, dtype=torch.long)
    ids[1, :3], mask[1, :3] = 0, 0
    kw = dict(do_sample=False, pad_token_id=0, max_new_tokens=12, min_new_tokens=12)
    got = dev.generate(ids.to("pjrt"), attention_mask=mask.to("pjrt"), **kw).cpu()
    assert torch.equal(got, cpu.generate(ids, attention_mask=mask, **kw))


def test_sliding_window_generate_equals_cpu():
    """Mistral's sliding-window cache keeps the last `sliding_window` positions of a growing
    cache (views of it): tokens equal CPU torch's."""
    transformers = pytest.importorskip("transformers")
    from torch_pjrt.tools.bench_llm import TINY_LLAMA

    config = transformers.MistralConfig(**TINY_LLAMA, sliding_window=8, max_position_embeddings=256)
    torch.manual_seed(0)
    cpu = transformers.MistralForCausalLM(config).eval()
    dev = transformers.MistralForCausalLM(config).eval()
    dev.load_state_dict(cpu.state_dict())
    dev.to("pjrt")
    ids = torch.randint(1, 500, (1, 12), generator=torch.Generator().manual_seed(1))
    kw = dict(do_sample=False, pad_token_id=0, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(dev.generate(ids.to("pjrt"), **kw).cpu(), cpu.generate(ids, **kw))


@pytest.mark.parametrize("pattern", ["piece from the cache", "piece from two cache rows", "old cache read after"])
def test_appends_whose_piece_reads_the_cache_in_compiled_regions_equal_cpu(pattern):
    """An append writes into the padded array in place (a dynamic_update_slice); its piece read
    from the same array, and other readers of it in the same compiled region, are the pattern
    XLA:CPU miscompiled for block writes (docs/conformance-notes.md): each step's values equal CPU's."""
    def steps(device):
        g = torch.Generator().manual_seed(0)
        k = torch.randn(1, 2, 4, 8, generator=g).to(device)
        q = torch.randn(1, 2, 1, 8, generator=g).to(device)
        out = []
        for i in range(30):
            old = k
            piece = k.narrow(2, 1, 1) - k.narrow(2, 0, 1) if pattern == "piece from two cache rows" else \
                k.narrow(2, 0, 1) * 0.5 + 0.1
            k = torch.cat([k, piece], dim=2)
            parts = [F.scaled_dot_product_attention(q, k, k).flatten(), k.narrow(2, 1, 2).sum().reshape(1)]
            if pattern == "old cache read after":
                parts += [F.scaled_dot_product_attention(q, old, old).flatten(), (old.narrow(2, 0, 3) * 3).flatten()]
            del old
            out.append(torch.cat(parts).cpu())  # one region a step, the same structure per capacity
        return torch.cat([*out, k.cpu().flatten()])

    torch_pjrt.reset_eager_stats()
    expected, got = steps("cpu"), steps("pjrt")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    ran = [r["executable"] for r in torch_pjrt.eager_stats()["fused"]["recent_regions"]]
    assert ran.count("cached") >= 10, ran
