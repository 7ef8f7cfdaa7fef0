"""Steady-state eager work does not grow device memory."""
import gc

import torch


def _allocated_after_collect() -> int:
    # Earlier tests can leave pjrt tensors in reference cycles; a collection inside the loop
    # would free them and move the count for a reason that is not this test's.
    gc.collect()
    return torch.pjrt.memory_allocated()


def test_small_ops_do_not_leak():
    a = torch.randn(16, 16, device="pjrt")
    b = torch.randn(16, 16, device="pjrt")
    for _ in range(50):
        (a + b).mul_(0.5)
    before = _allocated_after_collect()
    for _ in range(5000):
        c = a + b
        c.mul_(0.5)
        a.t().add(c)
    del c
    assert _allocated_after_collect() - before == 0


def test_mlp_training_does_not_leak():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to("pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32, device="pjrt"), torch.randn(16, 4, device="pjrt")

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for _ in range(10):
        last = step()
    first = last.item()
    before = _allocated_after_collect()  # with one loss tensor alive, as below
    for _ in range(300):
        last = step()
    assert _allocated_after_collect() - before == 0
    assert last.item() < first  # it trains
