"""The stacks users run (transformers, accelerate, Lightning) finding pjrt through their own hooks.

Each library keeps its own list of devices. We reach them only through what they support
(environment defaults they read, public registries), applied when the library is imported
and only where pjrt is the accelerator, so a machine with CUDA behaves as without torch-pjrt.
docs/ecosystem.md lists each library, the hook used and the upstream change that would remove it.
"""
from __future__ import annotations

import torch


def native_accelerators() -> list[str]:
    """Accelerators torch supports natively that are available here (cuda, xpu, mps...).

    `torch.accelerator` reports a registered PrivateUse1 device ahead of CUDA, so it cannot
    tell whether pjrt is the machine's accelerator; each native backend is asked instead.
    Called when a library is imported, not at `import torch`, so no driver starts early."""
    found = []
    for name in ("cuda", "xpu", "mtia", "npu", "hpu", "neuron"):
        module = getattr(torch, name, None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            found.append(name)
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def install() -> None:
    """Hooks run when each library is first imported (now, if it already is)."""
    from torch_pjrt import _after_import  # the package itself (layer 6), defined before setup runs
    from . import huggingface

    for module in huggingface.READ_BY:
        _after_import(module, huggingface.apply)
    _after_import("accelerate", huggingface.warn_multi_process)
    _after_import("trl", huggingface.warn_bf16_default)
