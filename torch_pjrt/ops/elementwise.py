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

import math as _m
import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import torch
from jax import lax
from ..dtypes import to_torch
from . import promotion
from .promotion import KIND, cast, promote
from .registry import family, NO_TEST_CASES, POINTWISE, SAME, TestCases
from .signature import TENSOR, Signature

lowering = family(padding=POINTWISE)

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


# Ops whose result is real for a complex input and whose in-place form CPU refuses on a complex
# self (ATen's unary_op_impl_with_complex_to_float_): `abs_` would otherwise write |z| into z.
NO_COMPLEX_IN_PLACE: set = set()


def define(name, math, *, kind=DEFAULT, allowed=ALL, ops=None, half=True, tests=NO_TEST_CASES):
    """Register `math` as the lowering of `ops` (default aten.<name>.default); returns the
    lowering, a function named after the op taking the op's tensor/Scalar operands.
    `allowed`: the dtype categories torch has kernels for; half=False: none for float16/bfloat16;
    `tests`: its tests' special cases."""

    def fn(*operands):
        return pointwise(math, *operands, kind=kind, name=name, allowed=allowed, half=half)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"aten.{name}: elementwise, {kind.name} promotion."
    lowering(*(ops if ops is not None else (getattr(aten, name).default,)), tests=tests)(fn)
    if kind is COMPLEX_TO_FLOAT:
        NO_COMPLEX_IN_PLACE.add(name)
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


def _rounded(x, common):
    """x rounded to `common` and back where CPU's kernels compute in a 16-bit float's own
    arithmetic (c10::Half / BFloat16 operators round each operation's result); x otherwise
    (and where `common` is None)."""
    if common is not None and np.dtype(common) in _REDUCED_FLOATS:
        return _to_compute(x, common, x.dtype)
    return x


def _scaled(b, alpha, common):
    """alpha * b as torch's CPU kernels round it: in the tensor dtype for 16-bit floats."""
    return _rounded(b * alpha, common)


@lowering(aten.add.Tensor, aten.add.Scalar, scalar_fits="alpha")
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


def _minus_scaled(a, b, alpha, common):
    """a - alpha * b as CPU's kernels: add with -alpha, a + (-alpha) * b. Of complex values that
    product is a complex one, which makes a zero's sign +0 where plain negation keeps it:
    (1 - 0i) - (0.76 - 0i) is 0.24 + 0i on CPU (0.24 - 0i as a - b)."""
    if category(a.dtype) == "c":
        return a + _scaled(b, -alpha, common)
    return a - _scaled(b, alpha, common)


@lowering(aten.sub.Tensor, aten.sub.Scalar, scalar_fits="alpha")
def sub(self, other, alpha=1):
    common = dtypes(self, other)[0]
    _no_bool_subtraction(self, other)
    _check_alpha(common, alpha)
    return pointwise(lambda a, b, alpha: _minus_scaled(a, b, alpha, common), self, other, scalars=(alpha,))


@lowering(aten.rsub.Tensor, aten.rsub.Scalar, scalar_fits="alpha")
def rsub(self, other, alpha=1):
    common = dtypes(self, other)[0]
    _no_bool_subtraction(self, other)
    _check_alpha(common, alpha)
    return pointwise(lambda a, b, alpha: _minus_scaled(b, a, alpha, common), self, other, scalars=(alpha,))


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def mul(self, other):
    return pointwise(lambda a, b: a & b if a.dtype == np.bool_ else a * b, self, other, opmath_other=True)


# Division with rounding of 16-bit floats by a tensor rounds each step to the dtype, as CPU's
# kernels compute it in the dtype's own arithmetic: trunc(1 / bfloat16(0.1001)) is
# trunc(bfloat16(9.99)) = 10 there, and floor division differs from floor-of-float in about 4% of
# random bfloat16 quotients. `common` None: in the computation dtype.
def _div_trunc(a, b, common):
    if _is_float(a):
        return jnp.trunc(_rounded(a / b, common))
    return lax.div(a, b)  # C division truncates


def _div_floor(a, b, common):
    if not _is_float(a):
        q, r = lax.div(a, b), lax.rem(a, b)
        return jnp.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)
    # c10::div_floor_floating: Python's algorithm, exact where floor(a / b) is not
    mod = lax.rem(a, b)
    div = _rounded(_rounded(a - mod, common) / b, common)
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), _rounded(div - 1, common), div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(_rounded(div - floordiv, common) > 0.5, _rounded(floordiv + 1, common), floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(_zero(a), a / b), floordiv)
    return jnp.where(b == 0, a / b, floordiv)


def _kept_divisor(self, other):
    """How a division keeps its divisor `other`: for one broadcast from a smaller shape (a Python
    scalar, a 0-d tensor, a row), XLA's algebraic simplifier rewrites a / broadcast(b) into
    a * broadcast(1 / b), which is 1 ulp off in most elements; CPU torch divides (so does IEEE), and
    a barrier keeps the divisor an operand of a true division, at the cost of materializing it."""
    if jnp.shape(other) == jnp.broadcast_shapes(jnp.shape(self), jnp.shape(other)):
        return lambda b: b
    return lax.optimization_barrier


def _rounding_division(math, name, self, other):
    """div with a rounding mode, and floor_divide, as CPU's kernels: a divisor of one element
    (TensorIterator's is_scalar) divides in float, read at full precision; a 16-bit float divides
    by a tensor in its own arithmetic."""
    common = None if jnp.size(other) == 1 else dtypes(self, other)[0]
    kept = _kept_divisor(self, other)
    return pointwise(lambda a, b: math(a, kept(b), common), self, other, name=name, allowed="uif",
                     opmath_other=True)


@lowering(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        kept = _kept_divisor(self, other)
        return pointwise(lambda a, b: a / kept(b), self, other, kind=INT_TO_FLOAT, opmath_other=True)
    if rounding_mode == "trunc":
        return _rounding_division(_div_trunc, "div_trunc", self, other)
    if rounding_mode == "floor":
        return _rounding_division(_div_floor, "div_floor", self, other)
    raise ValueError(
        f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'"
    )


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar, tests=TestCases(nonzero_divisor=True))
def floor_divide(self, other):
    return _rounding_division(_div_floor, "floor_divide", self, other)


def _remainder(a, b):
    mod = lax.rem(a, b)  # C fmod, sign of a
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


_DIVISION = TestCases(nonzero_divisor=True)
remainder = define(
    "remainder", _remainder, allowed="uif",
    ops=(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor), tests=_DIVISION,
)
fmod = define("fmod", lax.rem, allowed="uif", ops=(aten.fmod.Tensor, aten.fmod.Scalar), tests=_DIVISION)


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


def _int_pow_by(base, exponent: int):
    """_int_pow by a number >= 0 (CPU refuses a negative one), its square-and-multiply unrolled
    while tracing (no loop in the program)."""
    acc = jnp.ones_like(base)
    while exponent:
        if exponent & 1:
            acc = acc * base
        exponent >>= 1
        if exponent:
            base = base * base
    return acc


def _pow(a, b):
    return lax.pow(a, b) if _is_float(a) else _int_pow(a, b)


def _is_scalar(x) -> bool:
    return isinstance(x, (bool, int, float, complex)) or bool(getattr(x, "weak_type", False))


@lowering(aten.pow.Tensor_Tensor)
def pow(self, exponent):
    return pointwise(_pow, self, exponent, name="pow", allowed="uifc")


