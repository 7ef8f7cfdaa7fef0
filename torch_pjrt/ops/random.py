"""Lowerings: random ops. Each receives `generator` as a traced 64-bit seed drawn from the
torch generator (so torch.manual_seed reproduces runs) and derives a JAX key from it.
Registered on the in-place overloads torch uses (normal_, uniform_, ...): they return
self's new value."""
from __future__ import annotations
import math
import types

import jax
import jax.extend.random
import jax.numpy as jnp
import numpy as np
import torch
from ..dtypes import to_jax
from .index_probes import Derived
from .registry import family

lowering = family(not_paddable="its draws depend on the padded shape")


aten = torch.ops.aten


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k1, k2, x1, x2):
    """Threefry-2x32, 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"),
    the hash of JAX's default PRNG, written out round by round. JAX lowers it on the CPU as a
    5-iteration loop, which XLA:CPU compiles into ~20 small kernels: 300-400 ms per new shape
    here, and every new shape of a random op compiles it again. Written out it is one fused
    kernel: 4-5x less compile time and about 3x faster at 4M draws; the bits are the same."""
    ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x1 = x1 + x2
            x2 = ((x2 << np.uint32(r)) | (x2 >> np.uint32(32 - r))) ^ x1
        x1 = x1 + ks[(block + 1) % 3]
        x2 = x2 + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x1, x2


def _random_bits(key_data, bit_width: int, shape):
    """JAX's partitionable threefry bits: the hash of each element's 64-bit index, as two
    uint32 words; 32 bits are their xor, 64 their concatenation, 8 and 16 the xor's low bits."""
    wide = math.prod(shape) > 2**32  # indices past 32 bits
    dtype = jnp.uint64 if wide else jnp.uint32
    # the row-major index as a sum of per-dimension iotas (not a reshaped 1-D iota), which XLA's SPMD
    # partitioner splits along any dimension, as JAX's own iota_2x32_shape lowers it
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    index = sum((jax.lax.broadcasted_iota(dtype, shape, d) * dtype(stride) for d, stride in enumerate(strides)),
                jnp.zeros(shape, dtype))
    high = (index >> 32).astype(jnp.uint32) if wide else jnp.zeros(shape, jnp.uint32)
    bits1, bits2 = _threefry2x32(key_data[0], key_data[1], high, index.astype(jnp.uint32))
    if bit_width == 64:
        return (bits1.astype(jnp.uint64) << np.uint64(32)) | bits2.astype(jnp.uint64)
    return (bits1 ^ bits2).astype(f"uint{bit_width}")


def _as_threefry(method):
    """One of JAX's threefry key operations on raw key data (seeding, split, fold_in: key-sized)."""
    def on_data(key_data, *args):
        keys = method(jax.random.wrap_key_data(key_data, impl="threefry2x32"), *args)
        return jax.random.key_data(keys)
    return on_data


# JAX's threefry2x32 PRNG (the same streams), its bits drawn by the written-out hash above
_THREEFRY = jax.extend.random.define_prng_impl(
    key_shape=(2,), seed=lambda seed: jax.random.key_data(jax.random.key(seed, impl="threefry2x32")),
    split=_as_threefry(jax.random.split), random_bits=_random_bits, fold_in=_as_threefry(jax.random.fold_in),
    name="threefry2x32_unrolled", tag="fru")


def key(seed) -> jax.Array:
    return jax.random.key(seed.astype(jnp.uint32) ^ (seed >> 32).astype(jnp.uint32), impl=_THREEFRY)


def _float_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def _over_parts(self, draw):
    """draw(shape, floating dtype) -> values, in self's dtype. A complex tensor is drawn as CPU
    draws it, over view_as_real(self): its real and imaginary parts independently, each with
    the real formula in the component dtype (float64 for complex128)."""
    dtype = np.dtype(self.dtype)
    if dtype.kind == "c":
        parts = draw((*self.shape, 2), np.finfo(dtype).dtype)
        return jax.lax.complex(parts[..., 0], parts[..., 1]).astype(dtype)
    return draw(self.shape, _float_dtype(self)).astype(dtype)


