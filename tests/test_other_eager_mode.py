"""The eager test files again, in the eager mode the run is not in (fused <-> op).

The default run covers the default mode everywhere; this runs the files that exercise eager
semantics most (views and writes, autograd and training, layers, growing storages, errors) in
the other mode, in a subprocess, so CI checks both. The whole suite in the other mode:
`TORCH_PJRT_EAGER=op python -m pytest -q` (docs/eager.md; its last result is in
docs/benchmarks.md).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import torch_pjrt

FILES = ["test_storage_views.py", "test_training.py", "test_layers.py", "test_errors.py", "test_optim.py",
         "test_fused_eager.py", "test_eager_compiles.py", "test_sparse.py"]
# Hugging Face generate over growing caches, several minutes in a subprocess: behind the slow marker
SLOW_FILES = ["test_eager_growth.py"]


def _pass_in_the_other_mode(files: list[str]) -> None:
    other = "op" if torch_pjrt.eager_mode() == "fused" else "fused"
    here = Path(__file__).parent
    env = {**os.environ, "TORCH_PJRT_EAGER": other}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider",
                             *(str(here / f) for f in files)], env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def test_eager_files_pass_in_the_other_mode():
    _pass_in_the_other_mode(FILES)


@pytest.mark.slow
def test_growth_passes_in_the_other_mode():
    _pass_in_the_other_mode(SLOW_FILES)
