"""Pipeline, context and multi-dimensional parallelism on pjrt (torch.distributed.pipelining,
context_parallel, 2-D DeviceMesh compositions), each against one process training the
full model on the full batch, or against unsharded attention.

Each test launches worker processes (tests/distributed/case_parallel.py) with a hard timeout.
"""
from __future__ import annotations

import os

import pytest

from tests.distributed.launch import REPO, expect_success, launch, torchrun

# every schedule, both frontends (manual PipelineStage and the traced pipeline()), eager and compiled stages
PIPELINES = ["ScheduleGPipe:1:pipeline", "Schedule1F1B:1:compiled", "ScheduleInterleaved1F1B:2:manual"]


@pytest.mark.parametrize("nprocs", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_pipeline_schedules_equal_full_batch_training(nprocs):
    """Losses and parameters (the case's checks); the stages' sends and receives that the
    schedules batch together (1F1B's steady state, the interleaved schedule's mixed batches)
    ran as XLA exchanges, the rest host-staged (GPipe's batches are all-send or all-receive,
    which torch's pipelining issues one by one)."""
    values = expect_success(launch("pipeline", nprocs, timeout=400, args=PIPELINES))
    assert all(values[-1][spec][0] for spec in PIPELINES)  # the last stage saw every step's loss
    for spec in PIPELINES:
        paths = [v[spec][2] for v in values]
        if spec.startswith("ScheduleGPipe"):
            assert all(p["p2p_xla_exchanges"] == 0 and p["p2p_host_messages"] > 0 for p in paths), (spec, paths)
        else:
            assert all(p["p2p_xla_exchanges"] > 0 for p in paths), (spec, paths)


def test_context_parallel_sdpa_equals_unsharded_attention():
    """Ring attention over the sequence dimension: output and q/k/v gradients, causal (load
    balanced) and not, eager and under torch.compile(backend="pjrt")."""
    expect_success(launch("context_parallel", 2, timeout=300, args=["compiled"]))


@pytest.mark.slow  # 4 processes on a 2-D mesh: about 4 minutes on 2 cores (docs/distributed.md)
def test_fsdp2_x_tp_equals_full_batch_training_and_its_checkpoint_loads_on_another_mesh(tmp_path):
    expect_success(launch("fsdp_tp", 4, timeout=600, args=[str(tmp_path)]))
    expect_success(launch("fsdp_load", 2, timeout=300, args=[str(tmp_path)]))


@pytest.mark.slow  # 4 processes: about a minute on 2 cores
def test_fsdp2_x_pp_equals_full_batch_training():
    expect_success(launch("fsdp_pp", 4, timeout=400))


@pytest.mark.slow  # 8 processes on a 3-D mesh (docs/distributed.md has its time)
def test_fsdp2_x_tp_x_pp_equals_full_batch_training():
    expect_success(launch("fsdp_tp_pp", 8, timeout=1200))


@pytest.mark.slow  # 4 processes on a 2-D mesh, twice: about a minute each on 2 cores
@pytest.mark.parametrize("case", ["fsdp_cp", "tp_cp"])
def test_context_parallel_composed_equals_full_batch_training(case):
    """Ring attention over the sequence, composed with FSDP2 (dp x cp) or tensor parallelism (cp x tp)."""
    expect_success(launch(case, 4, timeout=900))


def _two_nodes(case: str, nproc_per_node: int, tmp_path, timeout: float) -> list[dict]:
    """`case` under two torchrun launchers (two "hosts") meeting at a c10d rendezvous."""
    env = dict(os.environ, TORCH_PJRT_PLATFORM="cpu", TORCH_PJRT_CPU_DEVICES="1", PYTHONPATH=str(REPO),
               OMP_NUM_THREADS="1")
    values = torchrun(["-m", "tests.distributed.cases", case], nproc_per_node, tmp_path, env, timeout, nnodes=2)
    assert all(not v["failures"] for v in values), [v["failures"] for v in values]
    return values


def test_two_nodes_find_jax_coordinator_from_torchruns_environment(tmp_path):
    """Ranks from two launchers start one JAX multi-process runtime with no extra setting."""
    for value in _two_nodes("smoke", 1, tmp_path, 180):
        assert value == {"path": "xla", "jax_processes": 2, "device": 0, "failures": []}


@pytest.mark.slow  # 4 processes, twice
@pytest.mark.parametrize("case", ["ddp", "fsdp"])
def test_two_nodes_of_two_processes_train_as_one(case, tmp_path):
    """DDP and FSDP2 across two launchers equal one process training the full batch (the cases' own checks)."""
    _two_nodes(case, 2, tmp_path, 600)


@pytest.mark.slow  # two launchers, a failed start and a restart: 2 to 4 minutes each on 2 loaded cores (docs/distributed.md)
@pytest.mark.parametrize("nproc,killed,wrapper", [(1, 1, "ddp"), (1, 0, "ddp"), (1, 1, "fsdp"), (2, 2, "ddp")],
                         ids=["rank1", "rank0_jax_coordinator", "rank1_fsdp2", "2x2_rank2"])
def test_node_killed_mid_step_stops_the_others_and_torchrun_resumes_from_the_last_checkpoint(
        nproc, killed, wrapper, tmp_path):
    """Two launchers (two "hosts"), `nproc` DDP (or FSDP2) ranks each, `--max-restarts=1`.
    One rank exits mid-step in the first start (tests/distributed/case_restart.py); the
    others must get an error, be stopped by their agent, or (when rank 0, JAX's
    coordinator, is the one lost) be aborted by JAX, well within the group's timeout; the
    restarted job must load the last distributed checkpoint (step 1) and end equal to
    full-batch training."""
    import json
    import time

    from tests.distributed.case_restart import KILLED_IN_STEP, TIMEOUT_S

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    env = dict(os.environ, TORCH_PJRT_PLATFORM="cpu", TORCH_PJRT_CPU_DEVICES="1", PYTHONPATH=str(REPO),
               OMP_NUM_THREADS="1")
    start = time.monotonic()
    values = torchrun(["-m", "tests.distributed.cases", "restart"], nproc, tmp_path, env, 560, nnodes=2,
                      args=[str(checkpoints), str(killed), wrapper], max_restarts=1)
    print(f"killed, restarted and resumed in {time.monotonic() - start:.0f} s")
    assert all(not v["failures"] for v in values), [v["failures"] for v in values]
    assert [(v["first_start"], v["resumed_after_step"]) for v in values] == [(False, KILLED_IN_STEP - 1)] * 2 * nproc
    lost = json.loads((checkpoints / "killed").read_text())
    assert lost["rank"] == killed
    evidence = {}  # rank -> what it recorded; a rank stopped while inside C++ (SIGKILL after SIGTERM) records nothing
    for rank in set(range(2 * nproc)) - {killed}:
        record, fault = checkpoints / f"survivor{rank}", checkpoints / f"fault{rank}"
        if record.exists():
            evidence[rank] = json.loads(record.read_text())
        elif fault.exists() and fault.read_text():  # stopped (SIGTERM) or aborted: faulthandler wrote the traceback
            how = "aborted" if fault.read_text().startswith("Fatal Python error") else "stopped"
            evidence[rank] = {how: fault.read_text().splitlines()[0], "time": fault.stat().st_mtime}
    print("the other ranks:", {r: {k: str(v)[:160] for k, v in e.items()} for r, e in evidence.items()})
    assert any("error" in e for e in evidence.values()), evidence  # someone saw the collective fail
    for rank, e in evidence.items():
        if "error" in e:  # the collective in flight names its failure
            # "Connection closed by peer" or "Connection reset by peer", as gloo's socket saw it
            assert "CollectiveError" in e["error"] and "by peer" in e["error"], e["error"]
            assert e["time"] - lost["time"] < TIMEOUT_S / 2
        else:  # stopped by its agent, or aborted by JAX: no hang, though no error of its own either
            assert e["time"] - lost["time"] < TIMEOUT_S / 2
        print(f"rank {rank}: {e['time'] - lost['time']:.2f} s after the loss")
