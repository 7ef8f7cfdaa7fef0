"""torch.distributed on pjrt: every collective, subgroups, functional collectives, with 2
and 4 processes launched as torchrun does, each compared with gloo on CPU tensors.

Each test launches worker processes (tests/distributed/cases.py) with a hard timeout.
"""
from __future__ import annotations

import os

import pytest

from tests.distributed.launch import REPO, expect_success, launch, torchrun


def test_torchrun_launch(tmp_path):
    """torchrun itself (not the test launcher): its environment starts JAX's multi-process runtime."""
    env = dict(os.environ, TORCH_PJRT_PLATFORM="cpu", TORCH_PJRT_CPU_DEVICES="1", PYTHONPATH=str(REPO))
    for value in torchrun(["-m", "tests.distributed.cases", "smoke"], 2, tmp_path, env):
        assert value == {"path": "xla", "jax_processes": 2, "device": 0, "failures": []}


def test_without_jax_multiprocess_runtime_everything_is_host_staged():
    """As under torch.multiprocessing.spawn, where JAX's runtime cannot start before import."""
    values = expect_success(launch("smoke", 2, timeout=120, env={"TORCH_PJRT_JAX_DISTRIBUTED": "0"}))
    assert all(v["path"] == "host" and v["jax_processes"] == 1 for v in values)


def test_local_rank_picks_the_device_when_a_process_sees_several():
    values = expect_success(launch("smoke", 2, timeout=120, env={"TORCH_PJRT_CPU_DEVICES": "2"}))
    assert [v["device"] for v in values] == [0, 1] and all(v["path"] == "xla" for v in values)


@pytest.mark.parametrize("nprocs", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4 ranks: also in subgroups, DCP
def test_collectives_xla_path(nprocs):
    values = expect_success(launch("collectives", nprocs, timeout=240))
    assert all(v["path"] == "xla" for v in values)
    assert all(v["compiled_graphs"] == 2 for v in values)  # no graph break around the collectives
    assert all(v["compiled_collectives"] == ["xla", "xla"] for v in values)  # SPMD programs with XLA collectives


def test_collectives_host_path():
    """Host-staged, initialised with the mixed backend string "cpu:gloo,pjrt:pjrt"."""
    values = expect_success(launch("collectives", 2, timeout=180, env={"TORCH_PJRT_COLLECTIVES": "host"},
                                   args=["cpu:gloo,pjrt:pjrt"]))
    assert all(v["path"] == "host" and v["compiled_collectives"] == ["host", "host"] for v in values)


def test_subgroups_and_device_mesh():
    values = expect_success(launch("subgroups", 4, timeout=240))
    assert values[1]["subgroup_path"] == values[3]["subgroup_path"] == "xla"
    assert all(v["compiled_2d_path"] == "xla" for v in values)


@pytest.mark.parametrize("nprocs", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ddp_equals_full_batch_training(nprocs):
    values = expect_success(launch("ddp", nprocs, timeout=300))
    assert values[0]["buckets"] > 1  # several gradient buckets


def test_fsdp2_equals_full_batch_training():
    expect_success(launch("fsdp", 2, timeout=300))


def test_tensor_parallel_mlp_equals_unsharded():
    values = expect_success(launch("tensor_parallel", 2, timeout=240))
    # the compiled block's forward and backward graphs: XLA collectives in one SPMD program each
    assert all(v["compiled_collectives"] == ["xla", "xla"] for v in values)


def test_dcp_save_on_4_load_on_2(tmp_path):
    expect_success(launch("dcp_save", 4, timeout=300, args=[str(tmp_path)]))
    expect_success(launch("dcp_load", 2, timeout=240, args=[str(tmp_path)]))


# the host-staged path with its agreement check off: the check is a blocking gloo all-gather at launch
HOST_UNCHECKED = {"TORCH_PJRT_COLLECTIVES": "host", "TORCH_PJRT_COLLECTIVE_CHECKS": "0"}


@pytest.mark.parametrize("nprocs", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ddp_bucket_all_reduces_overlap_the_backward_pass(nprocs):
    """Rank 0 issues every bucket's all-reduce while its peers hold back bucket 0, so its
    reducer got bucket 0's future incomplete and went on; training still equals full-batch
    training, and PowerSGD (collectives inside future callbacks) keeps the ranks equal."""
    values = expect_success(launch("ddp_overlap", nprocs, timeout=400))
    assert all(b > 1 for b in values[0]["buckets"]), values[0]
    assert values[0]["first_pending"] == [True, True], values[0]  # built-in all-reduce, Python comm hook


@pytest.mark.parametrize("env", [{}, HOST_UNCHECKED], ids=["xla", "host"])
def test_get_future_does_not_wait(env):
    values = expect_success(launch("future_later", 2, timeout=180, env=env))
    assert values[0]["pending"] == {"future_done": False, "work_completed": False, "completed_after": True}


@pytest.mark.parametrize("env", [{}, HOST_UNCHECKED], ids=["xla", "host"])
def test_get_future_of_a_timed_out_collective_fails(env):
    """A peer never joins: the future fails with wait()'s CollectiveError after the
    group's timeout (5 s), though nobody waits for it. (A failed torch future raises a
    RuntimeError naming the callback's error: it fails in C++ too, see PjrtWork.get_future.)"""
    value = launch("future_timeout", 2, timeout=120, env=env)[0].value
    assert value is not None and not value["failures"], value
    assert value["done_at_once"] is False and 4 < value["seconds"] < 30, value
    error = value["wait_error"]
    assert error is not None and error.startswith("CollectiveError: pjrt: all_reduce") and "[0, 1]" in error, value
    assert value["future_error"].startswith("RuntimeError: ") and error in value["future_error"], value
    assert value["completed"] and not value["success"], value
