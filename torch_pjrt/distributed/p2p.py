"""Point-to-point on the pjrt process group: a coalesced block's sends and receives between
two pjrt ranks as one XLA exchange per pair of ranks.

XLA's point-to-point is a collective-permute: one program that both ranks enter at the same
place in their order of XLA collectives. Single sends and receives cannot promise that
(a pipeline schedule posts them in crossing orders: rank 0 sends activations then receives
gradients while rank 1 sends gradients then receives activations), so they stay host-staged:
gloo's tagged, asynchronous point-to-point allows any order. A coalesced block (torch's
`_coalescing_manager`, which `batch_isend_irecv` uses on a group that `supports_coalescing`)
gives all of a rank's sends and receives at once. At its end, for each peer in ascending rank
order (one order of pairs on every rank, so no two pairs wait on each other), the two ranks
swap a small description of their halves over gloo, then run one program on the pair's two
devices over one canonical list of the pair's messages that both build alike: the lower
rank's sends, then the higher rank's, each in (tag, order of issue), which is how gloo
matches messages. The receiver's buffers are written in place when the work is waited for.

Where the descriptions do not match (a CPU tensor on either end, a rank without the XLA
path, a peer whose sends differ from this rank's receives in count, dtype, shape or tag), the
pair's messages take the host path, as before: what gloo allows still works, and what gloo
rejects fails as gloo does. Both ends must issue a pair's messages in a coalesced block: a
message sent in a block and received outside one (or the reverse) meets no exchange on the
other side and fails at the group's timeout.
"""
from __future__ import annotations

import threading
import zlib
from collections import defaultdict
from dataclasses import dataclass

import jax
import torch

from ..runtime import storage
from .work import PjrtWork, dispatch

# gloo tag of the descriptions two ranks swap before an exchange (user tags are small)
HANDSHAKE_TAG = 0x3EC7_0001


@dataclass
class Message:
    send: bool  # this rank sends it (else receives into `tensor`)
    peer: int  # group rank
    tag: int
    tensor: torch.Tensor
    order: int  # order of issue within the block


