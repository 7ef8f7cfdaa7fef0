"""DDP training-step time of the char GPT from 1 to 4 processes (weak scaling: a fixed batch
per process), on pjrt (XLA path and host-staged path) and, as the peer, torch CPU tensors
over gloo, each launched with torchrun.

    python benchmarks/distributed_ddp.py [--nprocs 1 2 4] [--steps 12] [--bucket-cap-mb 25]

prints a markdown table of the median step time (forward, backward with bucketed
gradient all-reduce, AdamW) on rank 0. The model's gradients are 0.4 MiB: DDP's default
25 MiB cap makes one bucket, reduced after the whole backward pass; `--bucket-cap-mb 0.1`
makes five, whose all-reduces can overlap the rest of the backward pass. On a machine with fewer cores than processes the
processes share cores, so the times measure contention as much as communication.
"""
from __future__ import annotations

import argparse
import os
import time

from distributed_torchrun import report_median, torchrun_json

CONFIGS = {  # name: (device, extra environment)
    "pjrt, XLA path": ("pjrt", {}),
    "pjrt, host-staged path": ("pjrt", {"TORCH_PJRT_COLLECTIVES": "host"}),
    "torch CPU, gloo": ("cpu", {}),
}
MODEL = dict(n_layer=2, n_embd=64, n_head=4, block_size=32)
BATCH_PER_PROCESS = 8


def worker(device: str, steps: int, bucket_cap_mb: float) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_pjrt.tools.demo_models import gpt_setup

    dist.init_process_group("pjrt" if device == "pjrt" else "gloo")
    data, model, _ = gpt_setup(device, seed=0, **MODEL)
    model = DDP(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(steps):
        x, y = data.batch(g, BATCH_PER_PROCESS, MODEL["block_size"])
        start = time.perf_counter()
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        float(loss)  # waits for the step
        times.append(time.perf_counter() - start)
    report_median(times, warmup=2)
    dist.destroy_process_group()


def run(nproc: int, steps: int, bucket_cap_mb: float, device: str, env: dict) -> float:
    args = ["--worker", device, "--steps", str(steps), "--bucket-cap-mb", str(bucket_cap_mb)]
    return torchrun_json(__file__, nproc, args, env)[0]["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["pjrt", "cpu"])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (torch's default: 25)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.bucket_cap_mb)
        return
    print(f"DDP step, char GPT {MODEL}, batch {BATCH_PER_PROCESS} per process, bucket_cap_mb {args.bucket_cap_mb}, "
          f"load: {os.getloadavg()[0]:.1f}\n")
    print("| processes | " + " | ".join(f"{name} (ms)" for name in CONFIGS) + " |")
    print("|---" * (len(CONFIGS) + 1) + "|")
    for n in args.nprocs:
        cells = [f"{run(n, args.steps, args.bucket_cap_mb, device, env) * 1e3:.1f}" for device, env in CONFIGS.values()]
        print(f"| {n} | " + " | ".join(cells) + f" |  (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
