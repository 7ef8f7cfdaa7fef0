"""Live executables stay under the process's memory-map budget (runtime/executable_budget.py).

Without the budget a long process (tests/ops, about 7000 executables) ran out of Linux's
vm.max_map_count and XLA segfaulted in its next persistent-cache load."""
import pytest
import torch

import torch_pjrt
from torch_pjrt.runtime import executable_budget


@pytest.fixture
def tiny_budget(monkeypatch):
    # our own module's knobs: check at every build, and any process is over budget
    monkeypatch.setattr(executable_budget, "CHECK_EVERY", 1)
    monkeypatch.setattr(executable_budget, "_BUDGET", 0)
    yield
    executable_budget._state["due"] = False


def _work(device, n):
    out = []
    for k in range(1, n + 1):  # a new shape each time: new executables
        x = torch.arange(k * 3, dtype=torch.float32, device=device).reshape(k, 3)
        out.append((x.sin() * 2 + x.sum(0)).cpu())
    return out


linux_only = pytest.mark.skipif(executable_budget.maps() is None or executable_budget._BUDGET is None,
                                reason="the map budget exists where Linux reports the process's maps and its limit")


@linux_only
@pytest.mark.parametrize("mode", ["fused", "op"])
def test_over_budget_releases_executables_and_results_hold(tiny_budget, mode):
    before_mode = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode(mode)
    try:
        released = torch_pjrt.eager_stats()["executables_released"]
        got = _work("pjrt", 6)
        assert torch_pjrt.eager_stats()["executables_released"] > released
        # the executables come back (persistent cache or compile) and compute the same
        again = _work("pjrt", 6)
    finally:
        torch_pjrt.set_eager_mode(before_mode)
    want = _work("cpu", 6)
    for a, b, c in zip(got, again, want):
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, c)


@linux_only
def test_release_drops_maps():
    import jax
    import jax.numpy as jnp

    fns = [jax.jit(lambda x, i=i: jnp.sort(x) + i) for i in range(200)]
    for f in fns:
        f(jnp.ones(4)).block_until_ready()
    held = executable_budget.maps()
    executable_budget._state["due"] = True
    executable_budget.release_if_due()
    assert executable_budget.maps() < held - 200  # 200 executables held 3-10 maps each


def test_a_cpp_kernel_call_is_a_safe_point():
    """A process whose calls all take C++ kernels (no Python kernel, no region run) still releases
    when over its budget: every C++ kernel's entry checks (fast_path.cpp's safe_point)."""
    x = torch.ones(4, device="pjrt")
    before = executable_budget.released()
    executable_budget._state["due"] = True
    try:
        y = x + 1
    finally:
        executable_budget._state["due"] = False
    assert executable_budget.released() == before + 1
    assert y.cpu().tolist() == [2.0] * 4


@linux_only
def test_the_budget_bounds_the_memory_executables_hold():
    """Each small XLA:CPU executable maps ~11 regions and keeps ~3 MB: half of vm.max_map_count
    alone would let a process hold ~9 GB of them (a harness process of PyTorch's tests reached
    10.5 GB). The budget is the lower of that and MEMORY_FRACTION of the machine's memory."""
    import jax
    import jax.numpy as jnp

    memory = executable_budget._physical_memory()
    by_memory = executable_budget.MEMORY_FRACTION * memory / executable_budget.BYTES_PER_MAP
    assert executable_budget._BUDGET == int(min(by_memory, executable_budget.MAX_MAP_FRACTION * executable_budget._map_limit()))
    held = executable_budget.maps()
    fns = [jax.jit(lambda x, i=i: jnp.tanh(x) * i) for i in range(100)]
    for f in fns:
        f(jnp.ones(3)).block_until_ready()
    per_executable = (executable_budget.maps() - held) / 100
    # the estimate behind BYTES_PER_MAP: executables' maps within the budget hold about
    # MEMORY_FRACTION of the memory (3 MB each, measured: 11 maps)
    assert 3 <= per_executable <= 20, per_executable
