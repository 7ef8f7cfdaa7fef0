"""Eager executables persist across processes (JAX's compilation cache, runtime/compilation_cache.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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
    import torch
    x = torch.randn(7, 5, device="pjrt")
    y = (torch.tanh(x) * 3 + x.t().sum(1)).softmax(-1)
    print("RESULT", round(float(y.sum().item()), 4), events["compiles"], events["hits"])
""")


def test_a_second_process_finds_the_eager_executables_in_the_cache(tmp_path):
    # JAX_COMPILATION_CACHE_DIR (respected as the user's own) keeps the C++ runtime's build cache
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path), TORCH_PJRT_PLATFORM="cpu",
               PYTHONPATH=os.path.dirname(os.path.dirname(torch_pjrt.__file__)))
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    out = [r.stdout.split("RESULT")[-1].split() if "RESULT" in r.stdout else r.stderr[-2000:] for r in runs]
    (value1, compiles1, hits1), (value2, compiles2, hits2) = out
    assert value1 == value2
    assert int(compiles1) > 0 and int(hits1) == 0
    assert int(hits2) >= int(compiles1), out  # every executable the first process built
    assert any(os.scandir(tmp_path))
