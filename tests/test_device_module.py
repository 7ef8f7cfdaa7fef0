"""torch.pjrt mirrors torch.cuda; torch.accelerator and generated methods work."""
import pytest
import torch

import torch_pjrt


def test_device_queries():
    assert torch.pjrt.is_available() and torch.pjrt.is_initialized()
    assert torch.pjrt.device_count() == 2
    assert torch.pjrt.current_device() == 0
    props = torch.pjrt.get_device_properties(1)
    assert props.platform == "cpu" and props.index == 1 and props.kind
    assert "cpu" in torch.pjrt.get_device_name(0).lower()
    assert torch.pjrt.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]


def test_set_device_and_context_manager():
    torch.pjrt.set_device(1)
    assert torch.pjrt.current_device() == 1
    assert torch.empty(2, device="pjrt").device == torch.device("pjrt:1")
    assert (torch.ones(2, device="pjrt") + 1).device == torch.device("pjrt:1")
    torch.pjrt.set_device("pjrt:0")
    with torch.pjrt.device(1):
        assert torch.zeros(1, device="pjrt").device.index == 1
    assert torch.pjrt.current_device() == 0
    with pytest.raises((RuntimeError, IndexError), match="invalid device index"):
        torch.pjrt.set_device(5)


def test_accelerator_api():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("pjrt")
    assert torch.accelerator.device_count() == 2
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1
    torch.accelerator.set_device_index(0)
    x = torch.ones(3, device=torch.accelerator.current_accelerator())
    torch.accelerator.synchronize()
    assert x.sum().item() == 3


def test_generated_methods():
    t = torch.arange(3.0)
    d = t.pjrt()
    assert d.is_pjrt and not t.is_pjrt
    assert d.pjrt(1).device == torch.device("pjrt:1")
    m = torch.nn.Linear(2, 2).pjrt()
    assert all(p.is_pjrt for p in m.parameters())
    assert torch.UntypedStorage(4, device="pjrt").is_pjrt


def test_streams_and_events():
    s = torch.pjrt.Stream()
    assert s.device == torch.device("pjrt:0")
    assert torch.pjrt.current_stream() == torch.pjrt.default_stream()
    with torch.pjrt.stream(s):
        assert torch.pjrt.current_stream() == s
        y = torch.ones(256, 256, device="pjrt") @ torch.ones(256, 256, device="pjrt")
    assert torch.pjrt.current_stream() == torch.pjrt.default_stream()
    start, end = torch.pjrt.Event(enable_timing=True), torch.pjrt.Event(enable_timing=True)
    start.record()
    y = y @ y
    end.record()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) >= 0.0
    generic = torch.Stream(device="pjrt")
    generic.synchronize()
    e = torch.Event(device="pjrt", enable_timing=True)
    e.record(generic)
    e.wait(generic)
    torch.pjrt.synchronize()
    assert y[0, 0].item() == 256 * 256 * 256


def test_rng_state_functions():
    torch.pjrt.manual_seed(3)
    assert torch.pjrt.initial_seed() == 3
    state = torch.pjrt.get_rng_state()
    a = torch.rand(5, device="pjrt")
    torch.pjrt.set_rng_state(state)
    torch.testing.assert_close(torch.rand(5, device="pjrt").cpu(), a.cpu())
    torch.pjrt.manual_seed_all(11)
    b0, b1 = torch.randn(4, device="pjrt:0"), torch.randn(4, device="pjrt:1")
    torch.testing.assert_close(b0.cpu(), b1.cpu())  # same seed on both devices
    assert isinstance(torch.pjrt.seed(), int)
    assert len(torch.pjrt.default_generators) == 2
    g = torch.Generator(device="pjrt")
    g.manual_seed(7)
    c = torch.randn(4, device="pjrt", generator=g)
    g.manual_seed(7)
    torch.testing.assert_close(torch.randn(4, device="pjrt", generator=g).cpu(), c.cpu())
    assert g.device == torch.device("pjrt:0")


def test_torch_manual_seed_reproduces_device_randomness():
    torch.manual_seed(123)
    a = torch.randn(8, device="pjrt")
    torch.manual_seed(123)
    b = torch.randn(8, device="pjrt")
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(a.cpu(), torch.randn(8, device="pjrt").cpu())


def test_memory_statistics():
    torch.pjrt.reset_peak_memory_stats()
    before = torch.pjrt.memory_allocated()
    x = torch.empty(1024, 1024, device="pjrt")  # 4 MiB
    assert torch.pjrt.memory_allocated() - before == 4 * 1024 * 1024
    assert torch.pjrt.max_memory_allocated() >= before + 4 * 1024 * 1024
    assert torch.pjrt.memory_reserved() >= torch.pjrt.memory_allocated()
    stats = torch.pjrt.memory_stats()
    assert stats["allocation.all.current"] >= 1
    del x
    assert torch.pjrt.memory_allocated() == before
    torch.pjrt.empty_cache()
    assert "pjrt:0 memory summary" in torch.pjrt.memory_summary()
    assert torch.pjrt.memory_allocated(1) == torch.pjrt.memory_stats("pjrt:1")["allocated_bytes.all.current"]


