"""Lowerings that replaced CPU fallbacks (issue 13, section 3), against CPU torch.

Every test runs the op on pjrt and on CPU and also asserts that the pjrt call ran no aten
op on the CPU fallback (the diff of torch_pjrt.fallback_ops() around it is empty) and
that the op has a lowering in the table. These ops are: aten.equal, the antialiased
resizes and their backward ops, fractional max pooling 2d/3d and their backward ops,
embedding_renorm_, randperm.generator_out, and the special_* Bessel/Airy functions and
orthogonal polynomials.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt  # noqa: F401  (sets the device up)
from tests.ops.harness import no_fallback
from torch_pjrt.ops.registry import LOWERINGS

aten = torch.ops.aten
DEV = "pjrt"


def on_pjrt(fn, *args, **kwargs):
    """fn on pjrt copies of the tensor arguments, with no CPU fallback; results back on CPU."""
    moved = [a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args]
    with no_fallback():
        out = fn(*moved, **kwargs)
    return tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu() if isinstance(out, torch.Tensor) else out


def test_every_op_has_a_lowering():
    ops = [aten.equal.default, aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default,
           aten._upsample_bilinear2d_aa_backward.default, aten._upsample_bicubic2d_aa_backward.default,
           aten.fractional_max_pool2d.default, aten.fractional_max_pool3d.default,
           aten.fractional_max_pool2d_backward.default, aten.fractional_max_pool3d_backward.default,
           aten.embedding_renorm.default, aten.randperm.generator_out]
    ops += [getattr(aten, f"special_{n}").default for n in SPECIAL_UNARY]
    ops += [getattr(getattr(aten, f"special_{n}"), o) for n in POLYNOMIALS for o in ("default", "x_scalar", "n_scalar")]
    assert [op for op in ops if op not in LOWERINGS] == []


# ----------------------------------------------------------------------------------- equal


def _t(values, dtype=None):
    return torch.tensor(values, dtype=dtype)


EQUAL_CASES = [
    (_t([1, 2]), _t([1.0, 2.0])),  # promotes: True
    (_t([1, 2]), _t([1, 2], torch.int32)),
    (_t([True, False]), _t([1, 0])),
    (_t([0.1]), _t([0.1], torch.float64)),  # float32(0.1) != 0.1 in float64: False
    (_t([1 + 0j, 2]), _t([1.0, 2.0])),
    (_t([1.0, 2.0]).bfloat16(), _t([1.0, 2.0]).half()),
    (_t([0.1]).bfloat16(), _t([0.1]).half()),
    (_t([float("nan")]), _t([float("nan")])),  # NaN is unequal
    (_t([0.0]), _t([-0.0])),
    (_t([1.0, 2.0]), _t([[1.0, 2.0]])),  # shapes differ: False, no broadcasting
    (_t(0.0), _t([0.0])),
    (torch.zeros(2, 0), torch.zeros(0, 2)),
    (torch.zeros(0), torch.zeros(0)),
    (torch.arange(12.0).reshape(3, 4), torch.arange(12.0).reshape(3, 4)),
    (torch.arange(12.0).reshape(3, 4), torch.arange(12.0).reshape(3, 4).t().contiguous().t()),
    (torch.arange(12).reshape(3, 4), torch.arange(12).reshape(3, 4) + (torch.arange(12).reshape(3, 4) == 11)),
    (torch.full((2, 3), 7, dtype=torch.uint8), torch.full((2, 3), 7, dtype=torch.int8)),
]


@pytest.mark.parametrize("a,b", EQUAL_CASES)
def test_equal_matches_cpu(a, b):
    expected = torch.equal(a, b)
    actual = on_pjrt(torch.equal, a, b)
    assert type(actual) is bool
    assert actual == expected


def test_equal_nan_in_the_same_tensor_and_views():
    x = torch.tensor([float("nan"), 1.0])
    px = x.to(DEV)
    with no_fallback():
        assert torch.equal(px, px) is torch.equal(x, x) is False  # even an alias of itself
        assert torch.equal(px[1:], px[1:]) is True
        assert torch.equal(px[1:], torch.ones(1, device=DEV)) is True
        assert torch.equal(px.reshape(2, 1).t(), torch.tensor([[float("nan"), 2.0]], device=DEV)) is False


def test_equal_mixed_devices_raises():
    with pytest.raises(RuntimeError):
        torch.equal(torch.ones(2, device=DEV), torch.ones(2))


# ------------------------------------------------------------------------- antialiased resize

AA_SIZES = [
    ((8, 9), dict(size=(4, 5))),  # down
    ((8, 9), dict(size=(13, 20))),  # up
    ((17, 5), dict(size=(6, 11))),  # down in H, up in W
    ((8, 9), dict(scale_factor=0.37)),  # scale factors passed on to the kernel
    ((8, 9), dict(scale_factor=(2.3, 0.5))),
    ((10, 20), dict(scale_factor=(1.7, 0.9))),
    ((8, 9), dict(scale_factor=0.5, recompute_scale_factor=True)),
    ((8, 9), dict(size=(8, 3))),  # H keeps its size: CPU does not resample it
    ((17, 5), dict(scale_factor=1.1)),  # H grows, W keeps its size though a scale is given
    ((1, 6), dict(size=(4, 5))),
]


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("hw,kwargs", AA_SIZES)
def test_antialiased_interpolate_matches_cpu(mode, dtype, align_corners, hw, kwargs):
    g = torch.Generator().manual_seed(hw[0] * 100 + hw[1])
    x = torch.rand((2, 3) + hw, generator=g) * 255
    x = x.round().to(dtype) if dtype == torch.uint8 else x.to(dtype)
    expected = F.interpolate(x, mode=mode, antialias=True, align_corners=align_corners, **kwargs)
    actual = on_pjrt(F.interpolate, x, mode=mode, antialias=True, align_corners=align_corners, **kwargs)
    if dtype == torch.uint8:  # CPU's fixed-point path, reproduced exactly
        torch.testing.assert_close(actual, expected, atol=0, rtol=0)
    else:
        torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("hw,kwargs", AA_SIZES[:7])
def test_antialiased_interpolate_gradient_matches_cpu(mode, dtype, align_corners, hw, kwargs):
    g = torch.Generator().manual_seed(1)
    x = torch.randn((2, 2) + hw, generator=g, dtype=dtype)
    xc, xp = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    yc = F.interpolate(xc, mode=mode, antialias=True, align_corners=align_corners, **kwargs)
    weights = torch.randn(yc.shape, generator=g, dtype=dtype)
    yc.backward(weights)
    with no_fallback():
        yp = F.interpolate(xp, mode=mode, antialias=True, align_corners=align_corners, **kwargs)
        yp.backward(weights.to(DEV))
    torch.testing.assert_close(yp.detach().cpu(), yc.detach())
    torch.testing.assert_close(xp.grad.cpu(), xc.grad)


@pytest.mark.parametrize("op,backward", [(aten._upsample_bilinear2d_aa, aten._upsample_bilinear2d_aa_backward),
                                         (aten._upsample_bicubic2d_aa, aten._upsample_bicubic2d_aa_backward)])
def test_antialiased_aten_ops_with_scales(op, backward):
    # the backward op spreads gradients over every axis, also one that keeps its size
    x = torch.randn(2, 3, 10, 20, dtype=torch.float64)
    for args in [((3, 3), False, 1.7, 0.9), ((3, 3), True, 1.7, 0.9), ((10, 7), False, 0.8, None)]:
        torch.testing.assert_close(on_pjrt(op.default, x, *args), op.default(x, *args))
        g = torch.randn(2, 3, *args[0], dtype=torch.float64)
        torch.testing.assert_close(on_pjrt(backward.default, g, args[0], list(x.shape), *args[1:]),
                                   backward.default(g, args[0], list(x.shape), *args[1:]))


def test_antialiased_interpolate_one_output_column():
    """CPU's float kernel gives every output row the first row's value when the output is
    one column wide and the height is resampled (its vertical pass loses the row stride);
    the uint8 path and both separate passes do not. pjrt computes the separable result, so
    this compares with CPU's two passes run one at a time."""
    x = torch.rand(1, 2, 17, 5, dtype=torch.float64)
    for mode in ("bilinear", "bicubic"):
        width = F.interpolate(x, size=(17, 1), mode=mode, antialias=True)
        height = F.interpolate(width.transpose(2, 3), size=(1, 6), mode=mode, antialias=True).transpose(2, 3)
        torch.testing.assert_close(on_pjrt(F.interpolate, x, size=(6, 1), mode=mode, antialias=True), height)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_antialiased_interpolate_half_is_rejected_as_on_cpu(dtype):
    x = torch.rand(1, 1, 8, 8, dtype=dtype)
    with pytest.raises(NotImplementedError, match="not implemented for"):
        F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)
    with pytest.raises(NotImplementedError, match="not implemented for"):
        F.interpolate(x.to(DEV), scale_factor=0.5, mode="bilinear", antialias=True)


