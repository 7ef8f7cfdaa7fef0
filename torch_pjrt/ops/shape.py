"""Lowerings: shape family (concatenation, flips, repeats, pads, copies, factories).

Factories take their dtype from the `dtype` argument or torch's default inference
(a bool/int/float/complex fill, the default float dtype); the device and layout
arguments are the runtime's business and are ignored here. linspace/logspace follow
torch's CPU kernel (its scalar path), which fills the first half from `start` and the
second half from `end`; for integer outputs with a fractional step, torch's vectorised
path rounds some elements differently (it depends on the CPU's vector width).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from ..dtypes import astype, to_jax, to_torch
from . import core
from .growth import Growth, PaddedOperand
from .promotion import default_float, promote
from .registry import family, FACTORY, Padding, refusal, SAME, suggested_memory_format
from .views import wrap_dim

lowering = family(not_paddable="no padding rule yet: it moves elements along a possibly padded dim (flip, roll, pad)")

aten = torch.ops.aten
INT64 = jnp.int64


# --------------------------------------------------------------------------- helpers
def complex_of(real):
    return {np.dtype(np.float64): np.dtype(np.complex128)}.get(np.dtype(real), np.dtype(np.complex64))


def infer_fill_dtype(value):
    """torch.full's dtype for a fill value when none is given: bool, int64, default float/complex."""
    kind = np.dtype(jnp.result_type(value)).kind if not isinstance(value, (bool, int, float, complex)) \
        else {bool: "b", int: "i", float: "f", complex: "c"}[type(value)]
    if kind == "b":
        return np.dtype(np.bool_)
    if kind in "iu":
        return np.dtype(np.int64)
    if kind == "c":
        return complex_of(default_float())
    return default_float()


def convert(x, dtype):
    """torch's dtype conversion: complex -> real keeps the real part; -> bool is != 0."""
    dtype = np.dtype(dtype)
    if np.dtype(x.dtype) == dtype:
        return x
    if jnp.iscomplexobj(x) and dtype.kind != "c":
        x = jnp.real(x)
    if dtype == np.bool_:
        return x != 0
    return astype(x, dtype)


def filled(shape, value, dtype):
    return jnp.full(tuple(shape), convert(jnp.asarray(value), dtype), dtype)


def _dtype_or(dtype, default):
    return np.dtype(default) if dtype is None else to_jax(dtype)


# --------------------------------------------------------------------------- joins
def _is_legacy_empty(t):
    return t.ndim == 1 and t.shape[0] == 0


def _cat_grows(tensors, dim=0) -> Growth | None:
    """An append (a KV cache token by token): the first tensor grows along `dim`."""
    if len(tensors) < 2:
        return None
    shapes = [t.shape for t in tensors]
    ndim = len(shapes[0])
    if ndim == 0 or any(len(s) != ndim for s in shapes):
        return None
    try:
        axis = wrap_dim(dim, ndim)
    except IndexError:  # the lowering raises torch's error
        return None
    return Growth(operands=((0, 0),), axis=axis, length=sum(s[axis] for s in shapes))


def _cat_growing(tensors, dim):
    """cat onto a padded first tensor: the rest written at its length, inside its capacity."""
    base, rest = tensors[0], tensors[1:]
    _, dtype = promote(base.array, *rest)
    piece = jnp.concatenate([t.astype(dtype) for t in rest], axis=base.axis)
    start = [jnp.zeros((), INT64)] * base.ndim
    start[base.axis] = base.length
    out = jax.lax.dynamic_update_slice(base.array.astype(dtype), piece, start)
    return PaddedOperand(out, base.axis, base.length + piece.shape[base.axis])


@lowering(aten.cat.default, padding=Padding("cat"), grows=lambda values: _cat_grows(*values))
def cat(tensors, dim=0):
    if isinstance(tensors[0], PaddedOperand):
        return _cat_growing(tensors, dim)
    _, dtype = promote(*tensors)
    kept = [t for t in tensors if not _is_legacy_empty(t)]  # torch skips 1-D empties of any shape
    if not kept:
        return jnp.zeros((0,), dtype)
    dim = wrap_dim(dim, kept[0].ndim)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=dim)


