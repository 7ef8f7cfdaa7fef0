"""torch.distributed on pjrt: every collective, subgroups, functional collectives, with 2
and 4 processes launched as torchrun does, each compared with gloo on CPU tensors.

Each test launches worker processes (tests/distributed/cases.py) with a hard timeout.
"""
from __future__ import annotations

import pytest

from tests.distributed.launch import expect_success, launch


@pytest.mark.parametrize("nprocs", [2, 4])
def test_collectives_xla_path(nprocs):
    values = expect_success(launch("collectives", nprocs, timeout=240))
    assert all(v["path"] == "xla" for v in values)
    assert all(v["compiled_graphs"] == 1 for v in values)  # no graph break around the collectives


def test_collectives_host_path():
    values = expect_success(launch("collectives", 2, timeout=180, env={"TORCH_PJRT_COLLECTIVES": "host"}))
    assert all(v["path"] == "host" for v in values)


def test_subgroups_and_device_mesh():
    values = expect_success(launch("subgroups", 4, timeout=240))
    assert values[1]["subgroup_path"] == values[3]["subgroup_path"] == "xla"
