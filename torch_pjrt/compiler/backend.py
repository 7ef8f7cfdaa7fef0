"""The Dynamo backend "pjrt": AOTAutograd -> the op-table interpreter -> one jax.jit per graph.

Dynamo hands each captured graph to `pjrt_backend`. AOTAutograd functionalizes it into
core ATen (decomposing only what the op table lacks), splits training graphs into a
forward and a backward graph, and gives each to `compile_graph`, which builds a
`GraphProgram` (interpreter.py) and compiles it ahead of time into one XLA executable for
the example inputs' shapes. `CompiledGraph` runs it: pjrt inputs are read as their JAX
buffers, random nodes get seeds drawn from the torch generator, outputs are wrapped as
pjrt tensors and mutated inputs are written back (their buffers donated when nothing
else holds them).
"""
from __future__ import annotations

import functools
import os
import time
import warnings

import jax
import numpy as np
import torch
from jax.sharding import SingleDeviceSharding

from ..runtime import platform, storage
from ..runtime.build import load as _load_runtime
from ..dtypes import to_jax
from . import dynamic, spmd, stats
from .interpreter import CPU, INT, OTHER, PJRT, GraphProgram, LoweringError, find_lowering, signature

_rt = _load_runtime()
whole_buffer = _rt.whole_buffer

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
OPTIONS = {
    "fallback": "'error' (default) or 'eager': run a graph that fails to lower eagerly on pjrt, with a warning",
    "buckets": "dynamic dims: 'pow2' (default), a sorted list of sizes, or None (one executable per exact size)",
    "donate": "bool, default True: donate buffers of mutated inputs that nothing else holds",
    "dump_dir": "a folder for FX and StableHLO text (default: $TORCH_PJRT_DUMP_DIR)",
    "xla_options": "dict of extra XLA compiler options for every executable",
}

# XLA options per mode and platform. CPU has no autotuner: max-autotune is a no-op there.
_AUTOTUNE = {"gpu": {"xla_gpu_autotune_level": 4}, "cuda": {"xla_gpu_autotune_level": 4},
             "rocm": {"xla_gpu_autotune_level": 4}}


class Config:
    __slots__ = ("mode", "fallback", "buckets", "donate", "dump_dir", "xla_options")

    def __init__(self, mode=None, options=None):
        mode = "default" if mode is None else mode
        if mode not in MODES:
            raise ValueError(f"torch.compile(backend='pjrt'): unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            valid = "\n".join(f"  {k}: {v}" for k, v in OPTIONS.items())
            raise ValueError(f"torch.compile(backend='pjrt'): unknown option(s) {', '.join(unknown)}; valid options:\n{valid}")
        self.mode = mode
        self.fallback = options.get("fallback", os.environ.get("TORCH_PJRT_COMPILE_FALLBACK", "error"))
        if self.fallback not in ("error", "eager"):
            raise ValueError(f"torch.compile(backend='pjrt'): option fallback must be 'error' or 'eager', not {self.fallback!r}")
        self.buckets = dynamic.parse_buckets(options.get("buckets", "pow2"), explicit="buckets" in options)
        self.donate = bool(options.get("donate", True))
        self.dump_dir = options.get("dump_dir", os.environ.get("TORCH_PJRT_DUMP_DIR") or None)
        xla = {}
        if mode.startswith("max-autotune"):
            xla.update(_AUTOTUNE.get(platform.devices()[0].platform, {}))
        xla.update(options.get("xla_options") or {})
        self.xla_options = xla or None


_seen_guard_failures = [0]


def pjrt_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None, **unknown):
    """torch.compile(model, backend="pjrt", mode=..., options={...})."""
    if unknown:
        raise ValueError(f"torch.compile(backend='pjrt'): unexpected argument(s) {', '.join(sorted(unknown))}")
    config = Config(mode, options)
    graph_id = stats.next_graph_id()
    _note_dynamo_recompile(f"graph{graph_id}")
    from torch._dynamo.backends.common import aot_autograd

    compilers = {kind: functools.partial(compile_graph, config=config, name=f"graph{graph_id}_{kind}")
                 for kind in ("forward", "backward", "inference")}
    aot = aot_autograd(
        fw_compiler=compilers["forward"], bw_compiler=compilers["backward"], inference_compiler=compilers["inference"],
        decompositions=decompositions(), keep_inference_input_mutations=True,
    )
    return aot(gm, example_inputs)


def _note_dynamo_recompile(name: str) -> None:
    """Record Dynamo's guard failures (the reason it is compiling this frame again)."""
    from torch._dynamo.utils import guard_failures

    reasons = [r for rs in list(guard_failures.values()) for r in rs]
    new = reasons[_seen_guard_failures[0]:]
    _seen_guard_failures[0] = len(reasons)
    for r in new:
        stats.append("recompiles", {"graph": name, "reason": f"dynamo guard failed: {r}"})


