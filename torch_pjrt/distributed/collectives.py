"""Collectives over a named mesh axis, and the lowerings of the functional collectives
(`torch.ops._c10d_functional`) built on them.

The per-shard bodies (`BODIES`) are one rank's side of a collective over a mesh axis
(`AXIS` unless told), for code running under `jax.shard_map` on a mesh with one device
per rank. Two consumers use them: the process group's eager XLA path (distributed/xla.py
runs one body per call) and compiled graphs whose collectives run over pjrt process
groups that one mesh spans, one group per mesh axis (compiler/spmd.py traces the whole
graph under `shard_map` on that mesh and names each group's axis with `over_groups`):
there each collective node is its body, an XLA collective inside the graph's one
executable.

Any other compiled graph (uneven all_to_all splits, groups no mesh spans, gloo groups,
symbolic sizes) runs each collective as an ordered host callback
(`io_callback(ordered=True)`: exactly once, in program order, so every rank issues its
collectives in the same order) on CPU tensors over the graph's process group: the
graph stays one executable, the collective itself is host-staged.

Eager calls never come here: c10d's own kernels of these ops call the process group
(torch_pjrt.distributed), which their entries say (`eager=`), so eager derives no kernel
from them. The lowerings live here, in the distributed layer, because their host path
calls torch.distributed; the op table itself stays pure.
"""
from __future__ import annotations
import contextlib
import threading
from typing import Callable
import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from jax.experimental import io_callback
from ..ops.registry import family

lowering = family(not_paddable="a collective exchanges whole tensors between ranks at their exact shapes",
                  eager="c10d's own kernels call the process group (torch_pjrt.distributed)")


c10d = torch.ops._c10d_functional
AXIS = "g"

# ---------------------------------------------------------------------------------
# per-shard bodies: body(n, **params) -> function of this rank's block (n ranks on AXIS)
# ---------------------------------------------------------------------------------
REDUCE_OPS = ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR")
# bitwise ReduceOps: XLA has no such all-reduce, so every block is gathered and reduced locally
_BITWISE = {"BAND": jnp.bitwise_and, "BOR": jnp.bitwise_or, "BXOR": jnp.bitwise_xor}
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _gathered(x, axis: str):
    """Every rank's block stacked on a new leading axis (n, *block)."""
    return jax.lax.all_gather(x, axis, axis=0, tiled=False)


def all_reduce_body(n: int, op: str, axis: str = AXIS) -> Callable:
    def body(x):
        if x.dtype == jnp.bool_:  # torch reduces bools as logical or (SUM, MAX) / and (MIN, PRODUCT)
            u = x.astype(jnp.uint8)
            return (jax.lax.pmax(u, axis) if op in ("SUM", "MAX", "BOR") else jax.lax.pmin(u, axis)).astype(jnp.bool_)
        if op == "SUM":
            return jax.lax.psum(x, axis)
        if op == "AVG":
            return (jax.lax.psum(x, axis) / n).astype(x.dtype)
        if op == "MAX":
            return jax.lax.pmax(x, axis)
        if op == "MIN":
            return jax.lax.pmin(x, axis)
        if op == "PRODUCT":  # XLA has no product all-reduce: gather, then multiply in rank order
            return jnp.prod(_gathered(x, axis), axis=0, dtype=x.dtype)
        return _BITWISE[op].reduce(_gathered(x, axis), axis=0)

    return body


def broadcast_body(n: int, src: int, axis: str = AXIS) -> Callable:
    """psum of the source's block and zeros elsewhere, on the bits (XLA:CPU lacks
    collective-broadcast): adding zero bits keeps -0.0 and NaN payloads exact."""
    def body(x):
        if x.dtype in (jnp.complex64, jnp.complex128):
            return jax.lax.complex(body(x.real), body(x.imag))
        bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize]) if x.dtype != jnp.bool_ else x.astype(jnp.uint8)
        mine = jnp.where(jax.lax.axis_index(axis) == src, bits, jnp.zeros_like(bits))
        total = jax.lax.psum(mine, axis)
        return total.astype(jnp.bool_) if x.dtype == jnp.bool_ else jax.lax.bitcast_convert_type(total, x.dtype)

    return body


def all_gather_body(n: int, axis: str = AXIS) -> Callable:
    """Block (c, ...) -> (n*c, ...): every rank's block in rank order."""
    return lambda x: jax.lax.all_gather(x, axis, axis=0, tiled=True)


def reduce_scatter_body(n: int, op: str, axis: str = AXIS) -> Callable:
    """Block (n*c, ...) -> (c, ...): chunk r of the reduction over ranks."""
    reduce = all_reduce_body(n, op, axis)  # for the reductions XLA only offers as all-reduce

    def body(x):
        if op == "SUM" and x.dtype != jnp.bool_:
            return jax.lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)
        if op == "AVG":
            return (jax.lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True) / n).astype(x.dtype)
        chunk = x.shape[0] // n
        rank = jax.lax.axis_index(axis)
        return jax.lax.dynamic_slice_in_dim(reduce(x), rank * chunk, chunk, axis=0)

    return body


