"""Eager without compile storms: a loop over Python-int indices builds a bounded number of
executables (a view's storage offset is traced, not static), with CPU's results."""
from __future__ import annotations

import threading
import traceback

import jax.monitoring
from jax._src import util as jax_util  # clear_all_caches: JAX's own (jax.clear_caches' Python half)
import pytest
import torch

from tests.budget import measured_warm
from tests.ops.harness import in_eager_mode

_built: list = []  # every XLA executable JAX compiles or loads from the persistent cache, eager's or not


def _note_build(name: str) -> None:
    # where it was built, for the failure message: a build here is found by its stack
    frames = traceback.extract_stack()
    if any(f.name == "_load" and f.filename.endswith("executable_store.py") for f in frames):
        # a read of an executable compiled before (ours, by signature): whether one is due depends on
        # what the store held when the process started (a region read whole at its first sight leaves
        # its calls' own executables to be read when a later region first runs op by op), not on the
        # loop's values. A per-value signature is still counted: eager_stats' traces.
        return
    stack = "".join(traceback.format_list(frames[-14:-2]))
    _built.append(f"{name} on thread {threading.current_thread().name}:\n{stack}")


_compiled_functions: list = []  # the function of every XLA compile, as JAX names it (its fun_name), else None


def _on_compile(name: str, secs: float, **kw) -> None:
    if "backend_compile" in name:
        _compiled_functions.append(kw.get("fun_name"))
        _note_build(name)


jax.monitoring.register_event_duration_secs_listener(_on_compile)
jax.monitoring.register_event_listener(
    lambda name, **kw: _note_build(name) if name.endswith("compilation_cache/cache_hits") else None)


def _executables_built(warm, fn) -> int:
    """Executables `fn` builds after `warm`: eager's (torch_pjrt.eager_stats) and any other JAX
    compiles (storage view reads), whether compiled or loaded from the on-disk cache."""
    import torch_pjrt

    def measure() -> int:
        torch.pjrt.synchronize()
        # as in a long process (the whole suite), whose calls evicted JAX's Python-level caches
        # (least recently used, bounded): a call that goes through JAX's Python dispatch (an
        # eager jnp.asarray, say) then builds its executable again, a build alone would not see
        jax_util.clear_all_caches()
        start, eager = len(_built), torch_pjrt.eager_stats()
        fn()
        torch.pjrt.synchronize()
        after = torch_pjrt.eager_stats()
        built = max(len(_built) - start, after["executables"] - eager["executables"])
        if built:  # say which, so that a failure seen once (a whole run) can be understood
            ops = {op: n - eager["by_op"].get(op, 0) for op, n in after["by_op"].items()
                   if n != eager["by_op"].get(op, 0)}
            print(f"built {built}: eager executables by op {ops}; fused {after.get('fused')}; "
                  f"JAX builds:\n" + "\n".join(_built[start:]))
        return built

    return measured_warm(lambda: _warm(warm), measure)


def _warm(fn) -> None:
    """Build every executable `fn` needs, whatever the index values: run it twice, since fused eager
    compiles a region the second time it sees it (the first runs on the ops' own executables).
    The first sight runs op by op even where TORCH_PJRT_FUSED_COLD_FRACTION would compile the short
    warm-up region at once: the measured loop, a longer structure of the same calls, runs op by op
    and needs the ops' executables, which a per-value build would show there."""
    from torch_pjrt.runtime import fused

    fraction, fused.COLD_FRACTION = fused.COLD_FRACTION, 0.0
    try:
        for _ in range(2):
            fn()
            torch.pjrt.synchronize()
    finally:
        fused.COLD_FRACTION = fraction


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

    assert _executables_built(lambda: loop(range(2)), lambda: loop(range(2, 10))) == 0
    assert torch.equal(pout.cpu(), out)


def test_select_index_narrow_index_put_over_100_ints_build_few_executables():
    x = torch.randn(100, 7)
    px = x.to("pjrt")
    acc, pacc = torch.zeros(7), torch.zeros(7, device="pjrt")
    y, py = torch.zeros(100, 7), torch.zeros(100, 7, device="pjrt")

    def loop(indices):
        nonlocal acc, pacc
        for i in indices:
            acc = acc + x[i] * 2 + x.narrow(0, i, 1).sum(0) + x[torch.tensor([i, 99 - i])].sum(0)
            pacc = pacc + px[i] * 2 + px.narrow(0, i, 1).sum(0) + px[torch.tensor([i, 99 - i])].sum(0)
            y[i] = x[i] + i
            py[i] = px[i] + i
            y.index_put_((torch.tensor([i]),), x[i] * 3)
            py.index_put_((torch.tensor([i]),), px[i] * 3)

    built = _executables_built(lambda: loop([0, 1]), lambda: loop(range(2, 100)))
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


