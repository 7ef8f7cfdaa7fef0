"""Train a two-layer character-level LSTM language model on the shipped tales:

    python examples/lstm.py --device pjrt --steps 100
"""
from __future__ import annotations

import argparse

import torch

from torch_pjrt.cli import RawDescriptionHelpFormatter
from torch_pjrt.tools import demo_models as dm


def main(argv=None):
    """Train; returns (losses, model)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="pjrt", help="cpu or pjrt (or cuda, ...): the same code on each")
    parser.add_argument("--steps", type=int, default=100, help="training steps")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=32, help="characters per training sequence")
    args = parser.parse_args(argv)

    data = dm.CharData(dm.load_text())
    torch.manual_seed(0)
    model = dm.CharLSTM(data.vocab_size).to(args.device)
    opt = torch.optim.RMSprop(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    losses = []
    for step in range(args.steps):
        x, y = data.batch(generator, args.batch_size, args.seq_len)
        _, loss = model(x.to(args.device), y.to(args.device))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        losses.append(loss.detach())
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    return [float(l) for l in torch.stack(losses).cpu()], model


if __name__ == "__main__":
    main()
