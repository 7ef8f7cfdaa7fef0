"""JAX's persistent compilation cache: a second process reuses the executables of the first.

On by default for every executable this process compiles, eager ops and compiled graphs
alike, in `<cache dir>/xla/<versions>` (the cache dir is `$TORCH_PJRT_CACHE_DIR`, else
`$XDG_CACHE_HOME/torch_pjrt`, default `~/.cache/torch_pjrt`, where the C++ runtime is built
too). The versions folder names jax, torch and torch-pjrt and a digest of torch-pjrt's source,
so upgrading any of them, or editing the source, starts a new cache (JAX's own key covers the
program, jax and XLA; ours adds what lowers to them). The op executable store
(executable_store.py) keeps only executables compiled afresh, keyed apart in this cache by a
compile option of its own, so it fills whatever this cache holds. Folders unused for STALE_DAYS,
or beyond the KEEP most recently used, are deleted.
`TORCH_PJRT_COMPILE_CACHE=0` turns it off. Executables that compiled in less than
`TORCH_PJRT_COMPILE_CACHE_MIN_SECONDS` (default 0: an eager op's executable compiles in
tens of milliseconds and reads back in about one) are not stored. A cache directory the user
already set through JAX (`jax_compilation_cache_dir`, `JAX_COMPILATION_CACHE_DIR`) is used
as it is.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

import jax
import torch

from .build import cache_dir

log = logging.getLogger("torch_pjrt")

_enabled: list = []


STALE_DAYS, KEEP = 7, 8


@functools.lru_cache(None)
def source_digest() -> str:
    """A digest of every Python file of this package (about 3 ms): what lowers to JAX."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def directory() -> Path:
    from ..version import __version__

    return cache_dir() / "xla" / f"jax{jax.__version__}-torch{torch.__version__}-pjrt{__version__}-{source_digest()[:16]}"


def tidy(folder: Path) -> None:
    """Create `folder`, mark it used now, and delete those of its siblings (other versions' caches:
    each upgrade, or each edit of this package, starts a new folder) unused for STALE_DAYS or
    beyond the KEEP most recently used."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)
        others = sorted((other for other in folder.parent.iterdir() if other != folder and other.is_dir()),
                        key=lambda other: other.stat().st_mtime, reverse=True)
        for rank, other in enumerate(others, start=2):
            if rank > KEEP or time.time() - other.stat().st_mtime > STALE_DAYS * 86400:
                shutil.rmtree(other, ignore_errors=True)
    except OSError as e:  # a read-only cache: reads may still work
        log.debug("pjrt: cache folder %s (%s)", folder, e)


def enabled() -> bool:
    return os.environ.get("TORCH_PJRT_COMPILE_CACHE", "1").lower() not in ("0", "false", "off", "no")


def enable() -> str | None:
    """Turn the cache on once per process, before the first executable; returns its
    directory (None when off)."""
    if _enabled:
        return _enabled[0]
    path = None
    if enabled():
        path = jax.config.jax_compilation_cache_dir
        if not path:
            path = str(directory())
            tidy(Path(path))
            jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ.get("TORCH_PJRT_COMPILE_CACHE_MIN_SECONDS", "0")))
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _enabled.append(path)
    return path
