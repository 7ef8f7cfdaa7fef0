"""Every op-table entry with Scalar arguments, each Scalar out of its dtype's range (int8 300,
float16 1e6, float32 1e39, a complex value into a real dtype, NaN into an integer one...): pjrt
raises what CPU raises ("value cannot be converted to type int8_t without overflow") or computes
what CPU computes. Such calls wrapped, saturated or clamped nothing, silently (issue 32); an
entry's `scalar_fits` names the Scalars CPU converts. New entries are covered by construction."""
from __future__ import annotations

import functools
import warnings

import pytest
import torch

from torch_pjrt.ops.registry import LOWERINGS

# (dtype of the tensors, the value of every Scalar)
OUT_OF_RANGE = [(torch.int8, 300), (torch.float16, 1e6), (torch.uint8, -1000), (torch.float32, 1e39),
                (torch.bfloat16, 1e39), (torch.int8, 2.5), (torch.int64, 1 + 1j), (torch.float32, 1 + 1j),
                (torch.int16, float("nan")), (torch.bool, 5)]

# Where pjrt computes what CPU refuses, by decision (each with its reason)
COMPUTED_BY_DECISION = {
    # CUDA has integer histc: CUDA's behaviour is the default answer (errors.py, the dtype table)
    ("aten.histc.default", torch.int8), ("aten.histc.default", torch.uint8), ("aten.histc.default", torch.int16),
    ("aten.histc.default", torch.int64),
}
KNOWN_DIFFERENCES = {
    # CPU's searchsorted has no complex kernel and refuses a complex Scalar; pjrt compares its
    # real part. Not a value anyone passes; left as it is.
    ("aten.bucketize.Scalar", torch.int64), ("aten.bucketize.Scalar", torch.float32),
    ("aten.searchsorted.Scalar", torch.int64), ("aten.searchsorted.Scalar", torch.float32),
}
# Both compute, and the values at an order or exponent that overflows float32 differ (CPU's
# vector_norm of [1, 2, 3] with ord=1e39 is 1.0, pjrt's inf; CPU's zeta(1e39, [1, 2, 3]) is
# [1, nan, nan], pjrt's all nan): no defined value to agree on, only that both compute
VALUES_UNDEFINED = {"aten.linalg_vector_norm.default", "aten.norm.Scalar", "aten.special_zeta.self_scalar",
                    "aten._foreach_norm.Scalar"}


def _is_scalar(argument) -> bool:
    return str(argument.type) in ("number", "Scalar")


def _ops() -> list:
    return sorted((op for op in LOWERINGS if any(_is_scalar(a) for a in op._schema.arguments)
                   and not op._schema.is_mutable and "out" not in op._overloadname), key=str)


def _is_factory(op) -> bool:
    """No tensor argument; the result's dtype and device are keyword arguments (full, linspace)."""
    return not any("Tensor" in str(a.type) for a in op._schema.arguments)


def _arguments(op, dtype, value, device):
    """The op's leading positional arguments: tensors [1, 2, 3] in `dtype`, every Scalar `value`,
    dims 0 (a factory's sizes and counts 3, and its dtype and device as keywords); None where a
    required argument is of another kind."""
    if _is_factory(op):
        neutral = {"int": 3, "List[int]": [3], "SymInt": 3, "List[SymInt]": [3]}
        args = [value if _is_scalar(a) else neutral[str(a.type)] for a in op._schema.arguments
                if not a.kwarg_only and not a.has_default_value()]
        return functools.partial(op, dtype=dtype, device=device), args
    args, keywords = [], {}
    for a in op._schema.arguments:
        if a.kwarg_only and a.has_default_value():
            continue
        if a.kwarg_only and str(a.type) in _NEUTRAL:  # div.Scalar_mode's rounding_mode
            keywords[a.name] = _NEUTRAL[str(a.type)]
        elif str(a.type) == "Tensor" and not a.has_default_value():
            args.append(torch.tensor([1, 2, 3], device=device).to(dtype))
        elif str(a.type) == "List[Tensor]":
            args.append([torch.tensor([1, 2, 3], device=device).to(dtype)])
        elif _is_scalar(a):
            args.append(value)
        elif a.has_default_value():
            break
        elif str(a.type) in _NEUTRAL:
            args.append(_NEUTRAL[str(a.type)])
        else:
            return None
    return functools.partial(op, **keywords), args


# a required argument of another kind: a value every such op takes for a 1-d tensor
_NEUTRAL = {"int": 0, "SymInt": 0, "List[int]": [0], "List[SymInt]": [0], "bool": False, "Optional[Tensor]": None,
            "str": "floor", "Optional[str]": "floor"}


def _outcome(call):
    if call is None:
        return None
    op, args = call
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = op(*args)
            torch.pjrt.synchronize()
    except Exception as e:  # noqa: BLE001  (the outcome compared is the exception)
        return type(e), str(e).split("\n")[0]
    results = result if isinstance(result, (tuple, list)) else [result]
    return [r.cpu() for r in results if isinstance(r, torch.Tensor)]


@pytest.mark.parametrize("op", _ops(), ids=str)
def test_a_scalar_out_of_its_dtypes_range_does_what_cpu_does(op):
    checked = 0
    for dtype, value in OUT_OF_RANGE:
        cpu_call = _arguments(op, dtype, value, "cpu")
        if cpu_call is None:
            pytest.skip(f"{op} takes a required argument that is neither a tensor nor a Scalar")
        if (str(op), dtype) in KNOWN_DIFFERENCES:
            continue
        expected, got = _outcome(cpu_call), _outcome(_arguments(op, dtype, value, "pjrt"))
        case = f"{op}({dtype}, {value})"
        if isinstance(expected, tuple):
            if (str(op), dtype) in COMPUTED_BY_DECISION:
                assert isinstance(got, list), case
                continue
            assert got == expected, f"{case}: CPU raises {expected}, pjrt gave {got}"
        else:
            assert isinstance(got, list), f"{case}: CPU computes, pjrt raised {got}"
            assert len(got) == len(expected), case
            for g, e in zip(got, expected) if str(op) not in VALUES_UNDEFINED else ():
                torch.testing.assert_close(g, e, equal_nan=True, msg=case)
        checked += 1
    assert checked