# ---------------------------------------------------------------- traced arguments (entries' `traced=`)
# Per op: a call for one value of an argument that fixes no output shape; a loop over many
# values must build no executable after the first ones, and give CPU's results.
_T = torch.randn(6, 7)
_NAN = torch.tensor([float("nan"), float("inf"), -float("inf"), 2.0])
TRACED_LOOPS = {
    "roll": (range(-9, 12), lambda x, v: torch.roll(x, v)),
    "roll_dims": (range(-9, 12), lambda x, v: torch.roll(x, (v, 2 * v), (0, 1))),
    "tril": (range(-8, 9), lambda x, v: torch.tril(x, v)),
    "triu": (range(-8, 9), lambda x, v: torch.triu(x, v)),
    "kthvalue": (range(1, 8), lambda x, v: torch.kthvalue(x, v)),
    "kthvalue_dim0": (range(1, 7), lambda x, v: torch.kthvalue(x, v, 0, keepdim=True)),
    "select_scatter": (range(-6, 6), lambda x, v: torch.select_scatter(x, x[0] * v, 0, v)),
    "slice_scatter": ([-3, 0, -7, -6, -5, -4, 1, 2, 3, 4],  # a slice of 3 at each start (end None at -3)
                      lambda x, v: torch.slice_scatter(x, x[:, :3] + v, 1, v, None if v == -3 else v + 3)),
    "slice_scatter_step": (range(0, 3), lambda x, v: torch.slice_scatter(x, x[:, :3] + v, 1, v, v + 5, 2)),
    "nan_to_num": ([0.0, 1.5, -3.0, 7.25], lambda x, v: torch.nan_to_num(_NAN.to(x.device), v, v + 1, v - 1)),
    "dropout_p0_p1": ([0.0, 1.0], lambda x, v: torch.ops.aten.native_dropout(x, v, True)),
}


def _run_loop(fn, values, device):
    x = _T.to(device)
    return [fn(x, v) for v in values]


def _assert_same(a, b):
    if isinstance(a, (tuple, list)):
        for x, y in zip(a, b):
            _assert_same(x, y)
        return
    assert torch.equal(a.cpu(), b), (a, b)


@pytest.mark.parametrize("name", sorted(TRACED_LOOPS))
def test_a_traced_argument_builds_no_executable_per_value(name):
    import torch_pjrt

    values, fn = TRACED_LOOPS[name]
    values = list(values)
    _run_loop(fn, values[:2], "pjrt")  # warm: the executables of this shape (slice_scatter: end None, end int)
    torch.pjrt.synchronize()
    torch_pjrt.reset_eager_stats()
    got = _run_loop(fn, values, "pjrt")
    built = torch_pjrt.eager_stats()["executables"]
    assert built == 0, f"{name}: {torch_pjrt.eager_stats()['by_op']} for {len(values)} values"
    for a, b in zip(got, _run_loop(fn, values, "cpu")):
        _assert_same(a, b)


def test_traced_random_parameters_build_no_executable_per_value():
    import torch_pjrt

    x = torch.ones(1000, device="pjrt")

    def step(p):
        out, mask = torch.ops.aten.native_dropout(x, p, True)
        kept = mask.cpu().float().mean().item()
        assert abs(kept - (1 - p)) < 0.1 and torch.allclose(out.cpu()[mask.cpu()], torch.tensor(1 / (1 - p)))
        assert abs(x.clone().bernoulli_(p).cpu().mean().item() - p) < 0.1
        bound = 1 / (p * 64) ** 0.5  # as kaiming_uniform_'s bound per fan-in
        u = x.clone().uniform_(-bound, bound).cpu()
        assert -bound <= u.min() and u.max() < bound and u.std() > bound / 3
        n = x.clone().normal_(p, 2 * p).cpu()
        assert abs(n.mean() - p) < 0.3 and abs(n.std() - 2 * p) < 0.3

    for p in (0.5, 0.3):  # warm: each region's first sight (its calls' own executables) and its compile
        step(p)
    torch_pjrt.reset_eager_stats()
    for p in (0.1, 0.25, 0.6, 0.9):
        step(p)
    assert torch_pjrt.eager_stats()["executables"] == 0, torch_pjrt.eager_stats()["by_op"]


