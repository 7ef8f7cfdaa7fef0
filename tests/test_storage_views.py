"""Layer 3: factories, copies, printing and every view op, with writes through views."""
import numpy as np
import pytest
import torch

import torch_pjrt

DEV = "pjrt"


def same(actual, expected):
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("factory", [
    lambda d: torch.zeros(2, 3, device=d),
    lambda d: torch.ones(4, dtype=torch.int32, device=d),
    lambda d: torch.full((2, 2), 7.5, device=d),
    lambda d: torch.arange(10, device=d),
    lambda d: torch.arange(1.0, 4.0, 0.5, device=d),
    lambda d: torch.linspace(0, 1, 5, device=d),
    lambda d: torch.eye(3, device=d),
    lambda d: torch.eye(2, 4, dtype=torch.int64, device=d),
    lambda d: torch.zeros_like(torch.ones(3, device=d)),
    lambda d: torch.ones_like(torch.ones(3, dtype=torch.bool, device=d)),
    lambda d: torch.full_like(torch.ones(2, device=d), 3),
    lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
])
def test_factories_match_cpu(factory):
    out = factory(DEV)
    assert out.device.type == "pjrt"
    same(out, factory("cpu"))


@pytest.mark.parametrize("factory", [
    lambda d: torch.full((3,), 2.0, device=d),
    lambda d: torch.arange(3.0, device=d),
    lambda d: torch.randn(3, device=d),
    lambda d: torch.empty(3, device=d).fill_(2.0),
    lambda d: torch.tensor([1.0, 2.0, 3.0], device=d),
    lambda d: torch.ones(3, device=d).zero_(),  # the C++ path: an operand the executable only writes
    lambda d: torch.linspace(0, 1, 3, device=d),
])
def test_tensors_made_on_the_second_device_are_computed_there(factory):
    """A factory on pjrt:1 puts its memory there, and what is computed from it stays there (an
    uncommitted array would move to pjrt:0 at its next use)."""
    from torch_pjrt.runtime import platform, storage

    t = factory("pjrt:1")
    for u in (t, t + 1, t[1:] * 2, torch.stack([t, t])):
        assert u.device == torch.device("pjrt:1")
        assert storage.read(u).devices() == {platform.device(1)}


def test_empty_and_empty_like_have_shape_dtype_device():
    e = torch.empty(3, 4, dtype=torch.float16, device=DEV)
    assert e.shape == (3, 4) and e.dtype == torch.float16 and e.device == torch.device("pjrt:0")
    like = torch.empty_like(e)
    assert like.shape == e.shape and like.dtype == e.dtype and like.device == e.device
    s = torch.empty_strided((2, 3), (1, 2), device=DEV)
    assert s.stride() == (1, 2)


def test_random_factories_are_seeded_and_in_range():
    torch.manual_seed(0)
    a = torch.randn(1000, device=DEV)
    b = torch.rand(1000, device=DEV)
    c = torch.randint(3, 9, (1000,), device=DEV)
    torch.manual_seed(0)
    same(torch.randn(1000, device=DEV), a.cpu())
    assert abs(a.mean().item()) < 0.15 and 0.85 < a.std().item() < 1.15
    assert 0 <= b.min().item() and b.max().item() < 1
    assert c.dtype == torch.int64 and c.min().item() >= 3 and c.max().item() <= 8
    assert set(c.cpu().tolist()) == set(range(3, 9))


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.complex64, torch.complex128])
def test_round_trip_every_dtype(dtype):
    cpu = (torch.arange(-6, 6).reshape(3, 4) * 3).to(dtype) if not dtype.is_complex else \
        torch.complex(torch.arange(12.0), -torch.arange(12.0)).reshape(3, 4).to(dtype)
    dev = cpu.to(DEV)
    assert dev.dtype == dtype and dev.device.type == "pjrt"
    same(dev, cpu)
    same(dev.t().contiguous(), cpu.t().contiguous())


