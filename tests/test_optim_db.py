"""PyTorch's OptimizerInfo database (`optim_db`) on pjrt against the CPU.

Each optimizer's own inputs (`optim_inputs_func`, with torch's foreach variants and, where the
optimizer has one, fused=True: torch allows fused on the PrivateUse1 backend), each run three
steps on the same parameters and gradients on both devices: parameters and every tensor of the
optimizer's state must agree. LBFGS steps with a closure; SparseAdam takes sparse gradients.
Complex parameters too, for the optimizers whose OptimizerInfo says they support them.
The optimizers' `optim_error_inputs_func`: pjrt raises (or warns) what the entry says, where
the CPU does. tests/test_optim.py covers what the database does not (capturable, Muon's
variants, GradScaler)."""
from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch.testing._internal.common_optimizers import (
    OptimizerErrorEnum, _get_optim_inputs_including_global_cliquey_kwargs, optim_db)
from torch.utils._pytree import tree_map

import torch_pjrt

STEPS = 3
# float32: XLA reorders sums and fuses multiply-adds, and three steps of an adaptive optimizer
# divide by small second moments (the same tolerance as tests/test_optim.py)
TOLERANCE = dict(rtol=1e-4, atol=1e-5)
# LBFGS runs 20 iterations a step: after 60 the quadratic's gradients and steps are float32 noise
# (1e-5 apart where both are about 1e-6)
CLOSURE_TOLERANCE = dict(rtol=1e-4, atol=1e-4)
SLOW = pytest.mark.slow
# parameters: a matrix, a vector and a 3-d tensor (Adafactor factors the last two dims);
# Muon takes matrices only
SHAPES = ((5, 4), (4,), (2, 3, 4))
MATRICES = ((5, 4), (3, 5))


def _cases():
    for info in optim_db:
        inputs = _get_optim_inputs_including_global_cliquey_kwargs("pjrt", torch.float32, info, skip=("differentiable",))
        if "fused" in info.supported_impls:  # torch's list leaves fused to the devices the OptimizerInfo names
            inputs += [type(i)(params=None, kwargs={**i.kwargs, "fused": True}, desc=i.desc + " fused")
                       for i in info.optim_inputs_func(device="pjrt", dtype=torch.float32)
                       if "foreach" not in i.kwargs and "fused" not in i.kwargs]
        dtypes = (torch.float32, torch.complex64) if info.supports_complex else (torch.float32,)
        for k, optim_input in enumerate(inputs):
            for dtype in dtypes:
                if dtype.is_complex and optim_input.kwargs.get("fused"):
                    continue  # torch's fused kernels take real parameters only, on every device
                yield pytest.param(info, optim_input, dtype, marks=() if _default_run(k, optim_input, dtype) else SLOW,
                                   id=f"{info.name}-{k}-{_slug(optim_input.kwargs)}-{str(dtype)[6:]}")


def _default_run(k: int, optim_input, dtype) -> bool:
    """The default test run's share (the rest is `-m slow`: 460 cases take 4-5 minutes from an empty
    executable store): every input of the single-tensor and the fused implementations in float32
    (a fused step is one lowering each: ops/optim.py), and the first input's foreach and complex
    variants."""
    first = optim_input.desc.startswith("default")
    return first or not optim_input.kwargs.get("foreach") and not dtype.is_complex


def _slug(kwargs: dict) -> str:
    return ",".join(f"{k}={v}" if not isinstance(v, torch.Tensor) else f"{k}=tensor" for k, v in kwargs.items()) or "default"


def _on(device):
    """Tensors moved to `device` as they were made: leaves stay leaves, Parameters Parameters, a
    gradient goes along, and a tensor named twice (duplicate parameters) is one tensor there too."""
    moved: dict = {}

    def move(x):
        if not isinstance(x, torch.Tensor) or x.device.type == device:
            return x
        if id(x) not in moved:
            y = x.detach().to(device).requires_grad_(x.requires_grad)
            if isinstance(x, torch.nn.Parameter):
                y = torch.nn.Parameter(y, requires_grad=x.requires_grad)
            if x.grad is not None:
                y.grad = x.grad.to(device)
            moved[id(x)] = y
        return moved[id(x)]
    return move