# -------------------------------------------------------------------------- fractional pooling

FRACTIONAL_2D = [((2, 3, 9, 11), (2, 3), (4, 5)), ((3, 10, 10), (3, 3), (5, 7)), ((1, 2, 7, 7), (2, 2), (6, 6)),
                 ((2, 2, 8, 9), (1, 1), (8, 1)), ((1, 1, 5, 5), (5, 5), (1, 1)), ((2, 2, 60, 90), (2, 3), (45, 70))]
FRACTIONAL_3D = [((2, 2, 6, 7, 8), (2, 3, 2), (3, 4, 5)), ((2, 5, 5, 5), (2, 2, 2), (3, 3, 2)),
                 ((1, 1, 20, 30, 40), (2, 2, 3), (15, 20, 30))]


def _pool_input(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    x.view(-1)[::7] = x.view(-1)[3]  # ties: the first maximum in window order wins
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("nd,case", [(2, c) for c in FRACTIONAL_2D] + [(3, c) for c in FRACTIONAL_3D])
def test_fractional_max_pool_matches_cpu_exactly(dtype, nd, case):
    shape, kernel, out = case
    op = aten.fractional_max_pool2d.default if nd == 2 else aten.fractional_max_pool3d.default
    x = _pool_input(shape, dtype, seed=len(shape))
    batch = shape[0] if len(shape) == nd + 2 else 1
    samples = torch.rand((batch, shape[-nd - 1], nd), generator=torch.Generator().manual_seed(5)).to(dtype)
    expected = op(x, kernel, out, samples)
    actual = on_pjrt(op, x, kernel, out, samples)
    assert actual[1].dtype == torch.int64
    torch.testing.assert_close(actual[1], expected[1], atol=0, rtol=0)  # the same windows and maxima
    torch.testing.assert_close(actual[0], expected[0], atol=0, rtol=0)


@pytest.mark.parametrize("nd", [2, 3])
def test_fractional_max_pool_empty_batch(nd):
    pool = F.fractional_max_pool2d if nd == 2 else F.fractional_max_pool3d
    x = torch.randn((0, 2) + (5,) * nd)
    samples = torch.rand(0, 2, nd)
    expected = pool(x, 2, output_size=(3,) * nd, _random_samples=samples)
    xp = x.to(DEV).requires_grad_()
    with no_fallback():
        actual = pool(xp, 2, output_size=(3,) * nd, _random_samples=samples.to(DEV))
        actual.sum().backward()
    assert actual.shape == expected.shape and xp.grad.shape == x.shape


def test_fractional_max_pool_nan_wins_last():
    x = torch.randn(1, 1, 6, 6)
    x[0, 0, 1, 1] = x[0, 0, 2, 2] = float("nan")  # two NaNs in one window: CPU keeps the later one
    samples = torch.rand(1, 1, 2)
    expected = aten.fractional_max_pool2d(x, (3, 3), (3, 3), samples)
    actual = on_pjrt(aten.fractional_max_pool2d.default, x, (3, 3), (3, 3), samples)
    torch.testing.assert_close(actual[0], expected[0], equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(actual[1], expected[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fractional_max_pool_gradients_match_cpu(dtype):
    g = torch.Generator().manual_seed(3)
    for pool, x, samples, kwargs in [
        (F.fractional_max_pool2d, torch.randn(2, 3, 10, 10, generator=g, dtype=dtype),
         torch.rand(2, 3, 2, generator=g, dtype=dtype), dict(kernel_size=3, output_size=(5, 6))),
        (F.fractional_max_pool2d, torch.randn(3, 9, 9, generator=g, dtype=dtype),
         torch.rand(1, 3, 2, generator=g, dtype=dtype), dict(kernel_size=2, output_ratio=(0.5, 0.5))),
        (F.fractional_max_pool3d, torch.randn(2, 3, 6, 6, 6, generator=g, dtype=dtype),
         torch.rand(2, 3, 3, generator=g, dtype=dtype), dict(kernel_size=2, output_ratio=0.5)),
    ]:
        xc, xp = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
        yc = pool(xc, _random_samples=samples, **kwargs)
        weights = torch.randn(yc.shape, generator=g, dtype=dtype)
        yc.backward(weights)
        with no_fallback():
            yp = pool(xp, _random_samples=samples.to(DEV), **kwargs)
            yp.backward(weights.to(DEV))
        torch.testing.assert_close(yp.detach().cpu(), yc.detach())
        torch.testing.assert_close(xp.grad.cpu(), xc.grad)


@pytest.mark.parametrize("call", [
    lambda d: aten.fractional_max_pool2d(torch.randn(1, 1, 4, 4, device=d), (3, 3), (3, 3), torch.rand(1, 1, 2, device=d)),
    lambda d: aten.fractional_max_pool3d(torch.randn(1, 1, 5, 5, 5, device=d), (2, 2, 2), (4, 3, 3),
                                         torch.rand(1, 1, 3, device=d)),
    lambda d: aten.fractional_max_pool2d(torch.randn(4, 4, device=d), (2, 2), (3, 3), torch.rand(1, 1, 2, device=d)),
    lambda d: aten.fractional_max_pool2d(torch.randn(1, 1, 4, 4, device=d), (2, 2), (3, 3), torch.rand(1, 1, 3, device=d)),
])
def test_fractional_max_pool_errors_as_on_cpu(call):
    with pytest.raises(RuntimeError) as on_cpu:
        call("cpu")
    with pytest.raises(RuntimeError) as on_device:
        call(DEV)
    assert str(on_device.value) == str(on_cpu.value)


def test_fractional_max_pool_random_samples_drawn_on_device_are_reproducible():
    x = torch.randn(2, 3, 12, 12, device=DEV)
    with no_fallback():
        torch.manual_seed(7)
        a = F.fractional_max_pool2d(x, 2, output_size=6, return_indices=True)
        torch.manual_seed(7)
        b = F.fractional_max_pool2d(x, 2, output_size=6, return_indices=True)
    assert torch.equal(a[0].cpu(), b[0].cpu()) and torch.equal(a[1].cpu(), b[1].cpu())


# ------------------------------------------------------------------------------ embedding_renorm_


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3.0, 0.5])
def test_embedding_renorm_matches_cpu(dtype, norm_type):
    g = torch.Generator().manual_seed(11)
    weight = (torch.randn(10, 4, generator=g) * 2).to(dtype)
    indices = torch.tensor([[1, 3, 3], [-1, 0, 7]])  # repeated rows scale once; negative rows wrap
    expected = weight.clone()
    torch.embedding_renorm_(expected, indices, 1.5, norm_type)
    pw = weight.to(DEV)
    with no_fallback():
        returned = torch.embedding_renorm_(pw, indices.to(DEV), 1.5, norm_type)
    assert returned is pw
    exact = dtype in (torch.float16, torch.bfloat16)  # one rounding of the scale, as CPU
    torch.testing.assert_close(pw.cpu(), expected, **(dict(atol=0, rtol=0) if exact else {}))
    assert torch.equal(pw.cpu()[[2, 4, 5, 6, 8]], weight[[2, 4, 5, 6, 8]])  # rows not named are untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embedding_with_max_norm_matches_cpu(dtype):
    g = torch.Generator().manual_seed(2)
    weight = (torch.randn(12, 5, generator=g) * 3).to(dtype)
    indices = torch.tensor([[0, 2, 4], [4, 11, 2]])
    expected_weight = weight.clone()
    expected = F.embedding(indices, expected_weight, max_norm=1.0)
    pw = weight.to(DEV)
    with no_fallback():
        actual = F.embedding(indices.to(DEV), pw, max_norm=1.0).cpu()
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(pw.cpu(), expected_weight)
    module = torch.nn.Embedding(12, 5, max_norm=0.5, norm_type=1.0).to(dtype)
    module.weight.data.copy_(weight)
    expected = module(indices)
    module = module.to(DEV)
    module.weight.data.copy_(weight.to(DEV))
    with no_fallback():
        actual = module(indices.to(DEV))
    torch.testing.assert_close(actual.detach().cpu(), expected.detach())


# -------------------------------------------------------------------------------------- randperm


def _is_permutation(t: torch.Tensor, n: int) -> bool:
    return torch.equal(torch.sort(t.cpu().to(torch.int64)).values, torch.arange(n))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32, torch.float64,
                                   torch.float16, torch.bfloat16])
