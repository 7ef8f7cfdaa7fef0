"""Compiled graphs whose collectives run over pjrt process groups, as one SPMD program.

A graph Dynamo captures on one rank holds that rank's functional collectives
(`_c10d_functional.all_reduce`, ...). When their process groups have an XLA path
(torch_pjrt.distributed: one device per rank) and one mesh spans them, one group per mesh
axis (a single group; or several evenly spaced groups that form a grid of ranks, as a
DeviceMesh's dimensions do), the graph runs as `jax.jit(shard_map(graph))` on that mesh:
each rank's inputs are its shards of global arrays laid out along dimension 0 (no copy),
the graph's ops run on the local blocks exactly as on one device, and each collective
node lowers to an XLA collective on its group's mesh axis (distributed/collectives.py, over_groups).
The graph stays one executable, and its collectives are XLA's own (NCCL on GPUs, gloo on
the CPU platform), scheduled by XLA together with the compute around them.

As on the eager XLA path, a call runs on the collectives' dispatcher thread and is waited
for with the group's timeout, so a dead peer raises CollectiveError instead of hanging,
and the program first all-gathers a fingerprint of the graph's collectives (each one's op,
mesh axis, shapes, dtypes and parameters, in program order; the rest of the graph may
differ between ranks, e.g. in rank-dependent constants): ranks whose collectives differ
skip the graph together and raise instead of exchanging mismatched buffers
(TORCH_PJRT_COLLECTIVE_CHECKS=0 turns the check off).

Other graphs with collectives keep the host path of distributed/collectives.py: groups no mesh
spans, groups without an XLA path, uneven all_to_all splits, symbolic sizes.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
from typing import NamedTuple

import jax
import torch
import torch.distributed as dist

from ..runtime import storage
from ..distributed.work import CollectiveError
from ..distributed.xla import GroupMesh, agreed, as_block, fingerprints
from ..distributed import collectives
from ..ops.signature import Signature
from . import stats
from ..eager.graph import OTHER, GraphProgram, LoweringError, signature
from .runner import GraphRunner, Strategy

c10d = torch.ops._c10d_functional


class Layout(NamedTuple):
    """Where an SPMD graph runs: a mesh of one device per rank of the grid its groups span."""
    mesh: object  # distributed.xla.GroupMesh
    axes: dict  # group name -> (mesh axis, group size)
    ranks: list  # global ranks in mesh order
    group: object  # the ProcessGroupPjrt whose dispatcher thread and timeout run the calls
    collectives: int  # a digest of the graph's collectives (op, axis, shapes, dtypes, parameters) in order


def plan(program: GraphProgram, example_inputs, dynamic: bool) -> Layout | None:
    """Where the graph's collectives can run as XLA collectives of one SPMD program; None
    when the graph has no collectives or keeps the host path. Records the path taken in
    compile_stats()["collective_graphs"]."""
    nodes = [n for n in program.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
             and n.target.namespace == "_c10d_functional" and n.target is not c10d.wait_tensor.default]
    if not nodes:
        return None
    placeholder_values = dict(zip(program.placeholders, example_inputs))
    layout, why = (None, "symbolic sizes") if dynamic else _layout(nodes, placeholder_values)
    if layout is not None:  # what every rank's graph must agree on
        described = [_describe(n, layout.axes, placeholder_values) for n in nodes]
        layout = layout._replace(collectives=_digest(repr(described)))
    stats.append("collective_graphs", {"graph": program.name, "path": "xla" if layout is not None else "host",
                                       "collectives": len(nodes), **({"why": why} if why else {})})
    return layout


def _layout(nodes, placeholder_values) -> tuple:
    """(the Layout, None) or (None, why the collectives stay host callbacks)."""
    groups = {}
    for node in nodes:
        values = _arguments(node)
        name = _group_name(values.get("group_name"), placeholder_values)
        if name is None:
            return None, "a collective's group is not known at compile time"
        groups[name] = _resolve(name)
        if groups[name] is None or groups[name].mesh is None:
            return None, (f"process group '{name}' has no XLA path (not a pjrt group, or JAX's multi-process "
                          f"runtime is off)")
        if node.target is c10d.all_to_all_single.default:
            rows = node.args[0].meta["val"].shape[0]
            if not collectives.even_all_to_all(rows, values["output_split_sizes"], values["input_split_sizes"],
                                               groups[name].size()):
                return None, "all_to_all_single with uneven splits"
    if len(groups) == 1:
        ((name, group),) = groups.items()
        return Layout(group.mesh, {name: (collectives.AXIS, group.size())}, group.global_ranks, group, 0), None
    return _grid(groups)


def _grid(groups: dict) -> tuple:
    """Several groups: one mesh axis per group, when each group's ranks are evenly spaced and
    together they span a grid of ranks (as a DeviceMesh's dimensions do)."""
    world = _resolve(dist.group.WORLD.group_name)
    if world is None or world.mesh is None:
        return None, "collectives over several groups need the default group to be a pjrt group with an XLA path"
    lines = []  # (stride, size, name, this rank's position)
    for name, group in groups.items():
        ranks = group.global_ranks
        stride = ranks[1] - ranks[0] if len(ranks) > 1 else 0
        if stride < 0 or any(b - a != stride for a, b in zip(ranks, ranks[1:])):
            return None, f"process group '{name}' has unevenly spaced ranks {ranks}"
        lines.append((stride, len(ranks), name, group.rank()))
    lines.sort(key=lambda line: -line[0])  # row-major: the largest stride first
    me = world.rank()
    origin = me - sum(stride * position for stride, _, _, position in lines)
    grid = [origin + sum(line[0] * i for line, i in zip(lines, index))
            for index in itertools.product(*(range(size) for _, size, _, _ in lines))]
    if len(set(grid)) != len(grid) or not all(0 <= r < world.size() for r in grid):
        return None, f"process groups {sorted(groups)} do not span a grid of ranks"
    devices = list(world.mesh.mesh.devices.flat)
    axes = tuple(f"g{k}" for k in range(len(lines)))
    mesh = GroupMesh([devices[r] for r in grid], grid.index(me), tuple(size for _, size, _, _ in lines), axes)
    return Layout(mesh, {name: (axis, size) for (_, size, name, _), axis in zip(lines, axes)}, grid, world, 0), None


def _arguments(node) -> dict:
    sig = Signature.of(node.target)
    return dict(zip(sig.names, sig.bind(tuple(node.args), dict(node.kwargs))))


def _group_name(group, placeholder_values) -> str | None:
    if isinstance(group, torch.fx.Node):  # DTensor passes the group as a graph input
        group = getattr(placeholder_values.get(group), "real_obj", None)
    return None if group is None else collectives.group_name(group)


def _describe(node, axes: dict, placeholder_values) -> tuple:
    """What every rank's collective must share: op, mesh axis (group names differ between the
    groups of one mesh dimension), tensor shapes and dtypes, other parameters."""
    def value(v):
        if isinstance(v, (list, tuple)):
            return tuple(value(e) for e in v)
        if isinstance(v, torch.fx.Node):
            val = v.meta.get("val")
            return (tuple(val.shape), str(val.dtype)) if isinstance(val, torch.Tensor) else None
        return v

    values = _arguments(node)
    values["group_name"] = axes[_group_name(values["group_name"], placeholder_values)][0]
    return (str(node.target),) + tuple(value(v) for v in values.values())


def _resolve(name: str):
    from ..distributed.backend import ProcessGroupPjrt

    group = torch._C._distributed_c10d._resolve_process_group(name)
    return group if isinstance(group, ProcessGroupPjrt) else None


class Spmd(Strategy):
    """The runner's strategy when `plan` found a layout for the graph's collectives."""

    def __init__(self, runner: GraphRunner, layout: Layout, example_inputs):
        super().__init__(runner)
        self.layout, self.mesh = layout, layout.mesh
        if runner.jax_device != self.mesh.device:
            raise LoweringError(
                f"pjrt compile: graph '{runner.name}' runs on pjrt:{runner.device}, but its collectives' process "
                f"group uses pjrt:{layout.group.device_index} on this rank (pjrt:LOCAL_RANK where a process sees "
                f"several devices); move the inputs to pjrt:{layout.group.device_index}")
        self.program: GraphProgram = runner.program
        self.name = self.program.name
        self.static = tuple(i for i, k in enumerate(runner.kinds) if k == OTHER)  # process groups
        self.constants = [self._global(c) for c in self.program.constants]
        self.scalar_constants = tuple(i for i, c in enumerate(self.program.constants)
                                      if isinstance(c, jax.Array) and c.ndim == 0)
        checked = layout.group.checks and self.mesh.size > 1
        self.fingerprint = (layout.collectives,) if checked else None
        self.scalar_outputs: dict = {}  # input signature -> (0-d outputs, 0-d mutated inputs)
        jit = functools.partial(jax.jit, self._program, static_argnums=(0,) + tuple(3 + i for i in self.static))
        self.jit = jit()
        # mutated inputs' buffers donated when nothing else holds them, as on one device (their
        # global arrays share the local buffers, so donating those donates the shards)
        self.donating = jit(donate_argnums=tuple(3 + i for i in runner.mutated)) if runner.mutated else None
        self._build([runner.spec(x) for x in example_inputs])

    # ---------------------------------------------------------------- the program
    def _program(self, scalar_inputs: tuple, seeds, constants, *inputs):
        """(0-d input positions: static; global arrays) -> global arrays."""
        arrays = [x for i, x in enumerate(inputs) if i not in self.static]

        def body(seeds, constants, arrays):
            local = iter(arrays)
            full = [x if i in self.static else next(local) for i, x in enumerate(inputs)]
            full = [x.reshape(()) if i in scalar_inputs else x for i, x in enumerate(full)]
            constants = [c.reshape(()) if i in self.scalar_constants else c for i, c in enumerate(constants)]
            with collectives.over_groups(self.layout.axes):
                outputs, new_values = self.program.function(seeds, constants, *full)
            self.scalar_outputs[signature(full)] = (tuple(o.ndim == 0 for o in outputs),
                                                    tuple(v.ndim == 0 for v in new_values))
            return tuple(as_block(o) for o in outputs), tuple(as_block(v) for v in new_values)

        if self.fingerprint is not None:
            body = agreed(body, self.fingerprint, self.mesh.axes)
        spec = self.mesh.spec
        return jax.shard_map(body, mesh=self.mesh.mesh, in_specs=spec, out_specs=spec, check_vma=False)(
            seeds, constants, arrays)

    def _global(self, x):
        return self.mesh.to_global(x) if isinstance(x, jax.Array) else x

    def _build(self, specs) -> None:
        """Trace now for the example inputs, so lowering errors surface at torch.compile time."""
        def spec(s):
            if not isinstance(s, jax.ShapeDtypeStruct):
                return s
            shape = (self.mesh.size * s.shape[0],) + s.shape[1:] if s.shape else (self.mesh.size,)
            return jax.ShapeDtypeStruct(shape, s.dtype, sharding=self.mesh.sharding)

        scalars = tuple(i for i, s in enumerate(specs) if isinstance(s, jax.ShapeDtypeStruct) and not s.shape)
        seeds = spec(self.runner.seed_spec())
        self.runner.trace(lambda: self.jit.trace(scalars, seeds, self.constants, *map(spec, specs)))

    # ---------------------------------------------------------------- a call
    def prepare(self, tensors: list):
        runner = self.runner
        inputs = runner.read_inputs(tensors)
        for i in runner.pjrt_inputs:
            if not isinstance(inputs[i], jax.Array):  # a strided view: resolved here, shards are whole arrays
                inputs[i] = storage.read(tensors[i])
        scalars = tuple(i for i, x in enumerate(inputs) if isinstance(x, jax.Array) and x.ndim == 0)
        seeds = runner.seeds()
        seeds = self._global(jax.device_put(seeds, self.mesh.device)) if seeds is not None else None
        fn = self.donating if self.donating is not None and runner.donatable(inputs) else self.jit
        arrays = [self._global(x) for x in inputs]
        return fn, (scalars, seeds, self.constants, *arrays), inputs

    def execute(self, fn, args):
        """On the collectives' dispatcher thread, waited for with the group's timeout."""
        def run():
            with stats.building(self.name):
                return jax.block_until_ready(fn(*args))

        return self.layout.group.run_compiled(self.name, run)

    def why_new(self, fn, inputs) -> str:
        return self.runner.why_new(inputs, undonated=fn is self.jit and self.donating is not None)

    def results(self, result, inputs):
        if self.fingerprint is not None:
            result, everyone = result
            self._check(everyone)
        outputs, new_values = result
        scalar_outputs, scalar_values = self.scalar_outputs[signature(inputs)]
        outputs = [self.mesh.local(o, s) for o, s in zip(outputs, scalar_outputs)]
        new_values = [self.mesh.local(v, s) for v, s in zip(new_values, scalar_values)]
        return outputs, new_values, self.runner.python_values(inputs)

    def _check(self, everyone) -> None:
        ranks = self.layout.ranks
        differ = [ranks[r] for r, code in enumerate(fingerprints(everyone)) if tuple(code) != self.fingerprint]
        if differ:
            groups = ", ".join(f"'{name}'" for name in self.layout.axes)
            raise CollectiveError(
                f"pjrt: compiled graph '{self.name}' with collectives on process group(s) {groups} (global ranks "
                f"{ranks}): ranks {differ} ran other collectives (ops, shapes or dtypes) than this rank (global rank "
                f"{ranks[self.mesh.rank]}); every rank must issue the same collectives in the same order")


def _digest(text: str) -> int:
    """A 62-bit digest that is the same in every process (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & (2 ** 62 - 1)
