"""Differences from CPU torch found by running PyTorch's test_nn whole on pjrt (issue 32;
docs/conformance-notes.md, "test_autograd and test_nn whole"). Each test runs the call on CPU (the
reference) and on pjrt."""
from __future__ import annotations

import pytest
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


# ------------------------------------------------------------------ in-place activations' backward
# test_elu_inplace_with_neg_alpha, test_leaky_relu_inplace_with_neg_slope: an in-place forward hands its
# backward the result, which a negative slope makes impossible to invert; CPU's backward refuses
# ("call out-of-place version"), pjrt computed a gradient (a wrong one for celu_).
_INPLACE_NEGATIVE = {
    "elu_": lambda a: torch.nn.functional.elu_(a, alpha=-2),
    "celu_": lambda a: torch.nn.functional.celu_(a, alpha=-2),
    "leaky_relu_": lambda a: torch.nn.functional.leaky_relu_(a, -2),
    "rrelu_": lambda a: torch.nn.functional.rrelu_(a, -5.0, 1.0),
}


def _backward_error(device, forward):
    a = torch.tensor([-1.0, 1.0], device=device, requires_grad=True)
    b = forward(a.clone())
    try:
        b.backward(torch.ones(2, device=device))
    except RuntimeError as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize("name", sorted(_INPLACE_NEGATIVE))
def test_inplace_activation_backward_with_a_negative_slope_raises_as_cpu(name):
    expected = _backward_error("cpu", _INPLACE_NEGATIVE[name])
    assert expected is not None and "call out-of-place version" in expected[1]
    assert _backward_error("pjrt", _INPLACE_NEGATIVE[name]) == expected


@pytest.mark.parametrize("name", ["elu_", "celu_", "selu_", "leaky_relu_"])
def test_inplace_activation_backward_with_a_valid_slope_equals_cpu(name):
    forward = {"elu_": lambda a: torch.nn.functional.elu_(a, alpha=0.7),
               "celu_": lambda a: torch.nn.functional.celu_(a, alpha=1.5),
               "selu_": torch.nn.functional.selu_,
               "leaky_relu_": lambda a: torch.nn.functional.leaky_relu_(a, 0.0)}[name]
    x = torch.linspace(-2, 2, 7, dtype=torch.float64)
    results = {}
    for device in ("cpu", "pjrt"):
        a = x.detach().to(device).requires_grad_()
        b = forward(a.clone())
        b.backward(torch.arange(7.0, dtype=torch.float64, device=device))
        results[device] = (b.detach(), a.grad)
    for pjrt, cpu in zip(results["pjrt"], results["cpu"]):
        torch.testing.assert_close(pjrt.cpu(), cpu)


# ------------------------------------------------------------------ reflection padding with negative widths
# test_pad: F.pad(x, (0, 0, -1, -1), mode="reflect") crops as CPU does; jnp.pad refuses negative widths
# (ValueError inside the lowering). A side that crops and one that reflects: CPU reflects about the
# input's own end (not the cropped one).
@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("pad", [(0, 0, -1, -1), (-3, 3), (2, -1, -2, 3), (-1, 0, 0, 2, 1, -2)])
def test_padding_with_negative_widths_equals_cpu(mode, pad):
    torch.manual_seed(0)
    x = torch.randn((2, 3, 4, 5, 6)[3 - len(pad) // 2:], dtype=torch.float64)  # batch, channels, padded dims
    grad = None
    results = {}
    for device in ("cpu", "pjrt"):
        a = x.detach().to(device).requires_grad_()
        out = torch.nn.functional.pad(a, pad, mode=mode)
        grad = torch.randn(out.shape, dtype=torch.float64) if grad is None else grad
        out.backward(grad.to(device))
        results[device] = (out.detach(), a.grad)
    for pjrt, cpu in zip(results["pjrt"], results["cpu"]):
        torch.testing.assert_close(pjrt.cpu(), cpu)


# ------------------------------------------------------------------ nearest upsampling's dtypes
# test_upsamplingBiMode2d_nonsupported_dtypes: nearest and nearest-exact upsampling of int8/16/32/64
# computed a result where CPU has no kernel ("... not implemented for 'Int'"). torch._decomp gives
# upsample_nearest* a Python CompositeImplicitAutograd kernel that only the Python dispatcher runs;
# eager took it for the dispatcher's and registered no kernel, so calls went through the boxed fallback
# (torch's decomposition, without the op's CPU dtype refusals). The dispatcher's table decides now.
_NEAREST = [(mode, rank) for mode in ("nearest", "nearest-exact") for rank in (1, 2, 3)]


def _interpolate(device, dtype, mode, rank, memory_format=torch.contiguous_format):
    x = (torch.arange(2 * 3 * 5 ** rank) % 97).reshape((2, 3) + (5,) * rank).to(dtype)
    x = x.to(device).contiguous(memory_format=memory_format)
    try:
        out = torch.nn.functional.interpolate(x, size=(7, 3, 4)[:rank], mode=mode)
    except RuntimeError as e:
        return type(e), str(e)
    return out.cpu(), out.stride()


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.float32])
@pytest.mark.parametrize("mode,rank", _NEAREST)
def test_nearest_upsampling_dtypes_as_cpu(mode, rank, dtype):
    cpu, pjrt = _interpolate("cpu", dtype, mode, rank), _interpolate("pjrt", dtype, mode, rank)
    if isinstance(cpu[0], type):
        assert pjrt == cpu
    else:
        assert pjrt[1] == cpu[1]
        torch.testing.assert_close(pjrt[0], cpu[0], rtol=0, atol=0)


def test_nearest_upsampling_has_an_eager_kernel_and_channels_last_equals_cpu():
    torch.ones(1, device="pjrt")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::upsample_nearest2d", "PrivateUse1")
    for dtype in (torch.int32, torch.uint8, torch.float64):
        cpu = _interpolate("cpu", dtype, "nearest", 2, torch.channels_last)
        pjrt = _interpolate("pjrt", dtype, "nearest", 2, torch.channels_last)
        assert type(pjrt[0]) is type(cpu[0]) and pjrt[1] == cpu[1]
        if isinstance(cpu[0], torch.Tensor):
            torch.testing.assert_close(pjrt[0], cpu[0], rtol=0, atol=0)
