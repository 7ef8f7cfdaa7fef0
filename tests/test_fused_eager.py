"""Fused eager (runtime/fused.py): calls recorded into regions, run as one executable at a sync.

Every result is compared with torch on the CPU, or bit for bit with op-by-op mode where the
two must agree (randomness, deterministic mode). tests/test_other_eager_mode.py runs the
eager test files in the mode the run is not in.
"""
from __future__ import annotations

import collections
import subprocess
import sys
import threading

import jax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt.runtime import fused

TOL = dict(rtol=1.3e-6, atol=1e-5)  # OpInfo's float32 tolerance


@pytest.fixture
def mode():
    """Run a test body in a given eager mode, restoring the mode after."""
    before = torch_pjrt.eager_mode()
    yield torch_pjrt.set_eager_mode
    torch_pjrt.set_eager_mode(before)


@pytest.fixture(autouse=True)
def _no_executable_store(monkeypatch):
    """These tests follow a region from its first sight (op by op) to compiled and cached: a region an
    earlier process or test kept on disk would start "stored" (tests/test_executable_store.py tests that)."""
    from torch_pjrt.runtime import executable_store

    monkeypatch.setitem(executable_store._state, "folder", None)
    executable_store._memo.clear()


def _fused_stats() -> dict:
    return torch_pjrt.eager_stats()["fused"]


def test_calls_are_recorded_and_run_as_one_region(mode):
    mode("fused")
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    xd, wd = x.to("pjrt"), w.to("pjrt")
    torch_pjrt.reset_eager_stats()
    y = ((xd * 2 + 1).relu() @ wd).softmax(-1).sum(0)
    assert _fused_stats()["pending_ops"] >= 5  # nothing ran yet
    torch.testing.assert_close(y.cpu(), ((x * 2 + 1).relu() @ w).softmax(-1).sum(0), **TOL)
    stats = _fused_stats()
    assert stats["pending_ops"] == 0 and stats["regions"] == 1 and stats["ended_by"] == {"host read": 1}
    region = stats["recent_regions"][-1]
    assert region["ops"] >= 5 and region["materialized"] == 1  # only the result: intermediates died inside


def test_static_arguments_that_compare_equal_stay_apart(mode):
    """6 == 6.0 and True == 1 in Python (same hash too): a call's cache key must still tell them
    apart, or arange(6.0) would get arange(6)'s int64 result (a wrong value seen in the suite)."""
    mode("fused")
    for end in (6, 6.0, True):
        got = torch.arange(end, device="pjrt") * 1
        want = torch.arange(end) * 1
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want), end
    x = torch.arange(6.0).to("pjrt")
    torch.testing.assert_close((x.view(2, 3).sum(1, keepdim=True) + x[:2].view(2, 1) * 1.0).cpu(),
                               torch.arange(6.0).view(2, 3).sum(1, keepdim=True) + torch.arange(2.0).view(2, 1))


def test_dead_intermediates_are_never_materialized(mode):
    mode("fused")
    x = torch.randn(5, 5).to("pjrt")
    torch_pjrt.reset_eager_stats()
    a = x + 1
    b = a * 3  # a stays alive: it is materialized too
    c = b.exp()
    del b
    torch.pjrt.synchronize()
    region = _fused_stats()["recent_regions"][-1]
    assert (region["ops"], region["outputs"], region["materialized"]) == (3, 3, 2)
    torch.testing.assert_close(c.cpu(), ((x.cpu() + 1) * 3).exp(), **TOL)
    torch.testing.assert_close(a.cpu(), x.cpu() + 1, **TOL)


def test_donation_takes_only_buffers_no_tensor_holds(mode):
    mode("fused")
    x_cpu = torch.randn(8, 8)
    for _ in range(3):  # first sight, compiled, cached: each must leave x and the updated p intact
        x = x_cpu.to("pjrt")
        p = torch.zeros(8, 8).to("pjrt")
        y = x * 2 + 1  # same shape as x: x's buffer could take y, but x still holds it
        p.add_(y)  # p's old buffer is the region's alone: donated
        torch.testing.assert_close(p.cpu(), x_cpu * 2 + 1, **TOL)
        torch.testing.assert_close(x.cpu(), x_cpu)
        torch.testing.assert_close(y.cpu(), x_cpu * 2 + 1, **TOL)


