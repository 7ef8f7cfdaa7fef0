"""Subprocesses of the tests import torch_pjrt from this checkout, not an installed copy."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def environment(**variables: str) -> dict[str, str]:
    """os.environ with this checkout first on PYTHONPATH, plus `variables`."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath, **variables}


def cache_dir_with_runtime(path):
    """`path` as a fresh TORCH_PJRT_CACHE_DIR for a subprocess, holding this process's built C++
    runtime (a link): the subprocess finds its executables' caches empty but does not build the
    runtime again (about a minute on 2 cores). Returns `path`."""
    from torch_pjrt.runtime import build

    built = build._build_dir(build._key())
    link = path / built.name
    path.mkdir(parents=True, exist_ok=True)
    if built.exists() and not link.exists():
        link.symlink_to(built, target_is_directory=True)
    return path
