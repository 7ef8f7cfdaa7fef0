"""Bad input on pjrt raises what CPU torch raises: the same exception type and message.

Each call runs on CPU (the reference) and on pjrt; both must raise, with the same type and
the same first line. None of these may surface a JAX or numpy exception. The OpInfo
error-inputs sweep (`python -m torch_pjrt.tools.conformance --checks errors`) measures the
same over PyTorch's own database; these are the cases users meet first.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from tests.ops.harness import assert_raises_like_cpu


CALLS = {
    "matmul shapes": lambda d: torch.randn(2, 3, device=d) @ torch.randn(2, 4, device=d),
    "mm shapes": lambda d: torch.mm(torch.randn(2, 3, device=d), torch.randn(2, 4, device=d)),
    "add broadcast": lambda d: torch.randn(10, device=d) + torch.randn(3, 4, device=d),
    "add_ broadcast": lambda d: torch.randn(3, device=d).add_(torch.randn(3, 4, device=d)),
    "mul alpha-less broadcast": lambda d: torch.mul(torch.randn(2, 5, device=d), torch.randn(3, 1, 4, device=d)),
    "cat sizes": lambda d: torch.cat([torch.randn(2, 3, device=d), torch.randn(2, 4, device=d)]),
    "stack sizes": lambda d: torch.stack([torch.randn(2, device=d), torch.randn(3, device=d)]),
    "amax empty dim": lambda d: torch.randn(0, 3, device=d).amax(0),
    "max empty": lambda d: torch.randn(0, device=d).max(),
    "kthvalue k": lambda d: torch.randn(3, device=d).kthvalue(5),
    "reshape numel": lambda d: torch.randn(6, device=d).reshape(4, 2),
    "view incompatible": lambda d: torch.randn(4, 6, device=d).t().view(24),
    "index_select dim": lambda d: torch.randn(3, 4, device=d).index_select(2, torch.tensor([0], device=d)),
    "gather dims": lambda d: torch.randn(3, 4, device=d).gather(1, torch.zeros(3, device=d, dtype=torch.long)),
    "conv2d channels": lambda d: F.conv2d(torch.randn(1, 3, 8, 8, device=d), torch.randn(4, 2, 3, 3, device=d)),
    "linear shapes": lambda d: F.linear(torch.randn(2, 3, device=d), torch.randn(4, 5, device=d)),
    "embedding dims": lambda d: F.embedding(torch.zeros(2, dtype=torch.long, device=d), torch.randn(3, device=d)),
    "cross_entropy classes": lambda d: F.cross_entropy(torch.randn(2, 3, device=d),
                                                       torch.tensor([0, 1, 1], device=d)),
    "bool subtraction": lambda d: torch.ones(2, dtype=torch.bool, device=d) - torch.ones(2, dtype=torch.bool, device=d),
    # from PyTorch's device-generic tests (issue 13): numpy's, JAX's or Python's exceptions before
    "amax over an empty dim": lambda d: torch.randn(3, 0, device=d).amax(1),
    "embedding_bag 3-D input": lambda d: F.embedding_bag(torch.zeros(2, 2, 2, dtype=torch.long, device=d),
                                                         torch.randn(3, 4, device=d)),
    "embedding_bag 2-D offsets": lambda d: F.embedding_bag(torch.zeros(4, dtype=torch.long, device=d),
                                                           torch.randn(3, 4, device=d),
                                                           torch.zeros(1, 2, dtype=torch.long, device=d)),
    # errors CPU raises that pjrt did not
    "embedding_bag index out of range": lambda d: F.embedding_bag(torch.tensor([0, 5], device=d),
                                                                  torch.randn(3, 4, device=d), torch.tensor([0], device=d)),
    "embedding_bag padding_idx out of range": lambda d: F.embedding_bag(
        torch.tensor([0, 1], device=d), torch.randn(3, 4, device=d), torch.tensor([0], device=d), padding_idx=7),
    "layer_norm normalized_shape": lambda d: F.layer_norm(torch.randn(2, 3, device=d), (4,)),
    "embedding 1-D weight": lambda d: F.embedding(torch.zeros(2, dtype=torch.long, device=d), torch.randn(3, device=d)),
    "exponential_ lambda": lambda d: torch.empty(3, device=d).exponential_(-1),
    "index_select out= overlapping its input": lambda d: (lambda x: torch.index_select(
        x, 0, torch.tensor([0, 1], device=d), out=x[:2]))(torch.randn(10, device=d)),
    "in-place write overlapping its input": lambda d: (lambda x: x[1:].add_(x[:-1]))(torch.randn(10, device=d)),
    "in-place write into an expanded tensor": lambda d: torch.zeros(3, device=d).expand(2, 3).add_(1),
}


SAME_RESULT = {  # where CPU raises nothing, pjrt must not either (and agree on the values)
    "max_pool2d of a zero batch": lambda d: F.max_pool2d(torch.ones(0, 3, 4, 4, device=d), 2, return_indices=True),
    "max_pool1d of a zero batch": lambda d: F.max_pool1d(torch.ones(0, 3, 4, device=d), 2),
    "vstack int16": lambda d: torch.vstack([torch.ones(3, dtype=torch.int16, device=d)] * 2),
    "row_stack int16 and int32": lambda d: torch.row_stack([torch.ones(3, dtype=torch.int16, device=d),
                                                            torch.ones(3, dtype=torch.int32, device=d)]),
    "in-place write into the other half of its storage": lambda d: (lambda x: x[:5].add_(x[5:]))(
        torch.arange(10.0, device=d)),
}


@pytest.mark.parametrize("name", sorted(SAME_RESULT))
def test_what_cpu_accepts_pjrt_accepts(name):
    expected = SAME_RESULT[name]("cpu")
    actual = SAME_RESULT[name]("pjrt")
    for a, e in zip(actual if isinstance(actual, tuple) else (actual,), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(a.cpu(), e)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_bad_input_raises_what_cpu_raises(name):
    assert_raises_like_cpu(CALLS[name], name)


def test_the_failed_call_changed_nothing():
    """A call that raises leaves its arguments as they were (in-place ops included)."""
    x = torch.arange(3.0, device="pjrt")
    with pytest.raises(RuntimeError):
        x.add_(torch.ones(3, 4, device="pjrt"))
    assert x.cpu().tolist() == [0.0, 1.0, 2.0]
    assert (x + 1).cpu().tolist() == [1.0, 2.0, 3.0]  # and the device works on


def test_a_lowering_bug_names_the_op_devices_and_dtypes():
    """Where CPU accepts a call that a lowering rejects, the error says so, names the op and
    the arguments, and keeps the lowering's exception as its cause (not a bare JAX error)."""
    from torch_pjrt.eager import errors

    x = torch.randn(2, 3, device="pjrt")
    bug = TypeError("a lowering's own failure")
    err = errors.as_torch_error(torch.ops.aten.abs.default, (x,), {}, bug)
    assert isinstance(err, RuntimeError)
    assert "aten::abs" in str(err) and "pjrt:0 float32[2, 3]" in str(err) and "please report" in str(err)
    assert err.__cause__ is bug


def test_fast_path_failure_gives_the_cpu_error():
    """Ops on the C++ fast path (add, mul) fall back to the Python kernel when their
    executable fails, which raises CPU's error."""
    a, b = torch.randn(10, device="pjrt"), torch.randn(3, 4, device="pjrt")
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(10\) must match the size of tensor b \(4\)"):
        torch.add(a, b)
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(10\) must match"):
        a * b
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning either
        assert torch.allclose((a * 2).cpu(), a.cpu() * 2)


def test_random_out_arguments_resize_as_on_cpu():
    """randperm(n, out=t) with a wrongly sized t resizes it (with torch's warning), as on CPU."""
    t = torch.empty(3, dtype=torch.long, device="pjrt")
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.randperm(5, out=t)
    assert t.shape == (5,) and sorted(t.cpu().tolist()) == list(range(5))
