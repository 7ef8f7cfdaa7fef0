"""Silent differences from CPU torch (issue 32): calls where pjrt returned another value, or
raised nothing where CPU raises. Each runs on CPU (the reference) and on pjrt.

Values are compared exactly, with the result's layout where CPU's is part of the op's
contract (as_strided_scatter keeps self's strides and storage offset); errors with
`assert_raises_like_cpu` (same type, same first line).
"""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from tests.ops.harness import assert_raises_like_cpu, in_eager_mode


def _same_as_cpu(call, layout: bool = False) -> None:
    """call(device) gives the same tensor on pjrt as on CPU (and the same strides and storage
    offset where `layout`)."""
    expected, actual = call("cpu"), call("pjrt")
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    if layout:
        assert (actual.stride(), actual.storage_offset()) == (expected.stride(), expected.storage_offset())


# --------------------------------------------------------------------------- as_strided on views with an offset
def _arange_view(d, start=2, stop=10):
    return torch.arange(12.0, device=d)[start:stop]


def _src(d):
    return torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], device=d)


@pytest.mark.parametrize("offset", [None, 0, 1, 3])
def test_as_strided_scatter_addresses_the_storage_of_a_view(offset):
    # CPU writes through as_strided of a copy of self's whole storage: the offset is a storage
    # position, and the result keeps self's strides and offset
    _same_as_cpu(lambda d: torch.as_strided_scatter(_arange_view(d), _src(d), (2, 2), (1, 2), offset), layout=True)


def test_as_strided_scatter_of_a_transposed_view_and_out():
    _same_as_cpu(lambda d: torch.as_strided_scatter(_arange_view(d, 3, 12).view(3, 3).t(), _src(d), (2, 2), (1, 2), 4),
                 layout=True)
    _same_as_cpu(lambda d: torch.ops.aten.as_strided_scatter.out(_arange_view(d), _src(d), (2, 2), (1, 2), 1,
                                                                 out=torch.empty(8, device=d)))


def test_as_strided_scatter_gradient_through_a_view():
    def grads(d):
        self_ = _arange_view(d).clone().requires_grad_()
        src = _src(d).requires_grad_()
        out = torch.as_strided_scatter(self_, src, (2, 2), (1, 2), 1)
        (out * torch.arange(8.0, device=d)).sum().backward()
        return torch.cat([self_.grad, src.grad.flatten()])

    _same_as_cpu(grads)


@pytest.mark.parametrize("offset", [None, 0, 10])
def test_as_strided_copy_addresses_the_storage_of_a_view(offset):
    # OpInfo's as_strided.partial_views: base[5:15] with storage offsets 0 and 10
    _same_as_cpu(lambda d: torch.as_strided_copy(torch.arange(20.0, device=d)[5:15], (2, 2), (1, 2), offset))
    _same_as_cpu(lambda d: torch.ops.aten.as_strided_copy.out(torch.arange(20.0, device=d)[5:15], (2, 2), (1, 2),
                                                              offset, out=torch.empty(2, 2, device=d)))
    _same_as_cpu(lambda d: torch.as_strided(torch.arange(20.0, device=d)[5:15], (2, 2), (1, 2), offset) * 1)


AS_STRIDED_SCATTER_ERRORS = {
    "src size": lambda d: torch.as_strided_scatter(_arange_view(d), torch.zeros(3, 2, device=d), (2, 2), (1, 2)),
    "repeated elements": lambda d: torch.as_strided_scatter(_arange_view(d), _src(d), (2, 2), (0, 2)),
    "past the storage": lambda d: torch.as_strided_scatter(_arange_view(d), _src(d), (2, 2), (1, 20)),
}


@pytest.mark.parametrize("name", AS_STRIDED_SCATTER_ERRORS)
def test_as_strided_scatter_errors(name):
    assert_raises_like_cpu(AS_STRIDED_SCATTER_ERRORS[name], name)


COPY_OVERLAP_ERRORS = {
    "into an expanded tensor": lambda d: torch.zeros(3, device=d).expand(2, 3).copy_(torch.ones(2, 3, device=d)),
    "from a host tensor into an expanded tensor": lambda d: torch.zeros(3, device=d).expand(2, 3).copy_(
        torch.ones(2, 3)),
    "from a partly overlapping view": lambda d: (lambda x: x[1:].copy_(x[:-1]))(torch.arange(5.0, device=d)),
}


@pytest.mark.parametrize("name", COPY_OVERLAP_ERRORS)
def test_copy_overlapping_its_target_raises(name):
    # torch's copy_ hands pjrt to _copy_from before its own overlap checks
    assert_raises_like_cpu(COPY_OVERLAP_ERRORS[name], name)


def test_copy_of_the_same_view_is_allowed():
    _same_as_cpu(lambda d: (lambda x: x.copy_(x))(torch.arange(5.0, device=d)))


# An in-place op on a whole tensor reading its own storage through another argument: the C++ fast
# path ran these unchecked (it sent only writes through views to the overlap checks); CPU refuses
# (test_torch's test_{index_add,index_fill,...}_mem_overlap)
SELF_READ_ERRORS = {
    "add_ of self transposed": lambda d: (lambda x: x.view(2, 3).add_(x.view(3, 2).t()))(torch.arange(6.0, device=d)),
    "index_add_ of a view of self": lambda d: (lambda y: y.index_add_(0, torch.tensor([0, 1, 2], device=d), y[:3]))(
        torch.arange(6.0, device=d)),
    "mul_ by an element of self": lambda d: (lambda x: x.mul_(x[0]))(torch.arange(6.0, device=d)),
    "index_fill_ indexed by self": lambda d: (lambda i: i.index_fill_(0, i, 0))(torch.tensor([0, 1, 2], device=d)),
}


@pytest.mark.parametrize("name", SELF_READ_ERRORS)
def test_an_in_place_op_reading_its_own_storage_raises(name):
    assert_raises_like_cpu(SELF_READ_ERRORS[name], name)


@pytest.mark.parametrize("call", [lambda x: x.add_(x), lambda x: x[:3].add_(x[3:]), lambda x: x.mul_(x.clone())],
                         ids=["the same tensor", "disjoint views", "a copy"])
def test_an_in_place_op_reading_its_own_storage_where_cpu_allows_it(call):
    _same_as_cpu(lambda d: call(torch.arange(6.0, device=d)))


# dst.copy_(src) where src does not broadcast to dst: JAX's ValueError reached the user (test_torch's
# test_broadcast_fn_copy); CPU raises its TensorIterator's errors, from pjrt or from the host alike
COPY_SHAPE_ERRORS = {"(2,1,2,1) <- (3,2)": ((2, 1, 2, 1), (3, 2)), "(3,) <- (2,)": ((3,), (2,)),
                     "(0,) <- (2,)": ((0,), (2,)), "(2,) <- (1,2)": ((2,), (1, 2)),
                     "(2,) <- (3,2)": ((2,), (3, 2)), "() <- (1,)": ((), (1,))}


@pytest.mark.parametrize("src_on_host", [False, True])
@pytest.mark.parametrize("name", COPY_SHAPE_ERRORS)
def test_copy_of_a_source_that_does_not_broadcast_raises(name, src_on_host):
    dst, src = COPY_SHAPE_ERRORS[name]
    assert_raises_like_cpu(
        lambda d: torch.zeros(dst, device=d).copy_(torch.ones(src, device="cpu" if src_on_host else d)), name)


@pytest.mark.parametrize("src", [(3,), (1, 3), (2, 1), (), (1,)])
def test_copy_of_a_source_that_broadcasts(src):
    _same_as_cpu(lambda d: torch.zeros(2, 3, device=d).copy_(torch.arange(float(torch.Size(src).numel()), device=d).reshape(src)))


# --------------------------------------------------------------------------- complex random draws
# CPU draws a complex tensor over view_as_real(self): both parts, independently (normal_ gives
# each part half the variance and adds the mean to both). Values cannot match across RNGs; the
# distribution's moments and ranges must.
N = 20000


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_uniform_draws_both_parts(dtype):
    for make in (lambda d: torch.empty(N, dtype=dtype, device=d).uniform_(-3, 2),
                 lambda d: torch.rand(N, dtype=dtype, device=d) * 5 - (3 + 3j)):
        x = make("pjrt").cpu()
        for part in (x.real, x.imag):
            assert part.dtype == x.real.dtype
            assert part.min() >= -3 and part.max() < 2
            assert abs(part.mean().item() + 0.5) < 0.1 and abs(part.var().item() - 25 / 12) < 0.15
        assert abs(torch.corrcoef(torch.stack([x.real, x.imag]))[0, 1].item()) < 0.05  # independent draws


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_normal_draws_both_parts(dtype):
    for make in (lambda d: torch.empty(N, dtype=dtype, device=d).normal_(5, 2),
                 lambda d: torch.randn(N, dtype=dtype, device=d) * 2 + (5 + 5j)):
        x = make("pjrt").cpu()
        for part in (x.real, x.imag):
            assert abs(part.mean().item() - 5) < 0.1
            assert abs(part.std().item() - 2 / 2 ** 0.5) < 0.05  # CPU: std / sqrt(2) per part
        assert abs(torch.corrcoef(torch.stack([x.real, x.imag]))[0, 1].item()) < 0.05


def test_complex_normal_matches_cpu_moments_with_a_mean():
    # mean goes to both parts on CPU (not only the real part, as a complex z * std + mean would)
    cpu = torch.empty(N, dtype=torch.complex64).normal_(3, 1)
    pjrt = torch.empty(N, dtype=torch.complex64, device="pjrt").normal_(3, 1).cpu()
    for a, b in ((cpu.real, pjrt.real), (cpu.imag, pjrt.imag)):
        assert abs(a.mean() - b.mean()) < 0.05 and abs(a.std() - b.std()) < 0.05


COMPLEX_RANDOM_ERRORS = {
    "random_": lambda d: torch.zeros(4, dtype=torch.complex64, device=d).random_(),
    "random_ to": lambda d: torch.zeros(4, dtype=torch.complex64, device=d).random_(3),
    "bernoulli_ p": lambda d: torch.zeros(4, dtype=torch.complex64, device=d).bernoulli_(0.5),
    "bernoulli_ tensor": lambda d: torch.zeros(4, dtype=torch.complex64, device=d).bernoulli_(
        torch.full((4,), 0.5, device=d)),
    "bernoulli": lambda d: torch.bernoulli(torch.zeros(4, dtype=torch.complex64, device=d)),
}


@pytest.mark.parametrize("name", COMPLEX_RANDOM_ERRORS)
def test_complex_random_ops_without_a_cpu_kernel_raise(name):
    assert_raises_like_cpu(COMPLEX_RANDOM_ERRORS[name], name)


# --------------------------------------------------------------------------- embedding_bag's checks
def _raises_exactly_like_cpu(call, monkeypatch) -> None:
    """As assert_raises_like_cpu, comparing the whole message: index checks then raise at the
    call (TORCH_PJRT_SYNC_INDEX_CHECKS=1), without the note an asynchronous check adds."""
    monkeypatch.setenv("TORCH_PJRT_SYNC_INDEX_CHECKS", "1")
    errors = []
    for d in ("cpu", "pjrt"):
        with pytest.raises(Exception) as info:
            call(d).cpu()
        errors.append(info.value)
    assert (type(errors[1]), str(errors[1])) == (type(errors[0]), str(errors[0]))


def _bag_inputs(idx, mode, w_dtype, idx_dtype, padding_idx, weighted):
    def call(d):
        index = torch.tensor(idx, device=d, dtype=idx_dtype)
        weight = torch.arange(20, device=d).reshape(10, 2).to(w_dtype)
        per_sample = torch.ones(index.shape, device=d, dtype=w_dtype) if weighted else None
        return torch.nn.functional.embedding_bag(index, weight, per_sample_weights=per_sample,
                                                 padding_idx=padding_idx, mode=mode)
    return call


# PyTorch's test_embedding_bag_out_of_bounds_idx (padding_idx 0: CPU's loop), and without
# padding_idx (CPU's fbgemm path for float rows, which words the error differently)
@pytest.mark.parametrize("idx", [[[-1, 1]], [[11, 8]]])
@pytest.mark.parametrize("mode,weighted", [("sum", False), ("sum", True), ("mean", False), ("max", False)])
@pytest.mark.parametrize("padding_idx", [0, None])
@pytest.mark.parametrize("w_dtype,idx_dtype", [(torch.float32, torch.int64), (torch.float64, torch.int32),
                                               (torch.bfloat16, torch.int64)])
def test_embedding_bag_index_out_of_range(idx, mode, weighted, padding_idx, w_dtype, idx_dtype, monkeypatch):
    call = _bag_inputs(idx, mode, w_dtype, idx_dtype, padding_idx, weighted)
    assert_raises_like_cpu(call, "embedding_bag")  # asynchronous: at the next sync
    _raises_exactly_like_cpu(call, monkeypatch)


def _offsets_call(indices, offsets, dtype=torch.int64, w_dtype=torch.float32):
    return lambda d: torch.nn.functional.embedding_bag(
        torch.tensor(indices, device=d, dtype=dtype), torch.ones(3, 4, device=d, dtype=w_dtype),
        torch.tensor(offsets, device=d, dtype=dtype))


EMBEDDING_BAG_DATA_ERRORS = {
    "offsets[0] not 0": _offsets_call([0, 1], [1]),
    "offsets[0] not 0, int32": _offsets_call([0, 1], [1], torch.int32),
    "offsets[0] negative": _offsets_call([0, 1], [-2, 1]),
    "offsets[-1] past the input": _offsets_call([0, 1, 2], [0, 5]),
    "offsets[-1] past the input, float64": _offsets_call([0, 1, 2], [0, 4], w_dtype=torch.float64),
    # 1-D input, the bad index in the first bag: CPU's fbgemm report is right whatever its threads
    "index in the first bag": _offsets_call([0, 7, 1], [0, 2]),
    "index in the first bag, float64": _offsets_call([5, 1, 1], [0, 2], w_dtype=torch.float64),
}


@pytest.mark.parametrize("name", EMBEDDING_BAG_DATA_ERRORS)
def test_embedding_bag_data_errors(name, monkeypatch):
    assert_raises_like_cpu(EMBEDDING_BAG_DATA_ERRORS[name], name)
    _raises_exactly_like_cpu(EMBEDDING_BAG_DATA_ERRORS[name], monkeypatch)


EMBEDDING_BAG_FUNCTIONS = {
    "F.embedding_bag": lambda w, i, o: torch.nn.functional.embedding_bag(i, w, o),
    "embedding_bag": torch.embedding_bag,
    "_embedding_bag": torch._embedding_bag,
    "_embedding_bag_forward_only": torch._embedding_bag_forward_only,
}
# PyTorch's test_embedding_bag_dimension_errors: (weight, indices, offsets) shapes
DIMENSION_CASES = {
    "5-D input": ((2, 6), (2, 0, 0, 6, 6), (2, 0, 0, 6, 6)),
    "5-D offsets": ((2, 2), (2,), (2, 0, 0, 6, 6)),
    "3-D weight": ((2, 2, 2), (2,), (2,)),
    "2-D offsets": ((3, 4), (4,), (1, 2)),
}


