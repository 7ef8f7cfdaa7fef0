"""Pipeline, context and multi-dimensional parallelism on pjrt against a reference: one
process training the full model on the full batch, or unsharded attention."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from tests.distributed.common import case, check_equal, init, pjrt
from torch_pjrt.tools.demo_models import Llama, llama_tensor_parallel

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


def _pp_train(schedule_name: str, stages_per_rank: int, frontend: str, mesh=None) -> dict:
    """Train a pipelined Stack (2 layers per stage) on the default group, or on `mesh`'s "pp"
    dimension with each stage's module under FSDP2 over its "dp" dimension (each dp rank
    training its rows of the batch) and, where the mesh has a "tp" dimension, its two layers
    tensor-parallel over it (column-wise, then row-wise). Returns the losses (last stage: the mean over the
    microbatches and dp ranks) and the full parameters, named as in the whole model."""
    from torch.distributed import pipelining

    group = mesh["pp"].get_group() if mesh is not None else dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    rows = slice(None)
    if mesh is not None:
        per = PP_BATCH // mesh["dp"].size()
        rows = slice(mesh["dp"].get_local_rank() * per, (mesh["dp"].get_local_rank() + 1) * per)
    microbatches = PP_MICROBATCHES if mesh is None else PP_MICROBATCHES // mesh["dp"].size()
    n_stages = world * stages_per_rank
    per_stage = 2
    torch.manual_seed(0)
    full = Stack(n_stages * per_stage, split_every=per_stage).to(pjrt())
    mine = [rank + world * k for k in range(stages_per_rank)]  # interleaved: stage s on rank s % world
    if frontend == "pipeline":
        x0 = torch.zeros(PP_BATCH // PP_MICROBATCHES, PP_WIDTH, device=pjrt())
        pipe = pipelining.pipeline(full, mb_args=(x0,))
        stages = [pipe.build_stage(s, pjrt(), group) for s in mine]
        modules = [pipe.get_stage_module(s) for s in mine]
    else:  # manual split; "compiled": each stage's module under torch.compile(backend="pjrt")
        modules = [_stage_module(full, s * per_stage, per_stage) for s in mine]
        if mesh is not None and "tp" in (mesh.mesh_dim_names or ()):  # each stage's two layers: column, then row
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            for m in modules:
                parallelize_module(m, mesh["tp"], {"layers.0.0": ColwiseParallel(), "layers.1.0": RowwiseParallel()})
        if mesh is not None:
            from torch.distributed.fsdp import fully_shard

            modules = [fully_shard(m, mesh=mesh["dp"]) for m in modules]
        run = [torch.compile(m, backend="pjrt") if frontend == "compiled" else m for m in modules]
        stages = [pipelining.PipelineStage(m, s, n_stages, pjrt(), group=group) for m, s in zip(run, mine)]
    params = [p for m in modules for p in m.parameters()]
    paths_before = dict(group.stats)  # which path the stages' sends and receives take
    opt = torch.optim.SGD(params, lr=0.1)
    schedule_class = getattr(pipelining, schedule_name)
    loss_fn = nn.functional.mse_loss
    schedule = schedule_class(stages[0] if stages_per_rank == 1 else stages, microbatches, loss_fn=loss_fn)
    last = (n_stages - 1) in mine
    losses = []
    for x, y in _pp_data():
        x, y = x[rows].to(pjrt()), y[rows].to(pjrt())
        opt.zero_grad()
        microbatch_losses = []
        if rank == 0:
            schedule.step(x, target=y if last else None, losses=microbatch_losses)
        elif last:
            schedule.step(target=y, losses=microbatch_losses)
        else:
            schedule.step()
        opt.step()
        if last:
            losses.append(torch.stack(microbatch_losses).mean())
    if losses and mesh is not None:
        losses = torch.stack(losses)
        dist.all_reduce(losses, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
    state = {}
    for s, m in zip(mine, modules):
        for name, value in m.state_dict().items():
            index, rest = _layer_index(name, frontend)
            value = value.full_tensor() if hasattr(value, "full_tensor") else value
            state[f"layers.{s * per_stage + index}.{rest}"] = value.detach().cpu()
    return {"losses": [float(v) for v in losses], "state": state,
            "p2p": {k: group.stats[k] - paths_before[k] for k in group.stats}}


def _pp_check(spec: str, run: dict, layers: int) -> None:
    """Losses (where this rank has the last stage) and parameters against one process training the whole model."""
    ref_losses, ref_state = _pp_reference(layers)
    if run["losses"]:
        check_equal(f"{spec} losses", torch.tensor(run["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for name, value in run["state"].items():
        check_equal(f"{spec} parameter {name}", value, ref_state[name], rtol=1e-5, atol=1e-6)


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
        _pp_check(spec, run, dist.get_world_size() * stages_per_rank * 2)
        result[spec] = [run["losses"], time.monotonic() - start, run["p2p"]]
    return result


@case
def context_parallel(*variants: str) -> dict:
    """Ring attention over the sequence dimension (torch's context_parallel on a pjrt
    DeviceMesh): outputs and q/k/v gradients equal unsharded SDPA, causal and not; with
    "compiled", also through torch.compile(backend="pjrt")."""
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
    runs = [(False, False), (True, False)] + ([(True, True)] if "compiled" in variants else [])
    for is_causal, compiled in runs:
        _cp_options.enable_load_balance = is_causal  # torch's round-robin sharding serves causal attention only
        ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref_out = F.scaled_dot_product_attention(*ref, is_causal=is_causal)
        ref_out.backward(grad)
        cp = [t.to(pjrt()) for t in (q, k, v)]
        cp_grad = grad.to(pjrt())

        def attention(*qkv):
            return F.scaled_dot_product_attention(*qkv, is_causal=is_causal)

        run = torch.compile(attention, backend="pjrt") if compiled else attention
        with context_parallel(mesh, buffers=[*cp, cp_grad], buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(cp)):
            for t in cp:
                t.requires_grad_(True)
            out = run(*cp)
            out.backward(cp_grad)
        full = context_parallel_unshard(mesh, [out.detach(), *(t.grad for t in cp)], [2, 2, 2, 2])
        what = f"{'compiled ' if compiled else ''}context parallel SDPA (causal={is_causal})"
        check_equal(f"{what} output", full[0], ref_out.detach(), rtol=1e-5, atol=1e-5)
        for name, actual, t in zip("qkv", full[1:], ref):
            check_equal(f"{what} gradient of {name}", actual, t.grad, rtol=1e-4, atol=1e-5)
    return {}


LLAMA_STEPS, LLAMA_BATCH, LLAMA_SEQ = 3, 8, 16


def _llama_batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(64, (LLAMA_BATCH, LLAMA_SEQ + 1), generator=g) for _ in range(LLAMA_STEPS)]


def _llama_train(model, rows: slice) -> list[float]:
    """AdamW steps on `rows` of each batch; returns the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    losses = []
    for batch in _llama_batches():
        batch = batch[rows].to(pjrt())
        loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


