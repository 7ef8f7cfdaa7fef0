"""isclose as one eager call (ops/elementwise.py, the `over_composite` trait): every assert_close on
the device computes it, and torch's composite decomposes it into about twelve calls, each an
executable per new shape. The one call computes what CPU's composite computes, op for op."""
from __future__ import annotations

import pytest
import torch

import torch_pjrt

TOLERANCES = [(1e-5, 1e-8, False), (1.3e-6, 1e-5, True), (0, 0, False), (0.1, 0, True), (0, 0.5, False),
              (1e-3, 1e-3, False)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.int64, torch.int32,
          torch.uint8, torch.int8, torch.bool]


def _pair(dtype):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(500, generator=g) > 0.5, torch.rand(500, generator=g) > 0.5
    if not (dtype.is_floating_point or dtype.is_complex):
        info = torch.iinfo(dtype)
        a = torch.randint(info.min, info.max, (500,), dtype=dtype, generator=g)
        b = a.clone()
        b[::3] = torch.randint(info.min, info.max, (167,), dtype=dtype, generator=g)
        return a, b
    a = torch.randn(500, dtype=dtype, generator=g)
    scale = torch.tensor([0, 1e-6, 1e-4, 1e-2, 1.0]).repeat(100).to(dtype)
    b = a + torch.randn(500, dtype=dtype, generator=g) * scale
    a[::37], b[::41], a[::53], b[::53], b[::59] = float("nan"), float("nan"), float("inf"), float("inf"), float("-inf")
    return a, b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_isclose_equals_cpu(dtype):
    a, b = _pair(dtype)
    for rtol, atol, equal_nan in TOLERANCES:
        want = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
        got = torch.isclose(a.to("pjrt"), b.to("pjrt"), rtol=rtol, atol=atol, equal_nan=equal_nan)
        assert torch.equal(got.cpu(), want), (rtol, atol, equal_nan)
    assert torch.allclose(a.to("pjrt"), b.to("pjrt"), equal_nan=True) == torch.allclose(a, b, equal_nan=True)


@pytest.mark.parametrize("a, b, keywords", [
    (torch.ones(3), torch.ones(3, dtype=torch.float64), {}),
    (torch.ones(3), torch.ones(3), {"rtol": -1.0}),
    (torch.ones(3), torch.ones(3), {"atol": -1.0}),
])
def test_isclose_refuses_what_cpu_refuses(a, b, keywords):
    with pytest.raises(RuntimeError) as cpu:
        torch.isclose(a, b, **keywords)
    with pytest.raises(RuntimeError) as pjrt:
        torch.isclose(a.to("pjrt"), b.to("pjrt"), **keywords)
    assert str(pjrt.value) == str(cpu.value)


def test_isclose_is_one_executable_per_shape_and_takes_no_gradient():
    torch_pjrt.reset_eager_stats()
    x = torch.randn(5, 13, 3, device="pjrt", requires_grad=True)  # a shape no other test builds
    close = torch.isclose(x, x.detach() + 1e-9)
    assert not close.requires_grad and close.grad_fn is None
    assert bool(close.all())
    built = torch_pjrt.eager_stats()["by_op"]
    assert built.get("aten.isclose.default") == 1
    assert not {"aten.eq.Tensor", "aten.abs.default", "aten.sub.Tensor", "aten.mul.Scalar"} & set(built), built
