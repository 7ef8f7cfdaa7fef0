"""JAX's persistent compilation cache, so a second process reuses compiled executables.

On by default for the compile backend, in `$TORCH_PJRT_CACHE_DIR`, else
`$XDG_CACHE_HOME/torch_pjrt/xla` (default `~/.cache/torch_pjrt/xla`).
`TORCH_PJRT_COMPILE_CACHE=0` turns it off. Executables that compiled in less than
`TORCH_PJRT_COMPILE_CACHE_MIN_SECONDS` (default 0.5) are not stored: reading them back
would cost about as much. The setting is process-wide (JAX has one cache), so it also
covers eager executables slow enough to qualify. A cache directory the user already set
through JAX (`jax_compilation_cache_dir`) is respected.
"""
from __future__ import annotations

import os
from pathlib import Path

import jax

_enabled: list = []


def directory() -> Path:
    explicit = os.environ.get("TORCH_PJRT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torch_pjrt" / "xla"


def enable() -> str | None:
    """Turn the cache on once per process; returns its directory (None when off)."""
    if _enabled:
        return _enabled[0]
    path = None
    if os.environ.get("TORCH_PJRT_COMPILE_CACHE", "1").lower() not in ("0", "false", "off", "no"):
        path = jax.config.jax_compilation_cache_dir
        if not path:
            path = str(directory())
            os.makedirs(path, exist_ok=True)
            jax.config.update("jax_compilation_cache_dir", path)
            jax.config.update("jax_persistent_cache_min_compile_time_secs",
                              float(os.environ.get("TORCH_PJRT_COMPILE_CACHE_MIN_SECONDS", "0.5")))
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
            # eager ops compiled before: JAX decided "no cache" then
            from jax.experimental.compilation_cache.compilation_cache import reset_cache

            reset_cache()
    _enabled.append(path)
    return path
