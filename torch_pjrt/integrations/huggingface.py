"""transformers and accelerate on pjrt: the environment defaults both read, set where pjrt is the accelerator.

- `ACCELERATE_TORCH_DEVICE`: accelerate puts the model on `torch.accelerator`'s device (pjrt), but
  transformers' `TrainingArguments.device` knows no pjrt and falls back to this variable, else
  "cpu": without it `Trainer` moves batches to the CPU and its first step fails with a device
  mismatch.
- `USE_HUB_KERNELS`: `from_pretrained` kernelizes the model with HF `kernels`, whose device list
  has no pjrt (ValueError on load); its kernels target CUDA, ROCm, Metal, XPU and NPU, none of
  which runs on pjrt, so turning them off loses nothing.

A value the user set is never changed. docs/ecosystem.md gives the upstream changes that
would make both unnecessary.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

from . import native_accelerators

# Modules whose import applies the defaults: both read the variables when used, not when imported.
READ_BY = ("transformers", "accelerate")

ENV_DEFAULTS = {"ACCELERATE_TORCH_DEVICE": "pjrt", "USE_HUB_KERNELS": "NO"}

# What `apply` set, for `torch-pjrt doctor` and for tests.
applied: dict[str, str] = {}


def env_defaults(environ: Mapping[str, str], native: list[str]) -> dict[str, str]:
    """The variables to set: none where a native accelerator (CUDA...) is the libraries' choice,
    else each default the user has not set."""
    if native:
        return {}
    return {name: value for name, value in ENV_DEFAULTS.items() if name not in environ}


def apply() -> None:
    if applied:
        return
    defaults = env_defaults(os.environ, native_accelerators())
    os.environ.update(defaults)
    applied.update(defaults)


def warn_multi_process() -> None:
    """Run when accelerate is imported under a launcher of several processes."""
    if applied.get("ACCELERATE_TORCH_DEVICE") and _world_size() > 1:
        # accelerate 1.16 maps each multi-process device type to a DistributedType of its own
        # list (MULTI_GPU, MULTI_NPU...): a generic accelerator gets DistributedType.NO, so each
        # process would train alone. Say so once instead of letting the replicas diverge quietly.
        warnings.warn(
            "torch-pjrt: accelerate (and so transformers' Trainer) has no multi-process mode for the "
            "pjrt device: under torchrun each process trains on its own, without DDP. Use DDP on the "
            "'pjrt' process group directly, or Lightning (strategy='ddp_pjrt'); docs/ecosystem.md has the "
            "accelerate change that enables it.",
            stacklevel=2,
        )


def warn_bf16_default() -> None:
    """Run when TRL is imported: its configs default to bf16=True, which transformers refuses on pjrt."""
    if applied.get("ACCELERATE_TORCH_DEVICE"):
        # transformers 5.25 accepts bf16 only on devices of its own list (is_torch_bf16_gpu_available),
        # and its error asks for use_cpu, which is not what a pjrt user wants.
        warnings.warn(
            "torch-pjrt: TRL's configs (SFTConfig, DPOConfig...) default to bf16=True, which transformers "
            "refuses on the pjrt device ('Your setup doesn't support bf16/gpu'). Pass bf16=False; "
            "docs/ecosystem.md has the transformers change that enables bf16 on pjrt.",
            stacklevel=2,
        )


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)
