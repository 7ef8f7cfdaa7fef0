"""Differences from CPU torch found by running PyTorch's test_nn whole on pjrt (issue 32;
docs/conformance-notes.md, "test_autograd and test_nn whole"). Each test runs the call on CPU (the
reference) and on pjrt."""
from __future__ import annotations

import torch


def _on(device, tensors):
    return [t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors]


# ------------------------------------------------------------------ empty batches
# test_GroupNorm_empty: native_group_norm reshaped its input to (N, group, -1), and -1 has no value
# when N is 0 (ZeroDivisionError inside the lowering).
def test_group_norm_of_an_empty_batch_equals_cpu():
    torch.manual_seed(0)
    results = {}
    for device in ("cpu", "pjrt"):
        mod = torch.nn.GroupNorm(2, 4).to(device)
        x = torch.zeros(0, 4, 3, 5, device=device, requires_grad=True)
        out = mod(x)
        out.sum().backward()
        results[device] = (out, x.grad, mod.weight.grad, mod.bias.grad)
    for pjrt, cpu in zip(results["pjrt"], results["cpu"]):
        assert pjrt.shape == cpu.shape
        torch.testing.assert_close(pjrt.cpu(), cpu)


# test_CTCLoss_empty_target: with every target length 0 the targets are empty and the lowering took
# labels from an empty axis (jnp.take raised IndexError); CPU's loss is then the all-blank path's.
def test_ctc_loss_with_every_target_empty_equals_cpu():
    torch.manual_seed(0)
    log_probs = torch.randn(7, 3, 5, dtype=torch.float64).log_softmax(2).requires_grad_()
    for targets in (torch.zeros(0, dtype=torch.long), torch.zeros(3, 0, dtype=torch.long)):
        results = {}
        for device in ("cpu", "pjrt"):
            lp, tg = _on(device, [log_probs, targets])
            loss = torch.nn.functional.ctc_loss(lp, tg, [7, 5, 0], [0, 0, 0], reduction="none", zero_infinity=True)
            loss.sum().backward()
            results[device] = (loss, lp.grad)
        for pjrt, cpu in zip(results["pjrt"], results["cpu"]):
            torch.testing.assert_close(pjrt.cpu(), cpu)
