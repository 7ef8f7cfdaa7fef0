"""Ops over tensors that grow along one axis: what a growing op's lowering receives.

A KV cache grows by one token per step (`torch.cat([cache, new], dim=-2)`); at exact sizes
every op that touches it compiles once per length. Eager keeps such a tensor's storage
padded (runtime/storage.py `Padded`: a longer physical array and the real length), and the
ops whose entry has a `grows` rule run over the padded array with the length traced, so
they compile once per capacity (a power of two). The rule, beside the lowering, says which
operands may arrive padded and how long the output is; the lowering handles a
`PaddedOperand` in those places. Every other op reads the exact value.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class Growth:
    """One call of a growing op, as its entry's `grows` rule sees it on the host."""

    operands: tuple  # (argument position, list position or None) of the operands that may arrive padded
    axis: int  # their growing axis
    length: int | None  # the output's length along `axis` when the output grows too; None: exact output


@jax.tree_util.register_pytree_node_class
class PaddedOperand:
    """A padded storage as a lowering receives it: the physical array (its length along
    `axis` is the capacity; elements from `length` on are junk) and the real length, a
    traced int64 scalar."""

    __slots__ = ("array", "axis", "length")

    def __init__(self, array, axis: int, length):
        self.array, self.axis, self.length = array, axis, length

    @property
    def shape(self) -> tuple:
        return tuple(self.array.shape)

    @property
    def ndim(self) -> int:
        return self.array.ndim

    @property
    def dtype(self):
        return self.array.dtype

    def valid(self) -> jax.Array:
        """Bool mask along `axis` of the real elements (shape: the capacity)."""
        return jnp.arange(self.array.shape[self.axis]) < self.length

    def tree_flatten(self):
        return (self.array, self.length), self.axis

    @classmethod
    def tree_unflatten(cls, axis, children):
        return cls(children[0], axis, children[1])
