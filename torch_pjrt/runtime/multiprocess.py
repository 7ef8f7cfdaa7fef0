"""JAX's multi-process runtime, started from torchrun's environment.

XLA collectives between processes need every process's devices in one JAX runtime, and
`jax.distributed.initialize` must run before JAX creates its backends, which torch_pjrt
does while `import torch` loads it. So platform.py calls `initialize_from_environment()`
first: when RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT say this process is one of a
multi-process job (torchrun sets them), process RANK joins a JAX runtime of WORLD_SIZE
processes whose coordinator runs in rank 0 at MASTER_ADDR:MASTER_PORT+1.

Environment (all optional):
  TORCH_PJRT_JAX_DISTRIBUTED=0     do not start it (collectives then stage through host memory)
  TORCH_PJRT_COORDINATOR=host:port the coordinator's address (default MASTER_ADDR:MASTER_PORT+1)
  TORCH_PJRT_HEARTBEAT_S=N         seconds before JAX declares a silent process dead (default 100)
  TORCH_PJRT_SHUTDOWN_S=N          seconds a finished process waits for the others at exit (default 30)
  TORCH_PJRT_INIT_TIMEOUT_S=N      seconds to wait for every process to join (default 300)
  TORCH_PJRT_LOCAL_DEVICE_IDS=0,1  the accelerator devices this process uses ("all"; default: LOCAL_RANK)
  JAX_ENABLE_PREEMPTION_SERVICE=1  keep JAX's SIGTERM handler (off by default here: see below)
"""
from __future__ import annotations

import os
import uuid

import jax

_state: dict = {"initialized": False, "error": None, "job_id": None}
_JOB_ID_KEY = "torch_pjrt/job_id"


def launched_by_torchrun() -> bool:
    env = os.environ
    return (all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
            and int(env["WORLD_SIZE"]) > 1)


def coordinator_address() -> str:
    explicit = os.environ.get("TORCH_PJRT_COORDINATOR")
    if explicit:
        return explicit
    return f"{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 1}"


def initialize_from_environment() -> None:
    """Start JAX's multi-process runtime when torchrun's variables describe a multi-process
    job. Idempotent; must run before JAX's backends exist. A failure is remembered (and
    collectives fall back to host staging) rather than raised: `import torch` must work."""
    if _state["initialized"] or os.environ.get("TORCH_PJRT_JAX_DISTRIBUTED", "1") == "0" or not launched_by_torchrun():
        return
    _state["initialized"] = True
    env = os.environ
    cpu = env.get("TORCH_PJRT_PLATFORM", "").lower() == "cpu" or env.get("JAX_PLATFORMS", "") == "cpu"
    local_ids = None if cpu else _local_device_ids()
    # the CPU client's cross-process collectives (only the CPU client reads this setting)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if "JAX_ENABLE_PREEMPTION_SERVICE" not in env:
        # JAX's preemption service catches SIGTERM (a TPU preemption notice, for code that polls
        # multihost_utils.reached_preemption_sync_point); under torchrun SIGTERM is the agent
        # stopping its workers after a failure, which a caught signal would delay by 30 s
        # (the agent's grace period) before SIGKILL, on every restart
        jax.config.update("jax_enable_preemption_service", False)
    try:
        jax.distributed.initialize(
            coordinator_address(), int(env["WORLD_SIZE"]), int(env["RANK"]), local_device_ids=local_ids,
            initialization_timeout=int(env.get("TORCH_PJRT_INIT_TIMEOUT_S", "300")),
            heartbeat_timeout_seconds=int(env.get("TORCH_PJRT_HEARTBEAT_S", "100")),
            shutdown_timeout_seconds=int(env.get("TORCH_PJRT_SHUTDOWN_S", "30")))
        if int(env["RANK"]) == 0:  # see job_id
            _coordination_client().key_value_set(_JOB_ID_KEY, uuid.uuid4().hex)
    except Exception as e:  # noqa: BLE001  (remembered; see is_active)
        _state["error"] = f"{type(e).__name__}: {e}"


def _coordination_client():
    from jax._src import distributed  # the key-value store of JAX's coordination service

    return distributed.global_state.client


def job_id() -> str:
    """An id of this start of the job: the same in all its processes, new each time they
    start ("" without JAX's multi-process runtime). torchrun's restart (`--max-restarts`)
    starts new workers on the same store (the rendezvous's shared TCPStore, MASTER_PORT), which
    still holds the keys the failed round wrote; a gloo group that rendezvoused under the same
    keys could read a dead process's address (and time out connecting to it). JAX's coordinator
    is new in every start (it lives in rank 0), so rank 0 puts a fresh id in its key-value store
    and the others read it there."""
    if _state["job_id"] is None:
        if not is_active():
            _state["job_id"] = ""
        else:
            timeout_s = int(os.environ.get("TORCH_PJRT_INIT_TIMEOUT_S", "300"))
            _state["job_id"] = _coordination_client().blocking_key_value_get(_JOB_ID_KEY, timeout_s * 1000)
    return _state["job_id"]


def _local_device_ids() -> list[int] | None:
    """On accelerators one device per process, as torchrun launches it (pjrt:0 is then
    device LOCAL_RANK): the process neither initialises nor preallocates its neighbours'
    devices. None (all visible devices) where the launcher already made one visible."""
    env = os.environ
    explicit = env.get("TORCH_PJRT_LOCAL_DEVICE_IDS")
    if explicit:
        return None if explicit == "all" else [int(i) for i in explicit.split(",")]
    for visible in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if env.get(visible, "").count(",") == 0 and env.get(visible, "") != "":
            return None
    return [int(env["LOCAL_RANK"])] if "LOCAL_RANK" in env else None


def is_active() -> bool:
    """True when this process is part of a multi-process JAX runtime."""
    return _state["initialized"] and _state["error"] is None and jax.process_count() > 1


def failure() -> str | None:
    """Why the multi-process runtime did not start, if it was attempted and failed."""
    return _state["error"]
