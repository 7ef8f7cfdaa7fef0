"""Advanced indexing, gathers, scatters, masks and embeddings against CPU torch."""
import math

import pytest
import torch

from tests.ops.harness import check, make

aten = torch.ops.aten
DTYPES = [torch.float32, torch.int64, torch.bool, torch.bfloat16]


def idx(*values):
    return torch.tensor(values, dtype=torch.int64)


# ------------------------------------------------------------------ index / index_put
@pytest.mark.parametrize("dtype", DTYPES)
def test_index(dtype):
    x = make((4, 5, 6), dtype)
    check(aten.index.Tensor, x, [idx(0, -1, 2)])
    check(aten.index.Tensor, x, [None, idx(1, 1, -5)])
    check(aten.index.Tensor, x, [idx(0, 3), None, idx(5, -1)])  # separated: advanced dims go first
    check(aten.index.Tensor, x, [None, idx(0, 3), idx(5, -1)])  # adjacent: stay in place
    check(aten.index.Tensor, x, [idx(0, 1)[:, None], idx(2, 3, 4)])  # index tensors broadcast
    check(aten.index.Tensor, x, [torch.tensor(2)])  # 0-d index
    check(aten.index.Tensor, x, [idx(1, 2).to(torch.int32)])
    check(aten.index.Tensor, x, [torch.empty(0, dtype=torch.int64)])
    check(aten.index.Tensor, x, [make((4,), torch.bool, 1)])  # bool masks
    check(aten.index.Tensor, x, [None, make((5, 6), torch.bool, 2)])
    check(aten.index.Tensor, x, [make((4,), torch.bool, 3), None, idx(0, 1, 2)[: int(make((4,), torch.bool, 3).sum())]])
    check(aten.index.Tensor, x, [make((4, 5), torch.bool, 4).to(torch.uint8)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(dtype, accumulate):
    x = make((4, 5), dtype)
    v = make((3, 5), dtype, 1)
    check(aten.index_put.default, x, [idx(0, -1, 2)], v, accumulate)
    check(aten.index_put.default, x, [idx(1, 1, 1)], v, accumulate)  # duplicates: last wins / add all
    check(aten.index_put.default, x, [idx(0, 2), idx(-1, 1)], make((), dtype, 2), accumulate)
    check(aten.index_put.default, x, [None, idx(4, 0, 4)], make((4, 3), dtype, 3), accumulate)
    check(aten.index_put.default, x, [idx(0, 1)[:, None], idx(2, 2, 3)], make((2, 3), dtype, 4), accumulate)
    mask = make((4, 5), torch.bool, 5)
    check(aten.index_put.default, x, [mask], make((), dtype, 6), accumulate)
    check(aten.index_put.default, x, [mask], make((int(mask.sum()),), dtype, 6), accumulate)
    rows = make((4,), torch.bool, 7)
    check(aten.index_put.default, x, [rows], make((int(rows.sum()), 5), dtype, 8), accumulate)
    check(aten.index_put.default, x, [rows], make((5,), dtype, 8), accumulate)
    check(aten.index_put.default, x, [None, make((5,), torch.bool, 9)], make((1,), dtype, 9), accumulate)
    check(aten.index_put.default, x, [rows, idx(1)], make((), dtype, 10), accumulate)  # mask + ints
    check(aten.index_put.default, x, [torch.zeros(4, dtype=torch.bool)], make((), dtype), accumulate)


def test_index_put_many_duplicates_last_wins():
    x = torch.zeros(8)
    targets = torch.randint(0, 8, (500,), generator=torch.Generator().manual_seed(0))
    check(aten.index_put.default, x, [targets], torch.arange(500.))
    check(aten.index_put.default, x, [targets], torch.arange(500.), True)


# ------------------------------------------------------------------ gather / scatter
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_gather(dtype):
    x = make((3, 4), dtype)
    index = torch.tensor([[0, 3, 1], [2, 2, 1]])
    check(aten.gather.default, x, 1, index)
    check(aten.gather.default, x, 0, torch.tensor([[0, 1], [2, 0]]))  # index smaller than self
    check(aten.gather.default, x, -1, torch.empty(3, 0, dtype=torch.int64))
    check(aten.gather.default, make((), dtype), 0, torch.tensor(0))


SCATTER_INDEX = torch.tensor([[0, 1, 0, 2], [2, 0, 0, 1]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float64])
def test_scatter(dtype):
    x = make((3, 5), dtype)
    src = make((2, 5), dtype, 1)
    check(aten.scatter.src, x, 0, SCATTER_INDEX, src)  # duplicates: the last write wins
    check(aten.scatter.src, x, 1, SCATTER_INDEX, src)
    check(aten.scatter.value, x, 0, SCATTER_INDEX, 7)
    check(aten.scatter.value, x, -1, SCATTER_INDEX, 1.5 if dtype.is_floating_point else 2)
    check(aten.scatter_add.default, x, 0, SCATTER_INDEX, src)
    check(aten.scatter_add.default, x, 1, torch.empty(0, 0, dtype=torch.int64), src)
    for reduce in ("add", "multiply"):
        check(aten.scatter.reduce, x, 0, SCATTER_INDEX, src, reduce=reduce)
        check(aten.scatter.value_reduce, x, 1, SCATTER_INDEX, 3, reduce=reduce)
    check(aten.scatter.src, make((), dtype), 0, torch.tensor(0), make((), dtype, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float64])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(dtype, reduce, include_self):
    x = make((3, 5), dtype)
    src = make((2, 5), dtype, 1)
    check(aten.scatter_reduce.two, x, 0, SCATTER_INDEX, src, reduce, include_self=include_self)
    check(aten.scatter_reduce.two, x, 1, SCATTER_INDEX, src, reduce, include_self=include_self)
    if dtype.is_floating_point and reduce in ("amax", "amin"):
        src[0, 0] = math.nan
        check(aten.scatter_reduce.two, x, 0, SCATTER_INDEX, src, reduce, include_self=include_self)


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_bool(reduce, include_self):
    """bool sum is or, bool prod is and, as on CPU."""
    x, src = make((3, 5), torch.bool), make((2, 5), torch.bool, 1)
    check(aten.scatter_reduce.two, x, 0, SCATTER_INDEX, src, reduce, include_self=include_self)


# ------------------------------------------------------------------ index_* along a dim
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_index_dim_ops(dtype):
    x = make((4, 3), dtype)
    index = torch.tensor([2, 0, -1])
    check(aten.index_select.default, x, 0, torch.tensor([3, 0, 0]))
    check(aten.index_select.default, x, -1, torch.tensor([2]))
    check(aten.index_select.default, x, 1, torch.tensor(1))
    check(aten.index_select.default, make((), dtype), 0, torch.tensor([0]))
    src = make((3, 3), dtype, 1)
    check(aten.index_add.default, x, 0, torch.tensor([2, 0, 2]), src)
    check(aten.index_add.default, x, 1, torch.tensor([1, 1, 0]), make((4, 3), dtype, 2))
    if dtype != torch.bool:
        check(aten.index_add.default, x, 0, torch.tensor([1, 3, 1]), src, alpha=2)
    check(aten.index_copy.default, x, 0, torch.tensor([2, 0, 3]), src)
    check(aten.index_copy.default, x, 0, torch.tensor([1, 1, 1]), src)  # duplicates: last wins
    check(aten.index_copy.default, x, 1, torch.tensor([2, 0]), make((4, 2), dtype, 3))
    check(aten.index_fill.int_Scalar, x, 0, index, 5)
    check(aten.index_fill.int_Scalar, x, -1, torch.tensor([1]), 0)
    check(aten.index_fill.int_Tensor, x, 1, torch.tensor([0, 2]), make((), dtype, 4))


# ------------------------------------------------------------------ masks
@pytest.mark.parametrize("dtype", DTYPES)
def test_masked(dtype):
    x = make((3, 4), dtype)
    mask = make((3, 4), torch.bool, 1)
    check(aten.masked_fill.Scalar, x, mask, 3)
    check(aten.masked_fill.Scalar, x, mask[0], 0)  # broadcast mask
    check(aten.masked_fill.Scalar, x[0], mask, 1)  # broadcast self
    check(aten.masked_fill.Tensor, x, mask, make((), dtype, 2))
    if dtype.is_floating_point:
        check(aten.masked_fill.Scalar, x, mask, -math.inf)
    source = make((12,), dtype, 3)
    check(aten.masked_scatter.default, x, mask, source)
    check(aten.masked_scatter.default, x, mask[1], source.reshape(3, 4))
    check(aten.masked_scatter.default, x, torch.zeros(3, 4, dtype=torch.bool), make((0,), dtype))
    check(aten.masked_select.default, x, mask)
    check(aten.masked_select.default, x, mask[:, :1])
    check(aten.masked_select.default, make((), dtype), torch.tensor(True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_take_put_nonzero(dtype):
    x = make((3, 4), dtype)
    check(aten.take.default, x, torch.tensor([[0, 11], [-1, 5]]))
    check(aten.take.default, x, torch.tensor(3))
    check(aten.put.default, x, torch.tensor([0, -1, 5]), make((3,), dtype, 1))
    check(aten.put.default, x, torch.tensor([[1, 1], [2, 1]]), make((2, 2), dtype, 2))
    check(aten.put.default, x, torch.tensor([1, 1, 2]), make((3,), dtype, 3), True)
    for t in (x, make((5,), dtype), make((2, 0), dtype), make((), dtype), torch.ones((), dtype=dtype),
              torch.zeros(3, dtype=dtype)):
        check(aten.nonzero.default, t)
        check(aten.nonzero_static.default, t, size=4)
        check(aten.nonzero_static.default, t, size=1, fill_value=7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
def test_where_scalar(dtype):
    cond = make((3, 4), torch.bool, 1)
    x = make((3, 4), dtype)
    check(aten.where.ScalarOther, cond, x, 2)
    check(aten.where.ScalarOther, cond, x, 2.5)
    check(aten.where.ScalarSelf, cond[0], -1, x)
    check(aten.where.Scalar, cond, 1, 0)
    check(aten.where.Scalar, cond, 1.0, 0)
    check(aten.where.Scalar, cond, True, False)


# ------------------------------------------------------------------ embeddings
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_embedding(dtype):
    weight = make((10, 3), dtype)
    indices = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]])
    check(aten.embedding.default, weight, indices)
    check(aten.embedding.default, weight, torch.tensor(7))
    grad = make((2, 4, 3), dtype, 1)
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else {}
    for padding_idx in (-1, 4):
        for scale in (False, True):
            check(aten.embedding_dense_backward.default, grad, indices, 10, padding_idx, scale, **tol)
    check(aten.embedding_dense_backward.default, make((3,), dtype, 2), torch.tensor(2), 5, -1, False)


EMBEDDING_BAG_INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2, 2])
EMBEDDING_BAG_OFFSETS = torch.tensor([0, 4, 4, 6, 8])  # an empty bag, a last bag of padding only


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("padding_idx", [-1, 2])
def test_embedding_bag(dtype, mode, include_last_offset, padding_idx):
    """All four outputs as CPU gives them (offset2bag empty on its fast sum path), then backward."""
    weight = make((10, 3), dtype)
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else {}
    # with include_last_offset, offsets end at len(indices): CPU's fast sum path ignores indices
    # past the last offset, its other paths add them to the last bag (pjrt: the latter)
    offsets = torch.cat([EMBEDDING_BAG_OFFSETS, torch.tensor([10])]) if include_last_offset else EMBEDDING_BAG_OFFSETS
    args = (weight, EMBEDDING_BAG_INDICES, offsets, False, mode, False, None, include_last_offset, padding_idx)
    out, offset2bag, bag_size, max_indices = check(aten._embedding_bag.default, *args, **tol)
    check(aten._embedding_bag_forward_only.default, *args, **tol)
    grad = make(tuple(out.shape), dtype, 1)
    check(aten._embedding_bag_backward.default, grad, EMBEDDING_BAG_INDICES, offsets, offset2bag,
          bag_size, max_indices, 10, False, mode, False, None, padding_idx, **tol)