def _pow_by_scalar(x, e, static_e, common):
    """torch's pow_tensor_scalar kernel: exponents 0.5, -0.5, -1 (and 2, 3, -2 for real
    floats) take dedicated paths, so pow(-0., .5) = -0. and pow(-inf, .5) = NaN as in sqrt.
    For bfloat16 those products are bfloat16 products, each rounded (v * v * v is
    bf16(bf16(v * v) * v)), as in CPU's kernel on both its vector and scalar paths: rounding
    once put 20% of bfloat16 cubes an ulp off CPU's, and rsqrt's backward (result.pow(3))
    past bfloat16's gradient tolerance."""
    def product(a, b):
        p = a * b
        return _to_compute(p, common, p.dtype) if np.dtype(common) == np.dtype(jnp.bfloat16) else p

    special = [(0.5, jnp.sqrt), (-0.5, lax.rsqrt), (-1, lambda v: 1 / v)]
    if category(x.dtype) == "f":
        special += [(2, lambda v: v * v), (3, lambda v: product(product(v, v), v)), (-2, lambda v: 1 / product(v, v))]
    if static_e is not None:  # a constant exponent (compile path): choose while tracing
        for v, f in special:
            if static_e == v:
                return f(x)
        return lax.pow(x, jnp.broadcast_to(e, x.shape))
    index = sum(jnp.where(e == v, i + 1, 0) for i, (v, _) in enumerate(special))
    branches = [lambda x, e: lax.pow(x, jnp.broadcast_to(e, x.shape))] + [lambda x, e, f=f: f(x) for _, f in special]
    return lax.switch(index, branches, x, e)


# static: torch's kernel picks a formula by the exponent's value (2: v * v, 0.5: sqrt, ...); traced,
# that pick is a conditional in the program, which XLA fuses nothing across (x ** 2 4x slower here)
# and which XLA:GPU decides on the host, a read back per call (RMSNorm's pow(2), GELU's pow(3.0))
@lowering(aten.pow.Tensor_Scalar, scalar_fits="exponent", static=("exponent",))
def pow_Tensor_Scalar(self, exponent):
    common, compute, result = dtypes(self, exponent)
    x, e = _to_compute(self, common, compute), _to_compute(exponent, common, compute)
    # a number (the entry's static exponent, a graph's constant), else traced (_foreach_pow.ScalarList's)
    static_e = exponent if isinstance(exponent, (bool, int, float)) else None
    if x.dtype == np.bool_:  # bool tensor ** bool Scalar stays bool
        return x | ~e
    if not _is_float(x):
        if static_e is None:
            return cast(_int_pow(x, e), result)
        if exponent < 0:  # CPU's check (numpy's too); pjrt gave 0, 1 or -1
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        return cast(_int_pow_by(x, int(exponent)), result)
    if np.dtype(common) == np.float16:  # torch's float16 kernel is plain std::pow
        return cast(lax.pow(x, jnp.broadcast_to(e, x.shape)), result)
    return cast(_pow_by_scalar(x, e, static_e, common), result)


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
@lowering(aten.ldexp.Tensor)
def ldexp(self, other):
    """aten.ldexp: elementwise, INT_TO_FLOAT promotion."""
    if other.dtype == jnp.bool_ and jnp.issubdtype(self.dtype, jnp.floating):
        raise TypeError("ldexp of a bool exponent")  # CPU has no such kernel: its call names the error
    return pointwise(lambda a, b: a * jnp.exp2(b), self, other, kind=INT_TO_FLOAT, name="ldexp", allowed=ALL)


def _regularized_gamma(lower: bool):
    """torch's calc_igamma / calc_igammac: its edge cases, else JAX's regularized incomplete gamma,
    in float64 for narrower floats: JAX's float32 series lose ~3e-5 where a and x are large and
    close (igamma(47.26, 47.26) 0.519331 against 0.519346), where CPU's (Temme's asymptotic
    series) holds float32's precision (test_unary_ufuncs' test_igamma_common)."""
    def math(a, x):
        nan, one, zero = (jnp.full((), v, a.dtype) for v in (jnp.nan, 1.0, 0.0))
        at_zero_a, at_zero_x, at_inf_x = (one, zero, one) if lower else (zero, one, zero)
        out = (jsp.gammainc if lower else jsp.gammaincc)(a.astype(jnp.float64), x.astype(jnp.float64)).astype(a.dtype)
        out = jnp.where(jnp.isinf(x), at_inf_x, out)
        out = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, one - at_inf_x), out)
        out = jnp.where(x == 0, at_zero_x, out)
        out = jnp.where(a == 0, jnp.where(x > 0, at_zero_a, nan), out)
        return jnp.where((x < 0) | (a < 0), nan, out)
    return math


igamma = define("igamma", _regularized_gamma(lower=True), allowed="f")
igammac = define("igammac", _regularized_gamma(lower=False), allowed="f")


@lowering(aten.frexp.Tensor, padding=SAME)
def frexp(self):
    """Mantissa in [0.5, 1) and an int32 exponent; inf and nan keep themselves with exponent 0 (C's frexp)."""
    if category(self.dtype) != "f":
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    compute = jnp.float32 if self.dtype in (jnp.float16, jnp.bfloat16) else self.dtype
    mantissa, exponent = jnp.frexp(self.astype(compute))
    finite = jnp.isfinite(self)
    return (jnp.where(finite, mantissa.astype(self.dtype), self),
            jnp.where(finite, exponent, 0).astype(jnp.int32))


def _same_dtype(name, what, *xs):
    first = dtype_of(xs[0])
    for x in xs[1:]:
        if x is not None and dtype_of(x) != first and not getattr(x, "weak_type", False):
            raise RuntimeError(f"{name}: expected dtype {to_torch(first)} for `{what}` but got dtype {to_torch(dtype_of(x))}")


def _lerp(a, b, w):
    return jnp.where(jnp.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))


@lowering(aten.lerp.Tensor)
def lerp(self, end, weight):
    _same_dtype("lerp", "end", self, end)
    if hasattr(weight, "ndim") and not getattr(weight, "weak_type", False):
        _same_dtype("lerp", "weight", self, weight)
        return pointwise(_lerp, self, end, weight, name="lerp", allowed="fc")
    return pointwise(_lerp, self, end, name="lerp", allowed="fc", scalars=(weight,))


@lowering(aten.lerp.Scalar, scalar_fits="weight")
def lerp_Scalar(self, end, weight):
    """A Scalar weight is a number whatever it arrives as (a traced bool is no weak-typed array, and
    is no tensor of another dtype: lerp(x, y, True) is y, as on the CPU)."""
    _same_dtype("lerp", "end", self, end)
    return pointwise(_lerp, self, end, name="lerp", allowed="fc", scalars=(weight,))


@lowering(aten.addcmul.default, scalar_fits="value")
def addcmul(self, tensor1, tensor2, *, value=1):
    return pointwise(lambda s, a, b, v: s + v * a * b, self, tensor1, tensor2,
                     name="addcmul", allowed="uifc", scalars=(value,))


@lowering(aten.addcdiv.default, scalar_fits="value")
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


clamp = lowering(aten.clamp.default, scalar_fits=("min", "max"))(_clamp_lowering("clamp", "uif"))
clamp_Tensor = lowering(aten.clamp.Tensor)(_clamp_lowering("clamp_Tensor", "buif"))


@lowering(aten.clamp_min.default, scalar_fits="min")
def clamp_min(self, min):
    return pointwise(lambda x, lo: _clamp(x, lo, None), self, min, name="clamp_min", allowed="uif")


@lowering(aten.clamp_min.Tensor)
def clamp_min_Tensor(self, min):
    return pointwise(lambda x, lo: _clamp(x, lo, None), self, min, name="clamp_min", allowed="buif")


@lowering(aten.clamp_max.default, scalar_fits="max")
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
    # CPU's |a / gcd * b| in C++'s int for 8- and 16-bit integers (their arithmetic promotes), so
    # an overflowing product takes its absolute value before it wraps to the narrow type
    narrow = a.dtype
    if jnp.dtype(narrow).itemsize < 4:
        a, b = a.astype(jnp.int32), b.astype(jnp.int32)
    g = jnp.gcd(a, b)
    safe = jnp.where(g == 0, jnp.ones((), g.dtype), g)
    return jnp.where(g == 0, _zero(a), jnp.abs(lax.div(a, safe) * b)).astype(narrow)


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


@lowering(aten.logical_not.default, padding=SAME)
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


