"""aten._scaled_mm (float8 matmul with scales) on pjrt against CPU torch, eager and compiled.

CPU torch 2.13 is the reference: tensor-wise (singleton) and row-wise ((M, 1), (1, N))
float32 scales over any float8 operands, any out_dtype (default: mat_a's dtype), bias,
scale_result (applied only for an explicit float8_e4m3fn / float8_e5m2 out_dtype), and no
layout or multiple-of-16 rule (those are CUDA's). Its errors are the oracle's.
"""
from __future__ import annotations

import pytest
import torch

from tests.ops.harness import assert_raises_like_cpu, no_fallback, raised
from torch_pjrt.compiler import compile_stats

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
ONE = torch.tensor(1.0)


def operands(m=16, k=32, n=24, dtype_a=E4M3, dtype_b=E4M3, seed=0):
    """a (m, k) row-major, b (k, n) column-major (torchao's layout), values in float8 range."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 4).to(dtype_a)
    b = (torch.randn(n, k, generator=g) * 4).to(dtype_b).t()
    return a, b


def rowwise_scales(m, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5


def _case(name):
    a, b = operands()
    a5, b5 = operands(dtype_a=E5M2, dtype_b=E5M2)
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    ra, rb = rowwise_scales(16, 24)
    bias = torch.randn(24, generator=torch.Generator().manual_seed(2))
    return {
        "tensorwise, default out (a's float8)": (a, b, sa, sb, {}),
        "tensorwise to float32": (a, b, sa, sb, {"out_dtype": torch.float32}),
        "tensorwise to bfloat16": (a, b, sa, sb, {"out_dtype": torch.bfloat16}),
        "tensorwise to float16": (a, b, sa, sb, {"out_dtype": torch.float16}),
        "tensorwise to float8_e5m2": (a, b, sa, sb, {"out_dtype": E5M2}),
        "e5m2 x e5m2": (a5, b5, sa, sb, {"out_dtype": torch.float32}),
        "e4m3 x e5m2 (mixed)": (a, b5, sa, sb, {"out_dtype": torch.bfloat16}),
        "singleton scales of shape (1,) and (1, 1)": (a, b, sa.reshape(1), sb.reshape(1, 1), {}),
        "rowwise to bfloat16": (a, b, ra, rb, {"out_dtype": torch.bfloat16}),
        "rowwise to float32 with bias": (a, b, ra, rb, {"out_dtype": torch.float32, "bias": bias}),
        "bias in bfloat16": (a, b, sa, sb, {"out_dtype": torch.bfloat16, "bias": bias.bfloat16()}),
        "scale_result with float8 out": (a, b, sa, sb, {"out_dtype": E4M3, "scale_result": torch.tensor(4.0)}),
        "scale_result ignored for float32 out": (a, b, sa, sb, {"out_dtype": torch.float32,
                                                                 "scale_result": torch.tensor(4.0)}),
        "scale_result ignored without out_dtype": (a, b, sa, sb, {"scale_result": torch.tensor(4.0)}),
        "use_fast_accum": (a, b, sa, sb, {"out_dtype": torch.float32, "use_fast_accum": True}),
        "b row-major, sizes not multiples of 16": (*operands(5, 24, 20), sa, sb, {"out_dtype": torch.float32}),
        "saturates to float8_e4m3fn's max": (*operands(4, 32, 8), torch.tensor(64.0), torch.tensor(64.0), {}),
        "empty k": (*operands(4, 0, 8), sa, sb, {"out_dtype": torch.float32}),
    }[name]


CASES = [
    "tensorwise, default out (a's float8)", "tensorwise to float32", "tensorwise to bfloat16",
    "tensorwise to float16", "tensorwise to float8_e5m2", "e5m2 x e5m2", "e4m3 x e5m2 (mixed)",
    "singleton scales of shape (1,) and (1, 1)", "rowwise to bfloat16", "rowwise to float32 with bias",
    "bias in bfloat16", "scale_result with float8 out", "scale_result ignored for float32 out",
    "scale_result ignored without out_dtype", "use_fast_accum", "b row-major, sizes not multiples of 16",
    "saturates to float8_e4m3fn's max", "empty k",
]


def _on(device, args):
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in args]


def _assert_like_cpu(out, expected):
    assert out.dtype == expected.dtype and out.shape == expected.shape and out.device.type == "pjrt"
    # float32 sums in another order: equal up to float32 rounding, then the same output rounding
    # (a float8 output may land one float8 step apart where the float32 values straddle a tie)
    tol = {E4M3: 0.125, E5M2: 0.25}.get(expected.dtype, 1e-5)
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=1e-5, rtol=tol, equal_nan=True)


def _defined(a, b, sa, sb, out_dtype=None):
    """_scaled_mm by its definition: the float32 product, scaled, converted (float8 saturating)."""
    return (a.float() @ b.float() * sa * sb).to(out_dtype or a.dtype)


# Cases where CPU torch's answer depends on the host CPU: with oneDNN's float8 kernels (CPUs
# with AMX) it gives NaN past float8's max and uninitialized memory for an empty k; its
# reference path, elsewhere, saturates and gives zeros, as CUDA does. pjrt follows the definition.
BY_DEFINITION = {"saturates to float8_e4m3fn's max", "empty k"}


@pytest.mark.parametrize("name", CASES)
def test_eager_matches_cpu(name):
    a, b, sa, sb, kw = _case(name)
    expected = _defined(a, b, sa, sb, **kw) if name in BY_DEFINITION else torch._scaled_mm(a, b, sa, sb, **kw)
    kw_pjrt = {k: v.to("pjrt") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    with no_fallback():
        out = torch._scaled_mm(*_on("pjrt", (a, b, sa, sb)), **kw_pjrt)
    _assert_like_cpu(out, expected)


@pytest.mark.usefixtures("fresh_compile")
@pytest.mark.parametrize("name", ["tensorwise to bfloat16", "rowwise to float32 with bias",
                                  "scale_result with float8 out", "tensorwise, default out (a's float8)"])
def test_compiled_matches_cpu(name):
    a, b, sa, sb, kw = _case(name)
    expected = torch._scaled_mm(a, b, sa, sb, **kw)

    def f(a, b, sa, sb, kw):
        return torch._scaled_mm(a, b, sa, sb, **kw) * 1  # (one more op: a graph, not one call)

    kw_pjrt = {k: v.to("pjrt") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    with no_fallback():
        out = torch.compile(f, backend="pjrt", fullgraph=True)(*_on("pjrt", (a, b, sa, sb)), kw_pjrt)
    _assert_like_cpu(out, expected)
    assert compile_stats()["executables"] == 1


def test_out_overload_writes_the_result():
    a, b = operands()
    expected = torch._scaled_mm(a, b, ONE, ONE, out_dtype=torch.float32)
    out = torch.empty(16, 24, device="pjrt")
    torch._scaled_mm(*_on("pjrt", (a, b, ONE, ONE)), out_dtype=torch.float32, out=out)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)


def _refusal(name):
    a, b = operands()
    ra, rb = rowwise_scales(16, 24)
    return {
        "float32 operands": lambda d: torch._scaled_mm(a.float().to(d), b.to(d), ONE.to(d), ONE.to(d)),
        "bfloat16 operands": lambda d: torch._scaled_mm(a.bfloat16().to(d), b.bfloat16().to(d), ONE.to(d), ONE.to(d)),
        "float64 scales": lambda d: torch._scaled_mm(a.to(d), b.to(d), ONE.double().to(d), ONE.to(d)),
        "bfloat16 row-wise scales": lambda d: torch._scaled_mm(a.to(d), b.to(d), ra.bfloat16().to(d),
                                                               rb.bfloat16().to(d), out_dtype=torch.bfloat16),
        "1-D row-wise scales": lambda d: torch._scaled_mm(a.to(d), b.to(d), ra.reshape(16).to(d),
                                                          rb.reshape(24).to(d)),
        "row-wise with a singleton": lambda d: torch._scaled_mm(a.to(d), b.to(d), ra.to(d), ONE.to(d)),
        "block-wise scales": lambda d: torch._scaled_mm(a.to(d), b.to(d), torch.rand(16, 2).to(d),
                                                        torch.rand(2, 24).to(d)),
        "integer scales": lambda d: torch._scaled_mm(a.to(d), b.to(d), torch.tensor(1).to(d), torch.tensor(1).to(d)),
        "inner sizes differ": lambda d: torch._scaled_mm(a.to(d), operands(16, 16, 24)[1].to(d), ONE.to(d), ONE.to(d)),
        "3-D mat1": lambda d: torch._scaled_mm(a.unsqueeze(0).to(d), b.to(d), ONE.to(d), ONE.to(d)),
        "2-D bias": lambda d: torch._scaled_mm(a.to(d), b.to(d), ONE.to(d), ONE.to(d), bias=torch.randn(16, 24).to(d),
                                               out_dtype=torch.float32),
        "float64 scale_result": lambda d: torch._scaled_mm(a.to(d), b.to(d), ONE.to(d), ONE.to(d), out_dtype=E4M3,
                                                           scale_result=torch.tensor(2.0, dtype=torch.float64).to(d)),
        "out_dtype differs from out=": lambda d: torch._scaled_mm(a.to(d), b.to(d), ONE.to(d), ONE.to(d),
                                                                  out_dtype=torch.bfloat16,
                                                                  out=torch.empty(16, 24, device=d)),
    }[name]


REFUSALS = ["float32 operands", "bfloat16 operands", "float64 scales", "bfloat16 row-wise scales",
            "1-D row-wise scales", "row-wise with a singleton", "block-wise scales", "integer scales",
            "inner sizes differ", "3-D mat1", "2-D bias", "float64 scale_result", "out_dtype differs from out="]


@pytest.mark.parametrize("name", REFUSALS)
def test_refusals_raise_as_on_cpu(name):
    call = _refusal(name)
    if name in ("float64 scales", "integer scales") and raised(call, "cpu") is None:
        # CPU torch's oneDNN float8 path (CPUs with AMX) takes these scales; CUDA and CPU's reference
        # path refuse them, and so does pjrt, on every host
        with pytest.raises(ValueError, match="Invalid scaling configuration"):
            call("pjrt")
        return
    assert_raises_like_cpu(call, name)


@pytest.mark.usefixtures("fresh_compile")
def test_compiled_refusal_names_the_scaling_rule():
    """Under compile the meta kernel (device pjrt: dims and dtypes only) lets a bad scale
    shape through to the lowering, which raises CPU's message."""
    a, b = operands()

    def f(a, b, sa, sb):
        return torch._scaled_mm(a, b, sa, sb)

    with pytest.raises(Exception, match="Invalid scaling configuration"):
        torch.compile(f, backend="pjrt")(*_on("pjrt", (a, b, torch.rand(16, 2), torch.rand(2, 24))))