def all_to_all_body(n: int, axis: str = AXIS) -> Callable:
    """Block (n*c, ...): chunk j goes to rank j; the result holds chunk r of every rank, in rank order."""
    return lambda x: jax.lax.all_to_all(x, axis, 0, 0, tiled=True)


def _as_bytes(x):
    """`x`'s bytes as a flat uint8 vector (bits kept exactly: NaN payloads, -0.0)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8).reshape(-1)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([x.real, x.imag], axis=-1)
    return jax.lax.bitcast_convert_type(x, jnp.uint8).reshape(-1)


def _from_bytes(b, like):
    """The inverse of `_as_bytes`: bytes `b` as an array of `like`'s shape and dtype."""
    if like.dtype == jnp.bool_:
        return b.reshape(like.shape) != 0
    if jnp.issubdtype(like.dtype, jnp.complexfloating):
        part = jnp.float32 if like.dtype == jnp.complex64 else jnp.float64
        pairs = _from_bytes(b, jax.ShapeDtypeStruct(tuple(like.shape) + (2,), part))
        return jax.lax.complex(pairs[..., 0], pairs[..., 1])
    size = jnp.dtype(like.dtype).itemsize
    shape = tuple(like.shape) + ((size,) if size > 1 else ())
    return jax.lax.bitcast_convert_type(b.reshape(shape), like.dtype)


def exchange_body(n: int, forward: int, axis: str = AXIS) -> Callable:
    """Point-to-point between the two ranks of a pair's mesh (rank 0 the lower): operands
    [0, forward) travel 0 -> 1, the rest 1 -> 0. Both ranks pass every operand at its shape
    (the sender its data, the receiver its receive buffer), so both trace one program; each
    direction's operands travel as their concatenated bytes in one collective-permute, and
    every operand comes back: the received value on the receiver, the receiver's zeros on the
    sender (unused)."""
    def body(*xs):
        out = []
        for part, perm in ((xs[:forward], [(0, 1)]), (xs[forward:], [(1, 0)])):
            if not part:
                continue
            if len(part) == 1 and part[0].dtype != jnp.bool_:  # nothing to concatenate
                out.append(jax.lax.ppermute(part[0], axis, perm))
                continue
            moved = jax.lax.ppermute(jnp.concatenate([_as_bytes(x) for x in part]), axis, perm)
            start = 0
            for x in part:
                size = x.size * jnp.dtype(x.dtype).itemsize
                out.append(_from_bytes(jax.lax.slice_in_dim(moved, start, start + size), x))
                start += size
        return tuple(out)

    return body


BODIES = {"all_reduce": all_reduce_body, "broadcast": broadcast_body, "all_gather": all_gather_body,
          "reduce_scatter": reduce_scatter_body, "all_to_all": all_to_all_body, "exchange": exchange_body}


# ---------------------------------------------------------------------------------
# which groups the graph being traced runs over (set by compiler/spmd.py while tracing)
# ---------------------------------------------------------------------------------
_tracing = threading.local()


@contextlib.contextmanager
def over_groups(axes: dict):
    """While tracing under `shard_map` on a mesh where process group `name` spans mesh axis
    `axes[name] = (axis, size)`, that group's functional collectives lower to XLA collectives."""
    _tracing.axes = axes
    try:
        yield
    finally:
        _tracing.axes = None


def group_name(group) -> str:
    """A graph names its group by name (str), or passes the group itself (newer graphs, DTensor)."""
    return group if isinstance(group, str) else group.group_name


def _spmd_axis(group) -> tuple[str, int] | None:
    """(mesh axis, size) when the graph is traced over a mesh the group spans, else None (host path)."""
    axes = getattr(_tracing, "axes", None)
    return axes.get(group_name(group)) if axes else None


def even_all_to_all(input_rows: int, output_split_sizes, input_split_sizes, size: int) -> bool:
    """all_to_all_single's XLA form needs equal chunks."""
    chunk = input_rows // size
    return all(s == chunk for s in list(output_split_sizes or []) + list(input_split_sizes or [])) \
        and input_rows % size == 0


# ---------------------------------------------------------------------------------
# host-side collectives on CPU tensors (public torch.distributed API: any group works)
# ---------------------------------------------------------------------------------
# torch 2.13 renamed these (the old names warn); torch 2.11 and 2.12 have only the old ones
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _group(group):
    if isinstance(group, str):
        return torch._C._distributed_c10d._resolve_process_group(group)
    return group


