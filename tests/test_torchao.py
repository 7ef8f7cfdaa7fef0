"""torchao quantization, unmodified, on pjrt against torchao on the CPU (same config, same weights).

Each config runs eager and under torch.compile(backend="pjrt"); none may add a CPU fallback.
Tolerances: the int8 paths are integer products with float scales, so pjrt and CPU agree to
float32 rounding of the scale multiplies (torchao's own tests use SQNR > 35 dB against float).
"""
from __future__ import annotations

import copy
import time

import jax
import pytest
import torch

import torch_pjrt
from torch_pjrt.compiler import compile_stats

torchao = pytest.importorskip("torchao")
from torchao.quantization import (  # noqa: E402
    Float8DynamicActivationFloat8WeightConfig,
    Float8WeightOnlyConfig,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    quant_api,
    quantize_,
)
from torchao.quantization.granularity import PerGroup, PerRow, PerTensor  # noqa: E402

CONFIGS = {
    "int8_weight_only": Int8WeightOnlyConfig,
    "int8_dynamic_activation_int8_weight": Int8DynamicActivationInt8WeightConfig,
    "float8_weight_only": Float8WeightOnlyConfig,
    # int4 weights, the portable way: IntxWeightOnlyConfig keeps int4 values unpacked in int8
    # (Int4WeightOnlyConfig needs the CUDA-only mslk kernels: see the test below)
    "int4_weight_only_intx": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
}


pytestmark = pytest.mark.usefixtures("fresh_compile")


def linear_stack():
    torch.manual_seed(0)
    # widths are multiples of 8: torchao's int8 matmul sends other widths through the CPU
    # (safe_int_mm's "bad_dimensions_for_cublas" path), a host round trip of its own
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).eval()


def quantized_pair(name):
    model = linear_stack()
    cpu = copy.deepcopy(model)
    quantize_(cpu, CONFIGS[name]())
    on_pjrt = copy.deepcopy(model).to("pjrt")
    quantize_(on_pjrt, CONFIGS[name]())
    return cpu, on_pjrt


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_eager_matches_torchao_on_cpu(name):
    cpu, on_pjrt = quantized_pair(name)
    assert type(on_pjrt[0].weight).__module__.startswith("torchao")  # really quantized
    x = torch.randn(4, 64)
    fallbacks = dict(torch_pjrt.fallback_ops())
    with torch.no_grad():
        expected = cpu(x)
        out = on_pjrt(x.to("pjrt"))
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert torch_pjrt.fallback_ops() == fallbacks


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_compiled_matches_torchao_on_cpu(name):
    cpu, on_pjrt = quantized_pair(name)
    x = torch.randn(4, 64)
    fallbacks = dict(torch_pjrt.fallback_ops())
    with torch.no_grad():
        expected = cpu(x)
        out = torch.compile(on_pjrt, backend="pjrt")(x.to("pjrt"))
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert torch_pjrt.fallback_ops() == fallbacks
    assert compile_stats()["executables"] >= 1


@pytest.mark.parametrize("config", [Float8DynamicActivationFloat8WeightConfig, Int4WeightOnlyConfig])
def test_cuda_only_configs_refuse_on_cpu_and_pjrt_alike(config):
    """torchao itself refuses these without CUDA (a compute-capability check, the mslk
    kernels), before any op runs: unmodified torchao cannot run them on pjrt or the CPU."""
    for device in ("cpu", "pjrt"):
        with pytest.raises((AssertionError, ImportError)):
            quantize_(linear_stack().to(device), config())


def test_float8_dynamic_refuses_in_torchaos_hardware_check():
    """The refusal is torchao.float8.inference._check_hardware_support, called by quantize_
    for PerTensor/PerRow granularity: it asserts CUDA capability >= 8.9, MI300+ or XPU."""
    with pytest.raises(AssertionError, match="requires CUDA compute capability"):
        quantize_(linear_stack().to("pjrt"), Float8DynamicActivationFloat8WeightConfig())


@pytest.mark.parametrize("granularity, dtype", [(PerTensor(), torch.float32), (PerRow(), torch.bfloat16)],
                         ids=["per_tensor_float32", "per_row_bfloat16"])
