"""Lowerings of the functional collectives (`torch.ops._c10d_functional`) for compiled graphs.

A compiled graph runs as one `jax.jit` on one device (compiler/interpreter.py), so a
collective inside it cannot be an XLA collective over other processes' devices: that
would need the whole graph to run under a multi-process mesh. Here each collective is an
ordered host callback (`io_callback(ordered=True)`: it runs exactly once, in program
order, so every rank issues its collectives in the same order) that runs the collective
on CPU tensors over the graph's process group, i.e. the group's gloo path. The graph stays
one executable with no graph break; the collective itself is host-staged.

Eager calls never come here: c10d's own kernels of these ops call the process group
(torch_pjrt.distributed), whose XLA path serves pjrt tensors. That is also why this module
is imported only after the eager kernels are registered (torch_pjrt.distributed.register):
the eager kernel generator would otherwise register these non-aten ops as aten kernels.
"""
from __future__ import annotations

import jax
import numpy as np
import torch
import torch.distributed as dist
from jax.experimental import io_callback

from .registry import lowering

c10d = torch.ops._c10d_functional

# torch 2.13 renamed these (the old names warn); torch 2.11 and 2.12 have only the old ones
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_REDUCE_OPS = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT",
               "band": "BAND", "bor": "BOR", "bxor": "BXOR"}


def _group(group):
    """The process group a graph names: by name (str), or the group itself (newer graphs pass it)."""
    if isinstance(group, str):
        return torch._C._distributed_c10d._resolve_process_group(group)
    return group


def _reduce_op(name: str):
    return getattr(dist.ReduceOp, _REDUCE_OPS[name.lower()])


def _on_host(collective, x, out_shape, *static):
    """Run `collective(cpu_tensor, *static) -> cpu_tensor` as an ordered callback producing `out_shape`."""
    from .. import storage

    def run(value):
        result = collective(storage.from_numpy(np.asarray(value)), *static)
        return storage.to_numpy(result)

    return io_callback(run, jax.ShapeDtypeStruct(tuple(out_shape), x.dtype), x, ordered=True)


# ---------------------------------------------------------------------------------
# host-side collectives on CPU tensors (public torch.distributed API: any group works)
# ---------------------------------------------------------------------------------
def _all_reduce(t, op, group_name):
    dist.all_reduce(t, _reduce_op(op), group=_group(group_name))
    return t


def _all_gather(t, group_size, group_name):
    out = t.new_empty((group_size * t.shape[0],) + tuple(t.shape[1:]))
    _all_gather_single(out, t.contiguous(), group=_group(group_name))
    return out


def _reduce_scatter(t, op, group_size, group_name):
    out = t.new_empty((t.shape[0] // group_size,) + tuple(t.shape[1:]))
    _reduce_scatter_single(out, t.contiguous(), _reduce_op(op), group=_group(group_name))
    return out


def _all_to_all(t, output_split_sizes, input_split_sizes, group_name):
    rows = sum(output_split_sizes) if output_split_sizes else t.shape[0]
    out = t.new_empty((rows,) + tuple(t.shape[1:]))
    dist.all_to_all_single(out, t.contiguous(), list(output_split_sizes) or None, list(input_split_sizes) or None,
                           group=_group(group_name))
    return out


def _broadcast(t, src, group_name):
    group = _group(group_name)
    dist.broadcast(t, dist.get_global_rank(group, src), group=group)  # src is a group rank
    return t


# ---------------------------------------------------------------------------------
# lowerings
# ---------------------------------------------------------------------------------
@lowering(c10d.all_reduce.default)
def all_reduce(input, reduce_op, group_name):
    return _on_host(_all_reduce, input, input.shape, reduce_op, group_name)


@lowering(c10d.all_reduce_coalesced.default)
def all_reduce_coalesced(inputs, reduce_op, group_name):
    return [all_reduce(x, reduce_op, group_name) for x in inputs]


@lowering(c10d.all_gather_into_tensor.default)
def all_gather_into_tensor(input, group_size, group_name):
    shape = (group_size * input.shape[0],) + tuple(input.shape[1:])
    return _on_host(_all_gather, input, shape, group_size, group_name)


@lowering(c10d.all_gather_into_tensor_coalesced.default)
def all_gather_into_tensor_coalesced(inputs, group_size, group_name):
    return [all_gather_into_tensor(x, group_size, group_name) for x in inputs]


@lowering(c10d.reduce_scatter_tensor.default)
def reduce_scatter_tensor(input, reduce_op, group_size, group_name):
    shape = (input.shape[0] // group_size,) + tuple(input.shape[1:])
    return _on_host(_reduce_scatter, input, shape, reduce_op, group_size, group_name)


@lowering(c10d.reduce_scatter_tensor_coalesced.default)
def reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size, group_name):
    return [reduce_scatter_tensor(x, reduce_op, group_size, group_name) for x in inputs]


@lowering(c10d.all_to_all_single.default)
def all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):
    rows = sum(output_split_sizes) if output_split_sizes else input.shape[0]
    shape = (rows,) + tuple(input.shape[1:])
    return _on_host(_all_to_all, input, shape, tuple(output_split_sizes), tuple(input_split_sizes), group_name)


@lowering(c10d.broadcast.default)
def broadcast(input, src, group_name):
    return _on_host(_broadcast, input, input.shape, src, group_name)


@lowering(c10d.wait_tensor.default)
def wait_tensor(tensor):
    return tensor  # the callback finished before its result exists