def _reduce_op(name: str):
    return getattr(dist.ReduceOp, name.upper())


def _on_host(collective, x, out_shape, *static):
    """Run `collective(cpu_tensor, *static) -> cpu_tensor` as an ordered callback producing `out_shape`."""
    from ..runtime import storage

    def run(value):
        result = collective(storage.from_numpy(np.asarray(value)), *static)
        return storage.to_numpy(result)

    return io_callback(run, jax.ShapeDtypeStruct(tuple(out_shape), x.dtype), x, ordered=True)


def _all_reduce(t, op, group):
    dist.all_reduce(t, _reduce_op(op), group=_group(group))
    return t


def _all_gather(t, group_size, group):
    out = t.new_empty((group_size * t.shape[0],) + tuple(t.shape[1:]))
    _all_gather_single(out, t.contiguous(), group=_group(group))
    return out


def _reduce_scatter(t, op, group_size, group):
    out = t.new_empty((t.shape[0] // group_size,) + tuple(t.shape[1:]))
    _reduce_scatter_single(out, t.contiguous(), _reduce_op(op), group=_group(group))
    return out


def _all_to_all(t, output_split_sizes, input_split_sizes, group):
    rows = sum(output_split_sizes) if output_split_sizes else t.shape[0]
    out = t.new_empty((rows,) + tuple(t.shape[1:]))
    dist.all_to_all_single(out, t.contiguous(), list(output_split_sizes) or None, list(input_split_sizes) or None,
                           group=_group(group))
    return out


def _broadcast(t, src, group):
    group = _group(group)
    dist.broadcast(t, dist.get_global_rank(group, src), group=group)  # src is a group rank
    return t


# ---------------------------------------------------------------------------------
# lowerings
# ---------------------------------------------------------------------------------
@lowering(c10d.all_reduce.default)
def all_reduce(input, reduce_op, group_name):
    spmd = _spmd_axis(group_name)
    if spmd is not None:
        axis, n = spmd
        return all_reduce_body(n, reduce_op.upper(), axis)(input)
    return _on_host(_all_reduce, input, input.shape, reduce_op, group_name)


@lowering(c10d.all_reduce_coalesced.default)
def all_reduce_coalesced(inputs, reduce_op, group_name):
    return [all_reduce(x, reduce_op, group_name) for x in inputs]


@lowering(c10d.all_gather_into_tensor.default)
def all_gather_into_tensor(input, group_size, group_name):
    spmd = _spmd_axis(group_name)
    if spmd is not None:
        return all_gather_body(group_size, spmd[0])(input)
    shape = (group_size * input.shape[0],) + tuple(input.shape[1:])
    return _on_host(_all_gather, input, shape, group_size, group_name)


@lowering(c10d.all_gather_into_tensor_coalesced.default)
def all_gather_into_tensor_coalesced(inputs, group_size, group_name):
    return [all_gather_into_tensor(x, group_size, group_name) for x in inputs]


@lowering(c10d.reduce_scatter_tensor.default)
def reduce_scatter_tensor(input, reduce_op, group_size, group_name):
    spmd = _spmd_axis(group_name)
    if spmd is not None:
        return reduce_scatter_body(group_size, reduce_op.upper(), spmd[0])(input)
    shape = (input.shape[0] // group_size,) + tuple(input.shape[1:])
    return _on_host(_reduce_scatter, input, shape, reduce_op, group_size, group_name)


@lowering(c10d.reduce_scatter_tensor_coalesced.default)
def reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size, group_name):
    return [reduce_scatter_tensor(x, reduce_op, group_size, group_name) for x in inputs]


@lowering(c10d.all_to_all_single.default)
def all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):
    spmd = _spmd_axis(group_name)
    if spmd is not None and even_all_to_all(input.shape[0], output_split_sizes, input_split_sizes, spmd[1]):
        return all_to_all_body(spmd[1], spmd[0])(input)
    if spmd is not None:  # compiler/spmd.py sends graphs with uneven splits to the host path
        raise ValueError("all_to_all_single with uneven splits has no XLA form")
    rows = sum(output_split_sizes) if output_split_sizes else input.shape[0]
    shape = (rows,) + tuple(input.shape[1:])
    return _on_host(_all_to_all, input, shape, tuple(output_split_sizes), tuple(input_split_sizes), group_name)


@lowering(c10d.broadcast.default)
def broadcast(input, src, group_name):
    spmd = _spmd_axis(group_name)
    if spmd is not None:
        axis, n = spmd
        return broadcast_body(n, src, axis)(input)
    return _on_host(_broadcast, input, input.shape, src, group_name)


@lowering(c10d.wait_tensor.default)
def wait_tensor(tensor):
    return tensor  # an XLA collective or a host callback: done before its result exists
