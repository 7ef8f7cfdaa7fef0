"""Sparse COO tensors on pjrt: the kernels of the SparsePrivateUse1 key that compute.

A COO tensor on pjrt is torch's own SparseTensorImpl whose indices (sparse_dim x nnz,
int64) and values (nnz x dense sizes) are ordinary pjrt tensors; the C++ runtime registers
ATen's device-generic metadata kernels for it (runtime/csrc/sparse.cpp). The ops here are
written in dense pjrt ops on indices and values, so they record and fuse like any other
eager op. They cover what sparse gradients need (nn.Embedding / embedding_bag with
sparse=True, and the sparse paths of SGD, Adagrad and SparseAdam: coalesce, add into dense,
sparse_mask) plus to_dense, sparse + sparse, sparse - sparse, index_select, sparse @ dense,
mul by a scalar, a sparse or a dense tensor, and div by a scalar. Every other op on the key
raises fallback.refuse_sparse's error, which names it.
"""
from __future__ import annotations

import torch

_library = None  # registrations live as long as their Library object


def _sparse(indices, values, size, coalesced: bool):
    """A COO tensor over (indices, values) without checks or copies."""
    return torch.sparse_coo_tensor(indices, values, size, check_invariants=False, is_coalesced=coalesced)


def _linear(indices, sizes):
    """Row-major position of each nonzero over the sparse dimensions."""
    position = torch.zeros_like(indices[0])
    for d, n in enumerate(sizes):
        position = position * n + indices[d]
    return position


def _at(dense, indices):
    """dense's values at a COO tensor's indices: (nnz, dense dims...). With no sparse dim, each of
    the nnz values is the whole tensor."""
    if indices.shape[0] == 0:
        return dense.unsqueeze(0).expand((indices.shape[1],) + tuple(dense.shape)).clone()
    return dense[tuple(indices)]


def _coalesce(self):
    """Duplicates summed, indices sorted row-major (as CPU's coalesce)."""
    sparse_dim, size = self.sparse_dim(), self.shape
    indices, values = self._indices(), self._values()
    if self._nnz() < 2:
        return _sparse(indices.clone(), values.clone(), size, True)
    if sparse_dim == 0:  # every value is at the one position: their sum
        return _sparse(indices[:, :1].clone(), values.sum(0, keepdim=True), size, True)
    # sorted positions (stable: duplicates keep their order, so each sum adds in CPU's order), each
    # run of equal positions one output row; the masked index of the runs' first elements is the
    # only data-dependent step (one count read). torch.unique here ran jnp.unique primitive by
    # primitive on the host's copy, compiling a dozen executables per nnz.
    position, order = torch.sort(_linear(indices, size[:sparse_dim]), stable=True)
    first = torch.ones_like(position, dtype=torch.bool)
    first[1:] = position[1:] != position[:-1]
    row = torch.cumsum(first, 0) - 1
    position = position[first]
    summed = values.new_zeros((position.shape[0],) + tuple(values.shape[1:])).index_add_(0, row, values[order])
    rows = []
    for n in reversed(size[:sparse_dim]):
        rows.append(torch.remainder(position, n))
        position = torch.div(position, n, rounding_mode="floor")
    return _sparse(torch.stack(rows[::-1]), summed, size, True)


def _check_same_shape(op: str, self, other) -> None:
    if self.shape != other.shape:
        raise RuntimeError(f"{op}: expected 'self' and 'other' to have same size, but self has size {list(self.shape)}"
                           f" while other has size {list(other.shape)} (FYI: dense-sparse addition does not "
                           f"currently support broadcasting)")


def _check_same_device(*tensors) -> None:
    """As CUDA: a CPU tensor mixed with pjrt ones raises (the dispatcher picks the pjrt kernel)."""
    devices = list(dict.fromkeys(str(t.device) for t in tensors))
    if len(devices) > 1:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{devices[0]} and {devices[1]}!")


def _name(dtype) -> str:
    """torch.float32 -> Float, as ATen's messages name a dtype."""
    return {torch.float32: "Float", torch.float64: "Double", torch.int64: "Long", torch.int32: "Int",
            torch.bool: "Bool"}.get(dtype, str(dtype).removeprefix("torch."))