class Block:
    """The sends and receives one thread issues between `_start_coalescing` and `_end_coalescing`."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.messages: list[Message] = []
        self.works: list[PjrtWork] = []  # coalesced collectives issued inside the block
        self.pending: list[Pending] = []

    def add(self, send: bool, peer: int, tag: int, tensor: torch.Tensor, what: str) -> Pending:
        self.messages.append(Message(send, peer, tag, tensor, len(self.messages)))
        self.pending.append(Pending(what, [tensor]))
        return self.pending[-1]


class Pending(PjrtWork):
    """The work of one send or receive inside a block: it stands for the block's work, which
    exists once the block ends (torch's `batch_isend_irecv` returns that one instead)."""

    def __init__(self, what: str, result: list):
        super().__init__(what, result)
        self._finished = False
        self.block_work: PjrtWork | None = None

    def _require(self) -> PjrtWork:
        if self.block_work is None:
            raise RuntimeError(f"pjrt: {self.what} was waited for inside the coalescing block that issued it; "
                               f"its data moves when the block ends")
        return self.block_work

    def is_completed(self) -> bool:
        return self.block_work is not None and self.block_work.is_completed()

    def is_success(self) -> bool:
        return self.block_work is None or self.block_work.is_success()

    def exception(self):
        return None if self.block_work is None else self.block_work.exception()

    def wait(self, timeout=None) -> bool:
        return self._require().wait(timeout)

    def get_future(self):
        return self._require().get_future()


def _key(m: Message) -> tuple:
    return m.tag, m.order


def _describe(messages: list[Message]) -> int:
    """One int for a side's messages in canonical order: tag, dtype and shape of each."""
    return hash(tuple((m.tag, _dtype_code(m.tensor.dtype), tuple(m.tensor.shape)) for m in messages)) & (2 ** 62 - 1)


def _dtype_code(dtype: torch.dtype) -> int:
    """A number for `dtype` that every process computes alike (str hashes are salted per process)."""
    return zlib.crc32(str(dtype).encode())


class _Pair:
    """This rank's half of the messages between it and `peer` in one block, and the
    description of that half the two ranks swap before deciding the path."""

    def __init__(self, group, peer: int, messages: list[Message]):
        self.group, self.peer = group, peer
        self.sends = sorted((m for m in messages if m.send), key=_key)
        self.recvs = sorted((m for m in messages if not m.send), key=_key)
        eligible = all(m.tensor.device.type == "pjrt" and m.tensor.device.index == group.device_index
                       for m in messages)
        self.mine = [int(eligible), len(self.sends), len(self.recvs), _describe(self.sends), _describe(self.recvs)]
        self.theirs = torch.zeros(len(self.mine), dtype=torch.int64)
        self.handshake = []

    def swap(self) -> None:
        """Post the swap of descriptions over gloo (asynchronous)."""
        host, peer = self.group.host, self.peer
        self.handshake = [host.send([torch.tensor(self.mine, dtype=torch.int64)], peer, HANDSHAKE_TAG),
                          host.recv([self.theirs], peer, HANDSHAKE_TAG)]

    def agreed(self) -> bool:
        """Wait for the peer's description: both ends pjrt, and each side's sends are the other's receives."""
        for w in self.handshake:
            self.group.wait_host(w, f"send/recv with group rank {self.peer}", hint=(
                f" (group rank {self.peer} did not end a coalesced block with this rank, as batch_isend_irecv does: "
                f"both ends of the messages between two ranks must issue them in one)"))
        eligible, sends, recvs, described_sends, described_recvs = self.mine
        return bool(eligible) and self.theirs.tolist() == [1, recvs, sends, described_recvs, described_sends]

    def work(self) -> PjrtWork:
        """One XLA exchange where both ends agree, else the messages host-staged."""
        group, peer = self.group, self.peer
        if not self.agreed():
            return group.host_p2p(self.sends + self.recvs)
        forward, backward = (self.sends, self.recvs) if group.rank() < peer else (self.recvs, self.sends)
        ordered = forward + backward
        values = tuple(storage.read(m.tensor) for m in ordered)  # read now, on this thread
        pair = group.pair_mesh(peer)

        def compute():
            out, _ = pair.run("exchange", values, None, forward=len(forward))
            return jax.block_until_ready(out)

        def finish(out):
            for m, value in zip(ordered, out):
                if not m.send:
                    storage.write(m.tensor, value)

        group.stats["p2p_xla_exchanges"] += 1
        group.stats["p2p_xla_messages"] += len(ordered)
        return PjrtWork(group._what(f"send/recv with group rank {peer}"), [m.tensor for m in ordered],
                        dispatch(compute), finish, group.timeout)


def end(group, block: Block) -> list[PjrtWork]:
    """The works of a block's pairs, in ascending order of the peer's rank (see the module's
    docstring). Every description swap is posted before any is waited for."""
    by_peer: dict[int, list[Message]] = defaultdict(list)
    for m in block.messages:
        by_peer[m.peer].append(m)
    rank = group.rank()
    if group.mesh is None:  # no XLA path on any rank of the group: nothing to agree on
        return [group.host_p2p(by_peer[peer]) for peer in sorted(by_peer)]
    pairs = {peer: _Pair(group, peer, by_peer[peer]) for peer in sorted(by_peer) if peer != rank}
    for pair in pairs.values():
        pair.swap()
    return [pairs[peer].work() if peer in pairs else group.host_p2p(by_peer[peer]) for peer in sorted(by_peer)]


def coalesce_batches_on_older_torch() -> None:
    """torch < 2.14's `batch_isend_irecv` coalesces only where `type(group) is ProcessGroup`, so
    never for a Python group such as this one, whatever its `supports_coalescing` says; from 2.14
    on it asks the group's backend (`group._get_backend(device).supports_coalescing`), whatever its
    type. On the older torch, a batch on a pjrt group takes 2.14's path: one `_coalescing_manager`
    block around the same isend/irecv calls (torch's own functions), so pipeline schedules' batches
    become XLA exchanges there too. Every other batch goes to torch's function unchanged."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.torch_version import TorchVersion

    original = c10d.batch_isend_irecv
    if TorchVersion(torch.__version__) >= (2, 14) or getattr(original, "pjrt_coalesces", False):
        return
    from .backend import ProcessGroupPjrt

    def batch_isend_irecv(p2p_op_list):
        group = p2p_op_list[0].group if p2p_op_list else None
        if group is None and p2p_op_list and dist.is_initialized():
            group = c10d._get_default_group()
        if not isinstance(group, ProcessGroupPjrt):
            return original(p2p_op_list)
        c10d._check_p2p_op_list(p2p_op_list)
        with c10d._coalescing_manager(group, p2p_op_list[0].tensor.device, async_ops=True) as manager:
            for op in p2p_op_list:
                peer = {"group_dst": op.group_peer} if op.op is dist.isend else {"group_src": op.group_peer}
                op.op(op.tensor, group=op.group, tag=op.tag, **peer)
        return manager.works

    batch_isend_irecv.__doc__, batch_isend_irecv.__wrapped__ = original.__doc__, original
    batch_isend_irecv.pjrt_coalesces = True
    c10d.batch_isend_irecv = dist.batch_isend_irecv = batch_isend_irecv