def test_randperm_is_a_permutation_of_cpus_dtype_and_shape(dtype):
    for n in (0, 1, 7, 200):
        expected = torch.randperm(n, dtype=dtype)
        with no_fallback():
            actual = torch.randperm(n, dtype=dtype, device=DEV)
        assert actual.device.type == DEV and actual.dtype == expected.dtype and actual.shape == expected.shape
        assert _is_permutation(actual, n)


def test_randperm_is_uniform():
    """Each of the 6 permutations of 3 about equally often (one sort by 64-bit random keys)."""
    import collections

    torch.manual_seed(0)
    counts = collections.Counter(tuple(torch.randperm(3, device=DEV).tolist()) for _ in range(1200))
    assert len(counts) == 6 and all(140 < c < 260 for c in counts.values()), counts


def test_randperm_out_and_generator():
    out = torch.empty(50, dtype=torch.int32, device=DEV)
    with no_fallback():
        returned = torch.randperm(50, out=out)
    assert returned is out and out.dtype == torch.int32 and _is_permutation(out, 50)
    gen = torch.Generator(device=DEV)
    with no_fallback():
        gen.manual_seed(123)
        a = torch.randperm(40, generator=gen, out=torch.empty(40, dtype=torch.int64, device=DEV))
        gen.manual_seed(123)
        b = torch.randperm(40, generator=gen, out=torch.empty(40, dtype=torch.int64, device=DEV))
        c = torch.randperm(40, generator=gen, out=torch.empty(40, dtype=torch.int64, device=DEV))
        gen.manual_seed(123)
        d = torch.randperm(40, generator=gen, device=DEV)
    assert _is_permutation(a, 40)
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(a.cpu(), d.cpu())
    assert not torch.equal(b.cpu(), c.cpu())  # the generator advanced


