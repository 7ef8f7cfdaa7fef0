"""OpInfo samples with their int64 tensor arguments (indices, targets, lengths, sorters) in another
dtype: pjrt raises what CPU raises or computes what CPU computes. torch's meta kernels check none
of these dtypes, so a lowering that does not (promotion.require_dtype) computed where CPU and CUDA
refuse: nll_loss with int32 targets trained here and failed on the real device (issue 32)."""
from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from torch.utils._pytree import tree_map
from torch.testing._internal.common_methods_invocations import op_db

# The OpInfos whose samples run differently by design: tensor_split's index tensor must be on the
# CPU whatever its dtype (here it is on pjrt, and CUDA answers the same).
ON_THE_CPU_BY_DESIGN = {"tensor_split"}
OTHER_DTYPES = (torch.int32, torch.int16, torch.uint8, torch.float32)


def _outcome(op, inp, args, kwargs):
    try:
        result = op(inp, *args, **kwargs)
        torch.pjrt.synchronize()
    except Exception as e:  # noqa: BLE001  (the outcome compared is the exception)
        return type(e), str(e).split("\n")[0]
    results = result if isinstance(result, (tuple, list)) else [result]
    return [r.detach().cpu() for r in results if isinstance(r, torch.Tensor)]


def _same(expected, got) -> bool:
    if isinstance(expected, tuple) or isinstance(got, tuple):
        return expected == got
    if len(expected) != len(got):
        return False
    for e, g in zip(expected, got):
        if e.shape != g.shape or e.dtype != g.dtype:
            return False
        try:
            torch.testing.assert_close(g, e, equal_nan=True, rtol=1e-4, atol=1e-4)
        except AssertionError:
            return False
    return True


def _differences(converted: torch.dtype, other_dtypes: tuple, samples_per_op: int) -> list:
    """Each OpInfo's first float32 samples with their `converted` tensor arguments (not the input)
    in each of `other_dtypes`, on CPU and pjrt: the (op, dtype) pairs whose outcomes differ."""
    differences = []
    for info in op_db:
        if info.name in ON_THE_CPU_BY_DESIGN or torch.float32 not in info.supported_dtypes("cpu"):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                samples = list(itertools.islice(info.sample_inputs("cpu", torch.float32), samples_per_op))
            except Exception:  # noqa: BLE001  (an OpInfo without float32 samples here)
                continue
        for sample in samples:
            found = []
            tree_map(lambda x: found.append(x) if isinstance(x, torch.Tensor) and x.dtype == converted else x,
                  (sample.args, sample.kwargs))
            if not found:
                continue
            for dtype in other_dtypes:
                def convert(x, device):
                    if isinstance(x, torch.Tensor):
                        return (x.to(dtype) if x.dtype == converted else x).to(device)
                    return x

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    expected = _outcome(info.op, sample.input, tree_map(lambda x: convert(x, "cpu"), sample.args),
                                        tree_map(lambda x: convert(x, "cpu"), sample.kwargs))
                    got = _outcome(info.op, tree_map(lambda x: x.to("pjrt") if isinstance(x, torch.Tensor) else x, sample.input),
                                   tree_map(lambda x: convert(x, "pjrt"), sample.args), tree_map(lambda x: convert(x, "pjrt"), sample.kwargs))
                if not _same(expected, got):
                    differences.append(f"{info.name} ({dtype}): CPU {expected if isinstance(expected, tuple) else 'computes'}"
                                       f", pjrt {got if isinstance(got, tuple) else 'computes'}")
    return differences


def test_int64_operands_in_other_dtypes_do_what_cpu_does():
    differences = _differences(torch.int64, OTHER_DTYPES, 3)
    assert not differences, "\n".join(differences)


@pytest.mark.slow  # 30 s from a warm store, 190 s from an empty one under load: `pytest -m slow` (passes at 8ad9868)
def test_float32_operands_in_other_dtypes_do_what_cpu_does():
    """The samples' other float32 tensors (weights, sources, targets, second operands) in float64,
    float16, int64, bool and complex64: an op that is not elementwise over two dtypes is where CPU's
    kernels refuse and meta kernels accept (errors.MixedDtypesRefused)."""
    differences = [d for d in _differences(torch.float32, FLOAT_OPERAND_DTYPES, 1)
                   if not {d.split(":")[0], d.split(" (")[0]} & FLOAT_OPERANDS_KNOWN.keys()]
    assert not differences, "\n".join(differences)


FLOAT_OPERAND_DTYPES = (torch.float64, torch.float16, torch.int64, torch.bool, torch.complex64)
# "OpInfo name" or "OpInfo name (dtype)" -> why pjrt's outcome differs
FLOAT_OPERANDS_KNOWN = {
    "sparse.sampled_addmm": "sparse CSR: pjrt refuses it, naming the op, before CPU's dtype check runs",
    "sparse.mm": "sparse CSR (its reduce variant): as sparse.sampled_addmm",
    "normal": "a random draw: pjrt's stream is not CPU's (both compute, in the same dtype)",
    "ldexp (torch.float16)": "one rounding fewer: XLA keeps 2 ** other in float32 inside the product, CPU rounds it to "
                             "float16 first (a relative 1e-3)",
    "nn.functional.gaussian_nll_loss": "the same error; CPU's words name the C++ type ('long int', 'bool'), pjrt's "
                                       "c10's ('Long', 'Bool')",
}
