"""fused=True optimizers run as one pjrt executable per step and match torch's fused CPU kernels."""
import pytest
import torch

import torch_pjrt

CASES = [
    (torch.optim.Adam, dict(lr=1e-2)),
    (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    (torch.optim.Adam, dict(lr=1e-2, maximize=True)),
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.05)),
    (torch.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
    (torch.optim.SGD, dict(lr=0.1)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1)),
    (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01)),
]


def train(device, cls, kwargs, steps=4, scheduler=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(device)
    opt = cls(model.parameters(), fused=True, **kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7) if scheduler else None
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched:
            sched.step()
    return [p.detach().cpu() for p in model.parameters()], opt


@pytest.mark.parametrize("cls,kwargs", CASES, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(CASES)])
def test_fused_step_matches_cpu_without_fallback(cls, kwargs):
    before = dict(torch_pjrt.fallback_ops())
    expected, _ = train("cpu", cls, kwargs)
    actual, opt = train("pjrt", cls, kwargs, scheduler=False)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    assert not {k: v for k, v in torch_pjrt.fallback_ops().items() if "_fused" in k and v != before.get(k)}


def test_scheduler_changes_lr_without_recompiling():
    from torch_pjrt.eager.kernels import _REGISTERED

    kernel = _REGISTERED[torch.ops.aten._fused_adamw_.default].kernel.executable
    train("pjrt", torch.optim.AdamW, dict(lr=1e-2, eps=1e-7), steps=3, scheduler=True)  # warm up every layout
    cached = kernel._cache_size()
    expected, _ = train("cpu", torch.optim.AdamW, dict(lr=1e-2, eps=1e-7), steps=8, scheduler=True)
    actual, _ = train("pjrt", torch.optim.AdamW, dict(lr=1e-2, eps=1e-7), steps=8, scheduler=True)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    assert kernel._cache_size() == cached  # eight learning rates, no new executable


def test_grad_scaler_with_fused_adam_skips_inf_steps():
    def run(device):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
        scaler = torch.amp.GradScaler(device, init_scale=1024.0)
        for i in range(3):
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(i)).to(device)
            loss = model(x).square().mean() * (float("inf") if i == 1 else 1.0)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach().cpu() for p in model.parameters()], scaler.get_scale()

    (expected, scale_cpu), (actual, scale_pjrt) = run("cpu"), run("pjrt")
    assert scale_cpu == scale_pjrt
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
