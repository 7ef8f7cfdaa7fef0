"""Foreach lowerings against CPU torch: every functional `_foreach_*` overload, over lists
of mixed shapes and dtypes, each list op one executable."""
from __future__ import annotations

import pytest
import torch

from tests.ops.harness import check
from tests.ops.test_elementwise import check_or_raise, low_precision_tol, make
from torch_pjrt.ops.registry import LOWERINGS

aten = torch.ops.aten
nan, inf = float("nan"), float("inf")


def tensors(dtype, seed=0, nonzero=False, special=True):
    """A list of differently shaped tensors (including 0-d) of one dtype."""
    return [make(dtype, shape=s, seed=seed + i, nonzero=nonzero, special=special)
            for i, s in enumerate([(3, 4), (7,), (), (2, 1, 3)])]


MIXED = [make(torch.float32, shape=(3, 4)), make(torch.float64, shape=(5,), seed=1),
         make(torch.bfloat16, shape=(2, 2), seed=2), make(torch.int64, shape=(4,), seed=3)]
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64)

UNARY = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
         "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign",
         "sin", "sinh", "sqrt", "tan", "tanh", "trunc"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", UNARY)
def test_unary(name, dtype):
    xs = tensors(dtype)
    check_or_raise(getattr(aten, f"_foreach_{name}").default, xs, tol=low_precision_tol(*xs))


def test_unary_mixed_dtypes():
    for name in ("exp", "neg", "sqrt", "sign"):
        check_or_raise(getattr(aten, f"_foreach_{name}").default, MIXED, tol=low_precision_tol(*MIXED))


BINARY = ["add", "sub", "mul", "div", "clamp_min", "clamp_max", "maximum", "minimum", "pow"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", BINARY)
def test_binary_variants(name, dtype):
    packet = getattr(aten, f"_foreach_{name}")
    xs, ys = tensors(dtype, seed=1), tensors(dtype, seed=20, nonzero=True)
    tol = low_precision_tol(*xs)
    check_or_raise(packet.List, xs, ys, tol=tol)
    for s in (2, -1.5, nan):
        check_or_raise(packet.Scalar, xs, s, tol=tol)
    check_or_raise(packet.ScalarList, xs, [2, -1.5, 0.5, 3], tol=tol)
    if "Tensor" in packet.overloads():
        check_or_raise(packet.Tensor, xs, torch.tensor(2.5), tol=tol)
        check_or_raise(packet.Tensor, xs, torch.tensor(3, dtype=dtype), tol=tol)


def test_alpha_and_mixed_lists():
    ys = [make(torch.float32, shape=(3, 4), seed=9), make(torch.float32, shape=(5,), seed=10),
          make(torch.bfloat16, shape=(2, 2), seed=11), make(torch.int32, shape=(4,), seed=12)]
    for alpha in (1, 2, -3):
        check(aten._foreach_add.List, MIXED, ys, alpha=alpha, **low_precision_tol(*MIXED))
        check(aten._foreach_sub.List, MIXED, ys, alpha=alpha, **low_precision_tol(*MIXED))
        check(aten._foreach_add.Tensor, MIXED, torch.tensor(0.5), alpha=alpha, **low_precision_tol(*MIXED))
    check(aten._foreach_mul.Scalar, [torch.tensor([1, 2])], 2.5)  # int * float Scalar -> float32
    check(aten._foreach_div.ScalarList, MIXED, [2, 3, 4, 5], **low_precision_tol(*MIXED))
    check_or_raise(aten._foreach_add.List, MIXED, ys[:2])  # lists of different lengths


def test_pow_scalar_and_tensor():
    xs = tensors(torch.float32, seed=3)
    for s in (2, 0.5, 1, -1.5):
        check(aten._foreach_pow.ScalarAndTensor, s, xs)
    check(aten._foreach_pow.ScalarAndTensor, 2, tensors(torch.int64, seed=4))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.bfloat16), ids=str)
def test_lerp(dtype):
    xs, ys = tensors(dtype, seed=1, special=False), tensors(dtype, seed=2)
    ws = [torch.rand(x.shape, generator=torch.Generator().manual_seed(i)).to(dtype) for i, x in enumerate(xs)]
    check(aten._foreach_lerp.List, xs, ys, ws)
    for w in (0.25, 0.75, -1.0, True, False, 2):  # test_foreach's test_lerp: a bool weight (pjrt took it for a tensor)
        check(aten._foreach_lerp.Scalar, xs, ys, w)
    check(aten._foreach_lerp.ScalarList, xs, ys, [0.1, 0.6, 1.0, -2.0])
    check(aten._foreach_lerp.ScalarList, xs, ys, [True, False, 3, 0.5])