def _refuse_complex(self, name: str) -> None:
    """CPU has no kernel of `name` for complex tensors: the oracle raises its NotImplementedError."""
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        raise TypeError(f"{name} has no kernel for {np.dtype(self.dtype).name}")


def _normal_in_range(values) -> bool:
    """normal_'s traced std, checked on the host (CPU torch names the error)."""
    return values[0].dtype.is_floating_point and values[2] >= 0


@lowering(aten.normal_.default, traced=("mean", "std"), in_range=_normal_in_range)
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        std = std / np.sqrt(2)  # CPU: each part gets half the variance; mean goes to both parts
    return _over_parts(self, lambda shape, dtype: jax.random.normal(key(generator), shape, dtype) * std + mean)


def _normal_std_in_range(values) -> bool:
    """normal's std tensor checked at the call, as CPU's and CUDA's kernels check it (both read
    `std.min() >= 0` back, a sync): XLA would draw with a negative scale. A NaN fails too. A
    complex std goes on to the lowering, which refuses it as CPU does."""
    std = values[1]
    if not isinstance(std, torch.Tensor) or std.is_complex() or std.numel() == 0:
        return True
    return bool(std.min().ge(0).item())


def _normal_of_tensors(mean, std, dtype, generator):
    """CPU's normal over tensors: normal_(0, 1) draws in the result's dtype (a complex one: each
    part with variance 1/2), times std, plus mean, in the broadcast shape of both."""
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    scale = 1 / np.sqrt(2) if np.dtype(dtype).kind == "c" else 1
    draws = _over_parts(types.SimpleNamespace(dtype=dtype, shape=shape),
                        lambda shape, dt: jax.random.normal(key(generator), shape, dt) * scale)
    return (draws * std + mean).astype(dtype)


@lowering(aten.normal.Tensor_Tensor, aten.normal.float_Tensor, in_range=_normal_std_in_range)
def normal_tensor_std(mean, std, *, generator=None):
    """The result takes mean's dtype (std's where mean is a number), as CPU's empty(mean.options())."""
    if jnp.issubdtype(std.dtype, jnp.complexfloating):
        raise TypeError("normal: a complex std")  # CPU refuses it: eager's oracle raises its error
    dtype = std.dtype if isinstance(mean, (int, float)) else mean.dtype
    return _normal_of_tensors(mean, std, dtype, generator)


def _uniform_real_dtype(self):
    """The floating dtype uniform_'s bounds live in (complex: its real parts), or None where
    CPU has no kernel or checks no bounds (an empty complex tensor)."""
    real = np.dtype(self.dtype)
    if real.kind == "c":
        if self.size == 0:  # CPU returns before checking a complex tensor's bounds
            return None
        real = np.finfo(real).dtype
    if not jnp.issubdtype(real, jnp.floating):
        raise TypeError(f"uniform_ has no kernel for {real.name}")  # CPU: NotImplementedError
    return real


def _check_uniform_range(self, from_, to):
    """CPU's checks of uniform_'s bounds, in its order: a floating dtype (complex: its real
    parts), from and to finite in it, from <= to, to - from representable."""
    real = _uniform_real_dtype(self)
    if real is None:
        return
    lowest, largest = float(jnp.finfo(real).min), float(jnp.finfo(real).max)
    if not (lowest <= from_ <= largest and lowest <= to <= largest) or from_ > to or to - from_ > largest:
        raise ValueError(f"uniform_: bounds [{from_}, {to}) out of range for {real.name}")  # CPU says which


def _uniform_in_range(values) -> bool:
    """uniform_'s traced bounds, checked on the host against the tensor's dtype."""
    self = values[0]
    try:
        _check_uniform_range(types.SimpleNamespace(dtype=to_jax(self.dtype), size=self.numel()), values[1], values[2])
    except (TypeError, ValueError):
        return False
    return True


@lowering(aten.uniform_.default, traced=("from", "to"), in_range=_uniform_in_range)
def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    """`from` and `to` are traced (layers' init bounds differ): the host checks them (in_range)."""
    if isinstance(from_, (int, float)) and isinstance(to, (int, float)):
        _check_uniform_range(self, from_, to)
    else:
        _uniform_real_dtype(self)
    return _over_parts(self, lambda shape, dtype: jax.random.uniform(key(generator), shape, dtype) * (to - from_)
                       + from_)


