"""The one runner of compiled graphs: a boxed call (args list) -> outputs list.

`GraphRunner` owns what every call does the same way: reading inputs (pjrt tensors as their
JAX buffers, CPU tensors uploaded, sizes as ints), drawing seeds from the torch generator,
counting calls, cache hits and new executables, writing mutated inputs back and wrapping
outputs as tensors. A *strategy* supplies what differs between ways of running a graph:
its executables (built at torch.compile time, so lowering errors surface there), the
arguments one call passes them, and how their results become the graph's outputs.

- `Exact` (runner.py): one executable per input signature; mutated inputs' buffers donated
  when nothing else holds them, a non-donating twin otherwise.
- `ReduceOverhead` (runner.py): `Exact` for mode="reduce-overhead": no lock and no cache-hit
  bookkeeping on the hot path.
- `Bucketed` (dynamic.py): symbolic sizes, inputs padded to a bucket per symbol.
- `Spmd` (spmd.py): collectives over pjrt process groups, one SPMD program on their mesh.
"""
from __future__ import annotations

import functools
import os

import jax
import numpy as np
import torch
from jax.sharding import SingleDeviceSharding

from ..dtypes import to_jax
from ..runtime import fused, platform, storage
from ..runtime.safe_point import safe_point
from ..runtime.build import load as _load_runtime
from . import stats
from ..eager.graph import CPU, INT, OTHER, PJRT, GraphProgram, LoweringError, signature

_rt = _load_runtime()
whole_buffer = _rt.whole_buffer


def hint(s):
    """The example value of a (possibly symbolic) size."""
    if isinstance(s, torch.SymInt):
        return s.node.hint
    return s


def dump(folder: str, filename: str, text: str) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, filename), "w") as f:
        f.write(text)


class GraphRunner:
    """One compiled graph: `strategy = choose(runner, example_inputs)` builds its executables."""

    def __init__(self, program: GraphProgram, example_inputs, config, choose):
        self._boxed_call = True  # an instance attribute: wrappers (functools.wraps) copy __dict__ only
        self.program, self.config = program, config
        self.name = program.name
        self.device = program.device
        self.jax_device = platform.device(self.device)
        self.kinds = program.input_kinds
        self.mutated = program.mutated if config.donate else ()  # the inputs whose buffers may be donated
        self.n_seeds = len(program.random_nodes)
        self.int_inputs = tuple(i for i, k in enumerate(self.kinds) if k == INT)
        self.pjrt_inputs = tuple(i for i, k in enumerate(self.kinds) if k == PJRT)
        self.cpu_inputs = tuple(i for i, k in enumerate(self.kinds) if k == CPU)
        self.output_places = [_place(d) for d in program.output_devices]
        self.executables = 0
        self._built: set = set()  # (callable, input signature) built so far
        self.strategy = choose(self, example_inputs)

    # ---------------------------------------------------------------- building (for strategies)
    def spec(self, x):
        """What an example input traces as."""
        if isinstance(x, torch.Tensor):
            return jax.ShapeDtypeStruct(tuple(int(hint(s)) for s in x.shape), to_jax(x.dtype))
        if isinstance(x, torch.SymInt):
            return int(hint(x))
        return getattr(x, "real_obj", x)  # a FakeScriptObject traces as the object calls will pass

    def seed_spec(self):
        if not self.n_seeds:
            return None
        return jax.ShapeDtypeStruct((self.n_seeds,), np.uint64)

    def trace(self, trace) -> None:
        """Run `trace()` (a jit's .trace(...)) now, naming the graph in errors. XLA compiles on the
        first call, when JAX sees the real buffers (their placement is part of the executable's
        key); that call reuses this trace."""
        with stats.building(self.name):
            try:
                traced = trace()
            except LoweringError:
                raise
            except Exception as e:  # noqa: BLE001  (not a node's failure: name the graph at least)
                raise LoweringError(f"pjrt compile: graph '{self.name}' failed to trace: {type(e).__name__}: {e}") from e
            if self.config.dump_dir:
                dump(self.config.dump_dir, f"{self.name}.stablehlo.txt", traced.lower().as_text())

    # ---------------------------------------------------------------- per call (for strategies)
    def read_inputs(self, tensors):
        """The graph's inputs as the executable takes them (a strided view stays lazy)."""
        inputs = list(tensors)
        for i in self.pjrt_inputs:
            buf = whole_buffer(tensors[i])
            inputs[i] = buf if buf is not None else storage.read_lazily(tensors[i])
        if fused.enabled:  # a compiled graph runs now, on arrays (pending ones run their region first)
            inputs = fused.concrete(inputs)
        for i in self.cpu_inputs:
            inputs[i] = jax.device_put(storage.to_numpy(tensors[i]), self.jax_device)
        for i in self.int_inputs:
            inputs[i] = int(tensors[i])
        return inputs

    def seeds(self):
        if not self.n_seeds:
            return None
        next_seed = _rt.next_seed
        return np.array([next_seed(None, self.device) for _ in range(self.n_seeds)], dtype=np.uint64)

    def donatable(self, inputs) -> bool:
        for i in self.mutated:
            # held by its storage and `inputs`; more holders: a view or another input shares it
            if not isinstance(inputs[i], jax.Array) or not storage.unshared(inputs[i], holders=2):
                return False
        return True

    def why_new(self, inputs, undonated: bool) -> str:
        """A recompile reason: the input signature (and whether donation was refused)."""
        parts = [f"size input {i} = {inputs[i]}" for i in self.int_inputs]
        for i, v in enumerate(inputs):
            if hasattr(v, "geometry"):
                parts.append(f"input {i} is a strided view {v.geometry[:2]}")
            elif isinstance(v, jax.Array):
                parts.append(f"input {i}: {v.dtype}{list(v.shape)}")
        if undonated:
            parts.insert(0, "mutated inputs not donatable (shared buffers)")
        return "new input signature: " + "; ".join(parts[:8]) + (" ..." if len(parts) > 8 else "")

    def python_values(self, inputs) -> list:
        """The graph's flat outputs as traced for `inputs`' signature: Python values (None,
        sizes), None where an array leaves the executable."""
        python = self.program.python_outputs
        return next(iter(python.values())) if len(python) == 1 else python[signature(inputs)]

    # ---------------------------------------------------------------- the call
    @platform.raises_torch_errors
    def __call__(self, args: list):
        tensors = list(args)
        args.clear()  # boxed convention: free inputs as early as the graph allows
        safe_point()
        strategy = self.strategy
        fn, call_args, state = strategy.prepare(tensors)
        strategy.count_call()
        before = stats.marker()
        result = strategy.execute(fn, call_args)
        if stats.marker() != before and self._new_build(fn, tensors):  # a new input signature compiled (or loaded)
            self._count_executable(strategy.why_new(fn, state))
        elif strategy.counts_cache_hits:
            stats.add("cache_hits")
        outputs, new_values, python = strategy.results(result, state)
        for i, value in zip(self.program.mutated, new_values):
            _write_back(tensors[i], value)
        arrays = iter(outputs)
        return [value if value is not None or place is None else place(next(arrays), self.device)
                for value, place in zip(python, self.output_places)]

    def _new_build(self, fn, tensors: list) -> bool:
        """False for a rebuild of an executable this graph already built (the same callable on
        the same signature, after runtime/executable_budget.py dropped JAX's executables)."""
        key = (fn, tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else
                         t if t is None or isinstance(t, (int, float, bool)) else type(t) for t in tensors))
        if key in self._built:
            return False
        self._built.add(key)
        return True

    def _count_executable(self, reason):
        stats.add("executables")
        self.executables += 1
        if self.executables > 1:
            stats.append("recompiles", {"graph": self.name, "reason": reason})