@functools.lru_cache(1)
def decompositions() -> dict:
    """Core-ATen decompositions, minus ops the table lowers directly (one lowering beats
    several), plus torch's decompositions of any other op the table lacks."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = {op: fn for op, fn in core_aten_decompositions().items() if find_lowering(op) is None}
    for op, fn in decomposition_table.items():
        if isinstance(op, torch._ops.OpOverload) and op not in table and find_lowering(op) is None and not _is_inplace_or_out(op):
            table[op] = fn
    return table


def _is_inplace_or_out(op) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


# ---------------------------------------------------------------------------------
# one graph
# ---------------------------------------------------------------------------------
def compile_graph(gm: torch.fx.GraphModule, example_inputs, *, config: Config, name: str):
    """AOTAutograd's fw/bw/inference compiler: a boxed callable running the graph as one executable."""
    start = time.perf_counter()
    stats.add("graphs")
    stats.append("graph_names", name)
    try:
        if config.dump_dir:
            _dump(config.dump_dir, f"{name}.fx.txt", gm.print_readable(print_output=False))
        program = GraphProgram(gm, example_inputs, name)
        compiled = CompiledGraph(program, example_inputs, config)
    except LoweringError as e:
        if config.fallback != "eager":
            raise
        warnings.warn(f"{e}\npjrt compile: running graph '{name}' eagerly instead (option fallback='eager')")
        stats.append("eager_fallbacks", {"graph": name, "error": str(e)})
        return _boxed(gm.forward)
    finally:
        stats.add("backend_seconds", time.perf_counter() - start)
    return compiled


def _boxed(fn):
    def run(args):
        values = list(args)
        args.clear()
        return fn(*values)

    run._boxed_call = True
    return run


def _dump(folder: str, filename: str, text: str) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, filename), "w") as f:
        f.write(text)