def test_views_and_inplace_writes_on_pending_storages(mode):
    mode("fused")
    base = torch.arange(24.0).reshape(4, 6)
    dev = base.to("pjrt")
    for t in (base, dev):
        a = (t * 1.5).clone()
        v = a[1:, ::2]
        v.mul_(2)  # through a strided view of a pending storage
        a.t()[0].add_(1)
        col = a[:, 3]
        col.copy_(torch.ones(4, device=t.device) * 7)
        t.tmp = (a, v.sum(), a.view(-1)[5:9].clone(), a.unsqueeze(0).expand(2, 4, 6).sum(0))
    for got, want in zip(dev.tmp, base.tmp):
        torch.testing.assert_close(got.cpu(), want, **TOL)


def _train(device, steps, *, stats_from_step=None):
    """A small classifier's AdamW steps with clipping; the losses and the parameters on the CPU.
    `stats_from_step`: eager_stats count from that step on (pjrt)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 3)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        if step == stats_from_step:
            torch_pjrt.reset_eager_stats()
        x, y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach().cpu())  # read each step (the forward's region has run at backward)
    return torch.stack(losses), [p.detach().cpu() for p in model.parameters()]


def _assert_trained_alike(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for p, q in zip(got[1], want[1]):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_autograd_and_a_training_loop_run_cached_regions(mode):
    mode("fused")
    _assert_trained_alike(_train("pjrt", 8, stats_from_step=0), _train("cpu", 8))
    stats = _fused_stats()
    assert stats["ended_by"].get("optimizer step", 0) == 8
    steps = [r["executable"] for r in stats["recent_regions"] if r["ended_by"] == "optimizer step"]
    # step 1 has host reads (AdamW's state), then a new structure runs op by op once and compiles
    # when it comes back (twice at most: which inputs are donated settles in the first steps)
    assert steps[-3:] == ["cached"] * 3 and steps.count("compiled") <= 2, steps


def test_a_training_step_is_two_regions_the_forward_and_what_follows_backward(mode):
    """autograd runs backward on a thread of its own while the caller waits: the caller lends it
    its region, so a step runs its forward when backward begins, then backward, clipping and the
    optimizer step as one region; no region is cut by a read from another thread."""
    mode("fused")
    _assert_trained_alike(_train("pjrt", 6, stats_from_step=5), _train("cpu", 6))
    ended = [r["ended_by"] for r in _fused_stats()["recent_regions"]]
    assert ended == ["backward", "optimizer step"], ended


def test_nested_and_concurrent_backwards_record_per_thread(mode):
    """A backward inside a backward (reentrant checkpointing), double backward and two threads'
    backwards at once: lending stops where more than one thread waits, and every gradient equals
    CPU torch's."""
    mode("fused")
    from torch.utils.checkpoint import checkpoint

    def grads(device):
        torch.manual_seed(0)
        layer = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)).to(device)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2)).to(device).requires_grad_()
        out = checkpoint(layer, x, use_reentrant=True).pow(2).sum()
        out.backward()
        (gx,) = torch.autograd.grad(layer(x).sin().sum(), x, create_graph=True)
        gx.pow(2).sum().backward()
        results = {}

        def worker(k):
            w = torch.randn(8, 8, generator=torch.Generator().manual_seed(10 + k)).to(device).requires_grad_()
            for _ in range(3):
                (x.detach() @ w).relu().sum().backward()
            results[k] = w.grad.cpu()

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [x.grad.cpu()] + [p.grad.cpu() for p in layer.parameters()] + [results[0], results[1]]

    for got, want in zip(grads("pjrt"), grads("cpu")):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_random_ops_give_op_by_op_numbers(mode):
    def sample():
        torch.manual_seed(7)
        x = torch.randn(6, 6, device="pjrt")
        y = F.dropout(x, 0.5, training=True) + torch.rand(6, 6, device="pjrt")
        return torch.cat([y, torch.randn_like(y).normal_(2.0, 3.0)]).cpu()

    mode("op")
    want = sample()
    mode("fused")
    assert torch.equal(sample(), want)


