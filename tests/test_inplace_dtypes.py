"""OpInfo in-place variants called on a self of another dtype than their samples', and OpInfo samples
in a dtype the OpInfo does not declare: pjrt raises what CPU raises or computes what CPU computes.
CPU's in-place rules differ by op (most compute in the samples' dtype and cast into self where
`can_cast` allows, a float16 self takes a float32 result rounded; some compute in self's dtype), and
an undeclared dtype is where CPU's kernels refuse ("not implemented for 'Bool'") while a lowering,
written for every dtype JAX has, computes (issue 32)."""
from __future__ import annotations

import itertools
import warnings
import zlib

import pytest
import torch
from torch.utils._pytree import tree_map
from torch.testing._internal.common_methods_invocations import op_db

from tests.ops.harness import first_difference

# (the samples' dtype, the dtypes self is converted to): one of each kind CPU's casting rules tell
# apart from float32 (integer, bool, narrower float, complex), and a float or bool self of integer samples
SELF_DTYPES = ((torch.float32, (torch.int64, torch.bool, torch.float16, torch.complex64)),
               (torch.int64, (torch.float32, torch.bool)))
# dtypes an OpInfo may not declare: its float32 samples in them (all of their float32 tensors)
UNDECLARED_DTYPES = (torch.bool, torch.complex64)
PARTS = 2  # the sweep in parts, which pytest-xdist runs side by side
SAMPLES = 3  # of which the first that CPU runs in the samples' own dtype is the one varied
# Ops whose values come from a generator: the outcome compared is dtype and shape, not values.
RANDOM = {"bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal", "uniform", "multinomial",
          "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
          "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
          "randint", "rand", "randn", "randint_like", "rand_like", "randn_like", "normal_number_mean"}


def _on(device):
    return lambda x: x.to(device) if isinstance(x, torch.Tensor) else x


def _call(op, self_, sample, device, convert=lambda x: x):
    """The outcome of op(self_, *sample.args, **sample.kwargs) on `device`: the exception (type and
    first line), or whether it returned self and its results on the CPU (self first)."""
    def moved(x):
        return convert(x).to(device) if isinstance(x, torch.Tensor) else x

    try:
        returned = op(self_, *tree_map(moved, sample.args), **tree_map(moved, sample.kwargs))
        if device == "pjrt":
            torch.pjrt.synchronize()
    except Exception as e:  # noqa: BLE001  (the outcome compared is the exception)
        return type(e), str(e).split("\n")[0]
    results = returned if isinstance(returned, (tuple, list)) else (returned,)
    return returned is self_, [self_.detach().cpu()] + [r.detach().cpu() for r in results
                                                        if isinstance(r, torch.Tensor) and r is not self_]


def _difference(expected, got, random: bool) -> str | None:
    if isinstance(expected[0], type) or isinstance(got[0], type):
        return None if expected == got else "outcome"
    (cpu_returns_self, cpu_results), (pjrt_returns_self, pjrt_results) = expected, got
    if cpu_returns_self != pjrt_returns_self:
        return "returned tensor is not self"
    return first_difference(cpu_results, pjrt_results, random, half_tolerance=2e-3)


def _said(outcome):
    return outcome if isinstance(outcome[0], type) else "computes"


