"""PyTorch's ModuleInfo database (`module_db`) on pjrt against the CPU.

torch's own test_modules.py checks a device against the CPU in `test_cpu_gpu_parity`, which it
runs on CUDA only; this is that check for pjrt: each module built on both devices with the same
parameters, its forward on the same inputs, then backward of the same random grad_outputs, and
the outputs, input gradients and parameter gradients compared (float32, training and eval mode
where the module differs). The default run takes each module's first input (its `-m slow`
companion, every input); what the ModuleInfo skips for that check is skipped here too. And the
modules' `module_error_inputs_func`: pjrt raises what the CPU raises."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.testing._internal.common_modules import ModuleErrorEnum, module_db
from torch.utils._pytree import tree_flatten, tree_map

import torch_pjrt

DTYPE = torch.float32
# Modules whose forward draws random numbers: pjrt's generator is not the CPU's, so only shapes,
# dtypes and (for backward) gradient shapes are compared.
RANDOM = {"nn.Dropout", "nn.Dropout1d", "nn.Dropout2d", "nn.Dropout3d", "nn.AlphaDropout", "nn.FeatureAlphaDropout",
          "nn.RReLU", "nn.FractionalMaxPool2d", "nn.FractionalMaxPool3d"}
# Gradients sum over batch, time and space in float32, in XLA's order: 1e-5 to 4e-5 apart at values
# about 1 (Conv3d and ConvTranspose3d weights, MultiheadAttention, LSTM, Transformer layers), and
# for CTCLoss's input gradients pjrt is the closer of the two to float64 (9e-6 from it, CPU's 7e-5)
GRAD_TOLERANCE = dict(rtol=1e-4, atol=1e-4)


def _skipped_for_parity(info) -> bool:
    """The ModuleInfo skips torch's parity check on every device (nn.KLDivLoss, nn.GroupNorm)."""
    return any(d.test_name == "test_cpu_gpu_parity" and d.device_type is None and d.dtypes is None
               and any(getattr(f, "__name__", "") == "decorator" for f in d.decorators) for d in info.decorators)


def _cases(every: bool, dtype=DTYPE):
    for info in module_db:
        if dtype not in info.dtypes or _skipped_for_parity(info):
            continue
        for training in ((True, False) if info.train_and_eval_differ else (True,)):
            inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=training)
            for k in range(len(inputs) if every else min(1, len(inputs))):
                if every and k == 0:
                    continue  # the default run's case
                mode = "train" if training else "eval"
                yield pytest.param(info, training, k, id=f"{info.name}-{mode}-{k}")


def _to(device):
    def move(x):
        if not isinstance(x, torch.Tensor):
            return copy.deepcopy(x)
        y = x.detach().to(device).requires_grad_(x.requires_grad)
        if y.requires_grad:
            y.retain_grad()
        return y
    return move


def _grads(tree):
    return [x.grad for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor) and x.requires_grad]


def _run(info, module_input, training: bool, device: str, grad_outputs=None, dtype=DTYPE):
    """(outputs, input grads, parameter grads), on the CPU; the grad_outputs used."""
    args, kwargs = tree_map(_to(device), (module_input.forward_input.args, module_input.forward_input.kwargs))
    torch.manual_seed(0)
    constructor = module_input.constructor_input
    module = info.module_cls(*constructor.args, **constructor.kwargs).to(dtype)
    if issubclass(info.module_cls, torch.nn.modules.lazy.LazyModuleMixin):
        with torch.no_grad():
            module(*tree_map(_to("cpu"), args), **tree_map(_to("cpu"), kwargs))
    module = module.to(device).train(training)
    outputs = module(*args, **kwargs)
    flat = [o for o in tree_flatten(outputs)[0] if isinstance(o, torch.Tensor)]
    differentiable = [o for o in flat if o.requires_grad]
    if grad_outputs is None:
        g = torch.Generator().manual_seed(1)
        grad_outputs = [torch.randn(o.shape, generator=g, dtype=o.dtype) if o.is_floating_point() or o.is_complex()
                        else None for o in differentiable]
    if differentiable:
        torch.autograd.backward(differentiable, [go.to(device) for go in grad_outputs])
    cpu = lambda ts: [t.detach().cpu() if t is not None else None for t in ts]  # noqa: E731
    return (cpu(flat), cpu(_grads((args, kwargs))), cpu([p.grad for p in module.parameters()])), grad_outputs


def _check(info, training: bool, k: int, dtype=DTYPE) -> None:
    torch.manual_seed(k)  # the inputs are random: made once, for both devices
    module_input = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=training)[k]
    want, grad_outputs = _run(info, module_input, training, "cpu", dtype=dtype)
    before = torch_pjrt.fallback_ops()
    got, _ = _run(info, module_input, training, "pjrt", grad_outputs, dtype=dtype)
    assert torch_pjrt.fallback_ops() == before, "ran on the CPU fallback"
    for what, g, w in zip(("outputs", "input grads", "parameter grads"), got, want):
        assert len(g) == len(w), what
        for a, b in zip(g, w):
            assert (a is None) == (b is None), what
            if a is None:
                continue
            assert a.shape == b.shape and a.dtype == b.dtype, what
            if info.name not in RANDOM:
                tolerance = GRAD_TOLERANCE if what != "outputs" and dtype == torch.float32 else {}
                torch.testing.assert_close(a, b, **tolerance, equal_nan=True, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("info,training,k", list(_cases(every=False)))
def test_module_as_on_cpu(info, training, k):
    _check(info, training, k)


@pytest.mark.slow
@pytest.mark.parametrize("info,training,k", list(_cases(every=True)))
def test_module_every_input_as_on_cpu(info, training, k):
    _check(info, training, k)


@pytest.mark.slow
@pytest.mark.parametrize("info,training,k", list(_cases(every=False, dtype=torch.float64)))
def test_module_float64_as_on_cpu(info, training, k):
    """float64 at assert_close's float64 tolerances: no lowering computes in a narrower type."""
    _check(info, training, k, torch.float64)


def _error_cases():
    for info in module_db:
        error_inputs = getattr(info, "module_error_inputs_func", None)
        for k, error_input in enumerate(error_inputs(info, device="cpu", dtype=DTYPE, requires_grad=False, training=True)
                                        if error_inputs else ()):
            yield pytest.param(info, error_input, id=f"{info.name}-{k}")


def _raised(info, error_input, device: str):
    """What building the module and its forward raise: (type, first line), or None."""
    given = error_input.module_error_input
    try:
        module = info.module_cls(*given.constructor_input.args, **given.constructor_input.kwargs)
        if error_input.error_on == ModuleErrorEnum.FORWARD_ERROR:
            args, kwargs = tree_map(_to(device), (given.forward_input.args, given.forward_input.kwargs))
            module.to(device)(*args, **kwargs)
            torch.pjrt.synchronize()  # an index check is raised at the next sync, as CUDA's device asserts
    except Exception as e:  # noqa: BLE001  (the outcome compared is the exception)
        return type(e), str(e).split("\n")[0]
    return None


@pytest.mark.parametrize("info,error_input", list(_error_cases()))
def test_module_error_inputs_as_on_cpu(info, error_input):
    """module_db's error inputs: pjrt raises what the CPU raises, and what the ModuleInfo says."""
    want = _raised(info, error_input, "cpu")
    assert want is not None and issubclass(want[0], error_input.error_type)
    assert _raised(info, error_input, "pjrt") == want