def test_same_program_is_bitwise_reproducible_once_fused(mode):
    mode("fused")
    x = torch.randn(32, 32).to("pjrt")

    def program():
        y = x
        for _ in range(4):
            y = torch.tanh(y @ x * 0.1 + y).softmax(-1) * 3
        return y.sum(-1).cpu()

    first = program()  # a structure seen for the first time runs op by op
    second, third = program(), program()  # then fused: compiled, then cached
    assert [r["executable"] for r in _fused_stats()["recent_regions"][-3:]] == ["first sight", "compiled", "cached"]
    assert torch.equal(second, third)
    torch.testing.assert_close(first, second, **TOL)


def test_a_region_holds_one_threads_calls(mode):
    """Where a thread's region ends depends on its own program, never on another thread's timing
    (fusion rounds by region, and DDP's replicas must compute the same bits): a thread's calls
    do not join this thread's region, and reading this thread's pending value runs it first."""
    mode("fused")
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(0))
    xd = x.to("pjrt")
    torch_pjrt.reset_eager_stats()
    mine = (xd * 2 + 1).tanh()
    recorded_here = _fused_stats()["pending_ops"]
    seen = {}

    def other_thread():
        y = xd
        for _ in range(3):
            y = (y @ xd * 0.01 + 1).relu()
        seen["pending"] = _fused_stats()["pending_ops"]
        seen["y"] = y.cpu()  # runs that thread's region only
        seen["mine"] = (mine * 3).cpu()  # needs this thread's pending value

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    want = x
    for _ in range(3):
        want = (want @ x * 0.01 + 1).relu()
    torch.testing.assert_close(seen["y"], want, **TOL)
    torch.testing.assert_close(seen["mine"], (x * 2 + 1).tanh() * 3, **TOL)
    regions = _fused_stats()["recent_regions"]
    assert [(r["ops"], r["ended_by"]) for r in regions[:2]] == [(seen["pending"] - recorded_here, "host read"),
                                                                (recorded_here, "another thread")]
    assert _fused_stats()["pending_ops"] == 0


def test_a_call_waiting_for_the_regions_lock_keeps_its_operands(mode):
    """Threads share an op's C++ kernel, and a call waits for fused._lock without the GIL: the
    call another thread makes meanwhile (the same op, other operands) must not become its call.
    (Per-kernel scratch state did: a PowerSGD callback recorded another thread's operands, or
    read a freed one: "Pending.value is unset".)"""
    mode("fused")
    a, b = torch.full((8,), 1.0, device="pjrt"), torch.full((8,), 5.0, device="pjrt")
    (a * 3).cpu(), (b * 3).cpu()  # both signatures known: neither call leaves C++ to trace
    got = {}
    with fused._lock:  # the other thread's call waits for it, inside the kernel
        thread = threading.Thread(target=lambda: got.setdefault("a", (a * 3).cpu()))
        thread.start()
        thread.join(timeout=0.5)  # (it is still waiting: the lock is held here)
        mine = b * 3  # the same kernel, on this thread, while that call waits
    thread.join()
    assert torch.equal(got["a"], torch.full((8,), 3.0))
    assert torch.equal(mine.cpu(), torch.full((8,), 15.0))


def test_deterministic_mode_runs_op_by_op(mode):
    mode("fused")
    x = torch.randn(16, 16).to("pjrt")
    torch.use_deterministic_algorithms(True)
    try:
        y = (x * 1.5 + 0.25).exp().sum(0)
        assert _fused_stats()["pending_ops"] == 0
        got = y.cpu()
    finally:
        torch.use_deterministic_algorithms(False)
    mode("op")
    assert torch.equal(got, (x * 1.5 + 0.25).exp().sum(0).cpu())