@case
def fsdp_tp(directory: str) -> dict:
    """FSDP2 over "dp" x tensor parallelism over "tp" on a 2-D pjrt DeviceMesh: losses and
    final parameters equal one process training the full model on the full batch. Then the
    2-D sharded model is saved as a distributed checkpoint in `directory` (with the
    reference's parameters beside it, for fsdp_load)."""
    init()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tests.distributed.case_training import _full_state

    tp = 2
    dp = dist.get_world_size() // tp
    mesh = init_device_mesh("pjrt", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    reference = Llama().to(pjrt())
    model = copy.deepcopy(reference)
    ref_losses = [float(v) for v in _llama_train(reference, slice(None))]

    llama_tensor_parallel(model, mesh["tp"])
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    per = LLAMA_BATCH // dp
    dp_rank = mesh["dp"].get_local_rank()
    losses = torch.stack(_llama_train(model, slice(dp_rank * per, (dp_rank + 1) * per)))
    dist.all_reduce(losses, op=dist.ReduceOp.AVG)  # the dp shards' mean loss (tp ranks hold the same)
    check_equal("FSDP2 x TP losses", losses, torch.tensor(ref_losses), rtol=1e-5, atol=1e-5)
    expected = {k: v.detach().cpu() for k, v in reference.state_dict().items()}
    for name, value in _full_state(model).items():
        # AdamW divides by the gradient's running magnitude: an element whose gradient is near
        # zero moves by ~lr whatever its rounding, so a reduction order shows at 1e-5 there
        check_equal(f"FSDP2 x TP parameter {name}", value, expected[name], rtol=1e-4, atol=1e-4)
    dcp.save(model.state_dict(), checkpoint_id=directory)
    if dist.get_rank() == 0:
        torch.save(expected, f"{directory}/expected.pt")
    return {"losses": losses.tolist()}


@case
def fsdp_load(directory: str) -> dict:
    """The FSDP2 x TP checkpoint (2-D mesh, 4 ranks) loaded into the same Llama under FSDP2
    alone on a 1-D mesh of this job's ranks: its full parameters equal the saved ones."""
    init()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tests.distributed.case_training import _full_state

    torch.manual_seed(1)  # other values than the saved ones
    model = Llama().to(pjrt())
    mesh = init_device_mesh("pjrt", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = model.state_dict()
    dcp.load(state, checkpoint_id=directory)
    model.load_state_dict(state)
    expected = torch.load(f"{directory}/expected.pt")
    for name, value in _full_state(model).items():
        check_equal(f"loaded parameter {name}", value, expected[name], rtol=1e-4, atol=1e-4)
    return {}


@case
def fsdp_pp() -> dict:
    """FSDP2 over "dp" x pipeline stages over "pp" (1F1B) on a 2-D pjrt DeviceMesh: losses and
    parameters equal one process training the whole model on the full batch."""
    init()
    from torch.distributed.device_mesh import init_device_mesh

    pp = 2
    mesh = init_device_mesh("pjrt", (pp, dist.get_world_size() // pp), mesh_dim_names=("pp", "dp"))
    run = _pp_train("Schedule1F1B", 1, "manual", mesh)
    _pp_check("FSDP2 x PP (1F1B)", run, pp * 2)
    return {"losses": run["losses"]}


@case
def fsdp_tp_pp() -> dict:
    """The 3-D composition torchtitan uses: pipeline stages over "pp" (1F1B), FSDP2 over "dp" and
    tensor parallelism over "tp" within each stage, on a 2x2x2 pjrt DeviceMesh (8 processes):
    losses and parameters equal one process training the whole model on the full batch."""
    init()
    from torch.distributed.device_mesh import init_device_mesh

    pp, tp = 2, 2
    mesh = init_device_mesh("pjrt", (pp, dist.get_world_size() // (pp * tp), tp), mesh_dim_names=("pp", "dp", "tp"))
    run = _pp_train("Schedule1F1B", 1, "manual", mesh)
    _pp_check("FSDP2 x TP x PP (1F1B)", run, pp * 2)
    return {"losses": run["losses"]}


CP_VOCAB, CP_WIDTH, CP_HEADS, CP_SEQ, CP_BATCH, CP_STEPS = 64, 32, 2, 128, 4, 3


class CausalAttentionLM(nn.Module):
    """Embedding, one causal self-attention block (SDPA) and a head: the smallest model whose
    training runs attention under context parallelism."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(CP_VOCAB, CP_WIDTH)
        self.q, self.k, self.v = (nn.Linear(CP_WIDTH, CP_WIDTH) for _ in range(3))
        self.out = nn.Linear(CP_WIDTH, CP_WIDTH)
        self.head = nn.Linear(CP_WIDTH, CP_VOCAB)

    def forward(self, tokens, targets):
        import torch.nn.functional as F

        x = self.embed(tokens)
        B, T, _ = x.shape
        # heads from the projection's width: a tensor-parallel rank runs its own heads
        q, k, v = (p(x).view(B, T, -1, CP_WIDTH // CP_HEADS).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        logits = self.head(x + self.out(y))
        return F.cross_entropy(logits.reshape(-1, CP_VOCAB), targets.reshape(-1))


def _cp_batches():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(CP_VOCAB, (CP_BATCH, CP_SEQ + 1), generator=g) for _ in range(CP_STEPS)]


def _cp_train(mesh, parallelize, rows: slice, what: str) -> dict:
    """Train CausalAttentionLM with context parallelism over mesh["cp"] (torch's context_parallel
    shards tokens and targets, causal load balancing on, and runs ring attention), after
    `parallelize(model)` (FSDP2, tensor parallelism); each rank trains `rows` of the batch.
    Losses and parameters equal one process training on the full batch and sequence."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options

    from tests.distributed.case_training import _full_state

    torch.manual_seed(0)
    reference = CausalAttentionLM().to(pjrt())
    model = copy.deepcopy(reference)
    # SGD: the keys' bias has a gradient of exactly zero in exact arithmetic (softmax ignores a
    # constant per query), and AdamW would blow its rounding noise up to steps of ~lr
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    ref_losses = []
    for batch in _cp_batches():
        batch = batch.to(pjrt())
        loss = reference(batch[:, :-1], batch[:, 1:])
        ref_opt.zero_grad()
        loss.backward()
        ref_opt.step()
        ref_losses.append(float(loss))

    parallelize(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    _cp_options.enable_load_balance = True  # round-robin blocks: each cp rank's share of causal work is equal
    losses = []
    for batch in _cp_batches():
        batch = batch[rows].to(pjrt())
        tokens, targets = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        with context_parallel(mesh["cp"], buffers=[tokens, targets], buffer_seq_dims=[1, 1],
                              no_restore_buffers={tokens, targets}):
            loss = model(tokens, targets)  # this rank's block of the sequence: its mean loss
            opt.zero_grad()
            loss.backward()
        opt.step()
        losses.append(loss.detach())
    losses = torch.stack(losses)
    dist.all_reduce(losses, op=dist.ReduceOp.AVG)  # equal shards: the mean of the means is the full mean
    check_equal(f"{what} losses", losses, torch.tensor(ref_losses), rtol=1e-5, atol=1e-5)
    expected = {k: v.detach().cpu() for k, v in reference.state_dict().items()}
    for name, value in _full_state(model).items():
        check_equal(f"{what} parameter {name}", value, expected[name], rtol=1e-5, atol=1e-5)
    return {"losses": losses.tolist()}


@case
def fsdp_cp() -> dict:
    """Context parallelism composed with FSDP2, as torchtitan composes them: a 2x2 pjrt mesh
    ("dp", "cp"); each dp rank trains its rows of the batch, each cp rank its block of the
    sequence; FSDP2 shards the parameters over all four ranks, so its gradient reduction
    averages over data and sequence shards alike."""
    init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    cp = 2
    dp = dist.get_world_size() // cp
    mesh = init_device_mesh("pjrt", (dp, cp), mesh_dim_names=("dp", "cp"))
    everyone = init_device_mesh("pjrt", (dist.get_world_size(),))  # FSDP2's shards: dp x cp ranks
    per = CP_BATCH // dp
    rows = slice(mesh["dp"].get_local_rank() * per, (mesh["dp"].get_local_rank() + 1) * per)
    return _cp_train(mesh, lambda model: fully_shard(model, mesh=everyone), rows, "FSDP2 x CP")


@case
def tp_cp() -> dict:
    """Context parallelism composed with tensor parallelism: a 2x2 pjrt mesh ("cp", "tp"); the
    attention's projections column-parallel and its output row-parallel over "tp" (each tp rank
    its heads), ring attention over "cp", FSDP2 over "cp" averaging the sequence blocks'
    gradients (torchtitan's composition without data parallelism)."""
    init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = 2
    mesh = init_device_mesh("pjrt", (dist.get_world_size() // tp, tp), mesh_dim_names=("cp", "tp"))

    def parallelize(model):
        parallelize_module(model, mesh["tp"], {"q": ColwiseParallel(), "k": ColwiseParallel(),
                                               "v": ColwiseParallel(), "out": RowwiseParallel()})
        fully_shard(model, mesh=mesh["cp"])

    return _cp_train(mesh, parallelize, slice(None), "TP x CP")
