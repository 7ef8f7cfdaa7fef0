"""The PyTorch toolbox on pjrt tensors, against CPU: torch.utils.checkpoint, parametrizations,
torch.func, DataLoader(pin_memory=True) with non_blocking copies, deterministic algorithms
and the profiler."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrizations, parametrize

import torch_pjrt

TOL = dict(rtol=1e-5, atol=1e-5)


def compare(fn):
    """fn(device) -> tensors, on cpu and pjrt; the results must agree."""
    cpu, pjrt = fn("cpu"), fn("pjrt")
    assert len(cpu) == len(pjrt)
    for a, b in zip(cpu, pjrt):
        assert b.device.type == "pjrt"
        torch.testing.assert_close(b.cpu(), a, **TOL)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# -- activation checkpointing ------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)
        self.dropout = dropout

    def forward(self, x):
        return x + self.fc2(F.dropout(F.gelu(self.fc1(x)), self.dropout, self.training))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_matches_plain_backward(use_reentrant):
    def run(device, checkpointed):
        torch.manual_seed(0)
        blocks = nn.Sequential(Block(0.0), Block(0.0)).to(device)
        x = randn(4, 8).to(device).requires_grad_()
        h = x
        for block in blocks:
            h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=use_reentrant) if checkpointed else block(h)
        h.pow(2).sum().backward()
        return [x.grad] + [p.grad for p in blocks.parameters()]

    plain_cpu = run("cpu", False)
    for device in ("cpu", "pjrt"):
        for a, b in zip(plain_cpu, run(device, True)):
            torch.testing.assert_close(b.cpu(), a, **TOL)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_replays_dropout_with_the_saved_pjrt_rng_state(use_reentrant):
    """Recomputation must draw the same dropout mask: checkpoint saves and restores the
    device's RNG state through torch.pjrt.get_rng_state/set_rng_state."""
    def run(checkpointed):
        torch.manual_seed(0)
        block = Block(0.5).to("pjrt")
        torch.pjrt.manual_seed(123)
        x = randn(16, 8).to("pjrt").requires_grad_()
        out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=use_reentrant) if checkpointed else block(x)
        out.pow(2).sum().backward()
        return out.detach().cpu(), x.grad.cpu(), block.fc1.weight.grad.cpu()

    for a, b in zip(run(False), run(True)):
        if torch_pjrt.eager_mode() == "op":  # the same executables in both runs
            assert torch.equal(a, b)
        else:  # regions end elsewhere when checkpoint reads the RNG state, and fusion rounds differently
            # (docs/eager.md); another dropout mask would change the values by O(1)
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


# -- parametrizations ----------------------------------------------------------------------
PARAMETRIZATIONS = {
    "weight_norm": lambda m: parametrizations.weight_norm(m),
    "spectral_norm": lambda m: parametrizations.spectral_norm(m, n_power_iterations=3),
    "orthogonal-matrix_exp": lambda m: parametrizations.orthogonal(m, orthogonal_map="matrix_exp"),
    "orthogonal-cayley": lambda m: parametrizations.orthogonal(m, orthogonal_map="cayley"),
    "orthogonal-householder": lambda m: parametrizations.orthogonal(m, orthogonal_map="householder"),
}


@pytest.mark.parametrize("name", PARAMETRIZATIONS)
def test_parametrization_forward_backward_step(name):
    def run(device):
        torch.manual_seed(0)
        layer = PARAMETRIZATIONS[name](nn.Linear(6, 6)).to(device)
        if name == "spectral_norm":  # its power iteration's start vectors are drawn at creation: same on both
            torch.manual_seed(1)
            layer.parametrizations.weight[0]._u.copy_(F.normalize(torch.randn(6), dim=0).to(device))
            layer.parametrizations.weight[0]._v.copy_(F.normalize(torch.randn(6), dim=0).to(device))
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        x = randn(3, 6).to(device)
        for _ in range(2):
            loss = layer(x).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        grads = [p.grad for p in layer.parameters()]
        return [layer.weight.detach(), loss.detach(), *grads]

    compare(run)


def test_custom_parametrization_and_remove():
    class Symmetric(nn.Module):
        def forward(self, w):
            return w.triu() + w.triu(1).transpose(0, 1)

    layer = nn.Linear(4, 4).to("pjrt")
    parametrize.register_parametrization(layer, "weight", Symmetric())
    w = layer.weight
    assert w.device.type == "pjrt" and torch.equal(w.cpu(), w.cpu().T)
    parametrize.remove_parametrizations(layer, "weight", leave_parametrized=True)
    assert isinstance(layer.weight, nn.Parameter) and torch.equal(layer.weight.detach().cpu(), w.detach().cpu())


# -- torch.func ----------------------------------------------------------------------------
def test_func_grad_and_value():
    def run(device):
        x = randn(5).to(device)
        g, v = torch.func.grad_and_value(lambda t: (t.sin() * t).sum())(x)
        return g, v

    compare(run)


def test_func_vmap():
    def run(device):
        x, w = randn(7, 3, 4).to(device), randn(4, 2, seed=1).to(device)
        batched = torch.func.vmap(lambda a: F.softmax(a @ w, dim=-1).sum(0))(x)
        nested = torch.func.vmap(torch.func.vmap(torch.dot))(x, x)
        return batched, nested

    compare(run)


def test_func_jacrev_jacfwd_hessian():
    def f(x):
        return torch.stack([x.pow(2).sum(), (x[0] * x[1]).exp(), x.tanh().prod()])

    def run(device):
        x = randn(3).to(device) * 0.5
        return (torch.func.jacrev(f)(x), torch.func.jacfwd(f)(x),
                torch.func.hessian(lambda t: t.pow(3).sum() + t.prod())(x))

    before = dict(torch_pjrt.fallback_ops())
    compare(run)
    assert torch_pjrt.fallback_ops() == before  # every op lowered, jacrev's zero tensors too


