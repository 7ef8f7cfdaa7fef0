"""Tests run on the CPU PJRT platform with two virtual devices (pjrt:0, pjrt:1)."""
import os

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")
os.environ.setdefault("TORCH_PJRT_CPU_DEVICES", "2")

import pytest  # noqa: E402
import torch  # noqa: E402  (autoloads torch_pjrt)

import torch_pjrt  # noqa: E402,F401  (explicit, in case autoload is off)


@pytest.fixture(autouse=True)
def _reset_current_device():
    torch.pjrt.set_device(0)
    yield
    torch.pjrt.set_device(0)


@pytest.fixture(autouse=True)
def _release_executables_between_tests():
    """The whole suite builds more executables than the process may map (see
    runtime/executable_budget.py): release them between tests, before the budget would inside one
    (tests that count builds then rarely meet a release; tests/budget.py covers the rest)."""
    from torch_pjrt.runtime import executable_budget

    executable_budget.release_at_boundary(0.7)
    yield


@pytest.fixture
def fresh_compile():
    """Dynamo's caches and the pjrt backend's counters reset, so a test counts only its own
    graphs and executables (test modules of torch.compile use it for every test)."""
    from torch_pjrt.compiler import reset_compile_stats

    torch._dynamo.reset()
    reset_compile_stats()
    yield