@pytest.mark.parametrize("function", EMBEDDING_BAG_FUNCTIONS)
@pytest.mark.parametrize("case", DIMENSION_CASES)
def test_embedding_bag_dimension_errors(function, case):
    weight, indices, offsets = DIMENSION_CASES[case]
    assert_raises_like_cpu(lambda d: EMBEDDING_BAG_FUNCTIONS[function](
        torch.zeros(weight, dtype=torch.float64, device=d), torch.zeros(indices, dtype=torch.int64, device=d),
        torch.zeros(offsets, dtype=torch.int64, device=d)), f"{function} {case}")


def test_embedding_bag_mode_out_of_range():
    assert_raises_like_cpu(lambda d: torch._embedding_bag(torch.ones(3, 4, device=d), torch.tensor([0, 1], device=d),
                                                          torch.tensor([0], device=d), False, 5), "mode 5")


@pytest.mark.parametrize("function", [f for f in EMBEDDING_BAG_FUNCTIONS if f != "F.embedding_bag"] + ["nn.EmbeddingBag"])
def test_embedding_bag_per_sample_weights_of_another_dtype(function):
    """PyTorch's test_EmbeddingBag_per_sample_weights_failures: CPU refuses float64 weights for a
    float32 table; pjrt computed in silence (CUDA raises too, with its own message)."""
    def call(d):
        index, offsets = torch.tensor([3, 1, 1, 1, 4, 0], device=d), torch.tensor([0, 0, 3, 3, 6], device=d)
        weights = torch.ones(6, dtype=torch.float64, device=d)
        if function == "nn.EmbeddingBag":
            return torch.nn.EmbeddingBag(5, 2, mode="sum").to(d)(index, offsets, weights)
        return EMBEDDING_BAG_FUNCTIONS[function](torch.ones(5, 2, device=d), index, offsets, False, 0, False, weights)

    with pytest.raises(RuntimeError, match="to have the same type as"):
        call("cpu")
    assert_raises_like_cpu(call, function)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("offsets", [[0, 1], [0, 0], [0, 2]], ids=str)
def test_embedding_bag_reads_2d_indices_by_flat_position(weighted, offsets):
    """CPU's _embedding_bag sums 2-D indices with offsets as their flattening (only the
    functional wrapper refuses the pair); its backward asserts 1-D, so forward only. Mean and
    max are not compared: there CPU counts bags over the first dimension and sums over all
    elements (docs/conformance-notes.md)."""
    weight, indices, mode = torch.randn(10, 3), torch.tensor([[1, 2], [3, 4]]), 0
    weights = torch.randn(4) if weighted else None

    def run(device):
        return [r.cpu() for r in torch._embedding_bag(
            weight.to(device), indices.to(device), torch.tensor(offsets, device=device), mode=mode,
            per_sample_weights=None if weights is None else weights.to(device))]

    for got, expected in zip(run("pjrt"), run("cpu")):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_with_no_indices_gives_empty_bags(mode):
    """PyTorch's test_embedding_bag_device: every bag empty (max mode took from an empty axis)."""
    def run(device):
        weight = (torch.arange(30.0).reshape(10, 3) / 7).to(device).requires_grad_()
        out = torch.nn.functional.embedding_bag(torch.tensor([], dtype=torch.long, device=device), weight,
                                                torch.tensor([0, 0], device=device), mode=mode)
        out.sum().backward()
        return out.detach().cpu(), weight.grad.cpu()

    for got, expected in zip(run("pjrt"), run("cpu")):
        torch.testing.assert_close(got, expected)


def test_embedding_max_norm_with_a_computed_index():
    """The renorm's index check sorts the index inside its executable: a pending (fused) index
    or a view of one is not on the host yet (its probe read it as an array)."""
    def run(device):
        weight = (torch.arange(30.0).reshape(10, 3) - 12).to(device)
        index = torch.tensor([1, 2, 4, 5, 4, 9], device=device) * 1
        out = torch.nn.functional.embedding(index[::2], weight, max_norm=1.0)
        return out.cpu(), weight.cpu()

    for got, expected in zip(run("pjrt"), run("cpu")):
        torch.testing.assert_close(got, expected)
    with pytest.raises(IndexError, match=r"select\(\): index 20 out of range"):
        torch.nn.functional.embedding(torch.tensor([1, 20], device="pjrt") * 1, torch.ones(10, 3, device="pjrt"),
                                      max_norm=1.0).cpu()


# --------------------------------------------------------------------------- multinomial's checks
def _multinomial_error_inputs():
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(op for op in op_db if op.name == "multinomial")
    on_device = list(op.error_inputs("pjrt"))  # built on the device, as torch's device tests build them
    # the OpInfo yields its bad distributions for the CPU only (their values; moved to pjrt below)
    return on_device + list(op.error_inputs("cpu"))[len(on_device):]


@pytest.mark.parametrize("i", range(len(_multinomial_error_inputs())))
def test_multinomial_error_inputs(i, monkeypatch):
    """OpInfo's error_inputs of multinomial, on pjrt: CPU's type and message (for the same
    values copied to the CPU), and the OpInfo's regex."""
    error_input = _multinomial_error_inputs()[i]
    sample = error_input.sample_input

    def call(d):
        moved = [a.to(d) if isinstance(a, torch.Tensor) else a for a in (sample.input, *sample.args)]
        kwargs = {k: v.to(d) if isinstance(v, torch.Tensor) else v for k, v in sample.kwargs.items()}
        return torch.multinomial(*moved, **kwargs)

    assert_raises_like_cpu(call, f"multinomial error input {i}")
    _raises_exactly_like_cpu(call, monkeypatch)
    with pytest.raises(error_input.error_type, match=error_input.error_regex):
        call("pjrt").cpu()


MULTINOMIAL_ERRORS = {
    # with replacement, CPU checks row by row: the first row's problem names the error
    "zero row before a negative one": lambda d: torch.multinomial(
        torch.tensor([[0.0, 0.0], [1.0, -1.0]], device=d), 3, True),
    "negative row before a zero one": lambda d: torch.multinomial(
        torch.tensor([[1.0, -1.0], [0.0, 0.0]], device=d), 3, True),
    "inf before a negative entry in the row": lambda d: torch.multinomial(
        torch.tensor([[float("inf"), -1.0]], device=d), 3, True),
    # without replacement (or one sample), CPU checks the whole tensor at once
    "zero row and a nan elsewhere": lambda d: torch.multinomial(
        torch.tensor([[0.0, 0.0], [1.0, float("nan")]], device=d), 1),
    "one sample with replacement": lambda d: torch.multinomial(torch.tensor([1.0, -1.0], device=d), 1, True),
    "float16": lambda d: torch.multinomial(torch.tensor([1.0, float("inf")], dtype=torch.float16, device=d), 2, True),
    "bfloat16": lambda d: torch.multinomial(torch.tensor([0.0, 0.0], dtype=torch.bfloat16, device=d), 1),
    "a strided view": lambda d: torch.multinomial(
        torch.tensor([[1.0, -1.0], [0.0, 0.0]], device=d).t(), 1),
    "num_samples 0 with replacement": lambda d: torch.multinomial(torch.ones(3, device=d), 0, True),
}


@pytest.mark.parametrize("name", MULTINOMIAL_ERRORS)
def test_multinomial_data_errors(name, monkeypatch):
    assert_raises_like_cpu(MULTINOMIAL_ERRORS[name], name)
    _raises_exactly_like_cpu(MULTINOMIAL_ERRORS[name], monkeypatch)


def test_multinomial_of_valid_weights_still_samples():
    torch.manual_seed(0)
    weights = torch.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0]], device="pjrt")
    drawn = torch.multinomial(weights, 200, True).cpu()
    assert (drawn[0] != 0).all() and (drawn[1] == 0).all()
    assert torch.multinomial(weights, 2).cpu()[1, 0] == 0


# --------------------------------------------------------------------------- out= overlapping an input
OUT_OVERLAP_ERRORS = {
    "gather into its input": lambda d: (lambda x: torch.gather(x, 0, torch.tensor([0, 1], device=d), out=x[:2]))(
        torch.arange(10.0, device=d)),
    "gather into part of its input": lambda d: (lambda x: torch.gather(
        x[:4], 0, torch.tensor([0, 1], device=d), out=x[1:3]))(torch.arange(10.0, device=d)),
    "gather into an expanded tensor": lambda d: torch.gather(
        torch.arange(10.0, device=d), 0, torch.tensor([0, 1], device=d), out=torch.zeros(1, device=d).expand(2)),
    "scatter into part of its input": lambda d: (lambda x: torch.scatter(
        x[:8], 0, torch.tensor([0, 1], device=d), x[5:7], out=x[2:]))(torch.arange(10.0, device=d)),
}


@pytest.mark.parametrize("name", OUT_OVERLAP_ERRORS)
def test_out_overlapping_an_input_raises(name):
    assert_raises_like_cpu(OUT_OVERLAP_ERRORS[name], name)


def test_gather_into_exactly_its_index_is_allowed():
    # CPU refuses partial overlap with the index, not the index itself
    _same_as_cpu(lambda d: (lambda i: torch.gather(torch.arange(10, 20, device=d), 0, i, out=i))(
        torch.tensor([3, 1], device=d)))


# --------------------------------------------------------------------------- fuzz: views with offsets
STORAGE = 40


def _random_view_geometry(rng, storage: int = STORAGE, max_dims: int = 3):
    """(size, stride, offset) of a random non-overlapping view that fits in `storage` elements:
    dims in a random order, a step of 1 or 2, at a random offset."""
    ndim = rng.randint(1, max_dims)
    size = [rng.randint(1, 4) for _ in range(ndim)]
    order = list(range(ndim))
    rng.shuffle(order)
    stride, step = [0] * ndim, rng.choice([1, 1, 2])
    for d in reversed(order):  # the last of `order` varies fastest
        stride[d] = step
        step *= size[d]
    span = sum((n - 1) * s for n, s in zip(size, stride)) + 1
    if span > storage:
        return _random_view_geometry(rng, storage, max_dims)
    return tuple(size), tuple(stride), rng.randint(0, storage - span)


def _fuzz_case(seed: int):
    """One seeded case: (description, call(device) -> tensors to compare)."""
    import random

    rng = random.Random(seed)
    view = _random_view_geometry(rng)
    kind = rng.choice(["as_strided", "as_strided_scatter", "as_strided write", "index_put_", "scatter_"])
    target = _random_view_geometry(rng)

    def call(d):
        rng, g = random.Random(seed + 1), torch.Generator().manual_seed(seed)  # the same draws on each device
        base = torch.arange(STORAGE, dtype=torch.float32).to(d)
        v = base.as_strided(*view)
        if kind == "as_strided":  # a read: the offset is a storage position, not one within v
            return [v.as_strided(*target) + 0]
        if kind == "as_strided_scatter":
            src = torch.randn(target[0], generator=g).to(d)
            out = torch.as_strided_scatter(v, src, *target)
            return [out, torch.tensor([*out.stride(), out.storage_offset()]), base]
        if kind == "as_strided write":
            v.as_strided(*target).mul_(-1)
            return [base]
        count = rng.randint(1, 3)
        index = [torch.randint(0, n, (count,), generator=g).to(d) for n in v.shape]
        if kind == "index_put_":
            values = torch.randn(index[0].shape, generator=g).to(d)
            v.index_put_(index, values, accumulate=True)  # duplicates add: no order dependence
            return [base]
        dim = rng.randrange(v.dim())
        # a permutation along dim, cut short: distinct targets, so no write order to depend on
        idx = torch.rand(v.shape, generator=g).argsort(dim).narrow(dim, 0, rng.randint(1, v.shape[dim])).to(d)
        v.scatter_(dim, idx, torch.randn(v.shape, generator=g).to(d))
        return [base]

    return f"seed {seed}: {kind} of view {view} (target {target})", call


@pytest.mark.parametrize("chunk", range(4))
def test_fuzz_views_with_offsets_against_cpu(chunk):
    """300 seeded cases: as_strided reads, as_strided_scatter, writes through as_strided,
    index_put_ (accumulating) and scatter_ into strided views at storage offsets; every value (and
    as_strided_scatter's layout) as on CPU."""
    for seed in range(chunk * 75, (chunk + 1) * 75):
        name, call = _fuzz_case(seed)
        expected = call("cpu")
        actual = call("pjrt")
        for e, a in zip(expected, actual):
            torch.testing.assert_close(a.cpu(), e, rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")


# --------------------------------------------------------------------------- empty inputs, saved statistics
EMPTY_CALLS = {
    "linalg.cholesky 0x0": lambda d: torch.linalg.cholesky(torch.empty(0, 0, device=d)),
    "linalg.cholesky upper 2x0x0": lambda d: torch.linalg.cholesky(torch.empty(2, 0, 0, device=d), upper=True),
    "linalg.cholesky_ex 0x0 factor": lambda d: torch.linalg.cholesky_ex(torch.empty(0, 0, device=d))[0],
    "linalg.cholesky_ex 2x0x0 info": lambda d: torch.linalg.cholesky_ex(torch.empty(2, 0, 0, device=d))[1],
    "_softmax over a zero-size dim": lambda d: torch._softmax(torch.empty(0, 3, device=d), 0, False),
    "_log_softmax over a zero-size dim": lambda d: torch._log_softmax(torch.empty(3, 0, device=d), 1, False),
    "softmax of an empty batch": lambda d: torch.softmax(torch.empty(0, 3, device=d), 1),
}


@pytest.mark.parametrize("name", EMPTY_CALLS)
def test_empty_inputs_as_on_cpu(name):
    _same_as_cpu(EMPTY_CALLS[name])
    assert EMPTY_CALLS[name]("pjrt").dtype == EMPTY_CALLS[name]("cpu").dtype


def test_native_batch_norm_eval_saves_empty_statistics():
    # CPU's saved mean and invstd are empty in evaluation mode (torch's own trace of
    # _native_batch_norm_legit treats a non-CPU device as CUDA and returns running_mean)
    def shapes(d, training, stats=True):
        x = torch.randn(2, 3, device=d)
        rm, rv = (torch.zeros(3, device=d), torch.ones(3, device=d)) if stats else (None, None)
        return [t.shape for t in torch.ops.aten.native_batch_norm(x, None, None, rm, rv, training, 0.1, 1e-5)]

    for training, stats in ((False, True), (True, True), (True, False)):
        assert shapes("pjrt", training, stats) == shapes("cpu", training, stats)


@pytest.mark.parametrize("training", [False, True])
def test_batch_norm_values_and_gradients(training):
    def call(d):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 3, 4, generator=g).to(d).requires_grad_()
        w, b = torch.rand(3, generator=g).to(d).requires_grad_(), torch.rand(3, generator=g).to(d).requires_grad_()
        rm, rv = torch.rand(3, generator=g).to(d), (torch.rand(3, generator=g) + 1).to(d)
        y = torch.nn.functional.batch_norm(x, rm, rv, w, b, training=training)
        (y * torch.arange(24.0, device=d).reshape(2, 3, 4)).sum().backward()
        return torch.cat([t.detach().flatten() for t in (y, x.grad, w.grad, b.grad, rm, rv)])

    torch.testing.assert_close(call("pjrt").cpu(), call("cpu"), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- foreach op_ over tensors sharing memory
def _foreach_sharing(d):
    """One tensor twice, and two views of one storage, in a foreach op_'s self (and its other
    lists): CPU applies the op tensor by tensor, each seeing the writes before it."""
    a, b = torch.ones(3, device=d), torch.arange(4.0, device=d)
    base = torch.arange(6.0, device=d).reshape(1, 6) + 1
    flat, grid = base.view(6), base.view(2, 3)
    torch._foreach_mul_([a, a, flat, grid], 0.5)
    torch._foreach_add_([b, b], [b, b])
    torch._foreach_addcmul_([a, a, b], [b[:3], b[:3], b], [a, b[:3], b], value=2.0)
    torch._foreach_mul_([flat, grid], torch.tensor(3.0, device=d))
    return torch.cat([a, b, base.view(6)])


def test_foreach_in_place_over_tensors_sharing_memory():
    _same_as_cpu(_foreach_sharing)


# --------------------------------------------------------------------------- advanced indexing checks
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int16, torch.int8])
@pytest.mark.parametrize("op", ["getitem", "setitem", "index_put"])
def test_index_tensors_of_other_dtypes_raise(dtype, op):
    # pjrt indexed with a float index's truncation (x[tensor([0.5])] gave x[0]), CPU raises IndexError
    def call(d):
        x, i = torch.arange(4, device=d), torch.tensor([1, 0], device=d).to(dtype)
        if op == "getitem":
            return x[i]
        if op == "setitem":
            x[i] = 7
            return x
        return torch.index_put(x, (i,), torch.tensor(7, device=d))

    assert_raises_like_cpu(call, f"{op} {dtype}")


