"""The "pjrt" process group: torch.distributed's collectives on pjrt tensors.

`ProcessGroupPjrt` is a Python ProcessGroup (torch's C++ Backend class cannot be
subclassed from Python), so it serves every device of its group: pjrt tensors take the
XLA path where one exists (xla.py) and the host-staged path otherwise (host.py); CPU
tensors go straight to the gloo group it owns. Each collective first all-gathers a small
fingerprint of the call (op, dtype, device, shape): inside the XLA program on that path,
over gloo on the host path. A rank that passes another shape or calls another op then
makes every rank raise with a message naming the calls, where gloo would abort a process
on the mismatched sizes (TORCH_PJRT_COLLECTIVE_CHECKS=0 turns the check off).
"""
from __future__ import annotations

import datetime
import os
import threading

import jax
import jax.numpy as jnp
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from ..runtime import platform, storage
from ..runtime import multiprocess
from . import p2p
from .host import HostWork, copy_back, to_host
from .work import CollectiveError, PjrtWork, dispatch
from .collectives import REDUCE_OPS
from .xla import GroupMesh

BACKEND = "pjrt"
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
_OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
        "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "barrier"]


def _path_setting() -> str:
    """TORCH_PJRT_COLLECTIVES: auto (XLA where possible), host (always stage through host memory)."""
    value = os.environ.get("TORCH_PJRT_COLLECTIVES", "auto").lower()
    if value not in ("auto", "host"):
        raise ValueError(f"TORCH_PJRT_COLLECTIVES={value!r}: expected 'auto' or 'host'")
    return value


def local_device_index() -> int:
    """pjrt:LOCAL_RANK where this process sees several devices, else pjrt:0."""
    count = len(platform.devices())
    if count == 1:
        return 0
    local_rank = int(os.environ.get("LOCAL_RANK", torch.pjrt.current_device()))
    if local_rank >= count:
        raise RuntimeError(f"pjrt: LOCAL_RANK={local_rank} but this process sees only {count} pjrt devices")
    return local_rank


def _reduce_op(op, what: str) -> tuple[str, float | None]:
    """(the reduction's name, PREMUL_SUM's factor or None): PREMUL_SUM is SUM of the inputs
    multiplied by the factor first (a Python number or a one-element tensor)."""
    name = op.op.name if hasattr(op, "op") else getattr(op, "name", str(op))
    name = name.split(".")[-1]
    if name == "PREMUL_SUM":
        factor = op.factor
        return "SUM", float(factor.item() if isinstance(factor, torch.Tensor) else factor)
    if name not in REDUCE_OPS:
        raise NotImplementedError(f"pjrt: {what} does not support ReduceOp.{name} (supported: {', '.join(REDUCE_OPS)}, "
                                  f"PREMUL_SUM)")
    return name, None


