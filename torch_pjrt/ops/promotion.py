"""PyTorch's type promotion, applied to lowering arguments at trace time.

torch._prims_common is the oracle: we describe each argument to it as torch sees it
(a weakly typed JAX scalar is a Python number, an array is a tensor of that rank and
dtype) and read back the computation and result dtypes. This runs once per traced
signature, never per call.
"""
from __future__ import annotations
import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes
from ..dtypes import astype, c10_name, to_jax, to_torch

_PY_SCALAR = {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}


def is_weak_scalar(x) -> bool:
    """True for a Python number or a weakly typed 0-d JAX value (a Scalar argument)."""
    if isinstance(x, (bool, int, float, complex)):
        return True
    return bool(getattr(x, "weak_type", False)) and jnp.ndim(x) == 0


def torch_like(x):
    """What torch's promotion rules see for `x`: a Python number or a meta tensor."""
    if isinstance(x, (bool, int, float, complex)):
        return x
    dt = np.dtype(x.dtype)
    if is_weak_scalar(x):
        return _PY_SCALAR[dt.kind]
    return torch.empty((1,) * jnp.ndim(x), dtype=to_torch(dt), device="meta")


def promote(*args, kind: KIND = KIND.DEFAULT) -> tuple[np.dtype, np.dtype]:
    """(computation dtype, result dtype) for an elementwise op over `args` (None ignored)."""
    like = [torch_like(a) for a in args if a is not None]
    compute, result = elementwise_dtypes(*like, type_promotion_kind=kind)
    return to_jax(compute), to_jax(result)


def cast(x, dtype):
    """Cast an array or weak scalar to `dtype` (a no-op when it already is)."""
    if isinstance(x, (bool, int, float, complex)):
        return jnp.asarray(x, dtype=dtype)
    if x.dtype == dtype and not getattr(x, "weak_type", False):
        return x
    y = astype(x, dtype)
    if x.dtype == np.bool_ and np.dtype(dtype).kind in "fc":
        # XLA's simplifier rewrites convert(pred) * y and convert(pred) / y as select(pred, ., 0),
        # which loses False * inf = NaN and False / 0 = NaN; the barrier keeps the arithmetic.
        y = jax.lax.optimization_barrier(y)
    return y


def default_float() -> np.dtype:
    return to_jax(torch.get_default_dtype())


def require_dtype(x, dtypes: tuple, error: type, words: str) -> None:
    """Raise error(words) where the operand `x` (an index, a target, a sorter) is not of one of
    `dtypes`, as CPU's kernels refuse it ("{}" in words: x's dtype as c10 names it, "Int").
    Torch's meta kernels accept any dtype there, so eager's meta check lets such a call through."""
    if x is not None and np.dtype(x.dtype) not in dtypes:
        raise error(words.format(c10_name(to_torch(x.dtype))))
