"""Point-to-point between two pjrt ranks: coalesced blocks of sends and receives in crossing
orders as XLA exchanges (torch_pjrt/distributed/p2p.py), bitwise equal to the host-staged path,
and the cases that keep the host path."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager, _get_default_group

from tests.distributed.common import case, failures, init, pjrt

# several tensors per direction, of different dtypes (a 0-d one, a complex one: isend sends its real view)
SHAPES = [((3, 4), torch.float32), ((5,), torch.bfloat16), ((2, 3), torch.int64), ((7,), torch.bool),
          ((), torch.float64), ((4,), torch.uint8), ((3,), torch.complex64), ((2, 2), torch.float16),
          ((6,), torch.int8)]


def _payload(sender: int, k: int) -> torch.Tensor:
    """Message k of `sender`: values exact in its dtype, with -0.0, inf and a NaN with a payload."""
    shape, dtype = SHAPES[k % len(SHAPES)]
    g = torch.Generator().manual_seed(100 * sender + k)
    n = math.prod(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        t = (torch.randn(n, generator=g) * 3).to(dtype)
        if n >= 4:
            t[0], t[1] = -0.0, float("inf")
            bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
            t.view(bits)[2] = t.new_tensor(float("nan")).view(bits) | 3  # a NaN with payload bits
        return t.reshape(shape)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def _same_bits(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    if actual.dtype != expected.dtype or actual.shape != expected.shape or not torch.equal(_bits(actual), _bits(expected)):
        failures.append(f"rank {dist.get_rank()}: {name}: {actual} != {expected} (bitwise)")


def _ops(rank: int, count: int, device, order: str) -> tuple[list, list]:
    """This rank's P2POps with its peer (`count` messages each way) in `order`, and its receive buffers.
    Rank 0 sends then receives, rank 1 receives then sends (the crossing orders of a pipeline),
    or the two interleaved."""
    peer = 1 - rank
    sends = [dist.P2POp(dist.isend, _payload(rank, k).to(device), peer) for k in range(count)]
    buffers = [torch.full(SHAPES[k % len(SHAPES)][0], 7, dtype=SHAPES[k % len(SHAPES)][1], device=device)
               for k in range(count)]
    recvs = [dist.P2POp(dist.irecv, b, peer) for b in buffers]
    if order == "crossing":
        ops = sends + recvs if rank == 0 else recvs + sends
    else:  # interleaved: send, recv, send, recv ... on rank 0; recv, send, ... on rank 1
        pairs = zip(sends, recvs) if rank == 0 else zip(recvs, sends)
        ops = [op for pair in pairs for op in pair]
    return ops, buffers


def _coalesced(ops: list) -> list:
    """The ops as one coalesced block: what torch's batch_isend_irecv does on a group that
    supports coalescing (torch 2.13 does it only for C++ groups; torch_pjrt/distributed/p2p.py)."""
    device = ops[0].tensor.device
    with _coalescing_manager(ops[0].group, device, async_ops=True) as cm:
        for op in ops:
            peer = {"group_dst": op.group_peer} if op.op is dist.isend else {"group_src": op.group_peer}
            op.op(op.tensor, group=op.group, tag=op.tag, **peer)
    return cm.works


def _host_staged(ops: list) -> list:
    """The same ops one by one (each a host-staged send or receive), sends first."""
    return [op.op(op.tensor, op.peer, op.group, op.tag) for op in sorted(ops, key=lambda op: op.op is dist.irecv)]


def _run(label: str, ops: list, issue) -> None:
    for work in issue(ops):
        work.wait()


@case
def p2p_exchange() -> dict:
    """batch_isend_irecv-style blocks between the two ranks: several tensors per direction,
    different dtypes, crossing and interleaved orders, compared bitwise with the host-staged
    result and with what the peer sent; the path each took, read from the group's stats."""
    init()
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    group = _get_default_group()
    stats = group.stats
    paths = {}

    def taken(before: dict) -> dict:
        return {k: stats[k] - before[k] for k in stats}

    for order in ("crossing", "interleaved"):
        for count in (1, 3, len(SHAPES)):
            label = f"{order}, {count} each way"
            ops, xla_out = _ops(rank, count, pjrt(), order)
            before = dict(stats)
            _run(label, ops, _coalesced)
            paths[label] = taken(before)
            ops, host_out = _ops(rank, count, pjrt(), order)
            _run(label, ops, _host_staged)
            for k, (a, b) in enumerate(zip(xla_out, host_out)):
                _same_bits(f"{label}: message {k}, XLA exchange vs host-staged", a, b)
                _same_bits(f"{label}: message {k}, received vs sent", a, _payload(peer, k))

    # torch's own batch_isend_irecv: it coalesces (XLA exchange) where torch asks the group
    # (torch >= 2.14); torch 2.13 issues the ops one by one for a Python group (host-staged)
    ops, out = _ops(rank, 3, pjrt(), "crossing")
    before = dict(stats)
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    paths["batch_isend_irecv"] = taken(before)
    for k, a in enumerate(out):
        _same_bits(f"batch_isend_irecv: message {k}", a, _payload(peer, k))

    # a peer that sends another shape of the same bytes than this rank receives: host path (gloo moves the bytes)
    send = _payload(rank, 0).to(pjrt())  # float32 (3, 4)
    buffer = torch.zeros(12 if rank == 0 else (3, 4), device=pjrt())
    before = dict(stats)
    _run("shapes differ", [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, buffer, peer)], _coalesced)
    paths["shapes differ"] = taken(before)
    _same_bits("shapes differ", buffer.cpu().reshape(3, 4), _payload(peer, 0))

    # a CPU tensor on one end: host path on both
    device = "cpu" if rank == 1 else pjrt()
    ops, out = _ops(rank, 2, device, "crossing")
    before = dict(stats)
    _run("cpu on one end", ops, _coalesced)
    paths["cpu on one end"] = taken(before)
    for k, a in enumerate(out):
        _same_bits(f"cpu on one end: message {k}", a, _payload(peer, k))

    # a send/recv between two blocks (1F1B's fwd_send_bwd_recv / bwd_send_fwd_recv) after
    # which this rank's buffer is used at once: the receive is written in place on wait()
    x = torch.arange(4, dtype=torch.float32, device=pjrt()) + 10 * rank
    y = torch.zeros(4, device=pjrt())
    for work in _coalesced([dist.P2POp(dist.irecv, y, peer), dist.P2POp(dist.isend, x * 2, peer)]):
        work.wait()
    _same_bits("in place, then used", (y + 1).cpu(), (torch.arange(4.0) + 10 * peer) * 2 + 1)
    return {"paths": paths}