def test_float8_e4m3fn_conversion_saturates_as_on_cpu():
    """torch 2.13 converts to float8_e4m3fn saturating at +-448 (infinities too); XLA gives NaN."""
    x = torch.tensor([3.2e6, 500.0, -1e9, float("inf"), -float("inf"), float("nan"), 3.0])
    expected = x.to(E4M3).float()
    written = torch.empty(7, dtype=E4M3, device="pjrt")
    written.copy_(x.to("pjrt"))
    compiled = torch.compile(lambda t: t.to(E4M3), backend="pjrt")(x.to("pjrt"))
    for got in (x.to("pjrt").to(E4M3), written, compiled, torch.tensor([1000, -1000]).to("pjrt").to(E4M3)):
        want = expected if got.numel() == 7 else torch.tensor([1000, -1000]).to(E4M3).float()
        torch.testing.assert_close(got.cpu().float(), want, equal_nan=True, atol=0, rtol=0)


@pytest.mark.usefixtures("fresh_compile")
def test_compiled_dynamic_rows_run_padded_in_one_executable():
    """The contraction padding rule: padded rows (and their row-wise scales) stay junk in
    padded positions, so new row counts within a bucket reuse the executable."""
    def f(a, b, sa, sb):
        return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32).relu()

    compiled = torch.compile(f, backend="pjrt", dynamic=True)
    for m in (5, 6, 7):
        a, b = operands(m, 32, 24)
        sa, sb = rowwise_scales(m, 24)
        out = compiled(*_on("pjrt", (a, b, sa, sb)))
        torch.testing.assert_close(out.cpu(), f(a, b, sa, sb), atol=1e-4, rtol=1e-5)
    assert compile_stats()["executables"] == 1


