"""XLA collectives over one process group: jitted shard_map programs on a mesh of the
group's devices (one per rank), through JAX's multi-process runtime.

A rank's tensor becomes its shard of a global array laid out along dimension 0
(`GroupMesh.to_global`, no copy), the program runs the collective on the named axis "g",
and the rank's result is its shard of the output. Programs are cached per (op, shape,
dtype, fingerprint, parameters) on the group's mesh. The process group runs them on its
dispatcher thread (work.py), since XLA's CPU collectives block until every peer joins.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "g"

# bitwise ReduceOps: XLA has no such all-reduce, so every block is gathered and reduced locally
_BITWISE = {"BAND": jnp.bitwise_and, "BOR": jnp.bitwise_or, "BXOR": jnp.bitwise_xor}


class GroupMesh:
    """The mesh of one process group: device `devices[r]` belongs to group rank r."""

    def __init__(self, devices: list, rank: int):
        self.size, self.rank = len(devices), rank
        self.device = devices[rank]
        self.mesh = Mesh(np.array(devices, dtype=object), (AXIS,))
        self.sharding = NamedSharding(self.mesh, PartitionSpec(AXIS))
        self._programs: dict = {}

    def to_global(self, x: jax.Array) -> jax.Array:
        """This rank's block `x` (at least 1-d) as its shard of the group-wide array."""
        shape = (self.size * x.shape[0],) + tuple(x.shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self.sharding, [x])

    @staticmethod
    def local(g: jax.Array) -> jax.Array:
        return g.addressable_shards[0].data

    def run(self, name: str, x: jax.Array, fingerprint: tuple | None = None, **params):
        """Run collective `name` (a key of BODIES) on this rank's block `x`.

        Returns (this rank's result, None), or with a `fingerprint` (a tuple of ints that
        every rank's call must share) (result, every rank's fingerprint): the program first
        all-gathers the fingerprints and runs the collective only if all are equal, so ranks
        whose calls differ (another shape, another op) skip it together instead of
        exchanging mismatched buffers; the caller compares and raises."""
        scalar = x.ndim == 0
        block = x.reshape(1) if scalar else x
        key = (name, block.shape, block.dtype, fingerprint, tuple(sorted(params.items())))
        program = self._programs.get(key)
        if program is None:
            body = BODIES[name](self.size, **params)
            specs = PartitionSpec(AXIS)
            if fingerprint is not None:
                body, specs = _agreed(body, np.array(fingerprint, dtype=np.int64)), (specs, specs)
            program = jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=PartitionSpec(AXIS), out_specs=specs,
                                            check_vma=False))
            self._programs[key] = program
        out = program(self.to_global(block))
        everyone = None
        if fingerprint is not None:
            out, everyone = out
            everyone = np.asarray(self.local(everyone))[0]
        out = self.local(out)
        return (out.reshape(()) if scalar else out), everyone


def _agreed(body: Callable, fingerprint: np.ndarray) -> Callable:
    """`body` run only when every rank passes the same fingerprint; also returns them all."""
    def checked(x):
        mine = jnp.asarray(fingerprint)
        everyone = jax.lax.all_gather(mine, AXIS)  # (ranks, len(fingerprint)), the same on every rank
        agree = jnp.all(everyone == mine[None])
        skipped = jax.eval_shape(body, x)
        out = jax.lax.cond(agree, body, lambda v: jnp.zeros(skipped.shape, skipped.dtype), x)
        return out, everyone[None]

    return checked


# ---------------------------------------------------------------------------------
# per-shard bodies: body(n, **params) -> function of this rank's block
# ---------------------------------------------------------------------------------
def _gathered(x):
    """Every rank's block stacked on a new leading axis (n, *block)."""
    return jax.lax.all_gather(x, AXIS, axis=0, tiled=False)


def all_reduce(n: int, op: str) -> Callable:
    def body(x):
        if x.dtype == jnp.bool_:  # torch reduces bools as logical or (SUM, MAX) / and (MIN, PRODUCT)
            u = x.astype(jnp.uint8)
            return (jax.lax.pmax(u, AXIS) if op in ("SUM", "MAX", "BOR") else jax.lax.pmin(u, AXIS)).astype(jnp.bool_)
        if op == "SUM":
            return jax.lax.psum(x, AXIS)
        if op == "AVG":
            return (jax.lax.psum(x, AXIS) / n).astype(x.dtype)
        if op == "MAX":
            return jax.lax.pmax(x, AXIS)
        if op == "MIN":
            return jax.lax.pmin(x, AXIS)
        if op == "PRODUCT":  # XLA has no product all-reduce: gather, then multiply in rank order
            return jnp.prod(_gathered(x), axis=0, dtype=x.dtype)
        return _BITWISE[op].reduce(_gathered(x), axis=0)

    return body


def broadcast(n: int, src: int) -> Callable:
    """psum of the source's block and zeros elsewhere, on the bits (XLA:CPU lacks
    collective-broadcast): adding zero bits keeps -0.0 and NaN payloads exact."""
    def body(x):
        if x.dtype in (jnp.complex64, jnp.complex128):
            return jax.lax.complex(body(x.real), body(x.imag))
        bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize]) if x.dtype != jnp.bool_ else x.astype(jnp.uint8)
        mine = jnp.where(jax.lax.axis_index(AXIS) == src, bits, jnp.zeros_like(bits))
        total = jax.lax.psum(mine, AXIS)
        return total.astype(jnp.bool_) if x.dtype == jnp.bool_ else jax.lax.bitcast_convert_type(total, x.dtype)

    return body


_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def all_gather(n: int) -> Callable:
    return lambda x: jax.lax.all_gather(x, AXIS, axis=0, tiled=True)


def reduce_scatter(n: int, op: str) -> Callable:
    """Block (n*c, ...) -> (c, ...): chunk r of the reduction over ranks."""
    reduce = all_reduce(n, op)  # for the reductions XLA only offers as all-reduce

    def body(x):
        if op == "SUM" and x.dtype != jnp.bool_:
            return jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
        if op == "AVG":
            return (jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True) / n).astype(x.dtype)
        chunk = x.shape[0] // n
        rank = jax.lax.axis_index(AXIS)
        return jax.lax.dynamic_slice_in_dim(reduce(x), rank * chunk, chunk, axis=0)

    return body


def all_to_all(n: int) -> Callable:
    """Block (n*c, ...): chunk j goes to rank j; the result holds chunk r of every rank, in rank order."""
    return lambda x: jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True)


BODIES = {"all_reduce": all_reduce, "broadcast": broadcast, "all_gather": all_gather,
          "reduce_scatter": reduce_scatter, "all_to_all": all_to_all}
REDUCE_OPS = ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR")