@lowering(aten.stack.default, padding=Padding("stack"))
def stack(tensors, dim=0):
    _, dtype = promote(*tensors)
    dim = wrap_dim(dim, tensors[0].ndim + 1)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=dim)


# --------------------------------------------------------------------------- rearrangements
@lowering(aten.flip.default)
def flip(self, dims):
    axes = tuple(wrap_dim(d, self.ndim) for d in dims)
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"dims has duplicates, original flip dims size={len(dims)}, but unique flip dims size={len(set(axes))}")
    return jnp.flip(self, tuple(a for a in axes if a < self.ndim)) if axes and self.ndim else self


@lowering(aten.roll.default, traced=("shifts",))
def roll(self, shifts, dims=()):
    """`shifts` is traced (a new shift compiles nothing): jnp.roll turns traced shifts into a
    dynamic slice of the doubled axis, wrapping modulo the size as torch does."""
    if not dims:
        if len(shifts) != 1:
            raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:0")
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape) if self.size else self
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    if self.ndim == 0 or self.size == 0:
        return self
    return jnp.roll(self, tuple(shifts), tuple(wrap_dim(d, self.ndim) for d in dims))


@lowering(aten.repeat.default)
def repeat(self, repeats):
    if len(repeats) < self.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(x, tuple(repeats))


def _checked_total(repeats, output_size, length: int | None = None) -> int:
    """The result's length for a repeats tensor (concrete here: jit=False), after CPU's checks of
    it, in CPU's order: 1-D, int32 or int64, `length` counts (self's size along dim), then the
    sum against `output_size` (skipped for an empty repeats, whose result is empty), then no
    negative count. A refusal is a ValueError, for which eager's oracle raises CPU's exact error.
    (jnp.repeat flattened a 2-D repeats, took float, int16 or uint8 counts, treated a negative
    count as 0, and padded or cut to an output_size other than the sum, all silently.)"""
    if (repeats.ndim != 1 or repeats.dtype not in (jnp.int32, jnp.int64)
            or (length is not None and repeats.shape[0] != length)):
        raise ValueError("repeat_interleave: repeats CPU refuses")
    if repeats.shape[0] == 0:
        return 0
    total = int(jnp.sum(repeats.astype(INT64)))
    if output_size is not None and output_size != total:  # CPU: "allocated size does not match required size"
        raise ValueError(f"repeat_interleave: output_size {output_size}, repeats sum to {total}")
    if bool(jnp.any(repeats < 0)):
        if output_size is not None:
            # CPU's kernel, given output_size, meets a negative count while writing its result: the counts
            # before it may write past the result (a crash), so CPU is not asked here; these are its words
            raise refusal(RuntimeError("repeats can not be negative"))
        raise ValueError("repeat_interleave: negative repeats")
    return total


@lowering(aten.repeat_interleave.Tensor, jit=False)
def repeat_interleave(repeats, *, output_size=None):
    """The indices of `repeats`' entries, each repeated that many times, in repeats' dtype (int32
    or int64, as CPU's result)."""
    total = _checked_total(repeats, output_size)
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats.astype(INT64), total_repeat_length=total)


@lowering(aten.repeat_interleave.self_Tensor, jit=False)
def repeat_interleave_self_tensor(self, repeats, dim=None, *, output_size=None):
    x, dim = (self.reshape(-1), 0) if dim is None else (self, wrap_dim(dim, self.ndim))
    x = x.reshape(1) if x.ndim == 0 else x
    if repeats.ndim <= 1 and repeats.size == 1:  # CPU expands a single count over the dim first
        repeats = jnp.broadcast_to(repeats.reshape(1), (x.shape[dim],))
    total = _checked_total(repeats, output_size, length=x.shape[dim])
    return jnp.repeat(x, repeats.astype(INT64), axis=dim, total_repeat_length=total)


@lowering(aten.repeat_interleave.self_int)
def repeat_interleave_self_int(self, repeats, dim=None, *, output_size=None):
    x, dim = (self.reshape(-1), 0) if dim is None else (self, wrap_dim(dim, self.ndim))
    x = x.reshape(1) if x.ndim == 0 else x
    return jnp.repeat(x, repeats, axis=dim)