def add_out(self, other, *, alpha=1, out):
    """add.out (add and add_ reach it through ATen's add_sparse/add_sparse_): dense + sparse
    scatters the values into a dense result; sparse + sparse concatenates (uncoalesced)."""
    if not (isinstance(other, torch.Tensor) and other.is_sparse):  # a wrapped number arrives as a Python number
        raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) instead.")
    _check_same_device(self, other, out)
    _check_same_shape("add", self, other)
    dtype = _result_dtype("add", self, other, out)
    values = other._values().to(dtype)
    if alpha != 1:
        values = values * alpha
    if not self.is_sparse:  # dense result
        if out.is_sparse:
            raise RuntimeError("add: expected 'out' to be a dense tensor when 'self' is dense")
        if out is not self:
            out.resize_(self.shape)
            out.copy_(self)
        if other._nnz():
            if other.sparse_dim():
                out.index_put_(tuple(other._indices()), values.to(out.dtype), accumulate=True)
            else:  # each value is the whole tensor
                out.add_(values.sum(0).to(out.dtype))
        return out
    if self.sparse_dim() != other.sparse_dim() or self.dense_dim() != other.dense_dim():
        raise RuntimeError(f"add: expected both tensors to have the same sparse_dim ({self.sparse_dim()} vs "
                           f"{other.sparse_dim()}) and dense_dim ({self.dense_dim()} vs {other.dense_dim()})")
    if not self._nnz():
        result = _sparse(other._indices().clone(), values, self.shape, other.is_coalesced())
    elif not other._nnz():
        result = _sparse(self._indices().clone(), self._values().to(dtype), self.shape, self.is_coalesced())
    else:
        result = _sparse(torch.cat([self._indices(), other._indices()], 1),
                         torch.cat([self._values().to(dtype), values]), self.shape, False)
    if out is not self:
        out.resize_as_(result)
    return out.copy_(result)


def sparse_mask(self, mask):
    """self's values at mask's indices, in mask's order; a sparse self's duplicates summed, and zero
    where it holds nothing (sparse_mask's backward of a sparse gradient, torch.sparse ops)."""
    _check_same_device(self, mask)
    if self.shape != mask.shape:
        raise RuntimeError(f"sparse_mask(): operands have incompatible sizes; self has size {list(self.shape)} "
                           f"but mask has size {list(mask.shape)}")
    indices = mask._indices()
    values = self.to_dense() if self.is_sparse else self
    return _sparse(indices.clone(), _at(values, indices), mask.shape, mask.is_coalesced())


def sparse_mask_projection(self, mask, accumulate_matches=False):
    """_sparse_mask_projection (sparse_mask's backward), as CPU's: self (sparse) keeps its own indices;
    each value stays where mask holds its position, and is zero elsewhere."""
    _check_same_device(self, mask)
    dims = self.shape[:self.sparse_dim()]
    kept = torch.isin(_linear(self._indices(), dims), _linear(mask._indices(), dims))
    values = self._values()
    kept = kept.reshape((-1,) + (1,) * (values.dim() - 1))
    return _sparse(self._indices().clone(), torch.where(kept, values, torch.zeros_like(values)), self.shape,
                   self.is_coalesced())


def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    """beta * self + alpha * (mat1 @ mat2) with mat1 a 2-D COO matrix and mat2 dense."""
    if not mat1.is_sparse or mat2.is_sparse or self.is_sparse:
        raise NotImplementedError("pjrt: aten::addmm: on sparse tensors pjrt covers a sparse mat1 with dense self "
                                  "and mat2 (sparse @ dense)")
    _check_same_device(self, mat1, mat2)
    if mat1.dim() != 2 or mat2.dim() != 2 or mat1.sparse_dim() != 2:
        raise RuntimeError(f"addmm: matrices expected, got {mat1.dim()}D, {mat2.dim()}D tensors")
    if mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({mat1.shape[0]}x{mat1.shape[1]} and "
                           f"{mat2.shape[0]}x{mat2.shape[1]})")
    rows, cols = mat1._indices()
    product = mat2.new_zeros((mat1.shape[0], mat2.shape[1])).index_add_(
        0, rows, mat1._values().to(mat2.dtype)[:, None] * mat2[cols])
    if alpha != 1:
        product = product * alpha
    if beta == 0:  # as torch: self is ignored (its nan and inf do not propagate)
        return product
    return product + (self if beta == 1 else self * beta).expand_as(product)


def index_select(self, dim, index):
    """The slices of a COO tensor at `index` along `dim` (a sparse or a dense dimension)."""
    dim = dim + self.dim() if dim < 0 else dim
    if index.dim() > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    index = index.reshape(-1)
    size = list(self.shape)
    size[dim] = index.numel()
    indices, values = self._indices(), self._values()
    if dim >= self.sparse_dim():
        return _sparse(indices.clone(), values.index_select(dim - self.sparse_dim() + 1, index), size, self.is_coalesced())
    if index.numel() and ((index < -self.shape[dim]) | (index >= self.shape[dim])).any():
        raise IndexError(f"index_select(): index out of range for a tensor of size {self.shape[dim]} at dimension {dim}")
    index = torch.remainder(index, self.shape[dim])
    match = indices[dim][None, :] == index[:, None]  # (len(index), nnz): which nonzeros each index picks
    picked, nonzero = match.nonzero(as_tuple=True)
    selected = indices.index_select(1, nonzero).clone()
    selected[dim] = picked
    return _sparse(selected, values.index_select(0, nonzero), size, False)


