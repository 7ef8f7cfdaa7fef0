"""The random lowerings' PRNG (ops/random.py): JAX's threefry2x32 streams, drawn by a written-out
hash that XLA compiles as one kernel (JAX's CPU lowering is a loop of ~20 kernels, 300-400 ms of
compile per new shape of a random op)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from torch_pjrt.ops import random as ops_random


def _jax_key(seed):
    return jax.random.key(seed.astype(jnp.uint32) ^ (seed >> 32).astype(jnp.uint32), impl="threefry2x32")


@pytest.mark.parametrize("shape", [(), (1,), (5, 7), (3, 0), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [jnp.uint8, jnp.uint16, jnp.uint32, jnp.uint64])
def test_bits_are_jaxs_threefry_bits(shape, dtype):
    seed = jnp.asarray(np.uint64(0x123456789ABCDEF))
    ours = jax.random.bits(ops_random.key(seed), shape, dtype)
    jaxs = jax.random.bits(_jax_key(seed), shape, dtype)
    assert ours.dtype == jaxs.dtype and np.array_equal(np.asarray(ours), np.asarray(jaxs))


@pytest.mark.parametrize("draw", [
    lambda k: jax.random.normal(k, (4, 5)),
    lambda k: jax.random.uniform(k, (3,), jnp.float64),
    lambda k: jax.random.permutation(k, 10),  # splits its key
    lambda k: jax.random.categorical(k, jnp.zeros((3, 4)), shape=(5, 3)),
    lambda k: jax.random.gamma(k, jnp.ones(4)),
    lambda k: jax.random.normal(jax.random.fold_in(k, 7), (6,)),
], ids=["normal", "uniform", "permutation", "categorical", "gamma", "fold_in"])
def test_distributions_draw_jaxs_threefry_streams(draw):
    seed = jnp.asarray(np.uint64(99))
    assert np.array_equal(np.asarray(draw(ops_random.key(seed))), np.asarray(draw(_jax_key(seed))))


def test_a_random_ops_program_holds_no_loop():
    """The hash is written out: a draw's program is straight-line (JAX's CPU lowering of its
    threefry is a while loop, which XLA:CPU compiles kernel by kernel)."""
    seed = jnp.asarray(np.uint64(5))
    text = jax.jit(lambda s: jax.random.normal(ops_random.key(s), (3, 7))).lower(seed).as_text()
    assert "while" not in text and "threefry" not in text


def test_seeded_draws_on_pjrt_repeat_and_differ_by_seed():
    draws = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        draws.append(torch.randn(64, device="pjrt").cpu())
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert abs(float(draws[0].mean())) < 0.5 and 0.5 < float(draws[0].std()) < 1.5
