"""Output strides follow torch: the op's meta kernel lays out every eager output (an op without
one, such as geqrf, takes CPU's layout from a run of CPU's kernel on zeros).

A channels_last input gives a channels_last output where CPU gives one (pooling, upsampling,
elementwise, normalization), copies keep a dense layout as CUDA's do, and the values are
CPU's. The storage stays one row-major JAX buffer holding the permuted data.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

CL = torch.channels_last


def _nhwc(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(memory_format=CL)


OPS = {
    "max_pool2d": lambda t: F.max_pool2d(t, 2),
    "max_pool2d indices": lambda t: F.max_pool2d(t, 2, return_indices=True)[1],
    "avg_pool2d": lambda t: F.avg_pool2d(t, 3, stride=2, padding=1),
    "adaptive_avg_pool2d to 1": lambda t: F.adaptive_avg_pool2d(t, 1),
    "adaptive_avg_pool2d": lambda t: F.adaptive_avg_pool2d(t, (3, 5)),
    "adaptive_max_pool2d": lambda t: F.adaptive_max_pool2d(t, 2),
    "bilinear": lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"),
    "bicubic": lambda t: F.interpolate(t, size=(5, 7), mode="bicubic", align_corners=True),
    "nearest": lambda t: F.interpolate(t, scale_factor=2, mode="nearest"),
    "relu": torch.relu,
    "add scalar": lambda t: t + 1,
    "mul with a contiguous tensor": lambda t: t * t.contiguous(),
    "batch_norm": lambda t: F.batch_norm(t, None, None, training=True),
    "gelu": F.gelu,
    # torch's meta kernels lay these out row-major; CPU's and CUDA's kernels follow the input
    # (the entries' output_memory_format)
    "conv2d": lambda t: F.conv2d(t, _weight(t, 4, 3, 3, 3)),
    "conv2d, a channels_last weight over a contiguous input": lambda t: F.conv2d(t.contiguous(), _weight(t, 4, 3, 3, 3, cl=True)),
    "conv2d, both contiguous": lambda t: F.conv2d(t.contiguous(), _weight(t, 4, 3, 3, 3)),
    "conv_transpose2d": lambda t: F.conv_transpose2d(t, _weight(t, 3, 2, 3, 3), stride=2),
    "reflection_pad2d": lambda t: F.pad(t, (1, 2, 2, 1), mode="reflect"),
    "replication_pad2d": lambda t: F.pad(t, (1, 2, 2, 1), mode="replicate"),
    "batch_norm with running statistics": lambda t: F.batch_norm(t, torch.zeros(3, device=t.device),
                                                                 torch.ones(3, device=t.device), training=True),
    "batch_norm in evaluation": lambda t: F.batch_norm(t, torch.zeros(3, device=t.device), torch.ones(3, device=t.device)),
}


def _weight(like, *shape, cl=False):
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    return (w.to(memory_format=CL) if cl else w).to(like.device)


@pytest.mark.parametrize("name", sorted(OPS))
def test_channels_last_outputs_keep_cpus_strides(name):
    x = _nhwc(2, 3, 8, 8)
    expected = OPS[name](x)
    actual = OPS[name](x.to("pjrt"))
    assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())
    assert actual.is_contiguous(memory_format=CL) == expected.is_contiguous(memory_format=CL)
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_copies_keep_a_dense_layout():
    x = _nhwc(2, 3, 4, 5)
    p = x.to("pjrt")
    assert p.stride() == x.stride()
    assert p.cpu().stride() == x.stride() and torch.equal(p.cpu(), x)
    assert p.clone().stride() == x.clone().stride()
    assert p.to(torch.float64).stride() == x.to(torch.float64).stride()
    assert p.contiguous().stride() == x.contiguous().stride()
    c = torch.randn(2, 3, 4, 5)
    assert c.to("pjrt").contiguous(memory_format=CL).stride() == c.contiguous(memory_format=CL).stride()
    assert c.to("pjrt").clone(memory_format=CL).stride() == c.clone(memory_format=CL).stride()
    t = torch.randn(3, 4).t()
    assert t.to("pjrt").stride() == t.clone().stride() and t.to("pjrt").cpu().stride() == t.stride()
    torch.testing.assert_close(t.to("pjrt").cpu(), t)


def _seeded(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


NOT_DENSE = {
    "strided slice of channels_last": lambda d: _nhwc(4, 3, 8, 8).to(d)[..., ::2, ::2],
    "strided slice of channels_last_3d": lambda d: _seeded(2, 3, 4, 4, 4).to(d, memory_format=torch.channels_last_3d)
    [..., ::2, ::2, ::2],
    "column slice": lambda d: _seeded(4, 6).to(d)[:, :3],
    "slice of a permutation": lambda d: _seeded(3, 4, 5).to(d)[:, ::2].permute(2, 0, 1),
    "expanded": lambda d: _seeded(3, 1).to(d).expand(3, 4),
}
COPIES = {
    "clone": lambda t: t.clone(),
    "to dtype": lambda t: t.to(torch.float64),
    "type": lambda t: t.type(torch.float64),
    "double": lambda t: t.double(),
    "to cpu": lambda t: t.to("cpu", copy=True),  # on the CPU, .cpu() would return t itself
}


@pytest.mark.parametrize("copy", sorted(COPIES))
@pytest.mark.parametrize("source", sorted(NOT_DENSE))
def test_copies_of_a_tensor_that_is_not_dense_take_cpus_layout(source, copy):
    # torch's empty_like keeps the order of the source's strides (channels_last for a strided slice
    # of a channels_last tensor); pjrt made such copies row-major (test_memory_format_clone, _to, _type)
    expected, actual = COPIES[copy](NOT_DENSE[source]("cpu")), COPIES[copy](NOT_DENSE[source]("pjrt"))
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def test_in_place_and_out_writes_keep_the_target_layout():
    x = _nhwc(1, 3, 4, 4)
    p = x.to("pjrt")
    p.mul_(2).add_(torch.ones(1, 3, 4, 4, device="pjrt"))
    assert p.stride() == x.stride()
    torch.testing.assert_close(p.cpu(), x * 2 + 1)
    out = torch.empty(1, 3, 4, 4, device="pjrt")
    torch.abs(p, out=out)
    assert out.is_contiguous()
    torch.testing.assert_close(out.cpu(), torch.abs(x * 2 + 1))


def test_channels_last_training_step_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 2))
    model = model.to(memory_format=CL)
    twin = torch.nn.Sequential(*[m for m in __import__("copy").deepcopy(model)]).to("pjrt")
    x = _nhwc(2, 3, 8, 8)
    model(x).square().mean().backward()
    twin(x.to("pjrt")).square().mean().backward()
    for a, b in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("batch", [(), (2,)])
def test_an_op_without_a_meta_kernel_keeps_cpus_strides(batch):
    """geqrf has no meta kernel; CPU returns its reflectors column-major, and PyTorch's test_ormqr
    checks `reflectors.mT.is_contiguous()` on every device."""
    a = torch.randn(*batch, 5, 3, generator=torch.Generator().manual_seed(0))
    reflectors, tau = torch.geqrf(a)
    actual, actual_tau = torch.geqrf(a.to("pjrt"))
    assert actual.stride() == reflectors.stride() and actual.mT.is_contiguous()
    assert actual_tau.stride() == tau.stride()
    torch.testing.assert_close(actual.cpu(), reflectors, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual_tau.cpu(), tau, atol=1e-5, rtol=1e-5)
    c = torch.randn(*batch, 5, 3)
    torch.testing.assert_close(torch.ormqr(actual, actual_tau, c.to("pjrt")).cpu(), torch.ormqr(reflectors, tau, c),
                               atol=1e-5, rtol=1e-5)


def test_an_empty_channels_last_tensor_keeps_its_strides():
    """An empty tensor is "contiguous" whatever its strides; its copies keep them, as CPU's do
    (ModuleInfo's BatchNorm2d takes a channels_last batch of 0)."""
    x = torch.randn(0, 5, 2, 2).to(memory_format=CL)
    moved = x.to("pjrt")
    assert moved.stride() == x.stride()
    assert moved.clone().stride() == x.clone().stride()
    norm = torch.nn.BatchNorm2d(5, affine=False).eval()
    expected = norm(x).stride()
    assert norm.to("pjrt")(moved).stride() == expected
