"""An op the table lacks but torch can decompose, as one executable per signature.

The first call of a signature (the op, its tensors' shapes, strides, dtypes and devices, its
other arguments' values) traces torch's decomposition with make_fx over fake tensors,
functionalized, into the ops the table has; the graph then runs through the compile path's
interpreter (eager/graph.py, GraphProgram) inside one `jax.jit`, so eager gets one
executable, not one dispatch per sub-op. Written arguments get the graph's new values
(storage.write), outputs the layout the trace gave them; a return that aliases an argument
returns that argument.

Where a signature cannot take this path (the decomposition needs a data-dependent shape,
takes a generator, draws random numbers, or reaches an op neither lowered nor decomposable),
`run` returns NOT_TRACED and fallback.py runs the decomposition op by op as before; an op
whose argument values keep changing stops being traced after MAX_SIGNATURES (each would be
a compile).
"""
from __future__ import annotations

import collections
import functools

import jax
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..ops.registry import LOWERINGS
from ..ops.signature import Signature
from ..runtime import default_dtype, fused, storage
from ..runtime.fused import Recordable
from .errors import in_memory_format
from .graph import GraphProgram, signature

NOT_TRACED = object()
_BY_LAYOUT = object()  # in _programs: this signature's graph reads its inputs' layout: keyed with it
MAX_SIGNATURES = 16

_programs: dict = {}  # signature -> _Program, or None where the signature does not trace
_signatures: collections.Counter = collections.Counter()  # op -> signatures traced


@default_dtype.on_change
def _forget_programs() -> None:  # make_fx traced them under another default dtype
    _programs.clear()
    _signatures.clear()


def _signature(op, args, kwargs, layout: bool = False):
    """The cache key of a call. Without `layout`, a tensor's strides count only as the order of its
    dims in memory and whether it is dense (what its outputs' layouts follow), and its storage
    offset not at all: a graph gets its inputs' values (views are read lazily), so the rest
    matters only to one that reads the layout (as_strided), which is keyed with it (`layout`).
    A loop's view of a growing buffer (generate's last token) is then one signature."""
    flat, spec = tree_flatten((args, kwargs))
    key = []
    for x in flat:
        if isinstance(x, torch.Tensor):
            if x.device.type != "pjrt":
                return None  # a CPU scalar tensor beside pjrt ones: op by op, whose kernels accept it
            if layout:
                geometry = x.stride(), x.storage_offset()
            else:
                geometry = _memory_order(x.shape, x.stride())
            key.append(("T", tuple(x.shape), *geometry, x.dtype, x.device, x.requires_grad))
        elif isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                            torch.memory_format)):
            key.append((type(x), x))
        else:
            return None  # a generator, a SymInt, ...: not keyed here
    storages = [x.untyped_storage()._cdata if isinstance(x, torch.Tensor) else None for x in flat]
    aliasing = tuple(storages.index(s) if s is not None else None for s in storages)  # which inputs share storage
    return op, str(spec), tuple(key), aliasing


def _memory_order(shape, stride) -> tuple:
    """(the dims of size > 1, innermost first; whether they are dense without gaps)."""
    dims = sorted((s, d) for d, (n, s) in enumerate(zip(shape, stride)) if n != 1)
    expected = 1
    for s, d in dims:
        if s != expected:
            return tuple(d for _, d in dims), False
        expected *= shape[d]
    return tuple(d for _, d in dims), True


@functools.lru_cache(None)
def _decompositions():
    from torch._decomp import decomposition_table

    return {op: d for op, d in decomposition_table.items() if op not in LOWERINGS}