def _samples(info, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            samples = list(itertools.islice(info.sample_inputs("cpu", dtype), SAMPLES))
        except Exception:  # noqa: BLE001  (an OpInfo without samples of this dtype here)
            return []
    # compressed sparse tensors have no pjrt form (a documented refusal, fallback.py)
    return [s for s in samples if isinstance(s.input, torch.Tensor) and not any(
        isinstance(t, torch.Tensor) and t.layout != torch.strided
        for t in (s.input, *s.args, *s.kwargs.values()))]


def _first_runs(op, samples, self_of=lambda s: s.input.clone()):
    """The first sample CPU runs `op` on (self from `self_of`); None where it runs none."""
    for sample in samples:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not isinstance(_call(op, self_of(sample), sample, "cpu")[0], type):
                return sample
    return None


def _compare(op, sample, self_of, convert, random) -> str | None:
    """op on CPU and on pjrt, self from self_of(sample) (converted by `convert` with the other tensors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        expected = _call(op, self_of(sample), sample, "cpu", convert)
        torch.manual_seed(0)
        got = _call(op, self_of(sample).to("pjrt"), sample, "pjrt", convert)
    what = _difference(expected, got, random)
    return None if what is None else f"{what}; CPU {_said(expected)}, pjrt {_said(got)}"


def inplace_differences(selected=lambda name: True) -> list[str]:
    """Each OpInfo's in-place variant on the first sample CPU runs it on, self in another dtype."""
    differences = []
    for info in op_db:
        if info.inplace_variant is None or not selected(info.name):
            continue
        for dtype, self_dtypes in SELF_DTYPES:
            if dtype not in info.supported_dtypes("cpu"):
                continue
            torch.manual_seed(0)  # the same samples each run
            sample = _first_runs(info.inplace_variant, _samples(info, dtype))
            if sample is None:
                continue
            for self_dtype in self_dtypes:
                what = _compare(info.inplace_variant, sample, lambda s: s.input.to(self_dtype, copy=True),
                                lambda x: x, info.name in RANDOM)
                if what is not None:
                    differences.append(f"{info.name} ({dtype} samples, self {self_dtype}): {what}")
    return differences


def undeclared_differences(selected=lambda name: True) -> list[str]:
    """Each OpInfo's first float32 sample CPU runs, its float32 tensors in a dtype the OpInfo does not
    declare. (Its in-place variant on them adds nothing the self-dtype sweep above does not find, at half its
    run time again: a one-off run found cumsum_ and cumprod_ of bool, which that sweep finds too.)"""
    differences = []
    for info in op_db:
        declared = info.supported_dtypes("cpu")
        if torch.float32 not in declared or not selected(info.name):
            continue
        undeclared = [d for d in UNDECLARED_DTYPES if d not in declared]
        if not undeclared:
            continue
        torch.manual_seed(0)
        samples = _samples(info, torch.float32)
        sample = _first_runs(info.op, samples)
        if sample is None:
            continue
        for dtype in undeclared:

            def convert(x, dtype=dtype):
                return x.to(dtype) if x.dtype == torch.float32 else x

            what = _compare(info.op, sample, lambda s: convert(s.input.clone()), convert, info.name in RANDOM)
            if what is not None:
                differences.append(f"{info.name} ({dtype} inputs): {what}")
    return differences


# "OpInfo name" or the difference's "OpInfo name (case)" -> why pjrt's outcome differs; each must still differ
KNOWN = {
    # pjrt computes where CPU refuses, by decision
    "nn.functional.rrelu (torch.float32 samples, self torch.float16)": "CUDA has a float16 rrelu_with_noise: the dtype "
                                                                       "table lists only what neither CPU nor CUDA computes",
    "trace (torch.bool inputs)": "CUDA has a bool trace (an int64 count): as nn.functional.rrelu",
}


def _unknown(differences: list) -> list:
    return [d for d in differences if not {d.split(":")[0], d.split(" (")[0]} & KNOWN.keys()]


@pytest.mark.parametrize("part", range(PARTS))
def test_inplace_into_self_of_other_dtypes_does_what_cpu_does(part):
    differences = _unknown(inplace_differences(lambda name: zlib.crc32(name.encode()) % PARTS == part))
    assert not differences, "\n".join(differences)


@pytest.mark.parametrize("part", range(PARTS))
def test_undeclared_input_dtypes_do_what_cpu_does(part):
    differences = _unknown(undeclared_differences(lambda name: zlib.crc32(name.encode()) % PARTS == part))
    assert not differences, "\n".join(differences)


def test_known_differences_still_differ():
    names = {key.split(" (")[0] for key in KNOWN}
    found = {d.split(":")[0] for d in inplace_differences(names.__contains__) + undeclared_differences(names.__contains__)}
    found |= {d.split(" (")[0] for d in found}
    gone = [key for key in KNOWN if key not in found]
    assert not gone, f"{gone} now do what CPU does: remove them from KNOWN"
