"""Lowerings: the few ops the runtime itself leans on (fill, zero, arange)."""
from __future__ import annotations
import jax.numpy as jnp
import numpy as np
import torch
from ..dtypes import to_jax, to_torch
from .registry import lowering, Padding, SAME

aten = torch.ops.aten


@lowering(aten.fill.Scalar, aten.fill.Tensor, padding=SAME, scalar_fits="value")
def fill(self, value):
    return jnp.full(self.shape, value, self.dtype)


@lowering(aten.zero.default, padding=SAME)
def zero(self):
    return jnp.zeros(self.shape, self.dtype)


def _arange_dtype(start, end, step, dtype):
    if dtype is not None:
        return to_jax(dtype)
    if all(isinstance(v, (bool, int)) for v in (start, end, step)):
        return np.dtype(np.int64)
    return to_jax(torch.get_default_dtype())


# CPU's kernel converts start and step to the dtype it computes in, with an overflow check
# (bfloat16 from 1e39: "value cannot be converted to type float"); end only fixes the length
@lowering(aten.arange.start_step, static=("start", "end", "step"), padding=Padding("arange"),
          scalar_fits=("start", "step"))
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Lengths and values follow torch: computed in float64 (or int64), then cast."""
    out = _arange_dtype(start, end, step, dtype)
    n = torch.arange(start, end, step, device="meta").numel()  # torch's own length rule and checks
    index = jnp.arange(n, dtype=jnp.int64 if np.issubdtype(out, np.integer) else jnp.float64)
    return (start + index * step).astype(out)


def _arange_out_warns_as_cpu(values) -> bool:
    """arange(out=)'s resize warning, per call (the executable is cached by start, end, step and
    out's shape, so a warning at trace time would show once): where out's element count differs
    from the result's, CPU's kernel on a CPU tensor of out's shape warns in its words ("The number
    of elements in the out tensor of shape [1, 49] is 49 which does not match the computed number
    of elements 50. ... The out tensor will be resized ...") and raises its errors."""
    start, end, step, out = values
    if out.numel() != torch.arange(start, end, step, device="meta").numel():
        torch.arange(start, end, step, out=torch.empty(out.shape, dtype=out.dtype))
    return True


@lowering(aten.arange.start_out, static=("start", "end", "step"), in_range=_arange_out_warns_as_cpu,
          resizes_out=True, scalar_fits=("start", "step"), not_paddable="writes an existing out= tensor in its own shape")
def arange_start_out(start, end, step=1, *, out):
    """arange(..., out=): CPU resizes `out` only when its element count differs, and otherwise
    writes the values in out's own shape and element order (torch's generic out= rule, which
    the decomposition followed, resizes any other shape: a non-contiguous out then had its
    values written at other storage positions). Returns out's new value."""
    values = arange(start, end, step, dtype=to_torch(out.dtype))
    return values.reshape(out.shape) if values.size == out.size else values