def test_float8_round_trip():
    cpu = torch.tensor([0.5, -2.0, 3.0]).to(torch.float8_e4m3fn)
    back = cpu.to(DEV).cpu()
    assert back.dtype == torch.float8_e4m3fn
    assert torch.equal(back.view(torch.uint8), cpu.view(torch.uint8))


def test_copies_in_every_direction():
    cpu = torch.arange(12.0).reshape(3, 4)
    d0 = cpu.to(DEV)
    same(d0, cpu)
    d1 = d0.to("pjrt:1")
    assert d1.device == torch.device("pjrt:1")
    same(d1, cpu)
    back = d1.to("pjrt:0")
    assert back.device == torch.device("pjrt:0")
    same(back, cpu)
    dst = torch.empty(3, 4, device=DEV)
    dst.copy_(cpu)
    same(dst, cpu)
    host = torch.empty(3, 4)
    host.copy_(d1)
    assert torch.equal(host, cpu)
    nb = cpu.pin_memory().to(DEV, non_blocking=True)
    same(nb, cpu)
    cast = cpu.to(DEV, dtype=torch.float64)
    assert cast.dtype == torch.float64
    same(cast, cpu.double())
    strided_src = cpu.t()
    same(strided_src.to(DEV), strided_src.contiguous())
    dst2 = torch.zeros(4, 3, device=DEV)
    dst2.copy_(strided_src)
    same(dst2, strided_src.contiguous())
    dst3 = torch.zeros(2, 3, 4, device=DEV)
    dst3.copy_(cpu)  # broadcasting copy
    same(dst3, cpu.expand(2, 3, 4))


def test_copy_to_cpu_is_independent_of_device_tensor():
    d = torch.ones(3, device=DEV)
    host = d.cpu()
    host[0] = 5
    same(d, torch.ones(3))
    src = torch.ones(3)
    d2 = src.to(DEV)
    src[0] = 9
    same(d2, torch.ones(3))


def test_item_and_print():
    t = torch.tensor([1.5, 2.5], device=DEV)
    assert t[1].item() == 2.5
    assert torch.tensor(3, device=DEV).item() == 3
    text = repr(t)
    assert "device='pjrt:0'" in text and "1.5000" in text
    assert "pjrt:1" in repr(torch.ones(2, device="pjrt:1"))