def test_fusion_rounding_stays_within_opinfo_tolerance(mode):
    """XLA contracts a*b+c into one FMA and fuses reductions with their producers, so fused
    results may differ from op by op in the last bits (docs/eager.md); never by more."""
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(64, 128, generator=g).to("pjrt") for _ in range(3))

    def program():
        y = a * b + c
        return torch.stack([y.softmax(-1), (y.exp() * b).cumsum(-1) / 128, F.layer_norm(y, (128,)) * a]).cpu()

    mode("op")
    op = program()
    mode("fused")
    torch.testing.assert_close(program(), op, **TOL)


def test_an_error_is_raised_at_the_call_and_the_region_goes_on(mode):
    mode("fused")
    x = torch.randn(3, 4)
    xd = x.to("pjrt")
    y = xd * 2  # pending
    with pytest.raises(RuntimeError) as err:
        torch.mm(y, torch.randn(3, 4, device="pjrt"))
    with pytest.raises(RuntimeError) as cpu_err:
        torch.mm(x * 2, torch.randn(3, 4))
    assert str(err.value) == str(cpu_err.value)
    torch.testing.assert_close((y + 1).cpu(), x * 2 + 1, **TOL)


def test_out_of_range_index_raises_at_the_sync_naming_the_op(mode):
    mode("fused")
    x = torch.randn(4, 3).to("pjrt") * 2
    index = torch.tensor([0, 9]).to("pjrt")
    y = x.index_select(0, index) + 1
    with pytest.raises(IndexError, match="index_select"):
        y.cpu()
    torch.testing.assert_close((x * 0).cpu(), torch.zeros(4, 3))  # the next region runs


def test_data_dependent_ops_sync_and_stay_correct(mode):
    mode("fused")
    x = torch.tensor([[0.0, 1.5, -2.0], [3.0, 0.0, 4.0]])
    xd = x.to("pjrt")
    y = xd * 2 - 3
    torch.testing.assert_close(y.nonzero().cpu(), (x * 2 - 3).nonzero())
    torch.testing.assert_close(torch.masked_select(y, y > 0).cpu(), torch.masked_select(x * 2 - 3, x * 2 - 3 > 0))


def test_a_region_ends_at_its_op_bound(mode, monkeypatch):
    mode("fused")
    monkeypatch.setattr(fused, "MAX_CALLS", 8)
    x = torch.randn(4).to("pjrt")
    torch_pjrt.reset_eager_stats()
    y = x
    for _ in range(20):
        y = y * 1.01 + 0.01
    want = x.cpu()
    for _ in range(20):
        want = want * 1.01 + 0.01
    torch.testing.assert_close(y.cpu(), want, **TOL)
    assert _fused_stats()["ended_by"].get("max ops") == 5  # 40 ops, 8 per region


def _hypot_region(n: int) -> None:
    """A region of a call sequence no other test records (its variants start at 0 here)."""
    x = torch.arange(float(n))
    got = torch.hypot(x.to("pjrt") + 1, x.to("pjrt")).mul(2).sum().item()
    assert got == pytest.approx(torch.hypot(x + 1, x).mul(2).sum().item(), rel=1e-6)


def test_a_region_compiles_when_it_comes_back(mode):
    mode("fused")
    torch_pjrt.reset_eager_stats()
    for _ in range(4):
        _hypot_region(11)
    how = [r["executable"] for r in _fused_stats()["recent_regions"]]
    assert how == ["first sight", "compiled", "cached", "cached"]


def _steps(x, w, n):
    out = []
    for _ in range(n):
        x = torch.tanh(x @ w) * 0.5 + x
        out.append(x.sum().item())
    return out


