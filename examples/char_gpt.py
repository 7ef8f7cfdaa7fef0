"""Train a nanoGPT-sized character-level GPT on the tales torch-pjrt ships, then sample:

    python examples/char_gpt.py --device pjrt --steps 300
(`torch-pjrt demo` runs this on pjrt and on the CPU and compares them.)
"""
from __future__ import annotations

import argparse

import torch

from torch_pjrt.cli import RawDescriptionHelpFormatter
from torch_pjrt.tools import demo_models as dm


def main(argv=None):
    """Train and sample; returns (losses, model)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="pjrt", help="cpu or pjrt (or cuda, ...): the same code on each")
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--n-layer", type=int, default=4, help="transformer blocks")
    parser.add_argument("--n-embd", type=int, default=128, help="embedding width")
    parser.add_argument("--block-size", type=int, default=64, help="context length in tokens")
    parser.add_argument("--sample-chars", type=int, default=200, help="characters to sample after training (0: none)")
    args = parser.parse_args(argv)

    data, model, opt = dm.gpt_setup(args.device, n_layer=args.n_layer, n_embd=args.n_embd,
                                    block_size=args.block_size, lr=3e-3)

    def report(step, loss):
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")

    losses = dm.train_gpt(data, model, opt, args.device, args.steps, batch_size=args.batch_size, on_step=report)
    if args.sample_chars:
        prompt = dm.load_text()[: args.block_size]
        idx = torch.tensor([data.encode(prompt)], device=args.device)
        out = model.generate(idx, args.sample_chars, torch.Generator().manual_seed(0))
        print(prompt + data.decode(out[0, len(prompt):].cpu()))
    return losses, model


if __name__ == "__main__":
    main()
