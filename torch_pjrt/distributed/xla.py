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

from .collectives import AXIS, BODIES


class GroupMesh:
    """A mesh of one device per rank: `devices[r]` belongs to rank r (of a process group, or
    of a grid of ranks several groups span: `shape` and `axes` lay the devices out, row-major)."""

    def __init__(self, devices: list, rank: int, shape: tuple | None = None, axes: tuple = (AXIS,)):
        self.size, self.rank = len(devices), rank
        self.devices, self.device = list(devices), devices[rank]
        self.axes = axes
        self.mesh = Mesh(np.array(devices, dtype=object).reshape(shape or (len(devices),)), axes)
        self.spec = PartitionSpec(axes if len(axes) > 1 else axes[0])  # blocks in rank order along dimension 0
        self.sharding = NamedSharding(self.mesh, self.spec)
        self._programs: dict = {}

    def to_global(self, x: jax.Array) -> jax.Array:
        """This rank's value `x` as its block (`as_block`) of the group-wide array."""
        x = as_block(x)
        shape = (self.size * x.shape[0],) + tuple(x.shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self.sharding, [x])

    @staticmethod
    def local(g: jax.Array, scalar: bool = False) -> jax.Array:
        """This rank's block of `g`; a 0-d value again where `scalar`."""
        x = g.addressable_shards[0].data
        return x.reshape(()) if scalar else x

    def run(self, name: str, x, fingerprint: tuple | None = None, **params):
        """Run collective `name` (a key of collectives.BODIES) on this rank's block `x` (an
        array, or a tuple of arrays for a body of several operands, which gives a tuple back).

        Returns (this rank's result, None), or with a `fingerprint` (a tuple of ints that
        every rank's call must share) (result, every rank's fingerprint): the program first
        all-gathers the fingerprints and runs the collective only if all are equal, so ranks
        whose calls differ (another shape, another op) skip it together instead of
        exchanging mismatched buffers; the caller compares and raises."""
        xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
        key = (name, tuple((a.shape, a.dtype) for a in xs), fingerprint, tuple(sorted(params.items())))
        program = self._programs.get(key)
        if program is None:
            body = BODIES[name](self.size, **params)
            specs = self.spec
            if fingerprint is not None:
                body, specs = agreed(body, fingerprint), (specs, specs)
            program = jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=(self.spec,) * len(xs), out_specs=specs,
                                            check_vma=False))
            self._programs[key] = program
        out = program(*(self.to_global(a) for a in xs))
        everyone = None
        if fingerprint is not None:
            out, everyone = out
            everyone = fingerprints(everyone)
        if isinstance(x, (tuple, list)):
            return tuple(self.local(o, scalar=a.ndim == 0) for o, a in zip(out, xs)), everyone
        return self.local(out, scalar=x.ndim == 0), everyone


def as_block(x):
    """Blocks are laid out along dimension 0, so a 0-d value travels as a (1,) block."""
    return x.reshape(1) if x.ndim == 0 else x


def agreed(body: Callable, fingerprint: tuple, axes: tuple = (AXIS,)) -> Callable:
    """`body` (any pytree of arrays in and out, traced under shard_map over mesh `axes`) run
    only when every rank passes the same `fingerprint` (a tuple of ints); also returns every
    rank's fingerprint as a (1, ranks, len) block. Ranks whose calls differ skip the body
    together (zeros come out) instead of exchanging mismatched buffers."""
    code = np.array(fingerprint, dtype=np.int64)

    def checked(*args):
        mine = jnp.asarray(code)
        everyone = jax.lax.all_gather(mine, axes)  # (ranks, len(fingerprint)), the same on every rank
        agree = jnp.all(everyone == mine[None])
        skipped = jax.eval_shape(body, *args)
        out = jax.lax.cond(agree, lambda: body(*args),
                           lambda: jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), skipped))
        return out, everyone[None]

    return checked


def fingerprints(everyone: jax.Array) -> list:
    """Every rank's fingerprint, from the global array `agreed` returned."""
    return np.asarray(GroupMesh.local(everyone))[0].tolist()
