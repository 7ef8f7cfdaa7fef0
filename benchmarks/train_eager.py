"""Eager training step time on pjrt beside torch CPU eager, in the same run.

    python benchmarks/train_eager.py               # markdown table + where pjrt's time goes
    python benchmarks/train_eager.py --threads 1   # steadier CPU numbers on a shared machine
    TORCH_PJRT_PLATFORM=gpu python benchmarks/train_eager.py --peer cuda   # on a GPU: against torch CUDA eager

Workloads (torch_pjrt.tools.demo_models, the models the demo and the examples train):
  gpt: char GPT, 4 layers, d=128, context 64, batch 8, AdamW + clip_grad_norm_ (DESIGN.md's reference step)
  cnn: two conv + batch-norm + max-pool blocks and an MLP head on 1x16x16 images, batch 32, Adam
Each number is the median step time over --steps steps after --warmup steps (the first
compile pjrt's executables), the rows' steps interleaved; pjrt steps end with
torch.pjrt.synchronize(). pjrt runs in each eager mode of --modes (fused, op).
--sync-every K times K steps and one synchronize as one sample (its time / K): a loop that
reads its loss every K steps, where pjrt's steps queue behind each other as CUDA's do.

With --peer cuda the CUDA rows run in a process of their own (before the pjrt rows, not
interleaved): torch's autograd cannot run a CUDA backward in a process where pjrt is registered
(torch keeps one accelerator per process and takes a PrivateUse1 backend first).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

PEER_PROCESS = "--peer-process" in sys.argv  # this process times a torch CUDA peer alone: no pjrt


def tool(name: str):
    """torch_pjrt.tools.<name>; in a peer process loaded from its file, since importing the
    package registers pjrt."""
    if not PEER_PROCESS:
        return importlib.import_module(f"torch_pjrt.tools.{name}")
    path = Path(__file__).resolve().parents[1] / "torch_pjrt" / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"peer_{name}", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


if not PEER_PROCESS:
    import torch_pjrt  # noqa: E402,F401
dm = tool("demo_models")


def gpt_workload(device):
    data, model, opt = dm.gpt_setup(device, n_layer=4, n_embd=128, n_head=4, block_size=64)
    generator = torch.Generator().manual_seed(1)

    def step():
        x, y = data.batch(generator, 8, 64)
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    return step


def cnn_workload(device):
    generator = torch.Generator().manual_seed(0)
    images, labels = dm.shapes(generator, 256)
    torch.manual_seed(0)
    model = dm.CNN().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        i = torch.randint(len(images), (32,), generator=generator)
        loss = F.cross_entropy(model(images[i].to(device)), labels[i].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


WORKLOADS = {"gpt": gpt_workload, "cnn": cnn_workload}


def sync(device):
    if device == "pjrt":
        torch.pjrt.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


class Runner:
    """One workload on one device (and, for pjrt, one eager mode), timed step by step."""

    def __init__(self, make, device: str, mode: str | None, warmup: int, sync_every: int = 1):
        self.device, self.mode, self.sync_every = device, mode, sync_every
        self.enter()
        self.step = make(device)
        start = time.perf_counter()
        for _ in range(warmup):
            self.step()
        sync(device)
        self.first = time.perf_counter() - start
        self.times: list = []
        self.thread_times: list = []  # the main thread's CPU time: the host work, without waits

    def enter(self) -> None:
        if self.mode is not None:
            torch_pjrt.set_eager_mode(self.mode)

    def time_one(self) -> None:
        self.enter()
        t, cpu = time.perf_counter(), time.thread_time()
        for _ in range(self.sync_every):
            self.step()
        sync(self.device)
        self.times.append((time.perf_counter() - t) / self.sync_every)
        self.thread_times.append((time.thread_time() - cpu) / self.sync_every)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def thread_median(self) -> float:
        return statistics.median(self.thread_times)


class PeerProcess:
    """A Runner's numbers for a torch peer (CUDA) timed by `script` in a process of its own
    (`--peer-process`): the child prints {"median", "first"} in seconds as its last line."""

    def __init__(self, script: str, workload: str, argv: list[str], device: str = "cuda"):
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        out = subprocess.run([sys.executable, script, "--peer-process", "--peer", device, "--workloads", workload,
                              *argv], capture_output=True, text=True, env=env, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"the {device} peer process failed: {(out.stderr or out.stdout).strip()[-800:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        self.median, self.first, self.device, self.mode = result["median"], result["first"], device, None

    def time_one(self) -> None:  # timed already, in its own process
        pass


def run_peer_process(make, device: str, warmup: int, sync_every: int, samples: int) -> None:
    """A peer process's whole work: time `make(device)`'s step, then print PeerProcess's last line."""
    runner = Runner(make, device, None, warmup, sync_every)
    for _ in range(samples):
        runner.time_one()
    print(json.dumps({"median": runner.median, "first": runner.first}))


