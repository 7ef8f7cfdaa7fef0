"""One cached XLA executable per (op, static arguments); JAX's jit keys shapes and dtypes.

`executable(lowering)` wraps a lowering in `jax.jit` with the op's static arguments
marked static, so the whole per-call cache lookup happens in JAX's C++ dispatch.
Call it with `prepare(sig, values)`: lists in static positions become tuples.
"""
from __future__ import annotations

import functools

import jax

from .registry import Lowering
from .signature import SCALAR, STATIC, Signature


def static_positions(lowering: Lowering, sig: Signature) -> tuple:
    return tuple(
        i for i, (name, kind) in enumerate(zip(sig.names, sig.kinds))
        if (kind == STATIC and name != "generator" and name not in lowering.traced)
        or (kind == SCALAR and name in lowering.static)
    )


def resolve_views(values) -> list:
    """Tensor operands may arrive as storage views (storage.StridedView): read them here,
    inside the executable, so a view costs no executable of its own."""
    out = []
    for v in values:
        if hasattr(v, "resolve"):
            v = v.resolve()
        elif type(v) is list:
            v = [x.resolve() if hasattr(x, "resolve") else x for x in v]
        out.append(v)
    return out


def call_lowering(lowering: Lowering, sig: Signature, *values):
    values = resolve_views(values)
    pos, kw = sig.split(list(values[: len(sig.names)]))
    if len(values) > len(sig.names):  # the seed of a random op whose schema has no generator
        kw["generator"] = values[-1]
    return lowering.fn(*pos, **kw)


@functools.lru_cache(None)
def executable(lowering: Lowering, traced=None):
    """The jitted (or, for data-dependent ops, plain) callable taking schema-ordered values.
    `traced(lowering, sig, *values)`, if given, is what the executable traces instead of
    `call_lowering` (a consumer's checks and output layouts around it)."""
    sig = Signature.of(lowering.op)
    fn = functools.partial(call_lowering, lowering, sig)
    if not lowering.jit:
        return fn
    if traced is not None:
        fn = functools.partial(traced, lowering, sig)
    return jax.jit(fn, static_argnums=static_positions(lowering, sig))


def hashable(v):
    if isinstance(v, list):
        return tuple(hashable(x) for x in v)
    return v


def prepare(lowering: Lowering, sig: Signature, values: list) -> list:
    """Make static values hashable (lists -> tuples); dynamic values pass through."""
    for i in static_positions(lowering, sig):
        if isinstance(values[i], list):
            values[i] = hashable(values[i])
    return values
