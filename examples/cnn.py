"""Train a small CNN (conv, batch norm, max pool) to classify generated 16x16 shapes:

    python examples/cnn.py --device pjrt --steps 100
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from torch_pjrt.cli import RawDescriptionHelpFormatter
from torch_pjrt.tools.demo_models import CNN, shapes


def main(argv=None):
    """Train; returns (losses, model)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="pjrt", help="cpu or pjrt (or cuda, ...): the same code on each")
    parser.add_argument("--steps", type=int, default=100, help="training steps")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step")
    args = parser.parse_args(argv)

    generator = torch.Generator().manual_seed(0)
    images, labels = shapes(generator, 1024)
    torch.manual_seed(0)
    model = CNN().to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(args.steps, 1))
    losses = []
    for step in range(args.steps):
        i = torch.randint(len(images), (args.batch_size,), generator=generator)
        x, y = images[i].to(args.device), labels[i].to(args.device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.detach())
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    model.eval()
    with torch.no_grad():
        accuracy = (model(images[:256].to(args.device)).argmax(1).cpu() == labels[:256]).float().mean().item()
    print(f"accuracy on 256 training images {accuracy:.3f}")
    return [float(l) for l in torch.stack(losses).cpu()], model


if __name__ == "__main__":
    main()
