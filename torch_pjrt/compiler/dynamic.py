"""Dynamic shapes: graphs whose sizes are symbols (dynamic=True, mark_dynamic, automatic dynamic).

AOTAutograd hands such graphs over with SymInt placeholders. XLA needs static shapes, so a
graph is compiled per *bucket*: every symbol is rounded up (to a power of two, or to the next
size of the user's `buckets` list), inputs are zero-padded to the bucket, the graph runs padded
(padding.py: per-op rules mask the padding wherever it could reach real elements, and sizes
used as values get the real size, passed in as a traced vector), and outputs are sliced back.
Executables per graph are bounded by the number of bucket combinations touched.

A graph that padding.py cannot make exact (an op without a rule, a random op, a reshape
splitting a padded dim, ...) falls back to one executable per distinct set of exact sizes:
sizes are static arguments of the graph's jax.jit, and Python-valued outputs (sizes saved for
backward) come from the trace of those sizes. The decision and its reason are recorded in
`compile_stats()["dynamic_graphs"]`.
"""
from __future__ import annotations

import time

import jax
import numpy as np
import torch
from jax.sharding import SingleDeviceSharding

from ..dtypes import to_jax
from ..runtime import storage
from . import stats
from ..eager.graph import LoweringError
from .padding import NotPaddable, PaddedProgram, Size, dim_for_expr, expand_layout, host_eval, pad_fn, sym_expr, \
    unpad_fn
from .runner import GraphRunner, Strategy, hint

# compound size expression (s0*s1) -> the flattening order a graph produced it in, so graphs reading
# such a tensor back (backward reading saved activations) pad it in the same layout
_LAYOUTS: dict = {}


def parse_buckets(value, explicit: bool = False):
    """'pow2' (default): next power of two; a sorted list: next size in it (exact beyond the last);
    None: no bucketing, one executable per exact size."""
    if value is None or value == "pow2":
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and v > 0 for v in value) \
            and list(value) == sorted(value):
        return tuple(value)
    raise ValueError(f"torch.compile(backend='pjrt'): option buckets must be 'pow2', None or a sorted list of "
                     f"positive sizes, not {value!r}")


def bucket_of(n: int, buckets) -> int:
    if buckets == "pow2":
        return storage.power_of_two_at_least(n)
    for b in buckets:
        if b >= n:
            return b
    return n  # beyond the largest bucket: this size gets its own executable


def plan(runner: GraphRunner, example_inputs, buckets) -> Bucketed | None:
    """The graph padded per bucket, or None (one executable per exact size); the decision and
    its reason go to compile_stats()["dynamic_graphs"]."""
    start = time.perf_counter()
    bucketed, reason = None, None
    if buckets is None:
        reason = "option buckets=None"
    else:
        try:
            bucketed = Bucketed(runner, example_inputs, buckets)
        except NotPaddable as e:
            reason = str(e)
        except LoweringError:
            raise
        except Exception as e:  # noqa: BLE001  (a rule's own failure: stay exact rather than wrong)
            reason = f"padding failed: {type(e).__name__}: {e}"
    stats.append("dynamic_graphs", {"graph": runner.name, "bucketed": bucketed is not None,
                                    "reason": reason, "plan_seconds": time.perf_counter() - start})
    return bucketed


