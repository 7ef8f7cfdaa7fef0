"""View ops whose CPU kernels are backend-specific: pure metadata over the same storage."""
from __future__ import annotations

import torch

aten = torch.ops.aten
_COMPONENT = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}
_COMPLEX = {v: k for k, v in _COMPONENT.items()}


def _retyped(self: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A view of self's whole storage with another element type (geometry set by the caller)."""
    n = max(1, dtype.itemsize // self.dtype.itemsize) if self.untyped_storage().nbytes() else 0  # empty storage
    return aten.view.dtype(self.as_strided((n,), (1,), 0), dtype)


def view_as_real(self: torch.Tensor) -> torch.Tensor:
    if not self.is_complex():
        raise RuntimeError("view_as_real is only supported for complex tensors")
    real = _retyped(self, _COMPONENT[self.dtype])
    return real.as_strided((*self.shape, 2), (*(2 * s for s in self.stride()), 1), 2 * self.storage_offset())


def view_as_complex(self: torch.Tensor) -> torch.Tensor:
    if self.dtype not in _COMPLEX:
        raise RuntimeError(f"view_as_complex is only supported for float and double tensors, but got a tensor of "
                           f"scalar type: {self.dtype}")
    if self.dim() == 0 or self.shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if self.stride(-1) != 1:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % 2 for s in self.stride()[:-1]) or self.storage_offset() % 2:
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last dimension")
    complex_ = _retyped(self, _COMPLEX[self.dtype])
    return complex_.as_strided(self.shape[:-1], tuple(s // 2 for s in self.stride()[:-1]), self.storage_offset() // 2)


def _unsafe_view(self: torch.Tensor, size) -> torch.Tensor:
    """An alias of self with a new shape, as on CPU (kron's out= writes through one); the op
    only hides the aliasing from autograd, so it must not copy."""
    geometry = self.view(size)  # the strides view gives (raises where no view exists, as on CPU)
    return aten._reshape_alias.default(self, geometry.shape, geometry.stride())


def kernels() -> dict:
    return {aten.view_as_real.default: view_as_real, aten.view_as_complex.default: view_as_complex,
            aten._unsafe_view.default: _unsafe_view}
