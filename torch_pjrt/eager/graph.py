"""An FX graph (functionalized core ATen, from AOTAutograd or torch.export) as one JAX function.

`GraphProgram(gm, example_inputs)` reads the graph once: what each placeholder is (a pjrt
tensor, a CPU tensor, an int), which inputs the graph mutates (AOTAutograd's trailing
`copy_(placeholder, value)` nodes), which nodes are random, what each output is. Its
`function` is pure: (seeds, constants, *inputs) -> (outputs, new values of mutated inputs),
and runs every call_function node through the op table's lowering, binding arguments with
the table's bound call (ops/call.py), exactly as the eager kernels do. The caller
puts it inside one `jax.jit`, so a graph is one XLA executable. Compiled graphs
(compiler/) and eager's decompositions (decomposed.py) share it, which is why it lives in the
eager layer, below the compiler.

A few nodes are graph plumbing rather than ops and are interpreted here: `getitem`,
`copy_` (the functionalization's write-back, run as the table's aten.copy) and the
symbolic-size helpers (`sym_size`, `operator.mul` on ints, ...).
"""
from __future__ import annotations

import operator

import jax
import torch
from torch.fx.node import map_aggregate

from ..dtypes import to_jax
from ..ops.call import OpCall
from ..ops.shape import copy as copy_lowering
from ..ops.registry import LOWERINGS, Lowering
from ..ops.quantized import HIGHER_ORDER

aten = torch.ops.aten
OpOverload = torch._ops.OpOverload


class LoweringError(RuntimeError):
    """A graph node could not be lowered; the message names the node, its op and the user code."""


# input kinds
PJRT, CPU, INT, OTHER = "pjrt", "cpu", "int", "other"


def _label(op) -> str:
    if not isinstance(op, OpOverload):
        return getattr(op, "__name__", str(op))
    namespace, name = op._schema.name.split("::")
    return f"{namespace}.{name}.{op._overloadname}"


def _inplace_twin(op: OpOverload):
    """The in-place overload whose lowering returns self's new value (random ops register there):
    aten.uniform.default -> aten.uniform_.default."""
    namespace, name = op._schema.name.split("::")
    packet = getattr(aten, name + "_", None) if namespace == "aten" else None
    return getattr(packet, op._overloadname, None) if packet is not None else None


def find_lowering(op: OpOverload) -> Lowering | None:
    lowering = LOWERINGS.get(op)
    if lowering is None:
        twin = _inplace_twin(op)
        lowering = LOWERINGS.get(twin) if twin is not None else None
    return lowering


_copy = copy_lowering  # the functionalization's write-back (copy_) is the table's aten.copy


def _sym_size(x, dim=None):
    return x.shape[dim] if dim is not None else x.shape


_PLUMBING = {
    operator.getitem: lambda args, kw: args[0][args[1]],
    aten.sym_size.int: lambda args, kw: args[0].shape[args[1]],
    aten.sym_numel.default: lambda args, kw: int(args[0].size),
    aten.sym_storage_offset.default: lambda args, kw: 0,
    aten._assert_async.msg: lambda args, kw: None,
    aten._assert_scalar.default: lambda args, kw: None,
}


def _has_mask(node) -> bool:
    """Whether a node's tensor arguments include a boolean (or uint8) mask, which makes an
    indexing op's output shape depend on the data."""
    flat = torch.utils._pytree.tree_flatten((node.args, node.kwargs))[0]
    vals = [a.meta.get("val") for a in flat if isinstance(a, torch.fx.Node)]
    return any(isinstance(v, torch.Tensor) and v.dtype in (torch.bool, torch.uint8) for v in vals)


def _is_symbolic(v) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


