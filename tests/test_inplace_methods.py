"""Every in-place Tensor method against CPU: for self of five dtypes and a few argument lists,
pjrt raises what CPU raises (type) or writes what CPU writes (dtype and values). In-place ops are
derived from functional ones (eager/kernels.py), so CPU's in-place rules (a result that can't be
cast to self, abs_ of a complex self, put_'s index dtype) are checked here as a class."""
from __future__ import annotations

import warnings

import pytest
import torch

_RANDOM_OR_META = {"requires_grad_", "share_memory_", "set_", "resize_", "resize_as_", "retain_grad", "detach_",
                   "rename_", "uniform_", "normal_", "random_", "bernoulli_", "cauchy_", "exponential_",
                   "geometric_", "log_normal_", "map_", "apply_", "map2_"}  # random draws or host-only methods
METHODS = sorted(n for n in dir(torch.Tensor) if n.endswith("_") and not n.startswith("_")
                 and n[:-1] in dir(torch.Tensor) and n not in _RANDOM_OR_META)
DTYPES = (torch.int64, torch.bool, torch.complex64, torch.float32, torch.uint8)


def _self(dtype: torch.dtype) -> torch.Tensor:
    base = torch.tensor([[1.5, -2.25, 0.5], [3.0, 0.75, -1.0]])
    if dtype.is_complex:
        return torch.complex(base, base.flip(1)).to(dtype)
    return base > 0 if dtype == torch.bool else base.to(dtype)


_FLOAT = _self(torch.float32)
ARGUMENTS = ((), (2,), (_FLOAT,), (0.5,), (1, 2), (_FLOAT, _FLOAT))


def _run(method: str, self: torch.Tensor, args: tuple):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            getattr(self, method)(*args)
            return None
        except Exception as e:  # noqa: BLE001  (whatever CPU raises is the expected error)
            return e


@pytest.mark.parametrize("method", METHODS)
def test_in_place_method_does_what_cpu_does(method):
    for dtype in DTYPES:
        for args in ARGUMENTS:
            cpu, pjrt = _self(dtype), _self(dtype).to("pjrt")
            expected = _run(method, cpu, args)
            got = _run(method, pjrt, tuple(a.to("pjrt") if isinstance(a, torch.Tensor) else a for a in args))
            where = f"{method}{tuple(type(a).__name__ for a in args)} on {dtype}"
            if expected is not None or got is not None:
                assert type(got) is type(expected), f"{where}: CPU raised {expected!r}, pjrt {got!r}"
                continue
            written = pjrt.cpu()
            assert written.dtype == cpu.dtype, where
            torch.testing.assert_close(written, cpu, equal_nan=True, atol=1e-5, rtol=1e-5, msg=where)


@pytest.mark.parametrize("index", [[0, 9], [0, -5]])
def test_put_out_of_range_index_raises_as_cpu(index):
    """put_ wrote nothing for an index past the end (XLA drops it) and raised nothing."""
    with pytest.raises(IndexError) as cpu:
        torch.zeros(4).put_(torch.tensor(index), torch.ones(2))
    with pytest.raises(IndexError) as pjrt:
        torch.zeros(4, device="pjrt").put_(torch.tensor(index, device="pjrt"), torch.ones(2, device="pjrt")).cpu()
    assert str(pjrt.value).startswith(str(cpu.value))
