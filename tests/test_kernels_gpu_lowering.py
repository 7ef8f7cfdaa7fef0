"""Every shipped Pallas kernel lowers for CUDA, forward and backward, on this CPU machine.

Pallas' Triton backend lowers a kernel to a custom call carrying its Triton IR without a GPU,
so the JAX-level half of a GPU build (the kernel language, the grid, captured constants, the
backend jax picks) is checked here; Triton's own compile to PTX happens on the GPU only. The
first H200 session found every kernel failing there: jax's default GPU backend (Mosaic GPU)
lowers none of these Triton-style kernels, which `kernels.pallas_call` now routes to Triton.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from torch_pjrt.kernels import platforms
from torch_pjrt.kernels.attention import flash_attention_kernel
from torch_pjrt.kernels.cross_entropy import softmax_cross_entropy_kernel
from torch_pjrt.kernels.moe import grouped_mm
from torch_pjrt.kernels.norm import rms_norm

BF16 = jnp.bfloat16
TRITON_CALL = "stablehlo.custom_call @__gpu$xla.gpu.triton("  # a Pallas kernel the Triton backend lowered


def spec(*shape, dtype=BF16):
    return jax.ShapeDtypeStruct(shape, dtype)


# name -> (kernel, array arguments (specs), static arguments)
CASES = {
    "flash_attention causal GQA": (flash_attention_kernel, (spec(2, 8, 128, 64), spec(2, 2, 128, 64),
                                                           spec(2, 2, 128, 64)), (True, None)),
    "flash_attention decode": (flash_attention_kernel, (spec(1, 4, 1, 16), spec(1, 2, 129, 16),
                                                       spec(1, 2, 129, 16)), (False, 0.25)),
    "rms_norm": (rms_norm, (spec(1024, 512), spec(512)), (1e-6,)),
    "softmax_cross_entropy": (softmax_cross_entropy_kernel, (spec(64, 4096), spec(64, dtype=jnp.int32)), (-100,)),
    "grouped_mm": (grouped_mm, (spec(256, 128), spec(16, 128, 128), spec(16, dtype=jnp.int32)), ()),
}


def lower_for_cuda(fn, specs) -> str:
    with platforms.tracing_for("gpu"):
        return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_lowers_for_cuda_through_triton(name, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_AUTOTUNE", "0")  # the default block sizes: tuning needs the device
    kernel, specs, static = CASES[name]
    forward = lambda *xs: kernel._run("gpu", (*xs, *static), {})  # noqa: E731
    text = lower_for_cuda(forward, specs)
    assert TRITON_CALL in text, text[:2000]

    def backward(*xs):
        outs = jax.tree_util.tree_leaves(kernel._run("gpu", (*xs, *static), {}))
        grads = tuple(jnp.ones_like(o) for o in outs)
        return kernel._backward("gpu", [*xs, *static], {}, tuple(outs), grads)

    if kernel.backward_fn is not None:
        assert TRITON_CALL in lower_for_cuda(backward, specs)
