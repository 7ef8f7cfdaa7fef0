"""torch.autocast("pjrt") follows CUDA's cast lists (torch_pjrt/autocast.py).

Until torch_pjrt._setup() calls torch_pjrt.autocast.register(), the fixture below registers
the rules (register() is idempotent)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt.autocast

LOW = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True, scope="module")
def _rules():
    torch_pjrt.autocast.register()


def pj(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to("pjrt", dtype)


@pytest.mark.parametrize("dtype", LOW)
def test_autocast_state(dtype):
    assert not torch.is_autocast_enabled("pjrt")
    with torch.autocast("pjrt", dtype=dtype):
        assert torch.is_autocast_enabled("pjrt")
        assert torch.get_autocast_dtype("pjrt") == dtype
    assert not torch.is_autocast_enabled("pjrt")


LOW_PRECISION_CASES = {
    "mm": lambda: torch.mm(pj(3, 4), pj(4, 5)),
    "matmul": lambda: pj(2, 3, 4) @ pj(4, 5),
    "bmm": lambda: torch.bmm(pj(2, 3, 4), pj(2, 4, 5)),
    "addmm": lambda: torch.addmm(pj(5), pj(3, 4), pj(4, 5)),
    "baddbmm": lambda: torch.baddbmm(pj(2, 3, 5), pj(2, 3, 4), pj(2, 4, 5)),
    "linear": lambda: F.linear(pj(3, 4), pj(5, 4), pj(5)),
    "conv2d": lambda: F.conv2d(pj(1, 2, 6, 6), pj(3, 2, 3, 3), pj(3)),
    "conv1d": lambda: F.conv1d(pj(1, 2, 6), pj(3, 2, 3)),
    "conv_transpose2d": lambda: F.conv_transpose2d(pj(1, 2, 4, 4), pj(2, 3, 3, 3)),
    "einsum": lambda: torch.einsum("ij,jk->ik", pj(3, 4), pj(4, 5)),
    "prelu": lambda: F.prelu(pj(3, 4), pj(1)),
    "lstm_cell": lambda: torch.lstm_cell(pj(2, 3), (pj(2, 4), pj(2, 4)), pj(16, 3), pj(16, 4))[0],
    "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(pj(1, 2, 4, 8), pj(1, 2, 4, 8),
                                                                          pj(1, 2, 4, 8)),
}

FLOAT32_CASES = {
    "softmax": lambda x: F.softmax(x, dim=-1),
    "log_softmax": lambda x: F.log_softmax(x, dim=-1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "group_norm": lambda x: F.group_norm(x.view(2, 4, 3), 2),
    "exp": torch.exp,
    "log": torch.log,
    "pow": lambda x: x.pow(2),
    "rsqrt": torch.rsqrt,
    "sum": torch.sum,
    "cumsum": lambda x: x.cumsum(0),
    "prod": lambda x: x.prod(),
    "logsumexp": lambda x: x.logsumexp(-1),
    "mse_loss": lambda x: F.mse_loss(x, x.detach() * 0.5),
    "l1_loss": lambda x: F.l1_loss(x, x.detach() * 0.5),
    "smooth_l1_loss": lambda x: F.smooth_l1_loss(x, x.detach() * 0.5),
    "nll_loss": lambda x: F.nll_loss(x, torch.tensor([0, 1], device="pjrt")),
    "bce_with_logits": lambda x: F.binary_cross_entropy_with_logits(x, torch.ones_like(x)),
    "kl_div": lambda x: F.kl_div(x, x.detach().softmax(-1), reduction="batchmean"),
    "cosine_similarity": lambda x: F.cosine_similarity(x, x.flip(-1)),
    "norm": lambda x: x.norm(),
    "vector_norm": lambda x: torch.linalg.vector_norm(x),
    "softplus": F.softplus,
}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", LOW_PRECISION_CASES)
def test_lower_precision_ops(name, dtype):
    with torch.autocast("pjrt", dtype=dtype):
        out = LOW_PRECISION_CASES[name]()
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", FLOAT32_CASES)
def test_float32_ops(name, dtype):
    x = (pj(2, 12).abs() + 0.5).to(dtype)  # a positive low-precision input, as a matmul's output would be
    with torch.autocast("pjrt", dtype=dtype):
        out = FLOAT32_CASES[name](x)
    assert out.dtype == torch.float32
    # the same computation done explicitly in float32 on the CPU
    torch.testing.assert_close(out.cpu(), FLOAT32_CASES[name](x.cpu().float()) if name != "nll_loss" else
                               F.nll_loss(x.cpu().float(), torch.tensor([0, 1])), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", LOW)
def test_explicit_dtype_and_float64_and_integers_are_left_alone(dtype):
    with torch.autocast("pjrt", dtype=dtype):
        assert F.softmax(pj(2, 3, dtype=dtype), -1, dtype=dtype).dtype == dtype  # an explicit dtype wins
        assert torch.mm(pj(2, 3, dtype=torch.float64), pj(3, 2, dtype=torch.float64)).dtype == torch.float64
        ints = torch.arange(6, device="pjrt").view(2, 3)
        assert (ints @ ints.T).dtype == torch.int64
        assert torch.sum(ints).dtype == torch.int64
        assert (pj(3) + pj(3)).dtype == torch.float32  # not on any list: unchanged
        assert F.relu(pj(3, dtype=dtype)).dtype == dtype


@pytest.mark.parametrize("dtype", LOW)
def test_promote_ops(dtype):
    with torch.autocast("pjrt", dtype=dtype):
        assert torch.addcmul(pj(3), pj(3, dtype=dtype), pj(3, dtype=dtype)).dtype == torch.float32
        assert torch.addcmul(pj(3, dtype=dtype), pj(3, dtype=dtype), pj(3, dtype=dtype)).dtype == dtype
        assert torch.atan2(pj(3, dtype=dtype), pj(3)).dtype == torch.float32
        assert torch.dot(pj(3, dtype=dtype), pj(3)).dtype == torch.float32


def test_binary_cross_entropy_is_refused_as_on_cuda():
    with torch.autocast("pjrt", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(pj(3).sigmoid(), torch.ones(3, device="pjrt"))


def test_disabled_region_and_nesting():
    with torch.autocast("pjrt", dtype=torch.bfloat16):
        with torch.autocast("pjrt", enabled=False):
            assert torch.mm(pj(2, 2), pj(2, 2)).dtype == torch.float32
        with torch.autocast("pjrt", dtype=torch.float16):
            assert torch.mm(pj(2, 2), pj(2, 2)).dtype == torch.float16
        assert torch.mm(pj(2, 2), pj(2, 2)).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU autocast does not touch pjrt tensors
        assert torch.mm(pj(2, 2), pj(2, 2)).dtype == torch.float32


def cuda_policy_reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype):
    """The model's forward with CUDA's autocast casts written out by hand, on the CPU."""
    h = F.conv2d(x.to(dtype), model[0].weight.to(dtype), model[0].bias.to(dtype))  # conv2d: low precision
    h = F.group_norm(h.float(), 2, model[1].weight, model[1].bias)  # group_norm: float32
    h = F.relu(h)  # float32 in, unchanged
    h = F.linear(h.flatten(1).to(dtype), model[4].weight.to(dtype), model[4].bias.to(dtype))
    # cross_entropy -> log_softmax(dtype=self's dtype: explicit, kept) -> nll_loss (float32)
    return F.nll_loss(F.log_softmax(h, 1, dtype=dtype).float(), y), h


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


@pytest.mark.parametrize("dtype", LOW)
def test_model_matches_cuda_policy_on_cpu_and_trains(dtype):
    cpu_model = make_model()
    model = make_model().to("pjrt")
    x = torch.randn(5, 2, 6, 6, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 2, 0, 1])
    with torch.autocast("pjrt", dtype=dtype):
        logits = model(x.to("pjrt"))
        loss = F.cross_entropy(logits, y.to("pjrt"))
    assert logits.dtype == dtype and loss.dtype == torch.float32
    ref_loss, ref_logits = cuda_policy_reference(cpu_model, x, y, dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(logits.cpu(), ref_logits, **tol)
    torch.testing.assert_close(loss.cpu(), ref_loss, **tol)

    loss.backward()
    ref_loss.backward()
    for (name, p), q in zip(cpu_model.named_parameters(), model.parameters()):
        assert q.grad.dtype == torch.float32, name  # gradients of float32 weights stay float32
        torch.testing.assert_close(q.grad.cpu(), p.grad, **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("dtype", LOW)
def test_close_to_cpu_autocast(dtype):
    """CPU autocast has its own (shorter) lists; on a linear + softmax model both agree to
    low-precision accuracy."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.randn(6, 8)
    with torch.autocast("cpu", dtype=dtype):
        ref = F.softmax(model(x), -1)
    model.to("pjrt")
    with torch.autocast("pjrt", dtype=dtype):
        out = F.softmax(model(x.to("pjrt")), -1)
    assert out.dtype == torch.float32  # CUDA's list: softmax in float32 (CPU autocast keeps it low)
    torch.testing.assert_close(out.cpu(), ref.float(), rtol=2e-2, atol=1e-2)


