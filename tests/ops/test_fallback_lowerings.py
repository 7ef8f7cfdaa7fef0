"""Ops that ran on the CPU fallback in the OpInfo sweep (issue 32), and `isin` (a traced
decomposition per call, which transformers' generate calls every token: issue 29) and
`_fused_rms_norm` (rms_norm as one call, not six: issue 29), now lowered:
every sample of their OpInfo entries (PyTorch's own database) on pjrt against the CPU, with no
CPU fallback.

Backward is compared where the OpInfo supports it (the gradient of the first floating output
with respect to every floating input that requires grad)."""
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

import torch_pjrt  # noqa: F401  (sets the device up)
from tests.ops.harness import no_fallback

# (OpInfo name, variant): each entry's samples, in the dtypes named
TOLERANCE = {  # float32 gradients summed in another order than CPU's (over time; over taps)
    ("nn.functional.ctc_loss", "", torch.float32): dict(rtol=1e-3, atol=2e-4),
    ("nn.functional.grid_sample", "", torch.float32): dict(rtol=1e-4, atol=1e-4),
}
MAX_SAMPLES = 24  # per op and dtype, for the default run's budget (histogram has 192)
ONLY = {  # the samples of the op that was on the fallback (2-D grid_sample is tested in test_nn.py)
    ("nn.functional.grid_sample", ""): lambda sample: sample.input.ndim == 5,
}
CASES = {
    ("igamma", ""): (torch.float32, torch.float64),
    ("igammac", ""): (torch.float32, torch.float64),
    ("frexp", ""): (torch.float32, torch.float64, torch.float16, torch.bfloat16),
    ("index_reduce", "prod"): (torch.float32, torch.int64),
    ("index_reduce", "mean"): (torch.float32, torch.int64),
    ("index_reduce", "amax"): (torch.float32, torch.int32),
    ("index_reduce", "amin"): (torch.float64, torch.uint8),
    ("nn.functional.ctc_loss", ""): (torch.float32, torch.float64),
    ("nn.functional.grid_sample", ""): (torch.float32, torch.float64),
    ("histogram", ""): (torch.float32, torch.float64),
    ("hash_tensor", ""): (torch.float32, torch.float64, torch.int8, torch.int64, torch.bool, torch.bfloat16),
    ("_segment_reduce", "lengths"): (torch.float32, torch.float64),
    ("_segment_reduce", "offsets"): (torch.float32, torch.float64),
    ("histogramdd", ""): (torch.float32, torch.float64),
    ("linalg.ldl_factor", ""): (torch.float32, torch.complex128),
    ("linalg.ldl_factor_ex", ""): (torch.float64, torch.complex64),
    ("linalg.ldl_solve", ""): (torch.float32, torch.float64, torch.complex64, torch.complex128),
    ("isin", ""): (torch.float32, torch.int64, torch.uint8, torch.float16),
    ("nn.functional.rms_norm", ""): (torch.float32, torch.float64, torch.bfloat16),
}


def _opinfo(name, variant):
    return next(op for op in op_db if op.name == name and op.variant_test_name == variant)


def _to(device):
    return lambda x: x.detach().to(device).requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x


def _samples(name, variant, dtype):
    op = _opinfo(name, variant)
    grad = op.supports_autograd and dtype.is_floating_point and dtype in (torch.float32, torch.float64)
    return op, list(op.sample_inputs("cpu", dtype, requires_grad=grad))


@pytest.mark.parametrize("name,variant,dtype", [(n, v, d) for (n, v), ds in CASES.items() for d in ds],
                         ids=lambda v: str(v).replace("torch.", "") or "-")
