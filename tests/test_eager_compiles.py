"""Eager without compile storms: a loop over Python-int indices builds a bounded number of
executables (a view's storage offset is traced, not static), with CPU's results."""
from __future__ import annotations

import jax.monitoring
import torch

_built: list = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: _built.append(name) if "backend_compile" in name else None)


def _executables_built(fn) -> int:
    torch.pjrt.synchronize()
    start = len(_built)
    fn()
    torch.pjrt.synchronize()
    return len(_built) - start


def test_gather_loop_over_python_ints_builds_a_constant_number_of_executables():
    src, idx = torch.randn(10, 10, 5), torch.randint(0, 5, (10, 10, 3))
    out = torch.empty(10, 10, 3)
    psrc, pidx, pout = src.to("pjrt"), idx.to("pjrt"), torch.empty(10, 10, 3, device="pjrt")

    def loop(rows):
        for i in rows:
            for j in range(10):
                for k in range(3):
                    out[i, j, k] = src[i, j, idx[i, j, k]]
                    pout[i, j, k] = psrc[i, j, pidx[i, j, k]]

    loop(range(2))  # warm: every executable the loop needs, whatever the index values
    assert _executables_built(lambda: loop(range(2, 10))) == 0
    assert torch.equal(pout.cpu(), out)


def test_select_narrow_index_put_over_100_ints_build_few_executables():
    x = torch.randn(100, 7)
    px = x.to("pjrt")
    acc, pacc = torch.zeros(7), torch.zeros(7, device="pjrt")
    y, py = torch.zeros(100, 7), torch.zeros(100, 7, device="pjrt")

    def loop(indices):
        nonlocal acc, pacc
        for i in indices:
            acc = acc + x[i] * 2 + x.narrow(0, i, 1).sum(0)
            pacc = pacc + px[i] * 2 + px.narrow(0, i, 1).sum(0)
            y[i] = x[i] + i
            py[i] = px[i] + i
            y.index_put_((torch.tensor([i]),), x[i] * 3)
            py.index_put_((torch.tensor([i]),), px[i] * 3)

    loop([0, 1])
    built = _executables_built(lambda: loop(range(2, 100)))
    assert built == 0, f"{built} executables for 98 new index values"
    torch.testing.assert_close(pacc.cpu(), acc)
    torch.testing.assert_close(py.cpu(), y)


def test_eager_stats_count_executables_per_op_and_warn_on_many_variants(monkeypatch):
    import warnings

    import torch_pjrt

    monkeypatch.setenv("TORCH_PJRT_RECOMPILE_WARN", "3")
    torch_pjrt.reset_eager_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(11, 16):  # a new length every time: a new executable every time
            x = torch.arange(float(n), device="pjrt")
            torch.testing.assert_close(torch.roll(x, 2).cpu(), torch.roll(torch.arange(float(n)), 2))
    stats = torch_pjrt.eager_stats()
    assert stats["by_op"]["aten.roll.default"] == 5
    assert stats["changing_arguments"]["aten.roll.default"] == {"self": 4}
    assert stats["executables"] >= 5 and stats["compile_seconds"] >= 0
    messages = [str(w.message) for w in caught if "aten.roll.default has compiled" in str(w.message)]
    assert len(messages) == 1 and "'self' changed" in messages[0]
