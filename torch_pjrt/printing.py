"""Printing a pjrt tensor formats one CPU copy of it.

torch's formatter runs a dozen tensor ops per print (slices, abs, masked_select over the
finite values, min/max, per-element item()), each of them an XLA executable per shape on
pjrt, and masked_select's output size depends on the values: printing a new shape cost
10-20 s of compiles. torch itself copies xla, lazy, ipu and mtia tensors to the CPU before
formatting, for the same reason (torch/_tensor_str.py, `_str_intern`), but its list is
closed, so pjrt's rule wraps the formatter. Code that calls repr() on every step pays
for it: torchao's int8 matmul tests `"FakeTensor" in input.__repr__()` on each call.
The text is the CPU copy's, with pjrt's device suffix and grad_fn: nothing else changes.
"""
from __future__ import annotations

import functools

import torch
import torch._tensor_str as tensor_str

_PREFIX = "tensor("  # pjrt tensors are plain tensors (or Parameters): this is their prefix


def _formats_from_cpu(t: torch.Tensor) -> bool:
    return (t.device.type == "pjrt" and t.layout == torch.strided and not t.is_nested and not t.is_quantized
            and t.numel() > 0 and type(t) in (torch.Tensor, torch.nn.Parameter)
            and not torch._C._functorch.is_functorch_wrapped_tensor(t))


def install() -> None:
    original = tensor_str._str
    if getattr(original, "_pjrt", False):
        return

    @functools.wraps(original)
    def _str(self, *, tensor_contents=None):
        if tensor_contents is None and _formats_from_cpu(self):
            with torch.no_grad():
                primal = torch.autograd.forward_ad.unpack_dual(self).primal
                tensor_contents = tensor_str._tensor_str(primal.detach().to("cpu"), len(_PREFIX))
        return original(self, tensor_contents=tensor_contents)

    _str._pjrt = True
    tensor_str._str = _str
