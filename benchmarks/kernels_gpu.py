"""Shipped kernels on an NVIDIA Hopper GPU (H100/H200): Pallas (native Triton lowering) against
the op-table lowering and against torch's own CUDA kernels, in the same run.

    TORCH_PJRT_PLATFORM=gpu python benchmarks/kernels_gpu.py [--quick] [--out results/kernels_gpu]

Needs a CUDA build of torch (2.11+) and jax[cuda] (0.11+) in one environment. Both share the
GPU: JAX is told not to preallocate. Writes <out>.json and <out>.md; paste the markdown
into docs/benchmarks.md under "Custom kernels".

Peers, each forward + backward, median of --runs:
  kernel       the Pallas kernel through the op (autotuned block sizes: TORCH_PJRT_AUTOTUNE
               defaults to on for GPUs; the tuning runs during warmup)
  reference    the pure-JAX reference with jax.vjp, jitted (XLA's own fusion)
  lowering     the torch computation on pjrt, torch.compile(backend="pjrt")
  torch cuda   torch eager on CUDA tensors (F.rms_norm, SDPA (flash), F.cross_entropy,
               torch._grouped_mm), and the same under torch.compile (inductor)
  (lowering keeps SDPA on the math path and runs grouped matmul as one matmul per expert;
  kernel_cpu.py's torch_step does that)
Workload shapes are benchmarks/kernels_cpu.py's "full" set, in bfloat16.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TORCH_PJRT_PLATFORM", "gpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch's CUDA kernels need memory too

import jax  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import kernels_cpu as common  # noqa: E402  (workloads, timing, the JAX and torch steps)


def _torch_grouped_mm(a, b, offs):
    return torch._grouped_mm(a, b, offs)


def _cuda_sync_step(step):
    def run():
        step()
        torch.cuda.synchronize()
    return run


def measure(size: str, runs: int) -> list[dict]:
    import torch_pjrt  # noqa: F401
    from torch_pjrt.kernels.op import _pjrt_device

    device = _pjrt_device()
    rows = []
    for name, (kernel, args, fn) in common.workloads(size, torch.bfloat16).items():
        row = {"workload": name, "dtype": "bfloat16"}
        row["kernel_s"] = common.median_time(common.jax_step(kernel, args, False, device), runs, warmup=3)
        row["reference_s"] = common.median_time(common.jax_step(kernel, args, True, device), runs)
        row["lowering_s"] = common.median_time(common.torch_step(fn, args, "pjrt", compiled=True), runs)
        cuda_fn = _torch_grouped_mm if name.startswith("grouped_mm") else fn  # torch's own grouped GEMM on CUDA
        row["torch_cuda_s"] = common.median_time(
            _cuda_sync_step(common.torch_step(cuda_fn, args, "cuda", compiled=False)), runs)
        try:
            inductor = common.torch_step(torch.compile(cuda_fn), args, "cuda", compiled=False)
            row["inductor_s"] = common.median_time(_cuda_sync_step(inductor), runs)
        except Exception as e:  # noqa: BLE001  (inductor may not handle every op, e.g. _grouped_mm on older torch)
            row["inductor_s"] = float("nan")
            row["inductor_error"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(row)
        print(f"  measured {name}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", default="kernels_gpu")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernels_gpu.py: torch sees no CUDA device (install a CUDA build of torch)")
    gpu = torch.cuda.get_device_name(0)
    rows = measure("quick" if args.quick else "full", args.runs)
    peers = ("kernel", "reference", "lowering", "torch_cuda", "inductor")
    table = common.markdown(rows, peers=peers, base="lowering")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    meta = {"gpu": gpu, "nvidia_smi": smi, "jax": jax.__version__, "torch": torch.__version__}
    with open(args.out + ".json", "w") as f:
        json.dump({"rows": rows, **meta}, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"{gpu}; jax {jax.__version__}, torch {torch.__version__}\n\n{table}\n")
    print(table)
    print(f"\nwrote {args.out}.json and {args.out}.md ({meta})")


if __name__ == "__main__":
    main()