# ------------------------------------------------------------------- _scaled_mm_v2
TW, RW, NO_SWIZZLE = 0, 1, 0  # torch.nn.functional.ScalingType / SwizzleType, as the dispatcher passes them


def _v2(name):
    """(arguments of aten._scaled_mm_v2, keyword arguments) per case; tensors on the CPU."""
    a, b = operands()
    sa, sb = torch.tensor([0.5]), torch.tensor([2.0])
    ra, rb = rowwise_scales(16, 24)
    bias = torch.randn(24, generator=torch.Generator().manual_seed(2))
    tw = ([sa], [TW], [NO_SWIZZLE], [sb], [TW], [NO_SWIZZLE])
    rw = ([ra], [RW], [NO_SWIZZLE], [rb], [RW], [NO_SWIZZLE])
    return {
        "tensorwise to bfloat16": ((a, b, *tw, None, torch.bfloat16), {}),
        "tensorwise, default out": ((a, b, *tw, None, None), {}),
        "rowwise to float32 with bias": ((a, b, *rw, bias, torch.float32), {}),
        "contraction_dim [1, 0], fast accumulation": ((a, b, *tw, None, torch.float32, [1, 0]),
                                                      {"use_fast_accum": True}),
        # refused (CPU's words through the oracle)
        "mixed recipes": ((a, b, [sa], [TW], [NO_SWIZZLE], [rb], [RW], [NO_SWIZZLE], None, torch.float32), {}),
        "block-wise recipe": ((a, b, [sa], [2], [NO_SWIZZLE], [sb], [2], [NO_SWIZZLE], None, torch.float32), {}),
        "swizzled": ((a, b, [sa], [TW], [1], [sb], [TW], [NO_SWIZZLE], None, torch.float32), {}),
        "two scales": ((a, b, [sa, sa], [TW, TW], [0, 0], [sb], [TW], [NO_SWIZZLE], None, torch.float32), {}),
        "row-wise recipe, singleton scales": ((a, b, [sa], [RW], [NO_SWIZZLE], [sb], [RW], [NO_SWIZZLE], None,
                                               torch.float32), {}),
    }[name]


def _v2_on(device, args):
    return [[t.to(device) for t in x] if isinstance(x, list) and x and isinstance(x[0], torch.Tensor)
            else x.to(device) if isinstance(x, torch.Tensor) else x for x in args]


@pytest.mark.parametrize("name", ["tensorwise to bfloat16", "tensorwise, default out", "rowwise to float32 with bias",
                                  "contraction_dim [1, 0], fast accumulation"])
def test_v2_matches_cpu(name):
    args, kw = _v2(name)
    expected = torch.ops.aten._scaled_mm_v2(*args, **kw)
    with no_fallback():
        out = torch.ops.aten._scaled_mm_v2(*_v2_on("pjrt", args), **kw)
    _assert_like_cpu(out, expected)


@pytest.mark.parametrize("name", ["mixed recipes", "block-wise recipe", "swizzled", "two scales",
                                  "row-wise recipe, singleton scales"])
def test_v2_refusals_raise_as_on_cpu(name):
    args, kw = _v2(name)
    assert_raises_like_cpu(lambda d: torch.ops.aten._scaled_mm_v2(*_v2_on(d, args), **kw), name)
