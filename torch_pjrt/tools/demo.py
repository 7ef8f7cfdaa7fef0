"""`torch-pjrt demo`: train a char-level GPT on pjrt and on the CPU, and compare.

The two runs share everything but the device string: the same weights (drawn on the CPU
from one seed), the same batches, the same AdamW. The demo prints the speed of each, how
closely the loss curves agree, and text sampled from the model trained on pjrt.

The speed ratio is measured so that it means something: the first `cpu_steps` steps of the
two runs are interleaved step by step (so a change in the machine's load hits both), each
step is timed to its end (a device synchronize on pjrt), the ratio is one of median step
times after the warm-up, and torch's CPU thread pool gets every core the process may use,
as XLA's CPU backend does. The machine's load average is printed beside the ratio; when it
exceeds the core count at the start, other processes compete for the CPU and the demo says
that the ratio is not a result instead of giving one.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field


@dataclass
class Run:
    device: str
    tokens_per_step: int
    losses: list = field(default_factory=list)  # loss tensors, one per step
    step_s: list = field(default_factory=list)  # each timed step's seconds, up to its synchronize
    warmup_s: float = 0.0  # the first `warmup` steps: tracing and compiling executables on pjrt

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / statistics.median(self.step_s) if self.step_s else float("nan")


def _sync(device: str) -> None:
    import torch

    if device.startswith("pjrt"):
        torch.pjrt.synchronize()


def cores() -> int:
    """CPUs this process may run on (XLA's CPU thread pool uses them all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def speed_verdict(pjrt: Run, cpu: Run, warmup: int, threads: int, load_at_start: float | None,
                  load_at_end: float | None, n_cores: int) -> str:
    """The speed line: a ratio with the conditions it was measured in, or why there is none."""
    load = (f"load average {load_at_start:.1f} at the start, {load_at_end:.1f} at the end with the demo's own "
            f"threads, on {n_cores} cores" if load_at_start is not None and load_at_end is not None
            else "load average unknown")
    if load_at_start is not None and load_at_start > n_cores:
        return (f"pjrt vs torch CPU eager: not a result here ({load}): other processes compete for the CPU "
                f"and torch's thread pool suffers most. Run the demo on a quiet machine for a speed ratio.")
    return (f"pjrt speed: {pjrt.tokens_per_s / cpu.tokens_per_s:.2f}x torch CPU eager (median step time over "
            f"steps {warmup + 1}-{len(cpu.step_s) + warmup}, the two runs interleaved step by step, torch on "
            f"{threads} threads; {load})")


SIZES = {  # nanoGPT-sized "baby" models that learn the tales' shape within the time budget
    "small": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, lr=3e-3),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, lr=3e-3),
}


