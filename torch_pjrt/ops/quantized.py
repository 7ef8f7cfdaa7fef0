"""Lowerings: quantized matmuls (torchao's int8 paths), as XLA's integer dot products.

`aten._int_mm` is int8 x int8 -> int32, accumulated in int32 by the dot itself, as CUDA's
cuBLASLt kernel does (no float round trip, no host copy). torchao under torch.compile
writes the same product as the higher-order op `out_dtype(aten.mm, torch.int32, a, b)`;
a higher-order op is no OpOverload, so its lowering lives in HIGHER_ORDER (read by the
graph interpreter) rather than in the op table.
"""
from __future__ import annotations

import numpy as np
import torch
from jax import lax
from torch._higher_order_ops.out_dtype import out_dtype

from ..dtypes import to_jax, to_torch
from .registry import LOWERINGS, Padding, family

lowering = family()

aten = torch.ops.aten

I32 = np.dtype(np.int32)


def _check_int_mm(self, mat2):
    if self.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(f"_int_mm: expected 2D tensors, got {self.ndim}D and {mat2.ndim}D")
    if self.dtype != np.int8 or mat2.dtype != np.int8:
        raise RuntimeError(f"_int_mm: expected self and mat2 to be int8, got {self.dtype} and {mat2.dtype}")
    if self.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"_int_mm: self.size(1) ({self.shape[1]}) must match mat2.size(0) ({mat2.shape[0]})")


@lowering(aten._int_mm.default, padding=Padding("contraction"))
def _int_mm(self, mat2):
    _check_int_mm(self, mat2)
    return lax.dot_general(self, mat2, (((1,), (0,)), ((), ())), preferred_element_type=I32)


def out_dtype_lowering(op, output_dtype, *args):
    """out_dtype(op, dtype, *args): torch's rule (out_dtype_fallback) is op on the args
    promoted with `dtype`, then cast to `dtype`; an int8 mm to int32 is `_int_mm` exactly."""
    if (op is aten.mm.default and output_dtype == torch.int32 and len(args) == 2
            and all(a.dtype == np.int8 for a in args)):
        return _int_mm(*args)
    inner = LOWERINGS.get(op)
    if inner is None:
        raise NotImplementedError(f"out_dtype({op}): the pjrt op table has no lowering for {op}")
    promoted = output_dtype
    for a in args:
        if hasattr(a, "dtype"):
            promoted = torch.promote_types(promoted, to_torch(a.dtype))
    casted = [a.astype(to_jax(promoted)) if hasattr(a, "astype") else a for a in args]
    return inner.fn(*casted).astype(to_jax(output_dtype))


# higher-order op -> its lowering, called with the node's arguments (arrays for tensors)
HIGHER_ORDER = {out_dtype: out_dtype_lowering}