_MASKED_WRITES = {  # values that do not broadcast to the masked selection (pjrt wrote them anyway)
    "empty_values": lambda d: (torch.arange(4, device=d), [True] * 4, torch.tensor([], dtype=torch.int64)),
    "too_many": lambda d: (torch.arange(4, device=d), [True] * 4, torch.tensor([1, 2, 3])),
    "too_few_selected": lambda d: (torch.arange(4, device=d), [True, False, False, False], torch.tensor([1, 2, 3])),
    "none_selected": lambda d: (torch.arange(4.0, device=d), [False] * 4, torch.tensor([1.0, 2.0])),
    "inner_dim": lambda d: (torch.zeros(2, 3, device=d), (slice(None), [True, False, True]), torch.ones(2, 3)),
    "inner_dim_1d": lambda d: (torch.zeros(2, 3, device=d), (slice(None), [True, False, True]), torch.ones(3)),
}


def _masked_write(case, d):
    x, where, values = _MASKED_WRITES[case](d)
    if isinstance(where, tuple):
        key = (where[0], torch.tensor(where[1], device=d))
    else:
        key = torch.tensor(where, device=d) & (x > -1)  # a computed mask
    x[key] = values.to(d)
    return x


@pytest.mark.parametrize("case", sorted(_MASKED_WRITES))
def test_masked_write_of_values_that_do_not_broadcast_raises(case):
    assert_raises_like_cpu(lambda d: _masked_write(case, d), case)


@pytest.mark.parametrize("values", [torch.tensor([5.0, 6.0]), torch.tensor(5.0), torch.tensor([[5.0]]),
                                    torch.tensor([[5.0], [6.0]])])
def test_masked_writes_that_broadcast_equal_cpu(values):
    def call(d):
        x = torch.arange(8.0, device=d).view(2, 4)
        x[:, torch.tensor([False, True, False, True], device=d)] = values.to(d)
        return x

    _same_as_cpu(call)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.complex64, torch.int16, torch.bool])
def test_empty_in_deterministic_mode_reads_as_on_cpu(dtype):
    # deterministic mode fills fresh memory with NaN / the largest integer; bfloat16's fill failed
    # ("Invalid integer data type 'V'") where CPU gives NaN
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        _same_as_cpu(lambda d: torch.empty(3, 2, dtype=dtype, device=d))
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.int32, torch.uint8, torch.bool])
def test_memory_made_in_deterministic_mode_reads_as_on_cpu_after_it(dtype):
    # the fill is decided when the memory is made (empty, the part resize_ adds), not when the
    # lazy storage is first read, here after the mode is off again
    from torch.testing._internal.common_utils import DeterministicGuard

    def made_inside_read_after(d):
        with DeterministicGuard(True):
            fresh = torch.empty(2, 3, dtype=dtype, device=d)
            like = torch.empty_like(fresh)
            new = fresh.new_empty(2)
            out = torch.empty(4, out=torch.zeros(1, dtype=dtype, device=d))
            resized = torch.zeros(2, dtype=dtype, device=d).resize_(5)
            unread = torch.zeros(1, dtype=dtype, device=d)
            unread.resize_(3)
        return torch.cat([fresh.flatten(), like.flatten(), new, out, resized, unread])

    _same_as_cpu(made_inside_read_after)


def test_empty_like_keeps_the_layout_cpu_gives():
    _same_as_cpu(lambda d: torch.empty_like(torch.zeros(2, 3, 4, 5, device=d).to(memory_format=torch.channels_last))
                 .zero_(), layout=True)


def test_memory_made_outside_deterministic_mode_is_not_filled_by_a_read_inside_it():
    from torch.testing._internal.common_utils import DeterministicGuard

    fresh = torch.empty(3, device="pjrt")
    with DeterministicGuard(True):
        assert not fresh.isnan().any()


# --------------------------------------------------------------------------- unique over a dim with NaN rows
def _rows_with_nans(seed: int, rows: int, dtype):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 3, (rows, 2), generator=generator).to(dtype)
    x[torch.rand(rows, 2, generator=generator) < 0.4] = float("nan")
    return x


@pytest.mark.parametrize("rows", [1, 6, 16, 17, 40, 300])  # past 16 rows CPU's std::sort partitions first
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unique_dim_keeps_nan_rows_apart_in_cpus_order(rows, dtype):
    # a row with a NaN equals no other row on CPU; pjrt merged NaN rows (jnp.unique) and sorted
    # them last, so the result's length, inverse and counts differed
    for seed in range(3):
        x = _rows_with_nans(seed, rows, dtype)
        for dim, t in ((0, x), (1, x.t()), (0, x[:, 0])):
            expected = torch.unique(t, dim=dim, return_inverse=True, return_counts=True)
            actual = torch.unique(t.to("pjrt"), dim=dim, return_inverse=True, return_counts=True)
            for e, a in zip(expected, actual):
                torch.testing.assert_close(a.cpu(), e, rtol=0, atol=0, equal_nan=True)


_OTHER_DTYPE_WRITES = {  # values of another dtype than self: CPU refuses, pjrt cast them
    "int_index": lambda d, x: x.index_put((torch.tensor([1], device=d),), torch.tensor([5], device=d)),
    "accumulate": lambda d, x: x.index_put((torch.tensor([1], device=d),), torch.tensor([5.0], device=d,
                                                                                      dtype=torch.float32), True),
    "zero_dim": lambda d, x: x.index_put((torch.tensor([1], device=d),), torch.tensor(5, device=d)),
    "mask_values": lambda d, x: x.index_put((x > 0,), torch.tensor([5, 6, 7], device=d)),
    "setitem_column": lambda d, x: x.view(3, 1).__setitem__((slice(None), [0]),
                                                            torch.zeros(3, 1, dtype=torch.int32, device=d)),
}


@pytest.mark.parametrize("case", sorted(_OTHER_DTYPE_WRITES))
def test_index_put_of_values_of_another_dtype_raises(case):
    assert_raises_like_cpu(lambda d: _OTHER_DTYPE_WRITES[case](d, torch.ones(3, dtype=torch.float64, device=d)), case)


def test_index_put_of_one_value_through_one_mask_casts_as_on_cpu():
    # CPU hands this call to masked_fill_, which casts the value
    _same_as_cpu(lambda d: torch.ones(3, dtype=torch.float64, device=d).index_put(
        (torch.tensor([True, False, True], device=d),), torch.tensor(5, device=d)))


# --------------------------------------------------------------------------- range factories' out=
_RANGES = {
    "arange": lambda d, out: torch.arange(0, 4, out=out),
    "arange_float_step": lambda d, out: torch.arange(1.0, 3.0, 0.5, out=out),
    "linspace": lambda d, out: torch.linspace(0, 3, 4, out=out),
    "linspace_tensor": lambda d, out: torch.linspace(torch.tensor(0.0, device=d), 3, 4, out=out),
    "logspace": lambda d, out: torch.logspace(0, 3, 4, out=out),
}


@pytest.mark.parametrize("name", sorted(_RANGES))
@pytest.mark.parametrize("out", ["narrowed", "transposed", "matrix", "resized"])
def test_range_factories_fill_out_in_its_own_shape(name, out):
    # CPU resizes out only when its element count differs; pjrt resized a (2, 2) view to (4,) and
    # wrote at other storage positions (torch.arange(0, 4, out=x.narrow(1, 1, 2)))
    def call(d):
        base = torch.zeros(2, 3, device=d)
        target = {"narrowed": lambda: base.narrow(1, 1, 2), "transposed": lambda: base.t()[1:],
                  "matrix": lambda: base[:, :2].contiguous(), "resized": lambda: base[:, 0]}[out]()
        result = _RANGES[name](d, target)
        return torch.cat([base.flatten(), result.flatten(), torch.tensor(result.shape, device=d)])

    _same_as_cpu(call)


# --------------------------------------------------------------------------- linspace's step
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int64, torch.float32, torch.float64])
@pytest.mark.parametrize("steps", [25, 50, 77])
def test_linspace_divides_by_steps_as_cpu(dtype, steps):
    # XLA rewrote (end - start) / (steps - 1) into a product with the reciprocal, one ulp low:
    # torch.linspace(1, 127, 50, dtype=int) gave 54 at index 21 where CPU (and numpy) give 55
    # (test_tensor_creation_ops' test_linspace_vs_numpy_integral)
    _same_as_cpu(lambda d: torch.linspace(1, 127, steps, dtype=dtype, device=d))
    _same_as_cpu(lambda d: torch.linspace(-3, 90.5 if dtype.is_floating_point else 90, steps, dtype=dtype, device=d)
                 if dtype != torch.uint8 else torch.linspace(0, 100, steps, dtype=dtype, device=d))


# --------------------------------------------------------------------------- random_'s range
RANDOM_RANGE_ERRORS = {
    "from below int8": lambda d: torch.empty(10, dtype=torch.int8, device=d).random_(-200, 5),
    "to past uint8": lambda d: torch.empty(10, dtype=torch.uint8, device=d).random_(0, 300),
    "from not below to": lambda d: torch.empty(10, device=d).random_(5, 2),
    "to of zero": lambda d: torch.empty(10, dtype=torch.int32, device=d).random_(0),
    "bool from 2": lambda d: torch.empty(10, dtype=torch.bool, device=d).random_(2, 5),
    "float from past its range": lambda d: torch.empty(10, dtype=torch.float16, device=d).random_(-2**40, 0),
}


@pytest.mark.parametrize("name", RANDOM_RANGE_ERRORS)
def test_random_range_errors(name):
    # pjrt drew integers from any range, outside the dtype's too (test_random_from_to, test_random_to)
    assert_raises_like_cpu(RANDOM_RANGE_ERRORS[name], name)


def test_random_warns_past_a_floats_exact_integers_on_every_call():
    t = torch.empty(10, device="pjrt")
    for _ in range(2):  # the second call reuses the first's executable: the check is per call
        with pytest.warns(UserWarning, match=r"to - 1 is out of bounds \[-\(2\^24\), 2\^24\]"):
            t.random_(0, 2**40)


@pytest.mark.parametrize("dtype, bounds", [(torch.int64, (-2**63, None)), (torch.int64, (5, None)), (torch.int64, ()),
                                           (torch.int64, (-2**63, 2**63 - 1)), (torch.uint8, (3, None)),
                                           (torch.float32, (-2**24, None)), (torch.int8, ())])
def test_random_over_the_whole_range_of_a_dtype(dtype, bounds):
    # random_(int64 min, None) raised OverflowError (the bound 2^63 passed through int64)
    t = torch.empty(4000, dtype=dtype, device="pjrt").random_(*bounds).cpu().double()
    low = bounds[0] if bounds else 0
    high = {torch.int64: 2**63 - 1, torch.uint8: 255, torch.int8: 127, torch.float32: 2**24}[dtype]
    assert low <= t.min() < low + (high - low) * 0.01 and high - (high - low) * 0.01 < t.max() <= high


# --------------------------------------------------------------------------- repeat_interleave's repeats
_MATRIX = [[1, 2], [3, 4]]
REPEATS_ERRORS = {
    "2-D repeats": lambda d: torch.repeat_interleave(torch.arange(4, device=d).reshape(2, 2)),
    "float repeats": lambda d: torch.repeat_interleave(torch.arange(4.0, device=d)),
    "negative repeats": lambda d: torch.repeat_interleave(torch.tensor([1, 2, -1, 3], device=d)),
    "negative repeats of self": lambda d: torch.repeat_interleave(torch.tensor(_MATRIX, device=d),
                                                                  torch.tensor([-1, 2], device=d), dim=0),
    "float repeats of self": lambda d: torch.repeat_interleave(torch.tensor(_MATRIX, device=d),
                                                               torch.tensor([1.0, 2.0], device=d), dim=0),
    "2-D repeats of self": lambda d: torch.repeat_interleave(torch.tensor(_MATRIX, device=d),
                                                             torch.tensor([[1, 2]], device=d), dim=0),
    # an output_size that is not the repeats' sum: CPU raises "allocated size does not match required size",
    # pjrt padded with the last index or cut the result (jnp.repeat's total_repeat_length), silently
    "output_size past the sum": lambda d: torch.repeat_interleave(torch.tensor([1, 2], device=d), output_size=5),
    "output_size short of the sum": lambda d: torch.repeat_interleave(torch.tensor([1, 2], device=d), output_size=2),
    "output_size of self": lambda d: torch.repeat_interleave(torch.tensor(_MATRIX, device=d),
                                                             torch.tensor([1, 2], device=d), dim=1, output_size=4),
    "output_size of self, one count": lambda d: torch.repeat_interleave(torch.tensor([5.0, 6.0], device=d),
                                                                        torch.tensor([2], device=d), output_size=3),
    # CPU has kernels for int32 and int64 counts only; pjrt took int16 and uint8 ones
    "int16 repeats": lambda d: torch.repeat_interleave(torch.tensor([1, 2], dtype=torch.int16, device=d)),
    "uint8 repeats of self": lambda d: torch.repeat_interleave(torch.tensor([5.0, 6.0], device=d),
                                                               torch.tensor([1, 2], dtype=torch.uint8, device=d)),
    "negative repeats, too few of them": lambda d: torch.repeat_interleave(
        torch.ones(3, device=d), torch.tensor([3, -1], device=d), output_size=2),
}


@pytest.mark.parametrize("name", REPEATS_ERRORS)
def test_repeat_interleave_refuses_what_cpu_refuses(name):
    # pjrt flattened a 2-D repeats, truncated float ones and repeated -1 times as 0 (test_repeat_interleave)
    assert_raises_like_cpu(REPEATS_ERRORS[name], name)