class Bucketed(Strategy):
    """Runs a graph with symbolic sizes padded per bucket: one executable per bucket key.

    The executable takes (bucket key: static, seeds, constants, real sizes, *padded arrays); the
    real sizes are Python ints, so they trace as weakly typed scalars (a size used as a value
    promotes like the Python int it is in torch)."""

    def __init__(self, runner: GraphRunner, example_inputs, buckets):
        super().__init__(runner)
        program = runner.program
        self.program, self.buckets = program, buckets
        layouts, binders, symbols = [], {}, set()
        for i, (node, x) in enumerate(zip(program.placeholders, example_inputs)):
            if isinstance(x, torch.Tensor):
                dims = []
                for d, s in enumerate(x.shape):
                    e = sym_expr(s)
                    if e is not None:
                        symbols |= e.free_symbols
                        if e.is_Symbol:
                            binders.setdefault(e, (i, d))
                    dims.append(dim_for_expr(e, _LAYOUTS))
                layouts.append(tuple(dims))
            elif isinstance(x, torch.SymInt) and sym_expr(x) is not None:
                e = sym_expr(x)
                symbols |= e.free_symbols
                if e.is_Symbol:
                    binders.setdefault(e, (i, None))
                layouts.append(e)
            elif isinstance(x, (int, torch.SymInt)):
                layouts.append(None)
            else:
                raise NotPaddable(f"input {i} of type {type(x).__name__}")
        unbound = symbols - set(binders)
        if unbound:
            raise NotPaddable(f"sizes {sorted(map(str, unbound))} appear only inside expressions of the inputs")
        self.symbols = sorted(binders, key=str)
        self.binders = [binders[s] for s in self.symbols]
        self.layouts = layouts
        self.padded = PaddedProgram(program, layouts, self.symbols, _LAYOUTS)
        self.jit = jax.jit(self.padded.function, static_argnums=(0,), compiler_options=runner.config.xla_options,
                           in_shardings=SingleDeviceSharding(runner.jax_device))
        # trace now, for the example inputs' bucket: padding and lowering errors surface at torch.compile time
        reals = {s: int(hint(example_inputs[i].shape[d] if d is not None else example_inputs[i]))
                 for s, (i, d) in zip(self.symbols, self.binders)}
        key, buckets = self._key(reals)
        specs = []
        for x, lay in zip(example_inputs, layouts):
            if isinstance(lay, tuple):
                shape = expand_layout(lay, [int(hint(s)) for s in x.shape], buckets, reals)[3]
                specs.append(jax.ShapeDtypeStruct(shape, to_jax(x.dtype)))
        reals_spec = tuple(jax.ShapeDtypeStruct((), np.int64, weak_type=True) for _ in self.symbols)
        with stats.building(program.name):
            self.jit.trace(key, runner.seed_spec(), program.constants, reals_spec, *specs)

    def _key(self, reals: dict):
        key = tuple(bucket_of(reals[s], self.buckets) for s in self.symbols)
        return key, dict(zip(self.symbols, key))

    def prepare(self, tensors):
        reals = {}
        for s, (i, d) in zip(self.symbols, self.binders):
            reals[s] = int(tensors[i].shape[d]) if d is not None else int(tensors[i])
        key, buckets = self._key(reals)
        arrays = []
        for i, lay in enumerate(self.layouts):
            if not isinstance(lay, tuple):
                continue
            t = tensors[i]
            if t.device.type == "pjrt":
                x = storage.read(t)
            else:
                x = jax.device_put(storage.to_numpy(t), self.runner.jax_device)
            real_f, pad_f, real_s, pad_s = expand_layout(lay, tuple(t.shape), buckets, reals)
            if tuple(t.shape) != real_s:
                raise RuntimeError(f"pjrt compile: graph '{self.program.name}' input {i} has shape {tuple(t.shape)}, "
                                   f"its symbolic sizes say {real_s}")
            if real_f != pad_f:
                x = pad_fn(real_f, pad_f, pad_s)(x)
            arrays.append(x)
        real_sizes = tuple(reals[s] for s in self.symbols)
        args = (key, self.runner.seeds(), self.program.constants, real_sizes, *arrays)
        return self.jit, args, (key, buckets, reals)

    def why_new(self, fn, state) -> str:
        key, _, reals = state
        return "new bucket: " + ", ".join(f"{s}={reals[s]}->{b}" for s, b in zip(self.symbols, key))

    def results(self, result, state):
        key, buckets, reals = state
        outputs, new_values = result
        out_layouts, new_layouts = self.padded.output_layouts[key]
        new_values = [_unpad(v, lay, buckets, reals) for v, lay in zip(new_values, new_layouts)]
        outputs = [_unpad(o, lay, buckets, reals) for o, lay in zip(outputs, out_layouts)]
        python = [host_eval(v.expr, reals) if isinstance(v, Size) else v for v in self.padded.python_outputs[key]]
        return outputs, new_values, python


def _unpad(x, layout, buckets, reals):
    if layout is None or all(d is None for d in layout):
        return x
    real_f, pad_f, real_s, pad_s = expand_layout(layout, tuple(x.shape), buckets, reals)
    if real_f == pad_f:
        return x
    return unpad_fn(pad_f, real_f, real_s)(x)


__all__ = ["Bucketed", "plan", "parse_buckets", "bucket_of"]
