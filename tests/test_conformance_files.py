"""Differences from CPU torch found by running PyTorch's device-generic test files whole (issue 32:
nn/test_pooling, nn/test_embedding, test_tensor_creation_ops; docs/conformance-notes.md, "Full-file
runs"). Each test runs the call on CPU (the reference) and on pjrt."""
from __future__ import annotations

import warnings

import pytest
import torch


def _warnings(call) -> list[str]:
    """The warnings call() gives, in order (each shown, however often it was shown before)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught]


# ------------------------------------------------------------------ range factories' out= resize
# CPU's range factories resize their out= tensor themselves when its element count differs: arange
# warns in its own words (test_tensor_creation_ops' test_arange looks for "The out tensor will be
# resized"), linspace and logspace say nothing. pjrt gave torch's generic out= warning for all three.
_RANGE_OUTS = {
    "arange": lambda out: torch.arange(-1, 1, 2.0 / 49, dtype=torch.float32, out=out),  # 50 values by rounding
    "arange_int": lambda out: torch.arange(5, out=out),
    "linspace": lambda out: torch.linspace(0, 1, 5, out=out),
    "logspace": lambda out: torch.logspace(0, 1, 5, out=out),
}


@pytest.mark.parametrize("name", sorted(_RANGE_OUTS))
@pytest.mark.parametrize("shape", [(1, 49), (2, 2), (0,)])
def test_range_factory_out_resize_warns_as_cpu(name, shape):
    call = _RANGE_OUTS[name]
    dtype = torch.int64 if name == "arange_int" else torch.float32
    results = {}
    for device in ("cpu", "pjrt"):
        out = torch.zeros(shape, dtype=dtype, device=device)
        results[device] = (_warnings(lambda: call(out)), out)
    (cpu_warnings, cpu_out), (pjrt_warnings, pjrt_out) = results["cpu"], results["pjrt"]
    assert pjrt_warnings == cpu_warnings
    assert pjrt_out.shape == cpu_out.shape
    # not exactly: CPU's vectorized arange adds k * step to a start rounded to the dtype per vector of
    # 8 or 16 lanes (an ulp from pjrt's start + i * step in float64, rounded once)
    torch.testing.assert_close(pjrt_out.cpu(), cpu_out)