def test_repeat_interleave_of_valid_repeats_as_on_cpu():
    _same_as_cpu(lambda d: torch.repeat_interleave(torch.tensor([0, 1, 2, 3], device=d)))
    _same_as_cpu(lambda d: torch.repeat_interleave(torch.tensor(_MATRIX, device=d), torch.tensor([1, 2], device=d),
                                                   dim=1))
    _same_as_cpu(lambda d: torch.repeat_interleave(torch.tensor(_MATRIX, device=d), torch.tensor(2, device=d)))
    _same_as_cpu(lambda d: torch.repeat_interleave(torch.tensor(_MATRIX, device=d), torch.tensor([1, 2], device=d),
                                                   dim=0, output_size=3))
    # CPU skips the output_size check where there is nothing to repeat
    _same_as_cpu(lambda d: torch.repeat_interleave(torch.tensor([], dtype=torch.int64, device=d), output_size=5))
    _same_as_cpu(lambda d: torch.repeat_interleave(torch.ones(0, 3, device=d), torch.tensor([2], device=d),
                                                   dim=0, output_size=4))


@pytest.mark.parametrize("repeats, output_size", [([1, -1], 0), ([3, -1], 2), ([0, 2, -2, 1], 1)])
def test_repeat_interleave_refuses_negative_repeats_of_the_output_size(repeats, output_size):
    # CPU's words, not CPU's call: given an output_size equal to the counts' sum, CPU's kernel writes the
    # counts before the negative one past its result (repeat_interleave(tensor([1, -1]), output_size=0)
    # crashes CPU torch), and pjrt asked CPU for the error, so it crashed too
    with pytest.raises(RuntimeError, match="^repeats can not be negative$"):
        torch.repeat_interleave(torch.tensor(repeats, device="pjrt"), output_size=output_size)
    with pytest.raises(RuntimeError, match="^repeats can not be negative$"):
        torch.repeat_interleave(torch.ones(len(repeats), device="pjrt"), torch.tensor(repeats, device="pjrt"),
                                output_size=output_size)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("output_size", [None, 3])
def test_repeat_interleave_of_repeats_alone_keeps_their_dtype(dtype, output_size):
    # CPU's indices are of the repeats' dtype; pjrt's were int64 for int32 repeats
    expected = torch.repeat_interleave(torch.tensor([1, 2], dtype=dtype), output_size=output_size)
    actual = torch.repeat_interleave(torch.tensor([1, 2], dtype=dtype, device="pjrt"), output_size=output_size)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


# --------------------------------------------------------------------------- new_empty_strided's strides
@pytest.mark.parametrize("size, stride", [((5, 3), (0, 1)), ((2, 3, 4), (2, 4, 6)), ((0, 2, 0), (0, 0, 0)),
                                          ((2, 3), (1, 2))])
def test_new_empty_strided_keeps_the_strides(size, stride):
    # pjrt returned contiguous strides (test_tensor_creation_ops' test_new_empty_strided)
    for d in ("cpu", "pjrt"):
        t = torch.zeros(5, 5, dtype=torch.int32, device=d).new_empty_strided(size, stride)
        assert (t.shape, t.stride(), t.dtype) == (torch.Size(size), stride, torch.int32)
    _same_as_cpu(lambda d: torch.zeros(2, device=d).new_empty_strided((2, 3), (1, 2)).fill_(3.0), layout=True)


# --------------------------------------------------------------------------- normal over a std tensor
NORMAL_STD_ERRORS = {
    "negative std": lambda d: torch.normal(torch.zeros(3, device=d), torch.tensor([-1.0, 1.0, 1.0], device=d)),
    "negative std, number mean": lambda d: torch.normal(0.0, torch.tensor([1.0, -1.0], device=d)),
    "nan std": lambda d: torch.normal(torch.zeros(2, device=d), torch.tensor([float("nan"), 1.0], device=d)),
    "complex std": lambda d: torch.normal(torch.zeros(2, device=d), torch.ones(2, dtype=torch.complex64, device=d)),
}


@pytest.mark.parametrize("name", NORMAL_STD_ERRORS)
def test_normal_refuses_a_std_tensor_cpu_refuses(name):
    # pjrt drew with a negative scale (test_tensor_creation_ops' test_normal_std_error); the value
    # is checked at the call, as CPU's and CUDA's kernels check it (a sync)
    with pytest.raises(Exception) as on_cpu:
        NORMAL_STD_ERRORS[name]("cpu")
    with pytest.raises(type(on_cpu.value), match=f"^{re.escape(str(on_cpu.value))}$"):
        NORMAL_STD_ERRORS[name]("pjrt")  # no sync after it


@pytest.mark.parametrize("mean_dtype, std_dtype", [(torch.float32, torch.float32), (torch.float64, torch.float32),
                                                   (None, torch.float64), (torch.complex64, torch.float32)])
def test_normal_over_tensors_has_cpus_shape_dtype_and_moments(mean_dtype, std_dtype):
    def call(d):
        std = torch.full((4000,), 2.0, dtype=std_dtype, device=d)
        mean = 3.0 if mean_dtype is None else torch.full((2, 1), 3.0, dtype=mean_dtype, device=d)
        return torch.normal(mean, std)

    expected, actual = call("cpu"), call("pjrt").cpu()
    assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype)
    assert abs(actual.mean().real - 3.0) < 0.15 and abs((actual - 3.0).abs().pow(2).mean() ** 0.5 - 2.0) < 0.15


# --------------------------------------------------------------------------- masked_scatter's source count
def _mask(d, ones=(0, 2, 4), n=5):
    return torch.isin(torch.arange(n, device=d), torch.tensor(ones, device=d))


MASKED_SCATTER_ERRORS = {
    "in place": lambda d: torch.zeros(5, device=d).masked_scatter_(_mask(d), torch.arange(1.0, 3.0, device=d)),
    "functional": lambda d: torch.zeros(5, device=d).masked_scatter(_mask(d), torch.arange(1.0, 3.0, device=d)),
    "broadcast mask": lambda d: torch.zeros(2, 5, device=d).masked_scatter_(_mask(d), torch.arange(1.0, 6.0, device=d)),
    "empty source": lambda d: torch.zeros(5, device=d).masked_scatter_(_mask(d), torch.zeros(0, device=d)),
    "mask view": lambda d: torch.zeros(3, device=d, dtype=torch.int64).masked_scatter_(
        _mask(d, (1, 3, 5), 6)[1::2], torch.arange(2, device=d)),
}


@pytest.mark.parametrize("name", MASKED_SCATTER_ERRORS)
def test_masked_scatter_with_too_short_a_source_raises(name, monkeypatch):
    # pjrt repeated the source's last element (test_masked_scatter); the count is checked
    # asynchronously, as index checks are (TORCH_PJRT_SYNC_INDEX_CHECKS=1: at the call)
    assert_raises_like_cpu(MASKED_SCATTER_ERRORS[name], name)
    _raises_exactly_like_cpu(MASKED_SCATTER_ERRORS[name], monkeypatch)


@pytest.mark.parametrize("call", [
    lambda d: torch.zeros(5, device=d).masked_scatter_(_mask(d), torch.arange(1.0, 4.0, device=d)),
    lambda d: torch.zeros(2, 5, device=d).masked_scatter(_mask(d), torch.arange(1.0, 12.0, device=d).view(1, 11)),
    lambda d: torch.zeros(5, 0, 5, device=d).masked_scatter_(torch.ones(5, 1, 5, dtype=torch.bool, device=d),
                                                             torch.zeros(0, device=d)),
    lambda d: torch.zeros(4, device=d).masked_scatter_(torch.zeros(4, dtype=torch.bool, device=d),
                                                       torch.zeros(0, device=d)),
], ids=["enough", "more than enough", "no elements", "no ones"])
def test_masked_scatter_with_enough_source_equals_cpu(call):
    _same_as_cpu(call)
    torch.pjrt.synchronize()  # and no check raises later


# --------------------------------------------------------------------------- bincount's checks
BINCOUNT_ERRORS = {
    "negative value": lambda d: torch.bincount(torch.tensor([1, -1], device=d)),
    "negative minlength": lambda d: torch.bincount(torch.tensor([1, 3], device=d), torch.tensor([0.2, 0.2], device=d),
                                                   minlength=-1),
}


@pytest.mark.parametrize("name", BINCOUNT_ERRORS)
def test_bincount_refuses_what_cpu_refuses(name):
    # pjrt counted without the negative value and ignored a negative minlength (test_bincount)
    assert_raises_like_cpu(BINCOUNT_ERRORS[name], name)


# --------------------------------------------------------------------------- out= of an int dim
_COUNT_NONZERO_OUT = {int: torch.ops.aten.count_nonzero.out, tuple: torch.ops.aten.count_nonzero.dim_IntList_out}


@pytest.mark.parametrize("op", ["all", "any", "count_nonzero"])
@pytest.mark.parametrize("dim", [1, (0, 1), (1,)])
def test_reduction_out_of_an_int_dim_or_dims(op, dim):
    # eager took all.out (int dim) for all.dims' out= overload and called it with an int:
    # "Expected a value of type 'Optional[List[int]]'" (test_reductions' test_all_any_vs_numpy)
    def call(d):
        x = torch.tensor([[1, 0, 2], [3, 4, 0]], dtype=torch.uint8, device=d)
        if op == "count_nonzero":
            return _COUNT_NONZERO_OUT[type(dim)](x, dim, out=torch.empty(0, dtype=torch.int64, device=d))
        out = torch.empty(0, dtype=torch.uint8, device=d)
        getattr(torch, op)(x, dim, out=out)
        return out

    _same_as_cpu(call)


def test_squeeze_copy_out_of_an_int_dim():
    _same_as_cpu(lambda d: torch.squeeze_copy(torch.zeros(2, 1, 3, device=d), 1, out=torch.empty(0, device=d)))
    _same_as_cpu(lambda d: torch.squeeze_copy(torch.zeros(2, 1, 1, device=d), (1, 2), out=torch.empty(0, device=d)))


# --------------------------------------------------------------------------- reductions of more than 64 dims
_OVER_64_DIMS = {
    "sum": lambda x: x.sum(0), "mean": lambda x: x.mean(-1), "var": lambda x: x.var(0),
    "logsumexp": lambda x: x.logsumexp(0), "norm": lambda x: x.norm(dim=0), "nansum": lambda x: x.nansum(0),
    "argmax": lambda x: x.argmax(0), "max.dim": lambda x: x.max(0), "amin": lambda x: x.amin(0),
    "all": lambda x: x.all(0), "prod": lambda x: x.prod(0),
}


@pytest.mark.parametrize("name", _OVER_64_DIMS)
def test_reducing_given_dims_of_more_than_64_dims_raises(name):
    # CPU's dim mask is a 64-bit set; pjrt reduced (test_dim_ndim_limit, test_dim_reduction_less_than_64)
    assert_raises_like_cpu(lambda d: _OVER_64_DIMS[name](torch.zeros([1] * 65, device=d)), name)


def test_reducing_every_dim_of_more_than_64_dims_as_on_cpu():
    _same_as_cpu(lambda d: torch.stack([torch.ones([1] * 65, device=d).sum(), torch.ones([1] * 65, device=d).argmax(),
                                        torch.ones([1] * 65, device=d).squeeze(0).sum()]))


# --------------------------------------------------------------------------- sum with a narrower dtype
@pytest.mark.parametrize("op", ["sum", "nansum"])
def test_sum_into_float16_rounds_each_element_first(op):
    # CPU converts the input to the result dtype, then accumulates in float32: pjrt summed the
    # float32 values unrounded (-118.0 where CPU gives -117.5625; test_nansum_out_dtype_float16)
    def call(d):
        x = torch.tensor([0.3, 0.3, 0.3, -0.7] * 16, device=d) * 1.001
        return torch.stack([getattr(torch, op)(x, dtype=torch.float16).float(),
                            getattr(torch, op)(x, dtype=torch.bfloat16).float()])

    _same_as_cpu(call)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_adaptive_max_pool_of_a_zero_size_batch(dims):
    # pjrt failed with ZeroDivisionError (a reshape with -1 over zero elements; test_AdaptiveMaxPool_zero_batch_dim)
    pool = {1: torch.nn.AdaptiveMaxPool1d, 2: torch.nn.AdaptiveMaxPool2d, 3: torch.nn.AdaptiveMaxPool3d}[dims](3)
    _same_as_cpu(lambda d: pool(torch.ones((0, 2) + (7,) * dims, device=d)))
    _same_as_cpu(lambda d: torch.nn.functional.adaptive_max_pool2d(torch.arange(98.0, device=d).reshape(2, 7, 7), 3)
                 if dims == 2 else pool(torch.ones((1, 2) + (7,) * dims, device=d)))


@pytest.mark.parametrize("nd", [2, 3])
def test_fractional_max_pool_with_fewer_samples_than_the_batch_raises(nd):
    # the 3d form returned a batch of 0 (test_FractionalMaxPool3d_zero_samples)
    def call(d):
        pool = (torch.nn.FractionalMaxPool3d if nd == 3 else torch.nn.FractionalMaxPool2d)(
            2, output_size=[1] * nd, _random_samples=torch.rand([0, 4, nd], device=d))
        return pool(torch.randn([1, 4] + [6] * nd, device=d))

    assert_raises_like_cpu(call, f"{nd}d")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_fused_region_rounds_between_ops_as_cpu(dtype):
    """XLA's default excess precision skipped the rounding of a freshly drawn bfloat16 tensor
    inside the region that also added it: `a + b` differed from CPU's sum of the very values `a`
    and `b` hold (test_binary_ufuncs' test_batch_vs_slicing_add_pjrt_bfloat16)."""
    from torch.testing import make_tensor

    for seed in range(3):
        torch.manual_seed(seed)
        a, b = (make_tensor((32, 512), dtype=dtype, device="pjrt") for _ in range(2))
        total = (a + b) * 3 - a  # a chain: each op's result rounded, as CPU does
        expected = (a.cpu() + b.cpu()) * 3 - a.cpu()
        assert torch.equal(total.cpu(), expected), seed


@pytest.mark.parametrize("call", [
    lambda d: torch.tensor([True, False], device=d).add_(1),
    lambda d: torch.tensor([True, False], device=d).mul_(2.5),
    lambda d: torch.ones(2, dtype=torch.int64, device=d).add_(2.5),
    lambda d: torch._foreach_add_([torch.tensor([True, False], device=d), torch.ones(1, 2, dtype=torch.bool, device=d)], 1),
    lambda d: torch._foreach_mul_([torch.ones(3, dtype=torch.int8, device=d)], [0.5]),
], ids=["add_", "mul_", "int_add_", "_foreach_add_", "_foreach_mul_"])
def test_in_place_result_type_refusal_says_what_cpu_says(call):
    # pjrt put the op's name first ("aten::_foreach_add_.Scalar: result type Long can't be cast ..."), so a
    # foreach op_'s error was not its per-tensor op_'s (test_foreach's test_binary_op, bool)
    assert_raises_like_cpu(call)


@pytest.mark.parametrize("call", [
    lambda d: torch.nn.functional.relu6(torch.tensor([0, 3, 7, 200], dtype=torch.uint8, device=d)),
    lambda d: torch.ops.aten.hardtanh(torch.tensor([0, 3, 7, 200], dtype=torch.uint8, device=d), 2.7, 5),
    lambda d: torch.nn.functional.hardtanh_(torch.tensor([0, 3, 7, 200], dtype=torch.uint8, device=d), 1, 6),
    lambda d: torch.ops.aten.hardtanh(torch.tensor([-9, 3, 7], dtype=torch.int8, device=d), -1.5, 2.7),
], ids=["relu6", "hardtanh", "hardtanh_", "int8_fractional_limits"])
def test_hardtanh_of_integers(call):
    # CPU computes hardtanh of uint8 (its limits truncated to integers); pjrt raised
    # "hardtanh not implemented for torch.uint8" (test_unary_ufuncs' test_batch_vs_slicing__refs_nn_functional_relu6_uint8)
    _same_as_cpu(call)