class CompiledGraph:
    """The runtime of one graph: boxed call (args list) -> outputs list."""

    def __init__(self, program: GraphProgram, example_inputs, config: Config):
        self._boxed_call = True  # an instance attribute: wrappers (functools.wraps) copy __dict__ only
        self.program, self.config = program, config
        self.name = program.name
        self.device = program.device
        self.jax_device = platform.device(self.device)
        self.kinds = program.input_kinds
        self.mutated = program.mutated if config.donate else ()
        self.n_seeds = len(program.random_nodes)
        self.int_inputs = tuple(i for i, k in enumerate(self.kinds) if k == INT)
        self.pjrt_inputs = tuple(i for i, k in enumerate(self.kinds) if k == PJRT)
        self.cpu_inputs = tuple(i for i, k in enumerate(self.kinds) if k == CPU)
        self.output_places = [_place(d) for d in program.output_devices]
        # (seeds, constants, *inputs): ints (symbolic sizes) and opaque objects (a process
        # group's script object, for the collectives' lowerings) are static; mutated inputs donated
        static = tuple(2 + i for i, k in enumerate(self.kinds) if k in (INT, OTHER))
        donated = tuple(2 + i for i in self.mutated)
        # every array argument on the graph's device, committed or not: one executable either way
        jit = functools.partial(jax.jit, program.function, static_argnums=static, compiler_options=config.xla_options,
                                in_shardings=SingleDeviceSharding(self.jax_device))
        self.donating = jit(donate_argnums=donated) if donated else None
        self.plain = jit()
        self.executables = 0
        # symbolic sizes: padded per bucket (or per exact size when the graph is not paddable)
        self.dynamic = dynamic.DynamicPlan(self, example_inputs, config.buckets) if self.int_inputs else None
        # collectives over pjrt process groups: the graph runs as one SPMD program on their mesh
        layout = spmd.plan(program, example_inputs, dynamic=self.dynamic is not None)
        self.spmd = spmd.SpmdGraph(self, layout) if layout is not None else None
        # compile now, for the example inputs' shapes: errors surface at torch.compile time
        specs = [self._spec(x) for x in example_inputs]
        if self.spmd is not None:
            self.spmd.build(specs)
        elif self.dynamic is None:
            self._build(self.donating or self.plain, specs)
        self.fast = config.mode == "reduce-overhead" and self.dynamic is None and self.spmd is None

    # ---------------------------------------------------------------- building
    def _spec(self, x):
        if isinstance(x, torch.Tensor):
            shape = tuple(int(dynamic.hint(s)) for s in x.shape)
            return jax.ShapeDtypeStruct(shape, to_jax(x.dtype))
        if isinstance(x, torch.SymInt):
            return int(dynamic.hint(x))
        return getattr(x, "real_obj", x)  # a FakeScriptObject traces as the object calls will pass

    def _seed_spec(self):
        if not self.n_seeds:
            return None
        return jax.ShapeDtypeStruct((self.n_seeds,), np.uint64)

    def _build(self, fn, specs):
        """Trace `fn` for `specs` now, so lowering errors surface at torch.compile time. XLA
        compiles on the first call, when JAX sees the real buffers (their placement is part
        of the executable's key); that call reuses this trace."""
        self._trace(lambda: fn.trace(self._seed_spec(), self.program.constants, *specs))

    def _trace(self, trace):
        with stats.building(self.name):
            try:
                traced = trace()
            except LoweringError:
                raise
            except Exception as e:  # noqa: BLE001  (not a node's failure: name the graph at least)
                raise LoweringError(f"pjrt compile: graph '{self.name}' failed to trace: {type(e).__name__}: {e}") from e
            if self.config.dump_dir:
                _dump(self.config.dump_dir, f"{self.name}.stablehlo.txt", traced.lower().as_text())

    def _count_executable(self, reason):
        stats.add("executables")
        self.executables += 1
        if self.executables > 1:
            stats.append("recompiles", {"graph": self.name, "reason": reason})

    # ---------------------------------------------------------------- running
    def __call__(self, args: list):
        if self.fast:
            return self._call_reduce_overhead(args)
        return self._call(args)

    def _read_inputs(self, args):
        inputs = list(args)
        for i in self.pjrt_inputs:
            t = args[i]
            buf = whole_buffer(t)
            inputs[i] = buf if buf is not None else storage.read_lazily(t)
        for i in self.cpu_inputs:
            inputs[i] = jax.device_put(storage.to_numpy(args[i]), self.jax_device)
        for i in self.int_inputs:
            inputs[i] = int(args[i])
        return inputs

    def _seeds(self):
        if not self.n_seeds:
            return None
        next_seed = _rt.next_seed
        return np.array([next_seed(None, self.device) for _ in range(self.n_seeds)], dtype=np.uint64)

    def _donatable(self, inputs) -> bool:
        for i in self.mutated:
            # held by its storage and `inputs`; more holders: a view or another input shares it
            if not isinstance(inputs[i], jax.Array) or not storage.unshared(inputs[i], holders=2):
                return False
        return True

    def _call(self, args: list):
        tensors = list(args)
        args.clear()  # boxed convention: free inputs as early as the graph allows
        if self.dynamic is not None:
            return self.dynamic.call(self, tensors)
        if self.spmd is not None:
            return self.spmd.call(tensors)
        inputs = self._read_inputs(tensors)
        fn = self.donating if self.donating is not None and self._donatable(inputs) else self.plain
        seeds = self._seeds()
        outputs, new_values = self._execute(fn, seeds, inputs)
        return self._finish(tensors, outputs, new_values, inputs)

    def _execute(self, fn, seeds, inputs):
        stats.add("calls")
        executables = stats._state["executables"]
        before = stats.marker()
        with stats.building(self.name):
            result = fn(seeds, self.program.constants, *inputs)
        if stats.marker() != before:  # a new input signature compiled (or loaded) on this call
            self._count_executable(self._why_new(inputs, fn))
        if stats._state["executables"] == executables:
            stats.add("cache_hits")
        return result

    def _why_new(self, inputs, fn) -> str:
        parts = [f"size input {i} = {inputs[i]}" for i in self.int_inputs]
        for i, v in enumerate(inputs):
            if hasattr(v, "geometry"):
                parts.append(f"input {i} is a strided view {v.geometry[:2]}")
            elif isinstance(v, jax.Array):
                parts.append(f"input {i}: {v.dtype}{list(v.shape)}")
        if fn is self.plain and self.donating is not None:
            parts.insert(0, "mutated inputs not donatable (shared buffers)")
        return "new input signature: " + "; ".join(parts[:8]) + (" ..." if len(parts) > 8 else "")

    def _finish(self, tensors, outputs, new_values, inputs):
        for i, value in zip(self.program.mutated, new_values):
            _write_back(tensors[i], value)
        python = self.program.python_outputs
        python = next(iter(python.values())) if len(python) == 1 else python[signature(inputs)]
        results = []
        it = iter(outputs)
        for value, place in zip(python, self.output_places):
            results.append(value if value is not None or place is None else place(next(it), self.device))
        return results

    def _call_reduce_overhead(self, args: list):
        """mode="reduce-overhead": the same steps with per-input work precomputed and no
        lock or cache-hit bookkeeping on the hot path (calls and executables are still counted)."""
        tensors = list(args)
        args.clear()
        inputs = tensors[:]
        for i in self.pjrt_inputs:
            buf = whole_buffer(tensors[i])
            inputs[i] = buf if buf is not None else storage.read_lazily(tensors[i])
        for i in self.cpu_inputs:
            inputs[i] = jax.device_put(storage.to_numpy(tensors[i]), self.jax_device)
        fn = self.donating if self.donating is not None and self._donatable(inputs) else self.plain
        seeds = self._seeds() if self.n_seeds else None
        stats._state["calls"] += 1  # (a GIL-atomic enough counter: no lock on the hot path)
        before = stats.marker()
        with stats.building(self.name):
            outputs, new_values = fn(seeds, self.program.constants, *inputs)
        if stats.marker() != before:
            self._count_executable(self._why_new(inputs, fn))
        return self._finish(tensors, outputs, new_values, inputs)


def _write_back(t: torch.Tensor, value) -> None:
    if t.device.type == "pjrt":
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