def test_cached_regions_run_from_cpp(mode, monkeypatch):
    """A region whose executable is cached runs from C++ (recorder.cpp's run_cached_region: its
    key from the digest folded as calls were recorded): fused._run, the Python path, is not
    entered, and the numbers and the bookkeeping are those of the Python path."""
    mode("fused")
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 4, generator=gen), torch.randn(4, 4, generator=gen)
    want = _steps(x, w, 5)
    for _ in range(2):  # a call's first step donates nothing (the caller holds x): two regions, each compiled
        _steps(x.to("pjrt"), w.to("pjrt"), 3)

    def python_run(region, reason):
        raise AssertionError("a cached region entered fused._run")

    monkeypatch.setattr(fused, "_run", python_run)
    torch_pjrt.reset_eager_stats()
    got = _steps(x.to("pjrt"), w.to("pjrt"), 5)
    assert got == pytest.approx(want, rel=1e-5)
    stats = _fused_stats()
    assert stats["region_cache_hits"] == stats["regions"] >= 5
    assert [r["executable"] for r in stats["recent_regions"]][-5:] == ["cached"] * 5


@pytest.mark.parametrize("donated", ["none", "intact", "consumed"])
def test_a_cached_executable_that_fails(mode, monkeypatch, donated):
    """A cached region's executable that raises: while its inputs are intact (none donated, or the
    run failed before consuming them) its calls run again one by one (the results stand); once the
    run consumed donated inputs (gone) its error is raised."""
    mode("fused")
    x = torch.ones(8, device="pjrt")
    for _ in range(3):  # compiled at the second sight, cached at the third
        y = (x * 2 + 1) if donated == "none" else x.mul_(2).add_(1)
        y.sum().item()
    expected = (x.cpu() * 2 + 1).sum().item()

    def failing(*inputs):
        if donated == "consumed":
            for a in inputs:
                if isinstance(a, jax.Array) and a.shape == (8,):  # x's buffer, donated to the in-place ops
                    a.delete()
        raise RuntimeError("the executable failed")

    for key in list(fused._executables):
        monkeypatch.setitem(fused._executables, key, failing)
    if donated == "consumed":
        with pytest.raises(RuntimeError, match="the executable failed"):
            x.mul_(2).add_(1).sum().item()
    elif donated == "intact":
        assert x.mul_(2).add_(1).sum().item() == expected
    else:
        assert (x * 2 + 1).sum().item() == expected


def test_a_steady_region_of_one_call_runs_from_cpp(mode):
    """A region of one call (an argmax and its read, a decode loop's tail) shares its call's own
    executable, compiles nothing, and once seen runs from the C++ runner, as cached regions do."""
    mode("fused")
    a = torch.randn(2, 8, 16, device="pjrt")
    expected = a.cpu()[:, -1].argmax(-1).tolist()
    values = [a[:, -1].argmax(-1).tolist() for _ in range(2)]
    torch_pjrt.reset_eager_stats()
    values += [a[:, -1].argmax(-1).tolist() for _ in range(3)]
    stats = _fused_stats()
    assert values == [expected] * 5
    assert stats["regions"] == 3 and stats["regions_run_in_python"] == 0 and stats["region_compiles"] == 0, stats
    assert [r["executable"] for r in stats["recent_regions"]] == ["one op"] * 3


def test_shapes_that_change_every_region_never_compile(mode):
    mode("fused")
    torch_pjrt.reset_eager_stats()
    for n in range(20, 30):
        _hypot_region(n)
    stats = _fused_stats()
    assert stats["region_compiles"] == 0 and stats["regions_first_sight"] == 10, stats


def test_a_region_that_keeps_recompiling_runs_op_by_op(mode, monkeypatch):
    mode("fused")
    monkeypatch.setattr(fused, "MAX_VARIANTS", 2)
    monkeypatch.setattr(fused, "_variants", collections.Counter())  # other tests compiled this sequence too
    torch_pjrt.reset_eager_stats()
    for n in range(40, 45):  # each structure twice: the second compiles, until the limit
        _hypot_region(n)
        _hypot_region(n)
    stats = _fused_stats()
    assert stats["region_compiles"] == 2 and stats["regions_op_by_op"] == 3, stats


