"""Host cost of eager steps at tiny shapes: pjrt eager beside torch CPU eager, in the same run.

    python benchmarks/host_overhead.py                 # markdown table, load average, fast-path counts
    python benchmarks/host_overhead.py --rounds 11 --modes fused,op
    TORCH_PJRT_PLATFORM=gpu python benchmarks/host_overhead.py --peer cuda   # on a GPU: against torch CUDA eager

At these shapes the arithmetic is negligible, so a step's time is its host work: Python,
autograd, the dispatcher and, for pjrt, recording and dispatching its executables. That is what
an accelerator's eager step costs too (issue 29). torch runs on one thread
(torch.set_num_threads(1)); rows are timed interleaved, round by round (train_eager.Runner), and
each number is the median of --rounds samples. A ratio measured at a load average above the
number of cores is not a result. A second table gives the main thread's CPU time per step
(time.thread_time): the host work alone, which the VM's scheduling moves less than the wall clock. Workloads:
  gpt-read-1      char GPT, 2 layers, d=32, T=8, batch 1, AdamW + clip_grad_norm_, loss read each step
  gpt-read-10     the same, the loss read every 10 steps (one sample: 10 steps and a synchronize)
  decode          Llama-style decode step (tools/tiny_llama.py: 4 layers, d=64, GQA, static cache
                  written with index_copy_), the argmax token read each step
  chain-250       250 small elementwise ops on an 8x8 tensor, then a synchronize
  hf-llama, hf-gpt2  transformers' generate, 16 new tokens, per token (random tiny weights;
                  skipped without transformers)
With --peer cuda the GPT rows' CUDA peer runs in a process of its own, before the pjrt rows
(train_eager.py says why); the other rows stay interleaved in one process.
"""
from __future__ import annotations

import argparse
import logging
import os

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")

import torch  # noqa: E402

# benchmarks/: one timing loop for every eager benchmark, and the CUDA peer's own process
from train_eager import PEER_PROCESS, PeerProcess, Runner, run_peer_process, tool  # noqa: E402

if not PEER_PROCESS:
    import torch_pjrt  # noqa: E402
dm = tool("demo_models")
Decoder = tool("tiny_llama").Decoder
TRAINING = ("gpt-read-1", "gpt-read-10")  # against torch CUDA: in a process of its own (train_eager.py says why)

HF_TOKENS = 16


def gpt(read_every: int):
    def make(device):
        data, model, opt = dm.gpt_setup(device, n_layer=2, n_embd=32, n_head=2, block_size=8)
        steps = dm.training_steps(data, model, opt, device, batch_size=1)
        if read_every == 1:
            return lambda: float(next(steps))
        return lambda: next(steps)
    return make


def decode(device):
    decoder = Decoder(device)

    def step():
        decoder.step()
        return int(decoder.token[0, 0])
    return step


def chain(device):
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0)).to(device)

    def step():
        y = x
        for _ in range(125):
            y = y * 1.0001 + 0.5
        return y
    return step


def hf(spec: str | None):
    def make(device):
        from torch_pjrt.tools.bench_llm import causal_lm

        model = causal_lm(spec, 64).build().to(device).eval()
        prompt = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(0)).to(device)

        def step():
            with torch.no_grad():
                return model.generate(prompt, max_new_tokens=HF_TOKENS, min_new_tokens=HF_TOKENS, do_sample=False)
        return step
    return make


# name -> (make(device) -> step, steps per sample, what a sample is divided into)
WORKLOADS = {"gpt-read-1": (gpt(1), 1, 1), "gpt-read-10": (gpt(10), 10, 1), "decode": (decode, 1, 1),
             "chain-250": (chain, 1, 1), "hf-llama": (hf(None), 1, HF_TOKENS), "hf-gpt2": (hf("hf:gpt2"), 1, HF_TOKENS)}


