"""Per-op eager overhead for a representative mix of ops, pjrt beside torch CPU, in one run.

    python benchmarks/op_overhead.py            # prints a markdown table and the load average

The mix (issue 3): elementwise, reduction, matmul, indexing, and a backward pass. Inputs are
small, so the numbers are dispatch overhead, not arithmetic. Each number is the best of 5
repetitions of N calls, in microseconds per call; pjrt calls end with a synchronize so
asynchronous dispatch is not counted as free.
"""
from __future__ import annotations

import os
import time

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")

import torch  # noqa: E402

import torch_pjrt  # noqa: E402,F401


def per_call_us(fn, sync, n: int = 1000, reps: int = 5) -> float:
    for _ in range(100):
        fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def workloads(device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=g).to(device), torch.randn(16, 16, generator=g).to(device)
    m1, m2 = torch.randn(64, 64, generator=g).to(device), torch.randn(64, 64, generator=g).to(device)
    table = torch.randn(1000, 16, generator=g).to(device)
    rows = torch.randint(0, 1000, (32,), generator=g).to(device)
    w = torch.randn(16, 16, generator=g).to(device).requires_grad_()

    def backward():
        loss = torch.relu(a @ w).sum()
        (grad,) = torch.autograd.grad(loss, w)
        return grad

    return {
        "elementwise: 16x16 add": lambda: a + b,
        "elementwise: 16x16 exp": lambda: torch.exp(a),
        "reduction: 16x16 sum(dim=1)": lambda: a.sum(dim=1),
        "reduction: 16x16 max(dim=0)": lambda: a.max(dim=0),
        "matmul: 64x64 @ 64x64": lambda: m1 @ m2,
        "indexing: table[rows] (1000x16, 32 rows)": lambda: table[rows],
        "indexing: index_select": lambda: torch.index_select(table, 0, rows),
        "backward: relu(a @ w).sum() grad": backward,
    }


def main() -> None:
    cpu = workloads("cpu")
    pjrt = workloads("pjrt")
    print("| op | torch CPU (us) | pjrt (us) | pjrt / CPU |")
    print("|---|---:|---:|---:|")
    for name in cpu:
        c = per_call_us(cpu[name], lambda: None)
        p = per_call_us(pjrt[name], torch.pjrt.synchronize)
        print(f"| {name} | {c:.1f} | {p:.1f} | {p / c:.1f}x |")
    print(f"\nload average while measuring: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
