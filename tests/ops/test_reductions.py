"""Reductions, scans, sorting and counting against CPU torch."""
import math
from builtins import min as builtins_min

import pytest
import torch

from tests.ops.harness import check

aten = torch.ops.aten
FLOATS = [torch.float32, torch.float64, torch.bfloat16]
INTS = [torch.int64, torch.int32, torch.uint8, torch.bool]
SHAPES = [(), (0,), (3, 4), (2, 0, 3)]


def make(shape, dtype, nan=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        if nan and x.numel() > 2:
            x.view(-1)[1] = math.nan
        return x
    lo = 0 if dtype == torch.uint8 else -5
    return torch.randint(lo, 6, shape, generator=g, dtype=dtype)


def distinct(shape, dtype=torch.float32, seed=0):
    """Values without ties (so sort-like ops have one right index)."""
    n = math.prod(shape)
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(n, generator=g) - n // 2).to(dtype).reshape(shape)


def dims_of(shape):
    nd = len(shape)
    return [None, []] + ([[0], [-1], [0, -1] if nd > 1 else [0]] if nd else [[0], [-1]])


# ------------------------------------------------------------------ sum / mean / prod
@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.complex64])
@pytest.mark.parametrize("shape", SHAPES)
def test_sum(dtype, shape):
    x = make(shape, dtype)
    tol = dict(atol=0.1, rtol=0.02) if dtype == torch.bfloat16 else {}
    check(aten.sum.default, x, **tol)
    for dim in dims_of(shape):
        for keepdim in (False, True):
            check(aten.sum.dim_IntList, x, dim, keepdim, **tol)
    check(aten.sum.dim_IntList, x, None, dtype=torch.float64)
    check(aten.sum.default, x, dtype=torch.int32 if not (dtype.is_floating_point or dtype.is_complex) else dtype)


@pytest.mark.parametrize("dtype", FLOATS + [torch.complex64])
@pytest.mark.parametrize("shape", SHAPES)
def test_mean_nansum_nanmean(dtype, shape):
    x = make(shape, dtype, nan=True)
    tol = dict(atol=0.05, rtol=0.02) if dtype == torch.bfloat16 else {}
    check(aten.mean.default, x, **tol)
    for dim in dims_of(shape):
        check(aten.mean.dim, x, dim, True, **tol)
        if not dtype.is_complex:
            check(aten.nansum.default, x, dim, False, **tol)
            check(aten.nanmean.default, x, dim, True, **tol)
    check(aten.mean.dim, make(shape, torch.int64), None, dtype=torch.float64)