def _hf_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--modes", default="fused", help="pjrt eager modes (torch_pjrt.set_eager_mode)")
    parser.add_argument("--why", action="store_true", help="log each region compile and why (torch_pjrt.fused at INFO)")
    parser.add_argument("--peer", default="cpu", choices=("cpu", "cuda"), help="the torch eager device pjrt is compared with")
    parser.add_argument("--peer-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if PEER_PROCESS:
        make, every, _ = WORKLOADS[args.workloads]
        return run_peer_process(make, args.peer, args.warmup, every, args.rounds)
    if args.why:
        logging.basicConfig(format="%(message)s")
        logging.getLogger("torch_pjrt.fused").setLevel(logging.INFO)
    torch.set_num_threads(1)
    modes = args.modes.split(",")
    names = [n for n in args.workloads.split(",") if _hf_available() or not n.startswith("hf-")]
    loads = [os.getloadavg()[0]]
    rows, failed = [], []
    for name in names:
        make, every, per = WORKLOADS[name]
        try:
            if args.peer == "cuda" and name in TRAINING:
                runners = [PeerProcess(__file__, name, ["--rounds", str(args.rounds), "--warmup", str(args.warmup)])]
            else:
                runners = [Runner(make, args.peer, None, args.warmup, every)]
            runners += [Runner(make, "pjrt", mode, args.warmup, every) for mode in modes]
            for _ in range(args.rounds):
                for runner in runners:
                    runner.time_one()
        except Exception as e:  # noqa: BLE001  (one row's failure is that row's result)
            failed.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        rows.append((name, per, runners))
        loads.append(os.getloadavg()[0])
    unit = "ms per step (hf: per token)"
    print(f"torch {torch.__version__} on 1 thread, pjrt {torch.pjrt.get_device_name()}, medians of {args.rounds} "
          f"interleaved rounds; load average (1 min) {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores"
          + ("  ** loaded: ratios are not results **" if max(loads) > os.cpu_count() else "") + "\n")
    peer = args.peer.upper()
    print(f"| workload ({unit}) | torch {peer} eager | " + " | ".join(f"pjrt {m} | {m} / {peer}" for m in modes) + " |")
    print("|---|---:|" + "---:|---:|" * len(modes))
    for name, per, (peer_row, *pjrt) in rows:
        cells = " | ".join(f"{r.median / per * 1e3:.2f} | {r.median / peer_row.median:.2f}x" for r in pjrt)
        print(f"| {name} | {peer_row.median / per * 1e3:.2f} | {cells} |")
    for line in failed:
        print(f"| {line} |")
    # The main thread's CPU time (time.thread_time) per step: the host work alone. The wall clock above
    # adds waiting for XLA's threads (on CPU they also run the arithmetic) and the VM's scheduling.
    print(f"\nMain thread CPU time ({unit}), the same rounds:\n")
    print(f"| workload | torch {peer} eager | " + " | ".join(f"pjrt {m} | {m} / {peer}" for m in modes) + " |")
    print("|---|---:|" + "---:|---:|" * len(modes))
    for name, per, (peer_row, *pjrt) in rows:
        if not getattr(peer_row, "thread_times", None):
            continue  # a peer timed in its own process
        cells = " | ".join(f"{r.thread_median / per * 1e3:.2f} | {r.thread_median / peer_row.thread_median:.2f}x"
                           for r in pjrt)
        print(f"| {name} | {peer_row.thread_median / per * 1e3:.2f} | {cells} |")
    print("\nWhat one more step of each pjrt row runs in Python (eager_stats()['paths']):")
    for name, _, (_, *pjrt) in rows:
        for runner in pjrt:
            runner.enter()
            torch_pjrt.reset_eager_stats()
            runner.step()
            torch.pjrt.synchronize()
            counts = torch_pjrt.eager_stats()["paths"]
            fast = sum(c["fast"] for c in counts.values())
            kernels = {n: c["python_kernel"] for n, c in counts.items() if c["python_kernel"]}
            recorded = sum(c["python_recorder"] for c in counts.values())
            print(f"- {name} ({runner.mode}): {fast} calls on the C++ fast path, {recorded} through the Python "
                  f"recorder, Python kernels {kernels or 'none'}")


if __name__ == "__main__":
    main()
