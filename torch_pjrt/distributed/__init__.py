"""torch.distributed on pjrt: the process-group backend "pjrt".

`init_process_group("pjrt")` (or "cpu:gloo,pjrt:pjrt") creates a `ProcessGroupPjrt` per
group. Collectives on pjrt tensors run as XLA collectives through JAX's multi-process
runtime when torchrun started one (see runtime/multiprocess.py), otherwise, and for the ops XLA has no
clean form for, they stage through host memory on a gloo group the backend owns. CPU
tensors always go to that gloo group. docs/distributed.md lists which op takes which path.

This package.s __init__ stays light.
"""
from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """Register backend "pjrt" with torch.distributed and the functional collectives' lowerings. Idempotent."""
    from . import collectives  # noqa: F401  (registers the functional collectives' lowerings)
    from . import backend

    backend.register()
