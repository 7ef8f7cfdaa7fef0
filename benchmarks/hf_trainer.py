"""A Hugging Face Trainer's samples/s on pjrt beside the CPU, in the same run, interleaved.

    python benchmarks/hf_trainer.py                 # tiny Llama (2 layers, d=64), batch 8, 32 tokens
    python benchmarks/hf_trainer.py --layers 4 --hidden 128 --rounds 5

Each round trains a fresh Trainer for --steps steps on pjrt (no setting: the defaults of
torch_pjrt/integrations/huggingface.py) and one on the CPU (`use_cpu=True` with
ACCELERATE_TORCH_DEVICE=cpu, as docs/ecosystem.md says), alternating. A round's number is the
median step time after --warmup steps (pjrt compiles its regions there), timed by a callback
at each step's end, which includes the Trainer's own work (data collation, logging, the
optimizer); pjrt synchronizes at each step end so its queued work counts. torch runs on as many
threads as XLA's CPU client uses. The table gives the median over rounds and the load average.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")

import torch  # noqa: E402
import transformers  # noqa: E402


class StepTimes(transformers.TrainerCallback):
    def __init__(self, device: str):
        self.device, self.times, self.last = device, [], None

    def on_step_end(self, args, state, control, **kwargs):
        if self.device == "pjrt":
            torch.pjrt.synchronize()
        now = time.perf_counter()
        if self.last is not None:
            self.times.append(now - self.last)
        self.last = now


def train(device: str, opts) -> list[float]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=opts.hidden, intermediate_size=2 * opts.hidden,
                                      num_hidden_layers=opts.layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=opts.tokens)
    model = transformers.LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(1)
    n = opts.batch * (opts.steps + 1)
    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 256, (n, opts.tokens), generator=g)]
    env = os.environ.get("ACCELERATE_TORCH_DEVICE")
    os.environ["ACCELERATE_TORCH_DEVICE"] = device
    try:
        args = transformers.TrainingArguments(
            output_dir="/tmp/hf_trainer_bench", per_device_train_batch_size=opts.batch, max_steps=opts.steps,
            report_to=[], save_strategy="no", logging_strategy="no", use_cpu=device == "cpu", disable_tqdm=True,
            learning_rate=1e-3, seed=0)
        timer = StepTimes(device)
        transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[timer]).train()
    finally:
        os.environ["ACCELERATE_TORCH_DEVICE"] = env or "pjrt"
    return timer.times[opts.warmup:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    opts = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    medians = {"pjrt": [], "cpu": []}
    for _ in range(opts.rounds):
        for device in ("pjrt", "cpu"):
            medians[device].append(statistics.median(train(device, opts)))
    pjrt, cpu = statistics.median(medians["pjrt"]), statistics.median(medians["cpu"])
    print(f"Trainer, Llama {opts.layers} layers d={opts.hidden}, batch {opts.batch} x {opts.tokens} tokens, "
          f"{opts.rounds} rounds, load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| device | step (ms) | samples/s | step vs CPU |\n|---|---|---|---|")
    for name, t in (("pjrt", pjrt), ("cpu", cpu)):
        print(f"| {name} | {t * 1e3:.1f} | {opts.batch / t:.0f} | {t / cpu:.2f}x |")


if __name__ == "__main__":
    main()
