"""Ops the table lacks run as torch's decomposition traced once per signature into one
executable (torch_pjrt/eager/decomposed.py), with CPU's results, writes and aliasing."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt.eager import decomposed

aten = torch.ops.aten


def _traced(op) -> list:
    return [p for key, p in decomposed._programs.items() if key[0] is op]


def test_a_decomposed_op_is_one_traced_program_per_signature_with_cpu_results():
    x = torch.randn(2, 8, 3, 3)
    for _ in range(3):  # the same signature: traced once
        torch.testing.assert_close(F.channel_shuffle(x.to("pjrt"), 4).cpu(), F.channel_shuffle(x, 4), rtol=0, atol=0)
    programs = _traced(aten.channel_shuffle.default)
    assert len(programs) == 1 and programs[0] is not None
    y = torch.randn(1, 4, 2, 2)  # a new shape: a second signature
    torch.testing.assert_close(F.channel_shuffle(y.to("pjrt"), 2).cpu(), F.channel_shuffle(y, 2), rtol=0, atol=0)
    assert len(_traced(aten.channel_shuffle.default)) == 2
    assert torch_pjrt.decomposed_ops()["aten.channel_shuffle.default"] >= 4


def test_in_place_decomposition_writes_through_a_view_and_returns_self():
    x = torch.arange(12).reshape(3, 4)
    p = x.to("pjrt")
    view = p[:, 1:]
    assert view.__ilshift__(2) is view
    x[:, 1:].__ilshift__(2)
    assert p.cpu().tolist() == x.tolist()
    assert all(prog is not None for prog in _traced(aten.__ilshift__.Scalar))


def test_signatures_that_do_not_trace_run_op_by_op():
    # out= with a resize: the functional graph cannot resize its input, so the
    # decomposition runs op by op, with CPU's result and out's new shape
    a, b = torch.randn(3), torch.randn(3)
    out = torch.empty(0, dtype=torch.complex64, device="pjrt")
    torch.complex(a.to("pjrt"), b.to("pjrt"), out=out)
    torch.testing.assert_close(out.cpu(), torch.complex(a, b))
    assert _traced(aten.complex.out) == [None]


def test_views_at_other_offsets_of_a_growing_buffer_share_one_program():
    """A decomposed op on the last token of a buffer that grows a token per step (as generate's
    loop reads `ids[:, -1:]`). The view's offset (and its size-1 dim's stride) change every step;
    the graph reads values, not layouts."""
    ids = torch.randint(0, 9, (2, 4, 3))
    pids = ids.to("pjrt")
    before = len(_traced(aten.channel_shuffle.default))
    for step in range(6):
        torch.testing.assert_close(F.channel_shuffle(pids[..., -1:], 2).cpu(), F.channel_shuffle(ids[..., -1:], 2))
        new = torch.full((2, 4, 1), step)
        ids, pids = torch.cat([ids, new], -1), torch.cat([pids, new.to("pjrt")], -1)
    assert len(_traced(aten.channel_shuffle.default)) - before == 1


def test_a_graph_that_reads_its_input_layout_is_keyed_by_it():
    base = torch.arange(20.0)
    pbase = base.to("pjrt")
    for offset in (0, 3, 5):
        view, pview = base[offset:offset + 8], pbase[offset:offset + 8]
        torch.testing.assert_close(torch.as_strided_scatter(pview, pview[:4] * 2, (4,), (2,)).cpu(),
                                   torch.as_strided_scatter(view, view[:4] * 2, (4,), (2,)), rtol=0, atol=0)
