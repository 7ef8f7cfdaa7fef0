"""Lowerings: nn family (matmuls, softmax, losses, norms, convolution, pooling, ...).

Conventions shared by this file:
  * float16/bfloat16 inputs are computed in float32 (`_acc`) and cast back, as torch's
    CPU kernels accumulate; matmuls and convolutions ask XLA for float32 accumulation
    through `preferred_element_type` instead of upcasting their operands.
  * float32 matmul precision follows `torch.get_float32_matmul_precision()` at trace
    time ("highest", torch's default, means no TF32/bf16 passes on GPUs and TPUs).
  * Backward ops of linear forwards (pools, convolution) are the forward's jax.vjp, so
    forward and backward cannot disagree about geometry.
  * Reductions use torch's enum: 0 none, 1 mean, 2 sum.
"""
from __future__ import annotations
import fractions
import functools
import itertools
import math
import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import suggest_memory_format
from jax import lax
from ..dtypes import to_jax, to_torch
from .promotion import cast, promote, require_dtype
from .registry import family, BATCH_ONLY, Padding, suggested_memory_format

lowering = family(not_paddable="no padding rule yet: it mixes elements along its dims (normalization, pooling, losses)")


aten = torch.ops.aten

F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)
_LOW_PRECISION = (np.dtype(np.float16), np.dtype(jnp.bfloat16))


# ---------------------------------------------------------------------------- helpers


def _acc(dtype) -> np.dtype:
    """The dtype torch's CPU kernels accumulate `dtype` in."""
    dtype = np.dtype(dtype)
    return F32 if dtype in _LOW_PRECISION else dtype


def _up(x):
    """`x` in its accumulation dtype."""
    return x.astype(_acc(x.dtype))


def matmul_precision():
    """float32 matmul precision from torch.get_float32_matmul_precision() (read at trace time)."""
    return {
        "highest": lax.Precision.HIGHEST,
        "high": lax.Precision.HIGH,
        "medium": lax.Precision.DEFAULT,
    }[torch.get_float32_matmul_precision()]


def _preferred(dtype):
    dtype = np.dtype(dtype)
    return F32 if dtype in _LOW_PRECISION else None


def _dot_general(a, b, contract, batch=((), ())):
    """lax.dot_general accumulating in float32 for half dtypes; result in the accumulation dtype.
    On XLA:CPU the half operands are upcast first (exact, and the same float32 sums): its Eigen dot
    has no BF16 x BF16 = F32 kernel, and a batched dot of a transposed bfloat16 operand reached it
    ("UNIMPLEMENTED: Unsupported element type for DotThunk::Execute", test_linalg's test_bmm)."""
    preferred = _preferred(a.dtype)
    if preferred is not None and jax.default_backend() == "cpu":  # (ops may not ask runtime.platform: layers)
        a, b = a.astype(preferred), b.astype(preferred)
    return lax.dot_general(a, b, (contract, batch), precision=matmul_precision(), preferred_element_type=preferred)


def _reduce(loss, reduction: int):
    if reduction == 0:
        return loss
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _reduce_grad(grad_output, shape, reduction: int):
    """d(reduced loss)/d(elementwise loss), broadcast to `shape`."""
    if reduction == 1:
        return jnp.broadcast_to(grad_output / math.prod(shape), shape)
    return jnp.broadcast_to(grad_output, shape)


def _scaled_add(self, prod, beta, alpha, out_dtype):
    """beta * self + alpha * prod, where beta == 0 ignores self (NaN included), as torch."""
    acc = prod.dtype
    beta = cast(beta, acc)
    alpha = cast(alpha, acc)
    self = jnp.broadcast_to(self.astype(acc), prod.shape)
    scaled = jnp.where(beta == 0, jnp.zeros((), acc), beta * self)
    return (scaled + alpha * prod).astype(out_dtype)


# ------------------------------------------------------------------------- matmuls


def _same_dtypes_as_cpu(op, *operands) -> None:
    """CPU's matmuls refuse operands of different dtypes (no promotion). Eager turns a lowering's
    refusal into CPU's own exception for the call (errors.as_torch_error asks CPU)."""
    if len({x.dtype for x in operands}) > 1:
        raise RuntimeError(f"{op}: expected operands of one dtype, got {[str(x.dtype) for x in operands]}")


@lowering(aten.mm.default, padding=Padding("contraction"))
def mm(self, mat2):
    _same_dtypes_as_cpu(aten.mm.default, self, mat2)
    return _dot_general(self, mat2, ((1,), (0,))).astype(self.dtype)


@lowering(aten.bmm.default, padding=Padding("contraction"))
def bmm(self, mat2):
    return _dot_general(self, mat2, ((2,), (1,)), ((0,), (0,))).astype(self.dtype)


@lowering(aten.mv.default, padding=Padding("contraction"))
def mv(self, vec):
    _same_dtypes_as_cpu(aten.mv.default, self, vec)
    return _dot_general(self, vec, ((1,), (0,))).astype(self.dtype)


@lowering(aten.dot.default, padding=Padding("contraction"))
def dot(self, tensor):
    return _dot_general(self, tensor, ((0,), (0,))).astype(self.dtype)


@lowering(aten.vdot.default)
def vdot(self, other):
    return _dot_general(jnp.conj(self), other, ((0,), (0,))).astype(self.dtype)


@lowering(aten.addmm.default, padding=Padding("contraction"))
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    _same_dtypes_as_cpu(aten.addmm.default, self, mat1, mat2)
    return _scaled_add(self, _dot_general(mat1, mat2, ((1,), (0,))), beta, alpha, mat1.dtype)


@lowering(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    return _scaled_add(self, _dot_general(mat, vec, ((1,), (0,))), beta, alpha, mat.dtype)


@lowering(aten.baddbmm.default, padding=Padding("contraction"))
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    prod = _dot_general(batch1, batch2, ((2,), (1,)), ((0,), (0,)))
    return _scaled_add(self, prod, beta, alpha, batch1.dtype)


@lowering(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    _same_dtypes_as_cpu(aten.addbmm.default, self, batch1, batch2)
    # sum over the batch is a second contraction dimension
    prod = _dot_general(batch1, batch2, ((0, 2), (0, 1)))
    return _scaled_add(self, prod, beta, alpha, batch1.dtype)


@lowering(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    # CPU expands self to the outer product's shape first: a 0-d self promotes as a dimensioned tensor
    _, out = promote(jnp.atleast_1d(self), vec1, vec2)
    prod = _up(vec1.astype(out))[:, None] * _up(vec2.astype(out))[None, :]
    if out == np.dtype(np.bool_):
        # torch: logical (beta and self) or (alpha and outer)
        return jnp.logical_or(jnp.logical_and(cast(beta, out), self), jnp.logical_and(cast(alpha, out), prod))
    return _scaled_add(self, prod, beta, alpha, out)


# ------------------------------------------------------------------------- softmax


def _along(fn, x, dim):
    """Apply `fn(x, axis)` also to 0-d tensors (torch allows dim 0 / -1 there) and to empty
    ones (CPU returns them as they are; a max over a zero-size axis has no value)."""
    if x.size == 0:
        return x
    if x.ndim == 0:
        return fn(x.reshape(1), 0).reshape(())
    return fn(x, dim)


def _softmax_fn(x, axis):
    m = lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    e = jnp.exp(x - m)
    return e / jnp.sum(e, axis=axis, keepdims=True)


def _log_softmax_fn(x, axis):
    m = lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    shifted = x - m
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))


@lowering(aten._softmax.default, padding=Padding("softmax"))
def _softmax(self, dim, half_to_float):
    out = F32 if half_to_float else self.dtype
    return _along(_softmax_fn, _up(self), dim).astype(out)


@lowering(aten._log_softmax.default, padding=Padding("softmax"))
def _log_softmax(self, dim, half_to_float):
    out = F32 if half_to_float else self.dtype
    return _along(_log_softmax_fn, _up(self), dim).astype(out)


@lowering(aten._safe_softmax.default, padding=Padding("softmax"))
def _safe_softmax(self, dim, dtype=None):
    """softmax that gives 0, not NaN, on rows that are entirely -inf (masked attention)."""
    x = self.astype(to_jax(dtype)) if dtype is not None else self
    out = _along(_softmax_fn, _up(x), dim).astype(x.dtype)
    if x.ndim == 0:
        return jnp.where(x == -jnp.inf, jnp.zeros((), x.dtype), out)
    masked = jnp.all(x == -jnp.inf, axis=dim, keepdims=True)
    return jnp.where(masked, jnp.zeros((), x.dtype), out)


@lowering(aten._softmax_backward_data.default, padding=Padding("softmax_backward"))
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _up(grad_output), _up(output)
    fn = lambda gy, axis: gy[0] * (gy[1] - jnp.sum(gy[0] * gy[1], axis=axis, keepdims=True))  # noqa: E731
    if y.ndim == 0:
        res = y * (g - g * y)
    else:
        res = fn((y, g), dim)
    return res.astype(to_jax(input_dtype))


@lowering(aten._log_softmax_backward_data.default, padding=Padding("softmax_backward"))
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _up(grad_output), _up(output)
    if y.ndim == 0:
        res = g - jnp.exp(y) * g
    else:
        res = g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)
    return res.astype(to_jax(input_dtype))


# -------------------------------------------------------------------------- weight norm