def test_float8_dynamic_runs_once_the_hardware_check_is_lifted(monkeypatch, granularity, dtype):
    """Everything after that check is torchao's own code and runs on pjrt: activations
    quantized per call, and the product as aten._scaled_mm (tensor-wise or row-wise scales),
    eager and compiled, equal to torchao on the CPU (whose _scaled_mm runs the same math),
    with no CPU fallback. (PerRow needs bfloat16 weights: torchao's rule.)"""
    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    model = linear_stack().to(dtype)
    config = Float8DynamicActivationFloat8WeightConfig(granularity=granularity)
    cpu, on_pjrt = copy.deepcopy(model), copy.deepcopy(model).to("pjrt")
    quantize_(cpu, config)
    quantize_(on_pjrt, config)
    assert on_pjrt[0].weight.qdata.dtype == torch.float8_e4m3fn and on_pjrt[0].weight.act_quant_kwargs is not None
    x = torch.randn(4, 64).to(dtype)
    fallbacks = dict(torch_pjrt.fallback_ops())
    with torch.no_grad():
        expected = cpu(x)
        eager = on_pjrt(x.to("pjrt"))
        compiled = torch.compile(on_pjrt, backend="pjrt")(x.to("pjrt"))
    for out in (eager, compiled):
        torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert torch_pjrt.fallback_ops() == fallbacks
    assert compile_stats()["executables"] >= 1


def test_int_mm_matches_cpu():
    a = torch.randint(-128, 128, (16, 64), dtype=torch.int8)
    b = torch.randint(-128, 128, (64, 24), dtype=torch.int8)
    out = torch._int_mm(a.to("pjrt"), b.to("pjrt"))
    assert out.dtype == torch.int32
    torch.testing.assert_close(out.cpu(), torch._int_mm(a, b), atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="int8"):
        torch._int_mm(a.float().to("pjrt"), b.to("pjrt"))


def test_out_dtype_int_mm_compiles():
    from torch._higher_order_ops.out_dtype import out_dtype

    def int_mm(a, b):
        return out_dtype(torch.ops.aten.mm.default, torch.int32, a, b) * 3

    a = torch.randint(-128, 128, (8, 32), dtype=torch.int8)
    b = torch.randint(-128, 128, (32, 16), dtype=torch.int8)
    out = torch.compile(int_mm, backend="pjrt")(a.to("pjrt"), b.to("pjrt"))
    torch.testing.assert_close(out.cpu(), int_mm(a, b), atol=0, rtol=0)
    assert compile_stats()["executables"] == 1


def test_printing_a_new_shape_compiles_nothing():
    """torchao's int8 matmul calls repr() on its input every call: printing must not build
    executables per shape (it used to: 10-20 s for each new shape)."""
    compiles = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        x = torch.randint(-128, 128, (5, 48), dtype=torch.int8).to("pjrt")
        y = torch.randn(7, 3000).to("pjrt")
        before = len(compiles)
        text_x, text_y = repr(x), repr(y)
        assert len(compiles) == before
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    for text, t in ((text_x, x), (text_y, y)):  # the CPU tensor's values as torch formats them
        assert text.startswith("tensor(" + torch._tensor_str._tensor_str(t.cpu(), len("tensor(")))
        assert "device='pjrt:0'" in text


def test_quantized_speed_ratio_is_recorded(capsys):
    """Not a timing assertion: prints each config's eager time per call over float's, for the report."""
    model = linear_stack().to("pjrt")
    x = torch.randn(4, 64).to("pjrt")
    models = {"float": model}
    for name, config in CONFIGS.items():
        models[name] = copy.deepcopy(model)
        quantize_(models[name], config())
    times = {}
    with torch.no_grad():
        for label, m in models.items():
            m(x).cpu()
            start = time.perf_counter()
            for _ in range(20):
                m(x).cpu()
            times[label] = (time.perf_counter() - start) / 20
    with capsys.disabled():
        print("\neager ms per call (ratio to float): " + ", ".join(
            f"{k} {v * 1e3:.2f} ({v / times['float']:.1f}x)" for k, v in times.items()))