@lowering(aten.isclose.default, over_composite="its result is bool: no gradient")
def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """ATen's composite isclose as one call, op for op through the table's lowerings (so with the
    same roundings): |self - other| <= atol + |rtol * other|, where finite, or equal (and NaN with
    NaN under equal_nan). Every `assert_close` on the device computes it: as twelve eager calls it
    built twelve executables per new shape. Bad arguments raise; eager's oracle raises CPU's error."""
    if self.dtype != other.dtype or rtol < 0 or atol < 0:
        raise TypeError("isclose: arguments CPU refuses")
    close = eq(self, other)
    if equal_nan and category(self.dtype) in "fc":
        close = bitwise_or(close, bitwise_and(isnan(self), isnan(other)))
    if rtol == 0 and atol == 0:
        return close
    if self.dtype == np.bool_:
        self = cast(self, promotion.default_float())
    if category(other.dtype) in "bui":  # the difference in a float: uint8's would wrap
        other = cast(other, promotion.default_float())
    allowed_error = add(abs(mul(other, rtol)), atol)
    actual_error = abs(sub(self, other))
    return bitwise_or(close, bitwise_and(isfinite(actual_error), le(actual_error, allowed_error)))


# ---------------------------------------------------------------------------------------
# unary math


def _abs(x):
    if category(x.dtype) in "bu":
        return x
    if category(x.dtype) == "c":  # C99's hypot, as CPU's: an infinite part makes |z| inf, NaN or not
        inf = jnp.isinf(x.real) | jnp.isinf(x.imag)
        return jnp.where(inf, jnp.full((), jnp.inf, x.real.dtype), jnp.abs(x))
    return jnp.abs(x)


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
    """2**x as 2**n * 2**f, n = round(x), |f| <= 0.5: exact at integral x, as CPU's exp2. XLA's
    exp2 is exp(x ln 2), whose rounding of x ln 2 grows with |x| (float32 2**47 off by 1.5e-6)."""
    if category(x.dtype) == "c":  # each part scaled by ln 2, not a complex product (inf * ln 2 has a NaN part)
        return _exp(lax.complex(x.real * _m.log(2), x.imag * _m.log(2)))
    n = jnp.clip(jnp.round(x), -2000, 2000)  # past both ends of float64's range: the result is 0 or inf
    exact = jnp.ldexp(jnp.exp2(x - n), n.astype(np.int32))
    return jnp.where(jnp.isfinite(x), exact, jnp.exp2(x))  # inf -> inf, -inf -> 0, NaN -> NaN


def _cosh(x):
    """CPU's cosh of a real x: exp(|x|) / 2 + exp(-|x|) / 2, overflowing where exp does, as CPU's
    vectorized kernel (Sleef) does (its scalar tail, std::cosh, only past log(2 max)). XLA's cosh
    rounds |x| + log(1/2) first: 60% of float32 results in [-95, 95] were more than 1.3e-6 from
    CPU's."""
    if category(x.dtype) == "c":
        return jnp.cosh(x)
    a = jnp.abs(x)
    return 0.5 * jnp.exp(a) + 0.5 * jnp.exp(-a)


def _sinh(x):
    """CPU's sinh of a real x: XLA's below |x| = 1 (expm1's accuracy where exp(x) - exp(-x)
    cancels), sign(x) (exp(|x|) / 2 - exp(-|x|) / 2) above (see _cosh)."""
    if category(x.dtype) == "c":
        return jnp.sinh(x)
    a = jnp.abs(x)
    return jnp.where(a < 1, jnp.sinh(x), jnp.sign(x) * (0.5 * jnp.exp(a) - 0.5 * jnp.exp(-a)))


def _conj_symmetric(f, z):
    """f(z) for a complex function with f(conj z) = conj(f(z)) (sqrt, exp), keeping the sign of a
    zero imaginary part as CPU does, which XLA's reads as +0: computed at conj z where Im z has
    its sign bit set."""
    return jnp.where(jnp.signbit(z.imag), jnp.conj(f(jnp.conj(z))), f(z))


def _sqrt(x):
    """sqrt; of a complex z, the branch cut's -0 kept (sqrt(-2.5 - 0j) = -1.58j, _conj_symmetric)
    and C99's special values."""
    if category(x.dtype) != "c":
        return jnp.sqrt(x)
    out = _conj_symmetric(jnp.sqrt, x)
    # C99's special values, as CPU's: sqrt(x +- inf i) = inf +- inf i (x NaN too), sqrt(-inf + NaN i) = NaN + inf i
    inf = jnp.full((), jnp.inf, x.real.dtype)
    out = jnp.where(jnp.isinf(x.imag), lax.complex(inf, x.imag), out)
    nan = jnp.full((), jnp.nan, x.real.dtype)
    out = jnp.where(jnp.isposinf(x.real) & jnp.isnan(x.imag), lax.complex(inf, nan), out)
    return jnp.where(jnp.isneginf(x.real) & jnp.isnan(x.imag), lax.complex(nan, inf), out)


def _exp(x):
    """exp; of a complex z with CPU's signed zeros (_conj_symmetric) and C99's special values for
    an infinite or NaN y in z = x + y i: exp(+inf + y i) = inf + NaN i, exp(-inf + y i) = 0 +- 0 i
    (XLA gives NaN + NaN i for both)."""
    if category(x.dtype) != "c":
        return jnp.exp(x)
    out = _conj_symmetric(jnp.exp, x)
    part = x.real.dtype
    odd = ~jnp.isfinite(x.imag)
    out = jnp.where(jnp.isposinf(x.real) & odd, lax.complex(jnp.full((), jnp.inf, part), jnp.full((), jnp.nan, part)), out)
    return jnp.where(jnp.isneginf(x.real) & odd, lax.complex(jnp.zeros((), part), jnp.copysign(jnp.zeros((), part), x.imag)), out)


def _c10_reciprocal(z):
    """1 / z of a complex z as CPU's c10::complex divides (Smith's scaled division, as numpy's), the
    division that gives rsqrt and sigmoid CPU's special values (1 / (inf + 0i) = 0 + 0i,
    1 / (inf + inf i) = NaN + NaN i, 1 / 0 = inf + NaN i) and signs of zeros (c10 adds a zero)."""
    c, d = z.real, z.imag
    part = c.dtype
    wide = jnp.abs(c) >= jnp.abs(d)  # false where a part is NaN: the narrow branch, NaN + NaN i
    rat = jnp.where(wide, d / c, c / d)  # |rat| <= 1, or NaN
    scl = 1 / jnp.where(wide, c + d * rat, d + c * rat)
    zero = jnp.zeros((), part)
    unit = jnp.where(jnp.isnan(rat), jnp.full((), jnp.nan, part), jnp.ones((), part))  # c10's 1 + 0 rat
    # wide: (1 + 0 rat) + (0 - rat) i; narrow: (rat + 0) + (0 rat - 1) i; a zero rat gives +0 parts
    re = jnp.where(wide, unit, jnp.where(rat == 0, zero, rat)) * scl
    im = jnp.where(wide, jnp.where(rat == 0, zero, -rat), -unit) * scl
    both_zero = (c == 0) & (d == 0)  # c10: 1 / |c| + (0 / |d|) i
    re = jnp.where(both_zero, jnp.full((), jnp.inf, part), re)
    return lax.complex(re, jnp.where(both_zero, jnp.full((), jnp.nan, part), im))


def _rsqrt(x):
    """rsqrt; of a complex z CPU's 1 / sqrt(z), C99's sqrt then c10's division (_c10_reciprocal):
    rsqrt(x + inf i) = NaN + NaN i, rsqrt(inf + y i) = 0 + 0i for a finite y. XLA's complex rsqrt
    gave 0 there, 1 - 0i for 1 + 0i and 3.9e-17 - 0.63i for -2.5 + 0i (CPU: -0.63i)."""
    if category(x.dtype) != "c":
        return lax.rsqrt(x)
    return _c10_reciprocal(_sqrt(x))


