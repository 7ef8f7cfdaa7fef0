"""Forking after the pjrt device started JAX (torch_pjrt/runtime/fork_safety.py): DataLoader workers
fork silently, any other fork explains itself once, and the 'spawn' advice works.

Each case runs in a fresh process: warnings and fork hooks are process-wide.
"""
from __future__ import annotations

import subprocess
import sys

from tests.checkout import ROOT, environment

ENV = environment(TORCH_PJRT_PLATFORM="cpu")
JAX_WARNING = "os.fork() was called"
OURS = "torch-pjrt: os.fork() in a process that runs JAX"

SETUP = """
import multiprocessing, torch
data = torch.utils.data.TensorDataset(torch.arange(16.0))
on_device = torch.ones(2, device="pjrt") + 1  # JAX is running
torch.pjrt.synchronize()
"""


def run(body: str) -> subprocess.CompletedProcess[str]:
    # -W default: show every warning as a user's script would see it at least once
    return subprocess.run([sys.executable, "-W", "default", "-c", SETUP + body], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=300)


def test_dataloader_workers_fork_without_a_warning() -> None:
    result = run("""
import warnings
warnings.resetwarnings()  # as test runners and catch_warnings() do after torch-pjrt's setup
warnings.simplefilter("always")
for epoch in range(2):  # two epochs: the workers are forked again
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2,
                                         multiprocessing_context="fork")
    total = sum(float(b.to("pjrt").sum()) for (b,) in loader)
print("total", total)
""")
    assert result.returncode == 0, result.stderr
    assert "total 120.0" in result.stdout
    assert JAX_WARNING not in result.stderr and OURS not in result.stderr, result.stderr


def test_any_other_fork_is_explained_once_instead_of_jaxs_warning() -> None:
    result = run("""
def cpu_only():
    torch.ones(3).sum()

for _ in range(3):
    child = multiprocessing.get_context("fork").Process(target=cpu_only)
    child.start()
    child.join()
    assert child.exitcode == 0
print("forked")
""")
    assert result.returncode == 0, result.stderr
    assert "forked" in result.stdout
    assert result.stderr.count(OURS) == 1, result.stderr
    assert "multiprocessing_context='spawn'" in result.stderr and "docs/training.md" in result.stderr
    assert JAX_WARNING not in result.stderr


def test_spawned_workers_may_use_the_device() -> None:
    """The documented way for a worker that touches pjrt: 'spawn' (it returns CPU tensors)."""
    result = run("""
from tests.test_fork_safety import OnDevice  # importable: a spawned worker unpickles it

loader = torch.utils.data.DataLoader(OnDevice(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
print("batches", [b.tolist() for b in loader])
""")
    assert result.returncode == 0, result.stderr
    assert "batches [[[0.0, 0.0], [2.0, 2.0]], [[4.0, 4.0], [6.0, 6.0]]]" in result.stdout
    assert JAX_WARNING not in result.stderr and OURS not in result.stderr


class OnDevice:
    """A dataset whose items are computed on pjrt (importable by spawned workers)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        import torch

        return (torch.full((2,), float(i), device="pjrt") * 2).cpu()