def _run(info, kwargs: dict, dtype, device):
    """Parameters and the optimizer's state after STEPS steps, on the CPU."""
    shapes = MATRICES if info.name == "Muon" else SHAPES
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g, dtype=dtype).to(device).requires_grad_() for s in shapes]
    targets = [torch.randn(s, generator=g, dtype=dtype).to(device) for s in shapes]
    optimizer = info.optim_cls(params, **tree_map(_on(device), kwargs))

    def closure():
        optimizer.zero_grad()
        loss = sum(((p - t).abs() ** 2).sum() for p, t in zip(params, targets))
        loss.backward()
        return loss

    for step in range(STEPS):
        if info.step_requires_closure:
            optimizer.step(closure)
            continue
        for p in params:
            grad = torch.randn(p.shape, generator=g, dtype=dtype)
            if info.only_supports_sparse_grads:
                grad = (grad * (torch.rand(p.shape, generator=g) > 0.5)).to_sparse()
            p.grad = grad.to(device)
        optimizer.step()
    state = [v for s in optimizer.state_dict()["state"].values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [t.detach().cpu() for t in params], [t.detach().cpu() for t in state]


@pytest.mark.parametrize("info,optim_input,dtype", list(_cases()))
def test_optimizer_steps_as_on_cpu(info, optim_input, dtype):
    kwargs = dict(optim_input.kwargs)
    want = _run(info, kwargs, dtype, "cpu")
    before = torch_pjrt.fallback_ops()
    got = _run(info, kwargs, dtype, "pjrt")
    assert torch_pjrt.fallback_ops() == before  # every op of the step lowered: no host round trips
    tolerance = CLOSURE_TOLERANCE if info.step_requires_closure else TOLERANCE
    torch.testing.assert_close(got[0], want[0], **tolerance)
    assert len(got[1]) == len(want[1])
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, **tolerance)


def _error_cases():
    for info in optim_db:
        for k, error_input in enumerate(info.optim_error_inputs_func(device="cpu", dtype=torch.float32)):
            yield pytest.param(info, error_input, id=f"{info.name}-{k}-{error_input.optimizer_error_input.desc}")


def _raised(info, error_input, device):
    """What constructing the optimizer and one step raise or warn: (kind, type, first line), or None."""
    move = _on(device)
    params = tree_map(move, error_input.optimizer_error_input.params)
    kwargs = tree_map(move, error_input.optimizer_error_input.kwargs)
    if params is None:
        params = [torch.randn(3, 2, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimizer = info.optim_cls(params, **kwargs)
            if error_input.error_on == OptimizerErrorEnum.STEP_ERROR:
                optimizer.step()
    except Exception as e:  # noqa: BLE001  (the outcome compared is the exception)
        return "raises", type(e), str(e).split("\n")[0]
    for w in caught:
        if issubclass(w.category, error_input.error_type):
            return "warns", w.category, str(w.message).split("\n")[0]
    return None


@pytest.mark.parametrize("info,error_input", list(_error_cases()))
def test_optimizer_error_inputs_as_on_cpu(info, error_input):
    want = _raised(info, error_input, "cpu")
    got = _raised(info, error_input, "pjrt")
    # a tensor's type in a message names its device, as CUDA's do ("but got torch.pjrt.FloatTensor")
    assert got == want or got[:2] == want[:2] and got[2] == want[2].replace("torch.", "torch.pjrt.")
    if want is not None:  # and what the OptimizerInfo says, where CPU says it too
        assert issubclass(got[1], error_input.error_type) and re.search(error_input.error_regex, got[2])