def test_embedding_bag_scale_grad_by_freq():
    """Each index's gradient is divided by how often it occurs, as in embedding and on CUDA.

    CPU's embedding_bag backward scales some rows by another index's count (here rows 3 and 5,
    which occur once, by 1/4), so the reference is embedding's backward over the bags' rows."""
    grad = make((5, 3), torch.float64, 1)
    bags = torch.tensor([0, 0, 0, 0, 2, 2, 3, 3, 4, 4])
    expected = aten.embedding_dense_backward(grad[bags], EMBEDDING_BAG_INDICES, 10, -1, True)
    args = [grad, EMBEDDING_BAG_INDICES, EMBEDDING_BAG_OFFSETS, bags, torch.zeros(5, dtype=torch.int64),
            torch.zeros(5, dtype=torch.int64), 10, True, 0, False, None, -1]
    got = aten._embedding_bag_backward(*[a.to("pjrt") if isinstance(a, torch.Tensor) else a for a in args])
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_embedding_bag_per_sample_weights(dtype):
    weight, psw = make((10, 3), dtype), make((10,), dtype, 2)
    out, offset2bag, bag_size, max_indices = check(
        aten._embedding_bag.default, weight, EMBEDDING_BAG_INDICES, EMBEDDING_BAG_OFFSETS, False, 0, False, psw)
    grad = make(tuple(out.shape), dtype, 1)
    check(aten._embedding_bag_backward.default, grad, EMBEDDING_BAG_INDICES, EMBEDDING_BAG_OFFSETS, offset2bag,
          bag_size, max_indices, 10, False, 0, False, psw, -1)
    check(aten._embedding_bag_per_sample_weights_backward.default, grad, weight, EMBEDDING_BAG_INDICES,
          EMBEDDING_BAG_OFFSETS, offset2bag, 0, 2)


