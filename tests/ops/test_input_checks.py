"""Input checks inside lowerings: pjrt raises (and warns) what CPU torch raises (and warns).

A lowering that must refuse a call raises any exception at trace time from its static
arguments, shapes and dtypes; the oracle (errors.py) then re-runs the call on CPU and raises
CPU's exception. Each case runs on CPU (the reference) and on pjrt: both raise the same
exception type with the same first line, or both accept and agree on the values.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from tests.ops.harness import assert_raises_like_cpu

aten = torch.ops.aten


def _weights(shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _adaptive(kind, nd, dtype):
    shape = (2, 3) + (5,) * nd
    return lambda d: getattr(F, f"adaptive_{kind}_pool{nd}d")((_weights(shape) * 5).to(dtype).to(d), 2)


M8 = [1, 0, 1]  # a uint8 mask's values

CALLS = {
    # uniform_'s from/to are static floats: checked in the lowering
    "uniform_ from > to": lambda d: torch.empty(3, device=d).uniform_(3, -1),
    "uniform_ from > to, float64": lambda d: torch.empty(3, dtype=torch.float64, device=d).uniform_(3, -1),
    "uniform_ to out of float16's range": lambda d: torch.empty(3, dtype=torch.float16, device=d).uniform_(0, 1e5),
    "uniform_ to - from beyond float16's max": lambda d: torch.empty(3, dtype=torch.float16, device=d).uniform_(
        -60000, 60000),
    "uniform_ infinite to": lambda d: torch.empty(3, device=d).uniform_(0, float("inf")),
    "uniform_ of an empty tensor checks too": lambda d: torch.empty(0, device=d).uniform_(3, -1),
    "uniform_ of int32": lambda d: torch.empty(3, dtype=torch.int32, device=d).uniform_(0, 1),
    # softshrink's lambd is static, so the meta kernel sees its value
    "softshrink negative lambda": lambda d: F.softshrink(_weights(5).to(d), -0.5),
    "softshrink lambda beyond float16's max": lambda d: F.softshrink(_weights(5).half().to(d), 1e5),
    "softshrink nan lambda": lambda d: F.softshrink(_weights(5).to(d), float("nan")),
    # convolution's ConvParams checks (the meta kernel lets negative padding through)
    "conv1d negative padding": lambda d: F.conv1d(_weights((1, 3, 6)).to(d), _weights((4, 3, 3)).to(d), padding=-1),
    "conv2d negative padding": lambda d: F.conv2d(_weights((1, 3, 6, 6)).to(d), _weights((4, 3, 3, 3)).to(d),
                                                  padding=-1),
    "conv3d negative padding": lambda d: F.conv3d(_weights((1, 3, 6, 6, 6)).to(d), _weights((4, 3, 3, 3, 3)).to(d),
                                                  padding=-1),
    "conv2d negative padding in one dim": lambda d: F.conv2d(_weights((1, 3, 6, 6)).to(d),
                                                             _weights((4, 3, 3, 3)).to(d), padding=(0, -1)),
    "conv_transpose2d negative padding": lambda d: F.conv_transpose2d(_weights((1, 3, 6, 6)).to(d),
                                                                      _weights((3, 4, 3, 3)).to(d), padding=-1),
    "conv_transpose2d negative output_padding": lambda d: F.conv_transpose2d(
        _weights((1, 3, 6, 6)).to(d), _weights((3, 4, 3, 3)).to(d), stride=2, output_padding=-1),
    "conv1d negative stride": lambda d: F.conv1d(_weights((1, 3, 6)).to(d), _weights((4, 3, 3)).to(d), stride=-1),
    "conv2d zero stride": lambda d: F.conv2d(_weights((1, 3, 6, 6)).to(d), _weights((4, 3, 3, 3)).to(d), stride=0),
    "conv3d zero dilation": lambda d: F.conv3d(_weights((1, 3, 6, 6, 6)).to(d), _weights((4, 3, 3, 3, 3)).to(d),
                                               dilation=0),
    "conv2d negative dilation": lambda d: F.conv2d(_weights((1, 3, 6, 6)).to(d), _weights((4, 3, 3, 3)).to(d),
                                                   dilation=-1),
    "convolution_backward negative padding": lambda d: aten.convolution_backward(
        _weights((1, 4, 6, 6)).to(d), _weights((1, 3, 6, 6)).to(d), _weights((4, 3, 3, 3)).to(d), [4], [1, 1],
        [-1, -1], [1, 1], False, [0, 0], 1, [True, True, True]),
    "convolution_backward zero stride": lambda d: aten.convolution_backward(
        _weights((1, 4, 6, 6)).to(d), _weights((1, 3, 6, 6)).to(d), _weights((4, 3, 3, 3)).to(d), [4], [0, 1],
        [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]),
    # masks must be bool
    "masked_scatter_ uint8 mask": lambda d: _weights(3).to(d).masked_scatter_(
        torch.tensor(M8, dtype=torch.uint8, device=d), _weights(3, 1).to(d)),
    "masked_scatter uint8 mask": lambda d: _weights(3).to(d).masked_scatter(
        torch.tensor(M8, dtype=torch.uint8, device=d), _weights(3, 1).to(d)),
    "masked_scatter_ int64 mask": lambda d: _weights(3).to(d).masked_scatter_(
        torch.tensor(M8, device=d), _weights(3, 1).to(d)),
    "masked_fill uint8 mask": lambda d: _weights(3).to(d).masked_fill(torch.tensor(M8, dtype=torch.uint8, device=d), 2.),
    "masked_fill_ uint8 mask, tensor value": lambda d: _weights(3).to(d).masked_fill_(
        torch.tensor(M8, dtype=torch.uint8, device=d), torch.tensor(2., device=d)),
    "masked_select uint8 mask": lambda d: _weights(3).to(d).masked_select(torch.tensor(M8, dtype=torch.uint8, device=d)),
    # CPU writes one value through one mask with masked_fill_, which refuses a uint8 mask
    "index_put_ uint8 mask, one value": lambda d: _weights(3).to(d).index_put_(
        (torch.tensor(M8, dtype=torch.uint8, device=d),), torch.tensor(5., device=d)),
    "setitem uint8 mask, a number": lambda d: _weights(3).to(d).__setitem__(
        torch.tensor(M8, dtype=torch.uint8, device=d), 5.),
    # as_strided_scatter: the view must fit self's storage and not repeat elements
    "as_strided_scatter beyond the storage": lambda d: torch.as_strided_scatter(
        _weights((4, 4)).to(d), _weights((2, 2)).to(d), [2, 2], [200, 200], storage_offset=0),
    "as_strided_scatter offset beyond the storage": lambda d: torch.as_strided_scatter(
        _weights((4, 4)).to(d), _weights((2, 2)).to(d), [2, 2], [4, 1], storage_offset=11),
    "as_strided_scatter 0-d view past the end": lambda d: torch.as_strided_scatter(
        _weights((4, 4)).to(d), torch.tensor(7., device=d), [], [], storage_offset=16),
    "as_strided_scatter repeating view": lambda d: torch.as_strided_scatter(
        _weights((4, 4)).to(d), _weights((2, 2)).to(d), [2, 2], [0, 0], storage_offset=0),
    # embedding_renorm_ selects each row (queued index check, raised at the sync)
    "embedding_renorm_ index out of range": lambda d: torch.embedding_renorm_(
        _weights((5, 3)).to(d), torch.tensor([1, 7], device=d), 1.0, 2.0),
    "embedding_renorm_ negative index out of range": lambda d: torch.embedding_renorm_(
        _weights((5, 3)).to(d), torch.tensor([1, -6], device=d), 1.0, 2.0),
    "embedding_renorm_ names the smallest bad index": lambda d: torch.embedding_renorm_(
        _weights((5, 3)).to(d), torch.tensor([[9, 7], [-8, 2]], device=d), 1.0, 2.0),
    "embedding_renorm_ int32 indices": lambda d: torch.embedding_renorm_(
        _weights((5, 3)).to(d), torch.tensor([5], dtype=torch.int32, device=d), 1.0, 2.0),
    "embedding with max_norm, index out of range": lambda d: F.embedding(
        torch.tensor([1, 7], device=d), _weights((5, 3)).to(d), max_norm=1.0),
}
# adaptive pooling: CPU has kernels for floating dtypes only
for _kind in ("avg", "max"):
    for _nd in (1, 2, 3):
        for _dtype in (torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool):
            CALLS[f"adaptive_{_kind}_pool{_nd}d {str(_dtype)[6:]}"] = _adaptive(_kind, _nd, _dtype)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_raises_what_cpu_raises(name):
    assert_raises_like_cpu(CALLS[name], name)


OUT_DTYPES = {  # out= of another dtype than the result: refused where CPU's kernel wants its exact dtype
    "aminmax": lambda d: torch.aminmax(_weights((3, 4)).to(d), dim=0, out=(
        torch.empty(4, device=d), torch.empty(4, dtype=torch.float64, device=d))),
    "amax": lambda d: torch.amax(_weights((3, 4)).to(d), 0, out=torch.empty(4, dtype=torch.float64, device=d)),
    "sort": lambda d: torch.sort(_weights((3, 4)).to(d), out=(
        torch.empty(3, 4, dtype=torch.float64, device=d), torch.empty(3, 4, dtype=torch.long, device=d))),
}


@pytest.mark.parametrize("name", sorted(OUT_DTYPES))
def test_out_of_another_dtype_is_refused_as_on_cpu(name):
    assert_raises_like_cpu(OUT_DTYPES[name], name)


def test_out_of_another_dtype_is_cast_where_cpu_casts():
    x = _weights((3, 4))
    out = torch.empty(3, 4, dtype=torch.float64, device="pjrt")
    torch.add(x.to("pjrt"), 1, out=out)
    torch.testing.assert_close(out.cpu(), (x + 1).double())


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


SAME_RESULT = {  # CPU accepts: pjrt must too, with the same values
    "adaptive_max_pool1d output 0, unbatched": lambda d: F.adaptive_max_pool1d(_weights((2, 3)).to(d), 0),
    "adaptive_max_pool1d output 0": lambda d: F.adaptive_max_pool1d(_weights((2, 3, 4)).to(d), 0, return_indices=True),
    "adaptive_max_pool2d output (0, 2)": lambda d: F.adaptive_max_pool2d(_weights((2, 3, 4)).to(d), (0, 2),
                                                                         return_indices=True),
    "adaptive_max_pool2d output 0": lambda d: F.adaptive_max_pool2d(_weights((2, 3, 4, 4)).to(d), 0),
    "adaptive_max_pool3d output 0": lambda d: F.adaptive_max_pool3d(_weights((2, 3, 4, 4)).to(d), 0,
                                                                    return_indices=True),
    "adaptive_avg_pool1d output 0": lambda d: F.adaptive_avg_pool1d(_weights((2, 3)).to(d), 0),
    "adaptive_avg_pool2d output (2, 0)": lambda d: F.adaptive_avg_pool2d(_weights((2, 3, 4)).to(d), (2, 0)),
    "adaptive_avg_pool3d output 0": lambda d: F.adaptive_avg_pool3d(_weights((2, 3, 4, 4)).to(d), 0),
    "adaptive_max_pool2d float16": lambda d: F.adaptive_max_pool2d(_weights((2, 3, 5, 5)).half().to(d), 2,
                                                                   return_indices=True),
    "adaptive_avg_pool2d bfloat16": lambda d: F.adaptive_avg_pool2d(_weights((2, 3, 5, 5)).bfloat16().to(d), 2),
    "adaptive_avg_pool3d float64": lambda d: F.adaptive_avg_pool3d(_weights((2, 3, 5, 5, 5)).double().to(d), 2),
    "softshrink lambda 0.5": lambda d: F.softshrink(_weights(8).to(d), 0.5),
    "softshrink lambda 0": lambda d: F.softshrink(_weights(8).to(d), 0.0),
    "softshrink lambda 1.25, float16": lambda d: F.softshrink(_weights(8).half().to(d), 1.25),
    "conv_transpose2d output_padding": lambda d: F.conv_transpose2d(_weights((1, 3, 6, 6)).to(d),
                                                                    _weights((3, 4, 3, 3)).to(d), stride=2,
                                                                    output_padding=1),
    "conv2d padding 0": lambda d: F.conv2d(_weights((1, 3, 6, 6)).to(d), _weights((4, 3, 3, 3)).to(d), padding=0),
    "as_strided_scatter in bounds": lambda d: torch.as_strided_scatter(
        _weights((4, 4)).to(d), _weights((2, 2)).to(d), [2, 2], [4, 1], storage_offset=10),
    "as_strided_scatter empty view far away": lambda d: torch.as_strided_scatter(
        _weights((4, 4)).to(d), torch.zeros(0, 2, device=d), [0, 2], [200, 1], storage_offset=100),
    "as_strided_scatter 0-d view at the end": lambda d: torch.as_strided_scatter(
        _weights((4, 4)).to(d), torch.tensor(7., device=d), [], [], storage_offset=15),
    "embedding_renorm_ in range, negative and repeated": lambda d: torch.embedding_renorm_(
        _weights((5, 3)).to(d) * 3, torch.tensor([1, -1, 1, 0], device=d), 1.0, 2.0),
    "embedding with max_norm": lambda d: F.embedding(torch.tensor([[1, 4], [4, 0]], device=d),
                                                     _weights((5, 3)).to(d) * 3, max_norm=1.0),
}


@pytest.mark.parametrize("name", sorted(SAME_RESULT))
def test_what_cpu_accepts_pjrt_accepts(name):
    expected = SAME_RESULT[name]("cpu")
    actual = SAME_RESULT[name]("pjrt")
    torch.pjrt.synchronize()
    for a, e in zip(_as_tuple(actual), _as_tuple(expected), strict=True):
        assert a.device.type == "pjrt"
        assert a.shape == e.shape and a.dtype == e.dtype
        torch.testing.assert_close(a.cpu(), e)


def test_uniform_in_range_draws_in_range():
    for from_, to in ((-1.0, 3.0), (2.0, 2.0), (-60000.0, 5000.0)):
        x = torch.empty(1000, dtype=torch.float16 if from_ == -60000.0 else torch.float32, device="pjrt")
        x.uniform_(from_, to)
        values = x.cpu().float()
        assert values.min() >= from_ and values.max() <= to


def _record(fn, device):
    """(result, [(category, message, filename)]) of fn on device, every warning recorded."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(device)
        if device == "pjrt":
            torch.pjrt.synchronize()
    # CPU's C++ warnings carry where in ATen they were raised: not part of torch's message
    return result, [(w.category, str(w.message).split(" (Triggered internally at")[0], w.filename) for w in caught]


