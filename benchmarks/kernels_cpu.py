"""Shipped kernels against the plain op-table lowering on the CPU, in the same run.

    TORCH_PJRT_PLATFORM=cpu python benchmarks/kernels_cpu.py [--quick] [--json out.json]

Each workload is timed forward + backward (one training use), median of --runs after warmup:
  kernel     the Pallas kernel, jitted in JAX (on the CPU: Pallas *interpret* mode, which
             emulates the grid with loops and dynamic slices; it says nothing about GPU or
             TPU speed and is expected to lose)
  reference  the kernel's pure-JAX reference with jax.vjp, jitted: what the CPU should run
  lowering   the same computation written in torch ops on pjrt tensors, compiled with
             torch.compile(backend="pjrt") (the op table's lowerings in one executable;
             SDPA forced onto its math path, grouped matmul as one matmul per expert)
  torch cpu  torch's own CPU kernels, eager (a peer, not a target)
Ratios are against `lowering`; below 1 is faster. Peers run in one process, in turn.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_pjrt  # noqa: E402,F401
from torch_pjrt import kernels  # noqa: E402
from torch_pjrt.runtime import storage  # noqa: E402
from torch_pjrt.kernels.attention import flash_attention_kernel  # noqa: E402
from torch_pjrt.kernels.cross_entropy import softmax_cross_entropy_kernel  # noqa: E402
from torch_pjrt.kernels.op import _reference_vjp  # noqa: E402


# ------------------------------------------------------------------ workloads: (kernel, args, torch function)
def _grouped_loop(a, b, offs):
    """What a model without a grouped matmul writes: one matmul per expert."""
    bounds = [0] + offs.tolist()
    return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(bounds, bounds[1:]))])


def workloads(size: str, dtype: torch.dtype) -> dict:
    """name -> (Kernel, args (torch, CPU), torch function of the same args giving the kernel's first output)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    big = size == "full"
    n, d = (4096, 1024) if big else (1024, 512)
    b, h, hk, l, hd = (1, 8, 2, 1024, 64) if big else (1, 4, 2, 256, 64)
    rows, vocab = (2048, 8192) if big else (512, 4096)
    m, k, nn, groups = (4096, 512, 512, 8) if big else (1024, 256, 256, 4)
    offs = torch.linspace(0, m, groups + 1)[1:].round().to(torch.int32)
    return {
        "rms_norm": (kernels.rms_norm, (r(n, d), r(d), 1e-6), lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps)),
        "flash_attention (causal, GQA)": (
            flash_attention_kernel, (r(b, h, l, hd), r(b, hk, l, hd), r(b, hk, l, hd), True),
            lambda q, k_, v, c: F.scaled_dot_product_attention(q, k_, v, is_causal=c, enable_gqa=True)),
        "softmax_cross_entropy": (
            softmax_cross_entropy_kernel, (r(rows, vocab), torch.randint(0, vocab, (rows,), generator=g), -100),
            lambda x, t, ignore: F.cross_entropy(x, t, ignore_index=ignore, reduction="none")),
        "grouped_mm (MoE)": (kernels.grouped_mm, (r(m, k), r(groups, k, nn) * k ** -0.5, offs), _grouped_loop),
    }


# ------------------------------------------------------------------ timing
def median_time(fn, runs: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _jax_args(args, device):
    return [jax.device_put(storage.to_numpy(a), device) if isinstance(a, torch.Tensor) else a for a in args]


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _cotangents(outputs):
    return tuple(jnp.ones_like(o) for o in outputs)


def jax_step(kernel, args, use_reference: bool, device):
    """Jitted forward + backward of the kernel (or its reference) on JAX arrays."""
    arrays = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    values = _jax_args(args, device)
    static = {i: v for i, v in enumerate(values) if i not in arrays}

    def full(xs):
        out = dict(static)
        out.update(zip(arrays, xs))
        return [out[i] for i in range(len(values))]

    if use_reference:
        def step(*xs):
            out = kernel.reference(*full(xs))
            return out, _reference_vjp(kernel.reference, full(xs), {}, arrays, _cotangents(_as_tuple(out)))
    else:
        def step(*xs):
            out = kernel.jax_forward(*full(xs))
            return out, kernel.jax_backward(tuple(full(xs)), {}, _as_tuple(out), _cotangents(_as_tuple(out)))

    compiled = jax.jit(step)
    inputs = [values[i] for i in arrays]
    return lambda: jax.block_until_ready(compiled(*inputs))


def torch_step(fn, args, device: str, compiled: bool):
    """Forward + backward of a torch function, on pjrt compiled by the pjrt backend or eager elsewhere.
    On pjrt, SDPA is kept on the op table's math path (the flash kernel is what `kernel` measures)."""
    tensors = [a.to(device).requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a for a in args]
    leaves = [t for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad]

    def loss(*xs):
        return fn(*xs).float().sum()

    run = torch.compile(loss, backend="pjrt") if compiled else loss

    def step():
        for t in leaves:
            t.grad = None
        if device.startswith("pjrt"):
            os.environ["TORCH_PJRT_FLASH_SDPA"] = "0"  # read when SDPA picks its backend (at trace time here)
            try:
                run(*tensors).backward()
            finally:
                os.environ.pop("TORCH_PJRT_FLASH_SDPA")
            torch.pjrt.synchronize()
        else:
            run(*tensors).backward()
    return step


def measure(size: str, dtype: torch.dtype, runs: int) -> list[dict]:
    from torch_pjrt.kernels.platforms import host_device

    device = host_device()
    rows = []
    for name, (kernel, args, fn) in workloads(size, dtype).items():
        row = {"workload": name, "dtype": str(dtype).replace("torch.", "")}
        row["kernel_s"] = median_time(jax_step(kernel, args, False, device), runs)
        row["reference_s"] = median_time(jax_step(kernel, args, True, device), runs)
        row["lowering_s"] = median_time(torch_step(fn, args, "pjrt", compiled=True), runs)
        row["torch_cpu_s"] = median_time(torch_step(fn, args, "cpu", compiled=False), runs)
        rows.append(row)
        print(f"  measured {name}", flush=True)
    return rows


def markdown(rows: list[dict], peers=("kernel", "reference", "lowering", "torch_cpu"), base="lowering") -> str:
    head = "| workload | dtype | " + " | ".join(f"{p} ms" for p in peers) + " | " + \
        " | ".join(f"{p}/{base}" for p in peers if p != base) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(peers) - 1)]
    for r in rows:
        ms = " | ".join(f"{r[p + '_s'] * 1e3:.2f}" for p in peers)
        ratios = " | ".join(f"{r[p + '_s'] / r[base + '_s']:.2f}x" for p in peers if p != base)
        lines.append(f"| {r['workload']} | {r['dtype']} | {ms} | {ratios} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer runs")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 7)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"load before: {load}", flush=True)
    rows = measure("quick" if args.quick else "full", torch.float32, runs)
    after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(markdown(rows))
    print(f"\nload after: {after}\njax {jax.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "load_before": load, "load_after": after}, f, indent=1)


if __name__ == "__main__":
    main()