@pytest.mark.parametrize("call", [
    lambda d: torch.nn.functional.hardtanh(torch.tensor([0, 3], dtype=torch.uint8, device=d)),
    lambda d: torch.nn.functional.hardtanh_(torch.tensor([0, 3], dtype=torch.uint8, device=d), -1.0, 6.0),
    lambda d: torch.ops.aten.hardtanh(torch.tensor([True], device=d), 0, 1),
], ids=["negative_limits", "in_place_negative_min", "bool"])
def test_hardtanh_refusals_say_what_cpu_says(call):
    # CPU: "cannot do hardtanh on an unsigned type with negative limits" for uint8
    assert_raises_like_cpu(call)


def _singular(d, batch=()):
    A = torch.eye(3, device=d).repeat(*batch, 1, 1)
    A[..., -1, -1] = 0
    return A


@pytest.mark.parametrize("batch", [(), (2,)], ids=["matrix", "batch"])
@pytest.mark.parametrize("call", [
    lambda A: torch.linalg.cholesky_ex(A, check_errors=True),
    lambda A: torch.linalg.inv_ex(A, check_errors=True),
    lambda A: torch.linalg.lu_factor_ex(A, check_errors=True),
    lambda A: torch.linalg.solve_ex(A, A, check_errors=True),
], ids=["cholesky_ex", "inv_ex", "lu_factor_ex", "solve_ex"])
def test_linalg_ex_check_errors_raises_as_cpu(call, batch):
    # pjrt returned the factor of a singular matrix and raised nothing (test_linalg's test_cholesky_ex_non_pd)
    assert_raises_like_cpu(lambda d: call(_singular(d, batch)))


def test_linalg_ex_without_check_errors_returns_info():
    _same_as_cpu(lambda d: torch.linalg.cholesky_ex(_singular(d, (2,)))[1])
    _same_as_cpu(lambda d: torch.linalg.inv_ex(_singular(d))[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch", [1, 3])
def test_bmm_of_a_transposed_half_operand(dtype, batch):
    # XLA:CPU raised "UNIMPLEMENTED: Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32"
    # (a JAX exception where CPU computes: test_linalg's test_bmm_pjrt_bfloat16)
    torch.manual_seed(0)
    a, b = torch.randn(batch, 15, 23).to(dtype), torch.randn(batch, 15, 12).to(dtype)
    expected = torch.bmm(a.transpose(1, 2), b)
    actual = torch.bmm(a.to("pjrt").transpose(1, 2), b.to("pjrt"))
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize("batch", [(), (3,)], ids=["matrix", "batch"])
def test_eig_of_a_matrix_with_infs_or_nans_raises_as_cpu(value, batch):
    # pjrt returned NaNs where CPU raises (test_linalg's test_eig_with_nan)
    def call(d):
        a = torch.ones(*batch, 4, 4, device=d)
        a[..., -1, -1] = value
        return torch.linalg.eig(a)

    assert_raises_like_cpu(call)


@pytest.mark.parametrize("uplo", ["l", "u", "L", "U"])
def test_eigh_takes_uplo_in_either_case(uplo):
    # pjrt raised JAX's "ValueError: UPLO must be one of None, 'L', or 'U', got u" (test_eigh_lower_uplo)
    def call(d):
        a = torch.arange(16.0, device=d).reshape(4, 4)  # not symmetric: UPLO decides which triangle is read
        return torch.linalg.eigvalsh(a, UPLO=uplo)

    expected, actual = call("cpu"), call("pjrt")
    torch.testing.assert_close(actual.cpu(), expected)


def test_lstsq_refuses_an_unknown_driver_as_cpu():
    # pjrt solved with any driver name (test_linalg's test_linalg_lstsq_input_checks)
    assert_raises_like_cpu(lambda d: torch.linalg.lstsq(torch.rand(2, 3, 3, device=d), torch.rand(2, 3, 2, device=d),
                                                        driver="fictitious_driver"))


@pytest.mark.parametrize("other_dtype", [torch.int64, torch.float64])
def test_lstsq_refuses_another_dtype_as_cpu(other_dtype):
    # pjrt solved in the input's dtype where CPU refuses (silent; test_linalg_lstsq_input_checks)
    assert_raises_like_cpu(lambda d: torch.linalg.lstsq(torch.rand(2, 2, 2, 2, device=d),
                                                        (torch.rand(2, 2, 2, device=d) * 100).to(other_dtype)))


def test_out_of_a_column_major_result_resizes_with_one_warning_as_on_cpu():
    """lu_factor's and cholesky's results are column-major (storage.Permuted): their out= tensors were
    taken for another dtype than the result, so CPU ran the call again and warned twice."""
    def run(device):
        a = torch.tensor([[4.0, 1, 2], [1, 3, 0], [2, 0, 5]], device=device)
        out = (torch.empty(1, device=device), torch.empty(1, dtype=torch.int32, device=device))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.linalg.lu_factor(a, out=out)
            factor = torch.linalg.cholesky(a, out=torch.empty(1, device=device))
        return [str(w.message) for w in caught], [out[0].cpu(), out[1].cpu(), factor.cpu()]

    (cpu_warnings, expected), (pjrt_warnings, got) = run("cpu"), run("pjrt")
    first_sentence = lambda messages: [m.split("]")[0] for m in messages]  # noqa: E731  (where it is raised differs)
    assert first_sentence(pjrt_warnings) == first_sentence(cpu_warnings)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("call", [
    lambda d, a, b: torch.mm(a, b),
    lambda d, a, b: torch.mv(a, b[:, 0]),
    lambda d, a, b: torch.addmm(torch.ones(2, 4, device=d), a, b),
    lambda d, a, b: torch.addmm(torch.ones(2, 4, dtype=torch.float64, device=d), b.t()[:2, :3].float(), b.float()),
    lambda d, a, b: torch.addbmm(torch.ones(2, 4, device=d), a[None], b[None]),
    lambda d, a, b: a.float() @ b.bfloat16(),
], ids=["mm", "mv", "addmm", "addmm-self", "addbmm", "matmul-bf16"])
def test_matmuls_refuse_operands_of_two_dtypes_as_cpu(call):
    # pjrt multiplied an int16 by a float32 matrix and returned int16 (silent; test_linalg's
    # test_mm_empty_inputs_mixed_dtype_errors): CPU refuses, with each op's own words
    assert_raises_like_cpu(lambda d: call(d, torch.ones(2, 3, dtype=torch.int16, device=d), torch.ones(3, 4, device=d)))


# --------------------------------------------------------------------------- cdist / pdist backward, p < 1
# A zero coordinate difference gave |0| ** (p - 1) = inf and a NaN gradient (test_torch's
# test_cdist_grad_p_lt_1_no_nan); CPU's kernel gives that coordinate 0.
def _distance_grads(d, p, pairwise):
    x = torch.tensor([[0.5, -1.0, 2.0], [1.5, -1.0, 2.0], [0.5, 3.0, 2.0]], device=d, requires_grad=True)
    y = torch.tensor([[1.5, -1.0, 0.0], [0.5, -1.0, 2.5]], device=d, requires_grad=True)
    out = torch.pdist(x, p=p) if pairwise else torch.cdist(x, y, p=p)
    out.backward(torch.arange(1.0, out.numel() + 1, device=d).reshape(out.shape))
    return torch.cat([x.grad.flatten()] + ([] if pairwise else [y.grad.flatten()]))


@pytest.mark.parametrize("pairwise", [False, True])
@pytest.mark.parametrize("p", [0.01, 0.5, 0.99, 1.5, 3.0])
def test_distance_backward_of_a_zero_difference(p, pairwise):
    expected, actual = _distance_grads("cpu", p, pairwise), _distance_grads("pjrt", p, pairwise)
    assert not actual.isnan().any()
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- index_fill with a complex value
# A complex value into a real tensor: pjrt wrote its real part; CPU's kernel refuses (test_torch's
# test_index_fill). A complex value into a complex tensor, and a real one, still fill.
INDEX_FILL_COMPLEX = {
    "in place, Python complex": lambda d: torch.ones(2, 2, device=d).index_fill_(1, torch.tensor([0], device=d), 1 + 1j),
    "functional, 1 + 0j": lambda d: torch.ones(2, 2, device=d).index_fill(1, torch.tensor([0], device=d), 1 + 0j),
    "0-d complex tensor": lambda d: torch.ones(2, 2, dtype=torch.int32, device=d).index_fill(
        0, torch.tensor([1], device=d), torch.tensor(2 + 1j, device=d)),
}


@pytest.mark.parametrize("name", INDEX_FILL_COMPLEX)
def test_index_fill_of_a_real_tensor_with_a_complex_value_raises(name):
    assert_raises_like_cpu(INDEX_FILL_COMPLEX[name], name)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float32, torch.int64])
def test_index_fill_still_fills(dtype):
    value = 1 + 2j if dtype.is_complex else 3
    _same_as_cpu(lambda d: torch.ones(2, 3, dtype=dtype, device=d).index_fill(1, torch.tensor([2, 0], device=d), value))


# --------------------------------------------------------------------------- is_set_to
# is_set_to ran on the CPU fallback, which compared host copies: always False (test_torch's
# test_is_set_to). It compares storages, offsets, sizes and strides, as CPU's.
def _is_set_to_answers(d):
    t1, t2 = torch.empty(3, 4, 9, 10, device=d), torch.empty(3, 4, 9, 10, device=d)
    t3 = torch.tensor([], device=d).set_(t1)
    t4 = t3.clone().resize_(12, 90)
    a = torch.tensor([True, True], device=d)
    b = torch.tensor([0], dtype=torch.bool, device=d).set_(a)
    e = torch.empty([2, 3, 4], device=d)
    empty = torch.tensor([], device=d)
    return [t1.is_set_to(t2), t1.is_set_to(t3), t3.is_set_to(t1), t1.is_set_to(t4), a.is_set_to(b),
            e.is_set_to(e.view(4, 3, 2)), empty.is_set_to(torch.tensor([], device=d)), empty.is_set_to(empty),
            t1[1].is_set_to(t1[1]), t1[1].is_set_to(t1[2]), t1.is_set_to(t1.transpose(0, 1))]


def test_is_set_to_compares_storages():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no CPU fallback
        assert _is_set_to_answers("pjrt") == _is_set_to_answers("cpu")


# --------------------------------------------------------------------------- out= resized: the op's layout
# An out= that the op resizes (an empty one) took row-major strides; CPU gives it the op's own layout
# (TensorIterator's, from the inputs' permutation: test_torch's test_strides_propagation), as the
# functional call's result has.
@pytest.mark.parametrize("op", [torch.add, torch.eq, torch.exp])
@pytest.mark.parametrize("perm", [(0, 2, 1), (1, 0, 2), (2, 1, 0), (1, 2, 0)])
@pytest.mark.parametrize("sliced", [False, True])
def test_a_resized_out_takes_the_ops_layout(op, perm, sliced):
    base = torch.arange(48.0).reshape(2, 3, 8) / 7

    def call(d):
        x = (base.to(d)[:, :, ::2] if sliced else base.to(d)[:, :, :4]).permute(perm)
        args = (x,) if op is torch.exp else (x, torch.linspace(-1, 1, x.shape[-1], device=d))
        out = torch.empty(0, device=d, dtype=torch.bool if op is torch.eq else torch.float32)
        result = op(*args, out=out)
        assert result is out
        return out

    expected, actual = call("cpu"), call("pjrt")
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)


# A fill value the result's dtype cannot hold: CPU's conversion refuses it ("value cannot be converted to type
# int8_t without overflow"); pjrt wrapped or saturated it (int8 300 -> 44, float16 1e6 -> inf, float32 1+1j -> 1).
# test_torch's test_fill_* and issue 32.
FILL_VALUE_ERRORS = {
    "fill_ int8 300": lambda d: torch.zeros(2, dtype=torch.int8, device=d).fill_(300),
    "fill_ of a view": lambda d: torch.zeros(4, dtype=torch.int8, device=d)[::2].fill_(300),
    "fill_ float32 complex": lambda d: torch.zeros(2, device=d).fill_(1 + 1j),
    "fill_ float16 1e6": lambda d: torch.zeros(2, dtype=torch.float16, device=d).fill_(1e6),
    "fill_ int32 nan": lambda d: torch.zeros(2, dtype=torch.int32, device=d).fill_(float("nan")),
    "full int8": lambda d: torch.full((2,), 300, dtype=torch.int8, device=d),
    "full inferred float32 1e39": lambda d: torch.full((2,), 1e39, device=d),
    "full_like": lambda d: torch.full_like(torch.zeros(2, dtype=torch.int8, device=d), 300),
    "new_full": lambda d: torch.zeros(2, dtype=torch.int8, device=d).new_full((2,), 300),
    "masked_fill": lambda d: torch.zeros(2, dtype=torch.int8, device=d).masked_fill(
        torch.tensor([True, False], device=d), 300),
    "masked_fill_ no element selected": lambda d: torch.zeros(2, dtype=torch.int8, device=d).masked_fill_(
        torch.tensor([False, False], device=d), 300),
    "scalar_tensor": lambda d: torch.scalar_tensor(300, dtype=torch.int8, device=d),
    # index_fill_ wrote 44 and inf; it checks a complex value first, in its own words
    "index_fill_ int8 300": lambda d: torch.zeros(3, dtype=torch.int8, device=d).index_fill_(
        0, torch.tensor([1], device=d), 300),
    "index_fill float16 1e6": lambda d: torch.zeros(3, dtype=torch.float16, device=d).index_fill(
        0, torch.tensor([1], device=d), 1e6),
    "index_fill_ int8 complex": lambda d: torch.zeros(3, dtype=torch.int8, device=d).index_fill_(
        0, torch.tensor([1], device=d), 1 + 2j),
    # other Scalars CPU converts to the result's dtype (they wrote 44 or inf, or clamped nothing)
    "scatter value": lambda d: torch.zeros(3, dtype=torch.int8, device=d).scatter(0, torch.tensor([1], device=d), 300),
    "scatter_ value float16": lambda d: torch.zeros(3, dtype=torch.float16, device=d).scatter_(
        0, torch.tensor([1], device=d), 1e6),
    "scatter_ value reduce": lambda d: torch.zeros(3, dtype=torch.int8, device=d).scatter_(
        0, torch.tensor([1], device=d), 300, reduce="add"),
    "add alpha": lambda d: torch.ones(2, dtype=torch.int8, device=d).add(torch.ones(2, dtype=torch.int8, device=d),
                                                                         alpha=300),
    "sub_ alpha float16": lambda d: torch.ones(2, dtype=torch.float16, device=d).sub_(
        torch.ones(2, dtype=torch.float16, device=d), alpha=1e6),
    "addcmul value": lambda d: torch.ones(2, dtype=torch.int8, device=d).addcmul(
        torch.ones(2, dtype=torch.int8, device=d), torch.ones(2, dtype=torch.int8, device=d), value=300),
    "clamp min and max": lambda d: torch.ones(2, dtype=torch.int8, device=d).clamp(-300, 300),
    "clamp_max": lambda d: torch.ones(2, dtype=torch.int8, device=d).clamp_max(1000),
    "index_add alpha": lambda d: torch.zeros(3, dtype=torch.int8, device=d).index_add(
        0, torch.tensor([1], device=d), torch.ones(1, dtype=torch.int8, device=d), alpha=300),
    # hardtanh's bounds are static (its meta kernel checks them): float16 took 1e6 and clamped nothing
    "hardtanh float16 bounds": lambda d: torch.nn.functional.hardtanh(
        torch.tensor([1.0, 5.0], dtype=torch.float16, device=d), -1e6, 1e6),
    "hardtanh float32 bounds": lambda d: torch.nn.functional.hardtanh(torch.ones(2, device=d), -1e300, 1e300),
    "threshold int8": lambda d: torch.threshold(torch.tensor([1, 5], dtype=torch.int8, device=d), 300, 2),
    "pow int8 exponent": lambda d: torch.pow(torch.tensor([2], dtype=torch.int8, device=d), 300),
    "pow float16 exponent": lambda d: torch.pow(torch.tensor([2.0], dtype=torch.float16, device=d), 1e6),
    # activations' and lerp's Scalars (found by converting each table op's Scalars out of range)
    "leaky_relu float32 slope": lambda d: torch.nn.functional.leaky_relu(torch.ones(2, device=d), 1e39),
    "elu alpha bfloat16": lambda d: torch.nn.functional.elu(torch.ones(2, dtype=torch.bfloat16, device=d), 1e39),
    "celu alpha": lambda d: torch.celu(torch.ones(2, device=d), 1e39),
    "softplus beta complex": lambda d: torch.nn.functional.softplus(torch.ones(2, device=d), 1 + 1j),
    "hardshrink float16 lambd": lambda d: torch.nn.functional.hardshrink(torch.ones(2, dtype=torch.float16, device=d), 1e6),
    "lerp weight": lambda d: torch.lerp(torch.zeros(2, device=d), torch.ones(2, device=d), 1e39),
    "threshold_backward int8": lambda d: torch.ops.aten.threshold_backward(
        torch.ones(2, dtype=torch.int8, device=d), torch.ones(2, dtype=torch.int8, device=d), 300),
    "softshrink_backward float16": lambda d: torch.ops.aten.softshrink_backward(
        torch.ones(2, dtype=torch.float16, device=d), torch.ones(2, dtype=torch.float16, device=d), 1e6),
}