def _logistic(x):
    """sigmoid, the logistic function; of a complex z CPU's kernel, 1 / (1 + exp(-z)) with C99's
    exp and c10's division: sigmoid(inf + inf i) = 1 (exp(-inf - inf i) = 0), sigmoid(-inf + y i)
    = NaN + NaN i for a finite nonzero y (1 / (inf - inf i)); XLA's logistic gave NaN and 0."""
    if category(x.dtype) != "c":
        return jax.nn.sigmoid(x)
    return _c10_reciprocal(1 + _exp(-x))


def _tanh(x):
    """tanh; of a complex z = x + y i C99's ctanh as CPU's (glibc's): odd and conj-symmetric with
    signed zeros, computed on |x| + |y| i and the signs put back, as
    (sinh x cosh x + i sin y cos y) / (sinh^2 x + cos^2 y). XLA's complex tanh lost up to 28 ulps
    near the poles (complex64 tanh(-0.0095 + 1.5746i) 3.4e-6 off; its max over normal values
    2.7e-6, this formula's 4.2e-7, complex128 2e-15 and 6e-16), read -0 as +0, and gave NaN + NaN i
    for C99's tanh(+-0 + y i) = +-0 + NaN i (y infinite or NaN) and tanh(NaN +- 0i) = NaN +- 0i."""
    if category(x.dtype) != "c":
        return jnp.tanh(x)
    re, im = x.real, x.imag
    a, b = jnp.abs(re), jnp.abs(im)
    part = a.dtype
    nan, zero, one = jnp.full((), jnp.nan, part), jnp.zeros((), part), jnp.ones((), part)
    sin, cos = jnp.sin(b), jnp.cos(b)
    sinh, cosh = _sinh(a), _cosh(a)
    den = sinh * sinh + cos * cos
    # past glibc's threshold sinh^2 overflows: Re = 1, Im = 4 sin y cos y / exp(2x)
    big = a > (44 if part == np.float32 else 354)
    out_re = jnp.where(big, one, sinh * cosh / den)
    out_im = jnp.where(big, 4 * sin * cos * jnp.exp(-a) * jnp.exp(-a), sin * cos / den)
    # C99's special values: tanh(inf + y i) = 1 + 0 sin(2y) i (+0 for an infinite or NaN y),
    # NaN + NaN i for a finite x and an infinite or NaN y (x = 0: 0 + NaN i), tanh(NaN + 0i) = NaN + 0i
    finite_b = jnp.isfinite(b)
    out_im = jnp.where(jnp.isinf(a), jnp.where(finite_b, out_im, zero), out_im)
    odd_b = jnp.isfinite(a) & ~finite_b
    out_re = jnp.where(odd_b, jnp.where(a == 0, zero, nan), out_re)
    out_im = jnp.where(odd_b | (jnp.isnan(a) & (b != 0)), nan, jnp.where(jnp.isnan(a), zero, out_im))
    return lax.complex(jnp.where(jnp.signbit(re), -out_re, out_re), jnp.where(jnp.signbit(im), -out_im, out_im))


def _atan(x):
    """atan; of a complex z = x + y i with CPU's (C99's) signs, Re atan z has x's sign and Im atan z
    y's (XLA's: atan(-0 + inf i) = +pi/2, atan(1 + 0i) with -0i), and C99's NaNs: NaN + NaN i for
    a NaN y and a finite x, NaN +- 0i for a NaN x and a zero or infinite y, else NaN + NaN i (XLA
    gave +-pi/2 as the real part)."""
    if category(x.dtype) != "c":
        return jnp.arctan(x)
    re, im = x.real, x.imag
    part = re.dtype
    w = jnp.arctan(x)
    # Im atan(x +- i) = +-log(hypot(x, 2) / |x|) / 2: XLA's x^2 + (1 - |y|)^2 underflows to 0 for a
    # tiny x, inf where CPU's is finite (atan(1e-30 + 1i) = 0.785 + 34.9i in complex64)
    w_im = jnp.where(jnp.isinf(w.imag) & (re != 0), 0.5 * (jnp.log(jnp.hypot(re, 2)) - jnp.log(jnp.abs(re))), w.imag)
    out_re, out_im = jnp.copysign(w.real, re), jnp.copysign(w_im, im)
    nan = jnp.full((), jnp.nan, part)
    nan_y = jnp.isnan(im) & jnp.isfinite(re)
    out_re = jnp.where(jnp.isnan(re) | nan_y, nan, out_re)
    nan_x_im = jnp.where((im == 0) | jnp.isinf(im), jnp.copysign(jnp.zeros((), part), im), nan)
    out_im = jnp.where(jnp.isnan(re), nan_x_im, jnp.where(nan_y, nan, out_im))
    return lax.complex(out_re, out_im)


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
    "sqrt": (_sqrt, ALL),
    "rsqrt": (_rsqrt, ALL),
    "exp": (_exp, ALL),
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
    "atan": (_atan, ALL),
    "sinh": (_sinh, ALL),
    "cosh": (_cosh, ALL),
    "tanh": (_tanh, ALL),
    "asinh": (jnp.arcsinh, ALL),
    "acosh": (jnp.arccosh, ALL),
    "atanh": (jnp.arctanh, ALL),
    "sigmoid": (_logistic, ALL),
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
# complex transcendental functions: XLA and torch use different formulas
_COMPLEX_FORMULAS = TestCases(tolerance=((torch.complex64, 1e-5, 1e-4),))
_COMPLEX_DIFFERS = {"tan", "tanh", "sigmoid", "sinc", "rsqrt", "log10", "log2"}
for _name, (_math, _allowed) in _FLOAT_UNARY.items():
    globals()[_name] = define(_name, _math, kind=INT_TO_FLOAT, allowed=_allowed, half=_name not in _NO_HALF,
                              tests=_COMPLEX_FORMULAS if _name in _COMPLEX_DIFFERS else NO_TEST_CASES)

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
    to 1 or above, where JAX's zeta series holds (CPU's zeta sums the same terms directly). The
    poles (0, the negative integers, -inf) are CPU's infinities up front: stepping from a float too
    large to change by 1 never ends. n! is exact: jsp.polygamma's exp(lgamma(n + 1)) put float32
    results ~1e-6 off CPU's."""
    step = (-1) ** n * _m.factorial(n)
    pole = (x <= 0) & (x == jnp.floor(x))

    def body(state):
        y, acc = state
        low = y < 1
        acc = acc + jnp.where(low, step / y ** (n + 1), jnp.zeros((), y.dtype))
        return jnp.where(low, y + 1, y), acc

    start = jnp.where(pole, jnp.ones((), x.dtype), x)
    y, acc = lax.while_loop(lambda st: jnp.any(st[0] < 1), body, (start, jnp.zeros_like(x)))
    at_pole = jnp.asarray(-jnp.inf if n % 2 == 0 else jnp.inf, x.dtype)  # CPU's (-1)^(n+1) n! zeta(n + 1, pole)
    return jnp.where(pole, at_pole, -step * jsp.zeta(jnp.asarray(n + 1, y.dtype), y) - acc)


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


@lowering(aten.nan_to_num.default, traced=("nan", "posinf", "neginf"))
def nan_to_num(self, nan=None, posinf=None, neginf=None):  # the replacements are traced: jnp.where only
    def replace(x):
        # each element classified as it was: a replacement that rounds to inf (nan=1e6 in float16)
        # stays inf, as CPU's kernel gives it
        fi = jnp.finfo(x.dtype)
        out = jnp.where(jnp.isnan(x), jnp.asarray(0.0 if nan is None else nan, x.dtype), x)
        out = jnp.where(jnp.isposinf(x), jnp.asarray(fi.max if posinf is None else posinf, x.dtype), out)
        return jnp.where(jnp.isneginf(x), jnp.asarray(fi.min if neginf is None else neginf, x.dtype), out)

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
# special functions: Bessel, Airy and orthogonal polynomials, as torch's CPU kernels compute
# them (ATen/native/Math.h: Cephes' rational approximations and Chebyshev series, evaluated
# in the computation dtype with the same coefficients, branches and loop bounds). torch has
# float32/float64 kernels only (integers and bools compute in the default float dtype).


