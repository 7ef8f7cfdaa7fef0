"""all_reduce bandwidth by message size on pjrt: the XLA path, the host-staged path, and
torch's gloo on CPU tensors (the peer), each launched with torchrun.

    python benchmarks/distributed_allreduce.py [--nproc 2] [--reps 20]

prints a markdown table. Each configuration is one `torchrun --standalone` job running
this file with --worker; rank 0 prints one JSON line per message size. Bandwidth is the
algorithm bandwidth (message bytes / time per all_reduce), median of --reps calls after
warm-up, every call waited for.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from distributed_torchrun import torchrun_json

SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 24]  # bytes of float32
CONFIGS = {  # name: (tensor device, extra environment)
    "pjrt, XLA path": ("pjrt", {}),
    "pjrt, XLA path, no shape checks": ("pjrt", {"TORCH_PJRT_COLLECTIVE_CHECKS": "0"}),
    "pjrt, host-staged path": ("pjrt", {"TORCH_PJRT_COLLECTIVES": "host"}),
    "torch CPU tensors, gloo": ("cpu", {}),
}


def worker(device: str, reps: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("pjrt" if device == "pjrt" else "gloo")
    for size in SIZES:
        t = torch.ones(size // 4, device=device)
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(reps):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            if device == "pjrt":
                torch.pjrt.synchronize()
            times.append(time.perf_counter() - start)
        times.sort()
        if dist.get_rank() == 0:
            print(json.dumps({"bytes": size, "seconds": times[len(times) // 2]}), flush=True)
    dist.destroy_process_group()


def run(nproc: int, reps: int, device: str, env: dict) -> dict[int, float]:
    rows = torchrun_json(__file__, nproc, ["--worker", device, "--reps", str(reps)], env)
    return {r["bytes"]: r["seconds"] for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["pjrt", "cpu"])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.reps)
        return
    results = {name: run(args.nproc, args.reps, device, env) for name, (device, env) in CONFIGS.items()}
    print(f"all_reduce (sum, float32), {args.nproc} processes, load: {os.getloadavg()[0]:.1f}\n")
    print("| message | " + " | ".join(f"{name} (us, MB/s)" for name in results) + " |")
    print("|---" * (len(results) + 1) + "|")
    for size in SIZES:
        cells = [f"{r[size] * 1e6:.0f}, {size / r[size] / 1e6:.0f}" for r in results.values()]
        print(f"| {size // 1024} KiB | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