def run(steps: int = 250, batch_size: int = 16, size: str = "small", cpu: bool = True, sample_chars: int = 200,
        warmup: int = 5, quiet: bool = False, cpu_steps: int = 40) -> int:
    t0 = time.perf_counter()
    load_at_start = load_average()  # before the demo's own work adds to it
    import torch
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from tqdm.auto import tqdm

    import torch_pjrt

    from . import demo_models as dm

    console = Console()
    warmup = max(1, min(warmup, steps - 1))
    cfg = SIZES[size]
    model_cfg = {k: v for k, v in cfg.items() if k != "lr"}
    data = dm.CharData(dm.load_text())
    device_name = torch.pjrt.get_device_name(0)
    n_params = sum(p.numel() for p in dm.GPT(dm.GPTConfig(vocab_size=data.vocab_size, **model_cfg)).parameters())
    console.print(f"[bold]torch-pjrt demo[/bold]: a char-level GPT ({n_params / 1e6:.2f}M parameters, "
                  f"{cfg['n_layer']} layers, d={cfg['n_embd']}, context {cfg['block_size']}) learns "
                  f"{len(data.data) / 1e3:.0f} KB of tales, {steps} AdamW steps of {batch_size} sequences.")
    console.print(f"pjrt device: {device_name}; the same script, device string \"pjrt\", then \"cpu\".")

    cpu_steps = min(cpu_steps, steps)
    cpu = cpu and cpu_steps > warmup
    n_cores = cores()
    threads_before = torch.get_num_threads()
    if cpu:
        torch.set_num_threads(n_cores)  # as many threads as XLA's CPU backend runs
    tokens_per_step = batch_size * cfg["block_size"]
    runs, stepping = {}, {}
    for device in ("pjrt", "cpu") if cpu else ("pjrt",):
        _, model, opt = dm.gpt_setup(device, data=data, lr=cfg["lr"], **model_cfg)
        runs[device] = Run(device, tokens_per_step)
        stepping[device] = (model, dm.training_steps(data, model, opt, device, batch_size=batch_size))
    model = stepping["pjrt"][0]
    timed_steps = cpu_steps if cpu else steps  # each synchronized; the rest of the pjrt run is not

    bar = tqdm(total=steps + (cpu_steps if cpu else 0), unit="step", disable=quiet, dynamic_ncols=True,
               desc="pjrt + cpu, interleaved" if cpu else "pjrt")
    try:
        for step in range(steps):
            devices = list(runs) if step < timed_steps else ["pjrt"]
            if step % 2:  # alternate which device goes first, so neither always follows the other
                devices.reverse()
            if step == timed_steps and cpu:
                bar.set_description("pjrt")
            for device in devices:
                r = runs[device]
                start = time.perf_counter()
                r.losses.append(next(stepping[device][1]))
                if step < timed_steps:
                    _sync(device)
                    seconds = time.perf_counter() - start
                    if step < warmup:
                        r.warmup_s += seconds
                    else:
                        r.step_s.append(seconds)
                bar.update(1)
            if step % 10 == 9 or step == steps - 1:  # reading the loss syncs: not every step
                bar.set_postfix(loss=f"{runs['pjrt'].losses[-1].item():.3f}")
    finally:
        bar.close()
        torch.set_num_threads(threads_before)
    load_at_end = load_average()
    losses = {device: [float(x) for x in torch.stack(r.losses).cpu()] for device, r in runs.items()}

    table = Table(title="training")
    for col in ("device", "steps", "first steps (s)", "tokens/s", "loss: first", "loss: last"):
        table.add_column(col, justify="right")
    for device, r in runs.items():
        table.add_row(device, str(len(r.losses)), f"{r.warmup_s:.1f} ({warmup} steps)", f"{r.tokens_per_s:,.0f}",
                      f"{losses[device][0]:.4f}", f"{losses[device][-1]:.4f}")
    console.print(table)
    if cpu:
        diffs = [abs(a - b) for a, b in zip(losses["pjrt"], losses["cpu"])]
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        early = min(10, len(diffs))
        console.print(f"loss curves, pjrt vs cpu: max |difference| {max(diffs[:early]):.1e} over the first {early} "
                      f"steps, {max(diffs):.1e} over {len(diffs)} steps (step {worst + 1}). float32 rounding "
                      f"differs (XLA fuses and reorders sums) and training amplifies it step by step.")
        console.print(speed_verdict(runs["pjrt"], runs["cpu"], warmup, n_cores, load_at_start, load_at_end,
                                    n_cores), highlight=False)

    prompt = dm.load_text()[: model.cfg.block_size]
    idx = torch.tensor([data.encode(prompt)], device="pjrt")
    # eager generate() compiles new executables while the text grows: a bar shows it is working
    with tqdm(total=sample_chars, unit="char", desc="sampling", disable=quiet, dynamic_ncols=True,
              leave=False) as sampling:
        out = model.generate(idx, sample_chars, torch.Generator().manual_seed(0), on_token=lambda: sampling.update(1))
    text = data.decode(out[0, len(prompt):].cpu())
    console.rule("sample from the model trained on pjrt")
    console.print(escape(prompt) + "[bold cyan]" + escape(text) + "[/bold cyan]", highlight=False)
    console.rule()
    fallbacks = torch_pjrt.fallback_ops()
    if fallbacks:
        console.print(f"ops that ran on the CPU fallback: {fallbacks}")
    console.print(f"demo wall time: {time.perf_counter() - t0:.0f} s")
    return 0