def _horner(z, coefficients):
    """Math.h's `p = p * z + c` over the coefficients, highest degree first (from p = 0)."""
    p = jnp.zeros_like(z)
    for c in coefficients:
        p = p * z + c
    return p


def _chbevl(y, coefficients):
    """Math.h's Chebyshev series loop: a = y * q - p + c, returning 0.5 * (a - p)."""
    p = q = jnp.zeros_like(y)
    a = jnp.full_like(y, coefficients[0])
    for c in coefficients[1:]:
        p, q = q, a
        a = y * q - p + c
    return 0.5 * (a - p)


def _full(x, value):
    return jnp.full((), value, x.dtype)


_J0_PP = (7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
          5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
          9.99999999999999997821e-01)
_J0_PQ = (9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
          5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
          1.00000000000000000218e+00)
_J0_QP = (-1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
          -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
          -5.14105326766599330220e+01, -6.05014350600728481186e+00)
_J0_QQ = (6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
          7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
          2.42005740240291393179e+02)
_J0_RP = (-4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14,
          9.70862251047306323952e+15)
_J0_RQ = (4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07,
          1.11855537045356834862e+10, 2.11277520115489217587e+12, 3.10518229857422583814e+14,
          3.18121955943204943306e+16, 1.71086294081043136091e+18)
_Y0_YP = (1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09,
          -9.82136065717911466409e+11, 8.75906394395366999549e+13, -3.46628303384729719441e+15,
          4.42733268572569800351e+16, -1.84950800436986690637e+16)
_Y0_YQ = (1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08,
          8.64002487103935000337e+10, 2.02979612750105546709e+13, 3.17157752842975028269e+15,
          2.50596256172653059228e+17)
_J1_PP = (7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
          5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
          1.00000000000000000254e+00)
_J1_PQ = (5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
          5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
          9.99999999999999997461e-01)
_J1_QP = (5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
          3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
          2.11688757100572135698e+02, 2.52070205858023719784e+01)
_J1_QQ = (7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
          9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
          3.36093607810698293419e+02)
_J1_RP = (-8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13,
          3.68295732863852883286e+15)
_J1_RQ = (6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07,
          2.21511595479792499675e+10, 4.74914122079991414898e+12, 7.84369607876235854894e+14,
          8.95222336184627338078e+16, 5.32278620332680085395e+18)
_Y1_YP = (1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14,
          -8.12770255501325109621e+15, 2.02439475713594898196e+17, -7.78877196265950026825e+17)
_Y1_YQ = (5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07,
          1.87601316108706159478e+10, 3.88231277496238566008e+12, 6.20557727146953693363e+14,
          6.87141087355300489866e+16, 3.97270608116560655612e+18)
_TWO_OVER_PI = 0.636619772367581343075535053490057448
_SQRT_TWO_OVER_PI = 0.797884560802865355879892119868763737
_PI_OVER_4 = 0.785398163397448309615660845819875721
_3PI_OVER_4 = 2.356194490192344928846982537459627163


def _bessel_asymptotic(x, pp, pq, qp, qq, phase, z, sine):
    """The x > 5 branch shared by J0/J1/Y0/Y1: z is 25/x^2 (order 0) or (5/x)*(5/x) (order 1)."""
    p = _horner(z, pp) / _horner(z, pq)
    q = _horner(z, qp) / _horner(z, qq)
    if sine:  # Y: p sin + (5/x) q cos
        out = p * jnp.sin(x - phase) + 5.0 / x * q * jnp.cos(x - phase)
    else:  # J: p cos - (5/x) q sin
        out = p * jnp.cos(x - phase) - 5.0 / x * q * jnp.sin(x - phase)
    return out * _SQRT_TWO_OVER_PI / jnp.sqrt(x)


def _bessel_j0(x):
    x = jnp.abs(x)
    xx = x * x
    small = (xx - 5.78318596294678452118e+00) * (xx - 3.04712623436620863991e+01) * _horner(xx, _J0_RP) / _horner(xx, _J0_RQ)
    small = jnp.where(x < 0.00001, 1.0 - xx / 4.0, small)
    large = _bessel_asymptotic(x, _J0_PP, _J0_PQ, _J0_QP, _J0_QQ, _PI_OVER_4, 25.0 / xx, sine=False)
    return jnp.where(x <= 5.0, small, large)


def _bessel_j1(x):
    xx = x * x
    # J1 is odd: the small branch's polynomial in x^2 times x holds for negative x as it is
    small = _horner(xx, _J1_RP) / _horner(xx, _J1_RQ) * x * (xx - 1.46819706421238932572e+01) * (xx - 4.92184563216946036703e+01)
    a = jnp.abs(x)
    large = _bessel_asymptotic(a, _J1_PP, _J1_PQ, _J1_QP, _J1_QQ, _3PI_OVER_4, 5.0 / a * (5.0 / a), sine=False)
    return jnp.where(a <= 5.0, small, jnp.where(x < 0, -large, large))


def _bessel_y0(x):
    xx = x * x
    small = _horner(xx, _Y0_YP) / _horner(xx, _Y0_YQ) + _TWO_OVER_PI * jnp.log(x) * _bessel_j0(x)
    small = jnp.where(x == 0, _full(x, -jnp.inf), jnp.where(x < 0, _full(x, jnp.nan), small))
    large = _bessel_asymptotic(x, _J0_PP, _J0_PQ, _J0_QP, _J0_QQ, _PI_OVER_4, 25.0 / xx, sine=True)
    return jnp.where(x <= 5.0, small, large)


def _bessel_y1(x):
    xx = x * x
    small = x * (_horner(xx, _Y1_YP) / _horner(xx, _Y1_YQ)) + _TWO_OVER_PI * (_bessel_j1(x) * jnp.log(x) - 1.0 / x)
    small = jnp.where(x == 0, _full(x, -jnp.inf), jnp.where(x < 0, _full(x, jnp.nan), small))
    large = _bessel_asymptotic(x, _J1_PP, _J1_PQ, _J1_QP, _J1_QQ, _3PI_OVER_4, 5.0 / x * (5.0 / x), sine=True)
    return jnp.where(x <= 5.0, small, large)


_I0_A = (-4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16,
         1.71539128555513303061e-15, -1.16853328779934516808e-14, 7.67618549860493561688e-14,
         -4.85644678311192946090e-13, 2.95505266312963983461e-12, -1.72682629144155570723e-11,
         9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-09,
         -1.30002500998624804212e-08, 6.04699502254191894932e-08, -2.67079385394061173391e-07,
         1.11738753912010371815e-06, -4.41673835845875056359e-06, 1.64484480707288970893e-05,
         -5.75419501008210370398e-05, 1.88502885095841655729e-04, -5.76375574538582365885e-04,
         1.63947561694133579842e-03, -4.32430999505057594430e-03, 1.05464603945949983183e-02,
         -2.37374148058994688156e-02, 4.93052842396707084878e-02, -9.49010970480476444210e-02,
         1.71620901522208775349e-01, -3.04682672343198398683e-01, 6.76795274409476084995e-01)
_I0_B = (-7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17,
         3.46122286769746109310e-17, -2.82762398051658348494e-16, -3.42548561967721913462e-16,
         1.77256013305652638360e-15, 3.81168066935262242075e-15, -9.55484669882830764870e-15,
         -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
         7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11,
         -3.14991652796324136454e-11, 1.18891471078464383424e-11, 4.94060238822496958910e-10,
         3.39623202570838634515e-09, 2.26666899049817806459e-08, 2.04891858946906374183e-07,
         2.89137052083475648297e-06, 6.88975834691682398426e-05, 3.36911647825569408990e-03,
         8.04490411014108831608e-01)
