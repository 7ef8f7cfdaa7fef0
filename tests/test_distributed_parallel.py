"""Pipeline, context and multi-dimensional parallelism on pjrt (torch.distributed.pipelining,
context_parallel, 2-D DeviceMesh compositions), each against one process training the
full model on the full batch, or against unsharded attention.

Each test launches worker processes (tests/distributed/case_parallel.py) with a hard timeout.
"""
from __future__ import annotations

import pytest

from tests.distributed.launch import expect_success, launch

# every schedule, both frontends (manual PipelineStage and the traced pipeline()), eager and compiled stages
PIPELINES = ["ScheduleGPipe:1:pipeline", "Schedule1F1B:1:compiled", "ScheduleInterleaved1F1B:2:manual"]


@pytest.mark.parametrize("nprocs", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_pipeline_schedules_equal_full_batch_training(nprocs):
    values = expect_success(launch("pipeline", nprocs, timeout=400, args=PIPELINES))
    assert all(values[-1][spec][0] for spec in PIPELINES)  # the last stage saw every step's loss


def test_context_parallel_sdpa_equals_unsharded_attention():
    """Ring attention over the sequence dimension: output and q/k/v gradients, causal (load balanced) and not."""
    expect_success(launch("context_parallel", 2, timeout=300))


@pytest.mark.slow  # 4 processes on a 2-D mesh: about 4 minutes on 2 cores (docs/distributed.md)
def test_fsdp2_x_tp_equals_full_batch_training_and_its_checkpoint_loads_on_another_mesh(tmp_path):
    expect_success(launch("fsdp_tp", 4, timeout=600, args=[str(tmp_path)]))
    expect_success(launch("fsdp_load", 2, timeout=300, args=[str(tmp_path)]))


@pytest.mark.slow  # 4 processes: about a minute on 2 cores
def test_fsdp2_x_pp_equals_full_batch_training():
    expect_success(launch("fsdp_pp", 4, timeout=400))
