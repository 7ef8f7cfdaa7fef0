"""Differences from CPU torch found by running PyTorch's device-generic test files whole (issue 32:
nn/test_pooling, nn/test_embedding, test_tensor_creation_ops; docs/conformance-notes.md, "Full-file
runs"). Each test runs the call on CPU (the reference) and on pjrt."""
from __future__ import annotations

import math
import re
import warnings

import jax
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


# ------------------------------------------------------------------ writes into permuted and block views
# An in-place op on a channels_last tensor (assertEqual's `matches |= ...` over a channels_last
# gradient in nn/test_pooling's test_avg_pool2d_nhwc) wrote through a scatter whose positions were a
# constant of the view's size: 80M int64 for the test's (200, 512, 28, 28) tensor, 20 s to compile and
# 6 s to load from the persistent cache (assertEqual 21-25 s where CPU takes 2 s). A view that is a
# block of its buffer is now written as one box, the value transposed to memory order.
def _strided_writes(device):
    x = torch.arange(4 * 6 * 3 * 5.0, device=device).reshape(4, 6, 3, 5).contiguous(memory_format=torch.channels_last)
    x.add_(1)
    x[1:3, 2:5].fill_(-1)  # a block at an offset
    x[2, :, 1].copy_(torch.full((6, 5), 7.0, device=device))
    x[:, 1:4, :, 2:4] = 9
    mask = (x > 50).bitwise_or_(x < 0)  # a bool channels_last target
    base = torch.arange(24.0, device=device).reshape(4, 6)
    base.t().mul_(2)  # a transposed view
    grid = torch.zeros(10, 10, device=device)
    grid[::3, 1::4] = torch.arange(12.0, device=device).reshape(4, 3)  # not a block: the scatter
    ones = torch.zeros(5, 1, 7, device=device).transpose(0, 2)
    ones.add_(torch.arange(7.0, device=device).reshape(7, 1, 1))  # a size-1 dim
    return x, mask, base, grid, ones


def test_writes_into_strided_views_equal_cpu():
    for expected, actual in zip(_strided_writes("cpu"), _strided_writes("pjrt")):
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)
        assert actual.stride() == expected.stride()


def test_a_channels_last_write_carries_no_positions_constant():
    """A block write is one window (storage._write_box): no element-wise positions constant, no
    per-element scatter (a one-window scatter's indices are one row)."""
    from torch_pjrt.dtypes import to_jax
    from torch_pjrt.runtime import storage

    x = torch.zeros(8, 16, 6, 6, device="pjrt").contiguous(memory_format=torch.channels_last)
    torch.pjrt.synchronize()
    buf = storage._materialized_buffer(x)
    shape, stride = tuple(x.shape), tuple(x.stride())
    block = storage._is_block(shape, stride, x.storage_offset())
    writer = storage._writer(shape, stride, buf.shape, to_jax(x.dtype), False, block)
    hlo = writer.fn.lower(buf, jax.numpy.ones(shape, buf.dtype), storage.offset_operand(0)).as_text()
    # every integer array of the program: the window's start (4 numbers) and its parts
    index_sizes = [math.prod(int(n) for n in s.split("x")[:-1]) for s in re.findall(r"tensor<((?:\d+x)+)i64>", hlo)]
    assert index_sizes and max(index_sizes) == 4, index_sizes


# ------------------------------------------------------------------ out= resize warnings (test_linalg)
# A non-empty out= of another shape: CPU warns once per resized tensor. pjrt warned again for each
# (test_linalg's test_{det,inv,cholesky,eig,slogdet}_errors_and_warnings count them): the meta dry run
# of the out= overload resized its twin of out, and torch's resize_output warns in C++, where
# catch_warnings cannot hold it. (det, solve, inv, cholesky and slogdet still warn twice: their out=
# kernel takes a result laid out by torch's strides, the column-major LU or factor, for a value of
# another dtype and asks CPU, which warns again: eager/kernels.py's _flat_values, not changed here.)
_RESIZED_OUTS = {
    "max": lambda A, d: torch.max(A, 0, out=(torch.empty(2, dtype=A.dtype, device=d),
                                             torch.empty(2, dtype=torch.int64, device=d))),
    "mm": lambda A, d: torch.mm(A, A, out=torch.empty(2, 3, dtype=A.dtype, device=d)),
}


@pytest.mark.parametrize("name", sorted(_RESIZED_OUTS))
def test_out_resize_warns_once_per_tensor_as_cpu(name):
    results, resized = {}, {}
    for device in ("cpu", "pjrt"):
        A = (torch.eye(3, dtype=torch.float64) * 2 + 0.1).to(device)
        caught = _warnings(lambda: results.setdefault(device, _RESIZED_OUTS[name](A, device)))
        resized[device] = [w.split(" since")[0] for w in caught if "resized" in w]
    assert resized["pjrt"] == resized["cpu"]
    expected, actual = results["cpu"], results["pjrt"]
    for e, a in zip(*((x,) if isinstance(x, torch.Tensor) else x for x in (expected, actual))):
        torch.testing.assert_close(a.cpu(), e)


# ------------------------------------------------------------------ size-1 dims of a permuted result
# An elementwise result laid out by torch's strides (a dense permutation, storage.Permuted): a size-1
# dim whose meta stride equals another dim's went outside that dim, so its stride came out as the
# product of the sizes inside both: exp of a (1, 3, 4) view with strides (2, 2, 6) had strides (3, 1, 3)
# where CPU gives (1, 1, 3), while empty_like and the other like functions gave CPU's
# (test_tensor_creation_ops' test_like_fn_stride_proparation_vs_tensoriterator_unary_op).
@pytest.mark.parametrize("shape, stride, dims", [
    ((4, 3, 2), (6, 2, 1), None),  # a ::2 slice of (4, 3, 2) is (4, 3, 1) with strides (6, 2, 2)
    ((4, 1, 1, 2), (10, 0, 0, 2), (3, 2, 1, 0)),
    ((4, 3, 2), (4, 2, 1), None),
])
def test_elementwise_result_strides_of_size_one_dims_as_cpu(shape, stride, dims):
    from itertools import permutations
    for device in ("cpu", "pjrt"):
        base = torch.empty_strided(shape, stride, device=device).fill_(1.0)
        if dims is None:
            base = base[:, :, ::2]
        for p in permutations(range(base.dim())):
            t = base.permute(p)
            expected = torch.exp(torch.empty_strided(t.shape, t.stride())).stride()
            assert torch.exp(t).stride() == expected, (device, p)
            assert (t + 1).stride() == expected, (device, p)
            assert torch.empty_like(t).stride() == torch.exp(t).stride(), (device, p)
