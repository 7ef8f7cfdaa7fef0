"""OpInfo samples with an out= tensor of another dtype than the op's result: pjrt raises what CPU
raises or writes what CPU writes. CPU's rules differ by op: most compute in the op's dtype and cast
into out where `can_cast` allows, some want out's exact dtype (mm, sort, max.dim), and reductions
(sum, cumsum, prod) compute into an integer out of a float input; torch's meta kernels tell none of
this apart, so a kernel that guesses refuses or computes where CPU does the other (issue 32)."""
from __future__ import annotations

import itertools
import warnings
import zlib

import pytest
import torch
from torch.utils._pytree import tree_map
from torch.testing._internal.common_methods_invocations import op_db

from tests.ops.harness import first_difference

# One of each kind CPU's rules tell apart (wider float, integer, bool, complex): float16 and int32 outs
# follow float64's and int64's rules, at a third more run time.
OUT_DTYPES = (torch.float64, torch.int64, torch.bool, torch.complex64)
PARTS = 2  # the sweep in parts, which pytest-xdist runs side by side
INPUT_DTYPES = (torch.float32, torch.int64)
# Ops whose values come from a generator: the outcome compared is the out tensor, not its values.
RANDOM = {"bernoulli", "normal", "normal_number_mean", "multinomial", "randint", "rand", "randn",
          "nn.functional.dropout"}


def _on(device):
    return lambda x: x.to(device) if isinstance(x, torch.Tensor) else x


def _outcome(info, sample, out, device):
    """The exception (type and first line), or the out tensors on the CPU with whether the call
    returned them."""
    to = _on(device)
    try:
        returned = info.op(tree_map(to, sample.input), *tree_map(to, sample.args), **tree_map(to, sample.kwargs), out=out)
        torch.pjrt.synchronize()
    except Exception as e:  # noqa: BLE001  (the outcome compared is the exception)
        return type(e), str(e).split("\n")[0]
    outs = out if isinstance(out, tuple) else (out,)
    returned = returned if isinstance(returned, tuple) else (returned,)
    same = len(returned) == len(outs) and all(r is o for r, o in zip(returned, outs))
    return same, [o.cpu() for o in outs]


def _difference(expected, got, random: bool) -> str | None:
    if isinstance(expected, tuple) and isinstance(expected[0], type) or isinstance(got, tuple) and isinstance(got[0], type):
        return None if expected == got else "outcome"
    (cpu_returns_out, cpu_outs), (pjrt_returns_out, pjrt_outs) = expected, got
    if cpu_returns_out != pjrt_returns_out:
        return "returned tensor is not out"
    # integer outs exactly: sum([0.6, 0.6, 0.6]) is 0 in CPU's int64 out, not 1
    return first_difference(cpu_outs, pjrt_outs, random, half_tolerance=1e-3)


def _results_on_cpu(info, sample):
    """The sample's results on CPU, where it also takes out= tensors of their own dtypes (sum
    without a dim has no out= overload); else None."""
    try:
        result = info.op(sample.input, *sample.args, **sample.kwargs)
        results = result if isinstance(result, tuple) else (result,)
        if not all(isinstance(r, torch.Tensor) and r.layout == torch.strided for r in results):
            return None
        outs = tuple(torch.empty_like(r) for r in results)
        info.op(sample.input, *sample.args, **sample.kwargs, out=outs if len(outs) > 1 else outs[0])
    except Exception:  # noqa: BLE001  (a sample CPU refuses has no out= to vary)
        return None
    return results


