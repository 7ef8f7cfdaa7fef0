"""torch.compile(backend="pjrt"): Dynamo graphs as XLA executables through the op table.

Importing this package registers the Dynamo backend "pjrt" and tells Dynamo not to trace
into torch_pjrt's own Python (its eager kernels) or JAX.
"""
from __future__ import annotations

import torch
import torch._dynamo

from . import inductor, optimizers
from .backend import pjrt_backend
from ..eager.graph import LoweringError
from .stats import compile_stats, reset_compile_stats

__all__ = ["pjrt_backend", "compile_stats", "reset_compile_stats", "LoweringError", "export"]


def export(model, example_args, example_kwargs=None, **kwargs):
    """StableHLO text of `model` traced by torch.export (see stablehlo.py)."""
    from .stablehlo import export as _export

    return _export(model, example_args, example_kwargs, **kwargs)


# The runtime's own Python: eager kernels the dispatcher calls (and the error checks they
# run), storage, the op table. Inside a compiled region (e.g. backward after a graph break)
# Dynamo would otherwise try to trace them. A package skips every module below it. Only
# these: user-facing modules such as torch_pjrt.tools.demo_models hold ordinary models that
# must stay traceable.
_RUNTIME_MODULES = (
    "torch_pjrt.runtime", "torch_pjrt.eager", "torch_pjrt.device", "torch_pjrt.autocast", "torch_pjrt.ops",
    "torch_pjrt.compiler", "jax", "jaxlib",
)


def _skip_in_dynamo() -> None:
    from torch._dynamo import trace_rules

    for module in _RUNTIME_MODULES:
        trace_rules.add(module)


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    if "pjrt" in _COMPILER_FNS:
        return
    if _BACKENDS.get("pjrt") is not None:  # our entry point is being loaded: lookup_backend registers it
        return
    register_backend(pjrt_backend, name="pjrt")


_skip_in_dynamo()
_register()
inductor.register()
optimizers.install()
