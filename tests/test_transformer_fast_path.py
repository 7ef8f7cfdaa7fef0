"""torch's transformer fast path on pjrt: nn.MultiheadAttention, nn.TransformerEncoderLayer and
nn.TransformerEncoder in inference (eval, no grad) call `_native_multi_head_attention`,
`_transformer_encoder_layer_fwd` and `_masked_softmax` on every device torch accepts, PrivateUse1
included, and TransformerEncoder packs a padded batch into a nested tensor. Each is compared with
CPU torch, and none may run on the CPU fallback (ops/transformer.py, eager/nested.py)."""
from __future__ import annotations

import warnings

import pytest
import torch

import torch_pjrt
from tests.ops.harness import assert_raises_like_cpu, no_fallback

TOLERANCE = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10),
             torch.float16: dict(atol=5e-3, rtol=5e-3), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


@pytest.fixture(autouse=True)
def _no_fallback():
    with warnings.catch_warnings(), no_fallback():
        warnings.simplefilter("ignore")  # nested tensors' "prototype stage" warning
        yield


def _both(module_fn, inputs, dtype=torch.float32):
    """(CPU's outputs, pjrt's outputs on the CPU) of the same module in eval mode without grad."""
    torch.manual_seed(0)
    module = module_fn().to(dtype).eval()
    with torch.no_grad():
        expected = module(*inputs)
        module.to("pjrt")
        torch_pjrt.reset_eager_stats()
        got = module(*[x.to("pjrt") if isinstance(x, torch.Tensor) else x for x in inputs])
    ran = torch_pjrt.eager_stats()["paths"]
    assert {"aten::_native_multi_head_attention", "aten::_transformer_encoder_layer_fwd"} & ran.keys(), \
        "torch did not take its fast path: the test compares nothing of it"
    as_list = (lambda r: list(r) if isinstance(r, tuple) else [r])
    return as_list(expected), [g.cpu() if isinstance(g, torch.Tensor) else g for g in as_list(got)]


def _assert_same(expected, got, dtype=torch.float32):
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        if e is None:
            assert g is None
        else:
            torch.testing.assert_close(g, e, equal_nan=True, **TOLERANCE[dtype])


def _padding(lengths, total):
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]


E, HEADS, T = 16, 4, 5
X = torch.randn(3, T, E, generator=torch.Generator().manual_seed(1))
KEY_PADDING = _padding([5, 3, 1], T)
CAUSAL = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)


