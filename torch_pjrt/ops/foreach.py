"""Lowerings: foreach family (`_foreach_*`), each one executable for a whole list.

A foreach op is its elementwise op mapped over the lists, exactly as torch's reference
("slow") path defines it: `_foreach_add.Scalar(xs, s)[i] == add(xs[i], s)`, so dtypes, NaN
behaviour and errors come from the elementwise lowerings. The variants differ only in how
the second argument is spread over the list:
  List       one tensor per element            (self[i], other[i])
  Scalar     one traced Scalar for all         (self[i], scalar)
  ScalarList one Scalar per element            (self[i], scalars[i])
  Tensor     one tensor for all (0-d or 1-d)   (self[i], other) or (self[i], scalars[i])
Scalar[] arguments arrive as lists of traced weak scalars (signature.py's SCALAR_LIST), so
new per-parameter step sizes do not recompile; where the elementwise entry's Scalar is static
(pow's exponent), the foreach entry's Scalar and Scalar[] are static too (`_as_elementwise`).
"""
from __future__ import annotations
import jax.numpy as jnp
import numpy as np
import torch
from ..dtypes import to_jax, to_torch
from . import elementwise as ew
from .promotion import cast, promote
from .registry import LOWERINGS, family

lowering = family(not_paddable="tensor lists of a fused optimizer step hold parameters, whose shapes are never symbolic")


aten = torch.ops.aten


def _same_length(name, *lists):
    n = len(lists[0])
    for other in lists[1:]:
        if len(other) != n:
            raise RuntimeError(f"{name}: Tensor lists must have the same number of tensors, got {n} and {len(other)}.")


def _named(fn, name):
    fn.__name__ = fn.__qualname__ = name
    return fn


def unary(op_name, fn):
    """_foreach_<op>(Tensor[] self)."""

    def lowering_fn(self):
        return [fn(x) for x in self]

    return lowering(getattr(aten, f"_foreach_{op_name}").default)(_named(lowering_fn, f"_foreach_{op_name}"))


def _as_elementwise(fn, op, position: int, trait: str) -> tuple:
    """The foreach `op`'s Scalar (or Scalar[]) at `position`, where the elementwise entry whose
    lowering is `fn` names the Scalar at the same position in its `trait`: `scalar_fits`, checked
    alike against each tensor's dtype (clamp_min's min, pow's exponent; not add's other), or
    `static` (pow's exponent: its lowering picks torch's formula, and refuses an integer tensor to
    a negative integer power, from the value)."""
    named = any(entry.fn is fn and entry.op._schema.arguments[position].name in getattr(entry, trait)
                for entry in LOWERINGS.values())
    return (op._schema.arguments[position].name,) if named else ()


def binary(op_name, fn, scalar_fn=None):
    """_foreach_<op>.List/.Scalar/.ScalarList/.Tensor: fn(self[i], other) with the second
    operand spread per variant; scalar_fn (default fn) serves the Scalar-valued variants."""
    packet = getattr(aten, f"_foreach_{op_name}")
    scalar_fn = scalar_fn or fn
    overloads = set(packet.overloads())
    out = {}

    if "List" in overloads:
        def foreach_list(self, other, **kw):
            _same_length(f"_foreach_{op_name}", self, other)
            return [fn(x, y, **kw) for x, y in zip(self, other)]

        out["List"] = lowering(packet.List)(_named(foreach_list, f"_foreach_{op_name}_List"))
    if "Scalar" in overloads:
        def foreach_scalar(self, scalar):
            return [scalar_fn(x, scalar) for x in self]

        out["Scalar"] = lowering(packet.Scalar, scalar_fits=_as_elementwise(scalar_fn, packet.Scalar, 1, "scalar_fits"),
                                 static=_as_elementwise(scalar_fn, packet.Scalar, 1, "static"))(
            _named(foreach_scalar, f"_foreach_{op_name}_Scalar"))
    if "ScalarList" in overloads:
        def foreach_scalar_list(self, scalars):
            _same_length(f"_foreach_{op_name}", self, scalars)
            return [scalar_fn(x, s) for x, s in zip(self, scalars)]

        out["ScalarList"] = lowering(packet.ScalarList,
                                     static=_as_elementwise(scalar_fn, packet.ScalarList, 1, "static"))(
            _named(foreach_scalar_list, f"_foreach_{op_name}_ScalarList"))
    if "Tensor" in overloads:
        def foreach_tensor(self, other, **kw):
            return [fn(x, other, **kw) for x in self]

        out["Tensor"] = lowering(packet.Tensor)(_named(foreach_tensor, f"_foreach_{op_name}_Tensor"))
    return out


