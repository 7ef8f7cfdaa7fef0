"""Compare an aten op on pjrt with the same op on CPU torch (the reference).

`check(op, *args, **kwargs)` runs `op` on CPU tensors, then on pjrt copies of them, and
compares every output (and every argument the op writes) with torch.testing.assert_close.
Before the device runtime is importable it runs the op's lowering from the table inside
jax.jit instead, so lowerings can be tested while the runtime is being built.
"""
from __future__ import annotations

import contextlib

import jax
import numpy as np
import torch
from torch.utils._pytree import tree_map

jax.config.update("jax_enable_x64", True)

import torch_pjrt.ops  # noqa: E402,F401  (registers every lowering)
from torch_pjrt.dtypes import to_torch  # noqa: E402
from torch_pjrt.ops.call import OpCall  # noqa: E402
from torch_pjrt.ops.registry import LOWERINGS  # noqa: E402
from torch_pjrt.ops.signature import Signature  # noqa: E402


def device_available() -> bool:
    try:
        torch.empty(1, device="pjrt")
        return True
    except Exception:
        return False


def _to_jax(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().resolve_conj().resolve_neg().contiguous()
        if x.dtype == torch.bfloat16:
            return jax.numpy.asarray(x.view(torch.int16).numpy().view(jax.numpy.bfloat16))
        return jax.numpy.asarray(x.numpy())
    return x


def _to_torch(x):
    if isinstance(x, jax.Array):
        a = np.asarray(x)
        dt = to_torch(a.dtype)
        if dt == torch.bfloat16:
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())
    return x


def make(shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    """A reproducible CPU test input of any dtype (small integers, normal floats, random bools)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-9, 10, shape, generator=g, dtype=dtype)


def run_lowering(op, *args, **kwargs):
    """The op's lowering on CPU tensors, through jax.jit as eager runs it."""
    args, kwargs = tree_map(_to_jax, (args, kwargs))
    return tree_map(_to_torch, OpCall.of(LOWERINGS[op]).run(args, kwargs))


def run_pjrt(op, *args, **kwargs):
    moved = tree_map(lambda x: x.to("pjrt") if isinstance(x, torch.Tensor) else x, (args, kwargs))
    out = op(*moved[0], **moved[1])
    return tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, out), moved


def check(op, *args, atol=None, rtol=None, equal_nan=True, **kwargs):
    """Assert that `op` gives the CPU result on pjrt (values, dtypes, shapes)."""
    cpu_args = tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, (args, kwargs))
    expected = op(*cpu_args[0], **cpu_args[1])
    if device_available():
        actual, moved = run_pjrt(op, *args, **kwargs)
        # arguments the op writes must match too
        for i in Signature.of(op).written:
            flat_m = moved[0][i] if i < len(moved[0]) else None
            flat_c = cpu_args[0][i] if i < len(cpu_args[0]) else None
            if isinstance(flat_m, torch.Tensor):
                torch.testing.assert_close(flat_m.cpu(), flat_c, atol=atol, rtol=rtol, equal_nan=equal_nan)
    else:
        actual = run_lowering(op, *args, **kwargs)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=equal_nan)
    return actual


def raised(call, device: str):
    """The exception call(device) raises, by the next host sync included (queued index
    checks raise there); None if it raises none."""
    try:
        call(device)
        if device == "pjrt":
            torch.pjrt.synchronize()
    except Exception as e:  # noqa: BLE001
        return e
    return None


def assert_raises_like_cpu(call, name: str = "") -> None:
    """call("cpu") raises; call("pjrt") raises the same exception type with the same first line,
    and never a JAX or numpy exception."""
    expected = raised(call, "cpu")
    assert expected is not None, f"{name}: CPU accepts this call; the test is wrong"
    actual = raised(call, "pjrt")
    assert actual is not None, f"{name}: pjrt raised nothing; CPU raises {type(expected).__name__}: {expected}"
    assert type(actual).__module__.split(".")[0] not in ("jax", "jaxlib", "numpy"), repr(actual)
    assert type(actual) is type(expected), f"{name}: pjrt {type(actual).__name__}: {actual}; CPU {expected!r}"
    assert str(actual).splitlines()[0] == str(expected).splitlines()[0]


@contextlib.contextmanager
def in_eager_mode(mode: str):
    """The body in eager `mode` ("fused" or "op"), the mode before restored after."""
    import torch_pjrt

    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode(mode)
    try:
        yield
    finally:
        torch_pjrt.set_eager_mode(before)


@contextlib.contextmanager
def no_fallback():
    """Fails if anything inside ran an aten op on the CPU fallback."""
    import torch_pjrt

    before = dict(torch_pjrt.fallback_ops())
    yield
    after = torch_pjrt.fallback_ops()
    ran = {op: n - before.get(op, 0) for op, n in after.items() if n != before.get(op, 0)}
    assert ran == {}, f"ran on the CPU fallback: {ran}"


def first_difference(cpu: list, pjrt: list, random: bool, half_tolerance: float) -> str | None:
    """How the first of `pjrt`'s tensors differs from its twin in `cpu` (count, dtype, shape, values),
    or None. Integer and bool tensors compare exactly (a float result cast into an integer tensor
    before or after the computation differs by whole units); float16 at `half_tolerance`, other
    floats at 1e-4; `random`: dtypes and shapes only."""
    if len(cpu) != len(pjrt):
        return f"{len(pjrt)} results, CPU's {len(cpu)}"
    for e, g in zip(cpu, pjrt):
        if e.shape != g.shape or e.dtype != g.dtype:
            return f"{g.dtype}{list(g.shape)}, CPU's {e.dtype}{list(e.shape)}"
        if random:
            continue
        exact = not e.is_floating_point() and not e.is_complex()
        tolerance = 0 if exact else half_tolerance if e.dtype == torch.float16 else 1e-4
        try:
            torch.testing.assert_close(g, e, equal_nan=True, rtol=tolerance, atol=tolerance)
        except AssertionError as error:
            return f"values: {str(error).splitlines()[-1]}"
    return None