@lowering(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """w = v * g / ||v|| (the norm over every dim but `dim`, kept as g's shape)."""
    axes = tuple(a for a in range(saved_v.ndim) if a != dim % saved_v.ndim)
    gw, v, g, norms = _up(grad_w), _up(saved_v), _up(saved_g), _up(saved_norms)
    grad_g = jnp.sum(gw * v, axis=axes, keepdims=True) / norms
    grad_v = (g / norms) * (gw - v * (grad_g / norms))
    return grad_v.astype(saved_v.dtype), grad_g.reshape(saved_g.shape).astype(saved_g.dtype)


# -------------------------------------------------------------------------- losses


def _nll_parts(self, target, weight, ignore_index):
    """Per-element (-log p[target] * w, w) with ignored targets weighted 0.

    self is (C,), (N, C) or (N, C, d1, ...); the class axis is 1 when batched."""
    batched = self.ndim >= 2
    x = self if batched else self[None]
    t = target if batched else target[None]
    valid = t != ignore_index
    safe = jnp.where(valid, t, 0).astype(I64)
    picked = jnp.take_along_axis(x, safe[:, None], axis=1)[:, 0]
    w = jnp.ones(safe.shape, x.dtype) if weight is None else jnp.take(weight, safe).astype(x.dtype)
    w = jnp.where(valid, w, jnp.zeros((), x.dtype))
    if not batched:
        picked, w = picked[0], w[0]
    return picked, w


# nll_loss's target dtypes and CPU's words for another, per overload (forward of a batch of class
# scores, its backward, the 2-d forward and backward); no meta kernel checks them
_NLL_TARGET = {
    "nll_loss_forward": ((np.int64, np.uint8), RuntimeError, "expected target dtype to be Long or Byte, but got {}"),
    "nll_loss_backward": ((np.int64, np.uint8), RuntimeError, "expected scalar type Long but found {}"),
    "nll_loss2d_forward": ((np.int64,), RuntimeError, "expected scalar type Long but found {}"),
    "nll_loss2d_backward": ((np.int64,), RuntimeError, "expected scalar type Long but found {}"),
}
_LONG_TARGET = ((np.int64,), RuntimeError, "expected scalar type Long but found {}")


def _nll_loss_forward(self, target, weight, reduction, ignore_index, *, overload="nll_loss_forward"):
    require_dtype(target, *_NLL_TARGET[overload])
    picked, w = _nll_parts(_up(self), target, weight, ignore_index)
    loss = -picked * w
    dt = self.dtype
    if reduction == 0 and self.ndim >= 2:
        return loss.astype(dt), jnp.zeros((), dt)  # torch leaves total_weight 0 here
    total = jnp.sum(w)
    out = jnp.sum(loss)
    if reduction == 1:
        out = out / total
    return out.astype(dt), total.astype(dt)


def _nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight, *,
                       overload="nll_loss_backward"):
    require_dtype(target, *_NLL_TARGET[overload])
    _, w = _nll_parts(_up(self), target, weight, ignore_index)
    g = _up(grad_output)
    if reduction == 1:
        g = g / _up(total_weight)
    coeff = -w * g  # per-element gradient of the picked log-probability
    class_axis = 1 if self.ndim >= 2 else 0
    t = target.astype(I64)
    onehot = lax.broadcasted_iota(I64, self.shape, class_axis) == jnp.expand_dims(t, class_axis)
    grad = jnp.where(onehot, jnp.expand_dims(coeff, class_axis), jnp.zeros((), coeff.dtype))
    return grad.astype(self.dtype)


nll_loss_forward = lowering(aten.nll_loss_forward.default, padding=Padding("nll_loss_forward"))(_nll_loss_forward)
nll_loss_backward = lowering(aten.nll_loss_backward.default, padding=Padding("nll_loss_backward"))(_nll_loss_backward)


@lowering(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    return _nll_loss_forward(self, target, weight, reduction, ignore_index, overload="nll_loss2d_forward")


@lowering(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight,
                              overload="nll_loss2d_backward")


@lowering(aten.mse_loss.default, padding=Padding("mse_loss"))
def mse_loss(self, target, reduction=1):
    compute, out = promote(self, target)
    d = _up(self.astype(compute)) - _up(target.astype(compute))
    return _reduce(d * d, reduction).astype(out)


@lowering(aten.mse_loss_backward.default, padding=Padding("mse_loss_backward"))
def mse_loss_backward(grad_output, self, target, reduction):
    compute, out = promote(grad_output, self, target)
    d = _up(self.astype(compute)) - _up(target.astype(compute))
    shape = jnp.broadcast_shapes(grad_output.shape, self.shape, target.shape)
    g = _reduce_grad(_up(grad_output.astype(compute)), shape, reduction)
    return (2 * d * g).astype(out)


# --------------------------------------------------------------------------- norms


def _bcast_channel(v, ndim):
    """A per-channel (C,) vector shaped to broadcast against (N, C, *spatial)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _normalize_grad(g_hat, xhat, rstd, axes):
    """d loss / d x for y = (x - mean) * rstd with batch statistics over `axes`."""
    mean_g = jnp.mean(g_hat, axis=axes, keepdims=True)
    mean_gx = jnp.mean(g_hat * xhat, axis=axes, keepdims=True)
    return rstd * (g_hat - mean_g - xhat * mean_gx)


@lowering(aten.native_layer_norm.default, padding=Padding("layer_norm"))
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x = _up(input)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * _up(weight)
    if bias is not None:
        out = out + _up(bias)
    dt = input.dtype
    return out.astype(dt), mean.astype(dt), rstd.astype(dt)


@lowering(aten.native_layer_norm_backward.default, padding=Padding("layer_norm_backward"))
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    k = len(normalized_shape)
    axes = tuple(range(input.ndim - k, input.ndim))
    batch_axes = tuple(range(input.ndim - k))
    x, g, mean, rstd = _up(input), _up(grad_out), _up(mean), _up(rstd)
    xhat = (x - mean) * rstd
    dt = input.dtype
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        g_hat = g * _up(weight) if weight is not None else g
        grad_input = _normalize_grad(g_hat, xhat, rstd, axes).astype(dt)
    if output_mask[1] and weight is not None:
        grad_weight = jnp.sum(g * xhat, axis=batch_axes).astype(weight.dtype)
    if output_mask[2] and bias is not None:
        grad_bias = jnp.sum(g, axis=batch_axes).astype(bias.dtype)
    return grad_input, grad_weight, grad_bias


def _rms_eps(eps, computation_dtype):
    """torch's default eps (None): the machine epsilon of float32 or float64 computation."""
    if eps is not None:
        return eps
    single = computation_dtype in (np.dtype(np.float32), np.dtype(np.complex64))
    return float(np.finfo(np.float32 if single else np.float64).eps)


@lowering(aten._fused_rms_norm.default,
          over_composite="torch differentiates it with FusedRmsNormBackward0 once a backend has a kernel")
def _fused_rms_norm(input, normalized_shape, weight, eps):
    """rms_norm as one call (torch's decomposition, in the accumulation dtype): (output, rstd)."""
    if not jnp.issubdtype(input.dtype, jnp.inexact):  # the meta kernel accepts it: CPU names the error (eager's oracle)
        raise ValueError(f"rms_norm of {input.dtype}")
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x = _up(input)
    rstd = lax.rsqrt(jnp.mean(jnp.square(x), axis=axes, keepdims=True) + _rms_eps(eps, x.dtype))
    out = x * rstd
    if weight is not None:
        out = out * weight
    return out.astype(input.dtype), rstd


@lowering(aten._fused_rms_norm_backward.default)
def _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    axis = input.ndim - len(normalized_shape)
    inner, outer = tuple(range(axis, input.ndim)), tuple(range(axis))
    x, g = _up(input), grad_out.astype(_acc(input.dtype))
    w = weight.astype(x.dtype) if weight is not None else None
    grad_x_hat = g * w if w is not None else g
    x_hat = x * rstd
    grad_input = grad_weight = None
    if output_mask[0]:
        n = math.prod(input.shape[axis:])
        total = jnp.sum(x_hat * grad_x_hat, axis=inner, keepdims=True)
        grad_input = ((grad_x_hat - (x_hat / n) * total) * rstd).astype(input.dtype)
    if output_mask[1] and w is not None:
        grad_weight = jnp.sum(g * x_hat, axis=outer).astype(input.dtype)
    return grad_input, grad_weight


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(output, save_mean, save_invstd, new_running_mean, new_running_var) as torch computes them.

    The new running statistics are None where there are none to update."""
    axes = (0,) + tuple(range(2, input.ndim))
    x = _up(input)
    acc = x.dtype
    nd = input.ndim
    params = [t for t in (weight, bias, running_mean, running_var) if t is not None]
    stat_dtype = params[0].dtype if params else input.dtype
    new_rm = new_rv = None
    if training:
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - _bcast_channel(mean, nd)), axis=axes)
        invstd = lax.rsqrt(var + eps)
        n = math.prod(input.shape[a] for a in axes)
        if running_mean is not None:
            new_rm = ((1 - momentum) * _up(running_mean) + momentum * mean).astype(running_mean.dtype)
        if running_var is not None:
            unbiased = var * (n / max(n - 1, 1))
            new_rv = ((1 - momentum) * _up(running_var) + momentum * unbiased).astype(running_var.dtype)
        # CPU stores the batch statistics in the parameters' dtype (float32 parameters with a
        # half input: mixed type), else the input's, and normalizes with the stored values
        save_mean, save_invstd = mean.astype(stat_dtype), invstd.astype(stat_dtype)
        mean, invstd = _up(save_mean), _up(save_invstd)
    else:
        mean = _up(running_mean)
        invstd = lax.rsqrt(_up(running_var) + eps)
        save_mean = save_invstd = jnp.zeros((0,), stat_dtype)
    # as CPU's kernel: input * alpha + beta per channel
    alpha = invstd.astype(acc) * _up(weight) if weight is not None else invstd.astype(acc)
    beta = -mean.astype(acc) * alpha if bias is None else _up(bias) - mean.astype(acc) * alpha
    out = x * _bcast_channel(alpha, nd) + _bcast_channel(beta, nd)
    return out.astype(input.dtype), save_mean, save_invstd, new_rm, new_rv


def _native_batch_norm_eager(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """native_batch_norm in eager: its schema hides the writes to the running statistics, so
    eager has no kernel for it; _native_batch_norm_legit declares them and has one (torch's own
    decomposition would recompute batch norm in other roundings than CPU's)."""
    if running_mean is None or running_var is None:
        if not training:
            raise RuntimeError("native_batch_norm: running_mean and running_var must be defined in evaluation mode")
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    if not training:  # nothing written; and CPU's saved statistics are empty (torch's trace of _legit,
        # taking pjrt for CUDA, would return running_mean itself as save_mean)
        return aten._native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps)
    return aten._native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering(aten.native_batch_norm.default, decomposition=_native_batch_norm_eager,
          output_memory_format=suggested_memory_format)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    # torch's schema hides that training also updates running_mean/running_var in place.
    # Eager pjrt never calls this lowering (its `decomposition` serves eager); a consumer that
    # does call it must write back RUNNING_STATS_UPDATE's values.
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit.no_stats, output_memory_format=suggested_memory_format)
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, training, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_no_training.default, padding=BATCH_ONLY, output_memory_format=suggested_memory_format)
def _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_functional.default, output_memory_format=suggested_memory_format)
def _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, save_mean, save_invstd, new_rm, new_rv = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, save_mean, save_invstd, (running_mean if new_rm is None else new_rm), (
        running_var if new_rv is None else new_rv)