VIEWS = {
    "view": lambda t: t.view(4, 6),
    "reshape": lambda t: t.reshape(2, 12),
    "t": lambda t: t.t(),
    "transpose": lambda t: t.transpose(0, 1),
    "permute": lambda t: t.view(2, 3, 4).permute(2, 0, 1),
    "narrow": lambda t: t.narrow(1, 1, 3),
    "select": lambda t: t.select(0, 3),
    "slice_step": lambda t: t[1::2, ::3],
    "slice_neg": lambda t: t[-3:, 1:-1],
    "diagonal": lambda t: t.diagonal(),
    "diagonal_offset": lambda t: t.diagonal(offset=1),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "squeeze": lambda t: t.view(1, 6, 1, 4).squeeze(),
    "as_strided": lambda t: t.as_strided((3, 3), (7, 1), 2),
    "unflatten": lambda t: t.unflatten(0, (2, 3)),
    "flatten": lambda t: t.flatten(),
    "movedim": lambda t: t.view(2, 3, 4).movedim(0, -1),
    "swapaxes": lambda t: t.swapaxes(0, 1),
    "split": lambda t: t.split(2)[1],
    "chunk": lambda t: t.chunk(2, dim=1)[1],
    "unbind": lambda t: t.unbind(1)[3],
    "real_of_complex_view": lambda t: t.view(torch.complex64).real if t.dtype == torch.float32 else t,
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_reads_and_writes_through(name):
    make = VIEWS[name]
    base_cpu = torch.arange(24.0).reshape(6, 4)
    base_dev = base_cpu.to(DEV)
    view_cpu, view_dev = make(base_cpu), make(base_dev)
    assert view_dev._base is base_dev or view_dev.data_ptr() != 0
    same(view_dev, view_cpu)
    assert view_dev.shape == view_cpu.shape and view_dev.stride() == view_cpu.stride()
    view_cpu.mul_(-2).add_(1)
    view_dev.mul_(-2).add_(1)
    same(base_dev, base_cpu)
    same(view_dev, view_cpu)


def test_expand_and_unfold_read():
    cpu = torch.arange(5.0)
    dev = cpu.to(DEV)
    same(dev.expand(3, 5), cpu.expand(3, 5))
    same(dev.unsqueeze(1).expand(5, 4), cpu.unsqueeze(1).expand(5, 4))
    same(dev.unfold(0, 3, 1), cpu.unfold(0, 3, 1))  # overlapping windows
    same(dev.unfold(0, 2, 2), cpu.unfold(0, 2, 2))


def test_strided_views_at_every_offset_read_as_on_cpu():
    """A view read inside an executable takes its offset as a value; whether the view is a block
    of its buffer's grid (read by one N-d slice) or a window that wraps across rows (a flat slice)
    is static. Each geometry at each offset, blocks and wrapping ones in turn, through the same op."""
    from torch_pjrt.runtime import storage

    cpu = torch.arange(4 * 6 * 5, dtype=torch.float32)
    dev = cpu.to(DEV)
    geometries = [((2, 3), (6, 1)), ((3, 2, 2), (30, 5, 1)), ((2, 2), (30, 2)), ((4,), (5,)), ((2, 3), (1, 6)),
                  ((2, 1, 3), (60, 7, 10))]
    kinds = set()
    for size, stride in geometries:
        last = sum((n - 1) * s for n, s in zip(size, stride))
        for offset in range(cpu.numel() - last):
            kinds.add(storage._is_block(size, stride, offset))
            same(dev.as_strided(size, stride, offset) * 2, cpu.as_strided(size, stride, offset) * 2)
    assert kinds == {True, False}  # both reads were met


def test_a_view_at_offset_zero_is_no_region_input_and_other_offsets_share_an_executable():
    """A view at storage offset 0 (a transpose, an expand, a reshape of a whole buffer: most
    views) has its offset static, so a region that reads it takes its buffer alone (a region's
    jitted call costs about 1 us an input: a decode token's region had 75 such zero offsets); a
    view at another offset takes its offset as a value, so x[i] for every i > 0 is one call."""
    from torch_pjrt.runtime import fused

    mode = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode("fused")
    try:
        x_cpu, y_cpu = torch.arange(12.0).reshape(3, 4), torch.arange(12.0).reshape(4, 3) * 0.5
        x, y = x_cpu.to(DEV), y_cpu.to(DEV)
        torch.pjrt.synchronize()
        a = x.t().mul(y)              # a transpose at offset 0: no offset input
        b = x.expand(2, 3, 4).mul(x)  # an expand at offset 0
        assert len(fused._current().inputs) == 2  # x's and y's buffers, nothing else
        rows = [x[i].mul(y[:, 0]) for i in range(3)]  # x[0]: static; x[1], x[2]: their offsets as values
        assert len(fused._current().inputs) == 4
        same(a, x_cpu.t() * y_cpu)
        same(b, x_cpu.expand(2, 3, 4) * x_cpu)
        for i, row in enumerate(rows):
            same(row, x_cpu[i] * y_cpu[:, 0])
        built = torch_pjrt.eager_stats()["executables"]
        for i in (1, 2, 1, 2):  # offsets other than 0: one call signature, its executable built above
            same(x[i].mul(y[:, 0]), x_cpu[i] * y_cpu[:, 0])
        assert torch_pjrt.eager_stats()["executables"] == built
    finally:
        torch_pjrt.set_eager_mode(mode)

def test_view_dtype_and_complex_views():
    cpu = torch.arange(8.0)
    dev = cpu.to(DEV)
    same(dev.view(torch.int32), cpu.view(torch.int32))
    same(dev.view(torch.complex64), cpu.view(torch.complex64))
    same(torch.view_as_complex(dev.view(4, 2)), torch.view_as_complex(cpu.view(4, 2)))
    c_cpu = torch.view_as_complex(cpu.view(4, 2).clone())
    c_dev = c_cpu.to(DEV)
    same(torch.view_as_real(c_dev), torch.view_as_real(c_cpu))
    r_cpu, r_dev = torch.view_as_real(c_cpu), torch.view_as_real(c_dev)
    r_cpu[:, 1].fill_(9)
    r_dev[:, 1].fill_(9)
    same(c_dev, c_cpu)
    b_cpu = cpu.clone().view(torch.uint8)
    b_dev = dev.clone().view(torch.uint8)
    same(b_dev, b_cpu)


def test_write_through_one_view_is_seen_by_every_other_view():
    base = torch.zeros(4, 4, device=DEV)
    row, col, diag, flat = base[1], base[:, 2], base.diagonal(), base.view(-1)
    row.fill_(1)
    col.add_(10)
    diag.mul_(3)
    flat[15] = -1
    ref = torch.zeros(4, 4)
    ref[1].fill_(1)
    ref[:, 2].add_(10)
    ref.diagonal().mul_(3)
    ref.view(-1)[15] = -1
    for dev_view, cpu_view in [(base, ref), (row, ref[1]), (col, ref[:, 2]), (diag, ref.diagonal()),
                               (flat, ref.view(-1))]:
        same(dev_view, cpu_view)


def test_setitem_patterns():
    cpu = torch.arange(12.0).reshape(3, 4)
    dev = cpu.to(DEV)
    for target in (cpu, dev):
        target[:, 1:3] = torch.tensor([[100.0, 101.0]] * 3).to(target.device)
        target.view(-1)[5] = -7.0
        target[0] = 3.0
        target[..., -1] += 1
    same(dev, cpu)


def test_in_place_on_sole_owner_donates_and_stays_correct():
    big = torch.zeros(1000, 1000, device=DEV)
    for i in range(5):
        big[i].add_(1)
    ref = torch.zeros(1000, 1000)
    ref[:5] += 1
    same(big, ref)


def test_clone_is_independent():
    a = torch.arange(4.0, device=DEV)
    b = a.clone()
    b.add_(1)
    same(a, torch.arange(4.0))
    same(b, torch.arange(4.0) + 1)


def test_resize_and_set():
    t = torch.arange(4.0, device=DEV)
    t.resize_(2, 3)
    assert t.shape == (2, 3)
    same(t.view(-1)[:4], torch.arange(4.0))
    u = torch.empty(0, device=DEV)
    u.set_(t.untyped_storage(), 1, (2,), (1,))
    same(u, torch.tensor([1.0, 2.0]))
    u.fill_(-1)
    same(t.view(-1)[:4], torch.tensor([0.0, -1, -1, 3]))


def _sliced(d, start=4, end=20):
    """A slice of an untyped storage (its data pointer an offset into the storage it slices)."""
    v = torch.arange(15, dtype=torch.float32, device=d).view(3, 5)
    return v, v.untyped_storage()[start:end]


def test_slices_of_an_untyped_storage_read_as_on_cpu():
    for start, end in [(4, 20), (0, 60), (1, 7), (56, 60), (8, 8)]:
        assert list(_sliced(DEV, start, end)[1]) == list(_sliced("cpu", start, end)[1])
        assert list(_sliced(DEV, start, end)[1].cpu()) == list(_sliced("cpu", start, end)[1])
    for d_slice, c_slice in [(_sliced(DEV)[1], _sliced("cpu")[1]), (_sliced(DEV)[1][4:16], _sliced("cpu")[1][4:16])]:
        typed = [torch.empty(0, device=d).set_(s, 1, (2,), (1,)) for d, s in ((DEV, d_slice), ("cpu", c_slice))]
        same(typed[0], typed[1])
        assert typed[0].data_ptr() == d_slice.data_ptr() + 4


def test_writes_through_a_slice_of_an_untyped_storage_reach_its_storage():
    expected, actual = _sliced("cpu"), _sliced(DEV)
    for v, sliced in (expected, actual):
        sliced[0:4].fill_(0)
        torch.empty(0, device=v.device).set_(sliced, 2, (2,), (1,)).mul_(-1)
        sliced[12] = 7
    same(actual[0], expected[0])


def test_a_view_past_a_slice_of_an_untyped_storage_raises_as_on_cpu():
    for d in ("cpu", DEV):
        with pytest.raises(RuntimeError, match="not resizable"):
            torch.empty(0, device=d).set_(_sliced(d)[1], 2, (3,), (1,))


def test_a_typed_view_of_a_slice_that_starts_within_an_element_says_so():
    # CPU reads such bytes as elements; a pjrt storage's buffer is addressed by whole elements
    _, sliced = _sliced(DEV, 2, 10)
    assert list(sliced) == list(_sliced("cpu", 2, 10)[1])
    with pytest.raises(RuntimeError, match="within an element, is not supported"):
        torch.empty(0, device=DEV).set_(sliced, 0, (2,), (1,))


def test_numpy_raises_type_error_like_cuda():
    with pytest.raises(TypeError, match="can't convert pjrt:0 device type tensor to numpy"):
        torch.ones(2, device=DEV).numpy()
    np.testing.assert_array_equal(torch.ones(2, device=DEV).cpu().numpy(), np.ones(2, np.float32))


def test_lazy_conjugate_and_negative_bits_are_applied():
    cpu = torch.tensor([1 + 2j, 3 - 4j])
    dev = cpu.to(DEV)
    same(dev.conj(), cpu.conj())
    same(dev.conj() * 2, cpu.conj() * 2)
    same(torch.neg(dev.conj()), torch.neg(cpu.conj()))
    same(dev.conj().imag, cpu.conj().imag)
    x_cpu = torch.tensor([1 + 1j, 2 - 1j], requires_grad=True)
    x_dev = x_cpu.detach().to(DEV).requires_grad_()
    (x_cpu * x_cpu.conj()).real.sum().backward()
    (x_dev * x_dev.conj()).real.sum().backward()
    torch.testing.assert_close(x_dev.grad.cpu(), x_cpu.grad)


@pytest.mark.parametrize("write", [
    lambda v, d: v.add_(1j),
    lambda v, d: v.mul_(2),
    lambda v, d: v.copy_(torch.tensor([5 + 5j, 6 - 6j], device=d)),
    lambda v, d: v.__setitem__(0, 7j),
])
def test_writes_through_conj_views_reach_the_base(write):
    cpu = torch.tensor([1 + 2j, 3 - 1j])
    dev = cpu.to(DEV)
    write(cpu.conj(), "cpu")
    write(dev.conj(), DEV)
    same(dev, cpu)


def test_writes_through_negative_views_and_copies_of_conj_sources():
    cpu, dev = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0], device=DEV)
    cpu._neg_view().add_(1)
    dev._neg_view().add_(1)
    same(dev, cpu)
    source = torch.tensor([1 + 2j, 3 - 1j])
    target = torch.zeros(2, dtype=torch.complex64, device=DEV)
    target.copy_(source.conj())
    same(target, source.conj().resolve_conj())
    host = torch.zeros(2, dtype=torch.complex64)
    host.conj().copy_(source.to(DEV))
    same(host.to(DEV), source.conj().resolve_conj())


