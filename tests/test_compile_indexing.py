"""Integer tensor indexing compiles (its output shape is static); boolean masks, whose
output shape depends on the data, still give CPU's result."""
from __future__ import annotations

import torch

import torch_pjrt.compiler  # noqa: F401
from torch_pjrt.compiler import compile_stats, reset_compile_stats


def test_integer_index_and_index_put_compile_to_one_executable_each():
    torch._dynamo.reset()
    reset_compile_stats()
    x, i, v = torch.randn(5, 3), torch.tensor([4, 0, 2, 4]), torch.randn(4, 3)
    gather = torch.compile(lambda x, i: x[i] * 2, backend="pjrt")
    scatter = torch.compile(lambda x, i, v: x.index_put((i,), v, accumulate=True), backend="pjrt")
    torch.testing.assert_close(gather(x.to("pjrt"), i.to("pjrt")).cpu(), x[i] * 2)
    torch.testing.assert_close(scatter(x.to("pjrt"), i.to("pjrt"), v.to("pjrt")).cpu(),
                               x.index_put((i,), v, accumulate=True))
    s = compile_stats()
    assert s["executables"] == 2 and not s["eager_fallbacks"], s


def test_boolean_mask_indexing_under_compile_equals_cpu():
    torch._dynamo.reset()
    x = torch.randn(6, 2)
    fn = torch.compile(lambda x: x[x[:, 0] > 0] + 1, backend="pjrt")
    torch.testing.assert_close(fn(x.to("pjrt")).cpu(), x[x[:, 0] > 0] + 1)
