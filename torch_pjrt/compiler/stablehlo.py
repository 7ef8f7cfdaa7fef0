"""torch_pjrt.export(model, example_args) -> StableHLO text, for deployment outside Python.

torch.export captures the model (parameters and buffers lifted to graph inputs), its
graph is decomposed to core ATen minus what the op table lowers directly, and the same
interpreter the compile backend uses turns it into one JAX function, lowered with
`jax.jit(...).lower(...).as_text()`.

The module's `main` takes, in order: a uint64 seed vector when the model has random ops
(one seed per random op; absent otherwise), graph constants, then the parameters and
buffers (in `ExportedProgram.graph_signature` order), then the user inputs. It returns
the user outputs (plus buffer updates, for a model that mutates buffers).
"""
from __future__ import annotations

import jax
import numpy as np
import torch

from .backend import decompositions
from ..eager.graph import GraphProgram, abstract_input


def export(model: torch.nn.Module, example_args: tuple, example_kwargs: dict | None = None, *,
           dynamic_shapes=None, strict: bool = False) -> str:
    """StableHLO text of `model` for `example_args`' shapes and dtypes."""
    exported = torch.export.export(model, tuple(example_args), example_kwargs, dynamic_shapes=dynamic_shapes,
                                   strict=strict)
    exported = exported.run_decompositions(decompositions())
    gm = exported.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = [n.meta.get("val") for n in placeholders]
    if any(isinstance(v, torch.SymInt) for v in examples) or any(
            isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape) for v in examples):
        raise NotImplementedError("torch_pjrt.export: dynamic shapes are not supported yet; export one shape per call")
    program = GraphProgram(gm, examples, "export")
    seeds = jax.ShapeDtypeStruct((len(program.random_nodes),), np.uint64) if program.random_nodes else None
    specs = [abstract_input(v) for v in examples]
    return jax.jit(program.function).lower(seeds, program.constants, *specs).as_text()