_I1_A = (2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
         -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
         3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
         -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-09,
         9.38153738649577178388e-09, -4.44505912879632808065e-08, 2.00329475355213526229e-07,
         -8.56872026469545474066e-07, 3.47025130813767847674e-06, -1.32731636560394358279e-05,
         4.78156510755005422638e-05, -1.61760815825896745588e-04, 5.12285956168575772895e-04,
         -1.51357245063125314899e-03, 4.15642294431288815669e-03, -1.05640848946261981558e-02,
         2.47264490306265168283e-02, -5.29459812080949914269e-02, 1.02643658689847095384e-01,
         -1.76416518357834055153e-01, 2.52587186443633654823e-01)
_I1_B = (7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
         -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
         -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
         4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
         -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
         3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
         -3.83538038596423702205e-09, -2.63146884688951950684e-08, -2.51223623787020892529e-07,
         -3.88256480887769039346e-06, -1.10588938762623716291e-04, -9.76109749136146840777e-03,
         7.78576235018280120474e-01)
_K0_A = (1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
         1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
         1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
         -5.35327393233902768720e-01)
_K0_B = (5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
         -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
         6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
         -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
         1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
         -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
         2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
         -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
         2.44030308206595545468e+00)
_K1_A = (-7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
         -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
         -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
         -3.53155960776544875667e-01, 1.52530022733894777053e+00)
_K1_B = (-5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
         1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
         -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
         3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
         -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
         2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
         -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
         1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
         2.72062619048444266945e+00)


def _modified_bessel_i0(x):
    a = jnp.abs(x)
    small = jnp.exp(a) * _chbevl(a / 2.0 - 2.0, _I0_A)
    large = jnp.exp(a) * _chbevl(32.0 / a - 2.0, _I0_B) / jnp.sqrt(a)
    return jnp.where(a <= 8.0, small, large)


def _modified_bessel_i1(x):
    a = jnp.abs(x)
    small = _chbevl(a / 2.0 - 2.0, _I1_A) * a * jnp.exp(a)
    large = jnp.exp(a) * _chbevl(32.0 / a - 2.0, _I1_B) / jnp.sqrt(a)
    out = jnp.where(a <= 8.0, small, large)
    return jnp.where(x < 0, -out, out)


def _k_domain(x, out):
    """K0/K1 (scaled or not): +inf at 0, NaN below."""
    return jnp.where(x == 0, _full(x, jnp.inf), jnp.where(x < 0, _full(x, jnp.nan), out))


def _modified_bessel_k0(x, scaled=False):
    small = _chbevl(x * x - 2.0, _K0_A) - jnp.log(0.5 * x) * _modified_bessel_i0(x)
    series = _chbevl(8.0 / x - 2.0, _K0_B)
    if scaled:
        small, large = small * jnp.exp(x), series / jnp.sqrt(x)
    else:
        large = jnp.exp(-x) * series / jnp.sqrt(x)
    return _k_domain(x, jnp.where(x <= 2.0, small, large))


def _modified_bessel_k1(x, scaled=False):
    small = jnp.log(0.5 * x) * _modified_bessel_i1(x) + _chbevl(x * x - 2.0, _K1_A) / x
    series = _chbevl(8.0 / x - 2.0, _K1_B)
    if scaled:
        small, large = small * jnp.exp(x), series / jnp.sqrt(x)
    else:
        large = jnp.exp(-x) * series / jnp.sqrt(x)
    return _k_domain(x, jnp.where(x <= 2.0, small, large))


def _spherical_bessel_j0(x):
    xx = x * x
    series = 1.0 + xx * (-1.0 / 6.0 + xx * (1.0 / 120.0 + xx * (-1.0 / 5040.0 + xx * (
        1.0 / 362880.0 + xx * (-1.0 / 39916800.0 + xx * (1.0 / 6227020800.0))))))
    out = jnp.where(jnp.abs(x) < 0.5, series, jnp.sin(x) / x)
    return jnp.where(jnp.isinf(x), _zero(x), out)


_AIRY_AN = (3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01,
            1.68089224934630576269e+02, 1.59756391350164413639e+02, 7.05360906840444183113e+01,
            1.40264691163389668864e+01, 9.99999999999999995305e-01)
_AIRY_AD = (5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01,
            1.77318088145400459522e+02, 1.64234692871529701831e+02, 7.14778400825575695274e+01,
            1.40959135607834029598e+01, 1.00000000000000000470e+00)
_AIRY_AFN = (-1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
             -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
             -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08)
_AIRY_AFD = (1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01,
             9.18707402907259625840e+00, 1.47529146771666414581e+00, 1.15687173795188044134e-01,
             4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07)
_AIRY_AGN = (1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00,
             9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
             5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
             8.11789239554389293311e-08, 3.41551784765923618484e-10)
_AIRY_AGD = (9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01,
             5.47686069422975497931e+00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
             4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
             4.91834570062930015649e-09)


def _airy_ai(x):
    inv_sqrt_pi = 5.64189583547756286948e-01
    # x < -2.09: the oscillating asymptotic expansion
    neg = jnp.where(x < -2.09, x, _full(x, -3.0))
    zeta = -2.0 * neg * jnp.sqrt(-neg) / 3.0
    z = 1.0 / zeta
    zz = z * z
    t = zeta + 0.25 * _m.pi
    oscillating = inv_sqrt_pi / jnp.sqrt(jnp.sqrt(-neg)) * (
        jnp.sin(t) * (1.0 + zz * _horner(zz, _AIRY_AFN) / _horner(zz, _AIRY_AFD))
        - jnp.cos(t) * (z * _horner(zz, _AIRY_AGN) / _horner(zz, _AIRY_AGD)))
    # x >= 2.09: the decaying asymptotic expansion
    pos = jnp.where(x >= 2.09, x, _full(x, 3.0))
    zeta = 2.0 * pos * jnp.sqrt(pos) / 3.0
    decaying = inv_sqrt_pi * (_horner(1.0 / zeta, _AIRY_AN) / _horner(1.0 / zeta, _AIRY_AD)) / (
        2.0 * jnp.sqrt(jnp.sqrt(pos)) * jnp.exp(zeta))
    # in between: the power series, summed until its terms stop mattering, per element
    s = jnp.where((x < -2.09) | (x >= 2.09), _zero(x), x)  # NaN stays: the series gives NaN, as on CPU
    eps = jnp.finfo(x.dtype).eps
    cube = s * s * s

    def body(state):
        f, g, k, m, n, t = state
        active = t > eps
        m1 = m * cube
        k1 = k + 1.0
        m1 = m1 / k1
        n1 = n * cube
        k1 = k1 + 1.0
        n1 = n1 / k1
        m1 = m1 / k1
        f1 = f + m1
        k1 = k1 + 1.0
        n1 = n1 / k1
        g1 = g + n1
        t1 = jnp.abs(m1 / f1)
        keep = lambda new, old: jnp.where(active, new, old)  # noqa: E731
        return keep(f1, f), keep(g1, g), keep(k1, k), keep(m1, m), keep(n1, n), keep(t1, t)

    one = jnp.ones_like(s)
    f, g, *_ = lax.while_loop(lambda st: jnp.any(st[5] > eps), body, (one, s, one, one, s, one))
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    out = jnp.where(x < -2.09, oscillating, jnp.where(x >= 2.09, decaying, series))
    out = jnp.where(x > 103.892, _zero(x), out)
    return jnp.where(jnp.isinf(x), _full(x, jnp.nan), out)


_SPECIAL_UNARY = {
    "special_airy_ai": _airy_ai,
    "special_bessel_j0": _bessel_j0,
    "special_bessel_j1": _bessel_j1,
    "special_bessel_y0": _bessel_y0,
    "special_bessel_y1": _bessel_y1,
    "special_modified_bessel_i0": _modified_bessel_i0,
    "special_modified_bessel_i1": _modified_bessel_i1,
    "special_modified_bessel_k0": _modified_bessel_k0,
    "special_modified_bessel_k1": _modified_bessel_k1,
    "special_scaled_modified_bessel_k0": lambda x: _modified_bessel_k0(x, scaled=True),
    "special_scaled_modified_bessel_k1": lambda x: _modified_bessel_k1(x, scaled=True),
    "special_spherical_bessel_j0": _spherical_bessel_j0,
}
# float32: our series, recurrences and asymptotic forms round differently from CPU's in a few ulps
_SPECIAL_TESTS = TestCases(tolerance=((torch.float32, 1e-5, 3e-4),))
for _name, _math in _SPECIAL_UNARY.items():
    globals()[_name] = define(_name, _math, kind=INT_TO_FLOAT, allowed="buif", half=False, tests=_SPECIAL_TESTS)


