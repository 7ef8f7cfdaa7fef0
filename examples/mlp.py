"""Train an MLP classifier on synthetic blobs. The same code on every device:

    python examples/mlp.py --device pjrt --steps 200
    python examples/mlp.py --device cpu --steps 200
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from torch_pjrt.cli import RawDescriptionHelpFormatter
from torch_pjrt.tools.demo_models import MLP, blobs


def main(argv=None):
    """Train; returns (losses, model)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="pjrt", help="cpu or pjrt (or cuda, ...): the same code on each")
    parser.add_argument("--steps", type=int, default=200, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per step")
    args = parser.parse_args(argv)

    generator = torch.Generator().manual_seed(0)
    x_all, y_all = blobs(generator, 4096)
    torch.manual_seed(0)
    model = MLP().to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(args.steps):
        i = torch.randint(len(x_all), (args.batch_size,), generator=generator)
        x, y = x_all[i].to(args.device), y_all[i].to(args.device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    with torch.no_grad():
        accuracy = (model(x_all.to(args.device)).argmax(1).cpu() == y_all).float().mean().item()
    print(f"train accuracy {accuracy:.3f}")
    return [float(l) for l in torch.stack(losses).cpu()], model


if __name__ == "__main__":
    main()