def test_mean_rejects_integers():
    with pytest.raises(RuntimeError, match="mean"):
        check(aten.mean.default, torch.arange(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("shape", [(), (0,), (6,), (2, 3)])
def test_prod(dtype, shape):
    x = make(shape, dtype)
    check(aten.prod.default, x)
    if shape:
        check(aten.prod.dim_int, x, -1, True)
        check(aten.prod.dim_int, x, 0, dtype=torch.float64)


# ------------------------------------------------------------------ var / std
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("shape", [(), (3, 4), (0, 3)])
def test_var_std(dtype, shape):
    x = make(shape, dtype, seed=3)
    tol = dict(atol=0.05, rtol=0.05) if dtype == torch.bfloat16 else {}
    for op in (aten.var, aten.std):
        check(op.default, x, **tol)
        check(op.default, x, False, **tol)
        for dim in dims_of(shape)[::2]:
            check(op.dim, x, dim, True, False, **tol)
            for correction in (None, 0, 2.5):
                check(op.correction, x, dim, correction=correction, keepdim=True, **tol)
    for op in (aten.var_mean, aten.std_mean):
        check(op.default, x, **tol)
        check(op.dim, x, [-1] if shape else None, False, True, **tol)
        check(op.correction, x, None, correction=0, **tol)


# ------------------------------------------------------------------ min / max family
@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("shape", [(), (3, 4), (2, 3, 4)])
def test_min_max(dtype, shape):
    x = make(shape, dtype, nan=True)
    for op in (aten.max, aten.min):
        check(op.default, x)
        for dim in ([0, -1] if shape else [0, -1]):
            check(op.dim, x, dim, True)
            check(op.dim, x, dim)
    for op in (aten.amax, aten.amin):
        for dim in dims_of(shape):
            check(op.default, x, [] if dim is None else dim, True)
    check(aten.aminmax.default, x)
    check(aten.aminmax.default, x, keepdim=True)
    check(aten.aminmax.default, x, dim=-1, keepdim=True)
    if dtype == torch.bool:
        with pytest.raises(RuntimeError, match="bool"):
            check(aten.argmax.default, x)
        return
    for op in (aten.argmax, aten.argmin):
        check(op.default, x)
        check(op.default, x, None, True)
        check(op.default, x, -1, True)
        check(op.default, x, 0)


def test_min_max_ties_first_index():
    x = torch.tensor([[1., 3., 3., 1.], [2., 2., 2., 2.]])
    for op in (aten.max.dim, aten.min.dim):
        check(op, x, 1)
    check(aten.argmax.default, x)
    check(aten.argmin.default, x, 1)


def test_max_empty_raises():
    with pytest.raises(RuntimeError, match="numel"):
        check(aten.max.default, torch.empty(0))
    check(aten.amax.default, torch.empty(0, 3), [1])


# ------------------------------------------------------------------ all / any / count_nonzero
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.float32, torch.int64])
@pytest.mark.parametrize("shape", SHAPES)
def test_all_any(dtype, shape):
    x = make(shape, dtype)
    for op in (aten.all, aten.any):
        check(op.default, x)
        if shape:
            check(op.dim, x, -1, True)
        check(op.dims, x, None)
        for dim in dims_of(shape):
            check(op.dims, x, dim, True)
    check(aten.count_nonzero.default, x)
    if shape:
        check(aten.count_nonzero.default, x, -1)
        check(aten.count_nonzero.dim_IntList, x, list(range(len(shape))))


# ------------------------------------------------------------------ logsumexp / norms
def test_logsumexp_complex_principal_branch():
    """A complex input shifts by its largest real part (CPU): the imaginary part stays in (-pi, pi]."""
    x = torch.tensor([[-4.8270 - 7.5824j, 1.0 + 3.0j], [0.5 - 9.0j, 2.0 + 0.1j]], dtype=torch.complex128)
    for dim in ([0], [1], [0, 1]):
        check(aten.logsumexp.default, x, dim, False)
    check(aten.logsumexp.default, x[0, 0], [0], False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4)])
def test_logsumexp(dtype, shape):
    x = make(shape, dtype)
    for dim in dims_of(shape)[2:]:  # torch's own logsumexp fails for dim=[]
        check(aten.logsumexp.default, x, dim, True)
    if dtype.is_floating_point and shape == (3, 4):
        x[0] = -math.inf
        x[1, 0] = math.inf
        check(aten.logsumexp.default, x, [1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("ord", [2, 1, 0, 3.5, math.inf, -math.inf])
def test_vector_norm(dtype, ord):
    x = make((3, 4), dtype, seed=1)
    tol = dict(atol=0.05, rtol=0.05) if dtype == torch.bfloat16 else {}
    check(aten.linalg_vector_norm.default, x, ord, **tol)
    check(aten.linalg_vector_norm.default, x, ord, [-1], True, **tol)
    check(aten.norm.Scalar, x, ord, **tol)
    check(aten.norm.ScalarOpt_dim, x, ord, [0], **tol)
    if not dtype.is_complex:
        check(aten.linalg_vector_norm.default, x, ord, None, dtype=torch.float64)
        check(aten.norm.ScalarOpt_dim_dtype, x, ord, [1], False, dtype=torch.float64)
        check(aten.norm.ScalarOpt_dtype, x, None, dtype=torch.float64)
    check(aten.linalg_vector_norm.default, make((), dtype), ord, **tol)


# ------------------------------------------------------------------ scans
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bool, torch.complex64])
@pytest.mark.parametrize("shape", [(), (0,), (6,), (3, 4)])
def test_cumsum_cumprod(dtype, shape):
    x = make(shape, dtype)
    for dim in (0, -1):
        check(aten.cumsum.default, x, dim)
        check(aten.cumprod.default, x, dim)
    check(aten.cumsum.default, x, 0, dtype=torch.float64 if not dtype.is_complex else torch.complex128)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5)])
