"""Sparse COO tensors on pjrt against torch CPU (eager/sparse.py, runtime/csrc/sparse.cpp).

A COO tensor on pjrt holds its indices and values as pjrt tensors; the ops that sparse
gradients and their optimizers call (coalesce, add into dense, sparse_mask) and the common
ones around them (to/cpu, to_dense, sparse + sparse, index_select, sparse @ dense, to_sparse)
give CPU's results; nn.Embedding / nn.EmbeddingBag(sparse=True) train with SGD, SparseAdam
and Adagrad to CPU's parameters. Any other op on a sparse pjrt tensor raises one
NotImplementedError naming it. tests/test_other_eager_mode.py reruns this file in the other
eager mode.
"""
from __future__ import annotations

import re
import warnings

import pytest
import torch

import torch_pjrt

warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")

INDICES = torch.tensor([[0, 1, 1, 2, 0], [2, 0, 0, 1, 2]])  # duplicates: (1, 0) and (0, 2)


def coo(dtype=torch.float64, dense=()):
    """A 3x3 (x dense) uncoalesced COO tensor on the CPU."""
    torch.manual_seed(0)
    values = torch.randn((INDICES.shape[1], *dense), dtype=dtype)
    return torch.sparse_coo_tensor(INDICES, values, (3, 3, *dense))


