"""Fine-tune a Hugging Face GPT-2 (random init from a small config, no downloads) on the
shipped tales, then generate() from it. Skips cleanly when transformers is missing:

    python examples/hf_finetune.py --device pjrt --steps 50
"""
from __future__ import annotations

import argparse
import sys

import torch

from torch_pjrt.cli import RawDescriptionHelpFormatter
from torch_pjrt.tools import demo_models as dm


def build(vocab_size: int, block_size: int, attn: str = "eager"):
    """A 2-layer GPT-2 from a config (random weights: nothing is downloaded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=block_size, n_embd=64, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        pad_token_id=0)
    config._attn_implementation = attn
    return GPT2LMHeadModel(config)


def main(argv=None):
    """Train and generate; returns (losses, model), or (None, None) without transformers."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="pjrt", help="cpu or pjrt (or cuda, ...): the same code on each")
    parser.add_argument("--steps", type=int, default=50, help="training steps")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--block-size", type=int, default=32, help="context length in tokens")
    parser.add_argument("--attn", default="eager", help="transformers attention implementation (eager, sdpa)")
    parser.add_argument("--generate", type=int, default=40, help="tokens for generate() after training (0: none)")
    args = parser.parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("hf_finetune: transformers is not installed (pip install transformers); skipping.")
        return None, None

    data = dm.CharData(dm.load_text())
    torch.manual_seed(0)
    model = build(data.vocab_size, args.block_size, args.attn).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=max(args.steps, 1))
    generator = torch.Generator().manual_seed(1)
    losses = []
    model.train()
    for step in range(args.steps):
        x, _ = data.batch(generator, args.batch_size, args.block_size)
        x = x.to(args.device)
        out = model(input_ids=x, attention_mask=torch.ones_like(x), labels=x)  # the model shifts the labels
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        sched.step()
        losses.append(out.loss.detach())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {out.loss.item():.4f}")
    if args.generate:
        model.eval()
        prompt = torch.tensor([data.encode("Once upon")], device=args.device)
        new_tokens = min(args.generate, args.block_size - prompt.shape[1])  # GPT-2 has block_size positions
        with torch.no_grad():
            ids = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False,
                                 attention_mask=torch.ones_like(prompt))
        print(data.decode(ids[0].cpu()))
        model.generated = ids.cpu()
    return [float(l) for l in torch.stack(losses).cpu()], model


if __name__ == "__main__":
    losses, _ = main()
    sys.exit(0)