class GraphProgram:
    """A functionalized FX graph read once, ready to be traced by jax.jit."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, name: str):
        self.gm, self.name = gm, name
        self.nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.input_kinds = tuple(_input_kind(x) for x in example_inputs)
        devices = {x.device.index or 0 for x in example_inputs if isinstance(x, torch.Tensor) and x.device.type == "pjrt"}
        devices |= {n.kwargs["device"].index or 0 for n in self.nodes
                    if n.op == "call_function" and isinstance(n.kwargs.get("device"), torch.device)
                    and n.kwargs["device"].type == "pjrt"}
        if len(devices) > 1:
            raise LoweringError(f"pjrt compile: graph {name} mixes pjrt devices {sorted(devices)}; one graph runs on one device")
        self.device = devices.pop() if devices else torch.pjrt.current_device()
        # constants (get_attr): passed in as executable inputs, read once
        self.constant_nodes = [n for n in self.nodes if n.op == "get_attr"]
        self.constants = [_constant(_fetch_attr(gm, n.target), self.device) for n in self.constant_nodes]
        # the functionalization's write-back into graph inputs
        index_of = {n: i for i, n in enumerate(self.placeholders)}
        self.mutations: dict[int, torch.fx.Node] = {}  # input index -> node holding the new value
        self.writeback_nodes = set()
        for n in self.nodes:
            if n.op == "call_function" and n.target is aten.copy_.default and n.args[0] in index_of:
                self.mutations[index_of[n.args[0]]] = n
                self.writeback_nodes.add(n)
        self.mutated = tuple(sorted(self.mutations))
        # how each call_function node runs
        self.calls: dict[torch.fx.Node, object] = {}
        self.random_nodes: list[torch.fx.Node] = []
        for n in self.nodes:
            if n.op == "call_function" and n not in self.writeback_nodes:
                self.calls[n] = self._plan(n)
                if isinstance(self.calls[n], OpCall) and self.calls[n].random:
                    self.random_nodes.append(n)
        self.seed_index = {n: i for i, n in enumerate(self.random_nodes)}
        out_node = next(n for n in reversed(self.nodes) if n.op == "output")
        self.output_args = out_node.args[0]
        flat, _ = torch.utils._pytree.tree_flatten(self.output_args)
        self.output_devices = [_output_device(n) for n in flat]
        self.python_outputs: dict = {}  # input signature -> flat outputs, None where an array

    # ------------------------------------------------------------------ planning
    def _plan(self, node):
        target = node.target
        if target in _PLUMBING:
            return _PLUMBING[target]
        if isinstance(target, OpOverload):
            lowering = find_lowering(target)
            if lowering is not None:
                if not lowering.jit and not (lowering.jit_for_integer_indices and not _has_mask(node)):
                    raise self.error(node, "its output shape depends on tensor values (a data-dependent op), so it cannot "
                                           "run inside one executable; let Dynamo graph-break on it")
                return OpCall.of(lowering, target)
            raise self.error(node, "the pjrt op table has no lowering for it (and torch has no decomposition "
                                   "AOTAutograd applied)")
        if target in HIGHER_ORDER:  # out_dtype(aten.mm, torch.int32, ...) from torchao (ops/quantized.py)
            return lambda args, kw, _f=HIGHER_ORDER[target]: _f(*args, **kw)
        if callable(target) and not isinstance(target, torch._ops.OpOverloadPacket):
            return lambda args, kw, _f=target: _f(*args, **kw)  # int arithmetic on sizes (operator.mul, ...)
        raise self.error(node, "unsupported call target")

    def error(self, node, why: str, cause: BaseException | None = None) -> LoweringError:
        lines = [s.strip() for s in (node.meta.get("stack_trace") or "").strip().splitlines()]
        files = [i for i, s in enumerate(lines) if s.startswith("File ")]
        user = f"\n  user code: {lines[files[-1]]}: {lines[files[-1] + 1] if files[-1] + 1 < len(lines) else ''}" if files else ""
        args = ", ".join(_describe(a) for a in node.args)
        msg = (f"pjrt compile: graph '{self.name}' failed to lower node %{node.name} = {_label(node.target)}({args}): "
               f"{why}{user}")
        if cause is not None:
            msg += f"\n  cause: {type(cause).__name__}: {cause}"
        return LoweringError(msg)

    # ------------------------------------------------------------------ the pure function
    def function(self, seeds, constants, *inputs):
        """(outputs, mutated input values): trace me inside jax.jit."""
        env = {}
        for n, v in zip(self.placeholders, inputs):
            env[n] = v.resolve() if hasattr(v, "resolve") else v
        for n, v in zip(self.constant_nodes, constants):
            env[n] = v
        self.evaluate(env, seeds, self.call)
        outputs, new_values = self.results(env)
        # only arrays leave the executable; Python values (None, sizes) are re-inserted by the
        # caller, looked up by the input signature they were traced for
        self.python_outputs[signature(inputs)] = [None if isinstance(o, jax.Array) else o for o in outputs]
        return tuple(o for o in outputs if isinstance(o, jax.Array)), tuple(new_values)

    def evaluate(self, env: dict, seeds, step) -> None:
        """The node loop: env[node] = step(node, args, kwargs, seeds) for every op node in graph
        order, with env's values in place of nodes in args and kwargs. `step` is `self.call`, or
        padding.py's step, which also propagates layouts and masks padding."""
        lookup = env.__getitem__
        for node in self.nodes:
            if node.op != "call_function" or node in self.writeback_nodes:
                continue
            args = map_aggregate(node.args, lambda a: lookup(a) if isinstance(a, torch.fx.Node) else a)
            kwargs = map_aggregate(node.kwargs, lambda a: lookup(a) if isinstance(a, torch.fx.Node) else a)
            env[node] = step(node, args, kwargs, seeds)

    def apply(self, node, args, kwargs, seeds):
        """Call node's op on `args`, `kwargs` (a random node takes its seed from `seeds`)."""
        if node in self.seed_index:
            return self.calls[node](args, kwargs, seeds[self.seed_index[node]])
        return self.calls[node](args, kwargs)

    def call(self, node, args, kwargs, seeds):
        """`apply`, with a lowering's failure re-raised naming the node."""
        try:
            return self.apply(node, args, kwargs, seeds)
        except LoweringError:
            raise
        except Exception as e:  # noqa: BLE001  (re-raised with the node named)
            raise self.error(node, "its lowering raised", e) from e

    def results(self, env: dict) -> tuple:
        """(flat outputs, new values of the mutated inputs) of an evaluated env."""
        new_values = []
        for i in self.mutated:
            node = self.mutations[i]
            env[node] = _copy(env[node.args[0]], env[node.args[1]])  # a graph may return copy_'s result
            new_values.append(env[node])
        outputs = [env[a] if isinstance(a, torch.fx.Node) else a
                   for a in torch.utils._pytree.tree_flatten(self.output_args)[0]]
        return outputs, new_values


