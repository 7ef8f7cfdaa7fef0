"""`check`: a kernel against its reference, for users' own tests.

For each sample it runs the kernel on pjrt tensors and the reference in plain JAX on the
host, compares outputs, then compares gradients of every floating-point tensor argument
(for one random cotangent per output) with `jax.vjp` of the reference, and finally runs
`torch.library.opcheck` (schema, fake impl, autograd registration, AOT dispatch).
"""
from __future__ import annotations

from typing import Any, Iterable

import jax
import numpy as np
import torch

from ..runtime import storage
from . import platforms
from .op import Kernel, _reference_vjp


def _split(sample) -> tuple[tuple, dict]:
    if isinstance(sample, dict):
        return tuple(sample.get("args", ())), dict(sample.get("kwargs", {}))
    if isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[0], tuple) and isinstance(sample[1], dict):
        return sample
    return tuple(sample), {}


def _to(v, device):
    return v.detach().to(device) if isinstance(v, torch.Tensor) else v


def _differentiable(v) -> bool:
    return isinstance(v, torch.Tensor) and (v.dtype.is_floating_point or v.dtype.is_complex)


def _host_array(v):
    if isinstance(v, torch.Tensor):
        return jax.device_put(storage.to_numpy(v.detach().cpu()), platforms.host_device())
    return v


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def reference_outputs(kernel: Kernel, args: tuple, kwargs: dict, cotangents: tuple | None = None):
    """(outputs, gradients of floating tensor args or None) of `kernel.reference`, as host tensors."""
    if kernel.reference is None:
        raise ValueError(f"{kernel.name}: check needs a reference= implementation")
    host = [_host_array(a) for a in args]
    kw = {k: _host_array(v) for k, v in kwargs.items()}
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    with platforms.tracing_for("cpu"):
        outs = tuple(_to_torch(o) for o in _as_tuple(kernel.reference(*host, **kw)))
        if cotangents is None:
            return outs, None
        grads = _reference_vjp(kernel.reference, host, kw, tensors, tuple(_host_array(c) for c in cotangents))
    return outs, {i: _to_torch(g) for i, g in zip(tensors, grads) if g is not None}


def _to_torch(a) -> torch.Tensor:
    return storage.from_numpy(np.asarray(a))


def check(kernel: Kernel, samples: Iterable[Any], *, atol: float | None = None, rtol: float | None = None,
          backward: bool = True, opcheck: bool = True, device: str = "pjrt", seed: int = 0) -> None:
    """Assert that `kernel` equals its reference on every sample, forward and backward, and passes opcheck.

    A sample is a tuple of arguments, `(args, kwargs)`, or {"args": ..., "kwargs": ...}; tensors may be
    on any device (they are moved to `device`). Tolerances default to torch.testing's per dtype.
    """
    generator = torch.Generator().manual_seed(seed)
    for n, sample in enumerate(samples):
        args, kwargs = _split(sample)
        dev_args = tuple(_to(a, device) for a in args)
        dev_kwargs = {k: _to(v, device) for k, v in kwargs.items()}
        diff = [i for i, a in enumerate(dev_args) if _differentiable(a)] if backward else []
        for i in diff:
            dev_args[i].requires_grad_(True)
        got = _as_tuple(kernel(*dev_args, **dev_kwargs))
        cotangents = None
        if diff:
            cotangents = tuple(torch.randn(o.shape, generator=generator, dtype=torch.float32).to(o.dtype)
                               for o in got)
        want, want_grads = reference_outputs(kernel, args, kwargs, cotangents)
        label = f"{kernel.name} sample {n}"
        for k, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(g.detach().cpu(), w, atol=atol, rtol=rtol, msg=lambda m: f"{label} output {k}: {m}")
        if diff:
            outs = [o for o in got if o.requires_grad]
            cts = [c.to(device) for o, c in zip(got, cotangents) if o.requires_grad]
            grads = torch.autograd.grad(outs, [dev_args[i] for i in diff], cts, allow_unused=True)
            for i, g in zip(diff, grads):
                w = want_grads[i]
                g = torch.zeros_like(w) if g is None else g.detach().cpu()
                torch.testing.assert_close(g, w, atol=atol, rtol=rtol,
                                           msg=lambda m: f"{label} gradient of argument {i}: {m}")
        if opcheck:
            _opcheck(kernel, dev_args, dev_kwargs, backward)
            _opcheck(kernel, tuple(_to(a, "cpu") for a in args), {k: _to(v, "cpu") for k, v in kwargs.items()}, backward)


# opcheck's autograd-registration test only knows CPU/CUDA/XPU tensors; it checks a
# device-independent registration (the Autograd alias key), so it runs on the CPU sample.
_PJRT_OPCHECKS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def _opcheck(kernel: Kernel, args: tuple, kwargs: dict, backward: bool) -> None:
    args = tuple(a.detach().requires_grad_(_differentiable(a) and backward) if isinstance(a, torch.Tensor) else a
                 for a in args)
    on_cpu = all(a.device.type == "cpu" for a in args if isinstance(a, torch.Tensor))
    tests = ("test_autograd_registration",) if on_cpu else _PJRT_OPCHECKS
    torch.library.opcheck(kernel.op, args, kwargs, test_utils=tests)
