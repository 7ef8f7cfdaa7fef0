"""Lowerings: reductions family (reductions, scans, sorting, counting).

Dims are normalised once, by views.wrap_dim / wrap_dims (None or [] reduces every dim).
Integer and bool sums/products accumulate in int64 as torch does; float16/bfloat16
statistics are computed in float32 and cast back, like torch's CPU accumulate type.
Ops whose output shape depends on the data (unique*, bincount) are registered with
jit=False and run on concrete arrays. Lowerings are named after their ops, so `sum`,
`min`, `max`, `all`, `any` shadow the builtins here: use `builtins.X` for those.
"""
from __future__ import annotations
import builtins
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from ..dtypes import to_jax
from .promotion import cast, default_float, promote, require_dtype
from .registry import family, Padding, reduction
from .views import wrap_dim, wrap_dims


def _reduced_dims(dims, ndim: int) -> tuple:
    """views.wrap_dims, with CPU's limit on reductions over given dims: its dim mask is a 64-bit
    set, so a tensor of more dims raises (XLA reduces it)."""
    _at_most_64_dims(dims, ndim)
    return wrap_dims(dims, ndim)


def _at_most_64_dims(dims, ndim: int) -> None:
    if ndim > 64 and dims is not None and (isinstance(dims, int) or len(dims)):
        raise RuntimeError("only tensors with up to 64 dims are supported")


lowering = family(not_paddable="no padding rule yet: it orders or scans the elements of a possibly padded dim")

aten = torch.ops.aten
INT64 = jnp.int64


# --------------------------------------------------------------------------- helpers
def is_integral(dtype, include_bool=True) -> bool:
    dt = np.dtype(dtype)
    return dt.kind in "iu" or (include_bool and dt.kind == "b")


