"""Training machinery on pjrt against CPU: checkpoint/resume, GradScaler, LR schedulers,
gradient clipping and autograd features (retain_graph, double backward, hooks,
torch.autograd.grad)."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt.tools import demo_models as dm

TOL = dict(rtol=1e-5, atol=1e-5)


# -- checkpoint / resume ---------------------------------------------------------------------
class Trainer:
    """Model + AdamW + OneCycleLR + GradScaler + the batch sampler: everything a resume needs."""

    def __init__(self, device: str, data: dm.CharData):
        self.device, self.data = device, data
        torch.manual_seed(0)
        cfg = dm.GPTConfig(vocab_size=data.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=32, dropout=0.1)
        self.model = dm.GPT(cfg).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.OneCycleLR(self.opt, max_lr=1e-2, total_steps=20)
        self.scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=2)
        self.sampler = torch.Generator().manual_seed(1)

    def step(self) -> torch.Tensor:
        x, y = self.data.batch(self.sampler, 4, 16)
        _, loss = self.model(x.to(self.device), y.to(self.device))
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.opt)
        self.scaler.update()
        self.sched.step()
        return loss.detach()

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                "scaler": self.scaler.state_dict(), "sampler": self.sampler.get_state(),
                "device_rng": torch.get_rng_state() if self.device == "cpu" else torch.pjrt.get_rng_state()}

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        self.scaler.load_state_dict(state["scaler"])
        self.sampler.set_state(state["sampler"].cpu())  # map_location moved it too
        rng = state["device_rng"].cpu()
        torch.set_rng_state(rng) if self.device == "cpu" else torch.pjrt.set_rng_state(rng)


def save(state) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def load(blob: bytes, map_location):
    return torch.load(io.BytesIO(blob), map_location=map_location, weights_only=True)


def clone(state):
    if isinstance(state, dict):
        return {k: clone(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(clone(v) for v in state)
    return state.clone() if isinstance(state, torch.Tensor) else state


def flat(state) -> dict:
    """{path: leaf} of a nested state dict."""
    out = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}/{i}", v)
        else:
            out[prefix] = value

    walk("", state)
    return out


def assert_states_equal(a: dict, b: dict, exact: bool = True):
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys()
    for key, va in fa.items():
        vb = fb[key]
        if isinstance(va, torch.Tensor):
            va, vb = va.cpu(), vb.cpu()
            if exact:
                assert va.dtype == vb.dtype and torch.equal(va, vb), key
            else:
                torch.testing.assert_close(vb, va, **TOL, msg=lambda m: f"{key}: {m}")
        elif isinstance(va, float) and not exact:
            assert va == pytest.approx(vb, rel=1e-5), key
        else:
            assert va == vb, key


@pytest.fixture(scope="module")
def data():
    return dm.CharData(dm.load_text())


@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def test_checkpoint_resume_on_pjrt_is_bit_exact(data, deterministic):
    """Bit for bit in deterministic mode, which runs op by op: fused regions are reproducible
    run to run, but a resumed run ends its regions elsewhere (the load's copies), and XLA's
    fusion rounds differently (docs/eager.md)."""
    trainer = Trainer("pjrt", data)
    for _ in range(3):
        trainer.step()
    blob = save(trainer.state())
    reference = [trainer.step() for _ in range(3)]  # the uninterrupted run

    resumed = Trainer("pjrt", data)
    state = load(blob, "pjrt")
    assert all(v.device.type == "pjrt" for v in flat(state["model"]).values())
    resumed.load(state)
    continued = [resumed.step() for _ in range(3)]
    assert torch.equal(torch.stack(continued).cpu(), torch.stack(reference).cpu())
    assert_states_equal(trainer.state(), resumed.state())


def test_checkpoint_saved_on_pjrt_resumes_on_cpu(data):
    """The loaded state equals the saved one bit for bit; the CPU continuation agrees with
    the pjrt one within float32 error (different kernels; dropout off: the devices' random
    streams differ)."""
    trainer = Trainer("pjrt", data)
    trainer.model.eval()  # no dropout, so both devices compute the same function
    for _ in range(2):
        trainer.step()
    saved = clone(trainer.state())  # a snapshot: state_dict() tensors alias the live parameters
    blob = save(saved)
    reference = [trainer.step() for _ in range(2)]

    state = load(blob, "cpu")
    assert_states_equal(saved, state, exact=True)  # pjrt -> file -> CPU loses nothing
    on_cpu = Trainer("cpu", data)
    on_cpu.model.eval()
    on_cpu.load(state)
    continued = [on_cpu.step() for _ in range(2)]
    torch.testing.assert_close(torch.stack(continued), torch.stack(reference).cpu(), **TOL)
    assert_states_equal(trainer.state()["model"], on_cpu.state()["model"], exact=False)

    # and back: a CPU checkpoint resumes on pjrt
    back = Trainer("pjrt", data)
    back.model.eval()
    back.load(load(save(on_cpu.state()), "pjrt"))
    assert_states_equal(on_cpu.state()["opt"], back.state()["opt"], exact=True)
    torch.testing.assert_close(back.step().cpu(), on_cpu.step(), **TOL)


# -- GradScaler -------------------------------------------------------------------------
def test_grad_scaler_skips_nonfinite_steps_and_backs_off():
    results = {}
    for device in ("cpu", "pjrt"):
        torch.manual_seed(0)
        model = nn.Linear(4, 2).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 8, growth_interval=1)
        history = []
        for step in range(4):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step)).to(device)
            if step == 1:
                x[0, 0] = float("inf")  # this step's gradients overflow
            loss = model(x).sum()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            history.append((scaler.get_scale(), model.weight.detach().cpu().clone()))
        results[device] = history
    for (scale_cpu, w_cpu), (scale_pjrt, w_pjrt) in zip(results["cpu"], results["pjrt"]):
        assert scale_pjrt == scale_cpu
        torch.testing.assert_close(w_pjrt, w_cpu, **TOL)
    assert results["pjrt"][1][0] == 2.0 ** 8 * 2 * 0.5  # grew after step 0, halved at the inf step
    assert torch.equal(results["pjrt"][1][1], results["pjrt"][0][1])  # the inf step was skipped
    # GradScaler's own ops have lowerings: nothing of the step ran on the CPU fallback
    assert not [op for op in torch_pjrt.fallback_ops() if "_amp_" in op], torch_pjrt.fallback_ops()


@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")])
def test_grad_scaler_ops_match_cpu(bad):
    """The two ops GradScaler calls, on float32/float16/float64 grads, against CPU torch."""
    def run(device):
        g = torch.Generator().manual_seed(0)
        grads = [torch.randn(5, generator=g).to(dtype) * 1000
                 for dtype in (torch.float32, torch.float16, torch.float64)]
        if bad is not None:
            grads[1][2] = bad
        grads = [t.to(device) for t in grads]
        found_inf = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, torch.full((1,), 1 / 3, device=device))
        out = grads + [found_inf.clone()]
        for tracker_value, scale_value in ((0, 2.0 ** 16), (1, 2.0 ** 16), (1, 3.0e38)):  # grow, grow to inf
            scale = torch.full((1,), scale_value, device=device)
            tracker = torch.full((1,), tracker_value, dtype=torch.int32, device=device)
            torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)
            out += [scale, tracker]
        return [t.cpu() for t in out]

    for got, want in zip(run("pjrt"), run("cpu")):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


# -- LR schedulers ------------------------------------------------------------------------
SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=8),
    "CosineAnnealingWarmRestarts": lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=3),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (1 + s)),
    "SequentialLR": lambda o: torch.optim.lr_scheduler.SequentialLR(o, [
        torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=3),
        torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9)], milestones=[3]),
    "ReduceLROnPlateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5),
    "PolynomialLR": lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=6, power=2.0),
    "CyclicLR": lambda o: torch.optim.lr_scheduler.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=2),
}


@pytest.mark.parametrize("name", SCHEDULERS)
def test_lr_scheduler_matches_cpu(name):
    results = {}
    for device in ("cpu", "pjrt"):
        torch.manual_seed(0)
        model = nn.Linear(4, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = SCHEDULERS[name](opt)
        lrs = []
        for step in range(8):
            loss = model(torch.full((2, 4), 1.0 + step, device=device)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if name == "ReduceLROnPlateau":
                sched.step(loss)  # a pjrt scalar tensor as the metric
            else:
                sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        results[device] = lrs, model.weight.detach().cpu()
    assert results["pjrt"][0] == pytest.approx(results["cpu"][0], rel=1e-12)
    torch.testing.assert_close(results["pjrt"][1], results["cpu"][1], **TOL)


# -- gradient clipping --------------------------------------------------------------------
@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_matches_cpu(foreach, norm_type):
    out = {}
    for device in ("cpu", "pjrt"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).to(device)
        model(torch.randn(4, 5).to(device)).pow(2).sum().mul(10).backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
        assert total.device.type == device
        out[device] = total.cpu(), [p.grad.cpu() for p in model.parameters()]
    torch.testing.assert_close(out["pjrt"][0], out["cpu"][0], **TOL)
    for g_pjrt, g_cpu in zip(out["pjrt"][1], out["cpu"][1]):
        torch.testing.assert_close(g_pjrt, g_cpu, **TOL)


@pytest.mark.parametrize("foreach", [False, True])
def test_clip_grad_value_and_nonfinite_error(foreach):
    w = nn.Parameter(torch.tensor([1.0, -2.0, 3.0], device="pjrt"))
    (w * torch.tensor([5.0, -5.0, 0.1], device="pjrt")).sum().backward()
    torch.nn.utils.clip_grad_value_([w], 1.0, foreach=foreach)
    assert w.grad.cpu().tolist() == pytest.approx([1.0, -1.0, 0.1])
    w.grad = torch.tensor([float("nan"), 1.0, 1.0], device="pjrt")
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True, foreach=foreach)


# -- autograd ---------------------------------------------------------------------------
def both(fn):
    """fn(device) on cpu and pjrt; asserts every returned tensor agrees."""
    cpu, pjrt = fn("cpu"), fn("pjrt")
    for a, b in zip(cpu, pjrt):
        assert b.device.type == "pjrt"
        torch.testing.assert_close(b.cpu(), a, **TOL)


def leaf(device, *shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device).requires_grad_()


def test_retain_graph_backward_twice_accumulates():
    def run(device):
        x = leaf(device, 3, 4)
        y = (x.sin() * x).sum()
        y.backward(retain_graph=True)
        first = x.grad.clone()
        y.backward()
        return first, x.grad

    both(run)


def test_backward_through_freed_graph_raises():
    x = leaf("pjrt", 3)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_double_backward_gradient_penalty():
    def run(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).to(device)
        x = leaf(device, 5, 4, seed=1)
        out = model(x).sum()
        (gx,) = torch.autograd.grad(out, x, create_graph=True)
        penalty = gx.pow(2).sum()
        penalty.backward()
        return gx.detach(), x.grad, model[0].weight.grad, model[2].weight.grad

    both(run)


def test_third_derivative():
    def run(device):
        x = leaf(device, 4)
        y = (x ** 3).sum()
        (g1,) = torch.autograd.grad(y, x, create_graph=True)
        (g2,) = torch.autograd.grad(g1.sum(), x, create_graph=True)
        (g3,) = torch.autograd.grad(g2.sum(), x)
        return g1.detach(), g2.detach(), g3

    both(run)


def test_autograd_grad_with_grad_outputs_and_unused_inputs():
    def run(device):
        x, w, unused = leaf(device, 3, 4), leaf(device, 4, 2, seed=1), leaf(device, 2, seed=2)
        y = x @ w
        v = torch.ones(3, 2, device=device) * torch.arange(2.0, device=device)
        gx, gw, gu = torch.autograd.grad(y, (x, w, unused), grad_outputs=v, allow_unused=True,
                                         materialize_grads=True)
        return gx, gw, gu

    both(run)


def test_hooks():
    def run(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).to(device)
        seen = {}

        def keep(key, value):  # hooks that observe return None
            seen[key] = value.detach().clone()

        model[0].weight.register_hook(lambda g: g * 2)  # a tensor hook that rewrites the gradient
        model[2].register_full_backward_hook(lambda m, gin, gout: keep("gout", gout[0]))
        model[1].register_forward_hook(lambda m, i, o: keep("act", o))
        model[2].bias.register_post_accumulate_grad_hook(lambda p: keep("bias_grad", p.grad))
        x = leaf(device, 5, 4, seed=3)
        x.register_hook(lambda g: keep("x_grad", g))
        model(x).pow(2).sum().backward()
        return model[0].weight.grad, seen["gout"], seen["act"], seen["bias_grad"], seen["x_grad"]

    both(run)


def test_custom_autograd_function_and_no_grad_modes():
    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * x * g

    def run(device):
        x = leaf(device, 6)
        with torch.no_grad():
            frozen = x * 2
        with torch.inference_mode():
            inferred = x.detach() + 1
        Cube.apply(x).sum().backward()
        assert not frozen.requires_grad and inferred.is_inference()
        return x.grad, frozen, inferred

    both(run)


def test_gradients_flow_across_devices_with_to():
    """A graph that moves between cpu and pjrt: .to() is differentiable both ways."""
    x = leaf("cpu", 3, 3)
    y = (x.to("pjrt").exp() * 2).to("cpu").sum()
    y.backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().exp(), **TOL)


def test_training_gpt_matches_cpu_in_float32(data):
    """The char GPT (dropout off) for a few steps: losses and every parameter."""
    runs = {}
    for device in ("cpu", "pjrt"):
        _, model, opt = dm.gpt_setup(device, data=data, n_layer=2, n_embd=32, n_head=2, block_size=16)
        losses = dm.train_gpt(data, model, opt, device, 4, batch_size=4)
        runs[device] = losses, model
    torch.testing.assert_close(torch.tensor(runs["pjrt"][0]), torch.tensor(runs["cpu"][0]), **TOL)
    for (name, p), q in zip(runs["cpu"][1].named_parameters(), runs["pjrt"][1].parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    assert not torch_pjrt.fallback_ops().keys() & {"aten::_softmax", "aten::mm", "aten::addmm"}
