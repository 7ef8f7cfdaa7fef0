"""fft lowerings (_fft_r2c, _fft_c2r, _fft_c2c) against CPU torch (pocketfft), directly and
through torch.fft's functions, which build every transform from these three and conj."""
import pytest
import torch

from tests.ops.harness import check, device_available
import torch_pjrt  # noqa: E402

aten = torch.ops.aten
TOL = dict(atol=1e-4, rtol=1e-4)


def r(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("normalization", [0, 1, 2])
@pytest.mark.parametrize("dim", [[2], [0, 2], [0, 1, 2, 3]])
@pytest.mark.parametrize("forward", [True, False])
def test_fft_c2c(normalization, dim, forward):
    check(aten._fft_c2c.default, r(3, 4, 5, 2, dtype=torch.complex64), dim, normalization, forward, **TOL)


@pytest.mark.parametrize("normalization", [0, 1, 2])
@pytest.mark.parametrize("dim", [[2], [0, 2], [0, 1, 2, 3]])
@pytest.mark.parametrize("onesided", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fft_r2c(normalization, dim, onesided, dtype):
    check(aten._fft_r2c.default, r(3, 4, 5, 2, dtype=dtype), dim, normalization, onesided, **TOL)


@pytest.mark.parametrize("normalization", [0, 1, 2])
@pytest.mark.parametrize("dim,last_dim_size", [([2], 8), ([2], 9), ([0, 2], 7), ([0, 1, 3, 2], 6)])
def test_fft_c2r(normalization, dim, last_dim_size):
    x = r(3, 4, last_dim_size // 2 + 1, 2, dtype=torch.complex128)
    check(aten._fft_c2r.default, x, dim, normalization, last_dim_size, **TOL)


FUNCTIONS = [
    (torch.fft.fft, {}), (torch.fft.ifft, {"norm": "ortho"}), (torch.fft.rfft, {"n": 7}),
    (torch.fft.irfft, {"n": 9}), (torch.fft.hfft, {}), (torch.fft.ihfft, {"norm": "forward"}),
    (torch.fft.fft2, {}), (torch.fft.ifftn, {"s": (3, 6)}), (torch.fft.rfftn, {}),
    (torch.fft.irfft2, {}), (torch.fft.hfft2, {}), (torch.fft.ihfftn, {}),
]


@pytest.mark.skipif(not device_available(), reason="torch.fft functions need the pjrt device")
@pytest.mark.parametrize("fn,kwargs", FUNCTIONS, ids=[f.__name__ for f, _ in FUNCTIONS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.int64])
def test_torch_fft_functions(fn, kwargs, dtype):
    x = r(4, 6, dtype=torch.float64).to(dtype) if not dtype.is_complex else r(4, 6, dtype=dtype)
    if fn in (torch.fft.rfft, torch.fft.rfftn, torch.fft.ihfft, torch.fft.ihfftn) and dtype.is_complex:
        x = x.real
    expected = fn(x, **kwargs)
    got = fn(x.to("pjrt"), **kwargs)
    assert got.device.type == "pjrt"
    torch.testing.assert_close(got.cpu(), expected, **TOL)
    assert not [op for op in torch_pjrt.fallback_ops() if "fft" in str(op)]


@pytest.mark.skipif(not device_available(), reason="gradients need the pjrt device")
@pytest.mark.parametrize("fn", [torch.fft.fft, torch.fft.rfft, torch.fft.irfft, torch.fft.hfft, torch.fft.ihfft2])
def test_torch_fft_gradients(fn):
    x = r(4, 6, dtype=torch.float64)
    if fn in (torch.fft.irfft, torch.fft.hfft):
        x = torch.complex(x, r(4, 6, dtype=torch.float64, seed=1))
    grads = []
    for device in ("cpu", "pjrt"):
        leaf = x.to(device).requires_grad_()
        out = fn(leaf)
        w = r(*out.shape, dtype=torch.float64, seed=2).to(out.dtype).to(device)
        grads.append(torch.autograd.grad((out * w).real.sum(), leaf)[0].cpu())
    torch.testing.assert_close(grads[1], grads[0], **TOL)