def test_cummax_cummin(dtype, shape):
    x = make(shape, dtype, nan=True)
    if dtype == torch.float32 and len(shape) == 2:
        x[1] = torch.tensor([1., 1., math.nan, 2., math.nan])  # ties and repeated NaN
    for dim in (0, -1):
        check(aten.cummax.default, x, dim)
        check(aten.cummin.default, x, dim)


@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5)])
def test_logcumsumexp(shape):
    x = make(shape, torch.float64)
    for dim in (0, -1):
        check(aten.logcumsumexp.default, x, dim)
    if shape == (7,):
        x[2] = -math.inf
        check(aten.logcumsumexp.default, x, 0)


# ------------------------------------------------------------------ sorting
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int16, torch.uint8, torch.bool])
@pytest.mark.parametrize("shape", [(), (0,), (9,), (4, 6), (2, 3, 5)])
def test_sort_argsort(dtype, shape):
    x = make(shape, dtype, nan=True)  # ties included: stable sort has one right answer
    if dtype.is_floating_point and x.numel() > 4:
        x.view(-1)[3] = -0.0
        x.view(-1)[4] = math.nan
    for dim in (0, -1):
        for desc in (False, True):
            check(aten.sort.stable, x, stable=True, dim=dim, descending=desc)
            check(aten.argsort.stable, x, stable=True, dim=dim, descending=desc)
    dx = distinct(shape, torch.float32 if dtype == torch.bool else dtype) if dtype != torch.uint8 else x
    check(aten.sort.default, dx, -1, True)
    check(aten.argsort.default, dx, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("shape", [(), (9,), (4, 6)])
def test_topk_kthvalue(dtype, shape):
    x = distinct(shape, dtype)
    n = shape[-1] if shape else 1
    for k in {0, 1, n // 2, n}:
        check(aten.topk.default, x, k)
        check(aten.topk.default, x, builtins_min(k, shape[0] if shape else 1), 0 if shape else -1, False)
    for k in {1, (n + 1) // 2, n}:
        check(aten.kthvalue.default, x, k)
        check(aten.kthvalue.default, x, k, -1, True)


def test_topk_nan_is_largest():
    x = torch.tensor([1., math.nan, 3., -1.])
    check(aten.topk.default, x, 2)
    check(aten.topk.default, x, 2, 0, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 4), (2, 3, 5)])
def test_median(dtype, shape):
    x = distinct(shape, dtype)
    check(aten.median.default, x)
    check(aten.nanmedian.default, x)
    for dim in (0, -1):
        for keepdim in (False, True):
            check(aten.median.dim, x, dim, keepdim)
            check(aten.nanmedian.dim, x, dim, keepdim)


def test_median_nan():
    # one NaN per row: which of several NaNs torch reports is up to its nth_element
    x = torch.tensor([[1., math.nan, 2., 4., 0.], [3., 4., 5., 6., 7.], [1., 2., 9., 3., math.nan]])
    for op in (aten.median.dim, aten.nanmedian.dim):
        check(op, x, 1)
        check(op, x.T.contiguous(), 0, True)
    check(aten.median.default, x)
    check(aten.nanmedian.default, x)
    check(aten.nanmedian.default, x[1:3])
    check(aten.nanmedian.default, torch.full((3,), math.nan))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(), (1,), (9,), (4, 7)])
def test_mode(dtype, shape):
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 3, shape, generator=g).to(dtype)
    check(aten.mode.default, x)
    if shape:
        check(aten.mode.default, x, 0, True)