@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("masks", ["none", "key_padding", "attn_mask", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_multihead_attention_in_inference_equals_cpu(masks, need_weights, average, dtype):
    key_padding = KEY_PADDING if masks in ("key_padding", "both") else None
    attn_mask = CAUSAL if masks in ("attn_mask", "both") else None

    class Self(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(E, HEADS, batch_first=True)

        def forward(self, x, key_padding_mask, attn_mask):
            return self.attn(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                             need_weights=need_weights, average_attn_weights=average)

    x = X.to(dtype)
    _assert_same(*_both(Self, [x, key_padding, attn_mask], dtype), dtype)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("mask", ["none", "src_mask", "key_padding"])
def test_transformer_encoder_layer_in_inference_equals_cpu(norm_first, activation, mask):
    layer = lambda: torch.nn.TransformerEncoderLayer(E, HEADS, 32, dropout=0.0, activation=activation,
                                                     batch_first=True, norm_first=norm_first)
    src_mask = CAUSAL if mask == "src_mask" else None
    key_padding = KEY_PADDING if mask == "key_padding" else None

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer()

        def forward(self, x, src_mask, key_padding):
            return self.layer(x, src_mask=src_mask, src_key_padding_mask=key_padding)

    _assert_same(*_both(Layer, [X, src_mask, key_padding]))


@pytest.mark.parametrize("lengths", [[5, 3, 1], [5, 5, 5], [2, 2, 4]])
@pytest.mark.parametrize("nested", [True, False])
def test_transformer_encoder_with_padding_equals_cpu(lengths, nested):
    """With enable_nested_tensor (the default) torch packs the batch into a nested tensor, and the
    padded positions of the result are 0; without it they hold what the layers computed."""
    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(E, HEADS, 32, dropout=0.0, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested)

        def forward(self, x, key_padding):
            return self.encoder(x, src_key_padding_mask=key_padding)

    expected, got = _both(Encoder, [X, _padding(lengths, T)])
    _assert_same(expected, got)


def test_a_nested_tensor_round_trips_on_pjrt():
    x = X.to("pjrt")
    keep = ~KEY_PADDING.to("pjrt")
    assert torch._nested_tensor_from_mask_left_aligned(x, keep)
    nested = torch._nested_tensor_from_mask(x, keep)
    assert nested.is_nested and nested.device.type == "pjrt"
    assert nested._nested_tensor_size().tolist() == [[5, E], [3, E], [1, E]]
    padded = nested.to_padded_tensor(0.0, X.shape)
    assert torch.equal(padded.cpu(), torch.where(KEY_PADDING[..., None], 0.0, X))
    assert not torch._nested_tensor_from_mask_left_aligned(x, torch.tensor([[True] * 5, [False, True] * 2 + [False],
                                                                             [True] * 5], device="pjrt"))


def test_compiled_encoder_equals_cpu():
    """Dynamo traces the dense fast path (no nested tensor) for pjrt as for the CPU."""
    torch.manual_seed(0)
    encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(E, HEADS, 32, dropout=0.0, batch_first=True),
                                          2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        expected = encoder(X, src_key_padding_mask=KEY_PADDING)
        compiled = torch.compile(encoder.to("pjrt"), backend="pjrt")
        got = compiled(X.to("pjrt"), src_key_padding_mask=KEY_PADDING.to("pjrt"))
    torch.testing.assert_close(got.cpu(), expected, **TOLERANCE[torch.float32])


SCORES = torch.randn(2, 3, T, T, generator=torch.Generator().manual_seed(2))
FULL_MASK = torch.rand(2, 3, T, T, generator=torch.Generator().manual_seed(3)) > 0.6
FULL_MASK[0, 0, 1] = True  # a row with every position left out: NaN, as on CPU


@pytest.mark.parametrize("mask,dim,mask_type", [
    (FULL_MASK, 3, 2), (FULL_MASK, 2, 2), (FULL_MASK, -1, None), (CAUSAL, 3, 0), (CAUSAL, 2, 0),
    (KEY_PADDING[:2], 3, 1), (KEY_PADDING[:2], 2, 1)])
def test_masked_softmax_equals_cpu(mask, dim, mask_type):
    for dtype in (torch.float32, torch.float64):
        x = SCORES.to(dtype, copy=True).requires_grad_()
        expected = torch._masked_softmax(x, mask, dim, mask_type)
        xp = SCORES.to(dtype).to("pjrt").detach().requires_grad_()
        got = torch._masked_softmax(xp, mask.to("pjrt"), dim, mask_type)
        torch.testing.assert_close(got.cpu(), expected, equal_nan=True, **TOLERANCE[dtype])
        if mask_type == 2:  # the backward (CPU's takes a mask of the input's shape)
            grad = torch.randn(SCORES.shape, dtype=dtype, generator=torch.Generator().manual_seed(4))
            expected.backward(grad)
            got.backward(grad.to("pjrt"))
            torch.testing.assert_close(xp.grad.cpu(), x.grad, equal_nan=True, **TOLERANCE[dtype])


MASKED_SOFTMAX_ERRORS = {
    "float mask": lambda d: torch._masked_softmax(SCORES.to(d), FULL_MASK.float().to(d), 3, 2),
    "type 2 of another shape": lambda d: torch._masked_softmax(SCORES.to(d), FULL_MASK[0].to(d), 3, 2),
    "type 0 not (L, L)": lambda d: torch._masked_softmax(SCORES.to(d), KEY_PADDING[:2].to(d), 3, 0),
    "type 1 not (B, L)": lambda d: torch._masked_softmax(SCORES.to(d), CAUSAL.to(d), 3, 1),
    "no type for a 2-D mask": lambda d: torch._masked_softmax(SCORES.to(d), CAUSAL.to(d), 3, None),
    "unknown type": lambda d: torch._masked_softmax(SCORES.to(d), CAUSAL.to(d), 3, 5),
    "integer input": lambda d: torch._masked_softmax(SCORES.long().to(d), FULL_MASK.to(d), 3, 2),
}


@pytest.mark.parametrize("name", MASKED_SOFTMAX_ERRORS)
def test_masked_softmax_bad_arguments_raise_as_cpu(name):
    assert_raises_like_cpu(MASKED_SOFTMAX_ERRORS[name], name)


def _attention(d, x=X, embed_dim=E, heads=HEADS, weight_rows=3 * E, bias=3 * E, dtype=torch.float32, **kwargs):
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(weight_rows, E, generator=g), torch.randn(bias, generator=g)
    pw, pb = torch.randn(E, E, generator=g), torch.randn(E, generator=g)
    on = (lambda t: t.to(dtype).to(d))
    return torch._native_multi_head_attention(on(x), on(x), on(x), embed_dim, heads, on(w), on(b), on(pw), on(pb),
                                              **kwargs)


ATTENTION_ERRORS = {
    "heads do not divide embed_dim": lambda d: _attention(d, heads=3),
    "embed_dim is not query's": lambda d: _attention(d, embed_dim=8),
    "2-D query": lambda d: _attention(d, x=X[0]),
    "qkv_weight rows": lambda d: _attention(d, weight_rows=2 * E),
    "qkv_bias length": lambda d: _attention(d, bias=E),
    "integer tensors": lambda d: _attention(d, dtype=torch.int64),
}


@pytest.mark.parametrize("name", ATTENTION_ERRORS)
def test_multi_head_attention_bad_arguments_raise_as_cpu(name):
    assert_raises_like_cpu(ATTENTION_ERRORS[name], name)


def test_attention_of_an_empty_batch_returns_no_weights():
    expected, got = _attention("cpu", x=X[:0]), _attention("pjrt", x=X[:0])
    assert got[1] is None and expected[1] is None and got[0].shape == expected[0].shape == (0, T, E)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_multi_head_attention_in_half_precision_is_close_to_cpu(dtype):
    """(nn.MultiheadAttention leaves its fast path for half types; the op itself takes them.)"""
    mask = KEY_PADDING.to("pjrt")
    _assert_same(list(_attention("cpu", dtype=dtype, mask=KEY_PADDING, mask_type=1)),
                 [t.cpu() for t in _attention("pjrt", dtype=dtype, mask=mask, mask_type=1)], dtype)


def _nested_layer(device, layer, gap: int):
    """_transformer_encoder_layer_fwd of a nested batch of two sequences (5 and 3 rows) with `gap`
    rows between them in its buffer."""
    buffer = torch.randn((5 + gap + 3) * E, generator=torch.Generator().manual_seed(6))
    nested = torch._nested_view_from_buffer(buffer.to(device), torch.tensor([[5, E], [3, E]]),
                                            torch.tensor([[E, 1], [E, 1]]), torch.tensor([0, (5 + gap) * E]))
    layer.to(device)
    with torch.no_grad():
        out = torch._transformer_encoder_layer_fwd(
            nested, E, HEADS, layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias,
            layer.self_attn.out_proj.weight, layer.self_attn.out_proj.bias, False, False, 1e-5, layer.norm1.weight,
            layer.norm1.bias, layer.norm2.weight, layer.norm2.bias, layer.linear1.weight, layer.linear1.bias,
            layer.linear2.weight, layer.linear2.bias)
    return out.to_padded_tensor(0.0)


def test_a_nested_encoder_layer_equals_cpu_and_refuses_what_cpu_refuses():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(E, HEADS, 32, dropout=0.0, batch_first=True).eval()
    torch.testing.assert_close(_nested_layer("pjrt", layer, 0).cpu(), _nested_layer("cpu", layer, 0),
                               **TOLERANCE[torch.float32])
    # sequences apart in the buffer: CPU reads the buffer as one block and refuses
    assert_raises_like_cpu(lambda d: _nested_layer(d, layer, 1), "a nested batch with a gap")


NESTED_FROM_MASK_ERRORS = {
    "a mask with a gap": lambda d: torch._nested_tensor_from_mask(
        X.to(d), torch.tensor([[True] * 5, [True, False, True, False, False], [True] * 5], device=d)),
    "a float mask": lambda d: torch._nested_tensor_from_mask(X.to(d), (~KEY_PADDING).float().to(d)),
    "an empty batch": lambda d: torch._nested_tensor_from_mask(X[:0].to(d), KEY_PADDING[:0].to(d)),
}


@pytest.mark.parametrize("name", NESTED_FROM_MASK_ERRORS)
def test_packing_a_bad_mask_raises_as_cpu(name):
    assert_raises_like_cpu(NESTED_FROM_MASK_ERRORS[name], name)