def is_floating(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def is_low_precision(dtype) -> bool:
    return np.dtype(dtype) in (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def real_dtype(dtype):
    return jnp.finfo(dtype).dtype if jnp.issubdtype(dtype, jnp.complexfloating) else np.dtype(dtype)


def isnan(x):
    """NaN test that is all-False for integer and bool arrays."""
    return jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.zeros(x.shape, jnp.bool_)


def accumulate_dtype(x, dtype):
    """The result dtype of a sum/prod/cumsum: `dtype` if given, int64 for ints and bools."""
    if dtype is not None:
        return to_jax(dtype)
    return np.dtype(INT64) if is_integral(x.dtype) else np.dtype(x.dtype)


def accumulate(fn, x, dtype, **kwargs):
    """fn(x, **kwargs) in the dtype torch's CPU kernels accumulate in (float32 for float16 and
    bfloat16 results, rounded once at the end), cast to the result dtype. CPU first converts the
    input to the result dtype: sum(float32 x, dtype=float16) rounds each element to float16."""
    out = accumulate_dtype(x, dtype)
    x = x.astype(out)
    return fn(x.astype(jnp.float32) if is_low_precision(out) else x, **kwargs).astype(out)


def numel_over(x, axes) -> int:
    return math.prod(x.shape[a] for a in axes)


def keep_all(x, ndim):
    """A full reduction with keepdim=True keeps every dim as size 1."""
    return x.reshape((1,) * ndim)


def along(x, dim):
    """An int64 iota along `dim` of x's shape (the index of each element in that dim)."""
    return jax.lax.broadcasted_iota(INT64, x.shape, dim)


def require_float(name, x):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(f"{name}(): input dtype should be either floating point or complex dtypes. "
                           f"Got {np.dtype(x.dtype).name} instead.")


# --------------------------------------------------------------------------- sum / mean / prod
@lowering(aten.sum.default, padding=reduction("zero"), computes_in_out_dtype=True)
def sum(self, *, dtype=None):  # noqa: A001 (named after the op)
    return accumulate(jnp.sum, self, dtype)


@lowering(aten.sum.dim_IntList, padding=reduction("zero"), computes_in_out_dtype=True)
def sum_dim(self, dim, keepdim=False, *, dtype=None):
    return accumulate(jnp.sum, self, dtype, axis=_reduced_dims(dim, self.ndim), keepdims=keepdim)


@lowering(aten.nansum.default, computes_in_out_dtype=True)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
    if jnp.issubdtype(self.dtype, jnp.inexact) and (jnp.issubdtype(self.dtype, jnp.complexfloating)
                                                   or dtype is not None and dtype.is_complex):
        # CPU and CUDA have no complex nansum (an integer input is summed as sum does; out='s dtype is
        # the dtype): CPU names the error
        raise NotImplementedError(f"nansum of {self.dtype} in {dtype}: no complex nansum")
    x = jnp.where(isnan(self), jnp.zeros((), self.dtype), self)
    return sum_dim(x, dim, keepdim, dtype=dtype)


def _mean_input(name, self, dtype):
    x = self if dtype is None else self.astype(to_jax(dtype))
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(f"{name}(): could not infer output dtype. Input dtype must be either a floating point "
                           f"or complex dtype. Got: {np.dtype(x.dtype).name}")
    return x


@lowering(aten.mean.default, padding=Padding("mean"), computes_in_out_dtype=True)
def mean(self, *, dtype=None):
    x = _mean_input("mean", self, dtype)
    return accumulate(jnp.mean, x, None)


@lowering(aten.mean.dim, padding=Padding("mean"), computes_in_out_dtype=True)
def mean_dim(self, dim, keepdim=False, *, dtype=None):
    x = _mean_input("mean", self, dtype)
    return accumulate(jnp.mean, x, None, axis=_reduced_dims(dim, x.ndim), keepdims=keepdim)


@lowering(aten.nanmean.default, computes_in_out_dtype=True)
def nanmean(self, dim=None, keepdim=False, *, dtype=None):
    x = _mean_input("nanmean", self, dtype)
    axes = _reduced_dims(dim, x.ndim)
    count = jnp.sum(~isnan(x), axis=axes, keepdims=keepdim)
    return (nansum(x, dim, keepdim) / count).astype(x.dtype)


@lowering(aten.prod.default, padding=reduction("one"), computes_in_out_dtype=True)
def prod(self, *, dtype=None):
    return accumulate(jnp.prod, self, dtype)


@lowering(aten.prod.dim_int, padding=reduction("one"), computes_in_out_dtype=True)
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    axes = _reduced_dims([dim], self.ndim)
    return accumulate(jnp.prod, self, dtype, axis=axes, keepdims=keepdim)


# --------------------------------------------------------------------------- var / std
def var_and_mean(x, dim, correction, keepdim, root=False):
    """(var, mean) with torch's divisor max(N - correction, 0); correction None means 1.
    root: (std, mean), the square root taken before rounding to a half type, as CPU does."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError("std and var only support floating point and complex dtypes")
    out_dtype = x.dtype
    xc = x.astype(jnp.float32) if is_low_precision(x.dtype) else x
    axes = _reduced_dims(dim, x.ndim)
    m = jnp.mean(xc, axis=axes, keepdims=True)
    correction = 1 if correction is None else correction
    divisor = jnp.maximum(numel_over(x, axes) - correction, 0)

    def real_var(d):
        return jnp.sum(d * d, axis=axes, keepdims=keepdim) / divisor

    d = xc - m
    # torch adds the variances of the real and imaginary parts (so a zero divisor gives
    # inf + 0/0 = nan for a real-valued complex input, exactly as torch)
    var = real_var(d.real) + real_var(d.imag) if jnp.iscomplexobj(d) else real_var(d)
    var = (jnp.sqrt(var) if root else var).astype(real_dtype(out_dtype))
    m = m if keepdim else jnp.squeeze(m, axes)
    return var, m.astype(out_dtype)


@lowering(aten.var.default)
def var(self, unbiased=True):
    return var_and_mean(self, None, int(unbiased), False)[0]


@lowering(aten.var.dim)
def var_dim(self, dim, unbiased=True, keepdim=False):
    return var_and_mean(self, dim, int(unbiased), keepdim)[0]


@lowering(aten.var.correction, padding=Padding("var"))
def var_correction(self, dim=None, *, correction=None, keepdim=False):
    return var_and_mean(self, dim, correction, keepdim)[0]


@lowering(aten.std.default)
def std(self, unbiased=True):
    return var_and_mean(self, None, int(unbiased), False, root=True)[0]


@lowering(aten.std.dim)
def std_dim(self, dim, unbiased=True, keepdim=False):
    return var_and_mean(self, dim, int(unbiased), keepdim, root=True)[0]


@lowering(aten.std.correction, padding=Padding("var"))
def std_correction(self, dim=None, *, correction=None, keepdim=False):
    return var_and_mean(self, dim, correction, keepdim, root=True)[0]


@lowering(aten.var_mean.default)
def var_mean(self, unbiased=True):
    return var_and_mean(self, None, int(unbiased), False)


@lowering(aten.var_mean.dim)
def var_mean_dim(self, dim, unbiased=True, keepdim=False):
    return var_and_mean(self, dim, int(unbiased), keepdim)


@lowering(aten.var_mean.correction, padding=Padding("var"))
def var_mean_correction(self, dim=None, *, correction=None, keepdim=False):
    return var_and_mean(self, dim, correction, keepdim)


@lowering(aten.std_mean.default)
def std_mean(self, unbiased=True):
    return var_and_mean(self, None, int(unbiased), False, root=True)


@lowering(aten.std_mean.dim)
def std_mean_dim(self, dim, unbiased=True, keepdim=False):
    return var_and_mean(self, dim, int(unbiased), keepdim, root=True)


@lowering(aten.std_mean.correction)
def std_mean_correction(self, dim=None, *, correction=None, keepdim=False):
    return var_and_mean(self, dim, correction, keepdim, root=True)


# --------------------------------------------------------------------------- min / max / arg*
def _nonempty(name, x, axes=None):
    axes = range(x.ndim) if axes is None else axes
    if x.size == 0 and (not axes or builtins.any(x.shape[a] == 0 for a in axes) or x.ndim == 0):
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                         f"Specify the reduction dim with the 'dim' argument.")


@lowering(aten.max.default, padding=reduction("low"))
def max(self):  # noqa: A001
    _nonempty("max", self)
    return jnp.max(self)


@lowering(aten.min.default, padding=reduction("high"))
def min(self):  # noqa: A001
    _nonempty("min", self)
    return jnp.min(self)


def _value_index(reduce, arg, self, dim, keepdim):
    _at_most_64_dims(dim, self.ndim)
    dim = wrap_dim(dim, self.ndim)
    if self.ndim == 0:
        return self, jnp.zeros((), INT64)
    if self.shape[dim] == 0:
        raise IndexError(f"Expected reduction dim {dim} to have non-zero size.")
    return reduce(self, axis=dim, keepdims=keepdim), arg(self, axis=dim, keepdims=keepdim).astype(INT64)


@lowering(aten.max.dim, padding=reduction("low"))
def max_dim(self, dim, keepdim=False):
    return _value_index(jnp.max, jnp.argmax, self, dim, keepdim)  # argmax takes the first NaN, as torch


@lowering(aten.min.dim, padding=reduction("high"))
def min_dim(self, dim, keepdim=False):
    return _value_index(jnp.min, jnp.argmin, self, dim, keepdim)


@lowering(aten.amax.default, padding=reduction("low"))
def amax(self, dim=(), keepdim=False):
    axes = _reduced_dims(dim, self.ndim)
    _nonempty("amax", self, axes)
    return jnp.max(self, axis=axes, keepdims=keepdim)


@lowering(aten.amin.default, padding=reduction("high"))
def amin(self, dim=(), keepdim=False):
    axes = _reduced_dims(dim, self.ndim)
    _nonempty("amin", self, axes)
    return jnp.min(self, axis=axes, keepdims=keepdim)


@lowering(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
    if dim is None:
        lo, hi = min(self), max(self)
        return (keep_all(lo, self.ndim), keep_all(hi, self.ndim)) if keepdim else (lo, hi)
    return amin(self, [dim], keepdim), amax(self, [dim], keepdim)


def _arg(fn, self, dim, keepdim):
    if self.dtype == jnp.bool_:
        raise RuntimeError(f"{fn.__name__}(): does not support bool input")
    if dim is None:
        _nonempty(fn.__name__, self)
        out = fn(self.reshape(-1)).astype(INT64)
        return keep_all(out, self.ndim) if keepdim else out
    return _value_index(jnp.max, fn, self, dim, keepdim)[1]


@lowering(aten.argmax.default, padding=reduction("low"))
def argmax(self, dim=None, keepdim=False):
    return _arg(jnp.argmax, self, dim, keepdim)


@lowering(aten.argmin.default, padding=reduction("high"))
def argmin(self, dim=None, keepdim=False):
    return _arg(jnp.argmin, self, dim, keepdim)


# --------------------------------------------------------------------------- all / any
def _logical_reduce(fn, self, dim, keepdim):
    # unlike the other reductions, all/any.dims with dim=[] reduce nothing
    axes = () if dim is not None and len(dim) == 0 else _reduced_dims(dim, self.ndim)
    out = fn(self, axis=axes, keepdims=keepdim)
    return out.astype(jnp.uint8) if self.dtype == jnp.uint8 else out  # torch keeps uint8 for uint8


@lowering(aten.all.default, padding=reduction("one"))
def all(self):  # noqa: A001
    return _logical_reduce(jnp.all, self, None, False)


@lowering(aten.all.dim, padding=reduction("one"))
def all_dim(self, dim, keepdim=False):
    return _logical_reduce(jnp.all, self, [dim], keepdim)


@lowering(aten.all.dims, padding=reduction("one"))
def all_dims(self, dim=None, keepdim=False):
    return _logical_reduce(jnp.all, self, dim, keepdim)


@lowering(aten.any.default, padding=reduction("zero"))
def any(self):  # noqa: A001
    return _logical_reduce(jnp.any, self, None, False)


@lowering(aten.any.dim, padding=reduction("zero"))
def any_dim(self, dim, keepdim=False):
    return _logical_reduce(jnp.any, self, [dim], keepdim)


@lowering(aten.any.dims, padding=reduction("zero"))
def any_dims(self, dim=None, keepdim=False):
    return _logical_reduce(jnp.any, self, dim, keepdim)


@lowering(aten.count_nonzero.default)
def count_nonzero(self, dim=None):
    return jnp.sum(self != 0, axis=_reduced_dims(dim, self.ndim), dtype=INT64)


@lowering(aten.count_nonzero.dim_IntList)
def count_nonzero_dims(self, dim):
    return jnp.sum(self != 0, axis=_reduced_dims(dim, self.ndim), dtype=INT64)


# --------------------------------------------------------------------------- logsumexp / norms
@lowering(aten.logsumexp.default, padding=reduction("low"))
def logsumexp(self, dim, keepdim=False):
    x = self.astype(default_float()) if is_integral(self.dtype) else self
    axes = _reduced_dims(dim, x.ndim)
    # a complex input shifts by its largest real part, as CPU does: the log's imaginary part
    # then stays in (-pi, pi]
    m = jnp.max(x.real if jnp.iscomplexobj(x) else x, axis=axes, keepdims=True, initial=-jnp.inf)
    m = jnp.where(jnp.isinf(m), jnp.zeros((), m.dtype), m)  # all -inf or an inf: no shift
    out = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, axes)


def vector_norm(x, ord, dim, keepdim, dtype):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. "
                           f"Got {np.dtype(x.dtype).name}")
    if dtype is not None:
        x = x.astype(to_jax(dtype))
    out_dtype = real_dtype(x.dtype)
    a = jnp.abs(x)
    a = a.astype(jnp.float32) if is_low_precision(a.dtype) else a
    axes = _reduced_dims(dim, x.ndim)
    ord = float(ord)
    if ord == math.inf:
        _nonempty("linalg.vector_norm", x, axes)
        r = jnp.max(a, axis=axes, keepdims=keepdim)
    elif ord == -math.inf:
        _nonempty("linalg.vector_norm", x, axes)
        r = jnp.min(a, axis=axes, keepdims=keepdim)
    elif ord == 0:
        r = jnp.sum(a != 0, axis=axes, keepdims=keepdim).astype(a.dtype)
    elif ord == 1:
        r = jnp.sum(a, axis=axes, keepdims=keepdim)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    else:
        r = jnp.sum(a ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)
    return r.astype(out_dtype)


@lowering(aten.linalg_vector_norm.default, static=("ord",))
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    return vector_norm(self, ord, dim, keepdim, dtype)


@lowering(aten.norm.Scalar, static=("p",))
def norm(self, p=2):
    return vector_norm(self, p, None, False, None)


@lowering(aten.norm.ScalarOpt_dim, static=("p",))
def norm_dim(self, p, dim, keepdim=False):
    return vector_norm(self, 2 if p is None else p, dim, keepdim, None)


@lowering(aten.norm.ScalarOpt_dim_dtype, static=("p",))
def norm_dim_dtype(self, p, dim, keepdim, *, dtype):
    return vector_norm(self, 2 if p is None else p, dim, keepdim, dtype)


@lowering(aten.norm.ScalarOpt_dtype, static=("p",))
def norm_dtype(self, p, *, dtype):
    return vector_norm(self, 2 if p is None else p, None, False, dtype)


# --------------------------------------------------------------------------- scans
def _scan(fn, x, dim):
    """Apply an axis scan; a 0-d tensor scans as one element."""
    dim = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return fn(x.reshape(1), 0).reshape(())
    return fn(x, dim)


@lowering(aten.cumsum.default, padding=Padding("cumulative"), computes_in_out_dtype=True)
def cumsum(self, dim, *, dtype=None):
    return accumulate(lambda x: _scan(lambda a, d: jnp.cumsum(a, axis=d, dtype=a.dtype), x, dim), self, dtype)


@lowering(aten.cumprod.default, padding=Padding("cumulative"), computes_in_out_dtype=True)
def cumprod(self, dim, *, dtype=None):
    return accumulate(lambda x: _scan(lambda a, d: jnp.cumprod(a, axis=d, dtype=a.dtype), x, dim), self, dtype)


@lowering(aten.logcumsumexp.default)
def logcumsumexp(self, dim):
    return _scan(lambda a, d: jax.lax.cumlogsumexp(a, axis=d), self, dim)


def _cum_extreme(better):
    """cummax/cummin as an associative scan over (value, index) pairs.

    torch's rule, element by element: take the new element if it is NaN, or if the running
    value is not NaN and `better(new, running)` (>= for max, <= for min, so ties take the
    latest index). Combining two scanned segments by the same rule is associative.
    """

    def combine(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = isnan(bv) | (~isnan(av) & better(bv, av))
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    def scan(x, dim):
        return jax.lax.associative_scan(combine, (x, along(x, dim)), axis=dim)

    return scan


def _cum_values_indices(self, dim, better):
    dim = wrap_dim(dim, self.ndim)
    if self.ndim == 0:
        return self, jnp.zeros((), INT64)
    if self.size == 0:
        return self, jnp.zeros(self.shape, INT64)
    return _cum_extreme(better)(self, dim)


@lowering(aten.cummax.default)
def cummax(self, dim):
    return _cum_values_indices(self, dim, jnp.greater_equal)


@lowering(aten.cummin.default)
def cummin(self, dim):
    return _cum_values_indices(self, dim, jnp.less_equal)


# --------------------------------------------------------------------------- sorting
def sort_along(x, dim, descending):
    """Stable sort with indices; NaN sorts as the largest value (XLA's total order, as torch)."""
    if x.ndim == 0:
        return x, jnp.zeros((), INT64)
    keys = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    if not descending:
        v, i = jax.lax.sort((keys, along(x, dim)), dimension=dim, is_stable=True, num_keys=1)
        return v.astype(x.dtype), i
    # stable descending: sort the reversed input ascending, then reverse back; equal
    # elements end up in their original order.
    n = x.shape[dim]
    v, i = jax.lax.sort((jnp.flip(keys, dim), along(x, dim)), dimension=dim, is_stable=True, num_keys=1)
    return jnp.flip(v, dim).astype(x.dtype), (n - 1) - jnp.flip(i, dim)


@lowering(aten.sort.default)
def sort(self, dim=-1, descending=False):
    return sort_along(self, wrap_dim(dim, self.ndim), descending)


@lowering(aten.sort.stable)
def sort_stable(self, *, stable, dim=-1, descending=False):
    return sort_along(self, wrap_dim(dim, self.ndim), descending)


@lowering(aten.argsort.default)
def argsort(self, dim=-1, descending=False):
    return sort_along(self, wrap_dim(dim, self.ndim), descending)[1]


@lowering(aten.argsort.stable)
def argsort_stable(self, *, stable, dim=-1, descending=False):
    return sort_along(self, wrap_dim(dim, self.ndim), descending)[1]


@lowering(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    dim = wrap_dim(dim, self.ndim)
    n = self.shape[dim] if self.ndim else 1
    if not 0 <= k <= n:
        raise RuntimeError(f"selected index k out of range")
    v, i = sort_along(self, dim, descending=largest)
    if self.ndim == 0:
        return v, i
    return jax.lax.slice_in_dim(v, 0, k, axis=dim), jax.lax.slice_in_dim(i, 0, k, axis=dim)


def _pick(x, dim, k, keepdim):
    """Element k (static int or traced array of shape x.shape minus dim) along dim."""
    if isinstance(k, int):
        return jax.lax.index_in_dim(x, k, axis=dim, keepdims=keepdim)
    out = jnp.take_along_axis(x, jnp.expand_dims(k, dim), axis=dim)
    return out if keepdim else jnp.squeeze(out, dim)


def _kth_in_range(values) -> bool:
    self, k, dim = values[0], values[1], values[2]
    shape = tuple(self.shape)
    return 1 <= k <= (shape[dim % len(shape)] if shape else 1)


@lowering(aten.kthvalue.default, traced=("k",), in_range=_kth_in_range)
def kthvalue(self, k, dim=-1, keepdim=False):
    """`k` is traced (a new k compiles nothing): its range is checked on the host (in_range)."""
    dim = wrap_dim(dim, self.ndim)
    n = self.shape[dim] if self.ndim else 1
    if isinstance(k, int) and not 1 <= k <= n:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim}")
    if self.ndim == 0:
        return self, jnp.zeros((), INT64)
    v, i = sort_along(self, dim, False)
    if not isinstance(k, int):
        pick = functools.partial(jax.lax.dynamic_index_in_dim, index=k - 1, axis=dim, keepdims=keepdim)
        return pick(v), pick(i)
    return _pick(v, dim, k - 1, keepdim), _pick(i, dim, k - 1, keepdim)


def _median(self, dim, keepdim, ignore_nan):
    if self.ndim == 0:
        return self, jnp.zeros((), INT64)
    if self.shape[dim] == 0:
        raise IndexError(f"median(): Expected reduction dim {dim} to have non-zero size.")
    v, i = sort_along(self, dim, False)  # NaNs sort last, keeping their order
    if ignore_nan:
        count = jnp.sum(~isnan(self), axis=dim)
        k = jnp.maximum((count - 1) // 2, 0)  # all NaN: element 0, the first NaN
        return _pick(v, dim, k, keepdim), _pick(i, dim, k, keepdim)
    # any NaN makes the median NaN, at the first NaN's index: the first slot after the numbers
    k = (self.shape[dim] - 1) // 2
    count = jnp.sum(~isnan(self), axis=dim)
    k = jnp.where(count < self.shape[dim], count, k)
    return _pick(v, dim, k, keepdim), _pick(i, dim, k, keepdim)


@lowering(aten.median.default)
def median(self):
    if self.size == 0:
        return jnp.full((), jnp.nan, self.dtype)
    return _median(self.reshape(-1), 0, False, False)[0]


@lowering(aten.nanmedian.default)
def nanmedian(self):
    if self.size == 0:
        return jnp.full((), jnp.nan, self.dtype)
    return _median(self.reshape(-1), 0, False, True)[0]


@lowering(aten.median.dim)
def median_dim(self, dim, keepdim=False):
    return _median(self, wrap_dim(dim, self.ndim), keepdim, False)


@lowering(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
    return _median(self, wrap_dim(dim, self.ndim), keepdim, True)


@lowering(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
    """The smallest most frequent value and the last index where it occurs (torch's CPU rule)."""
    dim = wrap_dim(dim, self.ndim)
    if self.ndim == 0:
        return self, jnp.zeros((), INT64)
    if self.shape[dim] == 0:
        raise IndexError(f"mode(): Expected reduction dim {dim} to have non-zero size.")
    v, i = sort_along(self, dim, False)  # equal values adjacent, their indices ascending
    pos = along(v, dim)
    prev = jnp.concatenate([jax.lax.slice_in_dim(v, 0, 1, axis=dim),
                            jax.lax.slice_in_dim(v, 0, v.shape[dim] - 1, axis=dim)], axis=dim)
    starts = (pos == 0) | (v != prev)
    run_start = jax.lax.cummax(jnp.where(starts, pos, 0), axis=dim)
    run_len = pos - run_start + 1  # peaks at each run's last element
    best = jnp.argmax(run_len, axis=dim)  # first run with the highest count: the smallest value
    return _pick(v, dim, best, keepdim), _pick(i, dim, best, keepdim)


# --------------------------------------------------------------------------- equal (a Python bool)
@jax.jit
def _all_equal(a, b):
    compute, _ = promote(a, b)
    return jnp.all(cast(a, compute) == cast(b, compute))


@lowering(aten.equal.default, jit=False)
def equal(self, other):
    """A Python bool, as on CPU: False for different shapes (no broadcasting), else whether
    every element is equal after type promotion (NaN is unequal to itself, even in one tensor)."""
    if tuple(self.shape) != tuple(other.shape):
        return False
    return bool(_all_equal(self, other))


# --------------------------------------------------------------------------- searching / counting
def _searchsorted(seq, values, side, sorter, out_int32):
    out_dtype = jnp.int32 if out_int32 else INT64
    compute, _ = promote(seq, values)
    seq, values = cast(seq, compute), cast(values, compute)
    if sorter is not None:
        require_dtype(sorter, (np.int64,), RuntimeError, "torch.searchsorted(): sorter must be a tensor of long dtype but got dtype {}")
        seq = jnp.take_along_axis(seq, sorter.astype(INT64), axis=-1)
    if seq.ndim <= 1:
        return jnp.searchsorted(seq.reshape(-1), values, side=side).astype(out_dtype)
    lead = seq.shape[:-1]
    flat_seq = seq.reshape(-1, seq.shape[-1])
    flat_values = values.reshape(flat_seq.shape[0], -1)
    out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(flat_seq, flat_values)
    return out.reshape(*lead, values.shape[-1]).astype(out_dtype)


def _side(right, side):
    if side is not None:
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                               "while right was True")
        return side
    return "right" if right else "left"


@lowering(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(sorted_sequence, self, _side(right, side), sorter, out_int32)


@lowering(aten.searchsorted.Scalar)
def searchsorted_scalar(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(sorted_sequence, jnp.asarray(self), _side(right, side), sorter, out_int32).reshape(())


@lowering(aten.bucketize.Tensor)
def bucketize(self, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, self, "right" if right else "left", None, out_int32)


@lowering(aten.bucketize.Scalar)
def bucketize_scalar(self, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, jnp.asarray(self), "right" if right else "left", None, out_int32).reshape(())


_ISIN_BROADCAST = 1 << 22  # elements x test elements compared at once; past it, a sort and binary search


def _isin(elements, test_elements, invert):
    """Whether each element equals one of the test elements, compared in their promoted dtype
    (NaN matches nothing), as CPU's isin; the result has the elements' shape."""
    compute, _ = promote(elements, test_elements)
    shape = jnp.shape(elements)
    e, t = cast(elements, compute).reshape(-1), cast(test_elements, compute).reshape(-1)
    if t.size == 0:
        found = jnp.zeros(e.shape, bool)
    elif e.size * t.size <= _ISIN_BROADCAST:
        found = jnp.any(e[:, None] == t[None, :], axis=1)
    else:
        ordered = jnp.sort(t)
        found = ordered[jnp.clip(jnp.searchsorted(ordered, e), 0, t.size - 1)] == e
    return (found != invert).reshape(shape)


@lowering(aten.isin.Tensor_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    return _isin(elements, test_elements, invert)


@lowering(aten.isin.Tensor_Scalar)
def isin_tensor_scalar(elements, test_element, *, assume_unique=False, invert=False):
    return _isin(elements, test_element, invert)


@lowering(aten.isin.Scalar_Tensor)
def isin_scalar_tensor(element, test_elements, *, assume_unique=False, invert=False):
    return _isin(element, test_elements, invert)


def _histc_range_as_cpu(values) -> bool:
    """CPU and CUDA refuse a range that is not finite or whose max is below its min. With
    min == max the range is the data's, read on the host as CUDA reads it (a sync only then)."""
    self, _, low, high = values
    if low == high and self.numel() and self.dtype.is_floating_point:
        low, high = (v.item() for v in torch.aminmax(self))
    return math.isfinite(low) and math.isfinite(high) and low <= high


@lowering(aten.histc.default, in_range=_histc_range_as_cpu)
def histc(self, bins=100, min=0, max=0):  # noqa: A002
    """Floats as torch's CPU kernel; integers as CUDA's (CPU refuses them, and transformers'
    MoE routing calls histc on int32 on every accelerator): the bounds cast to the input's
    type and bins found in integer arithmetic."""
    integer = not is_floating(self.dtype)
    if integer and self.dtype == jnp.bool_:
        raise RuntimeError("\"histc\" not implemented for 'Bool'")
    dt = np.dtype(jnp.int64) if integer else np.dtype(jnp.float32) if is_low_precision(self.dtype) else np.dtype(self.dtype)
    x = self.reshape(-1).astype(dt)
    lo, hi = jnp.asarray(min).astype(dt), jnp.asarray(max).astype(dt)  # an integer input truncates them
    data_lo = jnp.min(x) if x.size else jnp.zeros((), dt)
    data_hi = jnp.max(x) if x.size else jnp.zeros((), dt)
    auto = lo == hi  # min == max: use the data's range
    lo, hi = jnp.where(auto, data_lo, lo), jnp.where(auto, data_hi, hi)
    flat = lo == hi  # a single value: widen by one on each side, as torch
    lo, hi = jnp.where(flat, lo - 1, lo), jnp.where(flat, hi + 1, hi)
    inside = (x >= lo) & (x <= hi)  # NaN is outside
    scaled = ((x - lo) * bins) // (hi - lo) if integer else (x - lo) * bins / (hi - lo)
    pos = jnp.where(inside, scaled, 0).astype(INT64)
    pos = jnp.clip(pos, 0, bins - 1)  # x == max falls in the last bin
    counts = jnp.zeros(bins, dt).at[pos].add(inside.astype(dt))
    return counts.astype(self.dtype)


@lowering(aten.bincount.default, jit=False)
def bincount(self, weights=None, minlength=0):
    # the values are concrete here (jit=False): XLA's scatter would drop a negative one silently
    if self.ndim != 1 or (self.size and jnp.issubdtype(self.dtype, jnp.integer) and int(jnp.min(self)) < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    length = builtins.max(int(jnp.max(self)) + 1 if self.size else 0, minlength)
    if weights is None:
        return jnp.zeros(length, INT64).at[self].add(1)
    out_dtype = weights.dtype if np.dtype(weights.dtype) in (np.dtype(np.float32), np.dtype(np.float64)) \
        else np.dtype(np.float64)
    return jnp.zeros(length, out_dtype).at[self].add(weights.astype(out_dtype))


@lowering(aten.hash_tensor.default)
def hash_tensor(self, dim=(), keepdim=False, mode=0):
    """mode 0, xor_sum: the xor of every element's bits widened to 64 (floats as float64,
    integers sign-extended to int64), as CPU; dim=[] reduces every dim."""
    if mode != 0:
        raise RuntimeError(f"Unknown hash_tensor mode: {mode}")
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        raise TypeError("xor_sum has no complex kernel")
    wide = self.astype(jnp.float64 if is_floating(self.dtype) else INT64)
    bits = jax.lax.bitcast_convert_type(wide, jnp.uint64)
    axes = _reduced_dims(dim, self.ndim)
    out = jax.lax.reduce(bits, np.uint64(0), jax.lax.bitwise_xor, axes)
    return jnp.expand_dims(out, axes) if keepdim else out


# --------------------------------------------------------------------------- unique (data-dependent)
def _empty_index():
    return jnp.zeros((0,), INT64)


@lowering(aten._unique2.default, jit=False)
def _unique2(self, sorted=True, return_inverse=False, return_counts=False):  # noqa: A002
    out, inverse, counts = jnp.unique(self.reshape(-1), return_inverse=True, return_counts=True, equal_nan=False)
    return (out, inverse.reshape(self.shape).astype(INT64) if return_inverse else _empty_index(),
            counts.astype(INT64) if return_counts else _empty_index())


@lowering(aten._unique.default, jit=False)
def _unique(self, sorted=True, return_inverse=False):  # noqa: A002
    return _unique2(self, sorted, return_inverse)[:2]


def _libstdcxx_sort(order: list, less) -> None:
    """std::sort as libstdc++ writes it (introsort: median-of-three partitions down to 16
    elements, heapsort past the depth limit, then insertion sort), in place on `order`. CPU's
    unique_dim sorts rows with a comparator that NaN makes inconsistent; its result is then
    this algorithm's, so it is followed step by step."""
    def linear_insert(i):
        value, j = order[i], i - 1
        while less(value, order[j]):
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = value

    def insertion_sort(first, last):
        for i in range(first + 1, last):
            if less(order[i], order[first]):
                value = order[i]
                order[first + 1:i + 1] = order[first:i]
                order[first] = value
            else:
                linear_insert(i)

    def adjust_heap(first, hole, length, value):
        top, child = hole, hole
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if less(order[first + child], order[first + child - 1]):
                child -= 1
            order[first + hole] = order[first + child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            order[first + hole] = order[first + child - 1]
            hole = child - 1
        parent = (hole - 1) // 2
        while hole > top and less(order[first + parent], value):
            order[first + hole] = order[first + parent]
            hole, parent = parent, (parent - 1) // 2
        order[first + hole] = value

    def heap_sort(first, last):
        length = last - first
        for parent in range((length - 2) // 2, -1, -1):
            adjust_heap(first, parent, length, order[first + parent])
        while last - first > 1:
            last -= 1
            value, order[last] = order[last], order[first]
            adjust_heap(first, 0, last - first, value)

    def median_to_first(result, a, b, c):
        if less(order[a], order[b]):
            pick = b if less(order[b], order[c]) else (c if less(order[a], order[c]) else a)
        else:
            pick = a if less(order[a], order[c]) else (c if less(order[b], order[c]) else b)
        order[result], order[pick] = order[pick], order[result]

    def partition(first, last, pivot):
        while True:
            while less(order[first], order[pivot]):
                first += 1
            last -= 1
            while less(order[pivot], order[last]):
                last -= 1
            if not first < last:
                return first
            order[first], order[last] = order[last], order[first]
            first += 1

    def introsort(first, last, depth):
        while last - first > 16:
            if depth == 0:
                heap_sort(first, last)
                return
            depth -= 1
            median_to_first(first, first + 1, first + (last - first) // 2, last - 1)
            cut = partition(first + 1, last, first)
            introsort(cut, last, depth)
            last = cut

    n = len(order)
    if n < 2:
        return
    introsort(0, n, 2 * (n.bit_length() - 1))
    if n > 16:
        insertion_sort(0, 16)
        for i in range(16, n):
            linear_insert(i)
    else:
        insertion_sort(0, n)


def _unique_rows_as_cpu(rows: np.ndarray):
    """(order of the unique rows' first occurrences, inverse, counts) of a 2-D array with NaNs,
    as CPU's unique_dim computes them: rows sorted by libstdc++'s std::sort with a lexicographic
    `<`, then runs of equal rows merged, where a row with a NaN equals no other."""
    values = [tuple(r) for r in rows.astype(np.float64).tolist()]

    def less(a, b):
        for lhs, rhs in zip(values[a], values[b]):
            if lhs < rhs:
                return True
            if lhs > rhs:
                return False
        return False

    order = list(range(len(values)))
    _libstdcxx_sort(order, less)
    firsts, inverse, counts = [], np.zeros(len(order), np.int64), []
    for position, row in enumerate(order):
        if not firsts or not values[row] == values[order[firsts[-1]]] or builtins.any(math.isnan(v) for v in values[row]):
            firsts.append(position)
            counts.append(0)
        inverse[row] = len(firsts) - 1
        counts[-1] += 1
    return [order[f] for f in firsts], inverse, np.asarray(counts, np.int64)


@lowering(aten.unique_dim.default, jit=False)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):  # noqa: A002
    dim = wrap_dim(dim, self.ndim)
    zero_dims = builtins.sum(1 for n in self.shape if n == 0)
    if self.shape[dim] == 0:
        if zero_dims != 1:
            raise RuntimeError("Number of zero sized dimensions is more than one, so unique cannot be applied ")
        return self, _empty_index(), _empty_index()
    if zero_dims:
        raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
    if jnp.issubdtype(self.dtype, jnp.floating) and bool(jnp.isnan(self).any()):
        # NaN != NaN: no row with a NaN merges, and the rows' order is that of CPU's sort (jnp.unique
        # would merge NaN rows and sort them last)
        rows = np.asarray(jnp.moveaxis(self, dim, 0))
        picked, inverse, counts = _unique_rows_as_cpu(rows.reshape(rows.shape[0], -1))
        out = jnp.moveaxis(jnp.moveaxis(self, dim, 0)[jnp.asarray(picked, INT64)], 0, dim)
        return out, jnp.asarray(inverse), jnp.asarray(counts)
    out, inverse, counts = jnp.unique(self, axis=dim, return_inverse=True, return_counts=True)
    return out, inverse.reshape(-1).astype(INT64), counts.astype(INT64)  # torch always fills both with a dim


@lowering(aten.unique_consecutive.default, jit=False)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    x = self.reshape(-1) if dim is None else jnp.moveaxis(self, wrap_dim(dim, self.ndim), 0)
    n = x.shape[0]
    if n == 0:
        changed = jnp.zeros((0,), jnp.bool_)
    else:
        diff = (x[1:] != x[:-1]).reshape(n - 1, -1).any(axis=1) if x.ndim > 1 else x[1:] != x[:-1]
        changed = jnp.concatenate([jnp.ones((1,), jnp.bool_), diff])
    keep = np.asarray(changed)
    out = x[keep]
    if dim is not None:
        out = jnp.moveaxis(out, 0, wrap_dim(dim, self.ndim))
    inverse = jnp.cumsum(changed, dtype=INT64) - 1
    starts = np.flatnonzero(keep)
    counts = jnp.asarray(np.diff(np.append(starts, n)), INT64)
    if dim is not None:  # torch always fills both with a dim
        return out, inverse, counts
    return (out, inverse.reshape(self.shape) if return_inverse else _empty_index(),
            counts if return_counts else _empty_index())

