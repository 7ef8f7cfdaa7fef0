"""Failure behaviour: a dead rank, a stuck rank, mismatched shapes must raise, not hang."""
from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

from tests.distributed.common import case, init, pjrt

TIMEOUT_S = 6


@case
def failure(mode: str) -> dict:
    """Rank 1 misbehaves (mode: killed, stuck, frozen (SIGSTOP: as a node cut off by the network,
    no socket closes and no heartbeat comes), mismatch; compiled_killed and compiled_mismatch for
    a compiled graph's collective); every other rank reports the error it got."""
    init(timeout_s=TIMEOUT_S)
    compiled = mode.startswith("compiled_")
    mode = mode.removeprefix("compiled_")
    rank = dist.get_rank()
    t = torch.ones(4, device=pjrt())
    dist.all_reduce(t)  # everyone is up
    if rank == 1 and mode == "killed":
        os._exit(3)
    if mode == "frozen":  # rank 0 learns rank 1's pid, to end it once its own error is in
        store = dist.distributed_c10d._get_default_store()
        if rank == 1:
            store.set("frozen_pid", str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)  # the whole process stops: no thread answers, no socket closes
        frozen_pid = int(store.get("frozen_pid"))
    if rank == 1 and mode == "stuck":
        time.sleep(float(os.environ.get("PJRT_TEST_STUCK_S", 4 * TIMEOUT_S)))
        return {"peer_failed": True}
    if mode == "mismatch":
        t = torch.ones(4 + rank, device=pjrt())
    else:
        time.sleep(1)  # let the peer die or get stuck first
    if compiled:  # compiled before the clock starts: the timeout counts from the call
        double_sum = torch.compile(lambda x: fc.all_reduce(x * 2, "sum", dist.group.WORLD), backend="pjrt")
        torch._dynamo.mark_static(t)
    start = time.monotonic()
    try:
        if compiled:
            double_sum(t).cpu()
        else:
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            t.cpu()
        error = None
    except Exception as e:  # noqa: BLE001  (the error is the result)
        error = f"{type(e).__name__}: {e}"
    seconds = time.monotonic() - start
    if mode == "frozen":
        os.kill(frozen_pid, signal.SIGKILL)
    return {"error": error, "seconds": seconds, "peer_failed": True}
