"""A compiled tensor-parallel step with its collectives in the graph: torch.compile(backend="pjrt")
with XLA collectives (one SPMD program per graph) against the same graphs with host-callback
collectives, eager pjrt, and the peers torch CPU eager and inductor over gloo, each launched
with torchrun.

    python benchmarks/distributed_compiled.py [--nproc 2] [--steps 20]

The step: a Megatron-style MLP block (ColwiseParallel up, RowwiseParallel down, so one
all-reduce forward and one backward), forward, backward, loss read on the host. Prints a
markdown table of the median step time on rank 0.
"""
from __future__ import annotations

import argparse
import os
import time

from distributed_torchrun import report_median, torchrun_json

CONFIGS = {  # name: (device, compile backend or None, extra environment)
    "pjrt, compiled, XLA collectives in the graph": ("pjrt", "pjrt", {}),
    "pjrt, compiled, XLA collectives, checks off": ("pjrt", "pjrt", {"TORCH_PJRT_COLLECTIVE_CHECKS": "0"}),
    "pjrt, compiled, host-callback collectives": ("pjrt", "pjrt", {"TORCH_PJRT_COLLECTIVES": "host"}),
    "pjrt, eager": ("pjrt", None, {}),
    "torch CPU, eager, gloo": ("cpu", None, {}),
    "torch CPU, inductor, gloo": ("cpu", "inductor", {}),
}
WIDTH, HIDDEN, TOKENS = 256, 1024, 512


def worker(device: str, backend: str | None, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dist.init_process_group("pjrt" if device == "pjrt" else "gloo")
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    torch.manual_seed(0)
    block = torch.nn.Sequential()
    block.add_module("up", torch.nn.Linear(WIDTH, HIDDEN))
    block.add_module("act", torch.nn.GELU())
    block.add_module("down", torch.nn.Linear(HIDDEN, WIDTH))
    block = block.to(device)
    parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    step_block = torch.compile(block, backend=backend) if backend else block
    x = torch.randn(TOKENS, WIDTH, device=device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step_block(x).square().mean()
        loss.backward()
        float(loss)  # waits for the step
        times.append(time.perf_counter() - start)
    report_median(times, warmup=3)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["pjrt", "cpu"])
    parser.add_argument("--backend", default="")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.backend or None, args.steps)
        return
    print(f"compiled TP MLP step ({TOKENS}x{WIDTH} -> {HIDDEN} -> {WIDTH}), {args.nproc} processes, "
          f"load {os.getloadavg()[0]:.1f}\n")
    print("| configuration | step (ms) |\n|---|---|")
    for name, (device, backend, env) in CONFIGS.items():
        try:
            rows = torchrun_json(__file__, args.nproc, ["--worker", device, "--backend", backend or "",
                                                        "--steps", str(args.steps)], env)
            cell = f"{rows[0]['seconds'] * 1e3:.2f}"
        except RuntimeError as e:  # a peer that does not run here is reported, not fatal
            cell = f"fails: {str(e).strip().splitlines()[-1][:120]}"
        print(f"| {name} | {cell} |", flush=True)


if __name__ == "__main__":
    main()
