"""How an aten overload's arguments map onto a lowering call.

`Signature.of(op)` reads the schema once: which arguments are tensors, which are
Scalars (traced, weakly typed), which are static, and which are written (in-place and
out= overloads). `bind` normalises a dispatcher call (args, kwargs) into the full
argument list in schema order with defaults filled in.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass

import torch

TENSOR, TENSOR_LIST, SCALAR, SCALAR_LIST, STATIC = "tensor", "tensor_list", "scalar", "scalar_list", "static"


def _kind(t) -> str:
    s = str(t)
    if s in ("Tensor", "Optional[Tensor]"):
        return TENSOR
    if s in ("List[Tensor]", "List[Optional[Tensor]]"):
        return TENSOR_LIST
    if s in ("number", "Optional[number]"):
        return SCALAR
    if s == "List[number]":  # e.g. per-parameter step sizes of foreach optimizers: traced too
        return SCALAR_LIST
    return STATIC


@dataclass(frozen=True)
class Signature:
    names: tuple  # every argument, schema order
    kinds: tuple  # TENSOR / TENSOR_LIST / SCALAR / SCALAR_LIST / STATIC per argument
    kwarg_only: tuple  # bool per argument
    defaults: tuple  # default per argument (a sentinel where required)
    written: tuple  # indices of arguments the op writes (self for op_, out args for .out)
    returned_arguments: tuple  # per return: the index of the written argument it is (op_, out=), else None
    required: int  # arguments up to the last one without a default

    @staticmethod
    @functools.lru_cache(None)
    def of(op: torch._ops.OpOverload) -> "Signature":
        args = op._schema.arguments
        return Signature(
            names=tuple(a.name for a in args),
            kinds=tuple(_kind(a.type) for a in args),
            kwarg_only=tuple(a.kwarg_only for a in args),
            defaults=tuple(_default(a) for a in args),
            written=tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write),
            returned_arguments=_returned_arguments(op._schema),
            required=max((i + 1 for i, a in enumerate(args) if not a.has_default_value()), default=0),
        )

    def bind(self, args: tuple, kwargs: dict) -> list:
        """All argument values in schema order (defaults filled in)."""
        if not kwargs and len(args) >= self.required:  # the dispatcher's usual call: trailing defaults omitted
            return [*args, *self.defaults[len(args):]]
        values = list(args) + [_REQUIRED] * (len(self.names) - len(args))
        for i in range(len(args), len(self.names)):
            v = kwargs.get(self.names[i], self.defaults[i])
            if v is _REQUIRED:
                raise TypeError(f"missing required argument '{self.names[i]}'")
            values[i] = v
        return values

    def split(self, values: list) -> tuple[list, dict]:
        """Schema-ordered values -> (positional, keyword) as a lowering is called."""
        pos = [v for v, k in zip(values, self.kwarg_only) if not k]
        kw = {n: v for n, v, k in zip(self.names, values, self.kwarg_only) if k}
        return pos, kw


def _returned_arguments(schema) -> tuple:
    """Per return, the index of the written argument it aliases (alias set "a!"), else None."""
    written = {next(iter(a.alias_info.before_set), None): i for i, a in enumerate(schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write}
    return tuple(written.get(next(iter(r.alias_info.before_set), None))
                 if r.alias_info is not None and r.alias_info.is_write else None for r in schema.returns)


# Schema defaults of ScalarType arguments arrive as c10::ScalarType enum values.
_SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
                 6: torch.float32, 7: torch.float64, 9: torch.complex64, 10: torch.complex128, 11: torch.bool,
                 15: torch.bfloat16}


def _default(arg):
    if not arg.has_default_value():
        return _REQUIRED
    value = arg.default_value
    if isinstance(value, int) and "ScalarType" in str(arg.real_type):
        return _SCALAR_TYPES[value]
    return value


class _Required:
    def __repr__(self):
        return "<required>"


_REQUIRED = _Required()
