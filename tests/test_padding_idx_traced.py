"""padding_idx is traced, not static (issue 32): embedding_bag's forward takes it as a `split=`
argument (registry.Split: whether there is a padding index keys the executable, its value is
traced), its backwards and embedding's take it traced, so a loop over padding_idx values with one
shape builds a bounded number of executables, with CPU's results and gradients."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.budget import measured_warm

_W = torch.randn(20, 5, generator=torch.Generator().manual_seed(0))
_INPUT = torch.tensor([3, 0, 7, 7, 19, 5, 3, 11, 0, 13, 5, 2])
_OFFSETS = torch.tensor([0, 3, 3, 7])
_PER_SAMPLE = torch.randn(12, generator=torch.Generator().manual_seed(1))
# None and -1 (no padding index), indices present in _INPUT and absent, and a negative one (-5: row 15)
PADDING = [None, -1, 0, 3, 5, 7, 11, 13, 19, 4, -5]


def _embedding_bag(device, padding_idx, mode, per_sample):
    weight = _W.to(device).detach().requires_grad_()
    weights = _PER_SAMPLE.to(device).detach().requires_grad_() if per_sample else None
    out = F.embedding_bag(_INPUT.to(device), weight, _OFFSETS.to(device), mode=mode, padding_idx=padding_idx,
                          per_sample_weights=weights)
    (out * torch.arange(out.numel(), dtype=out.dtype, device=device).reshape(out.shape)).sum().backward()
    return [out.detach(), weight.grad] + ([weights.grad] if per_sample else [])


def _embedding(device, padding_idx):
    weight = _W.to(device).detach().requires_grad_()
    out = F.embedding(_INPUT.reshape(3, 4).to(device), weight, padding_idx=padding_idx)
    (out * torch.arange(out.numel(), dtype=out.dtype, device=device).reshape(out.shape)).sum().backward()
    return [out.detach(), weight.grad]


def _compare(fn, values) -> None:
    for padding_idx in values:
        for got, expected in zip(fn("pjrt", padding_idx), fn("cpu", padding_idx)):
            torch.testing.assert_close(got.cpu(), expected, msg=lambda m: f"padding_idx={padding_idx}: {m}")


def _built_over_padding(fn) -> tuple[int, int, dict]:
    """(eager executables, fused regions compiled, executables per op) for fn(device, padding_idx)
    over PADDING, each result and gradient compared with the CPU's, after the same loop over a
    value without and one with a padding index, three times: the first call of a signature CPU is
    asked about once in a process (the backward's mixed dtypes, errors.MixedDtypesRefused) reads its
    operands, which ends a region where later calls do not, and fused eager compiles a region the
    second time it sees it."""
    import torch_pjrt

    def warm() -> None:
        for _ in range(3):
            _compare(fn, [None, 0])

    def measure() -> tuple[int, int, dict]:
        torch.pjrt.synchronize()
        torch_pjrt.reset_eager_stats()
        _compare(fn, PADDING)
        torch.pjrt.synchronize()
        stats = torch_pjrt.eager_stats()
        return stats["executables"], stats["fused"]["region_compiles"], stats["by_op"]

    return measured_warm(warm, measure)


@pytest.mark.parametrize("mode,per_sample", [("sum", False), ("sum", True), ("mean", False), ("max", False)])
def test_embedding_bag_padding_idx_values_share_executables(mode, per_sample):
    built, regions, by_op = _built_over_padding(lambda d, p: _embedding_bag(d, p, mode, per_sample))
    assert (built, regions) == (0, 0), f"{mode}: {by_op}, {regions} regions for {len(PADDING)} padding_idx values"


def test_embedding_padding_idx_values_share_executables():
    built, regions, by_op = _built_over_padding(_embedding)
    assert (built, regions) == (0, 0), f"{by_op}, {regions} regions for {len(PADDING)} padding_idx values"


def test_embedding_bag_split_keys_whether_there_is_a_padding_index():
    """With and without a padding index the forward's offset2bag differs in shape (CPU's fast sum
    path leaves it empty): the split's static part, one executable each."""
    import torch_pjrt

    torch_pjrt.reset_eager_stats()
    weight, offsets = torch.randn(9, 3, device="pjrt"), torch.tensor([0, 2], device="pjrt")
    shapes = {}
    for padding_idx in (-1, 2, 4, -1, 8):
        out = torch.ops.aten._embedding_bag(weight, torch.tensor([1, 2, 4, 8], device="pjrt"), offsets,
                                            padding_idx=padding_idx)
        shapes[padding_idx] = tuple(out[1].shape)
    assert shapes == {-1: (0,), 2: (4,), 4: (4,), 8: (4,)}
    assert torch_pjrt.eager_stats()["by_op"].get("aten._embedding_bag.default", 0) <= 2
