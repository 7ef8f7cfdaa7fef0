"""A new process's first training steps on pjrt beside torch CPU eager's, with warm caches.

    python benchmarks/warm_start.py                  # gpt and cnn, 3 rounds
    python benchmarks/warm_start.py --rounds 5 --steps 3

Each sample is a fresh process that builds a workload of benchmarks/train_eager.py (the demo's char
GPT with AdamW and clipping, the CNN with Adam), runs --steps steps reading the loss after each,
and reports the time from the model's construction to the last loss (import excluded) and its
whole life. Rows: torch CPU eager; pjrt with its caches (JAX's persistent cache and the executable
store, runtime/executable_store.py); pjrt with JAX's cache alone (TORCH_PJRT_EXECUTABLE_STORE=0).
One warm-up round fills the caches; the rows then alternate within each round; medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import json, os, sys, time
start = time.perf_counter()
sys.path.insert(0, {benchmarks!r})
import torch
torch.set_num_threads({threads})
import train_eager
device = {device!r}
imported = time.perf_counter()
step = train_eager.WORKLOADS[{workload!r}](device)
for _ in range({steps}):
    float(step())
done = time.perf_counter()
print("RESULT" + json.dumps({{"steps": done - imported, "import": imported - start}}))
"""

ROWS = {"torch CPU eager": ("cpu", {}), "pjrt (JAX cache + store)": ("pjrt", {}),
        "pjrt (JAX cache only)": ("pjrt", {"TORCH_PJRT_EXECUTABLE_STORE": "0"})}


def sample(workload: str, device: str, settings: dict, steps: int, threads: int) -> dict:
    code = CHILD.format(benchmarks=str(Path(__file__).resolve().parent), device=device, workload=workload,
                        steps=steps, threads=threads)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **settings}, capture_output=True,
                         text=True, timeout=900)
    wall = time.perf_counter() - start
    if "RESULT" not in out.stdout:
        raise RuntimeError(f"{workload} on {device} failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.split("RESULT")[-1]), "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="gpt,cnn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's CPU threads (default 1: CPU torch's thread pool slows many times over on a busy machine)")
    opts = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}, torch threads {opts.threads}")
    print("| workload | row | first steps (s) | process (s) | first steps / torch CPU |")
    print("|---|---|---:|---:|---:|")
    for workload in opts.workloads.split(","):
        for device, settings in ROWS.values():  # warm-up: fills the caches
            sample(workload, device, settings, opts.steps, opts.threads)
        times: dict = {row: [] for row in ROWS}
        for _ in range(opts.rounds):
            for row, (device, settings) in ROWS.items():
                times[row].append(sample(workload, device, settings, opts.steps, opts.threads))
        base = statistics.median(t["steps"] for t in times["torch CPU eager"])
        for row, samples in times.items():
            steps = statistics.median(t["steps"] for t in samples)
            wall = statistics.median(t["wall"] for t in samples)
            print(f"| {workload} | {row} | {steps:.2f} | {wall:.2f} | {steps / base:.1f}x |")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
