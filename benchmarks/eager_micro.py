"""Eager per-op overhead: pjrt beside torch CPU and a raw jax.jit call, in one run.

    python benchmarks/eager_micro.py            # prints a markdown table
    python benchmarks/eager_micro.py --breakdown   # where a fused call's host time goes (docs/eager.md)
Each number is the best of 5 repetitions of N calls, in microseconds per call; pjrt in both
eager modes (op by op, fused: then the loop's calls are recorded and run as regions).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")

import jax  # noqa: E402
import torch  # noqa: E402

import torch_pjrt  # noqa: E402
from torch_pjrt.runtime import storage  # noqa: E402


def per_call_us(fn, n: int = 2000, reps: int = 5, sync=None, after=None) -> float:
    """Best of `reps` loops of `n` calls (each loop ends with `sync()`, inside the timing, then
    `after()`, outside it)."""
    for _ in range(200):
        fn()
    if after is not None:
        after()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if sync is not None:
            sync()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
        if after is not None:
            after()
    return best


def breakdown() -> None:
    """Where a fused eager call's host time goes (docs/eager.md): a 16x16 add recorded by the C++
    recorder, the Python recorder alone, a Python kernel's call, and a cached region's run."""
    from torch_pjrt.eager.kernels import _REGISTERED
    from torch_pjrt.ops.call import weak_scalar
    from torch_pjrt.runtime import fused

    torch_pjrt.set_eager_mode("fused")
    a_cpu, b_cpu = torch.randn(16, 16), torch.randn(16, 16)
    a, b = a_cpu.to("pjrt"), b_cpu.to("pjrt")
    recordable, args = _REGISTERED[torch.ops.aten.add.Tensor].run, (storage.read(a), storage.read(b), weak_scalar(1))
    sync = torch.pjrt.synchronize

    def region_of_100():
        for _ in range(100):
            a + b
        sync()

    rows = [
        ("torch CPU eager", per_call_us(lambda: a_cpu + b_cpu)),
        ("pjrt fused, recorded in C++ (the steady fast path)", per_call_us(lambda: a + b, n=1000, after=sync)),
        ("fused.record alone (the Python recorder)", per_call_us(lambda: fused.record(recordable, args), n=1000,
                                                                  after=sync)),
        ("a Python kernel's call: torch.cat((a, b)), recorded by fused.record",
         per_call_us(lambda: torch.cat((a, b)), n=1000, after=sync)),
        ("a cached region of 100 adds: record and run, per add", per_call_us(region_of_100, n=20) / 100),
    ]
    print("| 16x16 add, fused eager | us per call |")
    print("|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


def import_seconds(autoload: bool, runs: int = 5) -> float:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1" if autoload else "0"}
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    return min(float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True).stdout) for _ in range(runs))


def main() -> None:
    if "--breakdown" in sys.argv:
        torch.set_num_threads(1)
        breakdown()
        return
    a_cpu, b_cpu = torch.randn(16, 16), torch.randn(16, 16)
    a, b = a_cpu.to("pjrt"), b_cpu.to("pjrt")
    ja, jb = storage.read(a), storage.read(b)
    jadd = jax.jit(lambda x, y: x + y)
    jadd_t = jax.jit(lambda x, y: x.T + y)
    jmul = jax.jit(lambda x: x * 2.5)
    c_cpu, c = a_cpu.clone(), a.clone()
    cases = [  # (name, torch CPU call, pjrt call, raw jax.jit call)
        ("16x16 add", lambda: a_cpu + b_cpu, lambda: a + b, lambda: jadd(ja, jb)),
        ("16x16 add through a.t()", lambda: a_cpu.t() + b_cpu, lambda: a.t() + b, lambda: jadd_t(ja, jb)),
        ("16x16 mul by a Python number", lambda: a_cpu * 2.5, lambda: a * 2.5, lambda: jmul(ja)),
        ("16x16 in-place add_", lambda: c_cpu.add_(b_cpu), lambda: c.add_(b), lambda: jadd(ja, jb)),
        ("torch.empty(16, 16)", lambda: torch.empty(16, 16), lambda: torch.empty(16, 16, device="pjrt"), None),
    ]
    modes = ("op", "fused")
    rows = []
    for name, cpu, pjrt, raw in cases:
        per_mode = []
        for mode in modes:  # a loop of N calls, then synchronize: fused mode runs them as regions
            torch_pjrt.set_eager_mode(mode)
            per_mode.append(per_call_us(pjrt, sync=torch.pjrt.synchronize))
        rows.append((name, per_call_us(cpu), *per_mode, per_call_us(raw) if raw else None))
    torch_pjrt.set_eager_mode("op")
    rows.append(("copy 16x16 to CPU", per_call_us(lambda: a_cpu.clone()), per_call_us(lambda: a.cpu(), 1000), None,
                 per_call_us(lambda: jax.device_get(ja), 1000)))
    print("| op | torch CPU (us) | pjrt op-by-op (us) | pjrt fused (us) | raw jax.jit (us) | op-by-op / jax.jit |")
    print("|---|---|---|---|---|---|")
    for name, cpu, op, fused, raw in rows:
        ratio = f"{op / raw:.2f}x" if raw else "-"
        raw_text = f"{raw:.1f}" if raw else "-"
        fused_text = f"{fused:.1f}" if fused is not None else "- (a host read)"
        print(f"| {name} | {cpu:.1f} | {op:.1f} | {fused_text} | {raw_text} | {ratio} |")
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with_autoload, without = import_seconds(True), import_seconds(False)
    print(f"\n`import torch`: {without:.2f} s without autoload, {with_autoload:.2f} s with torch-pjrt autoloaded "
          f"(+{with_autoload - without:.2f} s)")


if __name__ == "__main__":
    main()