def test_grad_scaler_with_float16_autocast_training():
    """float16 autocast + GradScaler on pjrt follows float32 training on the CPU."""
    def train(device, amp):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        scaler = torch.amp.GradScaler(device, enabled=amp)
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
        y = (x.sum(1) > 0).long()
        x, y = x.to(device), y.to(device)
        losses = []
        for _ in range(15):
            with torch.autocast(device, dtype=torch.float16, enabled=amp):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
        assert all(p.dtype == torch.float32 for p in model.parameters())
        return losses, scaler.get_scale() if amp else None

    amp_losses, scale = train("pjrt", True)
    fp32_losses, _ = train("cpu", False)
    assert scale == 65536.0  # no step overflowed, none was skipped
    assert amp_losses[-1] < amp_losses[0] - 0.1
    assert amp_losses == pytest.approx(fp32_losses, abs=5e-3)


# ---- torch as the oracle of the cast lists (CUDA's policy) --------------------------------

def test_cast_lists_are_cudas_registrations():
    """Every op CUDA's autocast casts has a rule here, and every rule is CUDA's: an op with an
    AutocastCUDA kernel in this torch, or a composite CUDA casts after decomposing it."""
    cuda = {name.split("::")[1] for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
            if name.startswith("aten::")}
    ours = {op._schema.name.split("::")[1] + ("" if op._overloadname == "default" else "." + op._overloadname)
            for op in torch_pjrt.autocast.rules()}
    cuda_only = {n for n in cuda if n.startswith("cudnn_")}  # cuDNN entry points: no pjrt form
    missing = cuda - ours - cuda_only
    assert not missing, f"CUDA autocast casts these, pjrt does not: {sorted(missing)}"
    for name in ours - cuda:
        op = torch_pjrt.autocast._overload(name)
        assert op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd), name


