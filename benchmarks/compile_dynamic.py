"""Dynamic-shape overhead: a char-GPT training forward+backward compiled with pjrt, dynamic=True
(padded per power-of-two bucket) versus static (dynamic=False: one executable per length).

Run:  TORCH_PJRT_PLATFORM=cpu python benchmarks/compile_dynamic.py [--steps 10] [--lengths 12,20,33,50,64]

For each sequence length: median step time after warm-up, for static and bucketed; plus the
total first-call (compile) time over all lengths and the executables built. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import torch  # noqa: E402

import torch_pjrt.compiler  # noqa: E402
from test_compile_dynamic import CharGPT  # noqa: E402


def run(dynamic, lengths, steps, batch, d):
    torch._dynamo.reset()
    torch_pjrt.compiler.reset_compile_stats()
    torch.manual_seed(0)
    model = CharGPT(vocab=65, d=d, block_size=128).to("pjrt")
    compiled = torch.compile(model, backend="pjrt", dynamic=dynamic)
    times, first = {}, 0.0
    for T in lengths:
        idx = torch.randint(0, 65, (batch, T)).to("pjrt")
        start = time.perf_counter()
        compiled(idx, idx).backward()
        torch.pjrt.synchronize()
        first += time.perf_counter() - start
        samples = []
        for _ in range(steps):
            start = time.perf_counter()
            loss = compiled(idx, idx)
            loss.backward()
            loss.item()
            samples.append(time.perf_counter() - start)
        times[T] = statistics.median(samples) * 1e3
    return times, first, torch_pjrt.compiler.compile_stats()["executables"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lengths", default="12,20,33,50,64")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--d", type=int, default=64)
    args = parser.parse_args()
    lengths = [int(v) for v in args.lengths.split(",")]
    static, static_first, static_exe = run(False, lengths, args.steps, args.batch, args.d)
    bucketed, bucketed_first, bucketed_exe = run(True, lengths, args.steps, args.batch, args.d)
    print(f"char GPT (1 block, d={args.d}, batch {args.batch}), forward + backward, median of {args.steps} steps\n")
    print("| T | bucket | static | bucketed | bucketed / static |")
    print("|---|---|---|---|---|")
    for T in lengths:
        b = 1 << (T - 1).bit_length()
        print(f"| {T} | {b} | {static[T]:.2f} ms | {bucketed[T]:.2f} ms | {bucketed[T] / static[T]:.2f}x |")
    print(f"\nfirst calls (compile) over all lengths: static {static_first:.1f} s ({static_exe} executables), "
          f"bucketed {bucketed_first:.1f} s ({bucketed_exe} executables)")


if __name__ == "__main__":
    main()
