"""Training-step time: torch.compile(backend="pjrt") vs inductor on CPU vs pjrt eager vs CPU eager.

Run:  TORCH_PJRT_PLATFORM=cpu python benchmarks/compile_step.py [--steps 20] [--models mlp,cnn,gpt]

Each model trains with AdamW; one step = zero_grad, forward, loss, backward, optimizer.step(),
the whole step under torch.compile for the compiled columns. Times are medians of --steps
steps after warm-up (the first compiled call's time is reported separately as compile time).
Prints a markdown table; ratios are against inductor in the same run.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_pjrt  # noqa: E402,F401
import torch_pjrt.compiler  # noqa: E402  (registers the "pjrt" backend until the entry point does)


class CharGPT(nn.Module):
    def __init__(self, vocab=65, d=128, heads=4, layers=4, T=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(T, d)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((T, T), float("-inf")), diagonal=1))

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x, src_mask=self.mask[:T, :T])
        return self.head(self.ln(x))


def models():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    cnn = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                        nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
    return {
        "mlp": (mlp, lambda: (torch.randn(64, 256), torch.randint(0, 10, (64,))), F.cross_entropy),
        "cnn": (cnn, lambda: (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))), F.cross_entropy),
        "gpt": (CharGPT(), lambda: (torch.randint(0, 65, (8, 64)), torch.randint(0, 65, (8, 64))),
                lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))),
    }


def step(model, opt, x, y, loss_fn):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


def measure(model, make_batch, loss_fn, device, backend, steps):
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fn = step if backend is None else torch.compile(step, backend=backend)
    batches = [tuple(t.to(device) for t in make_batch()) for _ in range(4)]
    start = time.perf_counter()
    fn(model, opt, *batches[0], loss_fn).item()
    first = time.perf_counter() - start
    for i in range(3):
        fn(model, opt, *batches[i % 4], loss_fn).item()
    times = []
    for i in range(steps):
        start = time.perf_counter()
        fn(model, opt, *batches[i % 4], loss_fn).item()  # .item(): wait for the device
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, first


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="mlp,cnn,gpt")
    args = parser.parse_args()
    configs = [("CPU eager", "cpu", None), ("inductor (CPU)", "cpu", "inductor"),
               ("pjrt eager", "pjrt", None), ("pjrt compiled", "pjrt", "pjrt")]
    print("| model | " + " | ".join(c[0] for c in configs) + " | pjrt compiled / inductor | first step (compile) pjrt / inductor |")
    print("|---" * (len(configs) + 3) + "|")
    for name in args.models.split(","):
        model, make_batch, loss_fn = models()[name]
        row, firsts = {}, {}
        for label, device, backend in configs:
            torch._dynamo.reset()
            try:
                row[label], firsts[label] = measure(model, make_batch, loss_fn, device, backend, args.steps)
            except Exception as e:  # noqa: BLE001  (report, keep the table going)
                row[label] = firsts[label] = None
                print(f"<!-- {name} {label} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]} -->")
        cells = [f"{row[c[0]]:.2f} ms" if row[c[0]] is not None else "failed" for c in configs]
        ratio = (f"{row['pjrt compiled'] / row['inductor (CPU)']:.2f}x"
                 if row["pjrt compiled"] and row["inductor (CPU)"] else "n/a")
        comp = (f"{firsts['pjrt compiled']:.1f} s / {firsts['inductor (CPU)']:.1f} s"
                if firsts["pjrt compiled"] and firsts["inductor (CPU)"] else "n/a")
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio} | {comp} |", flush=True)


if __name__ == "__main__":
    main()