# ---------------------------------------------------------------------------------------
# unary

for _name in ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
              "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign",
              "sin", "sinh", "sqrt", "tan", "tanh", "trunc"):
    unary(_name, getattr(ew, _name))


# ---------------------------------------------------------------------------------------
# binary

binary("add", ew.add)
binary("sub", ew.sub)
binary("mul", ew.mul)
binary("div", ew.div)
binary("clamp_min", ew.clamp_min_Tensor, ew.clamp_min)
binary("clamp_max", ew.clamp_max_Tensor, ew.clamp_max)
# torch's reference path: maximum/minimum by a Scalar are clamp_min/clamp_max
binary("maximum", ew.maximum, ew.clamp_min)
binary("minimum", ew.minimum, ew.clamp_max)
binary("pow", ew.pow, ew.pow_Tensor_Scalar)


@lowering(aten._foreach_pow.ScalarAndTensor)
def _foreach_pow_ScalarAndTensor(self, exponent):
    return [ew.pow_Scalar(self, e) for e in exponent]


# ---------------------------------------------------------------------------------------
# ternary: lerp, addcmul, addcdiv


@lowering(aten._foreach_lerp.List)
def _foreach_lerp_List(self, tensors1, weights):
    _same_length("_foreach_lerp", self, tensors1, weights)
    return [ew.lerp(x, y, w) for x, y, w in zip(self, tensors1, weights)]


@lowering(aten._foreach_lerp.Scalar,
          scalar_fits=_as_elementwise(ew.lerp_Scalar, aten._foreach_lerp.Scalar, 2, "scalar_fits"))
def _foreach_lerp_Scalar(self, tensors1, weight):
    _same_length("_foreach_lerp", self, tensors1)
    return [ew.lerp_Scalar(x, y, weight) for x, y in zip(self, tensors1)]


@lowering(aten._foreach_lerp.ScalarList)
def _foreach_lerp_ScalarList(self, tensors1, weight):
    _same_length("_foreach_lerp", self, tensors1, weight)
    return [ew.lerp_Scalar(x, y, w) for x, y, w in zip(self, tensors1, weight)]


def _pointwise_ternary(op_name, fn):
    """_foreach_addcmul / _foreach_addcdiv: .Scalar (one value), .ScalarList (one per
    element) and .Tensor (a 1-d tensor of values, read as one Scalar per element)."""
    packet = getattr(aten, f"_foreach_{op_name}")
    name = f"_foreach_{op_name}"

    def foreach_scalar(self, tensor1, tensor2, value=1):
        _same_length(name, self, tensor1, tensor2)
        return [fn(s, a, b, value=value) for s, a, b in zip(self, tensor1, tensor2)]

    def foreach_scalar_list(self, tensor1, tensor2, scalars):
        _same_length(name, self, tensor1, tensor2, scalars)
        return [fn(s, a, b, value=v) for s, a, b, v in zip(self, tensor1, tensor2, scalars)]

    def foreach_tensor(self, tensor1, tensor2, scalars):
        if scalars.ndim != 1 or scalars.shape[0] != len(self):
            raise RuntimeError(
                f"Expected scalars to be a 1-D tensor with {len(self)} elements, got shape {tuple(scalars.shape)}")
        _same_length(name, self, tensor1, tensor2)
        return [fn(s, a, b, value=scalars[i]) for i, (s, a, b) in enumerate(zip(self, tensor1, tensor2))]

    lowering(packet.Scalar, scalar_fits=_as_elementwise(fn, packet.Scalar, 3, "scalar_fits"))(
        _named(foreach_scalar, f"{name}_Scalar"))
    lowering(packet.ScalarList)(_named(foreach_scalar_list, f"{name}_ScalarList"))
    lowering(packet.Tensor)(_named(foreach_tensor, f"{name}_Tensor"))