def test_embedding_bag_index_out_of_range_raises_as_on_cpu():
    weight, offsets = make((10, 3)), torch.tensor([0])
    with pytest.raises(RuntimeError, match=r"Index 1 of input takes value 10 which is not in the valid range \[0, 10\)"):
        aten._embedding_bag(weight.to("pjrt"), torch.tensor([1, 10]).to("pjrt"), offsets.to("pjrt"))
        torch.pjrt.synchronize()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_unsafe_index_family(dtype):
    x = make((4, 5), dtype)
    i = torch.tensor([[0, 3], [-1, 2]])
    check(aten._unsafe_index.Tensor, x, [i])
    check(aten._unsafe_index.Tensor, x, [None, torch.tensor([4, 0])])
    check(aten._unsafe_index_put.default, x, [torch.tensor([1, 1, 2])], make((3, 5), dtype, 1), True)
    mask = torch.tensor([[True, False], [True, True]])
    wild = torch.tensor([[1, 99], [2, -50]])  # out of range where masked off
    check(aten._unsafe_masked_index.default, x, mask, [wild, torch.tensor([0, 4])], 7)
    check(aten._unsafe_masked_index_put_accumulate.default, x, mask, [wild, torch.tensor([0, 4])],
          make((2, 2), dtype, 2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_accumulation_as_cpu(dtype):
    """scatter_add / scatter_reduce sum accumulate half types in float32 (rounded once), index_put
    accumulates in the tensor's dtype, as CPU's kernels do: bitwise equal."""
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 5, (200,), generator=g)
    src, x = (torch.randn(200, generator=g) * 3).to(dtype), torch.randn(5, generator=g).to(dtype)
    exact = dict(atol=0, rtol=0)
    check(aten.scatter_add.default, x, 0, idx, src, **exact)
    check(aten.scatter_reduce.two, x, 0, idx, src, "sum", **exact)
    check(aten.scatter_reduce.two, x, 0, idx, src, "mean", include_self=False, **exact)
    check(aten.index_put.default, x, [idx], src, True, **exact)
    check(aten.index_add.default, x, 0, idx, src, **exact)