def _keep_triangle(self, diagonal, lower: bool, name: str):
    """tril/triu with `diagonal` traced (a new diagonal compiles nothing): a mask of iotas."""
    if self.ndim < 2:
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    rows, cols = self.shape[-2:]
    offset = (jax.lax.broadcasted_iota(jnp.int64, (rows, cols), 1)
              - jax.lax.broadcasted_iota(jnp.int64, (rows, cols), 0))  # col - row
    keep = offset <= diagonal if lower else offset >= diagonal
    return jnp.where(keep, self, jnp.zeros((), self.dtype))


@lowering(aten.tril.default, padding=Padding("tril"), traced=("diagonal",))
def tril(self, diagonal=0):
    return _keep_triangle(self, diagonal, True, "tril")


@lowering(aten.triu.default, padding=Padding("tril"), traced=("diagonal",))
def triu(self, diagonal=0):
    return _keep_triangle(self, diagonal, False, "triu")


# --------------------------------------------------------------------------- padding
def _pad_widths(ndim, pad):
    """torch's pad list (last dim first, (before, after) pairs) as per-dim (lo, hi)."""
    if len(pad) % 2:
        raise RuntimeError("Length of pad must be even but instead it equals " + str(len(pad)))
    if len(pad) // 2 > ndim:
        raise RuntimeError(f"Length of pad should be no more than twice the number of dimensions of the input. "
                           f"Pad length is {len(pad)} while the input has {ndim} dimensions.")
    widths = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        widths[ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return widths


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    cfg = [(lo, hi, 0) for lo, hi in _pad_widths(self.ndim, pad)]  # negative pads crop
    return jax.lax.pad(self, convert(jnp.asarray(value), self.dtype), cfg)


def _pad_fn(mode, nd):
    def pad(x, padding):
        if x.ndim not in (nd + 1, nd + 2):
            raise RuntimeError(f"Expected {nd + 1}D or {nd + 2}D (batch mode) tensor with possibly 0 batch size "
                               f"and other non-zero dimensions for input, but got: {list(x.shape)}")
        widths = _pad_widths(x.ndim, padding)
        if mode == "reflect" and all(lo >= 0 and hi >= 0 for lo, hi in widths):
            return jnp.pad(x, widths, mode=mode)
        # out[i] = x[i - lo], the position reflected about (or clamped to) the input's own ends, as
        # CPU's kernels index; negative widths crop. Not crop-then-pad: a reflection after a crop
        # would turn about the cropped end
        for d, (lo, hi) in enumerate(widths):
            if lo or hi:
                n = x.shape[d]
                source = np.arange(n + lo + hi) - lo
                if mode == "reflect":
                    source = np.abs(source)
                    source = np.where(source >= n, 2 * (n - 1) - source, source)
                x = jnp.take(x, np.clip(source, 0, n - 1), axis=d)
        return x

    return pad


def _register_pad(name, mode, nd):
    fwd_op, bwd_op = getattr(aten, name).default, getattr(aten, name + "_backward").default
    pad = _pad_fn(mode, nd)

    def forward(self, padding):
        return pad(self, padding)

    def backward(grad_output, self, padding):
        _, vjp = jax.vjp(lambda x: pad(x, padding), self)
        return vjp(grad_output.astype(self.dtype))[0]

    forward.__name__ = forward.__qualname__ = name
    backward.__name__ = backward.__qualname__ = name + "_backward"
    return lowering(fwd_op, output_memory_format=suggested_memory_format)(forward), lowering(bwd_op)(backward)


reflection_pad1d, reflection_pad1d_backward = _register_pad("reflection_pad1d", "reflect", 1)
reflection_pad2d, reflection_pad2d_backward = _register_pad("reflection_pad2d", "reflect", 2)
reflection_pad3d, reflection_pad3d_backward = _register_pad("reflection_pad3d", "reflect", 3)
replication_pad1d, replication_pad1d_backward = _register_pad("replication_pad1d", "edge", 1)
replication_pad2d, replication_pad2d_backward = _register_pad("replication_pad2d", "edge", 2)
replication_pad3d, replication_pad3d_backward = _register_pad("replication_pad3d", "edge", 3)


# --------------------------------------------------------------------------- copies
@lowering(aten.clone.default, padding=SAME,
          eager="eager/transfer.py's clone: shares the source's buffer until one is written, keeps its layout")
def clone(self, *, memory_format=None):
    return self  # buffers are immutable: a clone is the same values


@lowering(aten.contiguous.default, padding=SAME)
def contiguous(self, *, memory_format=torch.contiguous_format):
    return self


@lowering(aten.copy.default, padding=SAME,
          eager="torch's own copy_ serves eager: it routes copies between devices to _copy_from (eager/transfer.py)")
def copy(self, src, non_blocking=False):
    """Functionalised copy_: src broadcast to self's shape, in self's dtype."""
    return jnp.broadcast_to(convert(src, self.dtype), self.shape)


@lowering(aten._to_copy.default, padding=SAME, eager="eager/transfer.py's to_copy: the copy may cross devices")
def _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return self if dtype is None else convert(self, to_jax(dtype))


# Dynamo's float arguments reach graphs as 0-d float64 tensors converted by this prim
# (torch.fx.passes._tensorify_python_scalars), which AOTAutograd leaves in place.
@lowering(torch.ops.prims.convert_element_type.default)
def convert_element_type(a, dtype):
    return convert(a, to_jax(dtype))


# --------------------------------------------------------------------------- fills and factories
# fill.Scalar / fill.Tensor / zero are core.py's lowerings.


@lowering(aten.zeros_like.default, padding=SAME)
def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(self.shape, _dtype_or(dtype, self.dtype))


_FRESH_MEMORY = ("torch's CompositeExplicitAutograd kernel: the runtime's metadata kernels (empty, empty_strided) "
                 "give fresh memory in the layout CPU gives, filled as CPU fills it in deterministic mode")


lowering(aten.empty_like.default, padding=SAME, eager=_FRESH_MEMORY)(zeros_like)  # compiled graphs: zeros


@lowering(aten.ones_like.default, padding=SAME)
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(self.shape, _dtype_or(dtype, self.dtype))


@lowering(aten.full_like.default, padding=SAME, scalar_fits="fill_value")
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return filled(self.shape, fill_value, _dtype_or(dtype, self.dtype))


@lowering(aten.full.default, padding=FACTORY, scalar_fits="fill_value")
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return filled(size, fill_value, _dtype_or(dtype, infer_fill_dtype(fill_value)))


@lowering(aten._efficientzerotensor.default)
def _efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """torch.func's zero gradients: plain zeros here. pjrt tensors have no ZeroTensor
    dispatch key, which only spares the memory; the values and dtype are the same."""
    return jnp.zeros(tuple(size), _dtype_or(dtype, default_float()))


@lowering(aten.scalar_tensor.default, padding=FACTORY, scalar_fits="s")
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return filled((), s, _dtype_or(dtype, default_float()))


@lowering(aten.new_zeros.default, padding=FACTORY)
def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype_or(dtype, self.dtype))


