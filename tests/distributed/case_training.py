"""Parallel training on pjrt against a reference: DDP and FSDP2 against single-process
training on the full batch, mixed-precision FSDP2 against the same on CPU over gloo, TP
against the unsharded module, and a distributed checkpoint saved by 4 ranks, loaded by 2."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from tests.distributed.common import case, check_equal, init, pjrt
from torch_pjrt.tools.demo_models import CharData, gpt_setup

STEPS, BATCH = 3, 8
_MODEL = dict(n_layer=2, n_embd=32, n_head=2, block_size=16)


def _batches(data: CharData, steps: int):
    g = torch.Generator().manual_seed(1)
    return [data.batch(g, BATCH, _MODEL["block_size"]) for _ in range(steps)]


def _train(model, opt, batches, device, shard: slice | None = None) -> list[float]:
    """AdamW steps on each batch (or this rank's `shard` of it); returns the losses."""
    losses = []
    for x, y in batches:
        if shard is not None:
            x, y = x[shard], y[shard]
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v) for v in torch.stack(losses).cpu()]


def _my_rows() -> slice:
    per = BATCH // dist.get_world_size()
    return slice(dist.get_rank() * per, (dist.get_rank() + 1) * per)


def _full_batch_reference(device):
    """Single-process training on the full batches: the result data parallelism must reproduce."""
    data, model, opt = gpt_setup(device, seed=0, **_MODEL)
    _train(model, opt, _batches(data, STEPS), device)
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


@case
def ddp() -> dict:
    init()
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    reference = _full_batch_reference(pjrt())
    buckets: list[int] = []

    def counting_hook(group, bucket):  # torch's default all-reduce hook (a future chain), counted
        buckets.append(bucket.index())
        return allreduce_hook(group, bucket)

    for hooked in (False, True):  # c10d's built-in all-reduce, then the Python comm-hook path
        data, model, _ = gpt_setup(pjrt(), seed=0, **_MODEL)
        # a small bucket cap: several gradient buckets, each all-reduced as soon as it is ready
        ddp_model = DDP(model, bucket_cap_mb=0.02)
        if hooked:
            ddp_model.register_comm_hook(None, counting_hook)
        opt = torch.optim.AdamW(ddp_model.parameters(), lr=1e-3, weight_decay=0.01)
        _train(ddp_model, opt, _batches(data, STEPS), pjrt(), _my_rows())
        for name, value in model.state_dict().items():
            check_equal(f"DDP{' with comm hook' if hooked else ''} parameter {name}", value, reference[name],
                        rtol=1e-4, atol=1e-5)
    return {"buckets": max(buckets) + 1}


def _fully_shard(model, mesh, mp=None):
    from torch.distributed.fsdp import fully_shard

    kwargs = {"mesh": mesh} | ({"mp_policy": mp} if mp is not None else {})
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _full_state(model) -> dict:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu() for k, v in model.state_dict().items()}