@case
def p2p_timing(*sizes: str) -> dict:
    """Seconds per 1F1B-style exchange (one tensor each way in one batch_isend_irecv, waited
    for), for float32 tensors of each size: XLA exchange, and host-staged (single isend/irecv).
    A measurement for docs/distributed.md, not a test."""
    import time

    init()
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    result = {}
    for size in (int(s) for s in sizes):
        x = torch.randn(size, device=pjrt())
        y = torch.empty(size, device=pjrt())
        for path, issue in (("xla", dist.batch_isend_irecv), ("host", _host_staged)):
            times = []
            for _ in range(30):
                ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)]
                dist.barrier()
                start = time.perf_counter()
                for work in issue(ops if rank == 0 else ops[::-1]):
                    work.wait()
                float(y[0])  # the value on the host: the receive is done
                times.append(time.perf_counter() - start)
            result[f"{path} {size}"] = sorted(times)[len(times) // 2]
    return result


@case
def p2p_unmatched() -> dict:
    """A message sent in a coalesced block and received outside one meets no exchange on the
    other side: both ranks raise torch's distributed error at the group's timeout, naming the
    op, instead of hanging."""
    import datetime
    import time

    init()
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=3))
    x, y = torch.ones(4, device=pjrt()), torch.zeros(4, device=pjrt())
    start = time.monotonic()
    try:
        if rank == 0:
            for work in _coalesced([dist.P2POp(dist.isend, x, peer, group), dist.P2POp(dist.irecv, y, peer, group)]):
                work.wait()
        else:
            dist.irecv(y, peer, group=group).wait()
        failures.append(f"rank {rank}: an unmatched send/recv did not raise")
        error = ""
    except dist.DistError as e:
        error = f"{type(e).__name__}: {e}"
    except RuntimeError as e:
        error = f"{type(e).__name__}: {e}"
    return {"error": error, "seconds": time.monotonic() - start, "peer_failed": True}
