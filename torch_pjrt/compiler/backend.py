"""The Dynamo backend "pjrt": AOTAutograd -> the op-table interpreter -> one jax.jit per graph.

Dynamo hands each captured graph to `pjrt_backend`. AOTAutograd functionalizes it into
core ATen (decomposing only what the op table lacks), splits training graphs into a
forward and a backward graph, and gives each to `compile_graph`, which builds a
`GraphProgram` (eager/graph.py) and a `GraphRunner` (runner.py) with the strategy that fits
the graph (`choose_strategy`), compiled ahead of time for the example inputs' shapes.
"""
from __future__ import annotations

import functools
import os
import time
import warnings

import torch

from ..runtime import platform
from . import dynamic, spmd, stats
from ..eager.graph import GraphProgram, LoweringError, find_lowering
from .runner import Exact, GraphRunner, ReduceOverhead, dump

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
            dump(config.dump_dir, f"{name}.fx.txt", gm.print_readable(print_output=False))
        program = GraphProgram(gm, example_inputs, name)
        compiled = GraphRunner(program, example_inputs, config, choose_strategy)
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


def choose_strategy(runner: GraphRunner, example_inputs):
    """How a graph runs. Collectives over pjrt process groups with one mesh: one SPMD program;
    symbolic sizes: padded per bucket where padding.py can make the graph exact, else one
    executable per exact size; otherwise one executable per input signature."""
    symbolic = bool(runner.int_inputs)
    bucketed = dynamic.plan(runner, example_inputs, runner.config.buckets) if symbolic else None
    layout = spmd.plan(runner.program, example_inputs, dynamic=symbolic)
    if layout is not None:
        return spmd.Spmd(runner, layout, example_inputs)
    if bucketed is not None:
        return bucketed
    if symbolic:
        return Exact(runner)  # traced per exact size on first use
    if runner.config.mode == "reduce-overhead":
        return ReduceOverhead(runner, example_inputs)
    return Exact(runner, example_inputs)