@case
def fsdp() -> dict:
    init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    n = dist.get_world_size()
    data, model, _ = gpt_setup(pjrt(), seed=0, **_MODEL)
    _fully_shard(model, init_device_mesh("pjrt", (n,)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    _train(model, opt, _batches(data, STEPS), pjrt(), _my_rows())
    reference = _full_batch_reference(pjrt())
    for name, value in _full_state(model).items():
        check_equal(f"FSDP2 parameter {name}", value, reference[name], rtol=1e-4, atol=1e-5)

    # mixed precision (bf16 compute, fp32 gradient reduction): the same FSDP2 run on CPU over gloo is the reference
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    losses = {}
    for device in ("pjrt", "cpu"):
        mesh = init_device_mesh("pjrt", (n,)) if device == "pjrt" else _gloo_mesh()
        dev = pjrt() if device == "pjrt" else torch.device("cpu")
        data, model, _ = gpt_setup(dev, seed=0, **_MODEL)
        _fully_shard(model, mesh, mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        losses[device] = _train(model, opt, _batches(data, STEPS), dev, _my_rows())
    check_equal("FSDP2 bf16 mixed precision losses", torch.tensor(losses["pjrt"]), torch.tensor(losses["cpu"]),
                rtol=2e-2, atol=2e-2)
    return {"losses": losses}


def _gloo_mesh():
    """A 1-d CPU DeviceMesh over a gloo group (the reference's collectives)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")


class MLPBlock(nn.Module):
    """A transformer block's MLP half (without the residual, which would need DTensor inputs)."""

    def __init__(self, d: int = 16, hidden: int = 64):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(self.act(self.up(self.norm(x))))


@case
def tensor_parallel() -> dict:
    init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    n = dist.get_world_size()
    mesh = init_device_mesh("pjrt", (n,))
    torch.manual_seed(0)
    reference = MLPBlock()
    x = torch.randn(2, 4 * n, 16)  # (batch, sequence, features), the same on every rank
    x.requires_grad_(True)
    ref_out = reference(x)
    ref_out.square().sum().backward()

    # DTensor basics: shard, redistribute, gather back
    d = distribute_tensor(x.detach().to(pjrt()), mesh, [Shard(1)])
    check_equal("DTensor Shard(1) -> full_tensor", d.full_tensor(), x.detach())
    check_equal("DTensor redistribute Shard(1) -> Replicate", d.redistribute(mesh, [Replicate()]).to_local(), x.detach())

    # Megatron-style MLP with sequence parallel norm: colwise up, rowwise down
    block = copy.deepcopy(reference).to(pjrt())
    parallelize_module(block, mesh, {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    })
    mine = x.detach().to(pjrt())
    rows = x.shape[1] // n
    local_in = mine[:, dist.get_rank() * rows:(dist.get_rank() + 1) * rows].clone().requires_grad_(True)
    out = block(local_in)  # this rank's rows of the sequence
    out.square().sum().backward()
    check_equal("TP MLP output", out.full_tensor(), ref_out.detach(), rtol=1e-5, atol=1e-5)
    for (name, p), (_, p_ref) in zip(block.named_parameters(), reference.named_parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        check_equal(f"TP gradient of {name}", grad, p_ref.grad, rtol=1e-4, atol=1e-5)

    # the same TP block under torch.compile(backend="pjrt"): the process group is a static graph input
    compiled_block = copy.deepcopy(reference).to(pjrt())
    parallelize_module(compiled_block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    compiled = torch.compile(compiled_block, backend="pjrt")
    compiled_in = x.detach().to(pjrt()).requires_grad_(True)
    out = compiled(compiled_in)
    check_equal("compiled TP MLP output", out, ref_out.detach(), rtol=1e-5, atol=1e-5)
    out.square().sum().backward()
    check_equal("compiled TP MLP input gradient", compiled_in.grad, x.grad, rtol=1e-4, atol=1e-5)
    for (name, p), (_, p_ref) in zip(compiled_block.named_parameters(), reference.named_parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        check_equal(f"compiled TP gradient of {name}", grad, p_ref.grad, rtol=1e-4, atol=1e-5)
    import torch_pjrt

    return {"compiled_collectives": [g["path"] for g in torch_pjrt.compile_stats()["collective_graphs"]]}


def _checkpointed_state(device) -> dict:
    """The state the checkpoint cases save: the char GPT's weights, drawn from a fixed seed."""
    _, model, _ = gpt_setup(device, seed=0, **_MODEL)
    return model.state_dict()


def _sharded(state: dict, mesh) -> dict:
    """Row-sharded DTensors (Shard(0)) of every tensor: the checkpoint holds each rank's shard."""
    from torch.distributed.tensor import Shard, distribute_tensor

    return {k: distribute_tensor(v.detach(), mesh, [Shard(0)]) for k, v in state.items()}


@case
def dcp_save(directory: str) -> dict:
    """4 ranks save a sharded state dict of pjrt DTensors."""
    init()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("pjrt", (dist.get_world_size(),))
    dcp.save(_sharded(_checkpointed_state(pjrt()), mesh), checkpoint_id=directory)
    return {}


@case
def dcp_load(directory: str) -> dict:
    """2 ranks load the 4-rank checkpoint into differently sharded DTensors; the full tensors equal the saved ones."""
    init()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("pjrt", (dist.get_world_size(),))
    expected = _checkpointed_state("cpu")
    state = _sharded({k: torch.zeros_like(v) for k, v in _checkpointed_state(pjrt()).items()}, mesh)
    dcp.load(state, checkpoint_id=directory)
    for name, value in state.items():
        check_equal(f"DCP loaded {name}", value.full_tensor(), expected[name])
    return {}


def _ddp_with_a_late_peer(hooked: bool, store) -> dict:
    """DDP training on pjrt where, in the third step, every rank but 0 joins bucket 0's
    all-reduce only once rank 0 has issued every bucket's all-reduce: so rank 0's backward
    pass must go on while bucket 0 is pending (a get_future() that waited would wait for
    a peer that waits for it). Returns what rank 0 saw and the parameters."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_pjrt.distributed.backend import ProcessGroupPjrt
    from torch_pjrt.distributed.work import PjrtWork

    rank, late_step = dist.get_rank(), 2  # DDP rebuilds its buckets after the first step
    seen = {"step": 0, "calls": [0] * (STEPS + 1), "futures": [], "first_pending": None}
    allreduce, get_future = ProcessGroupPjrt.allreduce, PjrtWork.get_future

    def counted_allreduce(self, tensors, opts=None):  # DDP's reducer and the hook both end here
        step = seen["step"]
        seen["calls"][step] += 1
        if step == late_step and rank != 0 and seen["calls"][step] == 1:
            store.wait([f"issued-{hooked}"])
        work = allreduce(self, tensors, opts)
        if step == late_step and rank == 0 and seen["calls"][step] == seen["calls"][step - 1]:  # the last bucket
            seen["first_pending"] = not seen["futures"][0].done()
            store.set(f"issued-{hooked}", "1")
        return work

    def recorded_get_future(self):
        future = get_future(self)
        if seen["step"] == late_step:
            seen["futures"].append(future)
        return future

    data, model, _ = gpt_setup(pjrt(), seed=0, **_MODEL)
    ddp_model = DDP(model, bucket_cap_mb=0.02)
    if hooked:
        ddp_model.register_comm_hook(None, allreduce_hook)
    opt = torch.optim.AdamW(ddp_model.parameters(), lr=1e-3, weight_decay=0.01)
    ProcessGroupPjrt.allreduce, PjrtWork.get_future = counted_allreduce, recorded_get_future
    try:
        for step, batch in enumerate(_batches(data, STEPS)):
            seen["step"] = step
            _train(ddp_model, opt, [batch], pjrt(), _my_rows())
    finally:
        ProcessGroupPjrt.allreduce, PjrtWork.get_future = allreduce, get_future
    return {"buckets": seen["calls"][late_step], "first_pending": seen["first_pending"], "model": model}


@case
def ddp_overlap() -> dict:
    """DDP's bucket all-reduces overlap the backward pass (built-in all-reduce and the
    Python comm-hook path), and the result still equals full-batch training; then PowerSGD,
    whose future callbacks issue collectives themselves, keeps every rank's model equal."""
    init()
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as DDP

    store = dist.distributed_c10d._get_default_store()
    reference = _full_batch_reference(pjrt())
    result = {"buckets": [], "first_pending": []}
    for hooked in (False, True):
        run = _ddp_with_a_late_peer(hooked, store)
        result["buckets"].append(run["buckets"])
        result["first_pending"].append(run["first_pending"])
        for name, value in run["model"].state_dict().items():
            check_equal(f"DDP{' with comm hook' if hooked else ''} (late peer) parameter {name}", value,
                        reference[name], rtol=1e-4, atol=1e-5)

    data, model, _ = gpt_setup(pjrt(), seed=0, **_MODEL)
    ddp_model = DDP(model, bucket_cap_mb=0.02)
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    ddp_model.register_comm_hook(state, powerSGD.powerSGD_hook)
    opt = torch.optim.AdamW(ddp_model.parameters(), lr=1e-3, weight_decay=0.01)
    _train(ddp_model, opt, _batches(data, STEPS + 2), pjrt(), _my_rows())
    mine = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    for name, value in mine.items():
        check_equal(f"PowerSGD: rank 0's parameter {name}", value, everyone[0][name])
        check_equal(f"PowerSGD: parameter {name} moved", (value - reference[name]).abs().max() > 0, torch.tensor(True))
    return result


@case
def future_later() -> dict:
    """get_future() returns at once: rank 0 launches an all-reduce of a large tensor, takes
    its future and chains a pjrt op to it, and only then lets the other ranks join."""
    init()
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    n = 1 << 20
    t = torch.arange(n, dtype=torch.float32, device=pjrt()) * (rank + 1)
    expected = torch.arange(n, dtype=torch.float32) * sum(range(1, world + 1))
    if rank != 0:
        store.wait(["launched"])
        dist.all_reduce(t)
        check_equal("all_reduce", t, expected)
        return {}
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    doubled = future.then(lambda f: f.value()[0] * 2)  # runs where the future completes
    pending = {"future_done": future.done(), "work_completed": work.is_completed()}
    x = torch.ones(256, 256, device=pjrt())
    busy = (x @ x).sum()  # this thread computes meanwhile
    store.set("launched", "1")
    check_equal("get_future's value", future.wait()[0], expected)
    check_equal("a pjrt op chained to the future", doubled.wait(), expected * 2)
    check_equal("the all_reduce's tensor", t, expected)
    check_equal("work on this thread meanwhile", busy, torch.tensor(256.0 ** 3))
    pending["completed_after"] = work.is_completed() and work.wait() and work.is_success()
    return {"pending": pending}


@case
def future_timeout() -> dict:
    """Rank 1 never joins: rank 0's future completes with the CollectiveError that wait()
    raises, after the group's timeout (5 s), while rank 0 never waits for it."""
    import datetime
    import time

    init(timeout_s=5)
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(4, device=pjrt())
    dist.all_reduce(t)  # everyone is up
    if dist.get_rank() != 0:
        store.wait(["done"], datetime.timedelta(seconds=120))
        return {"peer_failed": True}
    start = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    result = {"done_at_once": future.done()}
    while not future.done() and time.monotonic() - start < 60:
        time.sleep(0.1)
    result["seconds"] = time.monotonic() - start
    errors = []
    for wait in (future.wait, work.wait):
        try:
            wait()
            errors.append(None)
        except Exception as e:  # noqa: BLE001  (the error is the result)
            errors.append(f"{type(e).__name__}: {e}")
    result.update(future_error=errors[0], wait_error=errors[1], completed=work.is_completed(),
                  success=work.is_success())
    store.set("done", "1")
    result["peer_failed"] = True  # the collective is stuck: skip the orderly shutdown
    return result
