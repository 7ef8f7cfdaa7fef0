"""Correctness on a GPU before any timing: a few ops, attention, a training step, generate,
and a compiled step on pjrt against torch on the CPU (the reference), one line each.

    TORCH_PJRT_PLATFORM=gpu python benchmarks/gpu_checks.py     (benchmarks/gpu_session.sh runs it)

Exits 1 if any check fails; every check runs regardless.
"""
from __future__ import annotations

import os
import sys
import traceback

os.environ.setdefault("TORCH_PJRT_PLATFORM", "gpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt.tools import demo_models as dm  # noqa: E402

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def close(got, want, atol, rtol):
    torch.testing.assert_close(got.detach().cpu().float(), want.detach().float(), atol=atol, rtol=rtol)


@check
def ops_float32():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 128, generator=g), torch.randn(128, 32, generator=g)
    for f in (lambda x, y: x @ y, lambda x, y: (x @ y).softmax(-1), lambda x, y: F.layer_norm(x, (128,)).sum(0)):
        close(f(a.to("pjrt"), b.to("pjrt")), f(a, b), 1e-4, 1e-4)  # TF32 would fail this: torch's default is off


@check
def sdpa_bfloat16_forward_backward():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 8, 128, 64, generator=g, dtype=torch.bfloat16) for _ in range(3))
    dev = [t.to("pjrt").requires_grad_() for t in (q, k, v)]
    cpu = [t.float().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*dev, is_causal=True)
    want = F.scaled_dot_product_attention(*cpu, is_causal=True)
    close(out, want, 2e-2, 2e-2)
    out.float().sum().backward()
    want.sum().backward()
    for d, c in zip(dev, cpu):
        close(d.grad, c.grad, 5e-2, 5e-2)
    print(f"    SDPA served by {type(out.grad_fn).__name__}")


@check
def training_steps_match_cpu():
    losses = {}
    for device in ("cpu", "pjrt"):
        data, model, opt = dm.gpt_setup(device, n_layer=2, n_embd=64, n_head=4, block_size=32)
        gen = torch.Generator().manual_seed(3)
        for _ in range(3):
            x, y = data.batch(gen, 4, 32)
            _, loss = model(x.to(device), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses[device] = loss.item()
    assert abs(losses["cpu"] - losses["pjrt"]) < 1e-3, losses


@check
def generate_tokens_match_cpu():
    from torch_pjrt.tools import bench_llm

    lm = bench_llm.causal_lm(None, 128)
    cpu, dev = lm.build().eval(), lm.build().to("pjrt").eval()
    prompt = torch.randint(0, 500, (1, 12), generator=torch.Generator().manual_seed(4))
    kw = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
    assert torch.equal(dev.generate(prompt.to("pjrt"), **kw).cpu(), cpu.generate(prompt, **kw))


@check
def compiled_step_matches_eager():
    torch.manual_seed(5)
    model = dm.MLP().to("pjrt")
    x = torch.randn(16, 32, device="pjrt")
    eager = model(x).sum()
    compiled = torch.compile(model, backend="pjrt")(x).sum()
    close(compiled, eager.cpu(), 1e-5, 1e-5)


@check
def cuda_training_untouched_by_installed_pjrt():
    """With torch-pjrt installed, `import torch` alone leaves CUDA torch's accelerator and lets
    CUDA train (autoload stands aside where CUDA has devices)."""
    import subprocess
    import tempfile
    from pathlib import Path

    # the package's torch.backends entry point, as an install has it (this session may run from a
    # checkout on PYTHONPATH, without one)
    site = Path(tempfile.mkdtemp())
    info = site / "torch_pjrt_entry_point-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-pjrt-entry-point\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\npjrt = torch_pjrt:_autoload\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    code = ("import sys, torch\n"
            "m = torch.nn.Linear(4, 1).cuda(); m(torch.randn(8, 4, device='cuda')).sum().backward()\n"
            "print(torch.accelerator.current_accelerator().type, torch._C._get_privateuse1_backend_name(), "
            "'torch_pjrt' in sys.modules, tuple(m.weight.grad.shape))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    # the entry point imported torch_pjrt, whose autoload stood aside: pjrt is not registered
    assert out.stdout.split() == ["cuda", "privateuseone", "True", "(1,", "4)"], out.stdout + out.stderr


def main() -> int:
    print(f"torch {torch.__version__}, pjrt device {torch.pjrt.get_device_name()}, "
          f"{torch.pjrt.device_count()} device(s)")
    failed = 0
    for fn in CHECKS:
        try:
            fn()
            print(f"PASS {fn.__name__}")
        except Exception:  # noqa: BLE001  (report every check)
            failed += 1
            print(f"FAIL {fn.__name__}\n{traceback.format_exc(limit=4)}")
    print(f"fallback ops: {torch_pjrt.fallback_ops() or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
