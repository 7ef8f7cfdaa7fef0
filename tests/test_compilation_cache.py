"""Eager executables persist across processes (JAX's compilation cache, runtime/compilation_cache.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import torch_pjrt

SCRIPT = textwrap.dedent("""
    import jax.monitoring
    events = {"compiles": 0, "hits": 0}
    def count(name, *args, **kw):
        if "backend_compile" in name:  # fires for cache loads too: the first process's count is its compiles
            events["compiles"] += 1
        if name.endswith("cache_hits"):
            events["hits"] += 1
    jax.monitoring.register_event_duration_secs_listener(count)
    jax.monitoring.register_event_listener(lambda name, **kw: count(name))
    import torch, torch_pjrt
    x = torch.randn(7, 5, device="pjrt")
    for _ in range(3):  # fused mode: a region, run op by op at its first sight, compiled at its second
        y = (torch.tanh(x) * 3 + x.t().sum(1)).softmax(-1)
        total = float(y.sum().item())
    print("RESULT", round(total, 4), events["compiles"], events["hits"],
          torch_pjrt.eager_stats()["fused"]["region_compiles"])
""")


def _two_processes(tmp_path, mode: str) -> list:
    """(value, XLA compiles, cache hits, region compiles) of SCRIPT run twice on one cache."""
    # JAX_COMPILATION_CACHE_DIR (respected as the user's own) keeps the C++ runtime's build cache
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path), TORCH_PJRT_PLATFORM="cpu", TORCH_PJRT_EAGER=mode,
               TORCH_PJRT_EXECUTABLE_STORE="0",  # JAX's cache alone (tests/test_executable_store.py tests the store)
               PYTHONPATH=os.path.dirname(os.path.dirname(torch_pjrt.__file__)))
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    out = [r.stdout.split("RESULT")[-1].split() if "RESULT" in r.stdout else r.stderr[-2000:] for r in runs]
    assert all(len(o) == 4 for o in out), out
    assert any(os.scandir(tmp_path))
    return [(float(v), int(c), int(h), int(r)) for v, c, h, r in out]


def test_a_second_process_finds_the_eager_executables_in_the_cache(tmp_path):
    (value1, compiles1, hits1, _), (value2, _, hits2, _) = _two_processes(tmp_path, "op")
    assert value1 == value2
    assert compiles1 > 0 and hits1 == 0
    assert hits2 >= compiles1  # every executable the first process built


def test_a_second_process_finds_the_fused_regions_in_the_cache(tmp_path):
    first, second = _two_processes(tmp_path, "fused")
    assert first[0] == second[0]
    assert first[3] == second[3] == 1  # the loop's region compiled in each process...
    assert first[2] == 0 and second[2] >= first[1]  # ...and the second read it, and every op's, from the cache


def test_old_cache_folders_are_deleted(tmp_path):
    """Each version (each edit of the source) has its own folder: the KEEP most recently used stay,
    older ones and those unused for STALE_DAYS go."""
    from torch_pjrt.runtime import compilation_cache

    now = time.time()
    for i in range(10):  # used 1..10 hours ago
        (tmp_path / f"v{i}").mkdir()
        os.utime(tmp_path / f"v{i}", (now - 3600 * (i + 1),) * 2)
    os.utime(tmp_path / "v0", (now - 86400 * (compilation_cache.STALE_DAYS + 1),) * 2)  # the least recent
    compilation_cache.tidy(tmp_path / "current")
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted(["current"] + [f"v{i}" for i in range(1, compilation_cache.KEEP)])
