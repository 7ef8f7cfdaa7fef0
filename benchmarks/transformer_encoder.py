"""nn.TransformerEncoder in inference (eval, no grad) on pjrt beside torch CPU, in the same run.

    python benchmarks/transformer_encoder.py                       # markdown table and the load average
    python benchmarks/transformer_encoder.py --sizes 2x16x64,16x64x256 --rounds 11

Each batch holds sequences of random lengths (the first the longest) with a `src_key_padding_mask`,
run through 4 post-norm layers (8 heads, feed-forward 4x the width). torch's fast path packs the
batch into a nested tensor ("nested", the default `enable_nested_tensor=True`) or runs the layers
over the padded batch ("dense", `enable_nested_tensor=False`); both call
`_transformer_encoder_layer_fwd` (ops/transformer.py, eager/nested.py). torch runs on one thread;
rows are timed interleaved, round by round (train_eager.Runner), each number the median of
--rounds samples. A ratio measured at a load average above the number of cores is not a result.
"""
from __future__ import annotations

import argparse
import copy
import os
import warnings

os.environ.setdefault("TORCH_PJRT_PLATFORM", "cpu")

import torch  # noqa: E402

import torch_pjrt  # noqa: E402,F401
from train_eager import Runner  # noqa: E402  (benchmarks/: one timing loop for every eager benchmark)


def workload(batch: int, length: int, width: int, nested: bool):
    """make(device) -> one forward of the encoder over a padded batch, its result read back."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(width, 8, 4 * width, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=nested).eval()
    x = torch.randn(batch, length, width)
    lengths = torch.randint(length // 2, length + 1, (batch,))
    lengths[0] = length
    padding = torch.arange(length)[None, :] >= lengths[:, None]

    def make(device: str):
        model, xs, mask = copy.deepcopy(encoder).to(device), x.to(device), padding.to(device)

        def step():
            with torch.no_grad():
                model(xs, src_key_padding_mask=mask).cpu()
        return step
    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2x16x64,16x16x64,16x64x256", help="BATCHxLENGTHxWIDTH, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # nested tensors' "prototype stage" warning
    torch.set_num_threads(1)
    print(f"load average at start: {os.getloadavg()[0]:.2f}\n")
    print("| batch x length x width | path | torch CPU (ms) | pjrt (ms) | pjrt / CPU |")
    print("|---|---|---:|---:|---:|")
    for size in args.sizes.split(","):
        b, t, w = map(int, size.split("x"))
        for nested in (True, False):
            make = workload(b, t, w, nested)
            runners = [Runner(make, device, None, args.warmup) for device in ("cpu", "pjrt")]
            for _ in range(args.rounds):
                for runner in runners:
                    runner.time_one()
            cpu, pjrt = (r.median * 1e3 for r in runners)
            print(f"| {size} | {'nested' if nested else 'dense'} | {cpu:.2f} | {pjrt:.2f} | {pjrt / cpu:.2f}x |")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
