"""View ops whose CPU kernels are backend-specific: pure metadata over the same storage."""
from __future__ import annotations

import torch

from ..dtypes import c10_name

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
        raise RuntimeError(f"view_as_complex is only supported for half, float and double tensors, but got a tensor "
                           f"of scalar type: {c10_name(self.dtype)}")  # CPU's words (half: complex32, refused here)
    if self.dim() == 0 or self.shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if self.stride(-1) != 1:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % 2 for s in self.stride()[:-1]) or self.storage_offset() % 2:
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last dimension")
    complex_ = _retyped(self, _COMPLEX[self.dtype])
    return complex_.as_strided(self.shape[:-1], tuple(s // 2 for s in self.stride()[:-1]), self.storage_offset() // 2)


def as_strided_copy(self: torch.Tensor, size, stride, storage_offset=None) -> torch.Tensor:
    """CPU's: a contiguous copy of as_strided, which addresses self's storage (an offset of
    None is self's own), not self's elements as the lowering sees them."""
    return self.as_strided(size, stride, storage_offset).clone(memory_format=torch.contiguous_format)


def _clone_preserve_strides(self: torch.Tensor) -> torch.Tensor:
    """CPU's clone_preserve_strides: a copy of self's whole storage, laid out as self (an
    internally overlapping self is cloned plainly, as CPU does, since it is written next)."""
    if torch._debug_has_internal_overlap(self) == 1:
        return self.clone()
    whole = self.as_strided((self.untyped_storage().nbytes() // self.element_size(),), (1,), 0)
    return whole.clone().as_strided(self.shape, self.stride(), self.storage_offset())


def as_strided_scatter(self: torch.Tensor, src: torch.Tensor, size, stride, storage_offset=None) -> torch.Tensor:
    """CPU's composite: src written through as_strided of a copy of self's whole storage, so
    the offset and strides address storage positions (a view's offset counts), and the result
    keeps self's layout. Storage bounds and overlaps raise in as_strided and copy_, as on CPU."""
    output = _clone_preserve_strides(self)
    target = output.as_strided(size, stride, storage_offset)
    if target.shape != src.shape:
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = {list(src.shape)}, "
                           f"slice size = {list(target.shape)}")
    target.copy_(src)
    return output


def is_set_to(self: torch.Tensor, tensor: torch.Tensor) -> bool:
    """CPU's: the same storage (not an equal one: the CPU fallback compared copies, always False),
    offset, sizes and strides."""
    return (self.untyped_storage()._cdata == tensor.untyped_storage()._cdata
            and self.storage_offset() == tensor.storage_offset()
            and self.shape == tensor.shape and self.stride() == tensor.stride())


def kernels() -> dict:
    return {aten.view_as_real.default: view_as_real, aten.view_as_complex.default: view_as_complex,
            aten.is_set_to.default: is_set_to,
            aten.as_strided_copy.default: as_strided_copy,
            aten.as_strided_scatter.default: as_strided_scatter}