_pointwise_ternary("addcmul", ew.addcmul)
_pointwise_ternary("addcdiv", ew.addcdiv)


# ---------------------------------------------------------------------------------------
# reductions over each tensor: norm, powsum, max


def _norm_input(name, x, dtype):
    if ew.category(x.dtype) not in "fc":
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {to_torch(x.dtype)}")
    if dtype is not None:
        x = cast(x, to_jax(dtype) if isinstance(dtype, torch.dtype) else np.dtype(dtype))
    result = np.dtype(jnp.finfo(x.dtype).dtype)  # complex -> its real dtype
    compute = promote(jnp.zeros((), result))[0]  # float32 for float16/bfloat16
    return jnp.abs(x).astype(compute), result


def _vector_norm(x, ord, dtype):
    a, result = _norm_input("_foreach_norm", x, dtype)
    if ord == float("inf"):
        out = jnp.max(a)
    elif ord == float("-inf"):
        out = jnp.min(a)
    elif ord == 0:
        out = jnp.sum(a != 0).astype(a.dtype)
    elif ord == 1:
        out = jnp.sum(a)
    elif ord == 2:
        out = jnp.sqrt(jnp.sum(a * a))
    else:
        out = jnp.sum(a ** ord) ** (1.0 / ord)
    return out.astype(result)


@lowering(aten._foreach_norm.Scalar, static=("ord",), scalar_fits="ord")
def _foreach_norm_Scalar(self, ord=2, dtype=None):
    return [_vector_norm(x, ord, dtype) for x in self]


@lowering(aten._foreach_powsum.Scalar, static=("ord",), scalar_fits="ord")
def _foreach_powsum_Scalar(self, ord=2, dtype=None):
    # sum(|x| ** ord), the norm before its root (0 ** 0 == 1, so ord 0 counts every element)
    out = []
    for x in self:
        a, result = _norm_input("_foreach_powsum", x, dtype)
        out.append(jnp.sum(a * a if ord == 2 else a ** ord).astype(result))
    return out


@lowering(aten._foreach_max.default)
def _foreach_max(self):
    for x in self:
        if x.size == 0:
            raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() == 0. "
                               "Specify the reduction dim with the 'dim' argument.")
    return [jnp.max(x) for x in self]


# ---------------------------------------------------------------------------------------
# copies


if hasattr(aten, "_foreach_clone"):  # new in torch 2.12
    @lowering(aten._foreach_clone.default)
    def _foreach_clone(self, *, memory_format=None):
        return [jnp.array(x, copy=True) for x in self]


@lowering(aten._foreach_copy.default)
def _foreach_copy(self, src, non_blocking=False):
    _same_length("_foreach_copy", self, src)
    return [jnp.broadcast_to(cast(s, x.dtype), x.shape) for x, s in zip(self, src)]


@lowering(aten._foreach_zero.default)
def _foreach_zero(self):
    return [jnp.zeros(x.shape, x.dtype) for x in self]


if hasattr(aten, "_foreach_mm"):  # new in torch 2.12
    @lowering(aten._foreach_mm.default)
    def _foreach_mm(self, mat2):
        _same_length("_foreach_mm", self, mat2)
        mm = LOWERINGS.get(aten.mm.default)  # the nn family's matmul, looked up when traced
        if mm is not None:
            return [mm.fn(a, b) for a, b in zip(self, mat2)]
        return [jnp.matmul(a, b, precision="highest") for a, b in zip(self, mat2)]