def signature(inputs) -> tuple:
    """What the graph's Python-valued outputs (sizes) depend on: int inputs and input shapes."""
    return tuple(_shape_or_value(v) for v in inputs)


def _shape_or_value(v):
    if v is None or isinstance(v, int):
        return v
    return tuple(v.shape)  # an array's, or a storage view's


def _describe(a) -> str:
    if isinstance(a, torch.fx.Node):
        val = a.meta.get("val")
        if isinstance(val, torch.Tensor):
            return f"%{a.name}: {str(val.dtype).replace('torch.', '')}{list(val.shape)}"
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_describe(x) for x in a) + "]"
    return repr(a)


def _input_kind(x) -> str:
    if isinstance(x, torch.Tensor):
        return PJRT if x.device.type == "pjrt" else CPU
    if isinstance(x, (int, torch.SymInt)):
        return INT
    return OTHER


def _output_device(node):
    if not isinstance(node, torch.fx.Node):
        return None
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.device
    return None


def _fetch_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _constant(t, device: int):
    """A graph constant (get_attr) as a JAX array on the graph's device."""
    from ..runtime import storage, platform

    if isinstance(t, torch.Tensor):
        if t.device.type == "pjrt":
            return storage.read(t)
        # AOTAutograd calls the compiler under its fake mode; a real constant (torch.tensor(2.0)
        # in the model) must be read as the real tensor it is
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            return jax.device_put(storage.to_numpy(t), platform.device(device))
    return t


def abstract_input(x):
    """The jax.ShapeDtypeStruct a fake graph input stands for (for tracing at compile time)."""
    if isinstance(x, torch.Tensor):
        return jax.ShapeDtypeStruct(tuple(int(s) for s in x.shape), to_jax(x.dtype))
    return x