def test_opinfo_samples_match_cpu_without_fallback(name, variant, dtype):
    op, samples = _samples(name, variant, dtype)
    samples = [s for s in samples if ONLY.get((name, variant), lambda _: True)(s)]
    samples = samples[::-(-len(samples) // MAX_SAMPLES)]  # an even spread: each new shape compiles
    assert samples
    for i, sample in enumerate(samples):
        args = [sample.input, *sample.args]
        expected = op(*args, **sample.kwargs)
        moved = tree_map(_to("pjrt"), args)
        with no_fallback():
            got = op(*moved, **tree_map(_to("pjrt"), sample.kwargs))
        torch.testing.assert_close(tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, got), expected,
                                   equal_nan=True, msg=lambda m: f"sample {i}: {sample}\n{m}")
        outputs = [t for t in tree_flatten(expected)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if not outputs:
            continue
        inputs = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        pjrt_inputs = [t for t in tree_flatten(moved)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        seed = torch.randn_like(outputs[0])
        expected_grads = torch.autograd.grad(outputs[0], inputs, seed, allow_unused=True)
        pjrt_out = [t for t in tree_flatten(got)[0] if isinstance(t, torch.Tensor) and t.requires_grad][0]
        with no_fallback():
            grads = torch.autograd.grad(pjrt_out, pjrt_inputs, seed.to("pjrt"), allow_unused=True)
        torch.testing.assert_close([g if g is None else g.cpu() for g in grads], list(expected_grads),
                                   equal_nan=True, **TOLERANCE.get((name, variant, dtype), {}), msg=lambda m: f"grad of sample {i}: {sample}\n{m}")


def test_unique_without_sorting_or_inverse():
    x = torch.tensor([3, 1, 2, 3, 1, 7])
    with no_fallback():
        out, inverse = torch._unique(x.to("pjrt"), sorted=True, return_inverse=True)
    expected, expected_inverse = torch._unique(x, sorted=True, return_inverse=True)
    assert out.cpu().tolist() == expected.tolist() and inverse.cpu().tolist() == expected_inverse.tolist()


@pytest.mark.parametrize("call", ["bad reduce", "index out of range"])
def test_index_reduce_errors_match_cpu(call):
    def run(device):
        self, source = torch.zeros(3, device=device), torch.ones(1, device=device)
        if call == "bad reduce":
            return self.index_reduce(0, torch.tensor([1], device=device), source, "sum")
        return self.index_reduce(0, torch.tensor([5], device=device), source, "prod")

    with pytest.raises(Exception) as cpu:
        run("cpu")
    with pytest.raises(type(cpu.value)) as pjrt:
        run("pjrt").cpu()
    # an index is checked asynchronously, as on CUDA: the message says so after CPU's words
    assert str(pjrt.value).startswith(str(cpu.value))


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
def test_ctc_loss_and_its_log_probs_gradient_match_cpu(layout, zero_infinity):
    """Batch element 2 cannot align (3 labels, repeated, in 4 steps): an infinite loss, or 0
    with zero_infinity. The gradient is taken with respect to log_probs directly, where CPU's
    backward adds exp(log_probs) (ctc.py says why)."""
    torch.manual_seed(0)
    log_probs = torch.randn(12, 3, 5).log_softmax(2)
    targets = torch.tensor([[1, 2, 3, 4], [2, 2, 0, 0], [3, 3, 3, 0]])
    input_lengths, target_lengths = [12, 10, 4], [4, 2, 3]
    if layout == "concatenated":
        targets = torch.cat([row[:n] for row, n in zip(targets, target_lengths)])

    def run(device):
        lp = log_probs.detach().to(device).requires_grad_()
        nll, _ = torch.ops.aten._ctc_loss(lp, targets.to(device), input_lengths, target_lengths, 0, zero_infinity)
        nll[:2].sum().backward()  # element 2's gradient: nan without zero_infinity, 0 with it
        return nll.detach().cpu(), lp.grad.cpu()

    expected = run("cpu")
    with no_fallback():
        got = run("pjrt")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_rrelu_with_noise_as_cpu_draws_it(training, inplace):
    """Eval: equal to CPU. Training: CPU's rule with pjrt's own draws (another generator): each
    element <= 0 scaled by a slope in [lower, upper] that noise records and the gradient is;
    positives and NaN keep themselves with slope 1."""
    torch.manual_seed(0)
    x = torch.randn(2000)
    x[:3] = torch.tensor([0.0, -0.0, float("nan")])
    lower, upper = 0.1, 0.4

    def run(device):
        xx = x.detach().to(device).requires_grad_()
        noise = torch.empty_like(xx)
        with no_fallback():
            if inplace:  # on a non-leaf copy, as F.rrelu(inplace=True) inside a model
                y = torch.ops.aten.rrelu_with_noise_(xx * 1, noise, lower, upper, training)
            else:
                y = torch.ops.aten.rrelu_with_noise(xx, noise, lower, upper, training)
            y.sum().backward()
        return y.detach().cpu(), noise.cpu(), xx.grad.cpu()

    y, noise, grad = run("pjrt")
    if not training:
        cpu_y, _, cpu_grad = run("cpu")
        torch.testing.assert_close(y, cpu_y, equal_nan=True)
        torch.testing.assert_close(grad, cpu_grad)
        return
    drawn = x <= 0
    assert ((noise[drawn] >= lower) & (noise[drawn] <= upper)).all() and (noise[~drawn] == 1).all()
    assert noise[drawn].std() > 0.05  # drawn, not one value
    torch.testing.assert_close(y[drawn], x[drawn] * noise[drawn])
    torch.testing.assert_close(y[~drawn], x[~drawn], equal_nan=True)
    torch.testing.assert_close(grad, noise)


@pytest.mark.parametrize("reduce", ["max", "min", "mean", "sum", "prod"])
def test_segment_reduce_edge_cases_and_gradients_match_cpu(reduce):
    """Empty segments, NaN, zeros and ties (with a negative incoming gradient: CPU divides a
    tie's gradient only where it is positive)."""
    data = torch.tensor([[1.0, 3.0, 3.0, 0.0, float("nan"), 2.0, 0.0, 5.0],
                         [2.0, 2.0, -1.0, 0.0, 4.0, 4.0, 1.0, 0.5]])
    lengths = torch.tensor([[2, 0, 3, 3], [3, 1, 0, 4]])
    seed = torch.tensor([[1.0, -2.0, 0.5, -1.0], [-0.5, 2.0, 1.0, 3.0]])

    def run(device, initial):
        x = data.detach().to(device).requires_grad_()
        out = torch.segment_reduce(x, reduce, lengths=lengths.to(device), axis=1, initial=initial)
        out.backward(seed.to(device))
        return out.detach().cpu(), x.grad.cpu()

    for initial in (None, 2.0):
        expected = run("cpu", initial)
        with no_fallback():
            got = run("pjrt", initial)
        torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m: f"initial={initial}: {m}")


def test_segment_reduce_refuses_lengths_that_do_not_cover_the_axis():
    def run(device):
        return torch.segment_reduce(torch.ones(4, device=device), "sum", lengths=torch.tensor([1, 2], device=device))

    with pytest.raises(RuntimeError) as cpu:
        run("cpu")
    with pytest.raises(RuntimeError, match=str(cpu.value).split("(")[0]):
        run("pjrt")


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
@pytest.mark.parametrize("hermitian", [False, True])
def test_ldl_pivots_and_solve_match_lapack(dtype, hermitian):
    """Bunch-Kaufman's choices are CPU's: 1x1 and 2x2 pivots, interchanges, a zero pivot's info."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 6, 6, dtype=dtype, generator=g)
    a = a + (a.mT.conj() if hermitian else a.mT)
    a[1].diagonal().zero_()  # a zero diagonal: 2x2 pivots throughout
    a[2, :, 0] = 0  # a zero column: info names it
    a[2, 0, :] = 0
    a[3] = a[3] * 1e-3 + torch.diag(torch.arange(6.0, dtype=torch.float64)).to(dtype)  # 1x1 pivots, one zero
    ld, piv, info = torch.linalg.ldl_factor_ex(a, hermitian=hermitian)
    b = torch.randn(4, 6, 2, dtype=dtype, generator=g)
    x = torch.linalg.ldl_solve(ld, piv, b, hermitian=hermitian)
    with no_fallback():
        got = torch.linalg.ldl_factor_ex(a.to("pjrt"), hermitian=hermitian)
        got_x = torch.linalg.ldl_solve(ld.to("pjrt"), piv.to("pjrt"), b.to("pjrt"), hermitian=hermitian)
    assert (piv < 0).any() and info.ne(0).any()  # the cases are exercised
    torch.testing.assert_close(got[1].cpu(), piv)
    torch.testing.assert_close(got[2].cpu(), info)
    torch.testing.assert_close(got[0].cpu(), ld)
    torch.testing.assert_close(got_x.cpu(), x, equal_nan=True)


def test_rms_norm_is_one_call_with_torchs_own_gradient():
    """torch differentiates `_fused_rms_norm` by its own formula once a backend has a kernel
    (as on CUDA): forward and backward are one eager call each, not the decomposition's six."""
    x = torch.randn(3, 16, device="pjrt", requires_grad=True)
    w = torch.randn(16, device="pjrt", requires_grad=True)
    torch_pjrt.reset_eager_stats()
    y = torch.nn.functional.rms_norm(x, (16,), w, 1e-5)
    assert y.grad_fn.name() == "FusedRmsNormBackward0"
    y.sum().backward()
    ops = set(torch_pjrt.eager_stats()["paths"])
    assert {"aten::_fused_rms_norm", "aten::_fused_rms_norm_backward"} <= ops
    assert not ops & {"aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::rsqrt"}


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_rms_norm_of_integers_raises_cpus_error(dtype):
    """The meta kernel accepts any dtype; CPU refuses what is not floating or complex, and so does pjrt."""
    x = torch.arange(8).view(2, 4).to(dtype)
    with pytest.raises(NotImplementedError) as cpu:
        torch.nn.functional.rms_norm(x, (4,))
    with pytest.raises(NotImplementedError) as pjrt:
        torch.nn.functional.rms_norm(x.to("pjrt"), (4,))
    assert str(pjrt.value) == str(cpu.value)