def _mask(d):
    return torch.tensor(M8, dtype=torch.uint8, device=d)


UINT8_INDEXING = {
    "x[uint8 mask]": lambda d: _weights(3).to(d)[_mask(d)],
    "x[uint8 mask] of a matrix": lambda d: _weights((3, 2)).to(d)[_mask(d)],
    "x[uint8 mask, ints]": lambda d: _weights((3, 3)).to(d)[_mask(d), torch.tensor([0, 2], device=d)],
    "x[uint8 mask, uint8 mask] warns twice": lambda d: _weights((3, 3)).to(d)[_mask(d), _mask(d)],
    "index_put_ uint8 mask, a value per element": lambda d: _weights(3).to(d).index_put_(
        (_mask(d),), torch.tensor([5., 6.], device=d)),
    "index_put_ uint8 mask, rows": lambda d: _weights((3, 2)).to(d).index_put_(
        (_mask(d),), _weights((2, 2), 1).to(d)),
    "index_put_ uint8 mask, one value, accumulate": lambda d: _weights(3).to(d).index_put_(
        (_mask(d),), torch.tensor(5., device=d), accumulate=True),
    "index_put uint8 mask": lambda d: torch.index_put(_weights(3).to(d), (_mask(d),), torch.tensor([5., 6.], device=d)),
    "x[uint8 mask] = rows": lambda d: (lambda x: (x.__setitem__(_mask(d), _weights((2, 2), 1).to(d)), x)[1])(
        _weights((3, 2)).to(d)),
}


@pytest.mark.parametrize("name", sorted(UINT8_INDEXING))
def test_uint8_mask_indexing_warns_as_cpu_does(name):
    """CPU warns that uint8 masks are deprecated on every such call; pjrt warns the same,
    attributed to the same (caller's) line, and computes the same values."""
    call = UINT8_INDEXING[name]
    expected, expected_warnings = _record(call, "cpu")
    assert expected_warnings, "CPU does not warn: the test is wrong"
    for _ in range(2):  # the executable is cached: the second call warns too
        actual, actual_warnings = _record(call, "pjrt")
        assert actual_warnings == expected_warnings
        torch.testing.assert_close(actual.cpu(), expected)


def test_bool_masks_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = _weights((3, 2)).to("pjrt")
        mask = torch.tensor([True, False, True], device="pjrt")
        torch.testing.assert_close(x[mask].cpu(), x.cpu()[mask.cpu()])
        x[mask] = 1.0
        torch.pjrt.synchronize()