def _fake_cuda_dtype(case, dtype, low):
    """The dtype CUDA's autocast gives `case` (fake CUDA tensors: no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fake(*shape, seed=0, dtype=torch.float32):
        return torch.empty(*shape, device="cuda", dtype=dtype)

    # torch.autocast("cuda") turns itself off without a GPU; the state it would set, set directly
    enabled, before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    with FakeTensorMode():
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", low)
        try:
            return case(fake, dtype).dtype
        finally:
            torch.set_autocast_enabled("cuda", enabled)
            torch.set_autocast_dtype("cuda", before)


@pytest.mark.parametrize("name", ["mm", "addmm", "conv2d", "linear", "exp", "softmax", "sum", "layer_norm",
                                  "mse_loss", "addcmul_mixed", "addcmul_low", "relu", "add"])
def test_policy_matches_cuda_autocast(name):
    """pjrt's cast of each policy kind gives the dtype CUDA's own autocast gives."""
    cases = {
        "mm": lambda t, d: torch.mm(t(3, 4), t(4, 5)),
        "addmm": lambda t, d: torch.addmm(t(5), t(3, 4), t(4, 5)),
        "conv2d": lambda t, d: F.conv2d(t(1, 2, 6, 6), t(3, 2, 3, 3)),
        "linear": lambda t, d: F.linear(t(3, 4), t(5, 4)),
        "exp": lambda t, d: torch.exp(t(3, dtype=d)),
        "softmax": lambda t, d: F.softmax(t(2, 3, dtype=d), -1),
        "sum": lambda t, d: torch.sum(t(3, dtype=d)),
        "layer_norm": lambda t, d: F.layer_norm(t(2, 4, dtype=d), (4,)),
        "mse_loss": lambda t, d: F.mse_loss(t(3, dtype=d), t(3, dtype=d)),
        "addcmul_mixed": lambda t, d: torch.addcmul(t(3), t(3, dtype=d), t(3, dtype=d)),
        "addcmul_low": lambda t, d: torch.addcmul(t(3, dtype=d), t(3, dtype=d), t(3, dtype=d)),
        "relu": lambda t, d: F.relu(t(3, dtype=d)),
        "add": lambda t, d: t(3) + t(3, dtype=d),
    }
    for low in LOW:
        with torch.autocast("pjrt", dtype=low):
            ours = cases[name](pj, low).dtype
        assert ours == _fake_cuda_dtype(cases[name], low, low), (name, low)