def test_pinned_memory():
    t = torch.arange(4.0).pin_memory()
    assert t.is_pinned()
    assert not torch.arange(4.0).is_pinned()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4,
                                         pin_memory=True, pin_memory_device="pjrt")
    for (batch,) in loader:
        assert batch.is_pinned()
        assert batch.to("pjrt", non_blocking=True).sum().item() in (6.0, 22.0)


def test_registered_and_fallback_counters_exist():
    assert "add.Tensor" in torch_pjrt.registered_ops()
    assert isinstance(torch_pjrt.fallback_ops(), dict)


def test_synchronize_waits_for_work_whose_result_was_dropped():
    """Op by op, a dropped result's computation may still run: synchronize waits for it. (Fused, a
    dropped result is never computed: its region leaves it out.)"""
    from torch_pjrt.runtime import storage

    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode("op")
    try:
        a = torch.randn(1500, 1500, device="pjrt")
        a @ a  # result dropped at once; its computation may still be running
        dropped = storage._recent[-1]
        torch.pjrt.synchronize()
        assert dropped.is_ready()
    finally:
        torch_pjrt.set_eager_mode(before)


@pytest.mark.parametrize("mode", ["fused", "op"])
def test_synchronize_waits_for_the_latest_results(mode):
    """synchronize() waits for the latest results (a region's outputs, weakly held so that they stay
    donatable; op by op, the latest results), not for every live array."""
    from torch_pjrt.runtime import fused, storage

    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode(mode)
    try:
        a = torch.randn(1200, 1200, device="pjrt")
        held = [(a @ a).tanh() for _ in range(3)]
        torch.pjrt.synchronize()
        for t in held:
            buffer = storage._rt.buffer(t)
            array = buffer.value if type(buffer) is fused.Pending else buffer
            assert array.is_ready()
    finally:
        torch_pjrt.set_eager_mode(before)


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_synchronize_waits_once_for_each_result(mode):
    """What one synchronize() waited for, the next does not walk again: after a step and a
    synchronize, its bookkeeping holds nothing, and the next step's results are all it waits for."""
    from torch_pjrt.runtime import fused, storage

    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode(mode)
    try:
        x = torch.randn(8, 8, device="pjrt")
        for _ in range(300):  # more results than the bookkeeping keeps (its maxlen)
            x = x * 1.0001
        torch.pjrt.synchronize()
        assert len(storage._recent) == 0 and len(fused._recent_outputs) == 0
        y = (x + 1).tanh()
        torch.pjrt.synchronize()
        assert len(storage._recent) == 0 and len(fused._recent_outputs) == 0
        torch.testing.assert_close(y.cpu(), (x.cpu() + 1).tanh())
    finally:
        torch_pjrt.set_eager_mode(before)


def test_accelerator_memory_functions():
    torch.accelerator.reset_peak_memory_stats()
    before = torch.accelerator.memory_allocated()
    x = torch.empty(256, 256, device="pjrt")  # 256 KiB
    assert torch.accelerator.memory_allocated() - before == 256 * 1024
    assert torch.accelerator.max_memory_allocated() >= before + 256 * 1024
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == torch.pjrt.memory_allocated()
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total
    del x
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_allocated() == before


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_legacy_storage_classes_as_cuda_has_them():
    """`Tensor.storage_type()` looks the class up in the device module (torch.cuda.FloatStorage's
    kin); each builds a typed storage on pjrt with its dtype and the CPU class's values."""
    names = {dtype: name for dtype, name in torch.storage._dtype_to_storage_type_map().items()
             if not name.startswith("Q")}  # quantized dtypes: refused on pjrt, no CUDA class either
    assert len(names) == 12
    for dtype, name in names.items():
        cls = getattr(torch.pjrt, name)
        assert torch.empty(2, dtype=dtype, device="pjrt").storage_type() is cls
        assert cls.dtype == dtype == getattr(torch.cuda, name).dtype
    values = [1, 2, 3]
    s = torch.pjrt.LongStorage(values)
    assert (s.device.type, s.dtype, s.tolist()) == ("pjrt", torch.int64, torch.LongStorage(values).tolist())
    assert torch.pjrt.HalfStorage(4).size() == 4 and torch.pjrt.HalfStorage(4).device.type == "pjrt"
    x = torch.arange(4.0, device="pjrt")
    assert isinstance(x.storage(), torch.pjrt.FloatStorage) and not isinstance(x.storage(), torch.FloatStorage)
    assert torch.pjrt.FloatStorage(wrap_storage=x.untyped_storage()).tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="Device of 'wrap_storage' must be pjrt, but got cpu"):
        torch.pjrt.FloatStorage(wrap_storage=torch.ones(2).untyped_storage())
