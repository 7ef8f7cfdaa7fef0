"""The one mapping between torch dtypes and JAX dtypes."""
from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import torch

# torch dtype -> numpy/JAX dtype. float8 types exist in both under the same names.
TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
for _name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _name) and hasattr(ml_dtypes, _name):
        TORCH_TO_JAX[getattr(torch, _name)] = np.dtype(getattr(ml_dtypes, _name))

JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}


class UnsupportedDtypeError(RuntimeError, TypeError):
    """A dtype JAX/XLA cannot hold (bits8, uint4, complex32, float4_e2m1fn_x2, ...).

    Raised at creation (empty, empty_strided, copies and factories to pjrt). A RuntimeError,
    as torch raises for a dtype a backend has no kernels for, and a TypeError, the type
    to_jax raised before, so callers that catch either keep working."""


def unsupported_dtype(dtype: torch.dtype, device=None) -> UnsupportedDtypeError:
    """The error for a dtype JAX cannot hold; `device` (a pjrt index or device) is named when known."""
    where = "" if device is None else f"asked for on {f'pjrt:{device}' if isinstance(device, int) else device}; "
    if dtype.is_complex:
        instead = "complex64"
    elif dtype.is_floating_point:
        instead = "bfloat16, float16 or a float8 type"
    else:
        instead = "uint8 for raw bits, or another integer type"
    return UnsupportedDtypeError(
        f"pjrt: dtype {dtype} is not supported on pjrt devices ({where}JAX/XLA has no such type); "
        f"keep such tensors on the CPU, or use a supported dtype ({instead})")


def raise_unsupported_dtype(dtype: torch.dtype, device: int) -> None:
    """Called by the runtime's empty/empty_strided for a dtype not in TORCH_TO_JAX."""
    raise unsupported_dtype(dtype, device)


def to_jax(dtype: torch.dtype) -> np.dtype:
    """The JAX dtype of a torch dtype; UnsupportedDtypeError names a dtype JAX cannot hold."""
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise unsupported_dtype(dtype) from None


def to_torch(dtype) -> torch.dtype:
    return JAX_TO_TORCH[np.dtype(dtype)]


def c10_name(dtype: torch.dtype) -> str:
    """The dtype as torch's C++ messages name it (c10::ScalarType: Float, Long, Float8_e4m3fn)."""
    name = _C10_NAMES.get(dtype)
    if name is None and str(dtype).startswith("torch.float8_"):
        name = "Float8_" + str(dtype)[len("torch.float8_"):]
    return name or str(dtype)


_C10_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.int64: "Long", torch.int32: "Int",
              torch.bool: "Bool", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.int16: "Short",
              torch.int8: "Char", torch.uint8: "Byte", torch.complex64: "ComplexFloat",
              torch.complex128: "ComplexDouble"}

FLOAT8 = frozenset(v for k, v in TORCH_TO_JAX.items() if str(k).startswith("torch.float8_"))  # c10's isFloat8Type
_E4M3FN = TORCH_TO_JAX.get(getattr(torch, "float8_e4m3fn", None))


def astype(x, dtype):
    """`x.astype(dtype)` as torch converts: to float8_e4m3fn torch saturates at its largest
    finite value (+-448, infinities included) where XLA gives NaN; NaN stays NaN."""
    dtype = np.dtype(dtype)
    if dtype == _E4M3FN and np.dtype(x.dtype) != dtype and np.dtype(x.dtype).kind in "fiu":
        if np.dtype(x.dtype).kind in "iu":
            x = x.astype(np.float32)
        x = x.clip(-448, 448)
    return x.astype(dtype)


@functools.lru_cache(None)
def is_index_dtype(dtype) -> bool:
    """A JAX dtype of index tensors, not of masks (torch treats bool and uint8 ones as masks)."""
    dtype = np.dtype(dtype)
    return np.issubdtype(dtype, np.integer) and dtype != np.uint8
