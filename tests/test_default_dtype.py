"""torch.set_default_dtype after the first call reaches every later call, as on the CPU.

Traces read the default dtype (int / int, sqrt of an int, arange over floats) while the caches of
traces are keyed by shapes and dtypes: runtime/default_dtype.py drops them when it changes. Each
test compares with the same calls on the CPU, in both eager modes and compiled.
"""
from __future__ import annotations

import pytest
import torch

import torch_pjrt
from torch_pjrt.runtime import default_dtype


@pytest.fixture(params=["fused", "op"])
def mode(request):
    before_mode, before_dtype = torch_pjrt.eager_mode(), torch.get_default_dtype()
    torch_pjrt.set_eager_mode(request.param)
    yield request.param
    torch.set_default_dtype(before_dtype)
    torch_pjrt.set_eager_mode(before_mode)


def _calls(device: str) -> list[torch.Tensor]:
    a = torch.tensor([1, 2, 3], device=device)
    b = torch.tensor([2, 4, 7], device=device)
    return [a / b, torch.sqrt(a), a * 0.5, torch.arange(0.0, 3.0, device=device),
            torch.linspace(0, 1, 5, device=device), torch.true_divide(a, 3)]


def _assert_like_cpu(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        # one ulp: CPU torch's own float64 sqrt(2) depends on its kernel (AVX512: 1.414213562373095,
        # one below the correctly rounded value that its AVX2 kernel and XLA give)
        torch.testing.assert_close(g.cpu(), e, rtol=torch.finfo(e.dtype).eps if e.is_floating_point() else 0, atol=0)


def test_a_new_default_dtype_reaches_calls_traced_before(mode):
    changes = default_dtype.changes()
    for dtype in (torch.float32, torch.float64, torch.float32):
        torch.set_default_dtype(dtype)
        _assert_like_cpu(_calls("pjrt"), _calls("cpu"))
    assert default_dtype.changes() >= changes + 2


def test_calls_recorded_before_the_change_keep_their_dtype(mode):
    torch.set_default_dtype(torch.float32)
    before = _calls("pjrt")  # pending in fused mode: they run after the change
    expected_before = _calls("cpu")
    torch.set_default_dtype(torch.float64)
    after = _calls("pjrt")
    expected_after = _calls("cpu")
    _assert_like_cpu(before, expected_before)
    _assert_like_cpu(after, expected_after)


def test_compiled_graph_follows_the_default_dtype(mode):
    def f(a, b):
        return a / b + torch.arange(0.0, 3.0, device=a.device)

    compiled = torch.compile(f, backend="pjrt")
    a, b = torch.tensor([1, 2, 3]), torch.tensor([2, 4, 7])
    for dtype in (torch.float32, torch.float64):
        torch.set_default_dtype(dtype)
        got = compiled(a.to("pjrt"), b.to("pjrt"))
        expected = f(a, b)
        assert got.dtype == expected.dtype == dtype
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
