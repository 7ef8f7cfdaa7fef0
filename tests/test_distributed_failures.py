"""Failure behaviour of the pjrt process group: a rank that dies, a rank that never joins a
collective, and ranks that pass different shapes make the others raise an error naming
the op and the ranks, within the group's timeout (6 s here); nothing hangs.

Rank 1 misbehaves; rank 0's error is checked. Both data paths: the XLA path with the
shape checks off (so XLA's own collective meets the failure) and the host-staged path.
"""
from __future__ import annotations

import pytest

from tests.distributed.launch import launch

XLA_UNCHECKED = {"TORCH_PJRT_COLLECTIVE_CHECKS": "0"}
HOST = {"TORCH_PJRT_COLLECTIVES": "host"}


def _rank0(mode: str, env: dict) -> dict:
    results = launch("failure", 2, timeout=120, env=env, args=[mode])
    value = results[0].value
    assert value is not None, results[0].output[-3000:]
    return value


@pytest.mark.parametrize("env", [XLA_UNCHECKED, HOST], ids=["xla", "host"])
def test_killed_rank_raises(env):
    value = _rank0("killed", env)
    assert value["error"] is not None and "all_reduce" in value["error"] and "[0, 1]" in value["error"], value
    assert value["seconds"] < 30


@pytest.mark.parametrize("env", [XLA_UNCHECKED, HOST], ids=["xla", "host"])
def test_stuck_rank_times_out(env):
    value = _rank0("stuck", env)
    assert value["error"] is not None and "all_reduce" in value["error"], value
    assert 5 < value["seconds"] < 30, value  # the group's timeout (6 s), not forever


@pytest.mark.parametrize("env", [XLA_UNCHECKED, HOST], ids=["xla", "host"])
def test_frozen_rank_times_out(env):
    """A peer that stops whole (SIGSTOP), as a node cut off by the network would: no socket closes,
    no thread of it answers; the collective still ends at the group's timeout, not never."""
    value = _rank0("frozen", env)
    assert value["error"] is not None and "all_reduce" in value["error"], value
    assert 5 < value["seconds"] < 30, value


def test_mismatched_shapes_raise_on_every_rank():
    results = launch("failure", 2, timeout=120, args=["mismatch"])
    for r in results:
        error = r.value["error"]
        assert error is not None and "all_reduce" in error, r.value
        assert "rank 0: all_reduce(float32[4])" in error and "rank 1: all_reduce(float32[5])" in error, error


def test_exit_after_a_stuck_collective_does_not_hang():
    """Rank 0's collective is still blocked in XLA when it exits normally (through atexit
    handlers and thread joins): the exit must finish, bounded by JAX's shutdown timeout."""
    env = XLA_UNCHECKED | {"PJRT_TEST_NORMAL_EXIT": "1", "TORCH_PJRT_SHUTDOWN_S": "5", "PJRT_TEST_STUCK_S": "70"}
    results = launch("failure", 2, timeout=100, env=env, args=["stuck"])
    assert results[0].value["error"] is not None
    assert results[0].exited_after < 50, results[0].output[-2000:]  # long before its stuck peer (70 s) lets go


def test_compiled_graph_with_a_killed_peer_raises():
    """A compiled graph's collectives are XLA collectives in its executable: a dead peer
    still makes the call raise within the group's timeout, naming the graph and ranks."""
    value = _rank0("compiled_killed", {})
    assert value["error"] is not None and "compiled graph" in value["error"] and "[0, 1]" in value["error"], value
    assert value["seconds"] < 40


def test_compiled_graphs_of_other_shapes_raise_on_every_rank():
    results = launch("failure", 2, timeout=120, args=["compiled_mismatch"])
    for r in results:
        error = r.value["error"]
        assert error is not None and "CollectiveError" in error, r.value
        assert "ran other collectives (ops, shapes or dtypes)" in error, error
        assert f"ranks [{1 - r.rank}]" in error, error
