"""Concatenation, flips, repeats, pads, copies and factories against CPU torch."""
import math

import pytest
import torch

from tests.ops.harness import check, make

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_cat_stack(dtype):
    a, b = make((2, 3), dtype), make((4, 3), dtype, 1)
    check(aten.cat.default, [a, b])
    check(aten.cat.default, [a, make((2, 1), dtype)], -1)
    check(aten.cat.default, [a, torch.empty(0, dtype=dtype), b])  # legacy 1-D empties are skipped
    check(aten.cat.default, [torch.empty(0, dtype=dtype), a], 1)
    check(aten.cat.default, [torch.empty(0, dtype=dtype)])
    check(aten.cat.default, [a, make((2, 3), torch.float64)])  # promotes
    check(aten.stack.default, [a, a])
    check(aten.stack.default, [a, make((2, 3), dtype, 2)], -1)
    check(aten.stack.default, [make((), dtype), make((), dtype, 1)])
    check(aten.stack.default, [a, make((2, 3), torch.int32)], 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_flip_roll_repeat(dtype):
    x = make((3, 4, 2), dtype)
    check(aten.flip.default, x, [0])
    check(aten.flip.default, x, [-1, 1])
    check(aten.flip.default, x, [])
    check(aten.flip.default, make((), dtype), [0])
    check(aten.roll.default, x, [1])
    check(aten.roll.default, x, [-5, 2], [0, -1])
    check(aten.repeat.default, x, [2, 1, 3])
    check(aten.repeat.default, x, [2, 1, 1, 0])
    check(aten.repeat.default, make((), dtype), [3, 2])
    with pytest.raises(RuntimeError, match="repeat dims"):
        check(aten.repeat.default, make((2,), dtype), [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_repeat_interleave(dtype):
    x = make((3, 2), dtype)
    r = torch.tensor([2, 0, 3])
    check(aten.repeat_interleave.Tensor, r)
    check(aten.repeat_interleave.Tensor, r, output_size=5)
    check(aten.repeat_interleave.self_Tensor, x, r, 0)
    check(aten.repeat_interleave.self_Tensor, x, torch.tensor([1, 2]), -1)
    check(aten.repeat_interleave.self_Tensor, x, torch.tensor(2))
    check(aten.repeat_interleave.self_Tensor, x, torch.tensor([3]), 1, output_size=6)
    check(aten.repeat_interleave.self_int, x, 3)
    check(aten.repeat_interleave.self_int, x, 2, -1)
    check(aten.repeat_interleave.self_int, make((), dtype), 4)
    check(aten.repeat_interleave.self_int, x, 0, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_tril_triu(dtype):
    for shape in [(4, 5), (2, 3, 3), (0, 3)]:
        x = make(shape, dtype)
        for k in (0, 1, -2, 7, -9):
            check(aten.tril.default, x, k)
            check(aten.triu.default, x, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float64])
def test_constant_pad(dtype):
    x = make((2, 3, 4), dtype)
    check(aten.constant_pad_nd.default, x, [1, 2])
    check(aten.constant_pad_nd.default, x, [1, 0, 0, 2, 3, 1], 1)
    check(aten.constant_pad_nd.default, x, [-1, 2, 1, -2])  # negative pads crop
    check(aten.constant_pad_nd.default, x, [])
    if dtype.is_floating_point:
        check(aten.constant_pad_nd.default, x, [2, 2], 2.5)
        check(aten.constant_pad_nd.default, x, [1, 1], -math.inf)


@pytest.mark.parametrize("kind", ["reflection", "replication"])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_reflect_replicate_pad(kind, nd):
    pad = [2, 1, 0, 1, 1, 2][: 2 * nd]
    fwd = getattr(aten, f"{kind}_pad{nd}d").default
    bwd = getattr(aten, f"{kind}_pad{nd}d_backward").default
    for batch in ((2, 3), (3,)):
        x = make(batch + (4,) * nd, torch.float64)
        check(fwd, x, pad)
        out = fwd(x, pad)
        check(bwd, make(out.shape, torch.float64, 1), x, pad)
    check(fwd, make((2, 3) + (4,) * nd, torch.float32), pad)


@pytest.mark.parametrize("pad", [[-4, 5], [2, -4], [-2, -1], [5, -4]])
def test_replication_pad_negative_widths(pad):
    """Negative widths crop, and a side cropped away still replicates the nearest element."""
    x = make((2, 3, 4), torch.float64)
    check(aten.replication_pad1d.default, x, pad)
    out = aten.replication_pad1d(x, pad)
    check(aten.replication_pad1d_backward.default, make(out.shape, torch.float64, 1), x, pad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64, torch.bfloat16])
@pytest.mark.parametrize("to", [torch.float64, torch.int32, torch.bool, torch.float16, torch.uint8])
def test_to_copy(dtype, to):
    x = make((3, 4), dtype)
    if dtype.is_floating_point:
        x = x * 5
    if to == torch.uint8 and dtype.is_floating_point or dtype.is_complex and to == torch.uint8:
        x = x.abs()  # negative float -> uint8 is undefined in C++
    check(aten._to_copy.default, x, dtype=to)
    check(aten._to_copy.default, x)
    check(aten.clone.default, x)
    check(aten.contiguous.default, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_like_factories(dtype):
    x = make((2, 3), dtype)
    for op in (aten.zeros_like.default, aten.ones_like.default):
        check(op, x)
        check(op, x, dtype=torch.float64)
    check(aten.full_like.default, x, 3)
    check(aten.full_like.default, x, 2.5, dtype=torch.float64)
    check(aten.full_like.default, x, True, dtype=torch.int32)
    check(aten.new_zeros.default, x, [4, 1])
    check(aten.new_ones.default, x, [0, 2], dtype=torch.int32)
    check(aten.new_full.default, x, [3], 7)
    check(aten.new_full.default, x, [2, 2], 1.5, dtype=torch.float64)


def test_empty_like_and_new_empty_are_zeros():
    # torch leaves them uninitialised; we give zeros (a defined value) with torch's shape/dtype
    from tests.ops.harness import run_lowering
    x = make((2, 3))
    for out in (run_lowering(aten.empty_like.default, x), run_lowering(aten.new_empty.default, x, [2, 3]),
                run_lowering(aten.new_empty_strided.default, x, [2, 3], [3, 1])):
        torch.testing.assert_close(out, torch.zeros(2, 3))


def test_efficientzerotensor_is_zeros():
    """torch.func's zero gradients: CPU gives a ZeroTensor, pjrt plain zeros of the same value."""
    for dtype in (None, torch.float64, torch.int32):
        cpu = aten._efficientzerotensor.default([2, 3], dtype=dtype)
        out = aten._efficientzerotensor.default([2, 3], dtype=dtype, device="pjrt")
        assert out.device.type == "pjrt" and out.dtype == cpu.dtype and not out._is_zerotensor()
        torch.testing.assert_close(out.cpu(), torch.zeros(2, 3, dtype=cpu.dtype))


@pytest.mark.parametrize("value", [3, 2.5, True, -1, 1 + 2j])
def test_full_scalar_tensor(value):
    check(aten.full.default, [2, 3], value)
    check(aten.full.default, [0], value)
    check(aten.full.default, [2], value, dtype=torch.complex128 if isinstance(value, complex) else torch.float64)
    if not isinstance(value, complex):
        check(aten.full.default, [], value, dtype=torch.int32)
        check(aten.scalar_tensor.default, value)
        check(aten.scalar_tensor.default, value, dtype=torch.int64)


def test_arange():
    check(aten.arange.default, 5)
    check(aten.arange.default, 5.5)
    check(aten.arange.default, 0)
    check(aten.arange.default, 4, dtype=torch.float64)
    check(aten.arange.start, -3, 4)
    check(aten.arange.start, 0.5, 3, dtype=torch.float16)


@pytest.mark.parametrize("dtype", [None, torch.float64, torch.int64, torch.float16, torch.complex64])
@pytest.mark.parametrize("steps", [0, 1, 2, 7, 100])
def test_linspace_logspace(dtype, steps):
    kw = {} if dtype is None else {"dtype": dtype}
    tol = dict(atol=1e-2, rtol=1e-3) if dtype == torch.float16 else {}
    if dtype == torch.int64:
        # integer outputs: only exact steps; with a fractional step torch's vectorised CPU
        # path truncates differently depending on the vector width
        check(aten.linspace.default, -2, 10.5, 7, **kw)
        check(aten.linspace.default, 100, 1, 100, **kw)
        return
    check(aten.linspace.default, -2, 10.5, steps, **kw, **tol)
    check(aten.linspace.default, 10, 0, steps, **kw, **tol)
    check(aten.linspace.Tensor_Tensor, torch.tensor(1.), torch.tensor(5.), steps, **kw, **tol)
    check(aten.linspace.Tensor_Scalar, torch.tensor(1.), 5, steps, **kw, **tol)
    check(aten.linspace.Scalar_Tensor, -1, torch.tensor(2), steps, **kw, **tol)
    if dtype != torch.float16:
        check(aten.logspace.default, -2, 2, steps, **kw)
        check(aten.logspace.default, 0, 3, steps, 2.0, **kw)
        check(aten.logspace.Tensor_Tensor, torch.tensor(0.), torch.tensor(1.), steps, 3.0, **kw)
        check(aten.logspace.Tensor_Scalar, torch.tensor(0.), 1, steps, **kw)
        check(aten.logspace.Scalar_Tensor, 1, torch.tensor(0.), steps, **kw)


def test_eye():
    check(aten.eye.default, 3)
    check(aten.eye.default, 0)
    check(aten.eye.m, 2, 4, dtype=torch.int64)
    check(aten.eye.m, 4, 2, dtype=torch.bool)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_copy(dtype):
    x = make((2, 3), dtype)
    check(aten.copy.default, x, make((2, 3), torch.float64, 1))
    check(aten.copy.default, x, make((3,), torch.int32, 2))  # src broadcasts
    check(aten.copy.default, x, make((), dtype, 3))


def test_tensor_list_out_variants():
    """Ops whose only out= is a Tensor[] write each tensor and return None, as on CPU."""
    x = make((4, 5), torch.float32)
    outs = [torch.empty(2, 5, device="pjrt"), torch.empty(0, device="pjrt")]
    assert torch.split_with_sizes_copy(x.to("pjrt"), [2, 2], out=outs) is None
    for out, expected in zip(outs, x.split([2, 2])):
        torch.testing.assert_close(out.cpu(), expected)
    outs = [torch.empty(5, device="pjrt") for _ in range(4)]
    torch.unbind_copy(x.to("pjrt"), 0, out=outs)
    for out, expected in zip(outs, x.unbind(0)):
        torch.testing.assert_close(out.cpu(), expected)
