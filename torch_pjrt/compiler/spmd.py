"""Compiled graphs whose collectives run over one pjrt process group, as one SPMD program.

A graph Dynamo captures on one rank holds that rank's functional collectives
(`_c10d_functional.all_reduce`, ...). When they all use one process group that has an
XLA path (torch_pjrt.distributed: a mesh of one device per group rank), the graph runs as
`jax.jit(shard_map(graph))` on that mesh: each rank's inputs are its shards of global
arrays laid out along dimension 0 (no copy), the graph's ops run on the local blocks
exactly as on one device, and each collective node lowers to an XLA collective on the
mesh axis (ops.collectives.over_group). The graph stays one executable, and its
collectives are XLA's own (NCCL on GPUs, gloo on the CPU platform), scheduled by XLA
together with the compute around them.

As on the eager XLA path, a call runs on the collectives' dispatcher thread and is waited
for with the group's timeout, so a dead peer raises CollectiveError instead of hanging,
and the program first all-gathers a fingerprint of the graph (its code and input shapes):
ranks running different graphs skip them together and raise instead of exchanging
mismatched buffers (TORCH_PJRT_COLLECTIVE_CHECKS=0 turns the check off).

Other graphs with collectives keep the host path of ops/collectives.py: collectives over
several groups, uneven all_to_all splits, groups without an XLA path, symbolic sizes.
"""
from __future__ import annotations

import hashlib

import jax
import numpy as np
import torch
from jax.sharding import PartitionSpec

from .. import storage
from ..ops import collectives
from ..ops.signature import Signature
from . import stats
from .interpreter import OTHER, PJRT, GraphProgram, signature

c10d = torch.ops._c10d_functional


def plan(program: GraphProgram, example_inputs, dynamic: bool):
    """The one pjrt process group every collective of the graph uses, when the graph can run
    as an SPMD program over its mesh; None otherwise (no collectives, or the host path).
    Records the path taken in compile_stats()["collective_graphs"]."""
    nodes = [n for n in program.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
             and n.target.namespace == "_c10d_functional" and n.target is not c10d.wait_tensor.default]
    if not nodes:
        return None
    group, why = (None, "symbolic sizes") if dynamic else _one_group(nodes, dict(zip(program.placeholders, example_inputs)))
    stats.append("collective_graphs", {"graph": program.name, "path": "xla" if group is not None else "host",
                                       "collectives": len(nodes), **({"why": why} if why else {})})
    return group


def _one_group(nodes, placeholder_values) -> tuple:
    """(the pjrt group, None) or (None, why the collectives stay host callbacks)."""
    names = set()
    for node in nodes:
        sig = Signature.of(node.target)
        values = dict(zip(sig.names, sig.bind(tuple(node.args), dict(node.kwargs))))
        group = values.get("group_name")
        if isinstance(group, torch.fx.Node):  # DTensor passes the group as a graph input
            group = getattr(placeholder_values.get(group), "real_obj", None)
        if group is None:
            return None, "a collective's group is not known at compile time"
        names.add(collectives.group_name(group))
        if node.target is c10d.all_to_all_single.default:
            rows, size = node.args[0].meta["val"].shape[0], _group_size(group)
            if not collectives.even_all_to_all(rows, values["output_split_sizes"], values["input_split_sizes"], size):
                return None, "all_to_all_single with uneven splits"
    if len(names) != 1:
        return None, f"collectives over {len(names)} process groups"
    group = _resolve(names.pop())
    if group is None or group.mesh is None:
        return None, "the process group has no XLA path (not a pjrt group, or JAX's multi-process runtime is off)"
    return group, None


def _group_size(group) -> int:
    return torch._C._distributed_c10d._resolve_process_group(group).size() if isinstance(group, str) else group.size()


def _resolve(name: str):
    from ..distributed.backend import ProcessGroupPjrt

    group = torch._C._distributed_c10d._resolve_process_group(name)
    return group if isinstance(group, ProcessGroupPjrt) else None


