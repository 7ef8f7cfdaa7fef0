"""What the distributed benchmarks share: run a script under `torchrun --standalone` on
the CPU platform (one device per process) and collect the JSON lines rank 0 prints."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def torchrun_json(script: str, nproc: int, args: list[str], env: dict, timeout: float = 1200) -> list[dict]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               script, *args]
    full_env = dict(os.environ, TORCH_PJRT_PLATFORM="cpu", TORCH_PJRT_CPU_DEVICES="1", OMP_NUM_THREADS="1", **env)
    out = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def report_median(times: list[float], warmup: int) -> None:
    """In a worker: rank 0 prints the median of the step times after the first `warmup`
    (they compile) as the JSON line `torchrun_json` collects."""
    import torch.distributed as dist

    steady = sorted(times[warmup:])
    if dist.get_rank() == 0:
        print(json.dumps({"seconds": steady[len(steady) // 2]}), flush=True)


def timed_steps(step, steps: int, warmup: int) -> None:
    """In a worker: run `step()` (which returns the loss) `steps` times, each timed until its
    loss is read on the host, and report the median as `report_median` does."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        float(step())
        times.append(time.perf_counter() - start)
    report_median(times, warmup)