# Orthogonal polynomials P_n(x) with a tensor degree n: Math.h's special cases, closed forms
# and three-term recurrences. The degree arrives in the computation dtype and becomes an
# int64 as C++'s static_cast does on x86: NaN, infinities and out-of-range values give
# INT64_MIN, so degree 0 results.


def _degree(n):
    valid = jnp.isfinite(n) & (jnp.abs(n) < 2.0 ** 63)
    return jnp.where(valid, jnp.trunc(jnp.where(valid, n, 0)).astype(jnp.int64), jnp.int64(-1))


def _recurrence(p, q, steps, step, stop_at_nan=True):
    """Run (p, q) <- (q, step(i, p, q)) for i = 0, 1, ... while i < steps (elementwise), and,
    where stop_at_nan, while q is not NaN (Math.h's `&& !std::isnan(q)`); returns q."""

    def active(i, q):
        running = i < steps
        return running & ~jnp.isnan(q) if stop_at_nan else running

    def body(state):
        i, p, q = state
        on = active(i, q)
        r = step(i, p, q)
        return i + 1, jnp.where(on, q, p), jnp.where(on, r, q)

    _, _, q = lax.while_loop(lambda st: jnp.any(active(st[0], st[2])), body, (jnp.int64(0), p, q))
    return q


def _as(x, value):
    """An int64 (or Python) value in x's dtype (C++'s implicit int64 -> T conversion)."""
    return jnp.asarray(value).astype(x.dtype)


def _chebyshev(kind, x, n, shifted=False):
    """Chebyshev T, U, V, W and their shifted forms (argument 2x - 1)."""
    k = _degree(n)
    y = x + x - 1.0 if shifted else x
    even = k % 2 == 0
    one, minus_one = jnp.ones_like(x), -jnp.ones_like(x)
    n1, n21 = _as(x, k + 1), _as(x, k + k + 1)
    # the ends of the interval: |x| == 1 (shifted: x == 1 and x == 0)
    at_top = (x == 1.0) if shifted else (jnp.abs(x) == 1.0) & (x > 0)
    at_bottom = (x == 0.0) if shifted else (jnp.abs(x) == 1.0) & ~(x > 0)
    top = {"t": one, "u": n1, "v": one, "w": n21}[kind]
    bottom = {"t": jnp.where(even, one, minus_one), "u": jnp.where(even, n1, -n1),
              "v": jnp.where(even, n21, -n21), "w": jnp.where(even, one, minus_one)}[kind]
    # inside the interval, past a small degree: the trigonometric closed form
    above = {"t": 6, "u": 8, "v": 8, "w": 8}[kind] if not shifted else {"t": 6, "u": 6, "v": 6, "w": 4}[kind]
    inside = (k > above) & (jnp.abs(y) < 1.0)
    theta = jnp.arccos(jnp.where(inside, y, _zero(x)))
    half = _as(x, k) + 0.5
    if kind == "t":
        closed = jnp.cos(_as(x, k) * theta)
    elif kind == "u":
        closed = jnp.where(jnp.sin(theta) != 0, jnp.sin(n1 * theta) / jnp.sin(theta), n1 * jnp.cos(n1 * theta) / y)
    elif kind == "v":
        closed = jnp.where(jnp.sin(theta / 2.0) != 1.0, jnp.cos(half * theta) / jnp.cos(theta / 2.0),
                           jnp.where(even, n21, -n21))
    else:
        degenerate = jnp.where(even, one, minus_one)
        if not shifted:
            degenerate = jnp.where(x > 0, n21, degenerate)
        closed = jnp.where(jnp.cos(theta / 2.0) != 1.0, jnp.sin(half * theta) / jnp.sin(theta / 2.0), degenerate)
    first = {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]  # P_1
    general = ~((k < 0) | at_top | at_bottom | inside)
    two_y = y + y
    recur = _recurrence(one, first, jnp.where(general, k - 1, 0), lambda i, p, q: two_y * q - p)
    out = jnp.where(k == 1, first, recur)
    out = jnp.where(k == 0, one, out)
    out = jnp.where(inside, closed, out)
    out = jnp.where(at_bottom, bottom, jnp.where(at_top, top, out))
    return jnp.where(k < 0, _zero(x), out)


def _hermite_limit(x) -> int:
    return 128 if x.dtype == np.float32 else 512


def _hermite_polynomial_h(x, n):
    k = _degree(n)
    two_x = x + x
    steps = jnp.where((k > 1) & (k <= _hermite_limit(x)), k - 1, 0)
    recur = _recurrence(jnp.ones_like(x), two_x, steps, lambda i, p, q: two_x * q - _as(x, 2 * i + 2) * p,
                        stop_at_nan=False)
    out = jnp.where(k > _hermite_limit(x), _full(x, jnp.nan), recur)
    out = jnp.where(k == 1, two_x, jnp.where(k == 0, jnp.ones_like(x), out))
    return jnp.where(k < 0, _zero(x), out)


def _hermite_polynomial_he(x, n):
    k = _degree(n)
    steps = jnp.where((k > 1) & (k <= _hermite_limit(x)), k - 1, 0)
    recur = _recurrence(jnp.ones_like(x), x, steps, lambda i, p, q: x * q - _as(x, i + 1) * p, stop_at_nan=False)
    out = jnp.where(k > _hermite_limit(x), _full(x, jnp.nan), recur)
    out = jnp.where(k == 1, x, jnp.where(k == 0, jnp.ones_like(x), out))
    return jnp.where(k < 0, _zero(x), out)


def _laguerre_polynomial_l(x, n):
    k = _degree(n)
    one_minus_x = 1.0 - x

    def step(i, p, q):
        j = _as(x, i + 1)
        return (((j + j) + one_minus_x) * q - j * p) / (j + 1.0)

    general = (k > 1) & (jnp.abs(x) != 0)
    recur = _recurrence(jnp.ones_like(x), one_minus_x, jnp.where(general, k - 1, 0), step)
    out = jnp.where(k == 1, one_minus_x, recur)
    out = jnp.where((k == 0) | (jnp.abs(x) == 0), jnp.ones_like(x), out)
    return jnp.where(k < 0, _zero(x), out)


def _legendre_polynomial_p(x, n):
    k = _degree(n)

    def step(i, p, q):
        j = _as(x, i + 1)
        return ((j + j + 1.0) * x * q - j * p) / (j + 1.0)

    ends = jnp.abs(x) == 1.0
    recur = _recurrence(jnp.ones_like(x), x, jnp.where((k > 1) & ~ends, k - 1, 0), step)
    out = jnp.where(k == 1, x, jnp.where(k == 0, jnp.ones_like(x), recur))
    out = jnp.where(ends, jnp.where((x > 0) | (k % 2 == 0), jnp.ones_like(x), -jnp.ones_like(x)), out)
    return jnp.where(k < 0, _zero(x), out)


_POLYNOMIALS = {
    "special_chebyshev_polynomial_t": lambda x, n: _chebyshev("t", x, n),
    "special_chebyshev_polynomial_u": lambda x, n: _chebyshev("u", x, n),
    "special_chebyshev_polynomial_v": lambda x, n: _chebyshev("v", x, n),
    "special_chebyshev_polynomial_w": lambda x, n: _chebyshev("w", x, n),
    "special_shifted_chebyshev_polynomial_t": lambda x, n: _chebyshev("t", x, n, shifted=True),
    "special_shifted_chebyshev_polynomial_u": lambda x, n: _chebyshev("u", x, n, shifted=True),
    "special_shifted_chebyshev_polynomial_v": lambda x, n: _chebyshev("v", x, n, shifted=True),
    "special_shifted_chebyshev_polynomial_w": lambda x, n: _chebyshev("w", x, n, shifted=True),
    "special_hermite_polynomial_h": _hermite_polynomial_h,
    "special_hermite_polynomial_he": _hermite_polynomial_he,
    "special_laguerre_polynomial_l": _laguerre_polynomial_l,
    "special_legendre_polynomial_p": _legendre_polynomial_p,
}
for _name, _math in _POLYNOMIALS.items():
    _packet = getattr(aten, _name)
    globals()[_name] = define(_name, _math, kind=INT_TO_FLOAT, allowed="buif", half=False,
                              ops=(_packet.default, _packet.x_scalar, _packet.n_scalar), tests=_SPECIAL_TESTS)


