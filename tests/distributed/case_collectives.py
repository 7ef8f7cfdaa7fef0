"""Every torch.distributed collective on pjrt tensors against the same call on CPU tensors over gloo."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed import ReduceOp

from tests.distributed.common import case, check_equal, failures, init, pjrt


def _inputs(shape, dtype, salt: int = 0) -> torch.Tensor:
    """Rank-dependent values, exact in every dtype used here."""
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randint(-8, 9, shape, generator=g).to(dtype) / 4
    return torch.randint(1, 9, shape, generator=g).to(dtype)


def compare(name: str, fn, *args, gloo, only_rank: int | None = None, **tol) -> None:
    """Run `fn(*tensors, group)` on pjrt copies (pjrt group) and on CPU copies (gloo group);
    every tensor argument must end up equal. Lists of tensors are compared element-wise."""
    def on(device):
        return [[t.to(device) for t in a] if isinstance(a, list) else a.to(device) for a in args]

    mine, ref = on(pjrt()), on("cpu")
    fn(*mine, None)
    fn(*ref, gloo)
    if only_rank is not None and dist.get_rank() != only_rank:
        return
    for i, (m, r) in enumerate(zip(mine, ref)):
        check_equal(f"{name} (argument {i})", m, r, **tol)


def _avg_reference(t: torch.Tensor, group) -> None:
    dist.all_reduce(t, group=group)  # gloo has no AVG: the reference is the sum over the ranks, divided
    t.div_(dist.get_world_size())


@case
def smoke() -> dict:
    """One all_reduce: what a job launched by torchrun itself sees."""
    init()
    import jax

    # the usual torchrun idiom: this process's device is pjrt:LOCAL_RANK when it sees several
    local = int(os.environ["LOCAL_RANK"]) if torch.pjrt.device_count() > 1 else 0
    t = torch.full((3,), float(dist.get_rank() + 1), device=torch.device("pjrt", local))
    dist.all_reduce(t)
    n = dist.get_world_size()
    check_equal("all_reduce", t, torch.full((3,), n * (n + 1) / 2))
    return {"path": "xla" if dist.group.WORLD.mesh is not None else "host", "jax_processes": jax.process_count(),
            "device": dist.group.WORLD.device_index}


@case
def collectives(backend: str = "pjrt") -> dict:
    init(backend)
    n, rank = dist.get_world_size(), dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    pg = dist.group.WORLD
    path = "xla" if pg.mesh is not None else "host"

    # all_reduce: every ReduceOp, several dtypes, a view, a 0-d tensor
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool):
        for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT):
            compare(f"all_reduce {op} {dtype}", lambda t, g, op=op: dist.all_reduce(t, op, group=g),
                    _inputs((5, 3), dtype), gloo=gloo)
    for op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        compare(f"all_reduce {op}", lambda t, g, op=op: dist.all_reduce(t, op, group=g), _inputs((7,), torch.int64),
                gloo=gloo)
    mine, ref = _inputs((4, 6), torch.float32).to(pjrt()), _inputs((4, 6), torch.float32)
    dist.all_reduce(mine, ReduceOp.AVG)
    _avg_reference(ref, gloo)
    check_equal("all_reduce AVG", mine, ref)
    # PREMUL_SUM (gloo has none): the sum over the ranks of factor * input
    premul = dist._make_nccl_premul_sum(0.5)
    compare("all_reduce PREMUL_SUM", lambda t, g: dist.all_reduce(t, premul, group=g) if g is None else
            dist.all_reduce(t.mul_(0.5), group=g), _inputs((4, 6), torch.float32), gloo=gloo)
    compare("reduce_scatter_tensor PREMUL_SUM", lambda out, t, g: dist.reduce_scatter_tensor(out, t, premul) if g is None
            else dist.reduce_scatter_tensor(out, t * 0.5, group=g), torch.zeros(3), _inputs((3 * n,), torch.float32),
            gloo=gloo)
    compare("reduce PREMUL_SUM to rank 1", lambda t, g: dist.reduce(t, 1, premul) if g is None else
            dist.reduce(t.mul_(0.5), 1, group=g), _inputs((5,), torch.float32), gloo=gloo, only_rank=1)
    mine, ref = _inputs((4, 6), torch.float32).to(pjrt()), _inputs((4, 6), torch.float32)
    dist.all_reduce(mine[:, 1::2])  # a strided view: the result must land in the base's storage
    part = ref[:, 1::2].contiguous()  # gloo needs contiguous tensors
    dist.all_reduce(part, group=gloo)
    ref[:, 1::2] = part
    check_equal("all_reduce of a strided view", mine, ref)
    compare("all_reduce 0-d", lambda t, g: dist.all_reduce(t, group=g), _inputs((), torch.float32), gloo=gloo)

    # one-to-all, all-to-one
    for src in range(n):
        compare(f"broadcast from {src}", lambda t, g, s=src: dist.broadcast(t, s, group=g), _inputs((3, 4), torch.float32),
                gloo=gloo)
    compare("broadcast of bool", lambda t, g: dist.broadcast(t, 1, group=g), _inputs((5,), torch.bool), gloo=gloo)
    special = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan"), 1e-45])
    for values in (special, torch.complex(special, special.flip(0))):
        mine = (values * (rank + 1)).to(pjrt())  # rank 1 sends values * 2
        dist.broadcast(mine, 1)
        check_equal(f"broadcast of {values.dtype} specials, bit for bit", mine.cpu().view(torch.uint8),
                    (values * 2).view(torch.uint8))
    compare("reduce to 1", lambda t, g: dist.reduce(t, 1, group=g), _inputs((6,), torch.float32), gloo=gloo, only_rank=1)
    compare("gather to 0", lambda t, outs, g: dist.gather(t, outs if rank == 0 else None, 0, group=g),
            _inputs((2, 3), torch.float32), [torch.zeros(2, 3) for _ in range(n)], gloo=gloo)
    compare("scatter from 1", lambda out, ins, g: dist.scatter(out, ins if rank == 1 else None, 1, group=g),
            torch.zeros(4), [_inputs((4,), torch.float32, salt=k) for k in range(n)], gloo=gloo)

    # all-gather / reduce-scatter / all-to-all
    compare("all_gather", lambda outs, t, g: dist.all_gather(outs, t, group=g),
            [torch.zeros(2, 5) for _ in range(n)], _inputs((2, 5), torch.float32), gloo=gloo)
    compare("all_gather_into_tensor", lambda out, t, g: dist.all_gather_into_tensor(out, t, group=g),
            torch.zeros(2 * n, 5), _inputs((2, 5), torch.float32), gloo=gloo)
    compare("reduce_scatter", lambda out, ins, g: dist.reduce_scatter(out, ins, group=g),
            torch.zeros(3), [_inputs((3,), torch.float32, salt=k) for k in range(n)], gloo=gloo)
    for op in (ReduceOp.SUM, ReduceOp.MAX):
        compare(f"reduce_scatter_tensor {op}", lambda out, t, g, op=op: dist.reduce_scatter_tensor(out, t, op, group=g),
                torch.zeros(2, 3), _inputs((2 * n, 3), torch.float32), gloo=gloo)
    compare("all_to_all_single", lambda out, t, g: dist.all_to_all_single(out, t, group=g),
            torch.zeros(2 * n, 3), _inputs((2 * n, 3), torch.float32), gloo=gloo)
    in_splits = [(rank + k) % 3 + 1 for k in range(n)]  # rank r sends in_splits[k] rows to rank k
    out_splits = [(k + rank) % 3 + 1 for k in range(n)]  # and receives (k + r) % 3 + 1 rows from rank k
    compare("all_to_all_single, uneven splits",
            lambda out, t, g: dist.all_to_all_single(out, t, out_splits, in_splits, group=g),
            torch.zeros(sum(out_splits), 2), _inputs((sum(in_splits), 2), torch.float32), gloo=gloo)
    compare("all_to_all", lambda outs, ins, g: dist.all_to_all(outs, ins, group=g),
            [torch.zeros(2, 2) for k in range(n)], [_inputs((2, 2), torch.float32, salt=k) for k in range(n)],
            gloo=gloo)

    # point to point: a ring, blocking and async, and batched
    right, left = (rank + 1) % n, (rank - 1) % n
    send, recv = _inputs((3,), torch.float32).to(pjrt()), torch.zeros(3, device=pjrt())
    if rank % 2 == 0:
        dist.send(send, right)
        dist.recv(recv, left)
    else:
        dist.recv(recv, left)
        dist.send(send, right)
    expected = torch.zeros(3)
    ring = [dist.P2POp(dist.isend, _inputs((3,), torch.float32), right, gloo),
            dist.P2POp(dist.irecv, expected, left, gloo)]
    for w in dist.batch_isend_irecv(ring):
        w.wait()
    check_equal("send/recv ring", recv, expected)
    recv2 = torch.zeros(3, device=pjrt())
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv2, left)])
    for w in works:
        w.wait()
    check_equal("batch_isend_irecv", recv2, expected)
    w_recv = dist.irecv(recv2.zero_(), left)
    w_send = dist.isend(send, right)
    w_send.wait()
    w_recv.wait()
    check_equal("isend/irecv", recv2, expected)

    # async work objects
    t = _inputs((8,), torch.float32).to(pjrt())
    ref = _inputs((8,), torch.float32)
    work = dist.all_reduce(t, async_op=True)
    dist.all_reduce(ref, group=gloo)
    value = work.get_future().wait()
    work.wait()
    if not work.is_completed():
        failures.append("all_reduce work not completed after wait()")
    check_equal("async all_reduce (tensor)", t, ref)
    check_equal("async all_reduce (future value)", value[0], ref)
    dist.barrier()

    # objects (CPU, pickled) through the pjrt group
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": rank})
    if objects != [{"rank": r} for r in range(n)]:
        failures.append(f"all_gather_object: {objects}")
    box = [rank * 10 if rank == 1 else None]
    dist.broadcast_object_list(box, src=1)
    if box != [10]:
        failures.append(f"broadcast_object_list: {box}")

    # functional collectives (eager): c10d's kernels call the pjrt group
    x, xr = _inputs((2 * n, 3), torch.float32).to(pjrt()), _inputs((2 * n, 3), torch.float32)
    check_equal("functional all_reduce", fc.all_reduce(x, "sum", pg).wait(), fc.all_reduce(xr, "sum", gloo).wait())
    check_equal("functional all_gather_tensor", fc.all_gather_tensor(x, 0, pg).wait(),
                fc.all_gather_tensor(xr, 0, gloo).wait())
    check_equal("functional reduce_scatter_tensor", fc.reduce_scatter_tensor(x, "sum", 0, pg).wait(),
                fc.reduce_scatter_tensor(xr, "sum", 0, gloo).wait())
    check_equal("functional all_to_all_single", fc.all_to_all_single(x, None, None, pg).wait(),
                fc.all_to_all_single(xr, None, None, gloo).wait())

    # functional collectives inside one compiled graph: XLA collectives in one SPMD program
    # over the group's mesh (host callbacks where the multi-process runtime is off)
    def program(x, group):
        y = fc.all_reduce(x * 2, "sum", group)
        z = fc.all_gather_tensor(y + 1, 0, group)
        w = fc.reduce_scatter_tensor(z, "max", 0, group)
        b = torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.broadcast(w - 1, 1, group.group_name))
        return fc.all_to_all_single(z, None, None, group) * b.sum(), b

    compiled = torch.compile(program, backend="pjrt", fullgraph=True)
    check_equal("compiled functional collectives", compiled(x, pg), program(xr, gloo))

    @torch.compile(backend="pjrt")
    def accumulate(total, x):  # mutates a graph input: its buffer is donated on the SPMD path too
        total.add_(fc.all_reduce(x, "sum", pg))

    total, ref_total = torch.zeros(2 * n, 3, device=pjrt()), torch.zeros(2 * n, 3)
    for _ in range(3):
        accumulate(total, x)
        ref_total += fc.all_reduce(xr, "sum", gloo).wait()
    check_equal("compiled in-place accumulation of an all_reduce", total, ref_total)
    import torch_pjrt

    stats = torch_pjrt.compile_stats()
    return {"path": path, "compiled_graphs": stats["graphs"],
            "compiled_collectives": [g["path"] for g in stats["collective_graphs"]]}


@case
def subgroups() -> dict:
    """new_group and DeviceMesh sub-meshes (4 ranks)."""
    init()
    n, rank = dist.get_world_size(), dist.get_rank()
    odd = dist.new_group([1, 3])
    odd_gloo = dist.new_group([1, 3], backend="gloo")
    if rank in (1, 3):
        compare("all_reduce on new_group([1, 3])", lambda t, g: dist.all_reduce(t, group=g or odd),
                _inputs((5,), torch.float32), gloo=odd_gloo)
        compare("broadcast on new_group([1, 3]) from global rank 3",
                lambda t, g: dist.broadcast(t, 3, group=g or odd), _inputs((5,), torch.float32), gloo=odd_gloo)
        compare("all_gather_into_tensor on new_group([1, 3])",
                lambda out, t, g: dist.all_gather_into_tensor(out, t, group=g or odd),
                torch.zeros(4), _inputs((2,), torch.float32), gloo=odd_gloo)
    t = _inputs((4,), torch.float32).to(pjrt())
    dist.all_reduce(t)  # the world group still works after subgroups were used
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("pjrt", (2, n // 2), mesh_dim_names=("dp", "tp"))
    x, xr = _inputs((2, 3), torch.float32).to(pjrt()), _inputs((2, 3), torch.float32)
    everyone = [torch.zeros_like(xr) for _ in range(n)]
    dist.all_gather(everyone, xr, group=dist.new_group(backend="gloo"))
    for dim in ("dp", "tp"):
        got = fc.all_reduce(x, "sum", mesh[dim].get_group()).wait()
        peers = mesh[dim].mesh.flatten().tolist()  # the global ranks in this rank's sub-mesh
        check_equal(f"functional all_reduce over mesh dim {dim}", got, sum(everyone[r] for r in peers))

    # one compiled graph with collectives over both mesh dimensions: an SPMD program on the 2-D mesh
    dp, tp = mesh["dp"].get_group(), mesh["tp"].get_group()

    def two_d(x):
        y = fc.all_reduce(x * 2, "sum", tp)
        z = fc.all_gather_tensor(y + rank, 0, dp)
        return fc.reduce_scatter_tensor(z, "max", 0, tp), fc.all_reduce(z.sum(), "sum", dp)

    import torch_pjrt

    check_equal("compiled collectives over two mesh dimensions", torch.compile(two_d, backend="pjrt")(x),
                [t.cpu() for t in two_d(x)])  # eager pjrt, itself checked against gloo above
    return {"subgroup_path": ("xla" if odd.mesh is not None else "host") if rank in (1, 3) else None,
            "compiled_2d_path": torch_pjrt.compile_stats()["collective_graphs"][-1]["path"]}