class SpmdGraph:
    """How a CompiledGraph runs when `collective_group` found its group."""

    def __init__(self, compiled, group):
        self.compiled, self.group, self.mesh = compiled, group, group.mesh
        self.program: GraphProgram = compiled.program
        self.name = self.program.name
        self.static = tuple(i for i, k in enumerate(compiled.kinds) if k == OTHER)  # process groups
        self.constants = [self._global(c) for c in self.program.constants]
        self.scalar_constants = tuple(i for i, c in enumerate(self.program.constants) if c.ndim == 0)
        self.code = _digest(self.program.gm.code) if group.checks and group.size() > 1 else None
        self.scalar_outputs: dict = {}  # input signature -> (0-d outputs, 0-d mutated inputs)
        static_argnums = (0, 1) + tuple(4 + i for i in self.static)
        self.jit = jax.jit(self._program, static_argnums=static_argnums)

    # ---------------------------------------------------------------- the program
    def _program(self, scalar_inputs: tuple, fingerprint: tuple | None, seeds, constants, *inputs):
        """(scalar input positions, fingerprint: static; global arrays) -> global arrays."""
        arrays = [x for i, x in enumerate(inputs) if i not in self.static]
        group, n = self.group.group_name, self.mesh.size

        def body(seeds, constants, arrays):
            local = iter(arrays)
            full = [x if i in self.static else next(local) for i, x in enumerate(inputs)]
            full = [x.reshape(()) if i in scalar_inputs else x for i, x in enumerate(full)]
            constants = [c.reshape(()) if i in self.scalar_constants else c for i, c in enumerate(constants)]
            with collectives.over_group(group, n):
                outputs, new_values = self.program.function(seeds, constants, *full)
            self.scalar_outputs[signature(full)] = (tuple(o.ndim == 0 for o in outputs),
                                                    tuple(v.ndim == 0 for v in new_values))
            return tuple(_blocked(o) for o in outputs), tuple(_blocked(v) for v in new_values)

        if fingerprint is not None:
            from ..distributed.xla import agreed

            body = agreed(body, fingerprint)
        spec = PartitionSpec(collectives.AXIS)
        return jax.shard_map(body, mesh=self.mesh.mesh, in_specs=spec, out_specs=spec, check_vma=False)(
            seeds, constants, arrays)

    def _global(self, x):
        return self.mesh.to_global(_blocked(x)) if isinstance(x, jax.Array) else x

    # ---------------------------------------------------------------- a call
    def build(self, specs) -> None:
        """Trace now for the example inputs, so lowering errors surface at torch.compile time."""
        def spec(s):
            if not isinstance(s, jax.ShapeDtypeStruct):
                return s
            shape = (self.mesh.size * s.shape[0],) + s.shape[1:] if s.shape else (self.mesh.size,)
            return jax.ShapeDtypeStruct(shape, s.dtype, sharding=self.mesh.sharding)

        scalars = tuple(i for i, s in enumerate(specs) if isinstance(s, jax.ShapeDtypeStruct) and not s.shape)
        seeds = spec(self.compiled._seed_spec())
        fingerprint = self._fingerprint(specs)
        self.compiled._trace(lambda: self.jit.trace(scalars, fingerprint, seeds, self.constants, *map(spec, specs)))

    def _fingerprint(self, inputs) -> tuple | None:
        if self.code is None:
            return None
        shapes = _digest(repr([(tuple(x.shape), str(x.dtype)) for x in inputs
                               if isinstance(x, (jax.Array, jax.ShapeDtypeStruct))]))
        return (self.code, shapes)

    def call(self, tensors: list):
        compiled = self.compiled
        inputs = compiled._read_inputs(tensors)
        for i in compiled.pjrt_inputs:
            if not isinstance(inputs[i], jax.Array):  # a strided view: resolved here, shards are whole arrays
                inputs[i] = storage.read(tensors[i])
        scalars = tuple(i for i, x in enumerate(inputs) if isinstance(x, jax.Array) and x.ndim == 0)
        seeds = compiled._seeds()
        seeds = self._global(jax.device_put(seeds, self.mesh.device)) if seeds is not None else None
        arrays = [self._global(x) for x in inputs]
        fingerprint = self._fingerprint(inputs)

        def run():
            with stats.building(self.name):
                return jax.block_until_ready(self.jit(scalars, fingerprint, seeds, self.constants, *arrays))

        stats.add("calls")
        before = stats.marker()
        result = self.group.run_compiled(self.name, run)
        if stats.marker() != before:
            compiled._count_executable(compiled._why_new(inputs, self.jit))
        if fingerprint is not None:
            result, everyone = result
            self._check(fingerprint, everyone)
        outputs, new_values = result
        scalar_outputs, scalar_values = self.scalar_outputs[signature(inputs)]
        outputs = [_local(o, s) for o, s in zip(outputs, scalar_outputs)]
        new_values = [_local(v, s) for v, s in zip(new_values, scalar_values)]
        return compiled._finish(tensors, outputs, new_values, inputs)

    def _check(self, fingerprint: tuple, everyone) -> None:
        from ..distributed.xla import fingerprints
        from ..distributed.work import CollectiveError

        codes = fingerprints(everyone)
        differ = [self.group.global_ranks[r] for r, c in enumerate(codes) if tuple(c) != fingerprint]
        if differ:
            raise CollectiveError(
                f"pjrt: compiled graph '{self.name}' with collectives on process group '{self.group.group_name}' "
                f"(global ranks {self.group.global_ranks}): ranks {differ} ran another graph or other input shapes "
                f"than this rank (global rank {self.group.global_ranks[self.group.rank()]}); every rank of the group "
                f"must run the same compiled graph on inputs of the same shapes")


def _blocked(x):
    """Shards are laid out along dimension 0, so a 0-d value travels as a (1,) block."""
    return x.reshape(1) if x.ndim == 0 else x


def _local(g, scalar: bool):
    x = g.addressable_shards[0].data
    return x.reshape(()) if scalar else x


def _digest(text: str) -> int:
    """A 62-bit digest that is the same in every process (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & (2 ** 62 - 1)
