"""Lowerings: elementwise family (arithmetic, comparisons, bitwise, unary math, activations).

Every lowering follows TensorIterator's recipe through `pointwise`:
  1. torch's promotion (ops.promotion) gives the common, computation and result dtypes;
  2. operands are cast to the common dtype first, then to the computation dtype
     (float32 for float16/bfloat16), so a Scalar is rounded the way torch rounds a
     wrapped number: `bf16_tensor > 0.1` compares with bfloat16(0.1), as on CPU;
  3. the math runs in the computation dtype and is cast to the result dtype.
Dtypes torch rejects are rejected at trace time with torch's kind of error, naming the op.
The math of each op follows torch's CPU kernels (sign(nan) == 0, digamma(0) == -inf,
floor division of floats as c10::div_floor_floating, shifts past the bit width, ...).

Known differences (data-dependent errors cannot be raised inside an executable):
integer division or remainder by zero returns a value instead of raising
ZeroDivisionError, and an integer tensor to a negative integer Scalar power returns
torch's tensor-exponent result (0, 1 or -1) instead of raising.
"""
from __future__ import annotations

import operator

import math as _m

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import torch
from jax import lax

from ..dtypes import to_torch
from .promotion import KIND, cast, promote
from .registry import lowering
from .signature import TENSOR, Signature

aten = torch.ops.aten

DEFAULT = KIND.DEFAULT
INT_TO_FLOAT = KIND.INT_TO_FLOAT
ALWAYS_BOOL = KIND.ALWAYS_BOOL
COMPLEX_TO_FLOAT = KIND.COMPLEX_TO_FLOAT
BOOL_TO_LONG = KIND.BOOL_TO_LONG

# Dtype categories, as strings of these letters: b(ool), u(nsigned), i(nt), f(loat), c(omplex).
ALL = "buifc"


# ---------------------------------------------------------------------------------------
# helpers


def category(dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "b"
    if jnp.issubdtype(dtype, jnp.unsignedinteger):
        return "u"
    if jnp.issubdtype(dtype, jnp.integer):
        return "i"
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return "c"
    return "f"


def dtype_of(x) -> np.dtype:
    """The dtype of an operand; a Python number counts as its JAX (x64) dtype."""
    return np.dtype(jnp.result_type(x)) if isinstance(x, (bool, int, float, complex)) else np.dtype(x.dtype)


def check_dtype(name: str, dtype, allowed: str, half: bool = True):
    """Raise torch's error when `dtype` is not in `allowed` (or is a 16-bit float and not `half`)."""
    if category(dtype) not in allowed or (not half and category(dtype) == "f" and np.dtype(dtype).itemsize == 2):
        raise NotImplementedError(f'"{name}" not implemented for \'{to_torch(dtype)}\'')


def dtypes(*operands, kind=DEFAULT):
    """(common, computation, result) dtypes of an elementwise op, as TensorIterator sees them."""
    compute, result = promote(*operands, kind=kind)
    if kind in (ALWAYS_BOOL, COMPLEX_TO_FLOAT):
        common = promote(*operands, kind=DEFAULT)[1]
    else:
        common = result
    return common, compute, result


def pointwise(math, *operands, kind=DEFAULT, name=None, allowed=ALL, scalars=(), half=True, opmath_other=False):
    """Promote `operands` (None passes through), run `math(*operands, *scalars)` in the
    computation dtype, cast to the result dtype. `scalars` take no part in promotion
    (alpha, value, thresholds) and are cast to the computation dtype, like torch's opmath.
    opmath_other: a 0-d last operand goes to the computation dtype without first rounding to
    the common dtype (CPU's mul and div read a scalar `other` at full precision for float16
    and bfloat16: x_half * 0.1 multiplies by 0.1f, not by half(0.1)).
    """
    common, compute, result = dtypes(*operands, kind=kind)
    if name is not None:
        check_dtype(name, common, allowed, half)
    xs = [None if x is None else _to_compute(x, common, compute) for x in operands]
    if opmath_other and jnp.ndim(operands[-1]) == 0 and np.dtype(common) in _REDUCED_FLOATS:
        xs[-1] = cast(operands[-1], compute)
    present = [i for i, x in enumerate(xs) if x is not None]
    for i, x in zip(present, jnp.broadcast_arrays(*(xs[i] for i in present))):  # lax ops need equal shapes
        xs[i] = x
    ss = [None if s is None else cast(s, compute) for s in scalars]
    return cast(math(*xs, *ss), result)


_REDUCED_FLOATS = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def _to_compute(x, common, compute):
    return cast(cast(x, common), compute)


def define(name, math, *, kind=DEFAULT, allowed=ALL, ops=None, half=True):
    """Register `math` as the lowering of `ops` (default aten.<name>.default); returns the
    lowering, a function named after the op taking the op's tensor/Scalar operands.
    `allowed`: the dtype categories torch has kernels for; half=False: none for float16/bfloat16."""

    def fn(*operands):
        return pointwise(math, *operands, kind=kind, name=name, allowed=allowed, half=half)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"aten.{name}: elementwise, {kind.name} promotion."
    lowering(*(ops if ops is not None else (getattr(aten, name).default,)))(fn)
    return fn


def _zero(x):
    return jnp.zeros((), x.dtype)


def _bits(dtype) -> int:
    return np.dtype(dtype).itemsize * 8


def _is_float(x) -> bool:
    return category(x.dtype) in "fc"


def _check_alpha(common, alpha):
    """torch's alpha_check: a bool alpha only for bool results, no float alpha for integral ones."""
    c, a = category(common), category(dtype_of(alpha))
    if a == "b" and c != "b":
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if c in "bui" and a in "fc":
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")


# ---------------------------------------------------------------------------------------
# binary arithmetic


def _scaled(b, alpha, common):
    """alpha * b as torch's CPU kernels round it: in the tensor dtype for 16-bit floats."""
    prod = b * alpha
    if category(common) == "f" and np.dtype(common).itemsize == 2:
        prod = cast(cast(prod, common), prod.dtype)
    return prod


@lowering(aten.add.Tensor, aten.add.Scalar)
def add(self, other, alpha=1):
    common = dtypes(self, other)[0]
    _check_alpha(common, alpha)

    def math(a, b, alpha):
        if a.dtype == np.bool_:
            return a | (b & alpha)
        return a + _scaled(b, alpha, common)

    return pointwise(math, self, other, scalars=(alpha,))


def _no_bool_subtraction(*operands):
    if np.dtype(np.bool_) in [dtype_of(x) for x in operands]:
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. "
            "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(self, other, alpha=1):
    common = dtypes(self, other)[0]
    _no_bool_subtraction(self, other)
    _check_alpha(common, alpha)
    return pointwise(lambda a, b, alpha: a - _scaled(b, alpha, common), self, other, scalars=(alpha,))


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self, other, alpha=1):
    common = dtypes(self, other)[0]
    _no_bool_subtraction(self, other)
    _check_alpha(common, alpha)
    return pointwise(lambda a, b, alpha: b - _scaled(a, alpha, common), self, other, scalars=(alpha,))


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def mul(self, other):
    return pointwise(lambda a, b: a & b if a.dtype == np.bool_ else a * b, self, other, opmath_other=True)