def _probability(values, position: int) -> bool:
    """A traced probability's range, checked on the host (CPU torch names the error)."""
    p = values[position]
    return isinstance(p, (int, float)) and 0 <= p <= 1


@lowering(aten.bernoulli_.float, traced=("p",), in_range=lambda values: _probability(values, 1))
def bernoulli_(self, p=0.5, *, generator=None):
    _refuse_complex(self, "bernoulli_")
    return jax.random.bernoulli(key(generator), p, self.shape).astype(self.dtype)


@lowering(aten.bernoulli_.Tensor)
def bernoulli_tensor_(self, p, *, generator=None):
    _refuse_complex(self, "bernoulli_")
    draw = jax.random.uniform(key(generator), self.shape, jnp.float64 if p.dtype == jnp.float64 else jnp.float32)
    return (draw < jnp.broadcast_to(p, self.shape)).astype(self.dtype)


@lowering(aten.bernoulli.default, computes_in_out_dtype=True)  # CPU draws into an out of any dtype
def bernoulli(self, *, generator=None):
    _refuse_complex(self, "bernoulli")
    draw = jax.random.uniform(key(generator), self.shape, _float_dtype(self))
    return (draw < self).astype(self.dtype)


@lowering(aten.exponential_.default)
def exponential_(self, lambd=1.0, *, generator=None):
    return (jax.random.exponential(key(generator), self.shape, _float_dtype(self)) / lambd).astype(self.dtype)


@lowering(aten.cauchy_.default)
def cauchy_(self, median=0.0, sigma=1.0, *, generator=None):
    return (jax.random.cauchy(key(generator), self.shape, _float_dtype(self)) * sigma + median).astype(self.dtype)


@lowering(aten.log_normal_.default)
def log_normal_(self, mean=1.0, std=2.0, *, generator=None):
    z = jax.random.normal(key(generator), self.shape, _float_dtype(self))
    return jnp.exp(z * std + mean).astype(self.dtype)


@lowering(aten.geometric_.default)
def geometric_(self, p, *, generator=None):
    u = jax.random.uniform(key(generator), self.shape, jnp.float64, minval=jnp.finfo(jnp.float64).tiny)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p)).astype(self.dtype)


def _random_ints(seed, shape, low, high, dtype):
    """Integers uniform in [low, high) (float dtypes hold integers, as torch's random_ does).
    low and high are Python ints or traced scalars (random_'s from and to: int64, uint64 past
    2^63); the span reaches 2^64 (random_(-2**63) of int64) and high 2^63, past int64, so all of it
    is taken modulo 2^64 (a span of 0 there is 2^64) and read back as int64."""
    _refuse_complex(types.SimpleNamespace(dtype=dtype), "random_")
    bits = jax.random.bits(key(seed), shape, jnp.uint64)
    low = _modulo_2_64(low)
    span = _modulo_2_64(high) - low
    offset = jnp.where(span == 0, bits, bits % jnp.maximum(span, np.uint64(1)))
    return jax.lax.bitcast_convert_type(offset + low, jnp.int64).astype(dtype)


def _modulo_2_64(value):
    """An integer modulo 2^64 as uint64 (a traced int64 wraps as two's complement)."""
    if isinstance(value, int):
        return np.uint64(value % 2**64)
    return jnp.asarray(value).astype(jnp.uint64)


def _max_of(dtype) -> int:
    if dtype == jnp.bool_:
        return 2
    if jnp.issubdtype(dtype, jnp.integer):
        return int(jnp.iinfo(dtype).max) + 1  # 2^63 for int64: _random_ints takes it modulo 2^64
    return 2 ** int(jnp.finfo(dtype).nmant + 1) + 1


def _random_bounds_as_cpu(values) -> bool:
    """random_'s from/to checks, per call (from and to are traced, so the lowering never sees their
    values): CPU's kernel on an empty tensor of self's dtype raises its
    errors ("from is out of bounds for ...", "random_ expects 'from' to be less than 'to'") and
    gives its warnings (a float dtype's exact-integer range) before it looks at the data."""
    self, *bounds = values[:-1]  # the last is the generator
    torch.empty(0, dtype=self.dtype).random_(*bounds)
    return True