def test_synchronize_runs_what_is_recorded(mode):
    mode("fused")
    x = torch.randn(3).to("pjrt") + 1
    assert _fused_stats()["pending_ops"] > 0
    torch.pjrt.synchronize()
    assert _fused_stats()["pending_ops"] == 0
    torch.pjrt.current_stream().synchronize()


def test_compiled_graph_reads_pending_inputs(mode):
    mode("fused")
    f = torch.compile(lambda a: (a.sin() * 2).sum(-1), backend="pjrt")
    x = torch.randn(4, 5)
    xd = x.to("pjrt") * 3  # pending when the graph is called
    torch.testing.assert_close(f(xd).cpu(), ((x * 3).sin() * 2).sum(-1), **TOL)


@pytest.mark.parametrize("value", ["op", "fused"])
def test_environment_chooses_the_mode(value):
    code = "import torch, torch_pjrt; print(torch_pjrt.eager_mode(), (torch.ones(2, device='pjrt') * 2).sum().item())"
    env = {**__import__("os").environ, "TORCH_PJRT_EAGER": value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [value, "4.0"]


def test_unknown_mode_is_refused(mode):
    with pytest.raises(ValueError, match="'fused' or 'op'"):
        mode("lazy")


def test_an_optimizer_step_updates_parameters_and_states_in_place(mode, monkeypatch):
    """A region whose calls replace storages' buffers (AdamW's parameters, exp_avg, exp_avg_sq)
    donates each replaced array to the value that replaced it (Pending.replaces, region_plan), so
    XLA writes it in place: the step's executable copies at most the gradients (which XLA may read
    again in fusions that recompute their clipped values), not every updated tensor (it copied
    92 inputs for 28 parameters when donations were paired by shape alone). Parameters equal CPU's."""
    mode("fused")
    from torch_pjrt.tools import demo_models as dm

    regions = []
    run = fused._run

    def recording(region, reason):  # holds no input (that would change what the region may donate)
        import jax

        live, donate = fused._load_runtime().region_plan(region.outputs, region.inputs, region.input_index)
        specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.aval.weak_type) for x in region.inputs]
        regions.append(([call[0].name for call in region.calls], specs,
                        fused._executables.get((region.device, bytes(region.digest), live, donate))))
        return run(region, reason)

    results = {}
    for device in ("cpu", "pjrt"):
        data, model, opt = dm.gpt_setup(device, n_layer=1, n_embd=32, n_head=2, block_size=8)
        steps = dm.training_steps(data, model, opt, device, batch_size=2)
        for step in range(4):
            if device == "pjrt" and step == 3:
                monkeypatch.setattr(fused, "_run", recording)
                # cached regions run from C++ (recorder.cpp's run_cached_region): through _run here
                monkeypatch.setattr(fused._load_runtime(), "run_cached_region", lambda region, reason: False)
            float(next(steps))
        monkeypatch.setattr(fused, "_run", run)
        results[device] = [p.detach().cpu() for p in model.parameters()]
    for got, want in zip(results["pjrt"], results["cpu"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    optimizer = [r for r in regions if any("addcdiv" in name for name in r[0])]
    assert optimizer and optimizer[-1][2] is not None, "the optimizer's region ran from a cached executable"
    _, specs, executable = optimizer[-1]
    # a jitted function, or an executable already compiled (read from runtime/executable_store.py)
    text = (executable if hasattr(executable, "as_text") else executable.lower(*specs).compile()).as_text()
    copies = sum(1 for line in text[text.index("ENTRY"):].splitlines() if " copy(" in line)
    n_params = len(results["pjrt"])
    assert copies <= n_params, f"{copies} copies in the optimizer step's executable for {n_params} parameters"


@pytest.mark.parametrize("fraction", [0.0, 0.25])
def test_first_sights_of_new_shapes_compile_their_region_where_asked(monkeypatch, tmp_path, fraction, mode):
    """TORCH_PJRT_FUSED_COLD_FRACTION (fused.COLD_FRACTION): a region seen for the first time whose
    calls have no executables yet compiles at once instead of running op by op (0, the default:
    op by op); the values are the same either way, and a second pass over the shapes runs cached."""
    import torch_pjrt
    from torch_pjrt.runtime import executable_store, fused

    mode("fused")
    monkeypatch.setattr(fused, "COLD_FRACTION", fraction)
    monkeypatch.setitem(executable_store._state, "folder", tmp_path)  # a store no call has an executable in

    def step(x):
        return ((x * 3 + 1).tanh() @ x.T).softmax(-1).sum(0)

    first = 5 if fraction == 0 else 9  # shapes no other test (and not the other case) uses: every call new
    shapes = [(first, 3), (first + 1, 3), (first + 2, 3)]
    torch_pjrt.reset_eager_stats()
    for shape in shapes * 2:
        x = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) / 17
        torch.testing.assert_close(step(x.to("pjrt")).cpu(), step(x))
    stats = torch_pjrt.eager_stats()["fused"]
    if fraction:
        assert stats["region_compiles_at_first_sight"] == stats["region_compiles"] == len(shapes)
        assert stats["region_cache_hits"] >= len(shapes)
    else:  # op by op at the first sight, compiled at the second
        assert stats["region_compiles_at_first_sight"] == 0 and stats["region_compiles"] == len(shapes)


def test_first_sights_of_a_loop_of_another_length_run_op_by_op_where_asked(monkeypatch, tmp_path, mode):
    """With TORCH_PJRT_FUSED_COLD_FRACTION set, a loop whose length changes between syncs (an RNN
    over each sequence length) still runs its first sights op by op: its calls repeat a few
    signatures, whose executables serve every length, where a region would compile per length."""
    import torch_pjrt
    from torch_pjrt.runtime import executable_store, fused

    mode("fused")
    monkeypatch.setattr(fused, "COLD_FRACTION", 0.25)
    monkeypatch.setitem(executable_store._state, "folder", tmp_path)
    x, w = torch.full((2, 13), 0.01), torch.eye(13) * 0.9  # (2, 13): a shape no other test uses

    def loop(x, w, n):
        h = x
        for _ in range(n):
            h = (h @ w).tanh()
        return h.sum()

    torch_pjrt.reset_eager_stats()
    for n in (10, 11, 12):
        torch.testing.assert_close(loop(x.to("pjrt"), w.to("pjrt"), n).cpu(), loop(x, w, n))
    stats = torch_pjrt.eager_stats()["fused"]
    assert stats["regions_first_sight"] >= 3 and stats["region_compiles_at_first_sight"] == 0


def test_signatures_compiled_at_first_sights_count_as_built_when_they_keep_coming_back(monkeypatch, tmp_path, mode):
    """A region compiled at its first sight builds no executables of its own calls. A structure
    that repeats them with one new call (a sweep of an op's out= dtypes) compiles whole again while
    they came in fewer than fused.RECURRING such regions; from then on it runs op by op, building
    them once for every later structure, instead of compiling the repeated calls in each."""
    import torch_pjrt
    from torch_pjrt.runtime import executable_store, fused

    mode("fused")
    monkeypatch.setattr(fused, "COLD_FRACTION", 0.25)
    monkeypatch.setattr(fused, "RECURRING", 2)
    monkeypatch.setitem(executable_store._state, "folder", tmp_path)
    x = torch.arange(34, dtype=torch.float32).reshape(2, 17) / 40  # (2, 17): a shape no other test uses

    torch_pjrt.reset_eager_stats()
    compiled = []
    for last in (lambda t: t, torch.exp, torch.cos):  # the same four calls, then one new call each time
        torch.testing.assert_close(last((x.to("pjrt") * 3 + 1).tanh().mean()).cpu(), last((x * 3 + 1).tanh().mean()))
        compiled.append(torch_pjrt.eager_stats()["fused"]["region_compiles_at_first_sight"])
    assert compiled == [1, 2, 2]
    assert torch_pjrt.eager_stats()["fused"]["regions_first_sight"] == 3