def test_unfold_is_a_view_writes_go_through_it():
    """unfold has no composite kernel, only CPU/CUDA ones: pjrt registers its metadata kernel,
    so the result aliases its input with CPU's strides (it used to be a copy)."""
    cpu = torch.zeros(4, 5).t()
    dev = torch.zeros(4, 5, device="pjrt").t()
    cv, dv = cpu.unfold(0, 2, 1), dev.unfold(0, 2, 1)
    assert dv.stride() == cv.stride() and dv.storage_offset() == cv.storage_offset()
    cv[1, 2, 1] = 7.0
    dv[1, 2, 1] = 7.0
    assert torch.equal(dev.cpu(), cpu)
    x = torch.arange(24.0).reshape(2, 3, 4)
    assert torch.equal(x.to("pjrt").unfold(2, 3, 1).unfold(1, 2, 1).cpu(), x.unfold(2, 3, 1).unfold(1, 2, 1))


@pytest.mark.parametrize("path", ["internal", "public"])
def test_host_to_device_copies_own_their_data_on_every_dtype(path, monkeypatch):
    """x.to("pjrt") goes through platform.put (JAX's internal batched_device_put where this JAX has
    it, else jax.device_put): the device value is a copy (changing the host tensor after the copy
    leaves it), on the device asked for, for every dtype torch and pjrt share, on either path."""
    from torch_pjrt.runtime import platform

    if path == "public":
        monkeypatch.setattr(platform, "_batched_device_put", None)
    elif platform._batched_device_put is None:
        pytest.skip("this JAX has no internal batched_device_put: platform.put uses jax.device_put")
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int8,
                  torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn):
        host = (torch.arange(6) % 3).to(dtype).reshape(2, 3)
        for device in ("pjrt:0", "pjrt:1"):
            before = host.clone()
            moved = host.to(device)
            host.zero_() if dtype != torch.bool else host.logical_not_()
            assert moved.device == torch.device(device) and moved.dtype == dtype
            assert torch.equal(moved.cpu().view(torch.uint8), before.view(torch.uint8)), (dtype, device)
            host.copy_(before)