def _div_trunc(a, b):
    if _is_float(a):
        return jnp.trunc(a / b)
    return lax.div(a, b)  # C division truncates


def _div_floor(a, b):
    if not _is_float(a):
        q, r = lax.div(a, b), lax.rem(a, b)
        return jnp.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)
    # c10::div_floor_floating: Python's algorithm, exact where floor(a / b) is not
    mod = lax.rem(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(_zero(a), a / b), floordiv)
    return jnp.where(b == 0, a / b, floordiv)


def _true_divide_by_broadcast(a, b):
    """a / b for a divisor broadcast from a smaller shape (a Python scalar, a 0-d tensor, a row):
    XLA's algebraic simplifier rewrites a / broadcast(b) into a * broadcast(1 / b), which is 1 ulp
    off in most elements. CPU torch divides (so does IEEE); the barrier keeps the divisor an
    operand of a true division, at the cost of materializing it."""
    return a / lax.optimization_barrier(b)


@lowering(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        broadcast = jnp.shape(other) != jnp.broadcast_shapes(jnp.shape(self), jnp.shape(other))
        math = _true_divide_by_broadcast if broadcast else operator.truediv
        return pointwise(math, self, other, kind=INT_TO_FLOAT, opmath_other=True)
    if rounding_mode == "trunc":
        return pointwise(_div_trunc, self, other, name="div_trunc", allowed="uif", opmath_other=True)
    if rounding_mode == "floor":
        return pointwise(_div_floor, self, other, name="div_floor", allowed="uif", opmath_other=True)
    raise ValueError(
        f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'"
    )


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(self, other):
    return pointwise(_div_floor, self, other, name="floor_divide", allowed="uif", opmath_other=True)


def _remainder(a, b):
    mod = lax.rem(a, b)  # C fmod, sign of a
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


remainder = define(
    "remainder", _remainder, allowed="uif",
    ops=(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor),
)
fmod = define("fmod", lax.rem, allowed="uif", ops=(aten.fmod.Tensor, aten.fmod.Scalar))


def _int_pow(base, exp):
    """torch's powi: square-and-multiply (wrapping like C), negative exponents -> 0/1/-1."""
    base, exp = jnp.broadcast_arrays(base, exp)
    one = jnp.ones((), base.dtype)

    def body(state):
        acc, b, e = state
        return jnp.where((e & 1) == 1, acc * b, acc), b * b, e >> 1

    e = jnp.where(exp < 0, jnp.zeros((), exp.dtype), exp)
    acc, _, _ = lax.while_loop(lambda s: jnp.any(s[2] > 0), body, (jnp.ones_like(base), base, e))
    negative = jnp.where(base == one, one, jnp.where(base == -one, jnp.where((exp & 1) == 0, one, -one), 0))
    return jnp.where(exp < 0, negative, acc)


def _pow(a, b):
    return lax.pow(a, b) if _is_float(a) else _int_pow(a, b)


def _is_scalar(x) -> bool:
    return isinstance(x, (bool, int, float, complex)) or bool(getattr(x, "weak_type", False))


@lowering(aten.pow.Tensor_Tensor)
def pow(self, exponent):
    return pointwise(_pow, self, exponent, name="pow", allowed="uifc")


def _pow_by_scalar(x, e, static_e):
    """torch's pow_tensor_scalar kernel: exponents 0.5, -0.5, -1 (and 2, 3, -2 for real
    floats) take dedicated paths, so pow(-0., .5) = -0. and pow(-inf, .5) = NaN as in sqrt."""
    special = [(0.5, jnp.sqrt), (-0.5, lax.rsqrt), (-1, lambda v: 1 / v)]
    if category(x.dtype) == "f":
        special += [(2, lambda v: v * v), (3, lambda v: v * v * v), (-2, lambda v: 1 / (v * v))]
    if static_e is not None:  # a constant exponent (compile path): choose while tracing
        for v, f in special:
            if static_e == v:
                return f(x)
        return lax.pow(x, jnp.broadcast_to(e, x.shape))
    index = sum(jnp.where(e == v, i + 1, 0) for i, (v, _) in enumerate(special))
    branches = [lambda x, e: lax.pow(x, jnp.broadcast_to(e, x.shape))] + [lambda x, e, f=f: f(x) for _, f in special]
    return lax.switch(index, branches, x, e)


@lowering(aten.pow.Tensor_Scalar)
def pow_Tensor_Scalar(self, exponent):
    common, compute, result = dtypes(self, exponent)
    x, e = _to_compute(self, common, compute), _to_compute(exponent, common, compute)
    if x.dtype == np.bool_:  # bool tensor ** bool Scalar stays bool
        return x | ~e
    if not _is_float(x):
        return cast(_int_pow(x, e), result)
    if np.dtype(common) == np.float16:  # torch's float16 kernel is plain std::pow
        return cast(lax.pow(x, jnp.broadcast_to(e, x.shape)), result)
    static_e = exponent if isinstance(exponent, (bool, int, float)) else None
    return cast(_pow_by_scalar(x, e, static_e), result)


@lowering(aten.pow.Scalar)
def pow_Scalar(self, exponent):
    out = pointwise(_pow, self, exponent, name="pow", allowed="uifc")
    return jnp.where(self == 1, jnp.ones((), out.dtype), out)  # torch: ones for base 1, even for NaN


atan2 = define("atan2", jnp.arctan2, kind=INT_TO_FLOAT, allowed="buif")
hypot = define("hypot", jnp.hypot, allowed="f")
maximum = define("maximum", jnp.maximum, allowed="buif")
minimum = define("minimum", jnp.minimum, allowed="buif")
fmax = define("fmax", jnp.fmax, allowed="buif")
fmin = define("fmin", jnp.fmin, allowed="buif")
copysign = define("copysign", jnp.copysign, kind=INT_TO_FLOAT, allowed="buif",
                  ops=(aten.copysign.Tensor, aten.copysign.Scalar))


def _nextafter(a, b):
    if a.dtype.itemsize >= 4:
        return lax.nextafter(a, b)
    # 16-bit floats (XLA computes them through float32): step the bit pattern
    bits = lax.bitcast_convert_type(a, np.uint16)
    step = jnp.where((b > a) == (a > 0), np.uint16(1), np.uint16(0xFFFF))  # +1 away from zero, -1 toward
    smallest = jnp.where(jnp.signbit(b), np.uint16(0x8001), np.uint16(1))  # from zero: +-smallest subnormal
    out = lax.bitcast_convert_type(jnp.where(a == 0, smallest, bits + step), a.dtype)
    out = jnp.where(a == b, b, out)
    return jnp.where(jnp.isnan(a) | jnp.isnan(b), a + b, out)


nextafter = define("nextafter", _nextafter, kind=KIND.NO_OPMATH, allowed="f")


def _xlogy(x, y):
    return jnp.where(jnp.isnan(y), y, jnp.where(x == 0, _zero(x), x * jnp.log(y)))


def _xlog1py(x, y):
    return jnp.where(jnp.isnan(y), y, jnp.where(x == 0, _zero(x), x * jnp.log1p(y)))


xlogy = define("xlogy", _xlogy, kind=INT_TO_FLOAT, allowed="buif",
               ops=(aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self))
special_xlog1py = define(
    "special_xlog1py", _xlog1py, kind=INT_TO_FLOAT, allowed="buif",
    ops=(aten.special_xlog1py.default, aten.special_xlog1py.other_scalar, aten.special_xlog1py.self_scalar),
)


def _zeta(x, q):
    # cephes, as torch: x == 1 is a pole, x < 1 a domain error, q = 0, -1, -2, ... poles
    inf, nan = jnp.full((), jnp.inf, x.dtype), jnp.full((), jnp.nan, x.dtype)
    out = jnp.where((q <= 0) & (q == jnp.floor(q)), inf, jsp.zeta(x, q))
    return jnp.where(x == 1, inf, jnp.where(x < 1, nan, out))


special_zeta = define(
    "special_zeta", _zeta, kind=INT_TO_FLOAT, allowed="buif", half=False,
    ops=(aten.special_zeta.default, aten.special_zeta.other_scalar, aten.special_zeta.self_scalar),
)


def _logaddexp(a, b, log1p_exp=lambda d: jnp.log1p(jnp.exp(d))):
    # torch: equal infinities give themselves; otherwise max + log1p(exp(-|a - b|))
    m = jnp.maximum(a, b)
    out = m + log1p_exp(-jnp.abs(a - b))
    return jnp.where(jnp.isinf(a) & (a == b), a, out)




def _logaddexp_any(a, b):
    if category(a.dtype) != "c":
        return _logaddexp(a, b)
    big = jnp.where(jnp.real(a) >= jnp.real(b), a, b)
    small = jnp.where(jnp.real(a) >= jnp.real(b), b, a)
    return big + jnp.log1p(jnp.exp(small - big))


logaddexp = define("logaddexp", _logaddexp_any, allowed="fc")
logaddexp2 = define(
    "logaddexp2", lambda a, b: _logaddexp(a, b, lambda d: jnp.log1p(jnp.exp2(d)) / _m.log(2)), allowed="f"
)
ldexp = define("ldexp", lambda a, b: a * jnp.exp2(b), kind=INT_TO_FLOAT, ops=(aten.ldexp.Tensor,))


def _same_dtype(name, what, *xs):
    first = dtype_of(xs[0])
    for x in xs[1:]:
        if x is not None and dtype_of(x) != first and not getattr(x, "weak_type", False):
            raise RuntimeError(f"{name}: expected dtype {to_torch(first)} for `{what}` but got dtype {to_torch(dtype_of(x))}")


def _lerp(a, b, w):
    return jnp.where(jnp.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self, end, weight):
    _same_dtype("lerp", "end", self, end)
    if hasattr(weight, "ndim") and not getattr(weight, "weak_type", False):
        _same_dtype("lerp", "weight", self, weight)
        return pointwise(_lerp, self, end, weight, name="lerp", allowed="fc")
    return pointwise(_lerp, self, end, name="lerp", allowed="fc", scalars=(weight,))


@lowering(aten.addcmul.default)
def addcmul(self, tensor1, tensor2, *, value=1):
    return pointwise(lambda s, a, b, v: s + v * a * b, self, tensor1, tensor2,
                     name="addcmul", allowed="uifc", scalars=(value,))


@lowering(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, *, value=1):
    if category(dtypes(tensor1, tensor2)[0]) in "bui":
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future release addcdiv will "
            "perform a true division of tensor1 and tensor2. The historic addcdiv behavior can be "
            "implemented as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer "
            "inputs and as (input + value * tensor1 / tensor2) for float inputs. The future addcdiv "
            "behavior is just the latter implementation: (input + value * tensor1 / tensor2), for all dtypes."
        )
    return pointwise(lambda s, a, b, v: s + v * a / b, self, tensor1, tensor2,
                     name="addcdiv", allowed="fc", scalars=(value,))


