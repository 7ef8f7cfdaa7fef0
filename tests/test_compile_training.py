"""Whole training steps under torch.compile(backend="pjrt") against CPU eager, step by step.

A compiled step must compute what the same step computes eagerly, however the values it
depends on reach the graph: parameters and optimizer state (mutated inputs), learning rates
and betas that schedulers change every step (Python floats that Dynamo lifts into graph
inputs), Python ints and floats passed per call, and sizes (dynamic=True). Each case runs
12 steps and compares every loss and the final parameters with CPU eager; a graph input
baked in as a constant, a stale cache hit or a lost state write shows within a few steps.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from torch_pjrt.compiler import compile_stats, reset_compile_stats

STEPS = 12


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    reset_compile_stats()
    yield
    torch._dynamo.reset()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 8))


def _groups(model, decay):
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices, "weight_decay": decay}, {"params": others, "weight_decay": 0.0}]


OPTIMIZERS = {
    "adamw_groups": lambda m: torch.optim.AdamW(_groups(m, 0.1), lr=1e-2, betas=(0.9, 0.95)),
    "adam": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
    "adam_groups_l2": lambda m: torch.optim.Adam(_groups(m, 0.01), lr=5e-3),
    "sgd_momentum": lambda m: torch.optim.SGD(m.parameters(), lr=5e-2, momentum=0.9),
    "sgd_nesterov_groups": lambda m: torch.optim.SGD(_groups(m, 1e-3), lr=5e-2, momentum=0.9, nesterov=True),
}


def _warmup_cosine(step):
    return (step + 1) / 4 if step < 4 else 0.1 + 0.45 * (1 + math.cos(math.pi * (step - 4) / 8))


SCHEDULERS = {
    "lambda": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine),
    "cosine": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS),
    "onecycle": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-2, total_steps=STEPS + 1),
    "none": lambda opt: None,
}


def _train(device, optimizer, scheduler, *, backend=None, clip=True, accumulate=1, scale_arg=False, **compile_kw):
    model = copy.deepcopy(_model()).to(device)
    opt = OPTIMIZERS[optimizer](model)
    sched = SCHEDULERS[scheduler](opt)

    def step(x, scale, repeat):
        for chunk in x.chunk(accumulate):
            loss = (model(chunk) * scale).square().mean() * repeat / accumulate
            loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    run = torch.compile(step, backend=backend, **compile_kw) if backend else step
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(STEPS):
        rows = 4 + 4 * (i % 3) if compile_kw.get("dynamic") else 8
        x = torch.randn(rows, 8, generator=g)
        scale, repeat = (1.0 + 0.1 * i, 1 + i % 3) if scale_arg else (1.0, 1)
        losses.append(float(run(x.to(device), scale, repeat).detach()))
        if sched is not None:
            sched.step()
    return losses, [p.detach().cpu() for p in model.parameters()]


def _assert_matches_eager(**case):
    want_losses, want_params = _train("cpu", **case)
    losses, params = _train("pjrt", backend="pjrt", **case)
    assert compile_stats()["executables"] >= 1  # it really ran compiled
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-6)
    for p, q in zip(params, want_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("optimizer,scheduler", [
    ("adamw_groups", "lambda"),  # the case of issue 13: every group but the last kept a stale step count
    ("adam", "cosine"),
    ("adam_groups_l2", "onecycle"),  # OneCycle changes betas too
    ("sgd_momentum", "onecycle"),
    ("sgd_nesterov_groups", "lambda"),
])
def test_compiled_training_matches_cpu_eager(optimizer, scheduler):
    _assert_matches_eager(optimizer=optimizer, scheduler=scheduler)


def test_gradient_accumulation_and_per_call_python_numbers():
    _assert_matches_eager(optimizer="adamw_groups", scheduler="lambda", accumulate=2, scale_arg=True)


def test_reduce_overhead_mode():
    _assert_matches_eager(optimizer="adamw_groups", scheduler="cosine", clip=False, mode="reduce-overhead")


def test_dynamic_batch_sizes():
    _assert_matches_eager(optimizer="adam", scheduler="lambda", clip=False, dynamic=True)


def test_optimizer_state_counters_start_on_the_device():
    """Dynamo traces a fresh optimizer capturable on CUDA; on pjrt too, so no step counter is
    moved between devices while the step is traced (the cause of the stale counts)."""
    model = _model().to("pjrt")
    opt = torch.optim.AdamW(_groups(model, 0.1), lr=1e-2)
    model(torch.randn(2, 8, device="pjrt")).sum().backward()
    torch.compile(opt.step, backend="pjrt")()
    torch.compile(opt.step, backend="pjrt")()
    steps = [s["step"] for s in opt.state.values()]
    assert len(steps) == len(list(model.parameters()))
    assert all(t.device.type == "pjrt" and float(t) == 2.0 for t in steps)


# ------------------------------------------------------------------ every graph input is an input
def test_python_float_arguments_are_executable_inputs():
    """A float that changes per call: Dynamo lifts it into a 0-d float64 graph input (converted
    by prims.convert_element_type); one executable serves every value."""
    f = torch.compile(lambda x, s: (x * s).sum() + s, backend="pjrt")
    xc = torch.arange(4.0)
    x = xc.to("pjrt")
    values = [1.0, 1.1, -2.5, 0.0, -0.0, 1e-30, float("inf"), float("nan")]
    for s in values:
        torch.testing.assert_close(f(x, s).cpu(), (xc * s).sum() + s, equal_nan=True)
    stats = compile_stats()
    # at most: the first value specialized, the float lifted to an input, NaN specialized again
    assert stats["executables"] <= 3, stats
    assert stats["calls"] == len(values)


def test_symbolic_sizes_and_ints_are_executable_inputs():
    f = torch.compile(lambda x, n: (x * n).sum() + x.shape[0], backend="pjrt", dynamic=True)
    for n in (3, 5, 6, 7, 9, 17, 30):
        xc = torch.arange(float(n))
        torch.testing.assert_close(f(xc.to("pjrt"), n).cpu(), (xc * n).sum() + n)
    assert compile_stats()["executables"] < 7  # padded buckets, not one executable per value


def test_tensor_inputs_are_never_constants():
    w = torch.randn(3, 3)
    f = torch.compile(lambda x, w: (x @ w).relu(), backend="pjrt")
    for seed in range(3):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(f(x.to("pjrt"), w.to("pjrt")).cpu(), (x @ w).relu())
        w.mul_(-1.5)
    assert compile_stats()["executables"] == 1