@lowering(getattr(aten.random_, "from"), traced=("from", "to"), in_range=_random_bounds_as_cpu)
def random_from_(self, from_, to, *, generator=None):
    return _random_ints(generator, self.shape, from_, _max_of(self.dtype) if to is None else to, self.dtype)


@lowering(aten.random_.to, traced=("to",), in_range=_random_bounds_as_cpu)
def random_to_(self, to, *, generator=None):
    return _random_ints(generator, self.shape, 0, to, self.dtype)


@lowering(aten.random_.default)
def random_(self, *, generator=None):
    return _random_ints(generator, self.shape, 0, _max_of(self.dtype), self.dtype)


def _permutation(seed, n: int, dtype):
    """A uniform permutation of 0..n-1 in `dtype`, after CPU's checks that n fits it."""
    if n < 0:
        raise RuntimeError(f"n must be non-negative, got{n}")
    name = np.dtype(dtype).name
    largest = n - 1 if n > 0 else n
    if np.dtype(dtype).kind in "iu" and largest > np.iinfo(dtype).max:
        raise RuntimeError(f"n is too large for result tensor type: '{name}'")
    limits = {"float16": (2**11 + 1, "2049", "Half"), "float32": (2**24 + 1, "2^24+1", "Float"),
              "float64": (2**53 + 1, "2^53+1", "Double")}
    if name in limits and n > limits[name][0]:
        raise RuntimeError(f"n cannot be greater than {limits[name][1]} for {limits[name][2]} type.")
    # one sort by 64-bit random keys (ties, about n^2 / 2^65 of them, keep index order): jax.random.permutation
    # sorts by 32-bit keys in rounds, three for 2^25 elements, three times the time on XLA's CPU sort
    bits = jax.random.bits(key(seed), (n,), jnp.uint64)
    return jax.lax.sort_key_val(bits, jnp.arange(n, dtype=jnp.int64))[1].astype(dtype)


@lowering(aten.randperm.generator)
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    from ..dtypes import to_jax

    return _permutation(generator, n, to_jax(dtype or torch.int64))


@lowering(aten.randperm.generator_out)
def randperm_generator_out(n, *, generator=None, out):
    """torch.randperm(n, device=...) and randperm(n, out=...) land here (through randperm's
    CompositeExplicitAutograd kernels); its out= differs from randperm.generator's arguments
    (no dtype), so it is not derived. Returns out's new value: a permutation in out's dtype."""
    return _permutation(generator, n, out.dtype)


@lowering(aten.native_dropout.default, random=True, traced=("p",),
          in_range=lambda values: not values[2] or _probability(values, 1))
def native_dropout(input, p, train, *, generator=None):
    """`p` is traced (a new rate compiles nothing), so p == 0 and p == 1 are jnp.where cases."""
    if not train:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = jax.random.bernoulli(key(generator), 1.0 - p, input.shape) | (p == 0)
    scale = jnp.where(p < 1, 1.0 / jnp.where(p < 1, 1.0 - p, 1.0), 0.0).astype(input.dtype)
    return jnp.where(keep, input * scale, jnp.zeros((), input.dtype)), keep


@lowering(aten.rrelu_with_noise.default, random=True)
def rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """Returns (noise's new value, the output). Training: each non-positive element is scaled
    by a slope drawn uniformly from [lower, upper], which noise records (1 elsewhere); eval:
    leaky_relu with the mean slope, noise untouched (CPU's kernel)."""
    if not jnp.issubdtype(self.dtype, jnp.floating):
        raise TypeError("rrelu_with_noise has no kernel for integer tensors")
    if not training:
        slope = jnp.asarray((lower + upper) / 2, jnp.float64).astype(self.dtype)
        return noise, jnp.where(self >= 0, self, self * slope)
    compute = _float_dtype(self) if self.dtype not in (jnp.float16, jnp.bfloat16) else jnp.float32
    slopes = jax.random.uniform(key(generator), self.shape, compute, lower, upper).astype(self.dtype)
    drawn = self <= 0  # NaN keeps itself with slope 1, as CPU's `input <= 0` test
    new_noise = jnp.where(drawn, slopes, jnp.ones((), self.dtype)).astype(noise.dtype)
    return new_noise, jnp.where(drawn, self * slopes, self)


