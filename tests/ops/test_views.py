"""Functional view ops (as FX graphs meet them) and their *_scatter inverses, against CPU torch."""
import pytest
import torch

from tests.ops.harness import check, make

aten = torch.ops.aten
DTYPES = [torch.float32, torch.int64, torch.bool, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshapes(dtype):
    x = make((2, 3, 4), dtype)
    for op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default):
        check(op, x, [4, -1])
        check(op, x, [24])
        check(op, make((), dtype), [1, 1])
        check(op, make((0, 3), dtype), [3, 0, 5])
        check(op, make((0, 3), dtype), [-1, 3])
    check(aten._reshape_alias.default, x, [6, 4], [4, 1])
    with pytest.raises(RuntimeError):
        check(aten.view.default, x, [5, -1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_dim_shuffles(dtype):
    x = make((2, 3, 4), dtype)
    check(aten.t.default, make((3, 5), dtype))
    check(aten.t.default, make((3,), dtype))
    check(aten.t.default, make((), dtype))
    check(aten.transpose.int, x, 0, -1)
    check(aten.transpose.int, make((), dtype), 0, -1)
    check(aten.permute.default, x, [2, 0, 1])
    check(aten.permute.default, x, [-1, -2, -3])
    check(aten.permute.default, make((), dtype), [])
    check(aten.expand.default, make((3, 1), dtype), [2, 3, 4])
    check(aten.expand.default, make((3, 1), dtype), [-1, 5])
    check(aten.expand.default, make((), dtype), [2, 2])
    check(aten.expand_copy.default, make((1,), dtype), [0])
    for dim in (0, 1, -1, 3):
        check(aten.unsqueeze.default, x, dim)
    check(aten.unsqueeze.default, make((), dtype), -1)
    y = make((1, 3, 1, 2), dtype)
    check(aten.squeeze.default, y)
    check(aten.squeeze.dim, y, -2)
    check(aten.squeeze.dim, y, 1)  # not size 1: unchanged
    check(aten.squeeze.dims, y, [0, 1, 2])
    check(aten.squeeze.default, make((), dtype))
    check(aten.squeeze.dim, make((), dtype), 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_slicing(dtype):
    x = make((5, 6), dtype)
    for args in [(0, 1, 4), (1, None, None, 2), (-1, -4, -1), (0, 2, 100, 3), (0, -100, 2), (1, 5, 2), (0, 4, 2)]:
        check(aten.slice.Tensor, x, *args)
    check(aten.slice_copy.Tensor, x, 1, 2, None, 3)
    for dim, index in [(0, 0), (1, -1), (-1, 3)]:
        check(aten.select.int, x, dim, index)
    with pytest.raises(IndexError):
        check(aten.select.int, x, 0, 5)
    check(aten.narrow.default, x, 1, 2, 3)
    check(aten.narrow.default, x, -1, -3, 2)
    check(aten.narrow.Tensor, x, 0, torch.tensor(1), 3)
    check(aten.narrow.Tensor, x, 1, torch.tensor(-2), 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_diagonal_unfold(dtype):
    x = make((3, 4, 5), dtype)
    for offset in (0, 1, -2, 4, -3, 10):
        check(aten.diagonal.default, x, offset)
        check(aten.diagonal.default, x, offset, -1, 0)
    check(aten.diagonal_copy.default, x, 1, 2, 1)
    for dim, size, step in [(0, 2, 1), (-1, 3, 2), (1, 4, 4), (2, 0, 1)]:
        check(aten.unfold.default, x, dim, size, step)
    check(aten.unfold.default, make((), dtype), 0, 1, 1)
    check(aten.unfold_copy.default, make((7,), dtype), 0, 3, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float64])
def test_as_strided(dtype):
    x = make((4, 5), dtype)
    check(aten.as_strided.default, x, [2, 3], [5, 1])
    check(aten.as_strided.default, x, [3, 3], [1, 5], 2)
    check(aten.as_strided.default, x, [4, 2, 2], [1, 0, 4])  # overlapping, zero stride
    check(aten.as_strided.default, x, [0, 3], [1, 1])
    check(aten.as_strided_copy.default, x, [5], [4], 1)
    src = make((3, 3), dtype, seed=1)
    check(aten.as_strided_scatter.default, x, src, [3, 3], [1, 5], 2)
    check(aten.as_strided_scatter.default, x, make((2, 2), dtype, seed=2), [2, 2], [10, 2])


def test_identities():
    x = make((2, 3))
    for op in (aten.alias.default, aten.detach.default, aten.lift_fresh.default, aten.alias_copy.default,
               aten.detach_copy.default, aten.lift_fresh_copy.default):
        check(op, x)
        check(op, make(()))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_view_as_real_complex(dtype):
    z = torch.randn(3, 4, dtype=dtype)
    check(aten.view_as_real.default, z)
    check(aten.view_as_real.default, torch.randn((), dtype=dtype))
    real = torch.randn(3, 4, 2, dtype=torch.float32 if dtype == torch.complex64 else torch.float64)
    check(aten.view_as_complex.default, real)
    check(aten.view_as_complex_copy.default, real[0])


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.int32), (torch.int64, torch.float64),
                                     (torch.float32, torch.int16), (torch.int8, torch.int32),
                                     (torch.bool, torch.uint8), (torch.uint8, torch.bool),
                                     (torch.bfloat16, torch.int16), (torch.float16, torch.bfloat16)])
