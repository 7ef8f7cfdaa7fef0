"""Pipeline, context and multi-dimensional parallelism on pjrt against a reference: one
process training the full model on the full batch, or unsharded attention."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from tests.distributed.common import case, check_equal, init, pjrt

PP_STEPS, PP_BATCH, PP_MICROBATCHES, PP_WIDTH = 3, 8, 4, 16


class Stack(nn.Module):
    """`layers` Linear+Tanh layers; with `split_every`, a pipe_split() marker after every
    that many layers (the tracing frontend's stage boundaries)."""

    def __init__(self, layers: int, split_every: int = 0):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(PP_WIDTH, PP_WIDTH), nn.Tanh()) for _ in range(layers))
        self.split_every = split_every

    def forward(self, x):
        from torch.distributed.pipelining import pipe_split

        for i, layer in enumerate(self.layers):
            if self.split_every and i and i % self.split_every == 0:
                pipe_split()
            x = layer(x)
        return x


def _pp_data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(PP_BATCH, PP_WIDTH, generator=g), torch.randn(PP_BATCH, PP_WIDTH, generator=g))
            for _ in range(PP_STEPS)]


def _pp_reference(layers: int):
    """One process, the whole model, the full batch: (losses, final parameters by name)."""
    torch.manual_seed(0)
    model = Stack(layers).to(pjrt())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in _pp_data():
        loss = nn.functional.mse_loss(model(x.to(pjrt())), y.to(pjrt()))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _stage_module(full: Stack, first: int, count: int) -> nn.Module:
    """Layers first .. first+count-1 of `full` as one stage, keeping their names."""
    stage = copy.deepcopy(full)
    stage.layers = nn.ModuleList(full.layers[first:first + count])
    stage.split_every = 0
    return stage


def _pp_train(schedule_name: str, stages_per_rank: int, frontend: str) -> dict:
    """Train a pipelined Stack (2 layers per stage) on this group; returns losses (last stage) and parameters."""
    from torch.distributed import pipelining

    rank, world = dist.get_rank(), dist.get_world_size()
    n_stages = world * stages_per_rank
    per_stage = 2
    torch.manual_seed(0)
    full = Stack(n_stages * per_stage, split_every=per_stage).to(pjrt())
    mine = [rank + world * k for k in range(stages_per_rank)]  # interleaved: stage s on rank s % world
    if frontend == "pipeline":
        x0 = torch.zeros(PP_BATCH // PP_MICROBATCHES, PP_WIDTH, device=pjrt())
        pipe = pipelining.pipeline(full, mb_args=(x0,))
        stages = [pipe.build_stage(s, pjrt()) for s in mine]
        modules = [pipe.get_stage_module(s) for s in mine]
    else:  # manual split; "compiled": each stage's module under torch.compile(backend="pjrt")
        modules = [_stage_module(full, s * per_stage, per_stage) for s in mine]
        run = [torch.compile(m, backend="pjrt") if frontend == "compiled" else m for m in modules]
        stages = [pipelining.PipelineStage(m, s, n_stages, pjrt()) for m, s in zip(run, mine)]
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    schedule_class = getattr(pipelining, schedule_name)
    loss_fn = nn.functional.mse_loss
    if stages_per_rank == 1:
        schedule = schedule_class(stages[0], PP_MICROBATCHES, loss_fn=loss_fn)
    else:
        schedule = schedule_class(stages, PP_MICROBATCHES, loss_fn=loss_fn)
    last = (n_stages - 1) in mine
    losses = []
    for x, y in _pp_data():
        opt.zero_grad()
        microbatch_losses = []
        if rank == 0:
            schedule.step(x.to(pjrt()), target=y.to(pjrt()) if last else None, losses=microbatch_losses)
        elif last:
            schedule.step(target=y.to(pjrt()), losses=microbatch_losses)
        else:
            schedule.step()
        opt.step()
        if last:
            losses.append(float(torch.stack(microbatch_losses).mean()))
    state = {}
    for s, m in zip(mine, modules):
        for name, value in m.state_dict().items():
            index, rest = _layer_index(name, frontend)
            state[f"layers.{s * per_stage + index}.{rest}"] = value.detach().cpu()
    return {"losses": losses, "state": state}


def _layer_index(name: str, frontend: str) -> tuple[int, str]:
    """(index within the stage, the rest) of a stage module's parameter name."""
    parts = name.split(".")
    if frontend == "pipeline":  # the traced stage keeps the full model's names: layers.<global index>...
        return int(parts[1]) % 2, ".".join(parts[2:])
    return int(parts[1]), ".".join(parts[2:])


@case
def pipeline(*schedules: str) -> dict:
    """Each "Schedule:stages_per_rank:frontend" trains the same Stack; losses and parameters
    equal one process training the whole model on the full batch."""
    import time

    init()
    result = {}
    for spec in schedules:
        start = time.monotonic()
        schedule_name, stages_per_rank, frontend = spec.split(":")
        stages_per_rank = int(stages_per_rank)
        run = _pp_train(schedule_name, stages_per_rank, frontend)
        ref_losses, ref_state = _pp_reference(dist.get_world_size() * stages_per_rank * 2)
        if run["losses"]:
            check_equal(f"{spec} losses", torch.tensor(run["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
        for name, value in run["state"].items():
            check_equal(f"{spec} parameter {name}", value, ref_state[name], rtol=1e-5, atol=1e-6)
        result[spec] = [run["losses"], time.monotonic() - start]
    return result


@case
def context_parallel() -> dict:
    """Ring attention over the sequence dimension (torch's context_parallel on a pjrt
    DeviceMesh): outputs and q/k/v gradients equal unsharded SDPA, causal and not."""
    init()
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, context_parallel_unshard

    n = dist.get_world_size()
    mesh = init_device_mesh("pjrt", (n,))
    g = torch.Generator().manual_seed(0)
    # each rank's block of queries (half of it with causal load balancing) a multiple of 32: the
    # efficient-attention op's logsumexp is padded to one (torch's meta kernel), as on CUDA
    batch, heads, seq, dim = 1, 2, 64 * n, 16
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=g) for _ in range(3))
    grad = torch.randn(batch, heads, seq, dim, generator=g)
    for is_causal in (False, True):
        _cp_options.enable_load_balance = is_causal  # torch's round-robin sharding serves causal attention only
        ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref_out = F.scaled_dot_product_attention(*ref, is_causal=is_causal)
        ref_out.backward(grad)
        cp = [t.to(pjrt()) for t in (q, k, v)]
        cp_grad = grad.to(pjrt())
        with context_parallel(mesh, buffers=[*cp, cp_grad], buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(cp)):
            for t in cp:
                t.requires_grad_(True)
            out = F.scaled_dot_product_attention(*cp, is_causal=is_causal)
            out.backward(cp_grad)
        full = context_parallel_unshard(mesh, [out.detach(), *(t.grad for t in cp)], [2, 2, 2, 2])
        what = f"context parallel SDPA (causal={is_causal})"
        check_equal(f"{what} output", full[0], ref_out.detach(), rtol=1e-5, atol=1e-5)
        for name, actual, t in zip("qkv", full[1:], ref):
            check_equal(f"{what} gradient of {name}", actual, t.grad, rtol=1e-4, atol=1e-5)
    return {}
