"""Lowerings: quantized matmuls (torchao's int8 and float8 paths), as XLA dot products.

`aten._int_mm` is int8 x int8 -> int32, accumulated in int32 by the dot itself, as CUDA's
cuBLASLt kernel does (no float round trip, no host copy). torchao under torch.compile
writes the same product as the higher-order op `out_dtype(aten.mm, torch.int32, a, b)`;
a higher-order op is no OpOverload, so its lowering lives in HIGHER_ORDER (read by the
graph interpreter) rather than in the op table.

`aten._scaled_mm` is the float8 matmul with scales, computed as CPU torch computes it
(ScaledBlas.cpp's emulation): each float8 operand widened to float32 and multiplied by its
scale, one float32 dot, bias, and the cast. This is also the pattern XLA's GPU compiler
rewrites into a native float8 GEMM, so one lowering serves both. `aten._scaled_mm_v2` (scales as
lists, their recipes named) is the same product for the recipes CPU computes.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch._higher_order_ops.out_dtype import out_dtype

from ..dtypes import FLOAT8, c10_name, to_jax, to_torch
from .registry import LOWERINGS, Padding, family, refusal
from .shape import convert

lowering = family()

aten = torch.ops.aten

I32 = np.dtype(np.int32)
F32 = np.dtype(np.float32)


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


def _contiguous_strides(shape) -> list:
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= max(size, 1)
    return strides


def _invalid_scaling(a, b, scale_a, scale_b) -> ValueError:
    """CPU's message (strides are those of contiguous scales: a lowering sees no strides)."""
    def scale(name, s, last):
        shape = list(s.shape)
        return (f"{name}.dtype()={c10_name(to_torch(s.dtype))}, {name}.size()={shape}"
                f"{' and ' if last else ', '}{name}.stride()={_contiguous_strides(shape)}")

    return ValueError(
        "Invalid scaling configuration.\n"
        "- For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n"
        "- For RowWise scaling, a and b should be float8, scales should be float, scale_a should be "
        f"({a.shape[0]}, 1) and scale_b should be (1, {b.shape[1]}), and both should be contiguous.\n"
        f"Got mat_a.dtype()={c10_name(to_torch(a.dtype))}, {scale('scale_a', scale_a, False)}, "
        f"mat_b.dtype()={c10_name(to_torch(b.dtype))}, {scale('scale_b', scale_b, True)}")


def _scaled_mm_scaling(self, mat2, scale_a, scale_b) -> str:
    """"tensorwise" or "rowwise", chosen and checked as CPU torch does (float8 operands,
    float32 scales: both singletons, or (M, 1) and (1, N)); refusals raise CPU's errors."""
    if self.ndim != 2:
        raise RuntimeError("mat1 must be a matrix")
    if mat2.ndim != 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {mat2.ndim}D")
    float8 = self.dtype in FLOAT8 and mat2.dtype in FLOAT8
    float_scales = scale_a.dtype == F32 and scale_b.dtype == F32
    if float8 and float_scales and scale_a.size == 1 and scale_b.size == 1:
        kind = "tensorwise"
    elif float8 and float_scales and scale_a.shape == (self.shape[0], 1) and scale_b.shape == (1, mat2.shape[1]):
        kind = "rowwise"
    else:
        raise refusal(_invalid_scaling(self, mat2, scale_a, scale_b))
    if self.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat_a and mat_b shapes cannot be multiplied ({self.shape[0]}x{self.shape[1]} "
                           f"and {mat2.shape[0]}x{mat2.shape[1]})")
    return kind


@lowering(aten._scaled_mm.default, padding=Padding("contraction"))
def _scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    """float8 (M, K) x (K, N) with tensor-wise or row-wise float32 scales, as CPU torch:
    (a * scale_a) @ (b * scale_b) in float32, + bias, / scale_result only when out_dtype is
    float8_e4m3fn or float8_e5m2 (given explicitly), cast to out_dtype (default: a's dtype).
    use_fast_accum only chooses a CUDA accumulation mode; the result here is float32's."""
    kind = _scaled_mm_scaling(self, mat2, scale_a, scale_b)
    if scale_result is not None and not (scale_result.size == 1 and scale_result.dtype == F32):
        raise RuntimeError("scale_result must be a float scalar")
    n = mat2.shape[1]
    if bias is not None and bias.size != n:
        raise RuntimeError(f"Bias must be size {n} but got {bias.size}")
    if kind == "tensorwise":
        scale_a, scale_b = scale_a.reshape(()), scale_b.reshape(())
    a = self.astype(F32) * scale_a
    b = mat2.astype(F32) * scale_b
    out = jnp.matmul(a, b, precision=lax.Precision.HIGHEST)
    if bias is not None:  # torch's out.add_(bias): computed in the promoted dtype, kept float32
        wide = to_jax(torch.promote_types(torch.float32, to_torch(bias.dtype)))
        out = (out.astype(wide) + jnp.broadcast_to(bias.astype(wide), out.shape)).astype(F32)
    result = self.dtype if out_dtype is None else to_jax(out_dtype)
    if scale_result is not None and out_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        out = out * (np.float32(1) / scale_result.reshape(()))
    return convert(out, result)


# _scaled_mm_v2's recipes (torch.nn.functional.ScalingType) and swizzle (SwizzleType) as the
# dispatcher passes them
TENSOR_WISE, ROW_WISE, NO_SWIZZLE = 0, 1, 0


@lowering(aten._scaled_mm_v2.default, padding=Padding("contraction"))
def _scaled_mm_v2(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias=None,
                  out_dtype=None, contraction_dim=(), use_fast_accum=False):
    """_scaled_mm with each operand's scales as a list and their recipe named. CPU torch
    computes one tensor-wise or one row-wise scale per operand (both the same recipe), without
    swizzle, as _scaled_mm; anything else it refuses, and the oracle (eager/errors.py) raises its
    words for what this lowering refuses."""
    recipes = (tuple(recipe_a), tuple(recipe_b))
    if (len(scale_a), len(scale_b)) != (1, 1) or recipes not in (((TENSOR_WISE,),) * 2, ((ROW_WISE,),) * 2):
        raise ValueError(f"_scaled_mm_v2: scale recipes {recipes} with {len(scale_a)} and {len(scale_b)} scales")
    if any(s != NO_SWIZZLE for s in (*swizzle_a, *swizzle_b)):
        raise ValueError("_scaled_mm_v2: swizzled scales")
    if tuple(contraction_dim) not in ((), (1, 0)):
        raise ValueError(f"_scaled_mm_v2: contraction_dim {list(contraction_dim)}")
    # the scales' shapes must be the recipe's (singletons and row-wise shapes are both valid for v1)
    if _scaled_mm_scaling(self, mat2, scale_a[0], scale_b[0]) != ("tensorwise", "rowwise")[recipe_a[0]]:
        raise ValueError(f"_scaled_mm_v2: scales of shapes {scale_a[0].shape} and {scale_b[0].shape} for recipe {recipes}")
    return _scaled_mm(self, mat2, scale_a[0], scale_b[0], bias, None, out_dtype, use_fast_accum)


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
