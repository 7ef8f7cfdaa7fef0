"""Eager compile storms: first pass and repeat of code that used to compile per value or length,
pjrt beside torch CPU eager in the same run.

    python benchmarks/eager_compiles.py                      # both workloads, markdown tables
    python benchmarks/eager_compiles.py --workloads loop     # just the Python-int loop
    python benchmarks/eager_compiles.py --threads 1          # steadier CPU numbers on a shared machine

Workloads (each in a fresh process, with the persistent eager cache off there, so that the
first pass is what a new user's first run pays):
  loop      out[i, j, k] = src[i, j, idx[i, j, k]] over a 10x10x3 index (300 Python-int
            element reads and writes): ms per element, first pass and repeat (median)
  generate  Hugging Face generate(), greedy, max_new_tokens=32, default dynamic KV cache, on
            the tiny random Llama and a tiny random GPT-2 of torch_pjrt/tools/bench_llm.py:
            ms per new token, first pass and cached (median)
and, for pjrt, the XLA compiles of the first pass and of the repeats (eager op executables,
storage view reads and transfers alike) and how many were eager op executables
The CPU and pjrt passes alternate (first pass of each, then repeat 1 of each, ...), so a
change in the machine's load hits both. With the 1-minute load average above the core count
the tables are printed but marked as not a result.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")


def _sync(device: str) -> None:
    import torch

    if device == "pjrt":
        torch.pjrt.synchronize()


# ------------------------------------------------------------------ workloads (in the child)
def loop_workload(device: str):
    import torch

    generator = torch.Generator().manual_seed(0)
    src = torch.randn(10, 10, 5, generator=generator).to(device)
    idx = torch.randint(0, 5, (10, 10, 3), generator=generator).to(device)
    out = torch.empty(10, 10, 3, device=device)

    def one_pass():
        for i in range(10):
            for j in range(10):
                for k in range(3):
                    out[i, j, k] = src[i, j, idx[i, j, k]]
        _sync(device)
        return out.cpu()

    return one_pass, 300  # elements per pass


def generate_workload(spec: str | None):
    def make(device: str):
        import torch
        from torch_pjrt.tools import bench_llm

        new_tokens = 32
        model = bench_llm.causal_lm(spec, 64).build().eval().to(device)
        prompt = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
        prompt = prompt.to(device)

        def one_pass():
            with torch.no_grad():
                tokens = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                        min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            _sync(device)
            return tokens.cpu()

        return one_pass, new_tokens  # tokens per pass

    return make


WORKLOADS = {
    "loop": [("10x10x3 Python-int gather loop", "ms/element", loop_workload)],
    "generate": [("generate, tiny Llama", "ms/token", generate_workload(None)),
                 ("generate, tiny GPT-2", "ms/token", generate_workload("hf:gpt2"))],
}


def child(name: str, repeats: int) -> None:
    """Run one workload's rows on both devices, interleaved; print one JSON line per row."""
    import jax.monitoring
    import torch
    import torch_pjrt

    compiled = []  # every XLA compile in this process (eager executables, view reads, transfers)
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: compiled.append(seconds) if event.endswith("backend_compile_duration") else None)
    for label, unit, make in WORKLOADS[name]:
        passes = {d: make(d) for d in ("cpu", "pjrt")}
        times = {"cpu": [], "pjrt": []}
        results, executables = {}, {}
        torch_pjrt.reset_eager_stats()
        compiled.clear()
        for r in range(1 + repeats):
            for device in ("pjrt", "cpu"):
                fn, per = passes[device]
                start = time.perf_counter()
                results[device] = fn()
                times[device].append((time.perf_counter() - start) / per * 1e3)
                if device == "pjrt":
                    executables[r] = len(compiled)
        stats = torch_pjrt.eager_stats()
        print(json.dumps({
            "row": label, "unit": unit,
            "cpu_first": times["cpu"][0], "cpu_repeat": statistics.median(times["cpu"][1:]),
            "pjrt_first": times["pjrt"][0], "pjrt_repeat": statistics.median(times["pjrt"][1:]),
            "executables_first": executables[0], "executables_repeats": executables[repeats] - executables[0],
            "eager_executables": stats["executables"], "compile_s": sum(compiled),
            "equal_cpu": bool(torch.equal(results["cpu"], results["pjrt"])),
            "threads": torch.get_num_threads(),
        }), flush=True)


# ------------------------------------------------------------------ the parent
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="loop,generate")
    parser.add_argument("--repeats", type=int, default=5, help="passes after the first (their median is reported)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for both devices")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        child(args.child, args.repeats)
        return

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load_at_start = os.getloadavg()[0]
    env = {**os.environ, "TORCH_PJRT_COMPILE_CACHE": "0"}  # the first pass compiles, as in a new user's first run
    rows = []
    for name in args.workloads.split(","):
        command = [sys.executable, __file__, "--child", name, "--repeats", str(args.repeats)]
        if args.threads:
            command += ["--threads", str(args.threads)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            print(f"{name}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    load = os.getloadavg()[0]

    import torch

    print(f"torch {torch.__version__}, torch CPU threads {rows[0]['threads'] if rows else '?'}, {cores} cores, "
          f"persistent eager cache off, first pass + median of {args.repeats} repeats, "
          f"1-minute load average {load_at_start:.2f} at start, {load:.2f} at the end")
    if max(load, load_at_start) > cores:
        print(f"\n**NOT A RESULT: the load average is above the {cores} cores; run it again on a quiet machine.**")
    print("\n| workload | unit | torch CPU first | torch CPU repeat | pjrt first | pjrt repeat | pjrt repeat / CPU "
          "| pjrt XLA compiles (first pass / repeats) | of them eager op executables | pjrt compile (s) | equal to CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['row']} | {r['unit']} | {r['cpu_first']:.3f} | {r['cpu_repeat']:.3f} | {r['pjrt_first']:.3f} "
              f"| {r['pjrt_repeat']:.3f} | {r['pjrt_repeat'] / r['cpu_repeat']:.1f}x "
              f"| {r['executables_first']} / {r['executables_repeats']} | {r['eager_executables']} | {r['compile_s']:.1f} "
              f"| {r['equal_cpu']} |")


if __name__ == "__main__":
    main()