class Strategy:
    """What a way of running a graph supplies to the runner (see the module docstring).

    prepare(tensors) -> (executable, its arguments, state for why_new and results);
    execute(executable, arguments) -> its result; why_new(executable, state) -> a recompile
    reason; results(result, state) -> (array outputs, new values of mutated inputs, the flat
    outputs' Python values with None where an array goes)."""

    counts_cache_hits = True

    def __init__(self, runner: GraphRunner):
        self.runner = runner

    def count_call(self) -> None:
        stats.add("calls")

    def execute(self, fn, args):
        with stats.building(self.runner.name):
            return fn(*args)


class Exact(Strategy):
    """One executable per input signature, inputs passed as they are: (seeds, constants, *inputs),
    sizes and opaque objects (a process group's script object, for the collectives' lowerings)
    static. Mutated inputs' buffers are donated when nothing else holds them; otherwise the
    non-donating twin runs."""

    def __init__(self, runner: GraphRunner, example_inputs=None):
        super().__init__(runner)
        program = runner.program
        static = tuple(2 + i for i, k in enumerate(runner.kinds) if k in (INT, OTHER))
        donated = tuple(2 + i for i in runner.mutated)
        # every array argument on the graph's device, committed or not: one executable either way
        jit = functools.partial(jax.jit, program.function, static_argnums=static,
                                compiler_options=runner.config.xla_options,
                                in_shardings=SingleDeviceSharding(runner.jax_device))
        self.donating = jit(donate_argnums=donated) if donated else None
        self.plain = jit()
        if example_inputs is not None:  # None: symbolic sizes, traced per exact size on first use
            specs = [runner.spec(x) for x in example_inputs]
            runner.trace(lambda: (self.donating or self.plain).trace(runner.seed_spec(), program.constants, *specs))

    def prepare(self, tensors):
        runner = self.runner
        inputs = runner.read_inputs(tensors)
        fn = self.donating if self.donating is not None and runner.donatable(inputs) else self.plain
        return fn, (runner.seeds(), runner.program.constants, *inputs), inputs

    def why_new(self, fn, inputs) -> str:
        return self.runner.why_new(inputs, undonated=fn is self.plain and self.donating is not None)

    def results(self, result, inputs):
        outputs, new_values = result
        return outputs, new_values, self.runner.python_values(inputs)


class ReduceOverhead(Exact):
    """mode="reduce-overhead": the same executables; per call no lock and no cache-hit
    bookkeeping (calls and executables are still counted)."""

    counts_cache_hits = False

    def count_call(self) -> None:
        stats.add_unlocked("calls")


def _write_back(t: torch.Tensor, value) -> None:
    if t.device.type == "pjrt":
        if not _rt.store_whole(t, value):  # the common case (a static cache, a buffer): in C++
            storage.write(t, value)
    else:
        t.copy_(storage.from_numpy(np.asarray(value)))


def _to_pjrt(array, device):
    return storage.wrap(array, device)


def _to_cpu(array, device):
    return storage.from_numpy(np.asarray(array))


def _place(device):
    if device is None:
        return None
    return _to_pjrt if device.type == "pjrt" else _to_cpu