@pytest.mark.parametrize("mode", ["fused", "op"])
@pytest.mark.parametrize("name", FILL_VALUE_ERRORS)
def test_a_fill_value_the_dtype_cannot_hold_raises(name, mode):
    with in_eager_mode(mode):
        for _ in range(2):  # the C++ fast path serves the second call
            assert_raises_like_cpu(FILL_VALUE_ERRORS[name], name)


@pytest.mark.parametrize("call", [
    lambda d: torch.full((2,), -1, dtype=torch.uint8, device=d),  # CPU lets uint8 wrap -1
    lambda d: torch.zeros(2, dtype=torch.int64, device=d).fill_(2.5),
    lambda d: torch.zeros(2, dtype=torch.float16, device=d).fill_(float("inf")),
    lambda d: torch.zeros(2, dtype=torch.bool, device=d).fill_(5),
    lambda d: torch.zeros(2, device=d).masked_fill(torch.tensor([True, False], device=d), 2 + 0j),
    lambda d: torch.full((2,), 7, device=d),
    lambda d: torch.zeros(3, dtype=torch.uint8, device=d).index_fill_(0, torch.tensor([1], device=d), -1),
    lambda d: torch.zeros(3, dtype=torch.complex64, device=d).index_fill(0, torch.tensor([1], device=d), 1 + 2j),
    # the check converts to self's dtype; CPU to the promoted one: a value that only the promoted
    # dtype holds asks CPU, which computes
    lambda d: torch.tensor([1, -2, 3], dtype=torch.int8, device=d).clamp(min=-1e10),
    lambda d: torch.tensor([1, -2, 3], dtype=torch.int8, device=d).add(torch.ones(3, device=d), alpha=300),
    lambda d: torch.ones(3, dtype=torch.uint8, device=d).sub(torch.ones(3, dtype=torch.uint8, device=d), alpha=-1),
    lambda d: torch.ones(3, device=d).add_(torch.ones(3, device=d), alpha=-1e-3),
    lambda d: torch.tensor([float("nan"), 1.0, float("inf")], dtype=torch.float16, device=d).nan_to_num(1e6),
    # CPU's threshold compares half in float, pow(int8, float) computes in float: they accept
    lambda d: torch.threshold(torch.tensor([1.0, 2.0], dtype=torch.float16, device=d), 1e6, 0),
    lambda d: torch.pow(torch.tensor([2, 3], dtype=torch.int8, device=d), 300.5),
    lambda d: torch.nn.functional.hardtanh(torch.tensor([1.0, 5.0], dtype=torch.bfloat16, device=d), -1e6, 1e6),
    # uint64 values beyond int64 (no weakly typed JAX scalar holds them): the lowering failed
    lambda d: torch.full((2,), 2 ** 63 + 5, dtype=torch.uint64, device=d),
    lambda d: torch.zeros(2, dtype=torch.uint64, device=d).fill_(2 ** 64 - 1),
    lambda d: torch.zeros(2, device=d).fill_(2 ** 64 - 1),
    lambda d: torch.nn.functional.leaky_relu(torch.tensor([-1.0, 2.0], dtype=torch.float16, device=d), 1e5),
], ids=["uint8 -1", "int64 2.5", "float16 inf", "bool 5", "complex with no imaginary part", "int value inferred",
        "index_fill_ uint8 -1", "index_fill complex", "clamp int8 float min", "add int8 float alpha 300",
        "sub uint8 alpha -1", "add_ float alpha", "nan_to_num float16 replacement rounds to inf",
        "threshold float16 1e6", "pow int8 float exponent", "hardtanh bfloat16 1e6", "full uint64 2**63+5",
        "fill_ uint64 2**64-1", "fill_ float32 2**64-1",
        "leaky_relu float16 slope 1e5 (CPU computes in float)"])
def test_a_fill_value_cpu_accepts(call):
    _same_as_cpu(call)


def test_a_call_meta_refuses_but_cpu_accepts_leaves_the_ops_other_checks_on(monkeypatch):
    """masked_fill(float, mask, 2 + 0j): torch's meta kernel refuses it, CPU computes it; that call
    then traces without the meta check, but only calls of its kind (dtypes, shapes, number kinds):
    a uint8 mask in the same process still raises CPU's error. (It ran unchecked once, silently,
    and the executable store then kept the unchecked executable for every later process.)"""
    from torch_pjrt.runtime import executable_store

    # each call traced here (a stored executable skips the trace, and the check with it), on shapes
    # no other test uses
    monkeypatch.setitem(executable_store._state, "folder", None)
    mask = torch.tensor([True, False, False, True, True, False, True])
    for d in ("cpu", "pjrt"):  # the accepted call first, as a test earlier in a worker may make it
        torch.zeros(7, device=d).masked_fill(mask.to(d), 2 + 0j).cpu()
    with pytest.raises(RuntimeError) as pjrt:
        torch.zeros(7, device="pjrt").masked_fill(mask.to(torch.uint8).to("pjrt"), 2.0).cpu()
    with pytest.raises(RuntimeError, match="masked_fill_ only supports boolean masks") as cpu:
        torch.zeros(7).masked_fill(mask.to(torch.uint8), 2.0)
    assert str(pjrt.value) == str(cpu.value)
    assert torch.equal(torch.zeros(7, device="pjrt").masked_fill(mask.to("pjrt"), 2 + 0j).cpu(),
                       torch.zeros(7).masked_fill(mask, 2 + 0j))


# An index, target, sorter or lengths of a dtype the op does not take: torch's meta kernels accept
# any (so the meta check did not refuse) and pjrt computed with it; CPU (and CUDA) refuse, each op
# in its own words (found by a sweep of OpInfo samples with their int64 tensors in other dtypes).
INDEX_DTYPE_ERRORS = {
    "index_add int8": lambda d: torch.zeros(3, device=d).index_add(
        0, torch.tensor([0, 1], dtype=torch.int8, device=d), torch.ones(2, device=d)),
    "index_fill int32": lambda d: torch.zeros(3, device=d).index_fill(0, torch.tensor([0, 1], dtype=torch.int32, device=d), 2.0),
    "index_fill_ tensor value int32": lambda d: torch.zeros(3, device=d).index_fill_(
        0, torch.tensor([0, 1], dtype=torch.int32, device=d), torch.tensor(2.0, device=d)),
    "index_copy int32": lambda d: torch.zeros(3, device=d).index_copy(
        0, torch.tensor([0, 1], dtype=torch.int32, device=d), torch.ones(2, device=d)),
    "index_select int16": lambda d: torch.zeros(3, device=d).index_select(0, torch.tensor([0, 1], dtype=torch.int16, device=d)),
    "index_reduce uint8": lambda d: torch.zeros(3, device=d).index_reduce(
        0, torch.tensor([0, 1], dtype=torch.uint8, device=d), torch.ones(2, device=d), "prod"),
    # a loss's int32 targets (a common mistake CPU and CUDA refuse; pjrt trained on them)
    "nll_loss int32 target": lambda d: torch.nn.functional.nll_loss(
        torch.randn(3, 5, device=d), torch.tensor([1, 2, 3], dtype=torch.int32, device=d)),
    "cross_entropy int32 target": lambda d: torch.nn.functional.cross_entropy(
        torch.randn(3, 5, device=d), torch.tensor([1, 2, 3], dtype=torch.int32, device=d)),
    "nll_loss 2-d uint8 target": lambda d: torch.nn.functional.nll_loss(
        torch.randn(2, 5, 3, 3, device=d), torch.zeros(2, 3, 3, dtype=torch.uint8, device=d)),
    "nll_loss_backward int32 target": lambda d: torch.ops.aten.nll_loss_backward(
        torch.tensor(1.0, device=d), torch.randn(3, 5, device=d), torch.tensor([1, 2, 3], dtype=torch.int32, device=d),
        None, 1, -100, torch.tensor(1.0, device=d)),
    "multi_margin_loss int32 target": lambda d: torch.nn.functional.multi_margin_loss(
        torch.randn(3, 5, device=d), torch.tensor([1, 2, 3], dtype=torch.int32, device=d)),
    "multilabel_margin_loss int32 target": lambda d: torch.nn.functional.multilabel_margin_loss(
        torch.randn(3, 5, device=d), torch.zeros(3, 5, dtype=torch.int32, device=d)),
    "searchsorted int32 sorter": lambda d: torch.searchsorted(
        torch.tensor([1.0, 2, 3], device=d), torch.tensor([2.0], device=d), sorter=torch.tensor([0, 1, 2], dtype=torch.int32, device=d)),
    "segment_reduce int16 lengths": lambda d: torch.segment_reduce(
        torch.randn(4, device=d), "sum", lengths=torch.tensor([2, 2], dtype=torch.int16, device=d)),
}


@pytest.mark.parametrize("name", INDEX_DTYPE_ERRORS)
def test_an_index_of_a_dtype_the_op_does_not_take_raises(name):
    assert_raises_like_cpu(INDEX_DTYPE_ERRORS[name], name)


@pytest.mark.parametrize("call", [
    lambda d: torch.zeros(3, device=d).index_select(0, torch.tensor([0, 1], dtype=torch.int32, device=d)),
    lambda d: torch.zeros(3, device=d).index_add(0, torch.tensor([0, 1], dtype=torch.int32, device=d), torch.ones(2, device=d)),
    lambda d: torch.nn.functional.nll_loss(torch.log_softmax(torch.linspace(-2, 2, 15, device=d).view(3, 5), 1),
                                           torch.tensor([1, 2, 3], dtype=torch.uint8, device=d)),
    lambda d: torch.segment_reduce(torch.arange(4.0, device=d), "sum", lengths=torch.tensor([2, 2], dtype=torch.int32, device=d)),
], ids=["index_select int32", "index_add int32", "nll_loss uint8 target", "segment_reduce int32 lengths"])
def test_an_index_dtype_cpu_takes(call):
    _same_as_cpu(call)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float64), (torch.float64, torch.float32),
                                    (torch.float32, torch.float16)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bce_with_logits_has_the_targets_dtype(dtypes, reduction):
    """CPU's composite computes the loss in place into `1 - target`: its dtype is target's (pjrt gave
    the logits' dtype, silently another dtype)."""
    def call(d):
        logits = torch.linspace(-2, 2, 6, device=d).to(dtypes[0])
        target = torch.linspace(0, 1, 6, device=d).to(dtypes[1])
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, target, reduction=reduction)

    expected, got = call("cpu"), call("pjrt")
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float16), (torch.float16, torch.float32),
                                    (torch.float64, torch.float16)], ids=str)
def test_addr_of_a_0d_self_promotes_it_as_a_dimensioned_tensor(dtypes):
    """CPU expands self to the outer product's shape before promoting: addr(0-d float32, float16
    vectors) is float32 (pjrt gave float16, the vectors' dtype, as if self were a wrapped number)."""
    def call(d):
        return torch.addr(torch.tensor(0.5, device=d).to(dtypes[0]), torch.arange(3.0, device=d).to(dtypes[1]),
                          torch.arange(4.0, device=d).to(dtypes[1]), beta=2, alpha=3)

    expected, got = call("cpu"), call("pjrt")
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float64), (torch.float64, torch.float32),
                                    (torch.complex64, torch.float32)], ids=str)
