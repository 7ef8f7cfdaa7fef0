"""The op table describes each op once: its entry carries every trait a consumer reads.

Padding: every lowering names its padding rule (compiler/padding.py) or says why a graph
holding it runs at exact sizes; every elementwise lowering compiles with dynamic=True into
bucketed executables only (results equal eager CPU).
"""
from __future__ import annotations

import pytest
import torch

import torch_pjrt.compiler  # noqa: F401
from torch_pjrt.compiler import compile_stats, padding, reset_compile_stats
from torch_pjrt.ops.registry import LOWERINGS, POINTWISE

aten = torch.ops.aten


def test_every_lowering_is_paddable_or_says_why_not():
    unexplained = sorted(str(op) for op, l in LOWERINGS.items() if l.padding is None and not l.not_paddable)
    assert not unexplained, f"lowerings with neither a padding rule nor a reason: {unexplained}"
    unknown = sorted(f"{op}: {l.padding.rule}" for op, l in LOWERINGS.items()
                     if l.padding is not None and l.padding.rule not in padding.RULES)
    assert not unknown, f"padding rules the compiler does not have: {unknown}"


def _unary_float_ops() -> list:
    """Elementwise lowerings over one float tensor alone (aten.<name>.default(self))."""
    ops = []
    for op, l in LOWERINGS.items():
        args = op._schema.arguments
        if (l.padding is POINTWISE and op._overloadname == "default" and len(args) == 1
                and str(args[0].type) == "Tensor" and not op._schema.name.endswith("_")):
            ops.append(op)
    return sorted(ops, key=str)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _bucketed_only(op, lengths) -> None:
    torch._dynamo.reset()
    reset_compile_stats()
    fn = torch.compile(lambda x: _first(op(x)) * 2, backend="pjrt", dynamic=True)
    for n in lengths:
        x = torch.rand(n, dtype=torch.float64) * 0.8 + 0.1  # inside every op's domain (acos, atanh, logit, ...)
        try:
            expected = _first(op(x)) * 2
        except RuntimeError:  # an integer-only op (bitwise_not)
            x = torch.arange(n) - 2
            expected = _first(op(x)) * 2
        torch.testing.assert_close(fn(x.to("pjrt")).cpu(), expected, equal_nan=True)
    graphs = compile_stats()["dynamic_graphs"]
    assert graphs and all(g["bucketed"] for g in graphs), (op, graphs)


# The ops that once had neither torch's pointwise tag nor a padding rule: made by the same
# helpers as their tagged siblings, they built one executable per length.
ONCE_UNPADDED = [aten.hardswish.default, aten.hardsigmoid.default, aten.relu.default, aten.silu.default]


@pytest.mark.parametrize("op", ONCE_UNPADDED, ids=str)
def test_elementwise_ops_compile_bucketed(op):
    _bucketed_only(op, (5, 6, 7, 9))


@pytest.mark.slow
@pytest.mark.parametrize("op", _unary_float_ops(), ids=str)
def test_every_unary_elementwise_op_compiles_bucketed(op):
    _bucketed_only(op, (5, 7, 9))


def test_traits_read_by_eager_and_the_tests_are_well_formed():
    # a decomposition serves eager in place of a kernel: eager registers none for its op, whose calls
    # reach the boxed fallback (eager/fallback.py)
    torch.ones(1, device="pjrt")  # the eager kernels are registered
    redirected = [op for op, l in LOWERINGS.items() if l.decomposition is not None]
    assert aten.native_batch_norm.default in redirected
    assert not any(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1") for op in redirected)
    for op, l in LOWERINGS.items():
        for dtype, atol, rtol in l.tests.tolerance:
            assert isinstance(dtype, torch.dtype) and atol >= 0 and rtol >= 0, op
        assert l.tests.tolerance_for(torch.float64) == {} or any(d == torch.float64 for d, *_ in l.tests.tolerance)
        # a split argument (traced value, static part) is one of the schema's, and neither traced nor static besides
        names = [a.name for a in op._schema.arguments]
        for name, rule in l.split:
            assert name in names and name not in l.traced and name not in l.static and callable(rule), (op, name)
