"""Dynamic shapes: graphs whose sizes are symbols (dynamic=True, mark_dynamic, automatic dynamic).

AOTAutograd hands such graphs over with SymInt placeholders. XLA needs static shapes, so
each distinct set of sizes gets its own executable of the same graph: sizes are static
arguments of the graph's jax.jit, and Python-valued outputs (sizes saved for backward)
are taken from the trace of those sizes. Results equal eager; Dynamo compiles the graph once.

Not done yet: rounding dynamic dims up to buckets (powers of two or a user list), padding
and masking, which would bound executables by the bucket count. The `buckets` option is
validated and reserved for it; setting it explicitly warns that it has no effect yet.
"""
from __future__ import annotations

import warnings

import torch


def hint(s):
    """The example value of a (possibly symbolic) size."""
    if isinstance(s, torch.SymInt):
        return s.node.hint
    return s


def parse_buckets(value, explicit: bool = False):
    if value is None or value == "pow2":
        parsed = value
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and v > 0 for v in value) \
            and list(value) == sorted(value):
        parsed = tuple(value)
    else:
        raise ValueError(f"torch.compile(backend='pjrt'): option buckets must be 'pow2', None or a sorted list of "
                         f"positive sizes, not {value!r}")
    if explicit:
        warnings.warn("torch.compile(backend='pjrt'): option buckets is not applied yet; each new size compiles "
                      "its own executable (see docs/compile.md)")
    return parsed


class DynamicPlan:
    """Runs a graph with symbolic sizes: one executable per distinct set of sizes."""

    def __init__(self, program, example_inputs, buckets):
        self.program, self.buckets = program, buckets

    def call(self, compiled, tensors):
        inputs = compiled._read_inputs(tensors)
        fn = compiled.donating if compiled.donating is not None and compiled._donatable(inputs) else compiled.plain
        outputs, new_values = compiled._execute(fn, compiled._seeds(), inputs)
        return compiled._finish(tensors, outputs, new_values, inputs)