def test_func_functional_call_per_sample_gradients():
    def run(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 1)).to(device)
        params = {k: v.detach() for k, v in model.named_parameters()}
        x, y = randn(6, 4).to(device), randn(6, 1, seed=1).to(device)

        def loss(p, xi, yi):
            return F.mse_loss(torch.func.functional_call(model, p, (xi[None],)), yi[None])

        per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
        return [per_sample[k] for k in sorted(per_sample)]

    compare(run)


# -- data loading -------------------------------------------------------------------------
def test_dataloader_pin_memory_and_non_blocking_copies():
    data = torch.utils.data.TensorDataset(randn(20, 3), torch.arange(20))
    loader = torch.utils.data.DataLoader(data, batch_size=8, pin_memory=True)
    seen = []
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        xd, yd = x.to("pjrt", non_blocking=True), y.to("pjrt", non_blocking=True)
        assert xd.device.type == "pjrt"
        seen.append((xd * 2, yd))
    torch.pjrt.synchronize()
    torch.testing.assert_close(torch.cat([s[0] for s in seen]).cpu(), data.tensors[0] * 2)
    assert torch.equal(torch.cat([s[1] for s in seen]).cpu(), data.tensors[1])


def test_dataloader_pin_memory_device_pjrt_and_worker_process():
    data = torch.utils.data.TensorDataset(randn(6, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=3, pin_memory=True, pin_memory_device="pjrt",
                                         num_workers=1)
    batches = [b.to("pjrt", non_blocking=True) for (b,) in loader]
    torch.testing.assert_close(torch.cat(batches).cpu(), data.tensors[0])


def test_pinned_tensor_round_trip():
    x = randn(4, 4).pin_memory()
    assert x.is_pinned()
    back = torch.empty(4, 4).pin_memory()
    back.copy_(x.to("pjrt", non_blocking=True) + 1, non_blocking=True)
    torch.pjrt.synchronize()
    torch.testing.assert_close(back, x + 1)


# -- determinism ---------------------------------------------------------------------------
def test_deterministic_algorithms_reproduce_a_training_run():
    from torch_pjrt.tools import demo_models as dm

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        data = dm.CharData(dm.load_text()[:5000])
        runs = []
        for _ in range(2):
            _, model, opt = dm.gpt_setup("pjrt", data=data, n_layer=1, n_embd=16, n_head=2, block_size=8)
            runs.append(dm.train_gpt(data, model, opt, "pjrt", 3, batch_size=4))
            # index_add_ / scatter_add_ are nondeterministic on CUDA; on pjrt they must still run
            t = torch.zeros(5, device="pjrt").index_add_(0, torch.tensor([0, 0, 3], device="pjrt"),
                                                         torch.ones(3, device="pjrt"))
            assert t.cpu().tolist() == [2.0, 0.0, 0.0, 1.0, 0.0]
        assert runs[0] == runs[1]
    finally:
        torch.use_deterministic_algorithms(previous)


def test_deterministic_mode_fills_uninitialized_memory_like_cpu():
    """With deterministic algorithms on, torch fills torch.empty with NaN (floats) or the
    largest value (integers) on CPU and CUDA (torch.utils.deterministic.fill_uninitialized_memory)."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        cpu_f, cpu_i = torch.empty(3), torch.empty(3, dtype=torch.int64)
        pjrt_f = torch.empty(3, device="pjrt")
        pjrt_i = torch.empty(3, dtype=torch.int64, device="pjrt")
        assert torch.isnan(cpu_f).all() and torch.isnan(pjrt_f.cpu()).all()
        assert torch.equal(pjrt_i.cpu(), cpu_i)
    finally:
        torch.use_deterministic_algorithms(previous)


# -- profiler ------------------------------------------------------------------------------
def test_profiler_records_ranges_and_pjrt_ops():
    x = randn(8, 8).to("pjrt")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch.profiler.record_function("my_train_step"):
            y = (x @ x).relu().sum()
            y.item()
    names = {e.key for e in prof.key_averages()}
    assert "my_train_step" in names
    assert {"aten::mm", "aten::relu", "aten::sum"} <= names
    mm = next(e for e in prof.events() if e.name == "aten::mm")
    assert mm.input_shapes[0] == [8, 8]


def test_profiler_accepts_the_privateuse1_activity():
    activity = getattr(torch.profiler.ProfilerActivity, "PrivateUse1", None)
    if activity is None:
        pytest.skip("this torch has no ProfilerActivity.PrivateUse1")
    x = randn(4, 4).to("pjrt")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, activity]) as prof:
        with torch.profiler.record_function("step"):
            (x + 1).sum().item()
    assert "step" in {e.key for e in prof.key_averages()}


def test_profiler_reports_pjrt_memory():
    x = randn(64, 64).to("pjrt")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        y = x @ x
    mm = next(e for e in prof.key_averages() if e.key == "aten::mm")
    assert mm.self_device_memory_usage == y.nbytes == 64 * 64 * 4
    assert mm.self_cpu_memory_usage == 0


def test_legacy_profiler_reports_device_time_per_op():
    x = randn(64, 64).to("pjrt")
    (x @ x).relu()  # compiled outside the profile
    with torch.autograd.profiler.profile(use_device="pjrt", profile_memory=True) as prof:
        (x @ x).relu()
    events = {e.key: e for e in prof.key_averages()}
    assert events["aten::mm"].self_device_time_total > 0
    assert events["aten::relu"].device_time_total > 0
    assert events["aten::mm"].self_device_memory_usage == 64 * 64 * 4