def _clamp(x, lo, hi):
    if lo is not None:
        x = jnp.maximum(x, lo)  # NaN-propagating, like torch
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


# torch clamps bool tensors by bool tensors, but has no bool kernel for Scalar bounds


def _clamp_lowering(name, allowed):
    def fn(self, min=None, max=None):
        if min is None and max is None:
            raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
        # torch's two-sided clamp kernel has no bool version (one-sided ones do)
        ok = allowed if (min is None or max is None) else allowed.replace("b", "")
        return pointwise(_clamp, self, min, max, name="clamp", allowed=ok)

    fn.__name__ = fn.__qualname__ = name
    return fn


clamp = lowering(aten.clamp.default)(_clamp_lowering("clamp", "uif"))
clamp_Tensor = lowering(aten.clamp.Tensor)(_clamp_lowering("clamp_Tensor", "buif"))


@lowering(aten.clamp_min.default)
def clamp_min(self, min):
    return pointwise(lambda x, lo: _clamp(x, lo, None), self, min, name="clamp_min", allowed="uif")


@lowering(aten.clamp_min.Tensor)
def clamp_min_Tensor(self, min):
    return pointwise(lambda x, lo: _clamp(x, lo, None), self, min, name="clamp_min", allowed="buif")


@lowering(aten.clamp_max.default)
def clamp_max(self, max):
    return pointwise(lambda x, hi: _clamp(x, None, hi), self, max, name="clamp_max", allowed="uif")