lowering(aten.new_empty.default, padding=FACTORY, eager=_FRESH_MEMORY)(new_zeros)  # compiled graphs: zeros


@lowering(aten.new_empty_strided.default,
          eager="torch's CompositeExplicitAutograd kernel: empty_strided (the runtime's metadata kernel) keeps "
                "the asked strides, as on the CPU (this lowering's result is laid out contiguous)")
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype_or(dtype, self.dtype))


@lowering(aten.new_ones.default, padding=FACTORY)
def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _dtype_or(dtype, self.dtype))


@lowering(aten.new_full.default, padding=FACTORY, scalar_fits="fill_value")
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return filled(size, fill_value, _dtype_or(dtype, self.dtype))


@lowering(aten.eye.default)
def eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, dtype=_dtype_or(dtype, default_float()))


@lowering(aten.eye.m)
def eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=_dtype_or(dtype, default_float()))


# arange.start_step is core.py's lowering; the shorter overloads reuse it.
@lowering(aten.arange.default, static=("end",), padding=Padding("arange"))
def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return core.arange(0, end, 1, dtype=dtype)


@lowering(aten.arange.start, static=("start", "end"), padding=Padding("arange"), scalar_fits="start")
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return core.arange(start, end, 1, dtype=dtype)


# inductor's decompositions write arange as prims.iota (the default torch.compile backend
# hands its post-grad graphs to this table: compiler/inductor.py)
@lowering(torch.ops.prims.iota.default, static=("length", "start", "step"), padding=Padding("arange"))
def iota(length, *, start, step, dtype, device, requires_grad):
    return core.arange(start, start + length * step, step, dtype=dtype)