@lowering(aten.rrelu_with_noise_.default, random=True)
def rrelu_with_noise_(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """The in-place form writes self and noise: their new values, in schema order."""
    new_noise, out = rrelu_with_noise(self, noise, lower, upper, training, generator)
    return out, new_noise


def _multinomial_refused(self, num_samples, replacement) -> bool:
    """CPU's checks of multinomial's arguments (not its data): 1-D or 2-D floating weights, at
    least one sample, no more than the categories without replacement, at most 2^24 of them."""
    categories = self.shape[-1] if self.shape else 0
    return (len(self.shape) not in (1, 2) or not jnp.issubdtype(self.dtype, jnp.floating) or num_samples <= 0
            or (not replacement and num_samples > categories) or categories > 2 ** 24)


# Codes of multinomial's data checks (ops/index_probes.Derived): 0 valid, else CPU's error
_MULTINOMIAL_ERRORS = {
    1: "probability tensor contains either `inf`, `nan` or element < 0",
    2: "invalid multinomial distribution (sum of probabilities <= 0)",
    3: "invalid multinomial distribution (encountering probability entry < 0)",
    4: "invalid multinomial distribution (encountering probability entry = infinity or NaN)",
}


def _checked_at_once(p):
    """CPU's path without replacement (or one sample): every weight finite and >= 0 (code 1),
    then no row of zeros (code 2)."""
    invalid = jnp.any(~(p < jnp.inf) | ~(p >= 0))  # NaN fails both, as CPU's max() < inf does
    empty_row = jnp.any(jnp.all(p == 0, axis=-1))
    return jnp.where(invalid, 1, jnp.where(empty_row, 2, 0))


def _checked_row_by_row(p):
    """CPU's loop with replacement, row by row: the first weight that is not >= 0 (NaN
    included, code 3) or infinite (code 4) in the row, then a row summing to 0 (code 2)."""
    p = p.reshape(-1, p.shape[-1])
    negative, infinite = ~(p >= 0), jnp.isinf(p)
    first = jnp.argmax(negative | infinite, axis=-1)
    kind = jnp.where(jnp.take_along_axis(negative, first[:, None], axis=-1)[:, 0], 3, 4)
    return jnp.where(jnp.any(negative | infinite, axis=-1), kind, jnp.where(jnp.any(p > 0, axis=-1), 0, 2))


def _multinomial_probes(values):
    """multinomial's data checks, as CPU makes them (XLA would sample from any weights)."""
    self, num_samples, replacement = values[:3]
    if _multinomial_refused(self, num_samples, replacement) or math.prod(self.shape) == 0:
        return  # the lowering raises CPU's error for the arguments
    if replacement and num_samples > 1:
        rows = self.shape[0] if len(self.shape) == 2 else 1
        check = Derived(self, (rows,), _checked_row_by_row)
    else:
        check = Derived(self, (1,), _checked_at_once)
    yield check, 1, False, lambda _, code: RuntimeError(_MULTINOMIAL_ERRORS[code])


@lowering(aten.multinomial.default, index_probes=_multinomial_probes)
def multinomial(self, num_samples, replacement=False, *, generator=None):
    """Category indices drawn from each row of unnormalized non-negative weights: with
    replacement as independent categorical draws, without as the top num_samples of
    log-weights plus Gumbel noise (categories of weight 0 are never drawn). Eager checks the
    weights' values as CPU does (index_probes), before any sync reads the samples."""
    if _multinomial_refused(self, num_samples, replacement):
        raise ValueError("multinomial: arguments CPU refuses")  # eager's oracle raises CPU's error
    logits = jnp.log(self.astype(_float_dtype(self)))
    k = key(generator)
    if replacement:
        draws = jax.random.categorical(k, logits, axis=-1, shape=(num_samples,) + logits.shape[:-1])
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    noisy = logits + jax.random.gumbel(k, logits.shape, logits.dtype)
    return jax.lax.top_k(noisy, num_samples)[1].astype(jnp.int64)