@lowering(aten.clamp_max.Tensor)
def clamp_max_Tensor(self, max):
    return pointwise(lambda x, hi: _clamp(x, None, hi), self, max, name="clamp_max", allowed="buif")


@lowering(aten.where.self)
def where(condition, self, other):
    if category(condition.dtype) not in "bu" or (category(condition.dtype) == "u" and condition.dtype != np.uint8):
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor with dtype {to_torch(condition.dtype)}")
    cond = condition != 0
    return pointwise(lambda a, b: jnp.where(cond, a, b), self, other)


def _heaviside(x, values):
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


@lowering(aten.heaviside.default)
def heaviside(self, values):
    if dtype_of(self) != dtype_of(values):
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    return pointwise(_heaviside, self, values, name="heaviside", allowed="buif")


def _gcd(a, b):
    return jnp.gcd(a, b)


def _lcm(a, b):
    g = jnp.gcd(a, b)
    safe = jnp.where(g == 0, jnp.ones((), g.dtype), g)
    return jnp.where(g == 0, _zero(a), jnp.abs(lax.div(a, safe) * b))


gcd = define("gcd", _gcd, allowed="ui")
lcm = define("lcm", _lcm, allowed="ui")


# ---------------------------------------------------------------------------------------
# bitwise and logical

bitwise_and = define("bitwise_and", jnp.bitwise_and, allowed="bui", ops=(
    aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor))
bitwise_or = define("bitwise_or", jnp.bitwise_or, allowed="bui", ops=(
    aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor))
bitwise_xor = define("bitwise_xor", jnp.bitwise_xor, allowed="bui", ops=(
    aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor))
bitwise_not = define("bitwise_not", jnp.invert, allowed="bui")


def _shift_left(a, b):
    # torch: a negative shift or one past the bit width gives 0
    out = lax.shift_left(a, b)
    return jnp.where((b < 0) | (b >= _bits(a.dtype)), _zero(a), out)


