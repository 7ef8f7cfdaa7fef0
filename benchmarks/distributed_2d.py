"""A 2-D mesh training step: FSDP2 over "dp" x tensor parallelism over "tp" (2x2, 4
processes under torchrun) on a Llama-style model, on pjrt and, as the peer, the same on
torch CPU tensors over gloo, in the same run.

    python benchmarks/distributed_2d.py [--steps 8] [--dim 128] [--layers 2]

prints a markdown row per configuration: the median step time on rank 0 (forward, backward
with FSDP2's reduce-scatters and TP's all-reduces, AdamW, the loss read on the host) and
the load. With 4 processes on fewer cores the times measure contention as much as
communication.
"""
from __future__ import annotations

import argparse
import os

from distributed_torchrun import timed_steps, torchrun_json

CONFIGS = {"pjrt (XLA path)": "pjrt", "torch CPU, gloo (peer)": "cpu"}
BATCH, SEQ, TP = 8, 64, 2


def worker(device: str, steps: int, dim: int, layers: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch_pjrt.tools.demo_models import Llama, llama_tensor_parallel

    dist.init_process_group("pjrt" if device == "pjrt" else "gloo")
    dp = dist.get_world_size() // TP
    mesh = init_device_mesh(device, (dp, TP), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Llama(vocab=256, dim=dim, heads=4, hidden=4 * dim, layers=layers).to(device)
    llama_tensor_parallel(model, mesh["tp"])
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(mesh["dp"].get_local_rank())
    batches = iter([torch.randint(256, (BATCH // dp, SEQ + 1), generator=g).to(device) for _ in range(steps)])

    def step():
        batch = next(batches)
        loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    timed_steps(step, steps, warmup=2)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["pjrt", "cpu"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.dim, args.layers)
        return
    print(f"FSDP2 x TP step (2x2 mesh, 4 processes), Llama dim {args.dim}, {args.layers} layers, batch {BATCH} x "
          f"{SEQ} tokens, load: {os.getloadavg()[0]:.1f}\n")
    print("| configuration | median step (ms) | load after |")
    print("|---|---|---|")
    for name, device in CONFIGS.items():
        worker_args = ["--worker", device, "--steps", str(args.steps), "--dim", str(args.dim),
                       "--layers", str(args.layers)]
        seconds = torchrun_json(__file__, 4, worker_args, {})[0]["seconds"]
        print(f"| {name} | {seconds * 1e3:.1f} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