def test_randperm_reproducible_under_manual_seed():
    with no_fallback():
        torch.manual_seed(5)
        a = torch.randperm(100, device=DEV)
        b = torch.randperm(100, device=DEV)
        torch.manual_seed(5)
        c = torch.randperm(100, device=DEV)
    assert torch.equal(a.cpu(), c.cpu()) and not torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("n,dtype", [(3000, torch.float16), (300, torch.int8), (257, torch.uint8)])
def test_randperm_too_large_for_dtype_raises_as_on_cpu(n, dtype):
    with pytest.raises(RuntimeError) as on_cpu:
        torch.randperm(n, dtype=dtype)
    with pytest.raises(RuntimeError) as on_device:
        torch.randperm(n, dtype=dtype, device=DEV)
    assert str(on_device.value) == str(on_cpu.value)


# ------------------------------------------------------------------------- special functions

SPECIAL_UNARY = ["airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0",
                 "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0",
                 "scaled_modified_bessel_k1", "spherical_bessel_j0"]
POLYNOMIALS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
               "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
               "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
               "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]
# float32: XLA's sin/cos/exp/log differ from the C library's by an ulp or two, which the
# functions amplify where they are ill-conditioned (airy_ai at x = -90 takes the sine of a
# ~570 rad phase; a degree-600 recurrence compounds 600 roundings). float64 keeps the defaults.
SPECIAL_POINTS = [float("nan"), math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 2.09, -2.09, 5.0, -5.0, 8.0,
                  -8.0, 8.33, 103.9, 1e-6, -1e-6, 1e30, -1e30]