@pytest.mark.parametrize("name", ("addcmul", "addcdiv"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.bfloat16, torch.int64), ids=str)
def test_addcmul_addcdiv(name, dtype):
    packet = getattr(aten, f"_foreach_{name}")
    xs, t1, t2 = tensors(dtype, seed=1), tensors(dtype, seed=2), tensors(dtype, seed=3, nonzero=True)
    tol = low_precision_tol(*xs)
    check_or_raise(packet.Scalar, xs, t1, t2, tol=tol)
    check_or_raise(packet.Scalar, xs, t1, t2, -0.5 if dtype.is_floating_point else 3, tol=tol)
    check_or_raise(packet.ScalarList, xs, t1, t2, [1, 2, -3, 4], tol=tol)
    check_or_raise(packet.Tensor, xs, t1, t2, torch.tensor([1.0, 0.5, -2.0, 3.0]), tol=tol)


@pytest.mark.parametrize("ord", (2, 1, 0, 3, 0.5, inf, -inf))
def test_norm_and_powsum(ord):
    xs = [make(torch.float32, shape=(3, 4), special=False), make(torch.float64, shape=(5,), seed=1),
          make(torch.bfloat16, shape=(2, 3), seed=2, special=False), torch.tensor([0.0, -2.0, 0.0, 1.5]),
          torch.tensor(-3.0)]
    check(aten._foreach_norm.Scalar, xs, ord, **low_precision_tol(*xs))
    check(aten._foreach_powsum.Scalar, xs, ord, **low_precision_tol(*xs))
    check(aten._foreach_norm.Scalar, xs, ord, dtype=torch.float64)
    check(aten._foreach_norm.Scalar, [torch.tensor([3 + 4j, 1j])], ord)


def test_norm_rejects_integers():
    check_or_raise(aten._foreach_norm.Scalar, [torch.tensor([1, 2])], 2)


def test_max_clone_copy_zero():
    xs = tensors(torch.float32, seed=5, special=False) + [torch.tensor([1.0, nan]), make(torch.int32, shape=(3,))]
    check(aten._foreach_max.default, xs)
    check(aten._foreach_clone.default, xs)
    check(aten._foreach_zero.default, xs)
    src = [torch.tensor(1.5), torch.arange(7), torch.tensor(True), torch.ones(1, 3, dtype=torch.float64),
           torch.tensor([9.0, 8.0]), torch.tensor([7.5, -2.5, 3.0])]
    check(aten._foreach_copy.default, xs, src)


def test_mm():
    a = [make(torch.float32, shape=(3, 4), special=False), make(torch.float64, shape=(2, 2), seed=1, special=False)]
    b = [make(torch.float32, shape=(4, 5), seed=2, special=False), make(torch.float64, shape=(2, 3), seed=3, special=False)]
    check(aten._foreach_mm.default, a, b, atol=1e-5, rtol=1e-5)


def test_foreach_is_one_executable():
    # the whole list traces into a single jaxpr: one executable per call, not one per tensor
    import jax

    from torch_pjrt.ops.foreach import LOWERINGS
    fn = LOWERINGS[aten._foreach_add.List].fn
    xs = [jax.numpy.ones((3,)), jax.numpy.ones((2, 2))]
    jaxpr = jax.make_jaxpr(lambda a, b: fn(a, b, alpha=2))(xs, xs)
    assert len(jaxpr.jaxpr.outvars) == 2 and not any(e.primitive.name == "pjit" for e in jaxpr.eqns)


def test_foreach_pow_by_a_number_is_static_as_pow():
    """_foreach_pow's number exponent is static as pow's (its entry takes the elementwise entry's
    traits): torch's formula for the value is picked while tracing, no conditional in the program."""
    entry = LOWERINGS[torch.ops.aten._foreach_pow.Scalar]
    assert entry.static == LOWERINGS[torch.ops.aten.pow.Tensor_Scalar].static == {"exponent"}
    xs = [torch.rand(5) + 0.1, torch.rand(2, 3) + 0.1]
    for exponent in (2, 0.5, 1.7):
        got = torch._foreach_pow([x.to("pjrt") for x in xs], exponent)
        for actual, expected in zip(got, torch._foreach_pow(xs, exponent)):
            torch.testing.assert_close(actual.cpu(), expected, rtol=1e-6, atol=0)