def profile_step(step, device):
    """(aten ops per step, top ops by self CPU time) of one more step."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
        sync(device)
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    # top-level aten calls only: the dispatcher's nested calls are counted in their parent
    top_level = sum(1 for e in prof.events() if e.name.startswith("aten::") and
                    (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return top_level, events[:8]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="gpt,cnn")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for the CPU rows")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--modes", default="fused,op", help="pjrt eager modes to time (torch_pjrt.set_eager_mode)")
    parser.add_argument("--peer", default="cpu", choices=("cpu", "cuda"), help="the torch eager device pjrt is compared with")
    parser.add_argument("--sync-every", type=int, default=1, help="steps per synchronize (one timed sample)")
    parser.add_argument("--peer-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if PEER_PROCESS:
        return run_peer_process(WORKLOADS[args.workloads], args.peer, args.warmup, args.sync_every, args.steps)
    modes = args.modes.split(",")
    rows, profiles, failed = [], {}, []
    for name in args.workloads.split(","):
        try:
            if args.peer == "cuda":
                runners = [PeerProcess(__file__, name, ["--steps", str(args.steps), "--warmup", str(args.warmup),
                                                        "--sync-every", str(args.sync_every)])]
            else:
                runners = [Runner(WORKLOADS[name], args.peer, None, args.warmup, args.sync_every)]
            runners += [Runner(WORKLOADS[name], "pjrt", mode, args.warmup, args.sync_every) for mode in modes]
            for _ in range(args.steps):  # interleaved: a load change hits every row alike
                for runner in runners:
                    runner.time_one()
        except Exception as e:  # noqa: BLE001  (one row's failure is that row's result)
            failed.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        rows.append((name, runners))
        if not args.no_profile:
            runners[1].enter()
            profiles[name] = profile_step(runners[1].step, "pjrt")

    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, torch CPU threads {torch.get_num_threads()}, "
          f"pjrt device {torch.pjrt.get_device_name()}, median of {args.steps} interleaved samples of "
          f"{args.sync_every} step(s) and a synchronize, "
          f"load average {load:.2f} on {os.cpu_count()} cores\n")
    peer = "CPU" if args.peer == "cpu" else "CUDA"
    print(f"| workload | torch {peer} eager (ms/step) | " + " | ".join(
        f"pjrt {m} (ms/step) | pjrt {m} / {peer} | pjrt {m} first {args.warmup} steps (s)" for m in modes) + " |")
    print("|---|---|" + "---|---|---|" * len(modes))
    for name, (peer_row, *pjrt_rows) in rows:
        cells = " | ".join(f"{r.median * 1e3:.1f} | {r.median / peer_row.median:.2f}x | {r.first:.1f}" for r in pjrt_rows)
        print(f"| {name} | {peer_row.median * 1e3:.1f} | {cells} |")
    for line in failed:
        print(f"| {line} |")
    for name, (ops, top) in profiles.items():
        pjrt = next(r for n, r in rows if n == name)[1].median
        print(f"\n{name} on pjrt ({modes[0]}): {ops} top-level aten calls per step, {pjrt / ops * 1e6:.0f} us per call on average")
        print("| op | calls | self CPU total (ms) |")
        print("|---|---|---|")
        for e in top:
            print(f"| {e.key} | {e.count} | {e.self_cpu_time_total / 1e3:.1f} |")
    print(f"\nCPU fallback ops seen: {torch_pjrt.fallback_ops() or 'none'}")
    print(f"decomposed ops seen: {torch_pjrt.decomposed_ops() or 'none'}")


if __name__ == "__main__":
    main()