# ------------------------------------------------------------------ searching / counting
@pytest.mark.parametrize("invert", [False, True])
def test_isin(invert):
    """Compared in the promoted dtype (NaN matches nothing), every variant; past 2**22 pairs the
    lowering sorts the test elements and searches them instead of comparing every pair."""
    elements = torch.tensor([[1.0, 2.0, math.nan], [4.0, -0.0, 7.5]])
    check(aten.isin.Tensor_Tensor, elements, torch.tensor([2, 4, 0]), invert=invert)
    check(aten.isin.Tensor_Tensor, elements, torch.tensor([math.nan, 7.5], dtype=torch.float64), invert=invert)
    check(aten.isin.Tensor_Tensor, torch.arange(5, dtype=torch.uint8), torch.tensor([300, 3]), invert=invert)
    check(aten.isin.Tensor_Tensor, torch.arange(4), torch.tensor([], dtype=torch.int64), invert=invert)
    check(aten.isin.Tensor_Scalar, elements, 4, invert=invert)
    check(aten.isin.Scalar_Tensor, 7.5, elements, invert=invert)
    many = torch.randint(-3000, 3000, (4000,), generator=torch.Generator().manual_seed(0))
    check(aten.isin.Tensor_Tensor, many, torch.arange(0, 9000, 7), invert=invert)  # 4000 x 1286 pairs: sorted


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_searchsorted_bucketize(dtype):
    seq = torch.tensor([1, 3, 3, 5, 7], dtype=dtype)
    vals = torch.tensor([[0, 3, 4], [7, 8, 5]], dtype=dtype)
    for right in (False, True):
        check(aten.searchsorted.Tensor, seq, vals, right=right)
        check(aten.searchsorted.Tensor, seq, vals, out_int32=True, side="right" if right else "left")
        check(aten.searchsorted.Scalar, seq, 3, right=right)
        check(aten.bucketize.Tensor, vals, seq, right=right)
        check(aten.bucketize.Tensor, vals, seq, out_int32=True, right=right)
        check(aten.bucketize.Scalar, 4, seq, right=right)
    nd = torch.sort(make((2, 3, 6), dtype, seed=2), -1).values
    check(aten.searchsorted.Tensor, nd, make((2, 3, 4), dtype, seed=4), right=True)
    unsorted = torch.tensor([5, 1, 7, 3], dtype=dtype)
    check(aten.searchsorted.Tensor, unsorted, vals, sorter=torch.argsort(unsorted))
    check(aten.searchsorted.Tensor, seq.to(torch.float64), vals)  # mixed dtypes promote
    check(aten.searchsorted.Scalar, seq, 2.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histc(dtype):
    x = make((50,), dtype)
    check(aten.histc.default, x)
    check(aten.histc.default, make((50,), dtype, nan=True), 7, -1, 1)  # NaN is outside every bin
    check(aten.histc.default, x, 5, 0.5, 0.5)
    check(aten.histc.default, torch.tensor([1., 2., 3.], dtype=dtype), 4, 1, 3)  # max lands in the last bin
    check(aten.histc.default, torch.full((4,), 2., dtype=dtype), 3)  # a single value widens by one


def test_bincount():
    x = torch.tensor([0, 3, 3, 1, 7])
    check(aten.bincount.default, x)
    check(aten.bincount.default, x, None, 10)
    check(aten.bincount.default, x, torch.rand(5))
    check(aten.bincount.default, x, torch.rand(5, dtype=torch.float64))
    check(aten.bincount.default, x, torch.arange(5))
    check(aten.bincount.default, torch.empty(0, dtype=torch.int64), None, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unique(dtype):
    x = torch.tensor([[3, 1, 2], [1, 3, 3]]).to(dtype)
    for inv in (False, True):
        for counts in (False, True):
            check(aten._unique2.default, x, True, inv, counts)
            check(aten.unique_consecutive.default, x, inv, counts)
            check(aten.unique_consecutive.default, x, inv, counts, 1)
    rows = torch.tensor([[1, 2], [0, 5], [1, 2], [0, 5], [0, 1]]).to(dtype)
    check(aten.unique_dim.default, rows, 0, True, True, True)
    check(aten.unique_dim.default, rows, 1, True, True, True)
    check(aten.unique_consecutive.default, torch.tensor([1, 1, 2, 2, 3, 1, 1, 2]).to(dtype), True, True)
    check(aten.unique_consecutive.default, rows, True, True, 0)
    check(aten._unique2.default, torch.empty(0).to(dtype), True, True, True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_std_half_rounds_once(dtype):
    """std of a half type is sqrt(var) in float32, rounded once (CPU), not sqrt of a rounded var."""
    x = (torch.randn(40, 5, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    exact = dict(atol=0, rtol=0)
    check(aten.std.correction, x, [1], correction=1, **exact)
    check(aten.std_mean.correction, x, [0], correction=0, **exact)