class _Program:
    """One traced signature: the graph, its jitted function, where results go."""

    def __init__(self, op, decomposition, args, kwargs):
        flat, self.in_spec = tree_flatten((args, kwargs))
        self.tensor_positions = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        statics = [None if isinstance(x, torch.Tensor) else x for x in flat]  # the cache must not keep tensors alive

        def graph_fn(*tensors):
            values = list(statics)
            for i, t in zip(self.tensor_positions, tensors):
                values[i] = t
            a, kw = tree_unflatten(values, self.in_spec)
            return decomposition(*a, **kw)

        tensors = [flat[i] for i in self.tensor_positions]
        with torch._C._AutoDispatchBelowAutograd():
            gm = make_fx(torch.func.functionalize(graph_fn, remove="mutations_and_views"),
                         decomposition_table=_decompositions(), tracing_mode="fake")(*tensors)
        # a graph that reads its inputs' strides or offsets (as_strided) is cached per layout
        self.reads_layout = any(n.op == "call_function" and "as_strided" in str(n.target) for n in gm.graph.nodes)
        self.program = program = GraphProgram(gm, tensors, f"decomposed {op}")
        if program.random_nodes:
            raise _NotTraceable("random")
        self.out_spec = tree_flatten(program.output_args)[1]
        outputs = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None
                   for n in tree_flatten(program.output_args)[0]]
        self.device = program.device
        self.metas = [o for o in outputs if isinstance(o, torch.Tensor)]
        # an entry's output_memory_format (native_batch_norm: CPU keeps a channels_last input's format)
        self.metas = list(in_memory_format(LOWERINGS.get(op), Signature.of(op).bind(args, kwargs), self.metas))

        def run(*inputs):
            arrays, new_values = program.function((), program.constants, *inputs)
            return storage.laid_out(tuple(arrays), self.metas), new_values

        self.run = Recordable(jax.jit(run), name=f"{op} (decomposed)")
        self.sig = Signature.of(op)  # a return that is a written argument (op_, out=) returns that argument

    def __call__(self, args, kwargs):
        flat, _ = tree_flatten((args, kwargs))
        tensors = [flat[i] for i in self.tensor_positions]
        inputs = [storage.read_lazily(t) for t in tensors]
        arrays, new_values = self.run.on(self.device, tuple(inputs))
        for i, value in zip(self.program.mutated, new_values):
            storage.write(tensors[i], value)
        arrays = iter(arrays)
        python = iter(self.program.python_outputs[signature(inputs)])
        outs = []
        for node_value in python:
            outs.append(storage.wrap(next(arrays), self.device) if node_value is None else node_value)
        result = tree_unflatten(outs, self.out_spec)
        if any(i is not None for i in self.sig.returned_arguments):
            values = self.sig.bind(args, kwargs)
            results = list(result) if isinstance(result, (tuple, list)) else [result]
            results = [values[i] if i is not None else r for i, r in zip(self.sig.returned_arguments, results)]
            result = results[0] if len(results) == 1 else tuple(results)
        return result


class _NotTraceable(Exception):
    pass


def run(op, decomposition, args, kwargs):
    """The op as one executable for this signature, or NOT_TRACED."""
    key = _signature(op, args, kwargs)
    if key is None or any(a.name == "generator" for a in op._schema.arguments):
        return NOT_TRACED
    layout = False
    program = _programs.get(key, NOT_TRACED)
    if program is _BY_LAYOUT:
        layout = True
        key = _signature(op, args, kwargs, layout=True)
        program = _programs.get(key, NOT_TRACED)
    if program is NOT_TRACED:
        if _signatures[op] >= MAX_SIGNATURES:
            return NOT_TRACED
        _signatures[op] += 1
        try:
            program = _Program(op, decomposition, args, kwargs)
        except Exception as e:  # noqa: BLE001  (this signature runs op by op, which raises torch's own errors)
            if fused.interruption(e):  # a signal handler's timeout, say: no verdict on the signature
                _signatures[op] -= 1
                raise
            program = None
        if program is not None and program.reads_layout and not layout:
            _programs[key] = _BY_LAYOUT
            key = _signature(op, args, kwargs, layout=True)
        _programs[key] = program
    if program is None:
        return NOT_TRACED
    return program(args, kwargs)