def _check_sub(self, other) -> None:
    """ATen's sub_check: subtraction refuses bool operands."""
    bools = [isinstance(x, torch.Tensor) and x.dtype == torch.bool for x in (self, other)]
    if all(bools):
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or "
                           "`logical_xor()` operator instead.")
    if any(bools):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to "
                           "invert a mask, use the `~` or `logical_not()` operator instead.")


def sub(self, other, *, alpha=1):
    """add with -alpha, as ATen's sub_sparse (add's kernel then takes every layout combination)."""
    _check_sub(self, other)
    return torch.add(self, other, alpha=-alpha)


def sub_(self, other, *, alpha=1):
    _check_sub(self, other)
    return self.add_(other, alpha=-alpha)


def sub_out(self, other, *, alpha=1, out):
    _check_sub(self, other)
    return torch.add(self, other, alpha=-alpha, out=out)


def _result_dtype(op: str, self, other, out) -> torch.dtype:
    dtype = torch.result_type(self, other)
    if not torch.can_cast(dtype, out.dtype):
        raise RuntimeError(f"Can't convert result type {_name(dtype)} to output {_name(out.dtype)} in {op} operation")
    return dtype


def _scalar(x) -> bool:
    """A Python number or a 0-dim dense tensor (what sparse mul and div take as a scalar)."""
    return not isinstance(x, torch.Tensor) or (not x.is_sparse and x.dim() == 0)


def _store(out, result):
    """`result` (a COO tensor) written into `out`: a COO tensor takes it whole, a dense one its dense form."""
    if not out.is_sparse:
        return out.copy_(result.to_dense())
    if result.dtype != out.dtype:
        result = result.to(out.dtype)
    out.resize_as_(result)
    return out.copy_(result)


def _intersection(self, other):
    """Where two coalesced COO tensors of one shape both hold a value: self's positions kept, and
    other's position at each."""
    mine = _linear(self._indices(), self.shape[:self.sparse_dim()])
    theirs = _linear(other._indices(), other.shape[:other.sparse_dim()])
    if not theirs.numel():
        return mine.new_zeros(0), mine.new_zeros(0)
    at = torch.searchsorted(theirs, mine).clamp_(max=theirs.numel() - 1)
    kept = (theirs[at] == mine).nonzero().reshape(-1)  # the one data-dependent step (a count read)
    return kept, at[kept]


def mul(self, other):
    """sparse * scalar scales the values; sparse * sparse keeps the positions both hold (coalesced
    first, as CPU does); sparse * dense, either side, takes the dense values at the sparse positions,
    so the product is sparse, as on CPU."""
    if not (isinstance(self, torch.Tensor) and self.is_sparse):  # (a wrapped number arrives as a Python number)
        self, other = other, self
    _check_same_device(*(t for t in (self, other) if isinstance(t, torch.Tensor) and t.dim()))
    dtype = torch.result_type(self, other)
    indices, coalesced = self._indices(), self.is_coalesced()
    if _scalar(other):
        values = self._values() * other
    elif other.is_sparse:
        if self.shape != other.shape or self.sparse_dim() != other.sparse_dim():
            raise RuntimeError("sparse_binary_op_intersection_cpu(): expects sparse inputs with equal dimensionality, "
                               "number of sparse dimensions, and shape of sparse dimensions")
        self, other = self.coalesce(), other.coalesce()
        kept, at = _intersection(self, other)
        indices = self._indices().index_select(1, kept)
        values = self._values().index_select(0, kept) * other._values().index_select(0, at)
        coalesced = True
    else:
        shape = (torch.empty(self.shape, device="meta") * torch.empty(other.shape, device="meta")).shape  # CPU's check
        if shape != self.shape:
            raise NotImplementedError(f"pjrt: aten::mul: a sparse tensor of shape {list(self.shape)} times a dense one "
                                      f"that broadcasts it to {list(shape)} is not supported on pjrt devices")
        values = self._values() * _at(other.expand(self.shape), indices)
    return _sparse(indices.clone(), values.to(dtype), self.shape, coalesced)


def mul_out(self, other, *, out):
    _result_dtype("mul", self, other, out)
    return _store(out, mul(self, other))


def mul_(self, other):
    return mul_out(self, other, out=self)


