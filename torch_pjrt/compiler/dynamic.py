"""Dynamic shapes: placeholder."""
from __future__ import annotations

import torch


def hint(s):
    if isinstance(s, torch.SymInt):
        return s.node.hint
    return s


def parse_buckets(value):
    return value


class DynamicPlan:
    def __init__(self, program, example_inputs, buckets):
        self.program = program

    def call(self, compiled, tensors):
        inputs = compiled._read_inputs(tensors)
        seeds = compiled._seeds()
        outputs, new_values = compiled._execute(compiled.plain, seeds, inputs)
        return compiled._finish(tensors, outputs, new_values, inputs)