def _linspace_exponents(start, end, steps, dtype):
    """torch's CPU linspace in its step type (the dtype for floats, double for integers)."""
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    step_dt = np.dtype(np.float64) if np.dtype(dtype).kind in "iub" else np.dtype(dtype)
    # torch first converts start and end to the output dtype (an int output truncates them)
    start = convert(convert(jnp.asarray(start).reshape(()), dtype), step_dt)
    end = convert(convert(jnp.asarray(end).reshape(()), dtype), step_dt)
    if steps <= 1:
        return jnp.broadcast_to(start, (steps,)), step_dt
    # steps - 1 is a constant of the trace, and XLA's simplifier rewrites a division by a
    # constant into a product with its reciprocal (126 / 49 one ulp low, so an int linspace
    # truncated 54.99.. to 54 where CPU gives 55); the barrier keeps a true division
    step = (end - start) / jax.lax.optimization_barrier(jnp.asarray(steps - 1, step_dt))
    i = jnp.arange(steps, dtype=INT64)
    lo = start + step * i.astype(step_dt)
    hi = end - step * (steps - 1 - i).astype(step_dt)
    return jnp.where(i < steps // 2, lo, hi), step_dt


def _range_dtype(dtype, *values):
    if dtype is not None:
        return to_jax(dtype)
    if any(jnp.iscomplexobj(v) for v in values):
        return complex_of(default_float())
    return default_float()


def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = _range_dtype(dtype, start, end)
    values, _ = _linspace_exponents(start, end, steps, dt)
    return convert(values, dt)


def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = _range_dtype(dtype, start, end)
    exps, step_dt = _linspace_exponents(start, end, steps, dt)
    wide = np.dtype(np.complex128) if np.dtype(step_dt).kind == "c" else np.dtype(np.float64)
    return convert(jnp.power(jnp.asarray(base, wide), exps.astype(wide)), dt)  # pow in double, as torch


# CPU converts Scalar ends to the result's dtype with an overflow check (int8 300, float16 1e6)
_ENDS = ("start", "end")
for _op in (aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor):
    lowering(_op, scalar_fits=_ENDS)(linspace)
for _op in (aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor):
    lowering(_op, scalar_fits=_ENDS)(logspace)


def _in_out_shape(values, out):
    """CPU's linspace/logspace/arange out=: `out` is resized only when its element count differs;
    otherwise the values fill out's own shape in its element order (torch's generic out= rule
    resizes any other shape, and a non-contiguous out then took them at other storage positions)."""
    return values.reshape(out.shape) if values.size == out.size else values


def linspace_out(start, end, steps, *, out):
    return _in_out_shape(linspace(start, end, steps, dtype=to_torch(out.dtype)), out)


def logspace_out(start, end, steps, base=10.0, *, out):
    return _in_out_shape(logspace(start, end, steps, base, dtype=to_torch(out.dtype)), out)


for _op in (aten.linspace.out, aten.linspace.Tensor_Tensor_out, aten.linspace.Tensor_Scalar_out,
            aten.linspace.Scalar_Tensor_out):
    lowering(_op, resizes_out=True, scalar_fits=_ENDS)(linspace_out)  # CPU resizes out quietly
for _op in (aten.logspace.out, aten.logspace.Tensor_Tensor_out, aten.logspace.Tensor_Scalar_out,
            aten.logspace.Scalar_Tensor_out):
    lowering(_op, resizes_out=True, scalar_fits=_ENDS)(logspace_out)
