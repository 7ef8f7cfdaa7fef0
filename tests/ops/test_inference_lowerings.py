"""Lowerings LLM inference reaches (issue 18): integer histc as CUDA accepts it, multinomial
sampling, and _index_put_impl_ (advanced indexing's backward), on pjrt with no CPU fallback."""
import torch

from tests.ops.harness import no_fallback

DEV = "pjrt"


def test_integer_histc_counts_as_the_float_histogram_of_the_same_values():
    # CPU refuses integer inputs; CUDA (and transformers' MoE routing) count them
    x = torch.randint(0, 8, (200,), dtype=torch.int32)
    with no_fallback():
        got = torch.histc(x.to(DEV), bins=8, min=0, max=7).cpu()
        auto = torch.histc(x.to(DEV), bins=4).cpu()
    assert got.dtype == torch.int32
    assert got.tolist() == torch.histc(x.double(), bins=8, min=0, max=7).int().tolist()
    assert auto.tolist() == torch.histc(x.double(), bins=4).int().tolist()
    assert int(got.sum()) == 200


def test_float_histc_still_equals_cpu_with_nan_and_bounds():
    y = torch.randn(300)
    y[::7] = float("nan")
    with no_fallback():
        got = torch.histc(y.to(DEV), bins=10, min=-1, max=1).cpu()
    torch.testing.assert_close(got, torch.histc(y, bins=10, min=-1, max=1))


def test_multinomial_draws_follow_the_weights_and_the_seed():
    weights = torch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 1.0, 1.0]])
    with no_fallback():
        torch.manual_seed(0)
        many = torch.multinomial(weights.to(DEV), 20000, replacement=True).cpu()
        torch.manual_seed(0)
        again = torch.multinomial(weights.to(DEV), 20000, replacement=True).cpu()
        distinct = torch.multinomial(weights.to(DEV), 3).cpu()
        single = torch.multinomial(torch.tensor([0.2, 0.8]).to(DEV), 5, replacement=True).cpu()
    assert many.shape == (2, 20000) and many.dtype == torch.int64 and torch.equal(many, again)
    freq = torch.stack([torch.bincount(r, minlength=4) for r in many]).double() / 20000
    torch.testing.assert_close(freq, weights.double() / weights.double().sum(1, keepdim=True), atol=0.02, rtol=0)
    assert all(len(set(r.tolist())) == 3 and 1 not in r.tolist() for r in distinct[:1])  # weight 0: never drawn
    assert all(len(set(r.tolist())) == 3 for r in distinct)
    assert single.shape == (5,)


def test_advanced_indexing_backward_accumulates_on_pjrt():
    x = torch.randn(5, 3, requires_grad=True)
    index, scale = torch.tensor([1, 1, 4]), torch.arange(9.0).reshape(3, 3)
    xp = x.detach().to(DEV).requires_grad_()
    (x[index] * scale).sum().backward()
    with no_fallback():
        (xp[index.to(DEV)] * scale.to(DEV)).sum().backward()
    torch.testing.assert_close(xp.grad.cpu(), x.grad)