def div(self, other, *, rounding_mode=None):
    """A COO tensor divided by a scalar (a number or a 0-dim dense tensor), as on CPU."""
    if not (isinstance(self, torch.Tensor) and self.is_sparse and _scalar(other)):
        divisor = other if isinstance(other, torch.Tensor) and (other.is_sparse or other.dim()) else self
        raise RuntimeError(f"Sparse division requires a scalar or zero-dim dense tensor divisor (got shape "
                           f"{list(divisor.shape)} for divisor)")
    if rounding_mode is not None:  # rounding each duplicate is not rounding their sum: CPU coalesces first
        self = self.coalesce()
    values = torch.div(self._values(), other, rounding_mode=rounding_mode)
    return _sparse(self._indices().clone(), values, self.shape, self.is_coalesced())


def div_out(self, other, *, rounding_mode=None, out):
    quotient = div(self, other, rounding_mode=rounding_mode)
    if not torch.can_cast(quotient.dtype, out.dtype):
        raise RuntimeError(f"result type {_name(quotient.dtype)} can't be cast to the desired output type "
                           f"{_name(out.dtype)}")
    return _store(out, quotient)


def div_(self, other, *, rounding_mode=None):
    return div_out(self, other, rounding_mode=rounding_mode, out=self)


def to_sparse(self, *, layout=None, blocksize=None, dense_dim=None):
    """_to_sparse of a dense pjrt tensor: COO only (coalesced, as CPU builds it)."""
    if layout not in (None, torch.sparse_coo) or blocksize is not None:
        raise NotImplementedError(f"pjrt: aten._to_sparse: layout {layout} (compressed sparse layouts) is not "
                                  f"supported on pjrt devices; torch.sparse_coo is")
    return to_sparse_dim(self, self.dim() - (dense_dim or 0))


def to_sparse_dim(self, sparse_dim):
    """_to_sparse.sparse_dim: the nonzero slices over the first sparse_dim dimensions."""
    if not 0 <= sparse_dim <= self.dim():
        raise RuntimeError(f"sparse_dim argument must be in [0, {self.dim()}] but got {sparse_dim}")
    if sparse_dim == 0 and self.dim() > 0:
        raise RuntimeError("dense_to_sparse: sparse_dim argument must be in >0 when self.dim()>0")
    nonzero = self != 0
    if self.dim() > sparse_dim:
        nonzero = nonzero.flatten(sparse_dim).any(-1)
    indices = nonzero.nonzero().t().contiguous() if sparse_dim else self.new_zeros((0, 1), dtype=torch.int64)
    values = _at(self, indices)
    return _sparse(indices, values, self.shape, True)


def kernels() -> dict:
    """PrivateUse1 kernels that replace a lowering's (eager/kernels.register's `special`)."""
    from ..ops.registry import LOWERINGS
    from .kernels import Kernel

    op = torch.ops.aten._embedding_bag_backward.default
    return {op: _EmbeddingBagBackward(Kernel(LOWERINGS[op]))}


class _EmbeddingBagBackward:
    """sparse=False: the table's lowering; sparse=True: torch's composite
    _embedding_bag_sparse_backward (index_select, then embedding's sparse backward), after
    filling offset2bag where the forward's fast sum path left it empty, as CPU's kernel does."""

    def __init__(self, dense):
        self.dense = dense

    def __call__(self, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                 scale_grad_by_freq, mode, sparse, per_sample_weights=None, padding_idx=-1):
        if not sparse:
            return self.dense(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                              scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx)
        indices = indices.reshape(-1)
        if indices.numel() and offset2bag.numel() == 0:
            positions = torch.arange(indices.numel(), device=indices.device, dtype=offsets.dtype)
            offset2bag = torch.searchsorted(offsets, positions, right=True) - 1
        return torch.ops.aten._embedding_bag_sparse_backward(grad, indices, offsets, offset2bag, bag_size,
                                                             num_weights, scale_grad_by_freq, mode,
                                                             per_sample_weights, padding_idx)


def register() -> None:
    global _library
    _library = torch.library.Library("aten", "IMPL")
    for name, kernel in (("_coalesce", _coalesce), ("add.out", add_out), ("sub.out", sub_out), ("sub.Tensor", sub),
                         ("sub_.Tensor", sub_), ("sparse_mask", sparse_mask),
                         ("_sparse_mask_projection", sparse_mask_projection), ("addmm", addmm),
                         ("index_select", index_select), ("mul.Tensor", mul), ("mul_.Tensor", mul_), ("mul.out", mul_out),
                         ("div.Tensor", div), ("div_.Tensor", div_), ("div.out", div_out), ("div.Tensor_mode", div),
                         ("div_.Tensor_mode", div_), ("div.out_mode", div_out)):
        _library.impl(name, kernel, "SparsePrivateUse1")
    for name, kernel in (("_to_sparse", to_sparse), ("_to_sparse.sparse_dim", to_sparse_dim)):
        _library.impl(name, kernel, "PrivateUse1")  # a dense pjrt tensor to COO