def test_solve_triangular_of_two_dtypes_solves_in_as_dtype(dtypes):
    """CPU casts B to A's dtype; pjrt raised JAX's TypeError ("lax.triangular_solve requires
    arguments to have the same dtypes")."""
    def call(d):
        a = (torch.eye(3, device=d) * 2 + torch.triu(torch.ones(3, 3, device=d), 1)).to(dtypes[0])
        return torch.linalg.solve_triangular(a, torch.arange(6.0, device=d).view(3, 2).to(dtypes[1]), upper=True)

    expected, got = call("cpu"), call("pjrt")
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("call", [
    lambda d: torch.nn.functional.layer_norm(torch.ones(2, 3, device=d), (3,), torch.ones(3, dtype=torch.float64, device=d)),
    lambda d: torch.nn.functional.group_norm(torch.ones(2, 4, 3, device=d), 2, torch.ones(4, dtype=torch.float16, device=d)),
    lambda d: torch.zeros(3, device=d).index_add(0, torch.tensor([0, 1], device=d), torch.ones(2, dtype=torch.float64, device=d)),
    lambda d: torch.cdist(torch.ones(2, 3, device=d), torch.ones(4, 3, dtype=torch.float64, device=d)),
    lambda d: torch.nn.functional.grid_sample(torch.ones(1, 1, 3, 3, device=d), torch.zeros(1, 2, 2, 2, dtype=torch.float64, device=d),
                                              align_corners=False),
    lambda d: torch.ops.aten._softmax_backward_data(torch.ones(2, 3, dtype=torch.float64, device=d), torch.ones(2, 3, device=d),
                                                    1, torch.float32),
    lambda d: torch.nn.functional.batch_norm(torch.ones(2, 3, device=d), torch.zeros(3, device=d), torch.ones(3, device=d),
                                             torch.ones(3, dtype=torch.float64, device=d), training=True),
    lambda d: torch.nn.functional.layer_norm(torch.ones(2, 3, device=d), (3,), None, torch.ones(3, dtype=torch.int64, device=d)),
    lambda d: torch.nn.functional.batch_norm(torch.ones(2, 3, device=d), None, None,
                                             torch.ones(3, dtype=torch.int64, device=d), training=True),
    lambda d: torch.zeros(3, dtype=torch.int64, device=d).index_add(0, torch.tensor([0, 1], device=d), torch.ones(2, device=d)),
    lambda d: torch.zeros(3, device=d).index_copy(0, torch.tensor([0, 1], device=d), torch.ones(2, dtype=torch.int64, device=d)),
    lambda d: torch.nn.functional.cross_entropy(torch.ones(2, 3, device=d), torch.tensor([0, 1], device=d),
                                                weight=torch.ones(3, dtype=torch.int64, device=d)),
    lambda d: torch.nn.functional.binary_cross_entropy(torch.full((2, 3), 0.5, device=d),
                                                       torch.ones(2, 3, dtype=torch.int64, device=d)),
], ids=["layer_norm float64 weight", "group_norm float16 weight", "index_add float64 source", "cdist float64 x2",
        "grid_sample float64 grid", "_softmax_backward_data float64 grad", "batch_norm float64 weight (decomposed)",
        "layer_norm int64 bias", "batch_norm int64 weight (decomposed)", "index_add float32 source into int64",
        "index_copy int64 source", "cross_entropy int64 weight", "binary_cross_entropy int64 target"])
def test_operands_of_two_dtypes_cpu_refuses(call):
    """Ops that are not elementwise, over tensors of two dtypes (index tensors aside): torch's meta
    kernels accept them, CPU's kernels refuse (pjrt promoted and computed); CPU's own call decides
    now, once per op and combination (errors.MixedDtypesRefused)."""
    assert_raises_like_cpu(call, "mixed")


@pytest.mark.parametrize("call", [
    lambda d: torch.nn.functional.layer_norm(torch.ones(2, 3, dtype=torch.bfloat16, device=d), (3,), torch.ones(3, device=d)),
    lambda d: torch.mm(torch.ones(2, 3, device=d), torch.ones(3, 2, device=d)) + torch.ones(2, dtype=torch.float64, device=d),
    lambda d: torch.cat([torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d)]),
    lambda d: torch.where(torch.tensor([True, False], device=d), torch.ones(2, device=d), torch.zeros(2, dtype=torch.float64, device=d)),
    lambda d: torch.nn.functional.batch_norm(torch.ones(2, 3, dtype=torch.bfloat16, device=d), torch.zeros(3, device=d),
                                             torch.ones(3, device=d), torch.ones(3, device=d), training=True),
    lambda d: torch.cat([torch.ones(2, device=d), torch.ones(2, dtype=torch.int64, device=d)]),
    lambda d: torch.gather(torch.ones(2, 3, device=d), 1, torch.tensor([[0], [2]], dtype=torch.int32, device=d)),
    lambda d: torch.nn.functional.embedding(torch.tensor([0, 2], device=d), torch.arange(6.0, device=d).view(3, 2)),
    lambda d: torch.nn.functional.mse_loss(torch.ones(2, 3, device=d), torch.zeros(2, 3, dtype=torch.int64, device=d)),
], ids=["layer_norm bfloat16 input float32 weight (CPU's mixed dtype)", "add promotes", "cat promotes", "where promotes",
        "batch_norm bfloat16 input float32 statistics", "cat of float32 and int64 promotes", "gather's int32 index",
        "embedding's indices", "mse_loss int64 target"])
def test_operands_of_two_dtypes_cpu_accepts(call):
    for _ in range(2):  # the second call is not asked again
        _same_as_cpu(call)


# --------------------------------------------------------------------------- in-place and undeclared dtypes (sweep)
@pytest.mark.parametrize("call", [
    lambda d: torch.native_batch_norm(torch.ones(2, 3, dtype=torch.complex64, device=d), None, None, None, None,
                                      True, 0.1, 1e-5),
    lambda d: torch.nn.functional.batch_norm(torch.ones(2, 3, dtype=torch.complex64, device=d),
                                             torch.zeros(3, dtype=torch.complex64, device=d),
                                             torch.ones(3, dtype=torch.complex64, device=d)),
    lambda d: torch.nn.functional.instance_norm(torch.ones(2, 3, 4, dtype=torch.complex64, device=d)),
], ids=["native_batch_norm", "batch_norm (running statistics)", "instance_norm"])
def test_a_decomposed_op_refuses_a_dtype_cpu_has_no_kernel_for(call):
    """native_batch_norm runs as its decomposition into _native_batch_norm_legit overloads, which CPU's
    call never reaches, so the dtype table knows nothing of them: pjrt normalized complex inputs where
    CPU raises '"batch_norm" not implemented for 'ComplexFloat''. The decomposed op's own entry is
    checked (eager/fallback._dispatch_dtype_as_cpu)."""
    assert_raises_like_cpu(call, "complex batch_norm")
    _same_as_cpu(lambda d: torch.nn.functional.instance_norm(torch.arange(24.0, device=d).view(2, 3, 4)))


@pytest.mark.parametrize("call", [
    lambda d: torch.ones(2, 2, dtype=torch.bool, device=d) @ torch.ones(2, 2, dtype=torch.bool, device=d),
    lambda d: torch.cdist(torch.ones(2, 3, device=d), torch.ones(2, 3, dtype=torch.float64, device=d)),
], ids=["mm bool", "cdist float64 x2"])
def test_an_empty_call_cpu_accepts_speaks_only_for_empty_calls(call):
    """CPU returns before its dtype checks for an empty input (mm of a bool [0, 2] matrix, cdist of no
    rows): its acceptance let every later call of the op in that dtype through, so after one empty
    bool mm pjrt multiplied bool matrices where CPU raises (the in-place sweep's empty samples did this
    to tests run after it). An acceptance of an empty call is kept for empty calls only."""
    empty = {"mm bool": lambda d: torch.ones(0, 2, dtype=torch.bool, device=d) @ torch.ones(2, 3, dtype=torch.bool, device=d),
             "cdist float64 x2": lambda d: torch.cdist(torch.ones(0, 3, device=d),
                                                       torch.ones(2, 3, dtype=torch.float64, device=d))}
    for name, make in empty.items():
        assert make("pjrt").shape == make("cpu").shape, name
    assert_raises_like_cpu(call, "after an empty call")


def _bool_matrix(d):
    return torch.tensor([[True, False, True], [False, True, True], [True, True, False]], device=d)


@pytest.mark.parametrize("call", [
    lambda d: torch.linalg.eigh(_bool_matrix(d)),
    lambda d: torch.linalg.eigvals(_bool_matrix(d)),
    lambda d: torch.linalg.eigvals(_bool_matrix(d).long()),
    lambda d: torch.geqrf(_bool_matrix(d)),
    lambda d: torch.nn.functional.max_unpool2d(torch.ones(1, 1, 2, 2, dtype=torch.bool, device=d),
                                               torch.tensor([[[[0, 3], [8, 15]]]], device=d), 2),
    lambda d: torch.nn.functional.max_unpool2d(torch.ones(1, 1, 2, 2, dtype=torch.complex64, device=d),
                                               torch.tensor([[[[0, 3], [8, 15]]]], device=d), 2),
    lambda d: torch._softmax_backward_data(torch.ones(2, 3, dtype=torch.complex64, device=d),
                                           torch.ones(2, 3, dtype=torch.complex64, device=d), 1, torch.complex64),
    lambda d: torch.bucketize(torch.ones(3, dtype=torch.complex64, device=d),
                              torch.arange(3, dtype=torch.complex64, device=d)),
    lambda d: torch.histogram(torch.ones(3, dtype=torch.complex64), 3) if d == "cpu" else
    torch.histogram(torch.ones(3, dtype=torch.complex64, device=d), 3),
], ids=["eigh bool", "eigvals bool", "eigvals int64", "geqrf bool", "max_unpool2d bool", "max_unpool2d complex64",
        "_softmax_backward_data complex64", "bucketize complex64", "histogram complex64"])
def test_a_dtype_whose_opinfo_makes_no_samples_is_refused(call):
    """The dtype table (tools/cpu_dtypes.py) learns from each OpInfo's samples in the dtypes it does not
    declare; where it makes none (max_unpool's come from max_pool, eigh's from an SVD, neither takes
    bool), no refusal was learned and pjrt computed. The tool now converts the OpInfo's float32 samples;
    eigvals, whose CPU error comes before any dispatch, is refused by its lowering (`_complex_of`)."""
    assert_raises_like_cpu(call, "undeclared dtype")


@pytest.mark.parametrize("name", ["cumsum_", "cumprod_"])
def test_cumulative_inplace_computes_in_selfs_dtype(name):
    """CPU's cumsum_ is cumsum_out(self, self): it computes in self's dtype, so a bool self raises
    '"cumsum_out_cpu" not implemented for 'Bool'' (pjrt computed int64 and refused the cast in other
    words), and an int8 self is summed in int8. The in-place kernel passes self's dtype as the out=
    kernel passes out's (the entry's computes_in_out_dtype)."""
    assert_raises_like_cpu(lambda d: getattr(torch.tensor([[True, False, True]], device=d), name)(1), name)
    _same_as_cpu(lambda d: getattr(torch.tensor([[1, 0, 3, 100], [100, 100, 2, 2]], dtype=torch.int8, device=d),
                                   name)(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.complex64, torch.int64])
@pytest.mark.parametrize("shape", [(0, 8, 8), (2, 0, 8, 8), (2, 0, 8, 8, 8), (2, 3, 0, 8, 8), (0, 2, 3, 8, 2)])
def test_adaptive_avg_pool_of_an_empty_input(shape, dtype):
    """CPU returns an empty input's empty result before its dtype dispatch: a bool or complex
    adaptive_avg_pool1d of no rows computes there, and pjrt's lowering (no bool pooling) failed. But
    CPU's 3-d kernel refuses an empty non-batch dimension, which torch's meta kernel accepts: pjrt
    computed an empty or a zero result there."""
    pool = {3: lambda t: torch.nn.functional.adaptive_avg_pool1d(t, 3), 4: lambda t: torch.nn.functional.adaptive_avg_pool2d(t, 3),
            5: lambda t: torch.nn.functional.adaptive_avg_pool3d(t, 2)}[len(shape)]

    def call(d):
        return pool(torch.ones(shape, dtype=dtype, device=d))

    try:
        expected = call("cpu")
    except RuntimeError:
        assert_raises_like_cpu(call, "empty adaptive_avg_pool")
        return
    actual = call("pjrt")
    assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype)


@pytest.mark.parametrize("call", [
    lambda d: torch.ones(3, dtype=torch.int64, device=d).ldexp_(torch.tensor(1.0)),
    lambda d: torch.ones(3, dtype=torch.bool, device=d).clamp_(min=1e-6 + 0j),
    lambda d: torch.view_as_complex(torch.ones(2, 2, dtype=torch.bool, device=d)),
], ids=["ldexp_ into int64", "clamp_ into bool", "view_as_complex of bool"])
def test_a_refused_inplace_cast_in_cpus_words(call):
    """An in-place result self cannot take: CPU's kernels word it their own way ("ldexp can't be cast
    to the desired output type Long", clamp_'s "... output type bool", by the C++ type), so the Python
    in-place kernel lets CPU's call name it. (The C++ fast path stores its results through the same
    check without the call's arguments, so there the words stay pjrt's: docs/conformance-notes.md.)
    view_as_complex says "half, float and double" and names the dtype as c10 does, as CPU."""
    assert_raises_like_cpu(call, "in-place cast")


_SPD = [[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]]


@pytest.mark.parametrize("call", [
    lambda d: torch.nn.functional.soft_margin_loss(torch.ones(3, dtype=torch.int64, device=d),
                                                   torch.ones(3, dtype=torch.int64, device=d)),
    lambda d: torch.nn.functional.soft_margin_loss(torch.ones(3, dtype=torch.uint8, device=d), torch.ones(3, device=d),
                                                   reduction="none"),
    lambda d: torch.linalg.eigvals(torch.tensor(_SPD, dtype=torch.float16, device=d)),
    lambda d: torch.linalg.eigvals(torch.tensor(_SPD, dtype=torch.bfloat16, device=d)),
    lambda d: torch.linalg.lstsq(torch.tensor(_SPD, dtype=torch.float16, device=d),
                                 torch.tensor(_SPD, dtype=torch.float16, device=d)),
], ids=["soft_margin_loss int64", "soft_margin_loss uint8", "eigvals float16", "eigvals bfloat16", "lstsq float16"])
def test_an_undeclared_input_dtype_raises_as_cpu(call):
    """From a one-off run of the undeclared-dtype sweep with int64, uint8, float16 and bfloat16 inputs.
    soft_margin_loss of an integer input: CPU computes in the input's dtype and refuses the float exp's
    cast; pjrt returned int64 zeros (a truncated float loss). eigvals and lstsq of float16 hand LAPACK a
    dtype it has no kernel of: JAX traces it and fails only when the region compiles ("failed when its
    region ran"); the lowerings refuse at trace time, so CPU's call names the error."""
    assert_raises_like_cpu(call, "undeclared input dtype")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(0, 0), (2, 0, 0), (0, 3, 3)])
def test_determinant_of_no_elements(shape, dtype):
    """CPU makes no LAPACK call for an empty matrix (a 0 x 0 determinant is 1, a float16 one too, though
    its float16 det of a 3 x 3 matrix is refused); pjrt called LAPACK, which has no float16 kernels, and
    failed when the executable compiled."""
    _same_as_cpu(lambda d: torch.linalg.det(torch.ones(shape, dtype=dtype, device=d)))
    if dtype == torch.float32:
        _same_as_cpu(lambda d: torch.linalg.slogdet(torch.ones(shape, dtype=dtype, device=d))[1])
    else:  # slogdet refuses low precision dtypes first
        assert_raises_like_cpu(lambda d: torch.linalg.slogdet(torch.ones(shape, dtype=dtype, device=d)), "slogdet")


