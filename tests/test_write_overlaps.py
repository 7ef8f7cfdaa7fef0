"""In-place and out= writes through strided views: the overlap test that decides whether CPU's
oracle is asked (a host read of the call's storages) proves non-overlap from the layout, and
still finds the layouts that do overlap (CPU's error, type and message)."""
import itertools
import random

import pytest
import torch

from torch_pjrt.eager import errors


def _offsets(t: torch.Tensor) -> list[int]:
    return [t.storage_offset() + sum(i * s for i, s in zip(index, t.stride()))
            for index in itertools.product(*(range(n) for n in t.shape))]


def test_layout_proof_is_sound_and_finds_overlaps():
    rng = random.Random(0)
    base = torch.empty(4096)
    proven = 0
    for _ in range(3000):
        ndim = rng.randint(1, 4)
        size = [rng.randint(0, 4) for _ in range(ndim)]
        stride = [rng.choice([0, 1, 2, 3, 4, 5, 8, 12, 16, 20, 60]) for _ in range(ndim)]
        t = base.as_strided(size, stride, rng.randint(0, 8))
        offsets = _offsets(t)
        overlaps = len(set(offsets)) != len(offsets)
        if overlaps:
            assert errors.may_overlap_itself(t), (size, stride)
        elif not errors.may_overlap_itself(t):
            proven += 1
    assert proven > 1000  # the proof covers most non-overlapping layouts, not only contiguous ones
    # views users write through are proven free of overlap
    x = torch.empty(6, 5, 4)
    for view in (x.transpose(0, 2), x[:, ::2], x.permute(1, 2, 0)[1], x[..., 1], x.t() if x.ndim == 2 else x.mT):
        assert not errors.may_overlap_itself(view)
    assert errors.may_overlap_itself(torch.empty(3, 1).expand(3, 4))


@pytest.fixture
def oracle_calls(monkeypatch):
    calls = []
    real = errors.cpu_error

    def counted(op, args, kwargs):
        calls.append(str(op))
        return real(op, args, kwargs)

    monkeypatch.setattr(errors, "cpu_error", counted)
    return calls


def test_writes_through_strided_views_do_not_ask_cpu(oracle_calls):
    def steps(device):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(3, 4, 5, generator=g).to(device)
        src = torch.randn(5, 4, 3, generator=g).to(device)
        xt = x.transpose(0, 2)
        for i in range(5):
            xt[i] *= src[i]       # mul_ and the copy_ of `a[i] = a[i]` through a transposed view
            xt[i, ::2].add_(1.5)
        x[:, 1:3].copy_(src.permute(2, 1, 0)[:, :2])
        torch.mul(src[0], 2, out=xt[1])
        return x

    expected = steps("cpu")
    torch.testing.assert_close(steps("pjrt").cpu(), expected)
    oracle_calls.clear()  # CPU is asked once per op whether it allows a write onto the same view
    torch.testing.assert_close(steps("pjrt").cpu(), expected)
    assert oracle_calls == []


@pytest.mark.parametrize("case", ["expanded copy_", "expanded add_", "expanded out="])
def test_overlapping_writes_raise_cpus_error(case):
    def call(device):
        x = torch.zeros(3, 1, device=device).expand(3, 4)
        if case == "expanded copy_":
            return x.copy_(torch.ones(3, 4, device=device))
        if case == "expanded add_":
            return x.add_(1)
        return torch.add(torch.ones(3, 4, device=device), 1, out=x)

    with pytest.raises(Exception) as cpu:
        call("cpu")
    with pytest.raises(Exception) as pjrt:
        call("pjrt")
    assert type(pjrt.value) is type(cpu.value)
    assert str(pjrt.value) == str(cpu.value)


@pytest.mark.parametrize("how", ["slice assignment", "as_strided copy_", "as_strided_scatter of a view"])
def test_a_strided_write_of_values_read_from_the_same_buffer_in_one_region(how, monkeypatch):
    """`b[o:o + 8:2] = b[o:o + 4] * 2`, the read view of b in the same fused region: XLA:CPU computed
    the block write (a dynamic_update_slice of b seen as a grid) with elements it had already
    written (4 * b[o + 1] where 2 * b[o + 2] belongs) once the region was compiled, i.e. from the
    second offset on. Silent; storage.py writes such a box as a one-window scatter."""
    import torch_pjrt
    from torch_pjrt.runtime import executable_store

    monkeypatch.setitem(executable_store._state, "folder", None)  # compiled here, on shapes of its own
    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode("fused")

    def step(device, offset):
        b = torch.arange(22.0).to(device)
        if how == "slice assignment":
            b[offset:offset + 8:2] = b[offset:offset + 4] * 2
            return b[offset:offset + 8]
        if how == "as_strided copy_":
            b.as_strided((4,), (2,), offset).copy_(b[offset:offset + 4] * 2)
            return b[offset:offset + 8]
        view = b[offset:offset + 8]
        return torch.as_strided_scatter(view, view[:4] * 2, (4,), (2,))

    try:
        for offset in (1, 3, 5, 7, 9):  # first sight runs call by call; then the compiled region
            torch.testing.assert_close(step("pjrt", offset).cpu(), step("cpu", offset), rtol=0, atol=0)
    finally:
        torch_pjrt.set_eager_mode(before)


def test_fuzz_block_writes_whose_source_overlaps_them(monkeypatch):
    """Writes into a block of a buffer seen as a (12, C) grid, `b.view(12, C)[r:r + h, c:c + w] = f(b[s:])`,
    the source starting at (or one past) the block's first element, then a view of b read in the same
    region, three offsets per geometry (the first sight runs call by call, the others the compiled
    region), against CPU. With storage.py's former grid dynamic_update_slice 2 of these 72 cases
    differed (XLA:CPU, jax 0.10.2)."""
    import torch_pjrt
    from torch_pjrt.runtime import executable_store

    monkeypatch.setitem(executable_store._state, "folder", None)
    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode("fused")
    rng = random.Random(0)
    try:
        for columns, h, w in itertools.product((2, 3, 4), (1, 2, 3, 4), (1, 2, 3)):
            if w >= columns:
                continue
            for _ in range(3):
                r, c = rng.randint(0, 12 - h), rng.randint(0, columns - w)
                s = min(r * columns + c + rng.randint(0, 1), 12 * columns - h * w)
                results = []
                for device in ("pjrt", "cpu"):
                    b = torch.arange(float(12 * columns)).to(device)
                    b.view(12, columns)[r:r + h, c:c + w] = b[s:s + h * w].view(h, w) * 2 + 1
                    results.append(b[r * columns:].cpu())
                torch.testing.assert_close(*results, rtol=0, atol=0, msg=f"grid (12, {columns}), block {h}x{w} at ({r}, {c}), source at {s}")
    finally:
        torch_pjrt.set_eager_mode(before)