def batch_norm_running_stats(input, weight, bias, running_mean, running_var, training, momentum, eps, *_):
    """The new (running_mean, running_var) native_batch_norm writes in place when training."""
    _, _, _, new_rm, new_rv = _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return new_rm, new_rv


@lowering(aten._native_batch_norm_legit.default, output_memory_format=suggested_memory_format)
def _native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Writes running_mean and running_var (returned first, per registry.py) when training."""
    out, save_mean, save_invstd, new_rm, new_rv = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps)
    return (running_mean if new_rm is None else new_rm), (running_var if new_rv is None else new_rv), out, \
        save_mean, save_invstd


@lowering(aten._batch_norm_with_update.default)
def _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    """Training batch norm writing running_mean and running_var; the 4th output is CPU's empty reserve."""
    return _native_batch_norm_legit(input, weight, bias, running_mean, running_var, True, momentum, eps) + (
        jnp.zeros((0,), jnp.uint8),)


RUNNING_STATS_UPDATE = {aten.native_batch_norm.default: batch_norm_running_stats}


@lowering(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    nd = input.ndim
    axes = (0,) + tuple(range(2, nd))
    x, g = _up(input), _up(grad_out)
    if train:
        mean, invstd = _up(save_mean), _up(save_invstd)
    else:
        mean, invstd = _up(running_mean), lax.rsqrt(_up(running_var) + eps)
    # CPU's kernel: two sums per channel, sum(g) and dotp = sum((x - mean) * g), then one
    # elementwise pass (half the reductions of differentiating y = (x - mean) * invstd * w)
    centered = x - _bcast_channel(mean, nd)
    total = jnp.sum(g, axis=axes)
    dotp = jnp.sum(centered * g, axis=axes)
    scale = invstd * _up(weight) if weight is not None else invstd
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if train:
            n = math.prod(input.shape[a] for a in axes)
            k = dotp * invstd * invstd / n
            grad_input = (g - _bcast_channel(total / n, nd) - centered * _bcast_channel(k, nd)) * _bcast_channel(scale, nd)
        else:
            grad_input = g * _bcast_channel(scale, nd)
        grad_input = grad_input.astype(input.dtype)
    wdt = weight.dtype if weight is not None else _acc(input.dtype)
    if output_mask[1]:
        grad_weight = (dotp * invstd).astype(wdt)
    if output_mask[2]:
        grad_bias = total.astype(wdt)
    return grad_input, grad_weight, grad_bias


@lowering(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    # the group's size spelled out: -1 cannot be inferred when N is 0
    x = _up(input).reshape(N, group, C // group * HxW)
    mean = jnp.mean(x, axis=2, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=2, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = ((x - mean) * rstd).reshape(input.shape)
    if weight is not None:
        out = out * _bcast_channel(_up(weight), input.ndim)
    if bias is not None:
        out = out + _bcast_channel(_up(bias), input.ndim)
    dt = input.dtype
    return out.astype(dt), mean.reshape(N, group).astype(dt), rstd.reshape(N, group).astype(dt)


@lowering(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    nd = input.ndim
    x, g = _up(input), _up(grad_out)
    mean_g, rstd_g = _up(mean).reshape(N, group, 1), _up(rstd).reshape(N, group, 1)
    grouped = (N, group, C // group * HxW)  # not -1: N may be 0
    xhat = ((x.reshape(grouped) - mean_g) * rstd_g).reshape(input.shape)
    reduce_axes = (0,) + tuple(range(2, nd))
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        g_hat = g * _bcast_channel(_up(weight), nd) if weight is not None else g
        grad_input = _normalize_grad(
            g_hat.reshape(grouped), xhat.reshape(grouped), rstd_g, (2,)
        ).reshape(input.shape).astype(input.dtype)
    wdt = weight.dtype if weight is not None else input.dtype
    if output_mask[1]:
        grad_weight = jnp.sum(g * xhat, axis=reduce_axes).astype(wdt)
    if output_mask[2]:
        grad_bias = jnp.sum(g, axis=reduce_axes).astype(wdt)
    return grad_input, grad_weight, grad_bias


# --------------------------------------------------------------------- convolution

_SPATIAL = {1: "H", 2: "HW", 3: "DHW"}


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups):
    """aten.convolution without bias: lax.conv_general_dilated in torch's NC* layout."""
    nd = input.ndim - 2
    sp = _SPATIAL[nd]
    dn = lax.conv_dimension_numbers(input.shape, weight.shape, ("NC" + sp, "OI" + sp, "NC" + sp))
    common = dict(dimension_numbers=dn, feature_group_count=groups, precision=matmul_precision(),
                  preferred_element_type=_preferred(input.dtype))
    if not transposed:
        return lax.conv_general_dilated(
            input, weight, window_strides=tuple(stride), padding=[(p, p) for p in padding],
            rhs_dilation=tuple(dilation), **common)
    # A transposed convolution is the input-gradient of a convolution: dilate the input by
    # the stride, pad by dilation*(k-1)-padding, and convolve with the flipped kernel whose
    # in/out channels are swapped within each group.
    cin, cout_g, *k = weight.shape
    w = weight.reshape((groups, cin // groups, cout_g) + tuple(k))
    w = jnp.swapaxes(w, 1, 2).reshape((groups * cout_g, cin // groups) + tuple(k))
    w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    return lax.conv_general_dilated(
        input, w, window_strides=(1,) * nd, padding=pads, lhs_dilation=tuple(stride),
        rhs_dilation=tuple(dilation), **common)


def _expand(v, nd):
    v = tuple(v)
    return v * nd if len(v) == 1 else v


def _check_conv_params(stride, padding, dilation, output_padding):
    """CPU's ConvParams checks, which the meta kernel partly skips (negative padding): raising
    lets CPU name the refusal; before lax, which divides by a zero stride with a warning."""
    if any(p < 0 for p in padding):
        raise ValueError("negative padding")
    if any(p < 0 for p in output_padding):
        raise ValueError("negative output_padding")
    if any(s <= 0 for s in stride):
        raise ValueError("non-positive stride")
    if any(d <= 0 for d in dilation):
        raise ValueError("non-positive dilation")


def _convolution_memory_format(values) -> torch.memory_format:
    """CPU's (mkldnn_conv_use_channels_last) and CUDA's (cudnn_conv_suggest_memory_format) rule:
    channels_last output where the input or the weight is channels_last."""
    input, weight = values[0], values[1]
    if input.dim() in (4, 5):
        for t in (input, weight):
            suggested = suggest_memory_format(t)
            if suggested != torch.contiguous_format:
                return suggested
    return torch.contiguous_format


@lowering(aten.convolution.default, padding=Padding("convolution"), output_memory_format=_convolution_memory_format)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    nd = weight.ndim - 2
    _check_conv_params(stride, padding, dilation, output_padding)
    stride, padding, dilation, output_padding = (_expand(v, nd) for v in (stride, padding, dilation, output_padding))
    unbatched = input.ndim == nd + 1
    x = input[None] if unbatched else input
    out = _conv(x, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + _bcast_channel(_up(bias), out.ndim)
    out = out.astype(input.dtype)
    return out[0] if unbatched else out


@lowering(aten.convolution_backward.default, padding=Padding("convolution_backward"))
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    nd = weight.ndim - 2
    _check_conv_params(stride, padding, dilation, output_padding)
    stride, padding, dilation, output_padding = (_expand(v, nd) for v in (stride, padding, dilation, output_padding))
    unbatched = input.ndim == nd + 1
    x = input[None] if unbatched else input
    g = grad_output[None] if unbatched else grad_output

    def fwd(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups).astype(input.dtype)

    grad_input = grad_weight = grad_bias = None
    if output_mask[0] or output_mask[1]:
        _, vjp = jax.vjp(fwd, x, weight)
        gx, gw = vjp(g.astype(input.dtype))
        if output_mask[0]:
            grad_input = gx[0] if unbatched else gx
        if output_mask[1]:
            grad_weight = gw
    if output_mask[2]:
        grad_bias = jnp.sum(_up(g), axis=(0,) + tuple(range(2, g.ndim))).astype(grad_output.dtype)
    return grad_input, grad_weight, grad_bias


# ------------------------------------------------------------------------- pooling


def _pool_out_size(size, k, s, p, d, ceil_mode):
    """torch's pooling_output_shape."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_args(nd, kernel_size, stride, padding, dilation=(1,)):
    k = _expand(kernel_size, nd)
    s = _expand(stride, nd) if len(stride) else k
    return k, s, _expand(padding, nd), _expand(dilation, nd)


def _lowest(dtype):
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf, dtype)
    return jnp.array(jnp.iinfo(dtype).min, dtype)


def _max_pool_with_indices(x, k, s, p, d, ceil_mode):
    """Max pool over the last len(k) axes; indices are flat offsets into those axes."""
    nd = len(k)
    lead = x.ndim - nd
    sizes = x.shape[lead:]
    outs = [_pool_out_size(n, kk, ss, pp, dd, ceil_mode) for n, kk, ss, pp, dd in zip(sizes, k, s, p, d)]
    # pad low by p, high far enough for the last (possibly ceil_mode) window
    highs = [max((o - 1) * ss + dd * (kk - 1) + 1 - n - pp, 0) for o, ss, dd, kk, n, pp in zip(outs, s, d, k, sizes, p)]
    cfg = [(0, 0, 0)] * lead + [(pp, hh, 0) for pp, hh in zip(p, highs)]
    xp = lax.pad(x, _lowest(x.dtype), cfg)
    flat = jnp.arange(math.prod(sizes), dtype=I64).reshape(sizes)
    ip = lax.pad(flat, jnp.array(-1, I64), cfg[lead:])
    vals, idxs = [], []
    for offs in itertools.product(*(range(kk) for kk in k)):
        start = [o * dd for o, dd in zip(offs, d)]
        limit = [st + (o - 1) * ss + 1 for st, o, ss in zip(start, outs, s)]
        vals.append(lax.slice(xp, [0] * lead + start, list(xp.shape[:lead]) + limit, [1] * lead + list(s)))
        idxs.append(lax.slice(ip, start, limit, list(s)))
    vals = jnp.stack(vals, axis=-1)
    idxs = jnp.stack(idxs, axis=-1)
    # first maximum in window order; NaN wins, as in torch's kernels
    arg = jnp.argmax(vals, axis=-1)
    val = jnp.take_along_axis(vals, arg[..., None], axis=-1)[..., 0]
    idx = jnp.take_along_axis(jnp.broadcast_to(idxs, vals.shape), arg[..., None], axis=-1)[..., 0]
    return val, idx


def _max_unpool_grad(grad_output, indices, input, nd):
    lead_shape = input.shape[: input.ndim - nd]
    L = math.prod(lead_shape)
    S = math.prod(input.shape[input.ndim - nd:])
    per_plane = math.prod(grad_output.shape[grad_output.ndim - nd:])  # not -1: L may be 0
    g = _up(grad_output).reshape(L, per_plane)
    i = indices.reshape(L, per_plane).astype(I64)
    out = jnp.zeros((L, S), g.dtype).at[jnp.arange(L, dtype=I64)[:, None], i].add(g, mode="drop")
    return out.reshape(input.shape).astype(input.dtype)


def _max_pool_lowering(nd):
    def fn(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        k, s, p, d = _pool_args(nd, kernel_size, stride, _as_list(padding), _as_list(dilation))
        return _max_pool_with_indices(self, k, s, p, d, ceil_mode)
    return fn


def _as_list(v):
    return (v,) if isinstance(v, int) else tuple(v)


max_pool2d_with_indices = lowering(aten.max_pool2d_with_indices.default, padding=BATCH_ONLY)(_max_pool_lowering(2))
max_pool3d_with_indices = lowering(aten.max_pool3d_with_indices.default)(_max_pool_lowering(3))


@lowering(aten.max_pool2d_with_indices_backward.default, padding=BATCH_ONLY)
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_unpool_grad(grad_output, indices, self, 2)


@lowering(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_unpool_grad(grad_output, indices, self, 3)


def _avg_pool_sum(x, k, s, p, ceil_mode):
    """Window sums of x (in its accumulation dtype) and the output sizes."""
    nd = len(k)
    lead = x.ndim - nd
    sizes = x.shape[lead:]
    outs = [_pool_out_size(n, kk, ss, pp, 1, ceil_mode) for n, kk, ss, pp in zip(sizes, k, s, p)]
    highs = [max((o - 1) * ss + kk - n - pp, 0) for o, ss, kk, n, pp in zip(outs, s, k, sizes, p)]
    acc = _acc(x.dtype)
    summed = lax.reduce_window(
        x.astype(acc), np.array(0, acc), lax.add, (1,) * lead + tuple(k), (1,) * lead + tuple(s),
        [(0, 0)] * lead + list(zip(p, highs)))
    return summed, outs


def _avg_pool_divisor(sizes, outs, k, s, p, count_include_pad, divisor_override):
    if divisor_override is not None:
        div = np.asarray(float(divisor_override))
    else:
        # torch: windows are clipped to the padded input (count_include_pad) or to the input
        div = np.ones((), np.float64)
        for n, kk, ss, pp, o in zip(sizes, k, s, p, outs):
            start = np.arange(o) * ss - pp
            end = np.minimum(start + kk, n + pp)
            if count_include_pad:
                cnt = end - start
            else:
                cnt = np.minimum(end, n) - np.maximum(start, 0)
            div = div[..., None] * cnt
    return div


def _avg_pool(x, k, s, p, ceil_mode, count_include_pad, divisor_override):
    summed, outs = _avg_pool_sum(x, k, s, p, ceil_mode)
    div = _avg_pool_divisor(x.shape[x.ndim - len(k):], outs, k, s, p, count_include_pad, divisor_override)
    return (summed / jnp.asarray(div, summed.dtype)).astype(x.dtype)


def _avg_pool_lowering(nd):
    def fn(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        k, s, p, _ = _pool_args(nd, kernel_size, stride, _as_list(padding))
        return _avg_pool(self, k, s, p, ceil_mode, count_include_pad, divisor_override)
    return fn


def _avg_pool_backward_lowering(nd):
    def fn(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        k, s, p, _ = _pool_args(nd, kernel_size, stride, _as_list(padding))
        sizes = self.shape[self.ndim - nd:]
        outs = grad_output.shape[grad_output.ndim - nd:]
        div = _avg_pool_divisor(sizes, outs, k, s, p, count_include_pad, divisor_override)
        acc = _acc(self.dtype)
        # As CPU: each output's gradient is divided by its divisor in the input's dtype and added
        # into its window's inputs, windows in order, each addition rounded to that dtype.
        # Visiting kernel offsets last-first adds every input's contributions in window order.
        delta = (grad_output.astype(acc) / jnp.asarray(div, acc)).astype(self.dtype)
        lead = self.ndim - nd
        grad = jnp.zeros(self.shape, self.dtype)
        for offset in itertools.product(*(reversed(range(kk)) for kk in k)):
            cfg = [(0, 0, 0)] * lead + [(o - pp, pp + n - o - (m - 1) * ss - 1, ss - 1)
                                        for o, pp, n, m, ss in zip(offset, p, sizes, outs, s)]
            grad = (grad.astype(acc) + lax.pad(delta, jnp.zeros((), self.dtype), cfg).astype(acc)).astype(self.dtype)
        return grad
    return fn


avg_pool2d = lowering(aten.avg_pool2d.default, padding=BATCH_ONLY)(_avg_pool_lowering(2))
avg_pool3d = lowering(aten.avg_pool3d.default)(_avg_pool_lowering(3))
avg_pool2d_backward = lowering(aten.avg_pool2d_backward.default, padding=BATCH_ONLY)(_avg_pool_backward_lowering(2))
avg_pool3d_backward = lowering(aten.avg_pool3d_backward.default)(_avg_pool_backward_lowering(3))


def _adaptive_bounds(n, o):
    """torch's adaptive pooling windows: [floor(i*n/o), ceil((i+1)*n/o))."""
    i = np.arange(o)
    return (i * n) // o, -((-(i + 1) * n) // o)


def _adaptive_avg(x, output_size):
    nd = len(output_size)
    lead = x.ndim - nd
    acc = _acc(x.dtype)
    y = x.astype(acc)
    for a, o in enumerate(output_size):
        n = x.shape[lead + a]
        start, end = _adaptive_bounds(n, o)
        cols = np.arange(n)
        m = ((cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])) / (end - start)[:, None]
        y = jnp.moveaxis(jnp.tensordot(y, jnp.asarray(m.T, acc), axes=([lead + a], [0]), precision=lax.Precision.HIGHEST),
                         -1, lead + a)
    return y.astype(x.dtype)


def _check_adaptive_dtype(x):
    """CPU's adaptive pooling kernels exist for floating dtypes only (float16, bfloat16, float32,
    float64); for others it raises NotImplementedError, which the oracle then raises."""
    if np.dtype(x.dtype) not in (np.dtype(np.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32),
                                 np.dtype(np.float64)):
        raise TypeError(f"adaptive pooling has no kernel for {np.dtype(x.dtype).name}")


@lowering(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default, padding=BATCH_ONLY)
def _adaptive_avg_pool(self, output_size):
    if self.size == 0:  # CPU returns an empty input's empty result before its dtype dispatch (bool, complex)
        # ... where the empty dims are ones its kernel allows: the spatial dims never, and in 3-d every dim
        # but the batch (torch's meta kernel checks neither: this refusal lets CPU's call name the error)
        checked = range(self.ndim - 2, self.ndim) if len(output_size) == 2 else range(1, self.ndim)
        if any(self.shape[i] == 0 for i in checked):
            raise ValueError(f"adaptive_avg_pool{len(output_size)}d: an empty non-batch dimension {self.shape}")
        return jnp.zeros(self.shape[:self.ndim - len(output_size)] + tuple(output_size), self.dtype)
    _check_adaptive_dtype(self)
    return _adaptive_avg(self, tuple(output_size))


def _adaptive_avg_backward(grad_output, self, nd):
    """As CPU: each output's gradient divided by its window's extent along each axis in turn
    (rounding to the dtype each time), then added into the window's inputs, windows in order,
    each addition rounded to the dtype."""
    lead = self.ndim - nd
    sizes, outs = self.shape[lead:], grad_output.shape[lead:]
    acc = _acc(self.dtype)
    delta = grad_output.astype(self.dtype)
    bounds = [_adaptive_bounds(n, o) for n, o in zip(sizes, outs)]
    for a, (start, end) in enumerate(bounds):
        extent = (end - start).reshape((-1,) + (1,) * (nd - 1 - a))
        delta = (delta.astype(acc) / jnp.asarray(extent, acc)).astype(self.dtype)
    covering = []  # per axis: for the j-th window covering each input index, (window, valid)
    for n, (start, end) in zip(sizes, bounds):
        i = np.arange(n)
        first = np.searchsorted(end, i, side="right")  # the first window whose end lies past i
        count = max(int(((start[None, :] <= i[:, None]) & (i[:, None] < end[None, :])).sum(1).max()), 1)
        steps = []
        for j in range(count):
            o = np.minimum(first + j, len(start) - 1)
            steps.append((o, (first + j < len(start)) & (start[o] <= i) & (i < end[o])))
        covering.append(steps)
    grad = jnp.zeros(self.shape, self.dtype)
    for combo in itertools.product(*covering):
        part, valid = delta, np.ones((1,) * nd, bool)
        for a, (o, ok) in enumerate(combo):
            part = jnp.take(part, jnp.asarray(o, I64), axis=lead + a)
            valid = valid & ok.reshape((-1,) + (1,) * (nd - 1 - a))
        part = jnp.where(jnp.asarray(valid), part, jnp.zeros((), self.dtype))
        grad = (grad.astype(acc) + part.astype(acc)).astype(self.dtype)
    return grad


@lowering(aten._adaptive_avg_pool2d_backward.default, padding=BATCH_ONLY)
def _adaptive_avg_pool2d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 2)


@lowering(aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool3d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 3)


def _adaptive_max(x, output_size):
    """Gather each (variable-size) window padded to the largest one, masked to -inf."""
    nd = len(output_size)
    lead = x.ndim - nd
    sizes = x.shape[lead:]
    flat = np.arange(math.prod(sizes)).reshape(sizes)
    mask = np.ones(sizes, bool)
    vals = x
    for a, o in enumerate(output_size):
        n = sizes[a]
        start, end = _adaptive_bounds(n, o)
        kmax = int((end - start).max())
        idx = start[:, None] + np.arange(kmax)[None, :]
        ok = idx < end[:, None]
        idx = np.minimum(idx, n - 1)
        vals = jnp.take(vals, jnp.asarray(idx, I64), axis=lead + 2 * a)
        flat = np.take(flat, idx, axis=2 * a)
        mask = np.take(mask, idx, axis=2 * a) & np.expand_dims(ok, tuple(range(2 * a)) + tuple(
            range(2 * a + 2, 2 * a + 2 + (nd - a - 1))))
    # (O1, K1, O2, K2, ...) -> (O1, O2, ..., K1, K2, ...) flattened windows
    perm = [2 * a for a in range(nd)] + [2 * a + 1 for a in range(nd)]
    flat = flat.transpose(perm).reshape(tuple(output_size) + (-1,))
    mask = mask.transpose(perm).reshape(tuple(output_size) + (-1,))
    vals = jnp.transpose(vals, tuple(range(lead)) + tuple(lead + q for q in perm))
    # the window size spelled out: -1 is undefined for a zero-size batch (a ZeroDivisionError)
    vals = vals.reshape(vals.shape[:lead] + tuple(output_size) + (flat.shape[-1],))
    vals = jnp.where(jnp.asarray(mask), vals, _lowest(x.dtype))
    arg = jnp.argmax(vals, axis=-1)
    val = jnp.take_along_axis(vals, arg[..., None], axis=-1)[..., 0]
    idx = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(flat, I64), vals.shape), arg[..., None], axis=-1)[..., 0]
    return val, idx


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(self, output_size):
    _check_adaptive_dtype(self)
    if 0 in output_size:  # no windows: an empty result, as CPU's
        shape = self.shape[:self.ndim - len(output_size)] + tuple(output_size)
        return jnp.zeros(shape, self.dtype), jnp.zeros(shape, I64)
    return _adaptive_max(self, tuple(output_size))


@lowering(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _max_unpool_grad(grad_output, indices, self, 2)


@lowering(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _max_unpool_grad(grad_output, indices, self, 3)


# Fractional max pooling: windows of a fixed size whose starts come from one random sample
# per (batch, channel, spatial dim) in [0, 1), given as the tensor `random_samples`; the
# op is deterministic in it. The starts follow CPU's generate_intervals, computed in the
# samples' dtype (float16/bfloat16 round after every operation, as c10::Half does).
_ROUNDING_BITS = {np.dtype(np.float16): (5, 10), np.dtype(jnp.bfloat16): (8, 7)}


def _fractional_starts(sample, n_in, n_out, pool):
    """Window starts (int64, a trailing axis of n_out) from samples in their own dtype."""
    dtype = np.dtype(sample.dtype)
    bits = _ROUNDING_BITS.get(dtype)
    u = sample.astype(F32) if bits else sample

    def rounded(v):
        return lax.reduce_precision(v, *bits) if bits else v

    starts = jnp.full(sample.shape + (n_out,), n_in - pool, I64)  # the last window ends at the input's end
    if n_out > 1:
        # every integer is converted to the dtype first (bfloat16 rounds those above 256)
        alpha = rounded(rounded(jnp.asarray(n_in - pool, u.dtype)) / rounded(jnp.asarray(n_out - 1, u.dtype)))
        i = rounded(jnp.arange(n_out - 1, dtype=u.dtype))
        ends = rounded(rounded(i + u[..., None]) * alpha)
        first = rounded(u * alpha)[..., None]
        starts = starts.at[..., : n_out - 1].set(
            jnp.trunc(ends).astype(jnp.int32).astype(I64) - jnp.trunc(first).astype(jnp.int32).astype(I64))
    return starts


def _fractional_max_pool(name, x, kernel_size, output_size, random_samples, nd):
    if x.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}(): Expected {nd + 1}D or {nd + 2}D tensor, but got: {list(x.shape)}")
    batched = x.ndim == nd + 2
    x = x if batched else x[None]
    sizes = x.shape[2:]
    if random_samples.ndim != 3 or random_samples.shape[2] != nd:
        raise RuntimeError(f"Expect _random_samples.size(2) equals to {nd}; got {random_samples.shape[-1]}.")
    if random_samples.shape[1] != x.shape[1]:
        raise RuntimeError("Expect _random_samples.size(1) equals to input channel size.")
    if random_samples.shape[0] < x.shape[0]:  # the gather below would return fewer samples' windows
        raise RuntimeError("Expect _random_samples.size(0) no less then input batch size.")
    random_samples = random_samples[: x.shape[0]]  # CPU uses the first batch's worth: more would broadcast
    dims = ("time", "height", "width")[3 - nd:]
    for d, n, k, o in zip(dims, sizes, kernel_size, output_size):
        # CPU's checks: the 2d windows may end at the input's end, the 3d ones must not
        if (o + k - 1 > n) if nd == 2 else (o + k - 1 >= n):
            where = name if nd == 2 else f"{name}_out"
            raise RuntimeError(f"{where}(): pool {d} {k} too large relative to input {d} {n}")
    # the samples' last axis: (w, h) for 2d, (t, h, w) for 3d
    order = (1, 0) if nd == 2 else (0, 1, 2)
    starts = [_fractional_starts(random_samples[..., order[a]], sizes[a], output_size[a], kernel_size[a])
              for a in range(nd)]
    strides = [math.prod(sizes[a + 1:]) for a in range(nd)]

    def position(offsets):  # flat index into the spatial axes, per output element
        flat = 0
        for a, off in enumerate(offsets):
            shape = [1] * nd
            shape[a] = output_size[a]
            flat = flat + (starts[a] + off).reshape(starts[a].shape[:2] + tuple(shape)) * strides[a]
        return flat

    planes = x.reshape(x.shape[:2] + (math.prod(sizes),))  # not -1: the batch may be empty
    best = jnp.full(x.shape[:2] + tuple(output_size), -jnp.inf, x.dtype)
    where = position((0,) * nd)
    for offsets in itertools.product(*(range(k) for k in kernel_size)):  # CPU's loop order
        at = position(offsets)
        value = jnp.take_along_axis(planes, at.reshape(at.shape[:2] + (math.prod(output_size),)), axis=2)
        value = value.reshape(at.shape)
        better = (value > best) | jnp.isnan(value)  # a later NaN replaces an earlier one
        best, where = jnp.where(better, value, best), jnp.where(better, at, where)
    return (best, where) if batched else (best[0], where[0])


@lowering(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool("fractional_max_pool2d", self, tuple(kernel_size), tuple(output_size),
                                random_samples, 2)


@lowering(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool("fractional_max_pool3d", self, tuple(kernel_size), tuple(output_size),
                                random_samples, 3)


@lowering(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _max_unpool_grad(grad_output, indices, self, 2)


@lowering(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _max_unpool_grad(grad_output, indices, self, 3)


# ------------------------------------------------------------------------- dropout


@lowering(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    _, dtype = promote(grad_output, float(scale))  # integer and bool gradients give floats, as on CPU
    return (grad_output.astype(_acc(dtype)) * mask.astype(_acc(dtype)) * scale).astype(dtype)


# -------------------------------------------------------------- more loss functions


@lowering(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=1):
    x, t = _up(self), _up(target)
    # torch clamps each log at -100 so that 0 * log(0) stays finite
    loss = -(t * jnp.maximum(jnp.log(x), -100.0) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * _up(weight)
    return _reduce(loss, reduction).astype(self.dtype)


@lowering(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=1):
    x, t = _up(self), _up(target)
    g = _reduce_grad(_up(grad_output), x.shape, reduction)
    grad = g * (x - t) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        grad = grad * _up(weight)
    return grad.astype(self.dtype)


@lowering(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=1):
    x, t = _up(self), _up(target)
    softplus_neg = jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(-x, 0)  # -log(sigmoid(x))
    if pos_weight is not None:
        loss = (1 - t) * x + ((_up(pos_weight) - 1) * t + 1) * softplus_neg
    else:
        loss = (1 - t) * x + softplus_neg
    if weight is not None:
        loss = loss * _up(weight)
    # CPU's composite computes in place into `1 - target`: the loss has target's dtype (float64
    # target, float32 logits: float64; float16 target: float16)
    return _reduce(loss, reduction).astype(target.dtype)


def _smooth_l1(d, beta):
    ad = jnp.abs(d)
    if beta == 0:
        return ad
    return jnp.where(ad < beta, 0.5 * d * d / beta, ad - 0.5 * beta)


@lowering(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=1, beta=1.0):
    compute, out = promote(self, target)
    d = _up(self.astype(compute)) - _up(target.astype(compute))
    return _reduce(_smooth_l1(d, beta), reduction).astype(out)


@lowering(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    compute, out = promote(grad_output, self, target)
    d = _up(self.astype(compute)) - _up(target.astype(compute))
    shape = jnp.broadcast_shapes(grad_output.shape, self.shape, target.shape)
    g = _reduce_grad(_up(grad_output.astype(compute)), shape, reduction)
    if beta == 0:
        dd = jnp.sign(d)
    else:
        dd = jnp.where(d < -beta, -1.0, jnp.where(d > beta, 1.0, d / beta))
    return (g * dd).astype(out)


@lowering(aten.huber_loss.default)
def huber_loss(self, target, reduction=1, delta=1.0):
    d = _up(self) - _up(target)
    ad = jnp.abs(d)
    loss = jnp.where(ad < delta, 0.5 * d * d, delta * (ad - 0.5 * delta))
    return _reduce(loss, reduction).astype(self.dtype)


@lowering(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    d = _up(self) - _up(target)
    shape = jnp.broadcast_shapes(grad_output.shape, self.shape, target.shape)
    g = _reduce_grad(_up(grad_output), shape, reduction)
    dd = jnp.where(d < -delta, -delta, jnp.where(d > delta, delta, d))
    return (g * dd).astype(self.dtype)


@lowering(aten.soft_margin_loss.default)
def soft_margin_loss(self, target, reduction=1):
    if not jnp.issubdtype(self.dtype, jnp.inexact):  # CPU computes in self's dtype (neg_out, then exp_): an
        raise TypeError(f"soft_margin_loss of {self.dtype}")  # integer self refuses the cast; CPU's call names it
    x, t = _up(self), _up(target)
    return _reduce(jnp.log1p(jnp.exp(-x * t)), reduction).astype(self.dtype)  # CPU's order: a bool target works


@lowering(aten.soft_margin_loss_backward.default)
def soft_margin_loss_backward(grad_output, self, target, reduction):
    x, t = _up(self), _up(target)
    g = _reduce_grad(_up(grad_output), jnp.broadcast_shapes(x.shape, t.shape), reduction)
    z = jnp.exp(-t * x)
    return (g * -t * z / (1 + z)).astype(self.dtype)


def _multi_margin_terms(self, target, p, margin, weight):
    """Per-sample, per-class hinge terms z_ij = max(0, margin - x_iy + x_ij), j != y."""
    require_dtype(target, *_LONG_TARGET)
    x = _up(self)
    x2 = x if x.ndim == 2 else x.reshape(1, -1)
    t = target.reshape(-1).astype(I64)
    C = x2.shape[1]
    xy = jnp.take_along_axis(x2, t[:, None], axis=1)
    not_y = lax.broadcasted_iota(I64, x2.shape, 1) != t[:, None]
    z = jnp.where(not_y, jnp.maximum(cast(margin, x.dtype) - xy + x2, 0), jnp.zeros((), x.dtype))
    w = _up(jnp.take(weight, t))[:, None] if weight is not None else None
    return x2, t, C, z, not_y, w


@lowering(aten.multi_margin_loss.default)
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=1):
    x2, t, C, z, _, w = _multi_margin_terms(self, target, p, margin, weight)
    zp = jnp.where(cast(p, x2.dtype) == 1, z, z * z)
    if w is not None:
        zp = zp * w
    loss = jnp.sum(zp, axis=1) / C
    if self.ndim < 2 and reduction == 0:
        loss = loss.reshape(target.shape)
    return _reduce(loss, reduction).astype(self.dtype)


@lowering(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=1):
    x2, t, C, z, not_y, w = _multi_margin_terms(self, target, p, margin, weight)
    dz = jnp.where(cast(p, x2.dtype) == 1, (z > 0).astype(x2.dtype), 2 * z) / C
    if w is not None:
        dz = dz * w
    g = _up(grad_output)
    g = _reduce_grad(g.reshape(-1) if g.ndim else g, (x2.shape[0],), reduction)[:, None]
    dz = dz * g
    grad = dz - jnp.where(not_y, jnp.zeros((), x2.dtype), jnp.sum(dz, axis=1, keepdims=True))
    return grad.reshape(self.shape).astype(self.dtype)


def _multilabel_terms(self, target):
    require_dtype(target, *_LONG_TARGET)
    x = _up(self)
    x2 = x if x.ndim == 2 else x.reshape(1, -1)
    t = target.reshape(x2.shape).astype(I64)
    valid = jnp.cumprod(t >= 0, axis=1).astype(bool)  # targets up to the first -1
    safe = jnp.where(valid, t, 0)
    onehot = (safe[:, :, None] == lax.broadcasted_iota(I64, x2.shape, 1)[:, None, :]) & valid[:, :, None]
    is_target = jnp.any(onehot, axis=1)
    xj = jnp.take_along_axis(x2, safe, axis=1)
    # hinge[n, k, i] for target k against non-target class i
    hinge = jnp.maximum(1 - xj[:, :, None] + x2[:, None, :], 0)
    live = valid[:, :, None] & ~is_target[:, None, :]
    hinge = jnp.where(live, hinge, jnp.zeros((), x.dtype))
    return x2, safe, valid, is_target, hinge, live


@lowering(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self, target, reduction):
    x2, _, _, is_target, hinge, _ = _multilabel_terms(self, target)
    loss = jnp.sum(hinge, axis=(1, 2)) / x2.shape[1]
    if self.ndim < 2:
        loss = loss.reshape(())
    return _reduce(loss, reduction).astype(self.dtype), is_target.reshape(self.shape).astype(self.dtype)


@lowering(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    x2, safe, valid, _, hinge, live = _multilabel_terms(self, target)
    C = x2.shape[1]
    active = ((hinge > 0) & live).astype(x2.dtype) / C
    grad = jnp.sum(active, axis=1)  # + for each non-target class i
    per_target = -jnp.sum(active, axis=2)  # - for each target k
    grad = grad + jnp.sum(
        jnp.where(safe[:, :, None] == lax.broadcasted_iota(I64, x2.shape, 1)[:, None, :],
                  per_target[:, :, None], jnp.zeros((), x2.dtype)), axis=1)
    g = _up(grad_output)
    g = _reduce_grad(g.reshape(-1) if g.ndim else g, (x2.shape[0],), reduction)[:, None]
    return (grad * g).reshape(self.shape).astype(self.dtype)


# ---------------------------------------------------------------- recurrent cells
# torch calls these fused cells for LSTM/GRU on non-CPU devices. The workspace layout is
# ours (torch only hands it from forward to backward): LSTM [i, f, g, o] activated gates,
# GRU [r, z, n, hx, hn] as in torch's CUDA kernels.


@lowering(aten._thnn_fused_lstm_cell.default)
def _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _up(input_gates) + _up(hidden_gates)
    if input_bias is not None:
        gates = gates + _up(input_bias)
    if hidden_bias is not None:
        gates = gates + _up(hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * _up(cx) + i * g
    hy = o * jnp.tanh(cy)
    dt = input_gates.dtype
    return hy.astype(dt), cy.astype(dt), jnp.concatenate([i, f, g, o], axis=1).astype(dt)


def _lstm_cell_grads(grad_hy, grad_cy, cx, cy, workspace):
    i, f, g, o = jnp.split(_up(workspace), 4, axis=1)
    cy = _up(cy)
    zero = jnp.zeros(cy.shape, cy.dtype)
    ghy = _up(grad_hy) if grad_hy is not None else zero
    gcy = _up(grad_cy) if grad_cy is not None else zero
    tanh_cy = jnp.tanh(cy)
    gc = gcy + ghy * o * (1 - tanh_cy * tanh_cy)
    grad_gates = jnp.concatenate([
        gc * g * i * (1 - i),
        gc * _up(cx) * f * (1 - f),
        gc * i * (1 - g * g),
        ghy * tanh_cy * o * (1 - o),
    ], axis=1)
    return grad_gates, gc * f


@lowering(aten._thnn_fused_lstm_cell_backward_impl.default)
def _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    grad_gates, grad_cx = _lstm_cell_grads(grad_hy, grad_cy, cx, cy, workspace)
    dt = workspace.dtype
    grad_bias = jnp.sum(grad_gates, axis=0).astype(dt) if has_bias else None
    return grad_gates.astype(dt), grad_cx.astype(dt), grad_bias


@lowering(aten._thnn_fused_lstm_cell_backward.default)
def _thnn_fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    grad_gates, grad_cx, grad_bias = _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias)
    return grad_gates, grad_gates, grad_cx, grad_bias, grad_bias


@lowering(aten._thnn_fused_gru_cell.default)
def _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ig, hg = _up(input_gates), _up(hidden_gates)
    if input_bias is not None:
        ig = ig + _up(input_bias)
    if hidden_bias is not None:
        hg = hg + _up(hidden_bias)
    ir, iz, in_ = jnp.split(ig, 3, axis=1)
    hr, hz, hn = jnp.split(hg, 3, axis=1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    h = _up(hx)
    hy = n + z * (h - n)
    dt = input_gates.dtype
    return hy.astype(dt), jnp.concatenate([r, z, n, h, hn], axis=1).astype(dt)


@lowering(aten._thnn_fused_gru_cell_backward.default)
def _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, h, hn = jnp.split(_up(workspace), 5, axis=1)
    go = _up(grad_hy)
    dn = go * (1 - z) * (1 - n * n)
    dz = go * (h - n) * z * (1 - z)
    dr = dn * hn * r * (1 - r)
    dt = grad_hy.dtype
    grad_input_gates = jnp.concatenate([dr, dz, dn], axis=1)
    grad_hidden_gates = jnp.concatenate([dr, dz, dn * r], axis=1)
    grad_hx = go * z
    gib = jnp.sum(grad_input_gates, axis=0).astype(dt) if has_bias else None
    ghb = jnp.sum(grad_hidden_gates, axis=0).astype(dt) if has_bias else None
    return grad_input_gates.astype(dt), grad_hidden_gates.astype(dt), grad_hx.astype(dt), gib, ghb


# ---------------------------------------------------------------------- upsampling
# Each spatial axis is resampled by a static (out, in) matrix built with torch's index
# rules (UpSample.h); the backward ops are the forward's vjp (the transposed matrices).


def _scale_value(scale, n_in, n_out, ftype):
    """torch's compute_scales_value: 1/scale when given, else in/out."""
    if scale is not None and scale > 0:
        return ftype(1.0 / scale)
    return ftype(n_in) / ftype(n_out)


def _nearest_matrix(n_in, n_out, scale, exact):
    f32 = np.float32
    s = _scale_value(scale, n_in, n_out, f32)
    dst = np.arange(n_out).astype(f32)
    src = np.floor((dst + f32(0.5)) * s if exact else dst * s).astype(np.int64)
    src = np.minimum(src, n_in - 1)
    if n_out == n_in:
        src = np.arange(n_out)
    return np.eye(n_in)[src]


def _linear_matrix(n_in, n_out, align_corners, scale, ftype):
    if align_corners:
        s = ftype(n_in - 1) / ftype(n_out - 1) if n_out > 1 else ftype(0)
    else:
        s = _scale_value(scale, n_in, n_out, ftype)
    dst = np.arange(n_out).astype(ftype)
    src = s * dst if align_corners else np.maximum(s * (dst + ftype(0.5)) - ftype(0.5), ftype(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam1 = np.clip(src - i0, 0, 1)
    i1 = i0 + (i0 < n_in - 1)
    m = np.zeros((n_out, n_in), np.float64)
    np.add.at(m, (np.arange(n_out), i0), 1 - lam1)
    np.add.at(m, (np.arange(n_out), i1), lam1)
    return m


def _cubic_matrix(n_in, n_out, align_corners, scale, ftype):
    A = -0.75
    if align_corners:
        s = ftype(n_in - 1) / ftype(n_out - 1) if n_out > 1 else ftype(0)
    else:
        s = _scale_value(scale, n_in, n_out, ftype)
    dst = np.arange(n_out).astype(ftype)
    src = s * dst if align_corners else s * (dst + ftype(0.5)) - ftype(0.5)
    i = np.floor(src).astype(np.int64)
    t = (src - i).astype(np.float64)

    def conv1(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def conv2(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    coeffs = [conv2(t + 1), conv1(t), conv1(1 - t), conv2(2 - t)]
    m = np.zeros((n_out, n_in), np.float64)
    for k, c in enumerate(coeffs):
        np.add.at(m, (np.arange(n_out), np.clip(i - 1 + k, 0, n_in - 1)), c)
    return m


def _resample(x, matrices):
    """Apply one (out, in) matrix per trailing spatial axis.

    Integer images (uint8) resample like CPU's separable uint8 kernel: the last axis first,
    each pass rounded and clamped to the dtype's range. CPU's fixed-point weights can still
    make a value differ by 1."""
    nd = len(matrices)
    lead = x.ndim - nd
    integer = jnp.issubdtype(x.dtype, jnp.integer)
    acc = F32 if integer else _acc(x.dtype)
    y = x.astype(acc)
    for a in reversed(range(nd)) if integer else range(nd):
        y = jnp.moveaxis(jnp.tensordot(y, jnp.asarray(matrices[a].T, acc), axes=([lead + a], [0]),
                                       precision=lax.Precision.HIGHEST), -1, lead + a)
        if integer:
            info = jnp.iinfo(x.dtype)
            y = jnp.clip(jnp.floor(y + 0.5), info.min, info.max)
    return y.astype(x.dtype)


def _index_ftype(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _upsample_matrices(kind, in_sizes, out_sizes, scales, align_corners, dtype):
    ft = _index_ftype(dtype)
    if kind in ("nearest", "nearest_exact"):
        return [_nearest_matrix(i, o, s, kind == "nearest_exact") for i, o, s in zip(in_sizes, out_sizes, scales)]
    build = _linear_matrix if kind == "linear" else _cubic_matrix
    return [build(i, o, align_corners, s, ft) for i, o, s in zip(in_sizes, out_sizes, scales)]


def _upsample_nearest_gather(x, out_sizes, scales, exact):
    """Nearest modes copy values: a gather per axis, exact for every dtype."""
    nd = len(out_sizes)
    lead = x.ndim - nd
    for a, (o, s) in enumerate(zip(out_sizes, scales)):
        idx = np.argmax(_nearest_matrix(x.shape[lead + a], o, s, exact), axis=1)
        x = jnp.take(x, jnp.asarray(idx, I64), axis=lead + a)
    return x


def _register_upsample(op, bwd, kind, nd):
    has_ac = kind in ("linear", "cubic")

    def split(rest):
        align = rest[0] if has_ac else None
        scales = list(rest[1:] if has_ac else rest) + [None] * nd
        return align, scales[:nd]

    def forward(self, output_size, *rest):
        align, scales = split(rest)
        if kind in ("nearest", "nearest_exact"):
            return _upsample_nearest_gather(self, tuple(output_size), scales, kind == "nearest_exact")
        mats = _upsample_matrices(kind, self.shape[-nd:], output_size, scales, align, self.dtype)
        return _resample(self, mats)

    def backward(grad_output, output_size, input_size, *rest):
        align, scales = split(rest)
        mats = _upsample_matrices(kind, tuple(input_size)[-nd:], output_size, scales, align, grad_output.dtype)
        zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
        _, vjp = jax.vjp(lambda x: _resample(x, mats), zeros)
        return vjp(grad_output)[0]

    forward.__name__ = op.__name__
    backward.__name__ = bwd.__name__
    lowering(op.default)(forward)
    lowering(bwd.default)(backward)


for _nd, _name in ((1, "1d"), (2, "2d"), (3, "3d")):
    _register_upsample(getattr(aten, f"upsample_nearest{_name}"), getattr(aten, f"upsample_nearest{_name}_backward"),
                       "nearest", _nd)
    _register_upsample(getattr(aten, f"_upsample_nearest_exact{_name}"),
                       getattr(aten, f"_upsample_nearest_exact{_name}_backward"), "nearest_exact", _nd)
_register_upsample(aten.upsample_linear1d, aten.upsample_linear1d_backward, "linear", 1)
_register_upsample(aten.upsample_bilinear2d, aten.upsample_bilinear2d_backward, "linear", 2)
_register_upsample(aten.upsample_trilinear3d, aten.upsample_trilinear3d_backward, "linear", 3)
_register_upsample(aten.upsample_bicubic2d, aten.upsample_bicubic2d_backward, "cubic", 2)


# Antialiased resize (F.interpolate(..., antialias=True)): CPU's separable kernel with
# Pillow's filters, widened by the scale when downsampling. Each axis is one (out, in)
# weight matrix computed as CPU computes it (UpSampleKernel.cpp,
# _compute_indices_min_size_weights_aa: float32 or float64 arithmetic, the same truncations
# of the window bounds); the forward resamples only the axes whose size changes, width
# first. uint8 images use CPU's fixed-point path: int16 weights at the largest precision
# the axis allows, integer sums rounded by half an LSB, shifted and clamped after each pass.
# Known difference: CPU's float kernel gives every output row the first row's value when the
# output is one column wide and the height changes (its vertical pass loses the row stride);
# this computes the separable result there, as CPU's uint8 path and its two passes run
# separately do.


def _aa_linear_filter(x):
    x = np.abs(x)
    return np.where(x < 1.0, (1.0 - x).astype(x.dtype), np.zeros_like(x))


def _fma(a, b, c):
    """a * b + c rounded once, in a's dtype: the fused multiply-add the compiler contracts
    CPU's filter polynomials into (x86-64 AVX2 and aarch64 builds of torch)."""
    if a.dtype == np.float32:  # the float32 product is exact in float64
        return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)
    flat = [float(fractions.Fraction(float(p)) * fractions.Fraction(float(q)) + fractions.Fraction(float(r)))
            for p, q, r in zip(a.ravel(), b.ravel(), c.ravel())]
    return np.asarray(flat, np.float64).reshape(a.shape)


def _aa_cubic_filter(x):
    # Keys' cubic with a = -0.5 (Pillow's); torch's non-antialiased bicubic uses -0.75
    a = x.dtype.type(-0.5)
    x = np.abs(x)
    full = lambda v: np.full_like(x, v)  # noqa: E731
    near = _fma(_fma(full(a + 2), x, full(-(a + 3))) * x, x, full(1))  # ((a + 2) x - (a + 3)) x x + 1
    far = _fma(_fma(_fma(full(a), x, full(-5 * a)), x, full(8 * a)), x, full(-4 * a))  # ((a x - 5a) x + 8a) x - 4a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, np.zeros_like(x)))


@functools.lru_cache(maxsize=256)
def _aa_matrix(kind, n_in, n_out, align_corners, scale, ftype):
    """(out, in) antialiased weights of one axis, in ftype's arithmetic (a float64 array)."""
    f = np.dtype(ftype).type
    interp_size, filt = (2, _aa_linear_filter) if kind == "linear" else (4, _aa_cubic_filter)
    if align_corners:
        s = f(n_in - 1) / f(n_out - 1) if n_out > 1 else f(0)
    else:
        s = _scale_value(scale, n_in, n_out, f)
    support = f(interp_size * 0.5 * float(s)) if s >= 1.0 else f(interp_size * 0.5)
    taps = int(math.ceil(support)) * 2 + 1
    invscale = f(1.0 / float(s)) if s >= 1.0 else f(1.0)
    center = (float(s) * (np.arange(n_out) + 0.5)).astype(ftype)
    low = np.trunc((center - support).astype(np.float64) + 0.5).astype(I64)
    high = np.trunc((center + support).astype(np.float64) + 0.5).astype(I64)
    xmin = np.maximum(low, 0)
    xsize = np.clip(np.minimum(high, n_in) - xmin, 0, taps)
    j = np.arange(taps)
    pos = xmin[:, None] + j[None, :]
    arg = (((pos.astype(ftype) - center[:, None]).astype(np.float64) + 0.5) * float(invscale)).astype(ftype)
    w = np.where(j[None, :] < xsize[:, None], filt(arg), f(0)).astype(ftype)
    total = np.zeros(n_out, ftype)
    for k in range(taps):  # summed in order, in ftype
        total = (total + w[:, k]).astype(ftype)
    w = np.where(total[:, None] != 0, (w / np.where(total == 0, f(1), total)[:, None]).astype(ftype), w)
    m = np.zeros((n_out, n_in), np.float64)
    rows = np.broadcast_to(np.arange(n_out)[:, None], pos.shape)
    valid = j[None, :] < xsize[:, None]
    np.add.at(m, (rows[valid], pos[valid]), w[valid].astype(np.float64))
    m.setflags(write=False)  # cached
    return m


def _aa_int16(m):
    """CPU's _compute_index_ranges_int16_weights: (int weights, precision) of one axis."""
    largest = float(m.max()) if m.size else 0.0
    precision = 0
    while precision < 22 and int(0.5 + largest * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    v = m * (1 << precision)
    return np.trunc(np.where(v < 0, v - 0.5, v + 0.5)).astype(np.int32), precision


def _aa_resample_axis(y, m, axis):
    return jnp.moveaxis(jnp.tensordot(y, jnp.asarray(m.T, y.dtype), axes=([axis], [0]),
                                      precision=lax.Precision.HIGHEST), -1, axis)


def _upsample_aa(kind, x, output_size, align_corners, scales):
    name = "_upsample_bilinear2d_aa" if kind == "linear" else "_upsample_bicubic2d_aa"
    dtype = np.dtype(x.dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.uint8)):
        raise NotImplementedError(f'"compute_index_ranges_weights" not implemented for \'{to_torch(dtype)}\'')
    if x.ndim != 4 or min(x.shape[2:]) <= 0 or min(output_size) <= 0:
        raise RuntimeError(f"{name}: Input and output sizes should be greater than 0, but got input (H: "
                           f"{x.shape[-2]}, W: {x.shape[-1]}) output (H: {output_size[0]}, W: {output_size[1]})")
    ftype = np.float64 if dtype == np.float64 else np.float32
    y = x.astype(jnp.int32) if dtype == np.uint8 else x
    for axis in (3, 2):  # width first, then height; an axis that keeps its size is not resampled
        n_in, n_out = x.shape[axis], output_size[axis - 2]
        if n_in == n_out:
            continue
        m = _aa_matrix(kind, n_in, n_out, align_corners, scales[axis - 2], np.float64 if dtype == np.uint8 else ftype)
        if dtype == np.uint8:
            weights, precision = _aa_int16(m)
            y = _aa_resample_axis(y, weights, axis) + (1 << (precision - 1))
            y = jnp.clip(y >> precision, 0, 255)
        else:
            y = _aa_resample_axis(y, m, axis)
    return y.astype(dtype)


def _upsample_aa_backward(kind, grad_output, output_size, input_size, align_corners, scales):
    """CPU's backward spreads each output gradient over every axis's weights (it does not
    skip the axes that keep their size, as the forward does)."""
    dtype = np.dtype(grad_output.dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        name = "upsample_bilinear2d_aa_backward_cpu" if kind == "linear" else "upsample_bicubic2d_aa_backward_cpu"
        raise NotImplementedError(f'"{name}" not implemented for \'{to_torch(dtype)}\'')
    g = grad_output
    for axis in (2, 3):
        m = _aa_matrix(kind, input_size[axis], output_size[axis - 2], align_corners, scales[axis - 2], dtype.type)
        g = jnp.moveaxis(jnp.tensordot(g, jnp.asarray(m, dtype), axes=([axis], [0]),
                                       precision=lax.Precision.HIGHEST), -1, axis)
    return g


@lowering(aten._upsample_bilinear2d_aa.default)
def _upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_aa("linear", self, tuple(output_size), align_corners, (scales_h, scales_w))


@lowering(aten._upsample_bicubic2d_aa.default)
def _upsample_bicubic2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_aa("cubic", self, tuple(output_size), align_corners, (scales_h, scales_w))


@lowering(aten._upsample_bilinear2d_aa_backward.default)
def _upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners, scales_h=None,
                                     scales_w=None):
    return _upsample_aa_backward("linear", grad_output, tuple(output_size), tuple(input_size), align_corners,
                                 (scales_h, scales_w))


@lowering(aten._upsample_bicubic2d_aa_backward.default)
def _upsample_bicubic2d_aa_backward(grad_output, output_size, input_size, align_corners, scales_h=None,
                                    scales_w=None):
    return _upsample_aa_backward("cubic", grad_output, tuple(output_size), tuple(input_size), align_corners,
                                 (scales_h, scales_w))


# -------------------------------------------------------------- im2col / col2im, pixel shuffle


def _im2col(x, kernel_size, dilation, padding, stride):
    unbatched = x.ndim == 3
    if unbatched:
        x = x[None]
    N, C, H, W = x.shape
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel_size, dilation, padding, stride
    oh = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = [lax.slice(xp, (0, 0, i * dh, j * dw), (N, C, i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1),
                      (1, 1, sh, sw)) for i in range(kh) for j in range(kw)]
    out = jnp.stack(cols, axis=2).reshape(N, C * kh * kw, oh * ow)
    return out[0] if unbatched else out


@lowering(aten.im2col.default)
def im2col(self, kernel_size, dilation, padding, stride):
    return _im2col(self, kernel_size, dilation, padding, stride)


@lowering(aten.col2im.default)
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    # col2im is the adjoint of im2col: overlapping patches sum
    unbatched = self.ndim == 2
    x = self[None] if unbatched else self
    C = x.shape[1] // (kernel_size[0] * kernel_size[1])
    zeros = jnp.zeros((x.shape[0], C) + tuple(output_size), self.dtype)
    _, vjp = jax.vjp(lambda z: _im2col(z, kernel_size, dilation, padding, stride), zeros)
    out = vjp(x)[0]
    return out[0] if unbatched else out


@lowering(aten.pixel_shuffle.default)
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = self.shape
    x = self.reshape(tuple(lead) + (c // (r * r), r, r, h, w))
    n = len(lead)
    x = jnp.transpose(x, tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2))
    return x.reshape(tuple(lead) + (c // (r * r), h * r, w * r))


@lowering(aten.pixel_unshuffle.default)
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = self.shape
    n = len(lead)
    x = self.reshape(tuple(lead) + (c, h // r, r, w // r, r))
    x = jnp.transpose(x, tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3))
    return x.reshape(tuple(lead) + (c * r * r, h // r, w // r))


# -------------------------------------------------------------------- distances


def _pairwise_norm(diff, p):
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if math.isinf(p):
        return jnp.max(a, axis=-1)
    return jnp.sum(a ** p, axis=-1) ** (1.0 / p)


@lowering(aten._cdist_forward.default)
def _cdist_forward(x1, x2, p, compute_mode):
    x1u, x2u = _up(x1), _up(x2)
    P, R = x1.shape[-2], x2.shape[-2]
    # torch's choice of the matmul form for p == 2 (compute_mode None/0: when P or R > 25)
    use_mm = p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and (P > 25 or R > 25)))
    if use_mm:
        n1 = jnp.sum(x1u * x1u, axis=-1, keepdims=True)
        n2 = jnp.sum(x2u * x2u, axis=-1, keepdims=True)
        prod = jnp.matmul(x1u, jnp.swapaxes(x2u, -1, -2), precision=lax.Precision.HIGHEST)
        d2 = n1 - 2 * prod + jnp.swapaxes(n2, -1, -2)
        return jnp.sqrt(jnp.maximum(d2, 0)).astype(x1.dtype)
    diff = x1u[..., :, None, :] - x2u[..., None, :, :]
    return _pairwise_norm(diff, p).astype(x1.dtype)


def _cdist_grad(grad, x1, x2, p, dist):
    """d/dx1 of sum(grad * cdist(x1, x2)), written out so that zero distances give 0, not NaN."""
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    g = grad[..., None]
    d = dist[..., None]
    if p == 0:
        return jnp.zeros_like(x1)
    if p == 1:
        term = jnp.sign(diff)
    elif p == 2:
        term = jnp.where(d == 0, 0, diff / jnp.where(d == 0, 1, d))
    elif math.isinf(p):
        term = jnp.sign(diff) * (jnp.abs(diff) == d)
    else:  # a zero difference contributes 0, as CPU's kernel says (for p < 1, |0| ** (p - 1) is inf)
        a = jnp.where(diff == 0, 1, jnp.abs(diff))
        term = jnp.where((d == 0) | (diff == 0), 0, jnp.sign(diff) * a ** (p - 1) / jnp.where(d == 0, 1, d) ** (p - 1))
    return jnp.sum(g * term, axis=-2)


@lowering(aten._cdist_backward.default)
def _cdist_backward(grad, x1, x2, p, cdist):
    return _cdist_grad(_up(grad), _up(x1), _up(x2), p, _up(cdist)).astype(x1.dtype)


def _triu_pairs(n):
    i, j = np.triu_indices(n, k=1)
    return i.astype(np.int64), j.astype(np.int64)


@lowering(aten._pdist_forward.default)
def _pdist_forward(self, p=2.0):
    i, j = _triu_pairs(self.shape[0])
    x = _up(self)
    return _pairwise_norm(x[i] - x[j], p).astype(self.dtype)


@lowering(aten._pdist_backward.default)
def _pdist_backward(grad, self, p, pdist):
    n = self.shape[0]
    i, j = _triu_pairs(n)
    g = jnp.zeros((n, n), _acc(grad.dtype)).at[i, j].set(_up(grad)).at[j, i].set(_up(grad))
    d = jnp.zeros((n, n), _acc(grad.dtype)).at[i, j].set(_up(pdist)).at[j, i].set(_up(pdist))
    x = _up(self)
    return _cdist_grad(g, x, x, p, d).astype(self.dtype)
