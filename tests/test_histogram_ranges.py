"""histc, histogram and histogramdd with a range CPU refuses: given out of order or not finite,
or the data's own range (no range given) holding inf or NaN. pjrt counted such calls into
zeros or NaN edges, silently (issue 32); it now raises CPU's exception, reading the data's
range on the host only where no range is given (CUDA's histc reads it there too)."""
from __future__ import annotations

import pytest
import torch

from tests.ops.harness import assert_raises_like_cpu

INF, NAN = float("inf"), float("nan")

REFUSED = {
    "histc max below min": lambda d: torch.histc(torch.tensor([1.0, 2.0, 3.0], device=d), bins=4, min=3, max=1),
    "histc NaN min": lambda d: torch.histc(torch.tensor([1.0, 2.0], device=d), bins=4, min=NAN, max=1),
    "histc inf max": lambda d: torch.histc(torch.tensor([1.0, 2.0], device=d), bins=4, min=0, max=INF),
    "histc inf data": lambda d: torch.histc(torch.tensor([1.0, INF], device=d), bins=4),
    "histc NaN data": lambda d: torch.histc(torch.tensor([NAN, 1.0], device=d), bins=4),
    "histogram range out of order": lambda d: torch.histogram(torch.tensor([1.0, 2.0], device=d), bins=4,
                                                              range=(3.0, 1.0)),
    "histogram NaN data": lambda d: torch.histogram(torch.tensor([NAN], device=d), bins=4),
    "histogramdd NaN in one dim": lambda d: torch.histogramdd(torch.tensor([[1.0, NAN], [2.0, 3.0]], device=d),
                                                              bins=[2, 2]),
    "histogramdd range out of order": lambda d: torch.histogramdd(torch.tensor([[1.0, 2.0]], device=d), bins=[2, 2],
                                                                  range=[0.0, 1.0, 3.0, 2.0]),
}


@pytest.mark.parametrize("name", REFUSED)
def test_a_range_cpu_refuses_raises_its_error(name):
    assert_raises_like_cpu(REFUSED[name], name)


COMPUTED = {
    "histc data range": lambda d: torch.histc(torch.tensor([1.0, 2.0, 5.0], device=d), bins=3),
    "histc given range": lambda d: torch.histc(torch.tensor([1.0, 2.0, 5.0], device=d), bins=3, min=0, max=4),
    "histc empty": lambda d: torch.histc(torch.tensor([], device=d), bins=3),
    "histc one value": lambda d: torch.histc(torch.tensor([2.0, 2.0], device=d), bins=3),
    "histogram data range": lambda d: torch.histogram(torch.tensor([1.0, 2.0, 5.0], device=d), bins=3),
    "histogramdd data range": lambda d: torch.histogramdd(torch.tensor([[1.0, 2.0], [2.0, 3.0]], device=d),
                                                          bins=[2, 2]),
}


@pytest.mark.parametrize("name", COMPUTED)
def test_a_range_cpu_accepts_counts_as_cpu(name):
    expected, actual = COMPUTED[name]("cpu"), COMPUTED[name]("pjrt")
    for e, a in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(actual)):
        torch.testing.assert_close(a.cpu(), e, rtol=0, atol=1e-6)