def _shift_right(a, b):
    # torch: a negative shift or one past the bit width shifts by the maximum (sign fill)
    max_shift = _bits(a.dtype) - (category(a.dtype) == "i")
    return jnp.where((b < 0) | (b >= max_shift), a >> max_shift, a >> jnp.clip(b, 0, max_shift))


bitwise_left_shift = define("bitwise_left_shift", _shift_left, allowed="ui", ops=(
    aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor,
    aten.__lshift__.Tensor, aten.__lshift__.Scalar))
bitwise_right_shift = define("bitwise_right_shift", _shift_right, allowed="ui", ops=(
    aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor,
    aten.__rshift__.Tensor, aten.__rshift__.Scalar))


def _truth(x):
    return x if x.dtype == np.bool_ else x != 0


@lowering(aten.logical_and.default)
def logical_and(self, other):
    return _truth(self) & _truth(other)


@lowering(aten.logical_or.default)
def logical_or(self, other):
    return _truth(self) | _truth(other)


@lowering(aten.logical_xor.default)
def logical_xor(self, other):
    return _truth(self) ^ _truth(other)


@lowering(aten.logical_not.default)
def logical_not(self):
    return ~_truth(self)


# ---------------------------------------------------------------------------------------
# comparisons and classification

eq = define("eq", lambda a, b: a == b, kind=ALWAYS_BOOL, ops=(aten.eq.Tensor, aten.eq.Scalar))
ne = define("ne", lambda a, b: a != b, kind=ALWAYS_BOOL, ops=(aten.ne.Tensor, aten.ne.Scalar))
lt = define("lt", lambda a, b: a < b, kind=ALWAYS_BOOL, allowed="buif", ops=(aten.lt.Tensor, aten.lt.Scalar))
le = define("le", lambda a, b: a <= b, kind=ALWAYS_BOOL, allowed="buif", ops=(aten.le.Tensor, aten.le.Scalar))
gt = define("gt", lambda a, b: a > b, kind=ALWAYS_BOOL, allowed="buif", ops=(aten.gt.Tensor, aten.gt.Scalar))
ge = define("ge", lambda a, b: a >= b, kind=ALWAYS_BOOL, allowed="buif", ops=(aten.ge.Tensor, aten.ge.Scalar))


def _signbit(x):
    if category(x.dtype) == "f":
        return jnp.signbit(x)
    return x < 0 if category(x.dtype) == "i" else jnp.zeros(x.shape, np.bool_)


isnan = define("isnan", jnp.isnan, kind=ALWAYS_BOOL)
isinf = define("isinf", jnp.isinf, kind=ALWAYS_BOOL)
isfinite = define("isfinite", jnp.isfinite, kind=ALWAYS_BOOL)
isposinf = define("isposinf", jnp.isposinf, kind=ALWAYS_BOOL, allowed="buif")
isneginf = define("isneginf", jnp.isneginf, kind=ALWAYS_BOOL, allowed="buif")
signbit = define("signbit", _signbit, kind=ALWAYS_BOOL, allowed="buif")


# ---------------------------------------------------------------------------------------
# unary math


def _abs(x):
    return x if category(x.dtype) in "bu" else jnp.abs(x)


def _sign(x):
    if x.dtype == np.bool_:
        return x
    # (0 < x) - (x < 0): torch gives 0 for NaN
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _sgn(x):
    if category(x.dtype) != "c":
        return _sign(x)
    r = jnp.abs(x)
    return jnp.where(r == 0, _zero(x), x / r.astype(x.dtype))