# ---------------------------------------------------------------------------------------
# activations and their backward ops


def activation(name, math, allowed="f", ops=None, static=(), tests=NO_TEST_CASES, scalar_fits=()):
    """An activation over (tensor operands..., Scalar arguments...): the tensors are promoted
    together and the Scalars (slopes, thresholds) cast to the computation dtype. `static`:
    Scalars whose value torch checks (the meta kernel sees them only when concrete);
    `scalar_fits`: as the table's trait."""

    ops = ops if ops is not None else (getattr(aten, name).default,)
    n_tensors = Signature.of(ops[0]).kinds.count(TENSOR)

    def fn(*args):
        return pointwise(math, *args[:n_tensors], name=name, allowed=allowed, scalars=args[n_tensors:])

    fn.__name__ = fn.__qualname__ = name
    lowering(*ops, static=static, tests=tests, scalar_fits=scalar_fits)(fn)
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


_NAN_BY_SIZE = TestCases(nan_input_by_size=True)  # see TestCases: CPU's NaN gradient depends on size


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


elu = activation("elu", _elu, scalar_fits=("alpha", "scale", "input_scale"))


# CPU's backward kernels refuse a negative slope when they get the forward's result (an in-place
# forward: elu_, celu_, leaky_relu_, rrelu_), which cannot be inverted there; the slope is traced, so
# the host checks it and CPU torch names the error
def _negative_slope_of_a_result(slope: int, is_result: int):
    """An `in_range` over the schema positions of the slope and the is-result flag."""
    def in_range(values) -> bool:
        return not values[is_result] or values[slope] >= 0
    return in_range


@lowering(aten.elu_backward.default, tests=_NAN_BY_SIZE, in_range=_negative_slope_of_a_result(1, 4),
          scalar_fits=("alpha", "scale", "input_scale"))
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    def math(g, y, alpha, scale, input_scale):
        if is_result:
            neg = g * input_scale * (y + alpha * scale)
        else:
            neg = g * input_scale * (alpha * scale) * jnp.exp(y * input_scale)
        return jnp.where(y > 0, g * scale, neg)  # NaN: the negative branch, NaN

    return pointwise(math, grad_output, self_or_result, name="elu_backward", allowed="f",
                     scalars=(alpha, scale, input_scale))


@lowering(aten.celu.default, scalar_fits="alpha")
def celu(self, alpha=1.0):
    return pointwise(lambda x, a, inv: _elu(x, a, 1, inv), self, name="celu", allowed="f", scalars=(alpha, 1.0 / alpha))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
selu = activation("selu", lambda x: _elu(x, _SELU_ALPHA, _SELU_SCALE, 1.0))

leaky_relu = activation("leaky_relu", lambda x, slope: jnp.where(x > 0, x, x * slope), scalar_fits="negative_slope")


@lowering(aten.leaky_relu_backward.default, in_range=_negative_slope_of_a_result(2, 3), scalar_fits="negative_slope")
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    return pointwise(lambda g, x, s: jnp.where(x > 0, g, g * s), grad_output, self,
                     name="leaky_relu_backward", allowed="f", scalars=(negative_slope,))


# uint8 as on CPU; the limits static: CPU refuses negative ones for uint8 (its meta kernel checks)
hardtanh = activation("hardtanh", _clamp, allowed="uif", static=("min_val", "max_val"),
                      scalar_fits=("min_val", "max_val"))
hardtanh_backward = activation(
    "hardtanh_backward", lambda g, x, lo, hi: jnp.where((x > lo) & (x < hi), g, _zero(g)),
    tests=_NAN_BY_SIZE, scalar_fits=("min_val", "max_val"))  # NaN x: 0
hardsigmoid = activation("hardsigmoid", lambda x: jnp.clip(x + 3, 0, 6) / 6)
hardsigmoid_backward = activation(
    "hardsigmoid_backward", lambda g, x: jnp.where((x > -3) & (x < 3), g * (1 / 6), _zero(g)))
hardswish = activation("hardswish", lambda x: x * jnp.clip(x + 3, 0, 6) / 6)
hardswish_backward = activation(
    "hardswish_backward",
    lambda g, x: jnp.where(x <= -3, _zero(g), jnp.where(x >= 3, g, g * (x / 3 + 0.5))), tests=_NAN_BY_SIZE)  # NaN x: NaN
softplus = activation(
    "softplus", lambda x, beta, th: jnp.where(x * beta > th, x, jnp.log1p(jnp.exp(x * beta)) / beta),
    scalar_fits=("beta", "threshold"))


def _softplus_backward(g, x, beta, threshold):
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, g, g * z / (z + 1))


softplus_backward = activation("softplus_backward", _softplus_backward, scalar_fits=("beta", "threshold"))
mish = activation("mish", lambda x: x * jnp.tanh(jnp.log1p(jnp.exp(x))))


def _mish_backward(g, x):
    tanh_softplus = jnp.tanh(jnp.log1p(jnp.exp(x)))
    return g * (tanh_softplus + x * _sigmoid(x) * (1 - tanh_softplus * tanh_softplus))


mish_backward = activation("mish_backward", _mish_backward)


@lowering(aten.threshold.default, scalar_fits=("threshold", "value"))
def threshold(self, threshold, value):
    # torch compares and replaces in self's dtype (the Scalars do not promote)
    return pointwise(lambda x, th, v: jnp.where(x <= th, v, x), self, name="threshold", allowed="uif",
                     scalars=(threshold, value))


@lowering(aten.threshold_backward.default, scalar_fits="threshold")
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


@lowering(aten._prelu_kernel_backward.default, padding=None,
          not_paddable="no padding rule yet: the weight's gradient sums over the elements")
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


@lowering(aten.glu.default, padding=None, not_paddable="it halves `dim`: a padded dim would split at the bucket's middle")
def glu(self, dim=-1):
    _, (a, b) = _halves("glu", self, dim)
    return pointwise(lambda a, b: a * _sigmoid(b), a, b, name="glu", allowed="f")


@lowering(aten.glu_backward.default, padding=None,
          not_paddable="it halves `dim`: a padded dim would split at the bucket's middle")
def glu_backward(grad_output, self, dim):
    dim, (a, b) = _halves("glu", self, dim)

    def math(g, a, b):
        s = _sigmoid(b)
        return jnp.concatenate([s * g, (1 - s) * s * a * g], axis=dim)

    return pointwise(math, grad_output, a, b, name="glu_backward", allowed="f")


hardshrink = activation(
    "hardshrink", lambda x, lambd: jnp.where((x >= -lambd) & (x <= lambd), _zero(x), x), scalar_fits="lambd")
hardshrink_backward = activation(
    "hardshrink_backward", lambda g, x, lambd: jnp.where((x < -lambd) | (x > lambd), g, _zero(g)),
    tests=_NAN_BY_SIZE, scalar_fits="lambd")  # NaN x: 0
softshrink = activation(  # lambd static: torch requires 0 <= lambd <= the dtype's max (its meta kernel checks)
    "softshrink",
    lambda x, lambd: jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0)), static=("lambd",))
softshrink_backward = activation(
    "softshrink_backward", lambda g, x, lambd: jnp.where((x < -lambd) | (x > lambd), g, _zero(g)),
    tests=_NAN_BY_SIZE, scalar_fits="lambd")  # NaN x: 0


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
