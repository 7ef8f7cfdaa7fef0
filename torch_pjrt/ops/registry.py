"""The op table: one registry of lowerings, aten overload -> JAX function.

A lowering is a pure function named after its op. It receives the op's arguments
exactly as the aten schema orders and names them, with:
  * Tensor / Tensor? / Tensor[] arguments as jax arrays (None where absent);
  * Scalar arguments as traced, weakly typed JAX scalars (so a new value does not
    recompile), unless the lowering lists them in `static=`; never branch on them in
    Python, use jnp.where;
  * every other argument (int, int[], float, bool, str, dtype, ...) as a plain Python
    value, static for the executable.
Random ops take their randomness from a `generator` argument that arrives as a traced
64-bit seed drawn from the torch generator (ops.random.key turns it into a JAX key).
It returns a jax array, or a tuple of them for multi-output ops, with exactly the dtype
and shape PyTorch gives (use `ops.promotion` for dtypes). In-place (`op_`) and `out=`
overloads are derived from the functional lowering; do not register them. Where an op
writes its arguments and has no functional form (random `op_`s, batch norm's running
statistics), register the lowering on that op: it returns the written arguments' new
values in schema order (just the array when only `self` is written), then the op's other
outputs.

The table has consumers (eager kernels, the torch.compile interpreter, custom kernels)
and knows nothing of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

OpOverload = torch._ops.OpOverload


@dataclass(frozen=True)
class Lowering:
    op: OpOverload
    fn: Callable
    static: frozenset  # names of Scalar arguments that must be concrete (shape-determining)
    jit: bool  # False: data-dependent output shape, runs op-by-op on concrete arrays
    random: bool  # True: receives `generator=` as a traced 64-bit seed even if the schema has none
    traced: frozenset  # names of non-Scalar number arguments to trace anyway (a fused optimizer's lr)


LOWERINGS: dict[OpOverload, Lowering] = {}


def lowering(*ops: OpOverload, static: Iterable[str] = (), jit: bool = True, random: bool = False,
             traced: Iterable[str] = ()) -> Callable:
    """Register `fn` as the lowering of each overload in `ops`."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if not isinstance(op, OpOverload):
                raise TypeError(f"lowering({op}): pass an overload such as aten.add.Tensor, not a packet")
            known = LOWERINGS.get(op)
            # The same function again is its module imported again after an import failed part
            # way; that failure, not this, is the error to show.
            if known is not None and (known.fn.__module__, known.fn.__qualname__) != (fn.__module__, fn.__qualname__):
                raise ValueError(f"{op} already has a lowering ({known.fn.__module__}.{known.fn.__qualname__})")
            LOWERINGS[op] = Lowering(op, fn, frozenset(static), jit, random, frozenset(traced))
        return fn

    return register