def _special_input(dtype):
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.tensor(SPECIAL_POINTS, dtype=dtype), torch.randn(500, generator=g, dtype=dtype) * 6,
                      torch.rand(300, generator=g, dtype=dtype) * 200 - 100])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", SPECIAL_UNARY)
def test_special_unary_matches_cpu(name, dtype):
    fn = getattr(torch.special, name)
    x = _special_input(dtype)
    tol = LOWERINGS[getattr(aten, f"special_{name}").default].tests.tolerance_for(dtype)
    torch.testing.assert_close(on_pjrt(fn, x), fn(x), equal_nan=True, **tol)


@pytest.mark.parametrize("name", SPECIAL_UNARY)
def test_special_unary_integer_input_computes_in_float32(name):
    fn = getattr(torch.special, name)
    for x in (torch.arange(-6, 7), torch.tensor([True, False])):
        actual = on_pjrt(fn, x)
        assert actual.dtype == torch.float32
        torch.testing.assert_close(actual, fn(x), equal_nan=True)


def _degrees(dtype):
    g = torch.Generator().manual_seed(1)
    fixed = [0, 1, 2, 3, 7, 9, 10, -1, 20, 5, math.nan, math.inf, -math.inf, 2.7, 130, 600, 1e20, 4, 6, 12]
    return torch.cat([torch.tensor(fixed, dtype=dtype), torch.randint(-2, 15, (300,), generator=g).to(dtype)])