def test_view_dtype(src, dst):
    x = make((3, 8), src) if src != torch.uint8 else torch.randint(0, 2, (3, 8), dtype=torch.uint8)
    check(aten.view.dtype, x, dst)
    if x.element_size() == torch.empty((), dtype=dst).element_size():
        check(aten.view.dtype, make((), src) if src != torch.uint8 else torch.tensor(1, dtype=torch.uint8), dst)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_splits(dtype):
    x = make((7, 4), dtype)
    check(aten.split.Tensor, x, 3)
    check(aten.split.Tensor, x, 2, -1)
    check(aten.split.Tensor, x, 10)
    check(aten.split_copy.Tensor, make((0, 2), dtype), 0)
    check(aten.split_with_sizes.default, x, [2, 0, 5])
    check(aten.split_with_sizes_copy.default, x, [1, 3], 1)
    check(aten.chunk.default, x, 3)
    check(aten.chunk.default, x, 4, 1)
    check(aten.chunk.default, make((0,), dtype), 2)
    check(aten.unbind.int, x)
    check(aten.unbind.int, x, -1)
    check(aten.unbind_copy.int, make((0, 3), dtype), 1)
    with pytest.raises(RuntimeError):
        check(aten.split_with_sizes.default, x, [2, 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_scatters(dtype):
    x = make((5, 6), dtype)
    check(aten.slice_scatter.default, x, make((5, 2), dtype, 1), 1, 1, 5, 2)
    check(aten.slice_scatter.default, x, make((2, 6), dtype, 1), 0, -2)
    check(aten.slice_scatter.default, x, make((0, 6), dtype, 1), 0, 4, 1)
    check(aten.select_scatter.default, x, make((6,), dtype, 2), 0, -1)
    check(aten.select_scatter.default, x, make((5,), dtype, 2), 1, 2)
    check(aten.diagonal_scatter.default, x, make((5,), dtype, 3))
    check(aten.diagonal_scatter.default, x, make((4,), dtype, 3), 2)
    check(aten.diagonal_scatter.default, x, make((4,), dtype, 3), -2, 1, 0)
    y = make((2, 3, 4), dtype)
    check(aten.diagonal_scatter.default, y, make((3, 2), dtype, 4), 0, 0, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_view_backward_ops(dtype):
    g = make((5, 2), dtype)
    check(aten.slice_backward.default, g, [5, 6], 1, 1, 5, 2)
    check(aten.slice_backward.default, make((2, 6), dtype), [5, 6], 0, -2, 9223372036854775807, 1)
    check(aten.select_backward.default, make((6,), dtype), [5, 6], 0, -1)
    check(aten.diagonal_backward.default, make((4,), dtype), [5, 6], 2, 0, 1)
    check(aten.diagonal_backward.default, make((3, 2), dtype), [2, 3, 4], 0, 0, 2)
    check(aten.unfold_backward.default, make((3, 3, 4), dtype), [3, 9], 1, 4, 2)  # overlapping windows add
    check(aten.unfold_backward.default, make((2, 3), dtype), [7], 0, 3, 3)
    check(aten.narrow_copy.default, make((5, 6), dtype), 1, 2, 3)
