"""What indexing costs the host (issue 32, PyTorch's test_embedding_bag_1D_padding_idx).

A 0-d integer tensor as an index (`x[start + i]`) is turned into a Python int by torch's own
indexing code (`tensor.item<int64_t>()` in ATen's TensorIndexing.h, on every device): one host
read per index, never an executable of its own once warm. A boolean mask's output length is its
count: the count is read once, the coordinates and the gather are one executable per mask shape,
and only a slice is built per new count (jnp.nonzero on a concrete mask built six executables
per count). Counts are of executables built (JAX's build event), never of time."""
from __future__ import annotations

import jax
import torch
import torch.nn.functional as F

from tests.budget import measured_warm

_built = [0]


def _on_build(name: str, seconds: float, **_) -> None:
    from torch_pjrt.runtime.executable_budget import BUILD_EVENT

    if name == BUILD_EVENT:
        _built[0] += 1


jax.monitoring.register_event_duration_secs_listener(_on_build)


def _builds(fn) -> int:
    torch.pjrt.synchronize()
    before = _built[0]
    fn()
    torch.pjrt.synchronize()
    return _built[0] - before


def _bags_to_rows(device, indices, offsets, width, fill):
    """The test's gen_2D_indices_from_1D: element by element, with 0-d tensor starts and ends."""
    indices, offsets = indices.to(device), offsets.to(device)
    rows = torch.empty(len(offsets), width, device=device, dtype=torch.long)
    for bag in range(len(offsets)):
        start = offsets[bag]
        end = len(indices) if bag + 1 == len(offsets) else offsets[bag + 1]
        row = [indices[start + i] if (start + i) < end else fill for i in range(width)]
        rows[bag] = torch.tensor(row, device=device)
    return rows


_INDICES = torch.tensor([3, 0, 7, 7, 19, 5, 3, 11, 0, 13, 5, 2])
_OFFSETS = torch.tensor([0, 3, 3, 7, 10])


def test_zero_dim_tensor_index_is_one_host_read_and_no_executable():
    import torch_pjrt

    def run(fill):
        return _bags_to_rows("pjrt", _INDICES, _OFFSETS, 4, fill)

    def measure():
        torch_pjrt.reset_eager_stats()
        results = {}
        built = _builds(lambda: results.update((fill, run(fill).cpu()) for fill in (20, 21, 22)))
        return built, torch_pjrt.eager_stats()["paths"], results

    # twice: fused eager compiles a region the second time it sees it
    built, paths, results = measured_warm(lambda: [run(19).cpu() for _ in range(2)], measure)
    for fill, got in results.items():
        torch.testing.assert_close(got, _bags_to_rows("cpu", _INDICES, _OFFSETS, 4, fill))
    assert built == 0
    # per element: the comparison's bool, the 0-d index (torch calls item()), and torch.tensor's
    # read of each indexed element: each a _local_scalar_dense, no other host read
    elements = 3 * len(_OFFSETS) * 4
    taken = 3 * sum(min(4, int(e) - int(s)) for s, e in zip(_OFFSETS, [*_OFFSETS[1:], len(_INDICES)]))
    reads = sum(paths.get("aten::_local_scalar_dense", {}).values())
    assert reads == elements + 2 * taken, paths.get("aten::_local_scalar_dense")


def test_mask_index_builds_one_slice_per_new_count():
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    keys = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    xp, kp = x.to("pjrt"), keys.to("pjrt")

    def select(counts):
        for n in counts:
            torch.testing.assert_close(xp[kp < n].cpu(), x[keys < n])
            torch.testing.assert_close(xp[:, torch.arange(3, device="pjrt") < n % 4].cpu(),
                                       x[:, torch.arange(3) < n % 4])

    new = measured_warm(lambda: select([3, 4]), lambda: _builds(lambda: select(range(10, 20))))
    assert new <= 10 + 4, new  # a slice per new count of each mask (the second mask's counts are 0-3)
    assert measured_warm(lambda: None, lambda: _builds(lambda: select(range(10, 20)))) == 0


def test_embedding_bag_sparse_backward_over_padding_values():
    """sparse=True's backward drops the padding index's rows with a mask (ATen's
    embedding_sparse_backward): each padding value that occurs as often as one seen before
    builds nothing, and the gradients are CPU's."""
    weight = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))

    def grad(device, padding_idx):
        w = weight.clone().to(device).requires_grad_()
        F.embedding_bag(_INDICES.to(device), w, _OFFSETS.to(device), mode="sum", sparse=True,
                        padding_idx=padding_idx).sum().backward()
        return w.grad

    def compare(values):
        for p in values:
            got, expected = grad("pjrt", p), grad("cpu", p)
            assert got.is_sparse and got._nnz() == expected._nnz()
            torch.testing.assert_close(got.cpu().to_dense(), expected.to_dense())

    # 3, 7, 0 and 5 occur twice; 19, 11, 13 and 2 once: after one of each, the rest build nothing
    built = measured_warm(lambda: [compare([3, 19]) for _ in range(2)], lambda: _builds(lambda: compare([7, 0, 5, 11, 13, 2])))
    assert built == 0, built


def test_nonzero_and_masked_select_build_one_slice_per_new_count():
    x = torch.randn(6, 7, generator=torch.Generator().manual_seed(2))
    keys = torch.randperm(42, generator=torch.Generator().manual_seed(3)).reshape(6, 7)
    xp, kp = x.to("pjrt"), keys.to("pjrt")

    def run(counts):
        for n in counts:
            torch.testing.assert_close(torch.nonzero(kp < n).cpu(), torch.nonzero(keys < n))
            torch.testing.assert_close(torch.masked_select(xp, kp < n).cpu(), torch.masked_select(x, keys < n))

    new = measured_warm(lambda: run([3, 4]), lambda: _builds(lambda: run(range(10, 20))))
    assert new <= 2 * 10, new  # a slice per new count of each op


def test_sparse_coalesce_equals_cpu_and_builds_less_per_new_nnz():
    """Sparse _coalesce sorts the linear positions and keeps each run's first by a masked index
    (one count read); torch.unique there ran jnp.unique primitive by primitive (34 builds per new
    nnz, now 17: the dense ops' executables for the new shape)."""
    import warnings

    g = torch.Generator().manual_seed(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse invariant checks
        samples = [torch.sparse_coo_tensor(torch.randint(0, 6, (2, n), generator=g), torch.randn(n, 3, generator=g),
                                           (6, 6, 3)) for n in (5, 6, *range(20, 30))]
    on_device = [s.to("pjrt") for s in samples]

    def coalesce(items):
        for s, p in items:
            got, expected = p.coalesce(), s.coalesce()
            assert got.is_coalesced() and got._nnz() == expected._nnz()
            torch.testing.assert_close(got._indices().cpu(), expected._indices())
            torch.testing.assert_close(got._values().cpu(), expected._values())

    pairs = list(zip(samples, on_device))
    new = measured_warm(lambda: [coalesce(pairs[:2]) for _ in range(2)], lambda: _builds(lambda: coalesce(pairs[2:])))
    assert new <= 20 * 10, new