def _arguments(dtype):
    """x values paired with _degrees: the ends and middle of [-1, 1] (and [0, 1]), beyond it.
    No NaN x: for NaN x and degree >= 2 CPU returns an uninitialized variable (Math.h's
    `T r;` when the recurrence loop never runs), which no implementation can reproduce."""
    g = torch.Generator().manual_seed(2)
    fixed = [0.0, 1.0, -1.0, 0.5, 0.25, 2.0, -2.0, 0.3, 0.99, 1.5, math.inf, -0.5, 0.75, -0.99, 3.0, 0.0, 1.0, 0.5,
             -1.0, 0.1]
    return torch.cat([torch.tensor(fixed, dtype=dtype), torch.rand(200, generator=g, dtype=dtype) * 2 - 1,
                      torch.randn(100, generator=g, dtype=dtype)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomials_match_cpu(name, dtype):
    fn = getattr(torch.special, name)
    x, n = _arguments(dtype), _degrees(dtype)
    tol = LOWERINGS[getattr(aten, f"special_{name}").default].tests.tolerance_for(dtype)
    torch.testing.assert_close(on_pjrt(fn, x, n), fn(x, n), equal_nan=True, **tol)  # Tensor, Tensor
    for degree in (0, 1, 5, 12):  # Tensor, Scalar
        torch.testing.assert_close(on_pjrt(fn, x, degree), fn(x, degree), equal_nan=True, **tol)
    for value in (0.25, -1.0, 1.5):  # Scalar, Tensor
        torch.testing.assert_close(on_pjrt(fn, value, n), fn(value, n), equal_nan=True, **tol)


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomials_promote_as_cpu(name):
    fn = getattr(torch.special, name)
    cases = [(torch.linspace(-1, 1, 9), torch.arange(9)),  # float32 x, int64 n
             (torch.arange(-4, 5), torch.arange(9)),  # both integers: float32
             (torch.linspace(-1, 1, 9, dtype=torch.float64), torch.arange(9, dtype=torch.float32))]
    for x, n in cases:
        expected = fn(x, n)
        actual = on_pjrt(fn, x, n)
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected, equal_nan=True)


def test_hermite_beyond_cpus_degree_limit_is_nan():
    for dtype, limit in ((torch.float32, 128), (torch.float64, 512)):
        x = torch.full((3,), 0.5, dtype=dtype)
        n = torch.tensor([limit, limit + 1, 2 * limit], dtype=dtype)
        for name in ("hermite_polynomial_h", "hermite_polynomial_he"):
            fn = getattr(torch.special, name)
            torch.testing.assert_close(on_pjrt(fn, x, n), fn(x, n), equal_nan=True)


@pytest.mark.parametrize("name", ["bessel_j1", "modified_bessel_k0", "airy_ai"])
def test_special_half_is_rejected_as_on_cpu(name):
    fn = getattr(torch.special, name)
    x = torch.ones(3, dtype=torch.float16)
    with pytest.raises(NotImplementedError):
        fn(x)
    with pytest.raises(NotImplementedError):
        fn(x.to(DEV))


def test_special_out_and_noncontiguous():
    x = torch.linspace(-9, 9, 24, dtype=torch.float64).reshape(4, 6).t()
    for name in ("bessel_j1", "modified_bessel_i1"):
        fn = getattr(torch.special, name)
        out = torch.empty(0, dtype=torch.float64, device=DEV)
        with no_fallback():
            fn(x.to(DEV), out=out)
        torch.testing.assert_close(out.cpu(), fn(x))
    n = torch.arange(24.0, dtype=torch.float64).reshape(6, 4) % 7
    out = torch.empty(6, 4, dtype=torch.float64, device=DEV)
    with no_fallback():
        torch.special.hermite_polynomial_h(x.to(DEV) / 9, n.to(DEV), out=out)
    torch.testing.assert_close(out.cpu(), torch.special.hermite_polynomial_h(x / 9, n))
