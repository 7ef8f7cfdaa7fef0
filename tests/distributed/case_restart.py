"""A rank killed mid-step under torchrun --max-restarts: the other ranks stop instead of
hanging, and the restarted job resumes from its last distributed checkpoint."""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tests.distributed.case_training import _MODEL, _batches, _full_state, _fully_shard, _my_rows, _train
from tests.distributed.common import case, check_equal, init, pjrt
from torch_pjrt.tools.demo_models import gpt_setup

STEPS, KILLED_IN_STEP = 4, 2  # rank 1 dies in step 2 (0-based) of the first start: checkpoints 0 and 1 exist
TIMEOUT_S = 60  # the process group's timeout: the other rank must stop well within it


_FAULTS: list = []  # faulthandler's open files


def _record(directory: Path, name: str, **what) -> None:
    (directory / name).write_text(json.dumps(dict(what, time=time.time(), rank=dist.get_rank())))


@case
def restart(directory: str, killed: str = "1", wrapper: str = "ddp") -> dict:
    """DDP (or FSDP2: `wrapper`) on pjrt, a DCP checkpoint after every step
    (`directory`/step{k}, then `latest`). In the job's first start rank `killed` exits in
    the middle of step KILLED_IN_STEP (after its forward pass, while the others are in the
    backward pass's collectives); each other rank records (`survivor{rank}`) the error it
    gets; faulthandler's file `fault{rank}` shows that its agent stopped it (SIGTERM) or JAX
    aborted it. torchrun restarts
    them all; they load the latest checkpoint, train the remaining steps, and the final
    parameters must equal one process training on the full batches. (The first start is
    told by a marker file, not TORCHELASTIC_RESTART_COUNT: each launcher counts its own
    restarts, and one whose workers did not fail restarts with its count still 0.)"""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    directory = Path(directory)
    first_start = not (directory / "killed").exists()
    init(timeout_s=TIMEOUT_S)
    rank, killed = dist.get_rank(), int(killed)
    if first_start and rank != killed:
        # an abort, or the agent's SIGTERM (then handled as by default: the process ends), leaves
        # every thread's traceback there. In C, so a main thread blocked in C++ does not delay
        # it, as it would a Python signal handler (and with it the process's end)
        _FAULTS.append(open(directory / f"fault{rank}", "w"))
        faulthandler.enable(_FAULTS[-1])
        faulthandler.register(signal.SIGTERM, _FAULTS[-1], chain=True)

    data, model, opt = gpt_setup(pjrt(), seed=0, **_MODEL)  # one process, full batches, no interruption
    _train(model, opt, _batches(data, STEPS), pjrt())
    reference = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    data, model, opt = gpt_setup(pjrt(), seed=0, **_MODEL)
    if wrapper == "fsdp":
        wrapped = _fully_shard(model, init_device_mesh("pjrt", (dist.get_world_size(),)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)  # gpt_setup's, on the shards
    else:
        wrapped = DDP(model, bucket_cap_mb=0.02)  # several buckets: all-reduces in flight when the peer dies
    batches = _batches(data, STEPS)
    start = 0
    if (directory / "latest").exists():
        last = int((directory / "latest").read_text())
        model_state, opt_state = get_state_dict(wrapped, opt)
        state = {"model": model_state, "optim": opt_state}
        dcp.load(state, checkpoint_id=str(directory / f"step{last}"))
        set_state_dict(wrapped, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = last + 1

    for step in range(start, STEPS):
        x, y = batches[step]
        rows = _my_rows()
        _, loss = wrapped(x[rows].to(pjrt()), y[rows].to(pjrt()))
        if first_start and step == KILLED_IN_STEP and rank == killed:
            _record(directory, "killed", step=step)
            os._exit(3)  # no clean-up: the process is gone mid-step, as a lost node's are
        opt.zero_grad(set_to_none=True)
        try:
            loss.backward()
            opt.step()
            loss.item()
        except Exception as e:  # noqa: BLE001  (recorded for the test, then raised as a user's script would)
            if first_start:
                _record(directory, f"survivor{rank}", error=f"{type(e).__name__}: {e}")
            raise
        model_state, opt_state = get_state_dict(wrapped, opt)
        dcp.save({"model": model_state, "optim": opt_state}, checkpoint_id=str(directory / f"step{step}"))
        dist.barrier()  # every rank's shards written (dcp.save's rank 0 wrote the metadata last)
        if rank == 0:
            (directory / "latest").write_text(str(step))

    for name, value in _full_state(model).items():
        check_equal(f"resumed {wrapper} parameter {name}", value, reference[name], rtol=1e-4, atol=1e-5)
    return {"first_start": first_start, "resumed_after_step": start - 1}