def _is_pjrt(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.device.type == "pjrt"
    return all(_is_pjrt(e) for e in x) and len(x) > 0


_ON_PJRT = 100  # added to a fingerprint's dtype index for a pjrt tensor


def _describe(code: list) -> str:
    """A fingerprint (see ProcessGroupPjrt._fingerprint) as the call it stands for: all_reduce(float32[4, 3])."""
    if code[1] < 0:
        return f"{_OPS[code[0]]}()"
    on_pjrt, index = divmod(code[1], _ON_PJRT)
    dtype = str(_DTYPES[index]).replace("torch.", "") if index < len(_DTYPES) else "?"
    shape = ", ".join(str(d) for d in code[3:3 + min(code[2], 4)]) + (", ..." if code[2] > 4 else "")
    return f"{_OPS[code[0]]}({dtype}[{shape}]{'' if on_pjrt else ' on cpu'})"


class ProcessGroupPjrt(dist.ProcessGroup):
    """One group of ranks, one pjrt device per rank."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta,
                 global_ranks: list[int] | None = None):
        super().__init__(rank, size)
        self._group_name, self._group_desc = "", ""
        self.timeout = timeout
        self.global_ranks = list(global_ranks) if global_ranks else list(range(size))
        # keys of this start of the job only: after torchrun restarts the workers, the store still
        # holds the addresses the failed round's gloo groups published (multiprocess.job_id)
        self.host = ProcessGroupGloo(dist.PrefixStore(f"gloo/{multiprocess.job_id()}/", store), rank, size, timeout)
        self.device_index = local_device_index()
        self.mesh = self._group_mesh()
        self.checks = os.environ.get("TORCH_PJRT_COLLECTIVE_CHECKS", "1") != "0"
        self._block: p2p.Block | None = None  # the coalescing block open on some thread
        self._pair_meshes: dict[int, GroupMesh] = {}
        # which path this group's point-to-point messages took (tests and users read it)
        self.stats = {"p2p_xla_exchanges": 0, "p2p_xla_messages": 0, "p2p_host_messages": 0}

    # ------------------------------------------------------------------ identity
    def getBackendName(self) -> str:
        return BACKEND

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def _device_types(self) -> list[torch.device]:
        # object collectives pick "cpu" when it is listed: pickled objects are host memory
        return [torch.device("cpu"), torch.device("pjrt")]

    # What torch asks of a group's per-device Backend. torch >= 2.14's batch_isend_irecv calls
    # group._get_backend(device) on any ProcessGroup instance, Python subclasses included (2.13
    # checked `type(group) is ProcessGroup` first, so it never coalesces for this group), and the
    # C++ lookup raises for a Python group, which registers no Backend. This group serves cpu and
    # pjrt itself, so it answers for both: NCCL-style coalescing (a block's sends and receives
    # become one XLA exchange per peer: p2p.py); no splitting, time estimates or backend-allocated
    # tensors.
    supports_coalescing = True
    supports_splitting = False
    supports_time_estimate = False

    def supports_tensor_alloc(self, device) -> bool:
        return False

    def _get_backend(self, device) -> ProcessGroupPjrt:
        device_type = torch.device(device).type
        if device_type not in ("cpu", "pjrt"):  # as the C++ lookup answers; callers catch RuntimeError
            raise RuntimeError(f"No backend type associated with device type {device_type}")
        return self

    # ------------------------------------------------------------------ coalescing (torch's _coalescing_manager)
    def _start_coalescing(self, device=None) -> None:
        if self._block is not None:
            raise RuntimeError(f"pjrt: {self._what('_start_coalescing')}: a coalescing block is already open")
        self._block = p2p.Block()

    def _end_coalescing(self, device=None) -> PjrtWork:
        block, self._block = self._block, None
        if block is None:
            raise RuntimeError(f"pjrt: {self._what('_end_coalescing')}: no coalescing block is open")
        works = block.works + p2p.end(self, block)
        work = _joined(self._what("coalesced block"), works, [t for w in works for t in w.result()])
        for pending in block.pending:
            pending.block_work = work
        return work

    def _open_block(self) -> p2p.Block | None:
        """The coalescing block this thread has open, if any."""
        block = self._block
        return block if block is not None and block.thread == threading.get_ident() else None

    def _in_block(self, work: PjrtWork) -> PjrtWork:
        """A coalesced collective issued inside a block belongs to the block's work too."""
        block = self._open_block()
        if block is not None:
            block.works.append(work)
        return work

    def pair_mesh(self, peer: int) -> GroupMesh:
        """The mesh of this rank's and `peer`'s devices, the lower rank first."""
        mesh = self._pair_meshes.get(peer)
        if mesh is None:
            lo, hi = sorted((self.rank(), peer))
            mesh = GroupMesh([self.mesh.devices[lo], self.mesh.devices[hi]], int(self.rank() == hi))
            self._pair_meshes[peer] = mesh
        return mesh

    def wait_host(self, gloo_work, op: str, hint: str = "") -> None:
        try:
            gloo_work.wait()
        except Exception as e:  # noqa: BLE001
            raise CollectiveError(f"pjrt: {self._what(op)} failed: {e}{hint}") from None

    def host_p2p(self, messages: list) -> PjrtWork:
        """A block's messages with one peer, host-staged (as single sends and receives are)."""
        works = [self._host_send([m.tensor], m.peer, m.tag) if m.send else self._host_recv([m.tensor], m.peer, m.tag)
                 for m in messages]
        return _joined(self._what("send/recv"), works, [m.tensor for m in messages])

    def _what(self, op: str) -> str:
        return (f"{op} on process group '{self._group_name}' (global ranks {self.global_ranks}; this is group rank "
                f"{self.rank()}, pjrt:{self.device_index})")

    # ------------------------------------------------------------------ setup
    def _group_mesh(self) -> GroupMesh | None:
        """The XLA path's mesh, or None where a rank lacks JAX's multi-process runtime."""
        device = platform.device(self.device_index)
        mine = torch.tensor([jax.process_index(), device.id, int(self._xla_possible())], dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self.size())]
        self.host.allgather([everyone], [mine]).wait()
        if not all(int(e[2]) for e in everyone):
            return None
        processes = [int(e[0]) for e in everyone]
        if len(set(processes)) != len(processes):
            return None  # two ranks in one JAX process: not a torchrun layout
        by_id = {d.id: d for d in jax.devices()}
        return GroupMesh([by_id[int(e[1])] for e in everyone], self.rank())

    def _xla_possible(self) -> bool:
        return _path_setting() == "auto" and (multiprocess.is_active() or self.size() == 1)

    # ------------------------------------------------------------------ agreement checks
    def _fingerprint(self, op: str, tensor: torch.Tensor | None) -> tuple | None:
        """What every rank's call must share: (op, dtype and device, rank, first dims, shape hash);
        None when checks are off or there is nobody to disagree with."""
        if not self.checks or self.size() == 1:
            return None
        code = [_OPS.index(op), -1, 0, 0, 0, 0, 0, 0]
        if tensor is not None:
            shape = list(tensor.shape)
            dtype = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else len(_DTYPES)
            # the device too: a pjrt tensor on one rank and a CPU tensor on another would take different paths
            code[1:3] = [dtype + _ON_PJRT * (tensor.device.type == "pjrt"), len(shape)]
            code[3:7] = (shape + [0] * 4)[:4]
            code[7] = hash(tuple(shape)) & (2 ** 62 - 1)
        return tuple(code)

    def _disagreement(self, op: str, mine: tuple, everyone: list) -> CollectiveError | None:
        if all(tuple(c) == mine for c in everyone):
            return None
        calls = "; ".join(f"rank {self.global_ranks[r]}: {_describe(list(c))}" for r, c in enumerate(everyone))
        return CollectiveError(f"pjrt: {self._what(op)}: the ranks' calls do not match: {calls}")

    def _agree_on_host(self, op: str, fingerprint: tuple | None) -> None:
        """All-gather the fingerprints over gloo (the host path's check) and raise on disagreement."""
        if fingerprint is None:
            return
        mine = torch.tensor(fingerprint, dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self.size())]
        try:
            self.host.allgather([everyone], [mine]).wait()
        except Exception as e:  # noqa: BLE001
            raise CollectiveError(f"pjrt: {self._what(op)} failed: a peer rank is unreachable: {e}") from None
        error = self._disagreement(op, fingerprint, [e.tolist() for e in everyone])
        if error is not None:
            raise error

    # ------------------------------------------------------------------ the two paths
    def _on_xla(self, op: str, *tensors: torch.Tensor) -> bool:
        """True when `tensors` are pjrt tensors this group can reduce through XLA."""
        if self.mesh is None or not all(_is_pjrt(t) for t in tensors):
            return False
        for t in tensors:
            if t.device.index != self.device_index:
                raise RuntimeError(f"pjrt: {self._what(op)}: tensor is on {t.device}, but this rank's device is "
                                   f"pjrt:{self.device_index} (pjrt:LOCAL_RANK where a process sees several devices)")
        return True

    def _xla(self, label: str, name: str, x, finish, result: list, fingerprint: tuple | None, **params) -> PjrtWork:
        """Collective `name` of xla.BODIES on this rank's value `x` (read now, on this thread);
        `finish(output)` stores the output when the work is waited for. The program checks
        the ranks' fingerprints itself (xla.GroupMesh.run)."""
        mesh = self.mesh

        def compute():
            out, everyone = mesh.run(name, x, fingerprint, **params)
            error = self._disagreement(label, fingerprint, everyone) if everyone is not None else None
            if error is not None:
                raise error
            return jax.block_until_ready(out)

        return PjrtWork(self._what(label), result, dispatch(compute), finish, self.timeout)

    def run_compiled(self, graph: str, compute):
        """Run `compute()` (a compiled graph's SPMD program over this group; compiler/spmd.py)
        on the dispatcher thread, and wait for its value with the group's timeout."""
        value = []
        PjrtWork(self._what(f"compiled graph '{graph}'"), [], dispatch(compute), value.append, self.timeout).wait()
        return value[0]

    def _xla_in_place(self, label: str, name: str, t: torch.Tensor, **params) -> PjrtWork:
        return self._xla(label, name, storage.read(t), lambda out: storage.write(t, out), [t],
                         self._fingerprint(label, t), **params)

    def _staged(self, op: str, run, inputs, outputs, fingerprint: tuple | None, result=None, after=None) -> HostWork:
        """Run gloo's `run(host_inputs, host_outputs)` on host mirrors; copy outputs back on wait."""
        self._agree_on_host(op, fingerprint)
        host_in, host_out = to_host(inputs), to_host(outputs)
        try:
            gloo_work = run(host_in, host_out)
        except Exception as e:  # noqa: BLE001
            raise CollectiveError(f"pjrt: {self._what(op)} failed: {e}") from None

        def finish():
            if after is not None:
                after(host_out)
            copy_back(outputs, host_out)

        return HostWork(self._what(op), result if result is not None else _flat(outputs), gloo_work, finish, self.timeout)

    def _average(self, host_tensors) -> None:
        for t in host_tensors if isinstance(host_tensors, list) else [host_tensors]:
            if isinstance(t, list):
                self._average(t)
            elif t.is_floating_point() or t.is_complex():
                t.div_(self.size())
            else:
                t.copy_(torch.div(t, self.size(), rounding_mode="trunc"))

    # ------------------------------------------------------------------ collectives
    def allreduce(self, tensors: list[torch.Tensor], opts=None) -> PjrtWork:
        opts = opts or dist.AllreduceOptions()
        op, factor = _reduce_op(opts.reduceOp, "all_reduce")
        if factor is not None:
            for t in tensors:
                t.mul_(factor)  # in place: the result replaces the input anyway
        if self._on_xla("all_reduce", *tensors):
            works = [self._xla_in_place("all_reduce", "all_reduce", t, op=op) for t in tensors]
            return works[0] if len(works) == 1 else _joined(self._what("all_reduce"), works, tensors)
        (t,) = tensors
        return self._staged("all_reduce", lambda i, o: self.host.allreduce(o, _gloo_reduce(dist.AllreduceOptions(), op)),
                            tensors, tensors, self._fingerprint("all_reduce", t),
                            after=self._average if op == "AVG" else None)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts=None) -> PjrtWork:
        options = dist.AllreduceOptions()
        if opts is not None:
            options.reduceOp = opts.reduceOp
        return self._in_block(_joined(self._what("all_reduce"), [self.allreduce([t], options) for t in tensors], tensors))

    def broadcast(self, tensors: list[torch.Tensor], opts=None) -> PjrtWork:
        opts = opts or dist.BroadcastOptions()
        (t,) = tensors
        if self._on_xla("broadcast", t):
            return self._xla_in_place("broadcast", "broadcast", t, src=opts.rootRank)
        options = dist.BroadcastOptions()
        options.rootRank = opts.rootRank
        return self._staged("broadcast", lambda i, o: self.host.broadcast(o, options), tensors, tensors,
                            self._fingerprint("broadcast", t))

    def reduce(self, tensors: list[torch.Tensor], opts=None) -> PjrtWork:
        opts = opts or dist.ReduceOptions()
        op, factor = _reduce_op(opts.reduceOp, "reduce")
        (t,) = tensors
        root = self.rank() == opts.rootRank
        if factor is not None:  # the root receives the sum of the scaled inputs; other ranks keep theirs
            scaled = t * factor
            work = self.reduce([scaled], _reduce_options(opts.rootRank))
            return _joined(self._what("reduce"), [work], tensors, after=lambda: t.copy_(scaled) if root else None)
        if self._on_xla("reduce", t):  # an all-reduce whose result only the root keeps
            return self._xla("reduce", "all_reduce", storage.read(t), lambda out: storage.write(t, out) if root else None,
                             tensors, self._fingerprint("reduce", t), op=op)
        options = _gloo_reduce(dist.ReduceOptions(), op)
        options.rootRank = opts.rootRank
        return self._staged("reduce", lambda i, o: self.host.reduce(o, options), tensors, tensors,
                            self._fingerprint("reduce", t), after=self._average if op == "AVG" and root else None)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> PjrtWork:
        op = "all_gather_into_tensor"
        _expect(output.numel() == input.numel() * self.size(), self._what(op),
                f"output has {output.numel()} elements, expected {self.size()} x {input.numel()}")
        if self._on_xla(op, output, input):
            return self._xla(op, "all_gather", storage.read(input).reshape(-1),
                             lambda out: storage.write(output, out.reshape(tuple(output.shape))), [output],
                             self._fingerprint(op, input))
        return self._staged(op, lambda i, o: self.host._allgather_base(o, i), input, output, self._fingerprint(op, input))

    _allgather_base = all_gather_single  # its name before torch 2.13

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts=None) -> PjrtWork:
        (outputs,), (t,) = output_lists, inputs
        if self._on_xla("all_gather", t, *outputs) and all(o.shape == t.shape for o in outputs):
            def finish(out):
                for o, part in zip(outputs, out.reshape((len(outputs),) + tuple(t.shape))):
                    storage.write(o, part)

            return self._xla("all_gather", "all_gather", storage.read(t).reshape(-1), finish, output_lists,
                             self._fingerprint("all_gather", t))
        return self._staged("all_gather", lambda i, o: self.host.allgather(o, i), inputs, output_lists,
                            self._fingerprint("all_gather", t))

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> PjrtWork:
        return self._in_block(_joined(self._what("all_gather_into_tensor"),
                                      [self.all_gather_single(o, i) for o, i in zip(outputs, inputs)], outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # its name before torch 2.13

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> PjrtWork:
        opts = opts or dist.ReduceScatterOptions()
        name = "reduce_scatter_tensor"
        op, factor = _reduce_op(opts.reduceOp, name)
        _expect(input.numel() == output.numel() * self.size(), self._what(name),
                f"input has {input.numel()} elements, expected {self.size()} x {output.numel()}")
        if factor is not None:
            input = input * factor
        if self._on_xla(name, output, input):
            return self._xla(name, "reduce_scatter", storage.read(input).reshape(-1),
                             lambda out: storage.write(output, out.reshape(tuple(output.shape))), [output],
                             self._fingerprint(name, input), op=op)
        options = _gloo_reduce(dist.ReduceScatterOptions(), op)
        return self._staged(name, lambda i, o: self.host._reduce_scatter_base(o, i, options), input, output,
                            self._fingerprint(name, input), after=self._average if op == "AVG" else None)

    _reduce_scatter_base = reduce_scatter_single  # its name before torch 2.13

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> PjrtWork:
        return self._in_block(_joined(self._what("reduce_scatter_tensor"),
                                      [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)], outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # its name before torch 2.13

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts=None) -> PjrtWork:
        opts = opts or dist.ReduceScatterOptions()
        op, factor = _reduce_op(opts.reduceOp, "reduce_scatter")
        (out,), (ins,) = outputs, input_lists
        if factor is not None:
            ins = [i * factor for i in ins]
            input_lists = [ins]
        fingerprint = self._fingerprint("reduce_scatter", out)
        if self._on_xla("reduce_scatter", out, *ins) and all(i.shape == out.shape for i in ins):
            stacked = jnp.concatenate([storage.read(i).reshape(-1) for i in ins])
            return self._xla("reduce_scatter", "reduce_scatter", stacked,
                             lambda res: storage.write(out, res.reshape(tuple(out.shape))), outputs, fingerprint, op=op)
        options = _gloo_reduce(dist.ReduceScatterOptions(), op)
        return self._staged("reduce_scatter", lambda i, o: self.host.reduce_scatter(o, i, options), input_lists,
                            outputs, fingerprint, after=self._average if op == "AVG" else None)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts=None) -> PjrtWork:
        even = not output_split_sizes and not input_split_sizes
        # with split sizes the ranks' shapes differ legitimately: only op, dtype and device must agree
        fingerprint = self._fingerprint("all_to_all_single", input if even else input.flatten()[:0])
        if even and self._on_xla("all_to_all_single", output, input) and input.shape[0] % self.size() == 0:
            return self._xla("all_to_all_single", "all_to_all", storage.read(input),
                             lambda out: storage.write(output, out.reshape(tuple(output.shape))), [output], fingerprint)
        options = dist.AllToAllOptions()
        return self._staged("all_to_all_single", lambda i, o: self.host.alltoall_base(
            o, i, list(output_split_sizes), list(input_split_sizes), options), input, output, fingerprint)

    alltoall_base = all_to_all_single  # its name before torch 2.13

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts=None) -> PjrtWork:
        """As one all_to_all_single of the flattened, concatenated tensors (so sizes may differ)."""
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        flat_out = torch.empty(sum(t.numel() for t in outputs), dtype=flat_in.dtype, device=flat_in.device)
        in_splits, out_splits = [t.numel() for t in inputs], [t.numel() for t in outputs]
        even = len(set(in_splits)) == 1 and in_splits == out_splits
        self.all_to_all_single(flat_out, flat_in, [] if even else out_splits, [] if even else in_splits).wait()
        for t, part in zip(outputs, flat_out.split(out_splits)):
            with torch.no_grad():
                t.copy_(part.view(t.shape))
        return PjrtWork(self._what("all_to_all"), outputs)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts=None) -> PjrtWork:
        options = dist.GatherOptions()
        options.rootRank = opts.rootRank
        return self._staged("gather", lambda i, o: self.host.gather(o, i, options), inputs, output_lists,
                            self._fingerprint("gather", inputs[0]))

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts=None) -> PjrtWork:
        options = dist.ScatterOptions()
        options.rootRank = opts.rootRank
        return self._staged("scatter", lambda i, o: self.host.scatter(o, i, options), input_lists, outputs,
                            self._fingerprint("scatter", outputs[0]))

    def barrier(self, opts=None) -> PjrtWork:
        # every op this rank queued on its device finishes first, as NCCL's barrier orders after the stream
        storage.synchronize(self.device_index)
        return self._staged("barrier", lambda i, o: self.host.barrier(dist.BarrierOptions()), [], [],
                            self._fingerprint("barrier", None))

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> PjrtWork:
        block = self._open_block()
        if block is not None:  # collected: it moves when the block ends
            return block.add(True, dst, tag, tensors[0], self._what(f"send to group rank {dst}"))
        return self._host_send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> PjrtWork:
        block = self._open_block()
        if block is not None:
            return block.add(False, src, tag, tensors[0], self._what(f"recv from group rank {src}"))
        return self._host_recv(tensors, src, tag)

    def _host_send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> PjrtWork:
        self.stats["p2p_host_messages"] += 1
        return self._staged(f"send to group rank {dst}", lambda i, o: self.host.send(i, dst, tag), tensors, [], None,
                            result=tensors)

    def _host_recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> PjrtWork:
        self.stats["p2p_host_messages"] += 1
        return self._staged(f"recv from group rank {src}", lambda i, o: self.host.recv(o, src, tag), [], tensors, None)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> PjrtWork:
        return self._staged("recv from any rank", lambda i, o: self.host.recv_anysource(o, tag), [], tensors, None)

    def abort(self) -> None:
        self.host.abort()

    def shutdown(self) -> None:
        self.host.shutdown()


