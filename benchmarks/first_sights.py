"""Cold first sights: a shape sweep and a new process's first training steps, each in a fresh process
with empty caches (a new TORCH_PJRT_CACHE_DIR holding only the built C++ runtime), with
TORCH_PJRT_FUSED_COLD_FRACTION off and on (docs/eager.md, "First sights of new shapes").

    python benchmarks/first_sights.py                 # markdown table, load average
    python benchmarks/first_sights.py --fractions 0,0.25,0.1

Rows: "sweep" (a cross-entropy forward and backward over 30 batch sizes, each a new shape), "gpt"
and "cnn" (benchmarks/train_eager.py's workloads, their first 5 steps). Each number is one process's
wall time from the workload's construction to its last read (import excluded).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys, time
sys.path.insert(0, {benchmarks!r})
import torch
torch.set_num_threads(1)
import torch.nn.functional as F
import torch_pjrt, train_eager
start = time.perf_counter()
if {workload!r} == "sweep":
    for n in range(2, 32):
        x = torch.randn(n, 7, device="pjrt", requires_grad=True)
        y = torch.randint(0, 7, (n,), device="pjrt")
        (F.cross_entropy(x, y, label_smoothing=0.1) + (x.softmax(-1) * x).sum()).backward()
        assert torch.isfinite(x.grad).all().item()
else:
    step = train_eager.WORKLOADS[{workload!r}]("pjrt")
    for _ in range(5):
        float(step())
print("RESULT", time.perf_counter() - start, torch_pjrt.eager_stats()["fused"]["region_compiles_at_first_sight"])
"""


def sample(workload: str, fraction: str) -> tuple[float, int]:
    from torch_pjrt.runtime import build

    with tempfile.TemporaryDirectory() as cache:
        runtime = build._build_dir(build._key())  # the built runtime only: every other cache starts empty
        shutil.copytree(runtime, Path(cache) / runtime.name)
        env = {**os.environ, "TORCH_PJRT_CACHE_DIR": cache, "TORCH_PJRT_FUSED_COLD_FRACTION": fraction,
               "TORCH_PJRT_PLATFORM": os.environ.get("TORCH_PJRT_PLATFORM", "cpu")}
        code = CHILD.format(benchmarks=str(Path(__file__).resolve().parent), workload=workload)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    if "RESULT" not in out.stdout:
        raise RuntimeError(f"{workload} failed:\n{out.stderr[-3000:]}")
    seconds, compiled = out.stdout.split("RESULT")[-1].split()
    return float(seconds), int(compiled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="sweep,gpt,cnn")
    parser.add_argument("--fractions", default="0,0.25")
    args = parser.parse_args()
    fractions = args.fractions.split(",")
    print(f"load average at start: {os.getloadavg()[0]:.2f}\n")
    print("| workload | " + " | ".join(f"COLD_FRACTION={f} (s, regions compiled at first sight)" for f in fractions) + " |")
    print("|---|" + "---:|" * len(fractions))
    for workload in args.workloads.split(","):
        cells = [sample(workload, f) for f in fractions]
        print(f"| {workload} | " + " | ".join(f"{s:.1f} ({n})" for s, n in cells) + " |")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