@pytest.mark.parametrize("nd", [2, 3])
def test_fractional_max_pool_takes_the_first_samples_of_a_longer_batch(nd):
    """_random_samples with more rows than the input's batch: CPU uses the first rows; pjrt's gather
    broadcast the input to the samples' batch (a (1, C, ...) input gave a (2, C, ...) result; found
    by test_modules.py's test_forward of nn.FractionalMaxPool3d)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn((1, 4) + (6,) * nd, generator=g)
    samples = torch.rand(3, 4, nd, generator=g)
    pool = torch.nn.functional.fractional_max_pool2d if nd == 2 else torch.nn.functional.fractional_max_pool3d
    want = pool(x, 2, output_size=3, _random_samples=samples, return_indices=True)
    got = pool(x.to("pjrt"), 2, output_size=3, _random_samples=samples.to("pjrt"), return_indices=True)
    for w, o in zip(want, got):
        assert o.shape == w.shape and torch.equal(o.cpu(), w)


def test_masked_fill_with_a_device_value_out_of_range_raises_as_cpu():
    """A 0-d tensor value on the device that the target's dtype cannot hold: CPU's error, not a
    wrapped or saturated fill."""
    def call(device):
        x = torch.zeros(3, dtype=torch.int8, device=device)
        mask = torch.tensor([True, False, True], device=device)
        x.masked_fill(mask, torch.full((), 300.0, device=device))
        if device == "pjrt":
            torch.pjrt.synchronize()
    with pytest.raises(RuntimeError) as cpu:
        call("cpu")
    with pytest.raises(RuntimeError) as pjrt:
        call("pjrt")
    assert str(pjrt.value).split("\n")[0] == str(cpu.value).split("\n")[0]


# An in-place result CPU will not cast into self: CPU's own words, also from the C++ fast path (its
# store used to raise the Python store's "result type Float ..." for ldexp_, and c10's 'Bool' for clamp_)
UNCASTABLE_IN_PLACE = {
    "ldexp_ into int64": lambda d: torch.ones(3, dtype=torch.int64, device=d).ldexp_(torch.ones(3, device=d)),
    "ldexp_ into bool": lambda d: torch.ones(3, dtype=torch.bool, device=d).ldexp_(torch.ones(3, device=d)),
    "clamp_ into bool": lambda d: torch.ones(3, dtype=torch.bool, device=d).clamp_(min=torch.zeros(3, device=d)),
    "add_ float into int64": lambda d: torch.ones(3, dtype=torch.int64, device=d).add_(torch.ones(3, device=d)),
}


@pytest.mark.parametrize("mode", ["fused", "op"])
@pytest.mark.parametrize("name", UNCASTABLE_IN_PLACE)
def test_an_in_place_result_cpu_will_not_cast_into_self_raises_cpus_words(name, mode):
    with in_eager_mode(mode):
        for _ in range(3):  # the C++ fast path serves the later calls
            assert_raises_like_cpu(UNCASTABLE_IN_PLACE[name], name)


# --------------------------------------------------------------------------- index_reduce mean in half precision
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_index_reduce_mean_of_half_floats_adds_in_the_dtype_as_cpu(dtype, include_self):
    """CPU's index_reduce adds each source row in the tensor's dtype, rounding at every step (its
    scatter_reduce sums in float32 and rounds once); pjrt summed as scatter_reduce does, a few ulps
    off CPU wherever three or more rows meet (test_torch's test_index_reduce mean float16/bfloat16)."""
    generator = torch.Generator().manual_seed(0)
    dest = torch.randn(3, 4, 5, generator=generator).mul(5).to(dtype)
    source = torch.randn(3, 9, 5, generator=generator).mul(5).to(dtype)
    index = torch.tensor([0, 1, 1, 1, 3, 1, 0, 1, 1])
    _same_as_cpu(lambda d: dest.to(d, copy=True).index_reduce_(1, index.to(d), source.to(d), "mean",
                                                               include_self=include_self))
    # scatter_reduce keeps CPU's float32 sums
    expanded = index.view(1, -1, 1).expand(3, 9, 5)
    _same_as_cpu(lambda d: dest.to(d).scatter_reduce(1, expanded.to(d), source.to(d), "mean", include_self=include_self))


# --------------------------------------------------------------------------- integer ** negative integer
@pytest.mark.parametrize("dtype", [torch.int64, torch.int16, torch.uint8, torch.bool])
@pytest.mark.parametrize("exponent", [-1, -2])
def test_integer_tensor_to_a_negative_integer_power_raises_as_cpu(dtype, exponent):
    """CPU refuses ("Integers to negative integer powers are not allowed."); pjrt returned 0, 1 or -1."""
    assert_raises_like_cpu(lambda d: torch.arange(-3, 3, device=d).to(dtype).pow(exponent), "negative power")
    assert_raises_like_cpu(lambda d: torch.arange(-3, 3, device=d).to(dtype).pow_(exponent), "negative power, in place")
    _same_as_cpu(lambda d: torch.arange(-3, 3, device=d).to(dtype).pow(-exponent + 5))
    # foreach: the Scalar and the Scalar[] overloads (the exponents static as pow's)
    assert_raises_like_cpu(lambda d: torch._foreach_pow([torch.arange(1, 4, device=d).to(dtype)], exponent),
                           "_foreach_pow.Scalar")
    assert_raises_like_cpu(lambda d: torch._foreach_pow([torch.arange(3, device=d).float(),
                                                         torch.arange(1, 4, device=d).to(dtype)], [2, exponent]),
                           "_foreach_pow.ScalarList")
    assert_raises_like_cpu(lambda d: torch._foreach_pow([torch.arange(1, 4, device=d).to(dtype)], [exponent]),
                           "_foreach_pow.ScalarList of one")
    _same_as_cpu(lambda d: torch._foreach_pow([torch.arange(-3, 3, device=d).to(dtype), torch.arange(3, device=d).float()],
                                              [-exponent + 5, exponent])[0])
    _same_as_cpu(lambda d: torch._foreach_pow([torch.arange(-3, 3, device=d).to(dtype)], [exponent - 0.5])[0])


# --------------------------------------------------------------------------- from test_unary_ufuncs (2026-12-07)
def test_threshold_of_uint8_computes_as_cpu():
    """CPU's threshold kernel takes uint8; pjrt raised '"threshold" not implemented for 'torch.uint8''."""
    t = torch.tensor([0, 3, 100, 255, 1], dtype=torch.uint8)
    for threshold, value in ((3, 7), (2.5, 1), (0, 255), (-1, 5)):
        _same_as_cpu(lambda d: torch.nn.functional.threshold(t.to(d), threshold, value))
    assert_raises_like_cpu(lambda d: torch.nn.functional.threshold(t.to(d), 300, 2), "a limit uint8 cannot hold")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_a_prim_given_a_python_number_for_a_tensor_computes_as_cpu(dtype):
    """torch._refs.sigmoid of a complex tensor calls a prim whose Tensor argument is a Python
    complex (1 + 0j); the host check of the op's Scalars read `.dtype` from it (AttributeError)."""
    x = torch.tensor([1 + 2j, -0.5 + 0.1j, 3 - 4j], dtype=dtype)
    torch.testing.assert_close(torch._refs.sigmoid(x.to("pjrt")).cpu(), torch._refs.sigmoid(x))


def test_exp2_is_exact_at_integers_and_as_accurate_as_cpu():
    """XLA's exp2 is exp(x ln 2): float32 2**47 was off by 1.5e-6 and only 9% of float64 results were
    within 1e-15 of CPU's. Subnormal results are not compared: XLA:CPU flushes them to zero
    (docs/conformance-notes.md)."""
    ints = torch.arange(-126, 127, dtype=torch.int32)
    _same_as_cpu(lambda d: torch.exp2(ints.to(d)))
    g = torch.Generator().manual_seed(0)
    for dtype, lo, hi, rtol in ((torch.float32, -120, 127, 1.3e-6), (torch.float64, -1000, 1023, 1e-15)):
        x = (torch.rand(4000, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
        x = torch.cat([x, torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1e30, -1e30], dtype=dtype)])
        torch.testing.assert_close(torch.exp2(x.to("pjrt")).cpu(), torch.exp2(x), rtol=rtol, atol=0, equal_nan=True)


@pytest.mark.parametrize("op", [torch.cosh, torch.sinh])
def test_cosh_and_sinh_as_accurate_as_cpu(op):
    """XLA's cosh and sinh round |x| + log(1/2) before exp: 60% of float32 results in [-95, 95] were
    more than 1.3e-6 from CPU's (test_unary_ufuncs' reference_numerics_small int tests). Kept inside
    +-88 (float32) and +-709 (float64): past exp's overflow CPU's own vectorized and scalar kernels
    disagree."""
    g = torch.Generator().manual_seed(0)
    for dtype, limit, rtol in ((torch.float32, 88, 1.3e-6), (torch.float64, 709, 1e-14)):
        x = ((torch.rand(4000, generator=g, dtype=torch.float64) * 2 - 1) * limit).to(dtype)
        x = torch.cat([x, torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1e-30, -0.5, 1.0], dtype=dtype)])
        torch.testing.assert_close(op(x.to("pjrt")).cpu(), op(x), rtol=rtol, atol=0, equal_nan=True)
    ints = torch.arange(-88, 89, dtype=torch.int16)
    torch.testing.assert_close(op(ints.to("pjrt")).cpu(), op(ints), rtol=1.3e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("op", [torch.abs, torch.sqrt, torch.exp, torch.exp2])
def test_complex_special_values_and_signed_zeros_as_cpu(op, dtype):
    """C99's special values, as CPU's kernels give them (test_unary_ufuncs' reference_numerics_extremal):
    XLA's |inf + NaN i| was NaN, sqrt(-2.5 - 0i) +1.58i (the branch cut's -0 read as +0), exp and
    exp2 of infinite parts NaN + NaN i and of a -0 imaginary part +0."""
    values = [0.0, -0.0, 1.0, -2.5, float("inf"), float("-inf"), float("nan"), 1e30, 1e-30]
    z = torch.tensor([complex(a, b) for a in values for b in values], dtype=dtype)
    expected, actual = op(z), op(z.to("pjrt")).cpu()
    torch.testing.assert_close(actual, expected, equal_nan=True)
    if expected.is_complex():  # the sign of a zero imaginary part too
        zero = expected.imag == 0
        assert torch.equal(torch.signbit(actual.imag[zero]), torch.signbit(expected.imag[zero]))


def _assert_complex_same_as_cpu(actual, expected):
    """Equal as assert_close has it, NaN == NaN, and zero parts with CPU's signs."""
    torch.testing.assert_close(actual, expected, equal_nan=True)
    for part in (torch.real, torch.imag):
        zero = part(expected) == 0
        assert torch.equal(torch.signbit(part(actual)[zero]), torch.signbit(part(expected)[zero]))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize(
    "op", [torch.rsqrt, torch.sigmoid, torch.tanh, torch.nn.functional.tanhshrink, torch.atan],
    ids=["rsqrt", "sigmoid", "tanh", "tanhshrink", "atan"])
def test_complex_special_values_and_signed_zeros_of_rsqrt_sigmoid_tanh_atan_as_cpu(op, dtype):
    """C99's special values and signed zeros, as CPU's kernels give them (test_unary_ufuncs'
    reference_numerics_extremal): rsqrt(x + inf i) was 0 (CPU, 1 / sqrt(z) in c10's division:
    NaN + NaN i), sigmoid(inf + inf i) NaN (CPU: 1), tanh(0 + inf i) NaN + NaN i (CPU: 0 + NaN i),
    atan(-0 + inf i) +pi/2 (CPU: -pi/2), and -0 parts read as +0; tanhshrink's x - tanh x lost a
    zero's sign in the complex subtraction (CPU adds -1 times tanh x)."""
    values = [0.0, -0.0, 1.0, -2.5, float("inf"), float("-inf"), float("nan"), 1e30, 1e-30]
    z = torch.tensor([complex(a, b) for a in values for b in values], dtype=dtype)
    _assert_complex_same_as_cpu(op(z.to("pjrt")).cpu(), op(z))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_sigmoid_of_large_values_as_cpu(dtype):
    """test_unary_ufuncs' reference_numerics_large: sigmoid(-100 + 1i) in complex64, where exp(100 - 1i)
    overflows, is NaN + NaN i on CPU (1 / (inf - inf i) in c10's division); XLA's logistic gave 0."""
    reals = [s * m for m in (100.0, 1e3, 1e10, 1e30) for s in (1, -1)] + [88.0, -89.0, 709.0, -710.0]
    imags = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 100.0, -1e30, 1e30, 1e-30]
    z = torch.tensor([complex(a, b) for a in reals for b in imags], dtype=dtype)
    _assert_complex_same_as_cpu(torch.sigmoid(z.to("pjrt")).cpu(), torch.sigmoid(z))


def test_complex_tanh_near_its_poles_as_accurate_as_cpu():
    """XLA's complex64 tanh lost precision near the poles y = (k + 1/2) pi (24% of these 4000 values
    more than 1.3e-6 from CPU's, up to 7e-5; test_unary_ufuncs' reference_numerics_extremal tanh);
    now CPU's (glibc's) formula, (sinh x cosh x + i sin y cos y) / (sinh^2 x + cos^2 y)."""
    g = torch.Generator().manual_seed(0)
    re = (torch.rand(4000, generator=g, dtype=torch.float64) * 2 - 1) * 0.05
    k = torch.randint(-3, 4, (4000,), generator=g).double()
    im = (k + 0.5) * torch.pi + (torch.rand(4000, generator=g, dtype=torch.float64) * 2 - 1) * 0.01
    for dtype in (torch.complex64, torch.complex128):
        z = torch.complex(re, im).to(dtype)
        torch.testing.assert_close(torch.tanh(z.to("pjrt")).cpu(), torch.tanh(z))


@pytest.mark.parametrize("op", [torch.igamma, torch.igammac])
def test_igamma_of_large_close_arguments_as_accurate_as_cpu(op):
    """test_unary_ufuncs' test_igamma_common grid: JAX's float32 series were ~3e-5 off where a and
    x are large and close (igamma(47.26, 47.26)); CPU's holds float32's precision there."""
    v = torch.logspace(-4, 4, steps=500, base=2.71828182846, dtype=torch.float64).float()
    a, x = v.unsqueeze(-1), v.unsqueeze(0)
    for other in (x, a, 0.5 * a, 2.0 * a):
        torch.testing.assert_close(op(a.to("pjrt"), other.to("pjrt")).cpu(), op(a, other))


# --------------------------------------------------------------------------- division with a rounding mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_division_with_rounding_as_cpu(dtype, mode):
    """CPU divides 16-bit floats by a tensor in their own arithmetic, each step rounded
    (trunc(1 / bfloat16(0.1001)) is 10 there, not 9), and by a one-element divisor in float at
    the divisor's full precision; pjrt computed every case in float (16% of random bfloat16
    truncated quotients differed). A broadcast divisor divides (XLA would multiply by 1 / b:
    float32 53.1531 // 0.1001 truncated to 530 where CPU gives 531)."""
    gen = torch.Generator().manual_seed(0)
    a = (torch.randn(20000, generator=gen) * 50).to(dtype)
    b = torch.randn(20000, generator=gen).to(dtype)
    a[:6] = torch.tensor([1.0, -1.0, 0.0, float("inf"), float("nan"), 53.153099060058594])
    b[:6] = torch.tensor([0.10009765625, 0.0, 0.0, 2.0, 1.0, 3.0])
    rows, row = (torch.randn(200, 100, generator=gen) * 50).to(dtype), torch.randn(1, 100, generator=gen).to(dtype)
    pairs = [(a, b), (rows, row), (a, 0.1001), (a, torch.tensor(0.30078125, dtype=dtype)),
             (a, torch.tensor([0.30078125], dtype=dtype))]
    for x, y in pairs:
        _same_as_cpu(lambda d: torch.div(x.to(d), y.to(d) if isinstance(y, torch.Tensor) else y, rounding_mode=mode))
    if mode == "floor":
        _same_as_cpu(lambda d: torch.floor_divide(a.to(d), b.to(d)))