def _gloo_reduce(options, op: str):
    """Gloo has no AVG: sum, then divide on the host (the `after` step)."""
    options.reduceOp = getattr(dist.ReduceOp, "SUM" if op == "AVG" else op)
    return options


def _expect(ok: bool, what: str, why: str) -> None:
    if not ok:
        raise ValueError(f"pjrt: {what}: {why}")


def _flat(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for e in x for t in _flat(e)]


def _joined(what: str, works: list[PjrtWork], result, after=None) -> PjrtWork:
    """One work for several (coalesced) collectives; `after()` runs once they are all done."""
    return _Joined(what, works, _flat(result), after)


def _reduce_options(root: int) -> dist.ReduceOptions:
    options = dist.ReduceOptions()
    options.rootRank = root
    return options


class _Joined(PjrtWork):
    def __init__(self, what: str, works: list[PjrtWork], result: list, after=None):
        super().__init__(what, result)
        self._works, self._after = works, after

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def wait(self, timeout=None) -> bool:
        for w in self._works:
            w.wait(timeout)
        with self._lock:  # a completion thread (get_future) and the caller may both wait
            after, self._after = self._after, None
        if after is not None:
            after()
        return True


def create(options, backend_options=None) -> ProcessGroupPjrt:
    """torch.distributed's constructor hook (extended API): one ProcessGroupPjrt per group."""
    return ProcessGroupPjrt(options.store, options.group_rank, options.group_size, options.timeout,
                            list(options.global_ranks_in_group))


def register() -> None:
    if BACKEND in dist.Backend.backend_list:
        return
    # "cpu" too: the group serves CPU tensors (object collectives, DCP's metadata) on its gloo group
    dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu", "pjrt"])
    p2p.coalesce_batches_on_older_torch()  # pipeline schedules' batches as XLA exchanges on torch < 2.14 too