def test_view_backward_ops_over_python_ints_build_no_executables():
    import torch_pjrt

    def loop(device, indices):
        x = torch.arange(42.0).reshape(6, 7).to(device).requires_grad_()
        grads = []
        for i in indices:
            j = i % 6  # a slice of length 2 at every start
            (g,) = torch.autograd.grad((x[i] * 2).sum() + (x[:, j:j + 2] * 3).sum(), x)
            grads.append(g)
        return grads

    loop("pjrt", [0])
    torch.pjrt.synchronize()
    torch_pjrt.reset_eager_stats()
    got = loop("pjrt", range(-6, 5))
    by_op = torch_pjrt.eager_stats()["by_op"]
    assert not any("backward" in op for op in by_op), by_op
    for a, b in zip(got, loop("cpu", range(-6, 5))):
        assert torch.equal(a.cpu(), b)


OUT_OF_RANGE = {
    "kthvalue": lambda x: torch.kthvalue(x, 8),
    "kthvalue_zero": lambda x: torch.kthvalue(x, 0),
    "select_scatter": lambda x: torch.select_scatter(x, x[0], 0, 6),
    "select_scatter_negative": lambda x: torch.select_scatter(x, x[0], 0, -7),
    "slice_scatter": lambda x: torch.slice_scatter(x, x[:, :3], 1, 5, 9),
    "select_backward": lambda x: torch.ops.aten.select_backward(x[0], [6, 7], 0, 6),
    "slice_backward": lambda x: torch.ops.aten.slice_backward(x[:, :3], [6, 7], 1, 6, 9, 1),
    "dropout": lambda x: torch.ops.aten.native_dropout(x, 1.5, True),
    "bernoulli": lambda x: x.clone().bernoulli_(-0.5),
    "uniform_reversed": lambda x: x.clone().uniform_(2.0, 1.0),
    "uniform_half_overflow": lambda x: x.half().uniform_(0.0, 1e6),
    "uniform_integer": lambda x: x.long().uniform_(0.0, 1.0),
    "normal_negative_std": lambda x: x.clone().normal_(0.0, -1.0),
}


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
def test_a_traced_argument_out_of_range_raises_as_on_cpu(name):
    fn = OUT_OF_RANGE[name]
    with pytest.raises(Exception) as cpu:
        fn(_T)
    with pytest.raises(type(cpu.value)) as pjrt:
        fn(_T.to("pjrt"))
        torch.pjrt.synchronize()
    assert str(pjrt.value) == str(cpu.value)


def test_fresh_memory_of_sizes_seen_a_few_times_compiles_nothing_of_its_own():
    """torch.empty(shape) then a fill (make_tensor's way, randn's; a test's random shapes): the
    fresh memory's first runs of a size are filled on the host and copied (storage._filled_on_host),
    so a size seen a few times builds the fill's executable only, not one for its memory too; in
    fused and op-by-op mode, with CPU's deterministic fill."""
    from torch.testing._internal.common_utils import DeterministicGuard

    start = len(_compiled_functions)
    sizes = (1009, 1013, 1019, 1021)  # new to this process
    for _ in range(2):
        for n in sizes:
            t = torch.empty(n, device="pjrt").uniform_(2, 3)
            assert 2 <= t.min().item() and t.max().item() < 3
    with in_eager_mode("op"):
        for n in sizes:
            assert torch.equal(torch.empty(n, device="pjrt").add_(1).cpu(), torch.ones(n))
    with DeterministicGuard(True):  # CPU fills fresh memory with NaN in deterministic mode
        assert torch.empty(1031, device="pjrt").isnan().all().item()
    compiled = _compiled_functions[start:]
    if not any(compiled):
        pytest.skip("this JAX names no function in its compile events (fun_name)")
    fresh = compiled.count("jit(fresh_memory)")
    assert fresh == 0, f"fresh memory compiled {fresh} times"


def test_randint_over_new_bounds_builds_no_executable():
    """random_'s from and to are traced (make_tensor's integers draw with low and high a test's
    sizes): a shape's executable serves every bound, with CPU's range checks on the host."""
    drawn = []

    def draw(bounds):
        for low, high in bounds:
            drawn.append((low, high, torch.randint(low, high, (777,), device="pjrt").cpu()))

    assert _executables_built(lambda: draw([(0, 3)]), lambda: draw([(0, h) for h in range(4, 20)] + [(-7, 2)])) == 0
    for low, high, values in drawn:
        assert low <= values.min() and values.max() < high and len(values.unique()) == high - low