@lowering(aten.neg.default)
def neg(self):
    if category(self.dtype) == "b":
        raise RuntimeError(
            "Negation, the `-` operator, on a bool tensor is not supported. "
            "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )
    return pointwise(jnp.negative, self)


abs = define("abs", _abs, kind=COMPLEX_TO_FLOAT, allowed="uifc")
sign = define("sign", _sign, allowed="buif")
sgn = define("sgn", _sgn)
square = define("square", lambda x: x * x, kind=BOOL_TO_LONG)
_conj_physical = define("_conj_physical", lambda x: jnp.conj(x) if category(x.dtype) == "c" else x)
conj_physical = define("conj_physical", lambda x: jnp.conj(x) if category(x.dtype) == "c" else x)


def _exp2(x):
    return jnp.exp(x * _m.log(2)) if category(x.dtype) == "c" else jnp.exp2(x)


def _digamma(x):
    # torch: digamma(+-0) = -+inf, NaN at the negative integers
    pole = (x < 0) & (x == jnp.floor(x))
    out = jnp.where(pole, jnp.full((), jnp.nan, x.dtype), jsp.digamma(x))
    return jnp.where(x == 0, jnp.copysign(jnp.full((), jnp.inf, x.dtype), -x), out)


def _entr(x):
    out = jnp.where(x > 0, -x * jnp.log(x), jnp.where(x == 0, _zero(x), jnp.full((), -jnp.inf, x.dtype)))
    return jnp.where(jnp.isnan(x), x, out)


_NO_HALF = {"special_ndtri", "special_erfcx", "special_log_ndtr"}  # torch: float32/float64 only
_FLOAT_UNARY = {  # name: (math, dtype categories torch allows)
    "reciprocal": (lambda x: 1 / x, ALL),
    "sqrt": (jnp.sqrt, ALL),
    "rsqrt": (lax.rsqrt, ALL),
    "exp": (jnp.exp, ALL),
    "exp2": (_exp2, ALL),
    "expm1": (jnp.expm1, ALL),
    "log": (jnp.log, ALL),
    "log2": (jnp.log2, ALL),
    "log10": (jnp.log10, ALL),
    "log1p": (jnp.log1p, ALL),
    "sin": (jnp.sin, ALL),
    "cos": (jnp.cos, ALL),
    "tan": (jnp.tan, ALL),
    "asin": (jnp.arcsin, ALL),
    "acos": (jnp.arccos, ALL),
    "atan": (jnp.arctan, ALL),
    "sinh": (jnp.sinh, ALL),
    "cosh": (jnp.cosh, ALL),
    "tanh": (jnp.tanh, ALL),
    "asinh": (jnp.arcsinh, ALL),
    "acosh": (jnp.arccosh, ALL),
    "atanh": (jnp.arctanh, ALL),
    "sigmoid": (jax.nn.sigmoid, ALL),
    "sinc": (jnp.sinc, ALL),
    "erf": (lax.erf, "buif"),
    "erfc": (lax.erfc, "buif"),
    "erfinv": (lax.erf_inv, "buif"),
    "lgamma": (lax.lgamma, "buif"),
    "digamma": (_digamma, "buif"),
    "i0": (jsp.i0, "buif"),
    "special_i0e": (jsp.i0e, "buif"),
    "special_i1": (jsp.i1, "buif"),
    "special_i1e": (jsp.i1e, "buif"),
    "special_ndtri": (jsp.ndtri, "buif"),
    "special_erfcx": (jsp.erfcx, "buif"),
    "special_log_ndtr": (jsp.log_ndtr, "buif"),
    "special_entr": (_entr, "buif"),
    "deg2rad": (lambda x: x * (_m.pi / 180), "buif"),
    "rad2deg": (lambda x: x * (180 / _m.pi), "buif"),
}
for _name, (_math, _allowed) in _FLOAT_UNARY.items():
    globals()[_name] = define(_name, _math, kind=INT_TO_FLOAT, allowed=_allowed, half=_name not in _NO_HALF)

# rounding: integers pass through unchanged
_ROUNDING = {"floor": jnp.floor, "ceil": jnp.ceil, "trunc": jnp.trunc}
for _name, _math in _ROUNDING.items():
    globals()[_name] = define(_name, lambda x, f=_math: f(x) if _is_float(x) else x, allowed="uif")

frac = define("frac", lambda x: x - jnp.trunc(x), allowed="f")


@lowering(aten.round.default, aten.round.decimals)
def round(self, *, decimals=0):
    if decimals == 0:
        return pointwise(lambda x: jnp.round(x) if _is_float(x) else x, self, name="round", allowed="uif")

    def math(x):  # torch: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d
        ten_pow = jnp.asarray(10.0 ** (decimals if decimals > 0 else -decimals), x.dtype)
        return jnp.round(x * ten_pow) / ten_pow if decimals > 0 else jnp.round(x / ten_pow) * ten_pow

    return pointwise(math, self, name="round", allowed="f")


def _trigamma(x):
    """CPU's trigamma: the reflection pi^2/sin^2(pi x) below 1/2 (so its poles are CPU's huge
    finite values, not inf), six recurrence steps, then the asymptotic series."""
    reflect = x < 0.5
    pi = jnp.asarray(_m.pi, x.dtype)
    result = jnp.where(reflect, -(pi * pi) / jnp.square(jnp.sin(pi * x)), jnp.zeros((), x.dtype))
    y = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (y * y)
        y = y + 1
    ixx = 1 / (y * y)
    result = result + (1 + 1 / (2 * y) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / y
    return jnp.where(reflect, -result, result)


def _polygamma_high(n, x):
    """psi_n(x), n >= 2, for any real x: psi_n(x) = psi_n(x + 1) - (-1)^n n! / x^(n+1) moves x
    to 1 or above, where JAX's zeta series holds (CPU's zeta sums the same terms directly)."""
    step = (-1) ** n * _m.factorial(n)

    def body(state):
        y, acc = state
        low = (y < 1) & jnp.isfinite(y)
        acc = acc + jnp.where(low, step / y ** (n + 1), jnp.zeros((), y.dtype))
        return jnp.where(low, y + 1, y), acc

    y, acc = lax.while_loop(lambda st: jnp.any((st[0] < 1) & jnp.isfinite(st[0])), body, (x, jnp.zeros_like(x)))
    at_minus_inf = jnp.asarray(-jnp.inf if n % 2 == 0 else jnp.inf, x.dtype)  # CPU's zeta(n + 1, -inf) = inf
    return jnp.where(x == -jnp.inf, at_minus_inf, jsp.polygamma(n, y) - acc)


@lowering(aten.polygamma.default)
def polygamma(n, self):
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    math = _digamma if n == 0 else _trigamma if n == 1 else (lambda x: _polygamma_high(n, x))
    return pointwise(math, self, kind=INT_TO_FLOAT, name="polygamma", allowed="buif")


@lowering(aten.logit.default)
def logit(self, eps=None):
    def math(x):
        if eps is not None:
            x = jnp.clip(x, eps, 1 - eps)
        return jnp.log(x / (1 - x))

    return pointwise(math, self, kind=INT_TO_FLOAT, name="logit", allowed="buif")


@lowering(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    def replace(x):
        fi = jnp.finfo(x.dtype)
        x = jnp.where(jnp.isnan(x), jnp.asarray(0.0 if nan is None else nan, x.dtype), x)
        x = jnp.where(jnp.isposinf(x), jnp.asarray(fi.max if posinf is None else posinf, x.dtype), x)
        return jnp.where(jnp.isneginf(x), jnp.asarray(fi.min if neginf is None else neginf, x.dtype), x)

    kind = category(self.dtype)
    if kind == "c":
        return lax.complex(replace(jnp.real(self)), replace(jnp.imag(self)))
    return replace(self) if kind == "f" else self


@lowering(aten.angle.default)
def angle(self):
    _, compute, result = dtypes(self, kind=INT_TO_FLOAT)
    if category(result) == "c":
        return jnp.angle(self).astype(jnp.finfo(result).dtype)

    def math(x):  # torch: NaN stays NaN, negatives give pi, the rest 0
        return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(_m.pi, x.dtype), _zero(x)))

    return pointwise(math, self, kind=INT_TO_FLOAT)


# ---------------------------------------------------------------------------------------
# activations and their backward ops


def activation(name, math, allowed="f", ops=None):
    """An activation over (tensor operands..., Scalar arguments...): the tensors are promoted
    together and the Scalars (slopes, thresholds) cast to the computation dtype."""

    ops = ops if ops is not None else (getattr(aten, name).default,)
    n_tensors = Signature.of(ops[0]).kinds.count(TENSOR)

    def fn(*args):
        return pointwise(math, *args[:n_tensors], name=name, allowed=allowed, scalars=args[n_tensors:])

    fn.__name__ = fn.__qualname__ = name
    lowering(*ops)(fn)
    return fn


relu = activation("relu", lambda x: jnp.maximum(x, _zero(x)), allowed="uif")


@lowering(aten.gelu.default)
def gelu(self, *, approximate="none"):
    def math(x):
        if approximate == "tanh":
            inner = _m.sqrt(2 / _m.pi) * (x + 0.044715 * x * x * x)
            return 0.5 * x * (1 + jnp.tanh(inner))
        return x * 0.5 * (1 + lax.erf(x * _m.sqrt(0.5)))

    return pointwise(math, self, name="gelu", allowed="f")


@lowering(aten.gelu_backward.default)
def gelu_backward(grad_output, self, *, approximate="none"):
    def math(g, x):
        if approximate == "tanh":
            beta, kappa = _m.sqrt(2) * (2 / _m.sqrt(_m.pi)) * 0.5, 0.044715
            x_sq = x * x
            tanh_inner = jnp.tanh(beta * (x + kappa * x_sq * x))
            left, right = 0.5 * x, 1 + tanh_inner
            right_derivative = left * (1 - tanh_inner * tanh_inner) * (beta * (1 + 3 * kappa * x_sq))
            return g * (0.5 * right + right_derivative)
        cdf = 0.5 * (1 + lax.erf(x * _m.sqrt(0.5)))
        pdf = (2 / _m.sqrt(_m.pi)) * _m.sqrt(0.5) * 0.5 * jnp.exp(x * x * -0.5)
        return g * (cdf + x * pdf)

    return pointwise(math, grad_output, self, name="gelu_backward", allowed="f")


def _sigmoid(x):
    return 1 / (1 + jnp.exp(-x))


silu = activation("silu", lambda x: x / (1 + jnp.exp(-x)), allowed="fc")
silu_backward = activation(
    "silu_backward", lambda g, x: g * _sigmoid(x) * (1 + x * (1 - _sigmoid(x))), allowed="fc")


def _elu(x, alpha, scale, input_scale):
    return jnp.where(x <= 0, jnp.expm1(x * input_scale) * (alpha * scale), x * scale)


elu = activation("elu", _elu)


@lowering(aten.elu_backward.default)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    def math(g, y, alpha, scale, input_scale):
        if is_result:
            neg = g * input_scale * (y + alpha * scale)
        else:
            neg = g * input_scale * (alpha * scale) * jnp.exp(y * input_scale)
        return jnp.where(y > 0, g * scale, neg)  # NaN: the negative branch, NaN

    return pointwise(math, grad_output, self_or_result, name="elu_backward", allowed="f",
                     scalars=(alpha, scale, input_scale))


@lowering(aten.celu.default)
def celu(self, alpha=1.0):
    return pointwise(lambda x, a, inv: _elu(x, a, 1, inv), self, name="celu", allowed="f", scalars=(alpha, 1.0 / alpha))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
selu = activation("selu", lambda x: _elu(x, _SELU_ALPHA, _SELU_SCALE, 1.0))

leaky_relu = activation("leaky_relu", lambda x, slope: jnp.where(x > 0, x, x * slope))


@lowering(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    return pointwise(lambda g, x, s: jnp.where(x > 0, g, g * s), grad_output, self,
                     name="leaky_relu_backward", allowed="f", scalars=(negative_slope,))


hardtanh = activation("hardtanh", _clamp, allowed="if")
hardtanh_backward = activation(
    "hardtanh_backward", lambda g, x, lo, hi: jnp.where((x > lo) & (x < hi), g, _zero(g)))  # NaN x: 0
hardsigmoid = activation("hardsigmoid", lambda x: jnp.clip(x + 3, 0, 6) / 6)
hardsigmoid_backward = activation(
    "hardsigmoid_backward", lambda g, x: jnp.where((x > -3) & (x < 3), g * (1 / 6), _zero(g)))
hardswish = activation("hardswish", lambda x: x * jnp.clip(x + 3, 0, 6) / 6)
hardswish_backward = activation(
    "hardswish_backward",
    lambda g, x: jnp.where(x <= -3, _zero(g), jnp.where(x >= 3, g, g * (x / 3 + 0.5))))  # NaN x: NaN
softplus = activation(
    "softplus", lambda x, beta, th: jnp.where(x * beta > th, x, jnp.log1p(jnp.exp(x * beta)) / beta))


def _softplus_backward(g, x, beta, threshold):
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, g, g * z / (z + 1))


softplus_backward = activation("softplus_backward", _softplus_backward)
mish = activation("mish", lambda x: x * jnp.tanh(jnp.log1p(jnp.exp(x))))


def _mish_backward(g, x):
    tanh_softplus = jnp.tanh(jnp.log1p(jnp.exp(x)))
    return g * (tanh_softplus + x * _sigmoid(x) * (1 - tanh_softplus * tanh_softplus))


mish_backward = activation("mish_backward", _mish_backward)


@lowering(aten.threshold.default)
def threshold(self, threshold, value):
    # torch compares and replaces in self's dtype (the Scalars do not promote)
    return pointwise(lambda x, th, v: jnp.where(x <= th, v, x), self, name="threshold", allowed="if",
                     scalars=(threshold, value))


@lowering(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    return pointwise(lambda g, x, th: jnp.where(x <= th, _zero(g), g), grad_output, self,
                     name="threshold_backward", allowed="uif", scalars=(threshold,))


sigmoid_backward = activation(
    "sigmoid_backward", lambda g, y: g * jnp.conj(y * (1 - y)) if category(y.dtype) == "c" else g * (1 - y) * y,
    allowed="fc")
tanh_backward = activation(
    "tanh_backward", lambda g, y: g * jnp.conj(1 - y * y) if category(y.dtype) == "c" else g * (1 - y * y),
    allowed="fc")


@lowering(aten.logit_backward.default)
def logit_backward(grad_output, self, eps=None):
    def math(g, x):
        lo, hi = (0.0, 1.0) if eps is None else (eps, 1.0 - eps)
        outside = jnp.asarray(jnp.nan if eps is None else 0.0, g.dtype)
        return jnp.where((x < lo) | (x > hi), outside, g / (x * (1 - x)))  # NaN x: NaN

    return pointwise(math, grad_output, self, name="logit_backward", allowed="f")


@lowering(aten._prelu_kernel.default)
def _prelu_kernel(self, weight):
    return pointwise(lambda x, w: jnp.where(x > 0, x, w * x), self, weight, name="_prelu_kernel", allowed="f")


@lowering(aten._prelu_kernel_backward.default)
def _prelu_kernel_backward(grad_output, self, weight):
    def math(g, x, w):
        return jnp.where(x > 0, g, w * g), jnp.where(x > 0, _zero(x), x * g)

    _, compute, result = dtypes(grad_output, self, weight)
    check_dtype("_prelu_kernel_backward", result, "f")
    g, x, w = (cast(t, compute) for t in (grad_output, self, weight))
    grad_input, grad_weight = math(g, x, w)
    return cast(grad_input, result), cast(grad_weight, result)


def _halves(name, self, dim):
    if self.ndim == 0:
        raise RuntimeError(f"{name} does not support scalars because halving size must be even")
    dim = dim % self.ndim
    if self.shape[dim] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim} is size {self.shape[dim]}")
    return dim, jnp.split(self, 2, axis=dim)


@lowering(aten.glu.default)
def glu(self, dim=-1):
    _, (a, b) = _halves("glu", self, dim)
    return pointwise(lambda a, b: a * _sigmoid(b), a, b, name="glu", allowed="f")


@lowering(aten.glu_backward.default)
def glu_backward(grad_output, self, dim):
    dim, (a, b) = _halves("glu", self, dim)

    def math(g, a, b):
        s = _sigmoid(b)
        return jnp.concatenate([s * g, (1 - s) * s * a * g], axis=dim)

    return pointwise(math, grad_output, a, b, name="glu_backward", allowed="f")


hardshrink = activation(
    "hardshrink", lambda x, lambd: jnp.where((x >= -lambd) & (x <= lambd), _zero(x), x))
hardshrink_backward = activation(
    "hardshrink_backward", lambda g, x, lambd: jnp.where((x < -lambd) | (x > lambd), g, _zero(g)))  # NaN x: 0
softshrink = activation(
    "softshrink",
    lambda x, lambd: jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0)))
softshrink_backward = activation(
    "softshrink_backward", lambda g, x, lambd: jnp.where((x < -lambd) | (x > lambd), g, _zero(g)))  # NaN x: 0


@lowering(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(self):
    # CPU semantics: the buffer holds exp(-|x|) for the backward
    _, compute, result = dtypes(self)
    check_dtype("log_sigmoid_forward", result, "f")
    x = cast(self, compute)
    z = jnp.exp(-jnp.abs(x))
    return cast(jnp.minimum(_zero(x), x) - jnp.log1p(z), result), cast(z, result)


@lowering(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, self, buffer):
    def math(g, x, *z):
        z = z[0] if z else jnp.exp(-jnp.abs(x))
        neg = x < 0
        return g * (jnp.where(neg, 1, 0).astype(x.dtype) - jnp.where(neg, 1, -1).astype(x.dtype) * (z / (1 + z)))

    operands = (grad_output, self, buffer) if buffer.size > 0 else (grad_output, self)
    return pointwise(math, *operands, name="log_sigmoid_backward", allowed="f")
