"""`torch-pjrt demo`: train a char-level GPT on pjrt, then the same on the CPU, and compare.

The two runs share everything but the device string: the same weights (drawn on the CPU
from one seed), the same batches, the same AdamW. The demo prints the speed of each, how
closely the loss curves agree, and text sampled from the model trained on pjrt.
"""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Run:
    device: str
    losses: list
    warmup_s: float  # the first `warmup` steps: tracing and compiling executables on pjrt
    steady_s: float  # the remaining steps
    steady_tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.steady_tokens / self.steady_s if self.steady_s > 0 else float("nan")


def _sync(device: str) -> None:
    import torch

    if device.startswith("pjrt"):
        torch.pjrt.synchronize()


def train(device: str, data, steps: int, warmup: int, size: dict, batch_size: int, label: str, quiet: bool):
    """Train the GPT on `device` with a progress bar; (Run, model)."""
    from tqdm.auto import tqdm

    from . import demo_models as dm

    _, model, opt = dm.gpt_setup(device, data=data, lr=size.get("lr", 3e-3), **{k: v for k, v in size.items() if k != "lr"})
    bar = tqdm(total=steps, desc=label, unit="step", disable=quiet, dynamic_ncols=True, leave=True)
    marks = {}
    tokens_per_step = batch_size * model.cfg.block_size

    def on_step(step, loss):
        if step == warmup - 1:
            _sync(device)
            marks["warm"] = time.perf_counter()
        if step % 10 == 9 or step == steps - 1:  # reading the loss syncs: not every step
            bar.set_postfix(loss=f"{loss.item():.3f}")
        bar.update(1)

    start = time.perf_counter()
    losses = dm.train_gpt(data, model, opt, device, steps, batch_size=batch_size, on_step=on_step)
    _sync(device)
    end = time.perf_counter()
    bar.close()
    warm = marks.get("warm", start)
    run = Run(device, losses, warm - start, end - warm, (steps - warmup) * tokens_per_step)
    return run, model


SIZES = {  # nanoGPT-sized "baby" models that learn the tales' shape within the time budget
    "small": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, lr=3e-3),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, lr=3e-3),
}


def run(steps: int = 250, batch_size: int = 16, size: str = "small", cpu: bool = True, sample_chars: int = 200,
        warmup: int = 5, quiet: bool = False, cpu_steps: int = 40) -> int:
    t0 = time.perf_counter()
    import torch

    import torch_pjrt

    from . import demo_models as dm

    from rich.console import Console
    from rich.table import Table

    console = Console()
    warmup = max(1, min(warmup, steps - 1))
    cfg = SIZES[size]
    data = dm.CharData(dm.load_text())
    device_name = torch.pjrt.get_device_name(0)
    n_params = sum(p.numel() for p in dm.GPT(dm.GPTConfig(vocab_size=data.vocab_size, **{
        k: v for k, v in cfg.items() if k != "lr"})).parameters())
    console.print(f"[bold]torch-pjrt demo[/bold]: a char-level GPT ({n_params / 1e6:.2f}M parameters, "
                  f"{cfg['n_layer']} layers, d={cfg['n_embd']}, context {cfg['block_size']}) learns "
                  f"{len(data.data) / 1e3:.0f} KB of tales, {steps} AdamW steps of {batch_size} sequences.")
    console.print(f"pjrt device: {device_name}; the same script, device string \"pjrt\", then \"cpu\".")

    pjrt_run, model = train("pjrt", data, steps, warmup, cfg, batch_size, "pjrt", quiet)
    runs = [pjrt_run]
    cpu_steps = min(cpu_steps, steps)
    cpu = cpu and cpu_steps > warmup
    if cpu:  # the first cpu_steps steps of the same run: enough for the speed and the curves' agreement
        cpu_run, _ = train("cpu", data, cpu_steps, warmup, cfg, batch_size, "cpu ", quiet)
        runs.append(cpu_run)

    table = Table(title="training")
    for col in ("device", "steps", "first steps (s)", "tokens/s", "loss: first", "loss: last"):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(r.device, str(len(r.losses)), f"{r.warmup_s:.1f} ({warmup} steps)", f"{r.tokens_per_s:,.0f}",
                      f"{r.losses[0]:.4f}", f"{r.losses[-1]:.4f}")
    console.print(table)
    if cpu:
        diffs = [abs(a - b) for a, b in zip(pjrt_run.losses, cpu_run.losses)]
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        early = min(10, len(diffs))
        console.print(f"loss curves, pjrt vs cpu: max |difference| {max(diffs[:early]):.1e} over the first {early} "
                      f"steps, {max(diffs):.1e} over {len(diffs)} steps (step {worst + 1}). float32 rounding "
                      f"differs (XLA fuses and reorders sums) and training amplifies it step by step.")
        console.print(f"pjrt speed: {pjrt_run.tokens_per_s / cpu_run.tokens_per_s:.2f}x torch CPU eager "
                      f"(steady state, after {warmup} warm-up steps)")

    prompt = dm.load_text()[: model.cfg.block_size]
    idx = torch.tensor([data.encode(prompt)], device="pjrt")
    out = model.generate(idx, sample_chars, torch.Generator().manual_seed(0))
    text = data.decode(out[0, len(prompt):].cpu())
    console.rule("sample from the model trained on pjrt")
    console.print(prompt + "[bold cyan]" + rich_escape(text) + "[/bold cyan]", highlight=False)
    console.rule()
    fallbacks = torch_pjrt.fallback_ops()
    if fallbacks:
        console.print(f"ops that ran on the CPU fallback: {fallbacks}")
    console.print(f"demo wall time: {time.perf_counter() - t0:.0f} s")
    return 0


def rich_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