def test_scalar_reads_of_every_element_equal_cpu():
    """.item() / int() of one element: a small storage is read from a host copy at the element's
    storage offset (the C++ kernel, fast_path.cpp's ScalarReadKernel), a large one through the
    element's view, a view of another dtype through its view (transfer.local_scalar_dense); a
    computed (pending) value too. Values and Python types are the CPU's for every dtype."""
    torch_pjrt.reset_eager_stats()
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int8,
                  torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn):
        cpu = (torch.arange(12) % 5 - 1).to(dtype).reshape(3, 4)
        dev = cpu.to(DEV)
        for view in (lambda t: t, lambda t: t.t(), lambda t: t[1:, 2:]):
            c, d = view(cpu), view(dev)
            for i in range(c.shape[0]):
                for j in range(c.shape[1]):
                    got, want = d[i, j].item(), c[i, j].item()
                    assert got == want and type(got) is type(want), (dtype, i, j)
    big = torch.randn(100, 100)
    assert big.to(DEV)[37, 42].item() == big[37, 42].item()  # past the host-copy size: the view's read
    floats = torch.arange(10.0)
    assert floats.to(DEV).view(torch.int32)[3].item() == floats.view(torch.int32)[3].item()
    large = torch.cat([torch.zeros(4998, dtype=torch.uint64), torch.tensor([2**63 + 5, 7], dtype=torch.uint64)])
    assert large.to(DEV)[4998].item() == 2**63 + 5  # past int64, through the Python kernel's number
    assert int((torch.tensor([[3]], device=DEV) * 2 + 1)[0, 0]) == 7  # a pending value
    reads = torch_pjrt.eager_stats()["paths"]["aten::_local_scalar_dense"]
    assert (reads["fast"], reads["python_kernel"]) == (10 * (12 + 12 + 4) + 1, 3), reads  # big ones, the int32 view


def test_scalar_read_raises_an_earlier_out_of_range_index():
    """A scalar read is a host sync: an out-of-range index of an earlier call raises there, as it
    does on CUDA, with CPU's exception, and the next read works."""
    table = torch.arange(12.0, device=DEV)
    picked = table[torch.tensor([3, 20], device=DEV)]  # checked asynchronously
    with pytest.raises(IndexError, match="out of bounds"):
        table[0].item()
    del picked
    assert table[5].item() == 5.0