def same(got, expected):
    """got (on pjrt) equals expected (CPU): layout, sizes, indices and values."""
    assert got.device.type == "pjrt" and got.layout == expected.layout
    got = got.cpu()
    if expected.is_sparse:
        assert got.is_sparse and got.shape == expected.shape and got.sparse_dim() == expected.sparse_dim()
        got, expected = got.coalesce(), expected.coalesce()
        assert torch.equal(got.indices(), expected.indices())
        got, expected = got.values(), expected.values()
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dense", [(), (2,)])
def test_create_move_and_read_back(dense):
    s = coo(dense=dense)
    p = s.to("pjrt")
    assert p.is_sparse and p.device.type == "pjrt" and p._nnz() == 5 and not p.is_coalesced()
    assert p._indices().device.type == "pjrt" and p._values().device.type == "pjrt"
    assert (p.sparse_dim(), p.dense_dim()) == (s.sparse_dim(), s.dense_dim())
    back = p.cpu()
    assert torch.equal(back._indices(), s._indices()) and torch.equal(back._values(), s._values())
    built = torch.sparse_coo_tensor(INDICES.to("pjrt"), s._values().to("pjrt"), s.shape)
    assert built.device.type == "pjrt" and torch.equal(built.cpu().to_dense(), s.to_dense())
    empty = torch.empty(2, 3, layout=torch.sparse_coo, device="pjrt")
    assert empty.is_sparse and empty._nnz() == 0 and torch.equal(empty.cpu().to_dense(), torch.zeros(2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("dense", [(), (2,)])
def test_coalesce_and_to_dense(dtype, dense):
    s = coo(dense=dense).to(dtype) if dtype.is_floating_point else torch.sparse_coo_tensor(
        INDICES, torch.arange(5 * (2 if dense else 1)).reshape(5, *dense).to(dtype), (3, 3, *dense))
    p = s.to("pjrt")
    c = p.coalesce()
    assert c.is_coalesced() and c._nnz() == 3
    assert torch.equal(c.cpu()._indices(), s.coalesce()._indices())
    torch.testing.assert_close(c.cpu()._values(), s.coalesce()._values())
    same(p.to_dense(), s.to_dense())
    same(p.clone(), s.clone())
    same(-p, -s)
    same(p * 3, s * 3)


def test_add_into_dense_and_sparse():
    s = coo()
    d = torch.randn(3, 3, dtype=torch.float64)
    p, dp = s.to("pjrt"), d.to("pjrt")
    same(dp + p, d + s)
    same(torch.add(dp, p, alpha=2.5), torch.add(d, s, alpha=2.5))
    same(p + p, s + s)
    same(p.add(p, alpha=-1.5), s.add(s, alpha=-1.5))
    view = dp.t()  # in place through a non-contiguous view writes the base
    view.add_(p)
    d.t().add_(s)
    same(dp, d)
    with pytest.raises(RuntimeError, match="add.*same size"):
        torch.zeros(2, 3, dtype=torch.float64, device="pjrt").add_(p)
    with pytest.raises(RuntimeError, match="Can't convert result type Double to output Long in add operation"):
        torch.zeros(3, 3, dtype=torch.int64).add_(s)  # CPU's error, then pjrt's
    with pytest.raises(RuntimeError, match="Can't convert result type Double to output Long in add operation"):
        torch.zeros(3, 3, dtype=torch.int64, device="pjrt").add_(p)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        dp.add_(s)  # a CPU sparse tensor into a pjrt tensor, as CUDA refuses it


def _raises_like_cpu(call, s, p, *others):
    """call(p, ...) on pjrt raises what call(s, ...) raises on the CPU (type and message)."""
    with pytest.raises(Exception) as on_cpu:
        call(s, *(o.cpu() if isinstance(o, torch.Tensor) else o for o in others))
    with pytest.raises(type(on_cpu.value), match=f"^{re.escape(str(on_cpu.value))}$"):
        call(p, *others)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_sub_mul_div_as_on_cpu(dtype):
    """sparse - sparse (and dense - sparse); sparse * sparse (positions both hold, each coalesced
    first), sparse * dense either side (a sparse product), sparse * / scalar; the errors CPU raises
    for the rest (test_type_promotion's test_sparse_{add,sub,mul,div})."""
    s, t = (coo() * 4).to(dtype), torch.sparse_coo_tensor(torch.tensor([[1, 0, 2], [0, 2, 2]]), torch.tensor([3, -2, 5]), (3, 3))
    t = t.to(dtype)
    d = torch.randn(3, 3, dtype=torch.float64)
    p, q, dp = s.to("pjrt"), t.to("pjrt"), d.to("pjrt")
    same(p - q, s - t)
    same(dp - p, d - s)
    same((p * q).to_dense(), (s * t).to_dense())  # (CPU keeps an explicit zero where only t holds one)
    same(p * dp, s * d)
    same(dp * p, d * s)
    same(p * dp[0], s * d[0])  # a dense operand that broadcasts to the sparse one's shape
    same(p * 2.5, s * 2.5)
    same(p * torch.tensor(3, device="pjrt"), s * torch.tensor(3))
    same(p / 2, s / 2)
    same(torch.true_divide(p, 4), torch.true_divide(s, 4))
    same(p.div(-3, rounding_mode="floor"), s.div(-3, rounding_mode="floor"))
    same(dp.clone().mul_(p), d.clone().mul_(s))
    same(dp.clone().sub_(p), d.clone().sub_(s))
    if dtype.is_floating_point:
        same(p.clone().mul_(q).to_dense(), s.clone().mul_(t).to_dense())
        same(p.clone().div_(2), s.clone().div_(2))
    else:
        _raises_like_cpu(lambda a: a.clone().div_(2), s, p)
        with pytest.raises(RuntimeError, match="^Can't convert result type Double to output Long"):
            p.clone().mul_(dp.to_sparse())  # (CPU's message ends there or goes on "in mul operation", by path)
    for call in (lambda a: a + 1, lambda a: a - 1, lambda a, b: a - b, lambda a, b: a / b, lambda a, b: b / a):
        args = (dp,) if call.__code__.co_argcount == 2 else ()
        _raises_like_cpu(call, s, p, *args)
    bools = torch.sparse_coo_tensor(INDICES, INDICES[0] > 0, (3, 3))
    _raises_like_cpu(lambda a: a - a, bools, bools.to("pjrt"))


def test_sparse_mask_of_a_sparse_tensor_and_its_projection():
    """sparse_mask of a sparse self (duplicates summed, zero where self holds nothing) and
    _sparse_mask_projection (self's indices kept, values outside mask zeroed): the backward of
    sparse_mask and of a sparse constructor (test_autograd's test_sparse_mask_autograd and
    test_sparse_ctor_getter_backward)."""
    s = coo(dense=(2,))
    mask = torch.sparse_coo_tensor(torch.tensor([[1, 2, 0], [0, 2, 1]]), torch.ones(3, 2), (3, 3, 2)).coalesce()
    p, m = s.to("pjrt"), mask.to("pjrt")
    same(p.sparse_mask(m), s.sparse_mask(mask))
    same(p._sparse_mask_projection(m), s._sparse_mask_projection(mask))
    x = torch.randn(3, 3, 2, dtype=torch.float64)
    xp = x.to("pjrt").requires_grad_()
    x.requires_grad_()
    x.sparse_mask(mask.to(torch.float64)).to_dense().sum().backward()
    xp.sparse_mask(m.to(torch.float64)).to_dense().sum().backward()
    same(xp.grad, x.grad)

    def through_a_sparse_tensor(values, device):
        y = (torch.sparse_coo_tensor(INDICES.to(device), values, (3, 3)) + coo().to(device)).coalesce()
        return torch.sparse_coo_tensor(y.indices(), y.values().tanh(), y.size()).coalesce().values()

    values = torch.randn(5, dtype=torch.float64, requires_grad=True)
    values_p = values.detach().to("pjrt").requires_grad_()
    through_a_sparse_tensor(values, "cpu").sum().backward()
    through_a_sparse_tensor(values_p, "pjrt").sum().backward()
    same(values_p.grad, values.grad)


def test_no_sparse_dim():
    """A COO tensor with no sparse dim (each value is the whole tensor): coalesce sums them, add
    into dense and sparse_mask as on the CPU."""
    s = torch.sparse_coo_tensor(torch.zeros(0, 5, dtype=torch.long), torch.randn(5, 2, dtype=torch.float64), (2,))
    p = s.to("pjrt")
    same(p.coalesce(), s.coalesce())
    d = torch.randn(2, dtype=torch.float64)
    same(d.to("pjrt") + p, d + s)
    same(d.to("pjrt").sparse_mask(p.coalesce()), d.sparse_mask(s.coalesce()))
    with pytest.raises(RuntimeError, match="^dense_to_sparse: sparse_dim argument must be in >0 when self.dim"):
        d.to("pjrt").to_sparse(0)  # CPU's error


def test_sparse_mask_index_select_and_mm():
    s = coo(dense=(2,))
    d = torch.randn(3, 3, 2, dtype=torch.float64)
    p, dp = s.to("pjrt"), d.to("pjrt")
    same(dp.sparse_mask(p.coalesce()), d.sparse_mask(s.coalesce()))
    for dim, index in ((0, [2, 0, 0]), (1, [0, 2]), (2, [1, 1, 0]), (-1, [1])):
        index = torch.tensor(index)
        same(p.index_select(dim, index.to("pjrt")), s.index_select(dim, index))
    m = coo()
    mat = torch.randn(3, 4, dtype=torch.float64)
    same(m.to("pjrt") @ mat.to("pjrt"), m @ mat)
    same(torch.sparse.mm(m.to("pjrt"), mat.to("pjrt")), torch.sparse.mm(m, mat))
    bias = torch.randn(3, 4, dtype=torch.float64)
    same(torch.addmm(bias.to("pjrt"), m.to("pjrt"), mat.to("pjrt"), beta=0.5, alpha=2),
         torch.addmm(bias, m, mat, beta=0.5, alpha=2))


def test_dense_to_sparse():
    x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    for args in ((), (1,)):
        got, expected = x.to("pjrt").to_sparse(*args), x.to_sparse(*args)
        assert got.is_coalesced() == expected.is_coalesced()
        same(got, expected)


def _train(device, optimizer, bag=False, steps=5):
    """A tiny recommender (a sparse embedding table, then a linear layer) trained `steps`
    steps in float64; the table gets sparse gradients and `optimizer`, the layer SGD."""
    torch.manual_seed(0)
    table = (torch.nn.EmbeddingBag(20, 8, mode="mean", sparse=True) if bag
             else torch.nn.Embedding(20, 8, sparse=True, padding_idx=3))
    model = torch.nn.Sequential(table, torch.nn.Linear(8, 1)).double().to(device)
    cls, kwargs = optimizer
    opt = cls(table.parameters(), **kwargs)
    dense_opt = torch.optim.SGD(model[1].parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, 20, (6, 4), generator=g).to(device)
        out = model(idx) if bag else model(idx).sum(1)
        loss = ((out - 1) ** 2).mean()
        opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        assert table.weight.grad.is_sparse
        opt.step()
        dense_opt.step()
    return [p.detach().cpu() for p in model.parameters()]


OPTIMIZERS = {"SGD": (torch.optim.SGD, dict(lr=0.1)), "SparseAdam": (torch.optim.SparseAdam, dict(lr=0.05)),
              "Adagrad": (torch.optim.Adagrad, dict(lr=0.1)), "SGD momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9))}


@pytest.mark.parametrize("bag", [False, True], ids=["Embedding", "EmbeddingBag"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_sparse_embedding_trains_as_on_cpu(name, bag):
    before = dict(torch_pjrt.fallback_ops())
    expected = _train("cpu", OPTIMIZERS[name], bag)
    got = _train("pjrt", OPTIMIZERS[name], bag)
    assert not torch.equal(expected[0], _train("cpu", OPTIMIZERS[name], bag, steps=0)[0])  # the table moved
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert torch_pjrt.fallback_ops() == before  # all on pjrt


def test_uncovered_sparse_op_raises_one_clear_error():
    p = coo().to("pjrt")
    for op, call in (("aten.sin", torch.sin), ("aten.pow", lambda t: t.pow(2)),
                     ("aten._sparse_softmax", lambda t: torch.sparse.softmax(t, 0))):
        with pytest.raises(NotImplementedError, match=rf"^pjrt: {op}.*: no pjrt kernel for sparse tensors "
                                                      r"\(devices: pjrt:0\)"):
            call(p)
    csr = torch.eye(3).to("pjrt")
    with pytest.raises(NotImplementedError, match="_to_sparse_csr.*sparse_csr.*not supported"):
        csr.to_sparse_csr()