def _first_sample(info, dtype):
    """The first sample (of a few) with results and an out= overload; None where there is none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            samples = list(itertools.islice(info.sample_inputs("cpu", dtype), 4))
        except Exception:  # noqa: BLE001  (an OpInfo without samples of this dtype here)
            return None
        for sample in samples:
            if any(isinstance(t, torch.Tensor) and t.layout != torch.strided
                   for t in (sample.input, *sample.args, *sample.kwargs.values())):
                continue  # compressed sparse tensors have no pjrt form (a documented refusal, fallback.py)
            results = _results_on_cpu(info, sample)
            if results is not None:
                return sample, results
    return None


def out_differences(selected=lambda name: True) -> list[str]:
    torch.manual_seed(0)  # the same samples each run
    differences = []
    for info in op_db:
        if not info.supports_out or not selected(info.name):
            continue
        for dtype in INPUT_DTYPES:
            first = _first_sample(info, dtype) if dtype in info.supported_dtypes("cpu") else None
            if first is None:
                continue
            sample, results = first
            for position, out_dtype in itertools.product(range(len(results)), OUT_DTYPES):
                if results[position].dtype == out_dtype:
                    continue

                def outs(device):
                    made = tuple(torch.zeros(r.shape, dtype=out_dtype if i == position else r.dtype, device=device)
                                 for i, r in enumerate(results))
                    return made if len(made) > 1 else made[0]

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    expected = _outcome(info, sample, outs("cpu"), "cpu")
                    got = _outcome(info, sample, outs("pjrt"), "pjrt")
                what = _difference(expected, got, info.name in RANDOM)
                if what is not None:
                    def said(o):
                        return o if isinstance(o[0], type) else "computes"
                    differences.append(f"{info.name} ({dtype}, out {position} {out_dtype}): {what}; "
                                       f"CPU {said(expected)}, pjrt {said(got)}")
    return differences


# Differences left, with why: each must still differ (a fixed one leaves this list).
KNOWN: dict = {}


@pytest.mark.parametrize("part", range(PARTS))
def test_out_tensors_of_other_dtypes_do_what_cpu_does(part):
    differences = out_differences(lambda name: name not in KNOWN and zlib.crc32(name.encode()) % PARTS == part)
    assert not differences, "\n".join(differences)


def test_known_differences_still_differ():
    for name in KNOWN:
        assert out_differences(lambda n: n == name), f"{name} now does what CPU does: remove it from KNOWN"


@pytest.mark.parametrize("x", [torch.tensor([[0.6, 0.6, 0.6], [1.7, -1.7, 2.5]]),
                               torch.tensor([[True, False, True], [False, False, True]]),
                               torch.tensor([[100, 100, 100], [-3, 5, 7]], dtype=torch.int8)],
                         ids=["float32", "bool", "int8"])
def test_reductions_cast_their_input_to_an_integer_out_first(x):
    """CPU's sum, prod and cumsum compute in out's dtype: the input is truncated before it is summed,
    and a bool or int8 input sums into an out of its own dtype (without `dtype` its result is int64)."""
    calls = {
        "sum": lambda t, out: torch.sum(t, 1, out=out),
        "prod": lambda t, out: torch.prod(t, 1, out=out),
        "nansum": lambda t, out: torch.nansum(t, 1, out=out),
        "cumsum": lambda t, out: torch.cumsum(t, 1, out=out),
        "cumprod": lambda t, out: torch.cumprod(t, 1, out=out),
    }
    for name, call in calls.items():
        for dtype in (torch.int64, torch.int32, torch.bool, torch.int8):
            shape = (2, 3) if name.startswith("cum") else (2,)
            try:
                expected = call(x, torch.zeros(shape, dtype=dtype))
            except Exception as e:  # noqa: BLE001  (CPU's refusal is the outcome compared)
                expected = (type(e), str(e))
            out = torch.zeros(shape, dtype=dtype, device="pjrt")
            try:
                got = call(x.to("pjrt"), out)
                assert got is out
                got = got.cpu()
            except Exception as e:  # noqa: BLE001
                got = (type(e), str(e))
            if isinstance(expected, tuple) or isinstance(got, tuple):
                assert got == expected, (name, dtype)
            else:
                assert got.dtype == expected.dtype and torch.equal(got, expected), (name, dtype, got, expected)


def test_a_decomposed_op_refuses_an_out_dtype_cpu_refuses():
    """conj_physical.out runs torch's decomposition here, which casts into out; CPU wants out's dtype."""
    for device in ("cpu", "pjrt"):
        out = torch.zeros(3, dtype=torch.float64, device=device)
        try:
            torch.conj_physical(torch.ones(3, device=device), out=out)
            raise AssertionError(f"{device} computed")
        except RuntimeError as e:
            assert str(e) == "Found dtype Double but expected Float"
