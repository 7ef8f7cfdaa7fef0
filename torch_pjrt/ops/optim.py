"""Lowerings: fused optimizer steps (`torch.optim.*(fused=True)`), one executable per step
over every parameter, and GradScaler's two ops. Each returns the new values of the
arguments the op writes, in schema order (registry.py). Learning rates are traced, so a
scheduler never recompiles.

Semantics follow torch's fused CPU kernels: grads are unscaled by `grad_scale` (and the
unscaled grads written back), and a step with `found_inf` set leaves everything as it was.
"""
from __future__ import annotations
import jax.numpy as jnp
import torch

from .registry import family

lowering = family(not_paddable="a fused optimizer step updates parameters, whose shapes are never symbolic")


aten = torch.ops.aten


def _unscale(grads, grad_scale):
    return grads if grad_scale is None else [g / grad_scale.astype(g.dtype) for g in grads]


def _skip_if_inf(found_inf, new, old):
    """Every written list as it was when found_inf is set, else the new values."""
    if found_inf is None:
        return new
    skip = found_inf.reshape(()) != 0
    return tuple([jnp.where(skip, o, n) for n, o in zip(new_list, old_list)] for new_list, old_list in zip(new, old))


def _adam(decoupled, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale, found_inf):
    grads = _unscale(grads, grad_scale)
    params, avgs, sqs, maxes = [], [], [], []
    for i, (p, g, m, v, step) in enumerate(zip(self, grads, exp_avgs, exp_avg_sqs, state_steps)):
        d = -g if maximize else g
        lr_p = jnp.asarray(lr, p.dtype)
        if weight_decay != 0:
            if decoupled:
                p = p * (1 - lr_p * weight_decay)
            else:
                d = d + weight_decay * p
        m = m + (d - m) * (1 - beta1)
        v = v * beta2 + d * d * (1 - beta2)
        step = step.reshape(()).astype(jnp.float64)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = jnp.sqrt(1 - beta2 ** step)
        if amsgrad:
            peak = jnp.maximum(max_exp_avg_sqs[i], v)
            maxes.append(peak)
            denom = jnp.sqrt(peak) / bias_correction2_sqrt.astype(p.dtype) + eps
        else:
            denom = jnp.sqrt(v) / bias_correction2_sqrt.astype(p.dtype) + eps
        step_size = (lr_p / bias_correction1).astype(p.dtype)
        params.append(p - step_size * m / denom)
        avgs.append(m)
        sqs.append(v)
    new = (params, grads, avgs, sqs, maxes if amsgrad else list(max_exp_avg_sqs))
    old = (self, list(grads), exp_avgs, exp_avg_sqs, max_exp_avg_sqs)
    return _skip_if_inf(found_inf, new, old)


@lowering(aten._fused_adam_.default, aten._fused_adam_.tensor_lr, traced=("lr",))
def _fused_adam_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    return _adam(False, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


@lowering(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr, traced=("lr",))
def _fused_adamw_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                  weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    return _adam(True, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


@lowering(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr, traced=("lr",))
def _fused_sgd_(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
                is_first_step, grad_scale=None, found_inf=None):
    grads = _unscale(grads, grad_scale)
    params, buffers = [], []
    for i, (p, g) in enumerate(zip(self, grads)):
        d = -g if maximize else g
        if weight_decay != 0:
            d = d + weight_decay * p
        if momentum != 0:
            buf = d if is_first_step else momentum_buffer_list[i] * momentum + d * (1 - dampening)
            buffers.append(buf)
            d = d + momentum * buf if nesterov else buf
        params.append(p - jnp.asarray(lr, p.dtype) * d)
    new = (params, grads, buffers if momentum != 0 else list(momentum_buffer_list))
    return _skip_if_inf(found_inf, new, (self, list(grads), momentum_buffer_list))


@lowering(aten._fused_adagrad_.default, traced=("lr",))
def _fused_adagrad_(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                    grad_scale=None, found_inf=None):
    grads = _unscale(grads, grad_scale)
    params, sums = [], []
    for p, g, s, step in zip(self, grads, state_sums, state_steps):
        d = -g if maximize else g
        if weight_decay != 0:
            d = d + weight_decay * p
        clr = jnp.asarray(lr, jnp.float64) / (1 + (step.reshape(()).astype(jnp.float64) - 1) * lr_decay)
        s = s + d * d
        params.append(p - clr.astype(p.dtype) * d / (jnp.sqrt(s) + eps))
        sums.append(s)
    new = (params, grads, sums, list(state_steps))
    return _skip_if_inf(found_inf, new, (self, list(grads), state_sums, state_steps))


@lowering(aten._fused_adagrad_.tensor_lr, traced=("lr",))
def _fused_adagrad_tensor_lr(self, grads, state_sums, state_steps, **kwargs):
    """The same step with a tensor lr; its state_steps are read only (the schema writes three lists)."""
    return _fused_adagrad_(self, grads, state_sums, state_steps, **kwargs)[:3]


# ------------------------------------------------------------------------- GradScaler
@lowering(aten._amp_foreach_non_finite_check_and_unscale_.default)
def _amp_foreach_non_finite_check_and_unscale_(self, found_inf, inv_scale):
    """GradScaler.unscale_: every grad times `inv_scale` (in float32, or float64 for double
    grads, as torch's kernels compute); `found_inf` becomes 1 when any grad holds inf or NaN."""
    unscaled, bad = [], jnp.zeros((), jnp.bool_)
    for g in self:
        compute = jnp.float64 if g.dtype == jnp.float64 else jnp.float32
        bad = bad | ~jnp.all(jnp.isfinite(g))
        unscaled.append((g.astype(compute) * inv_scale.reshape(()).astype(compute)).astype(g.dtype))
    return unscaled, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lowering(aten._amp_update_scale_.default)
def _amp_update_scale_(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    """GradScaler.update: back off after an overflow, grow after `growth_interval` clean
    steps (unless the grown scale would be infinite). Returns (scale, growth_tracker)."""
    scale = self.astype(jnp.float64)  # the factors are doubles: multiply in double, store float
    inf = found_inf.reshape(self.shape) != 0
    grown = growth_tracker + 1
    grow = ~inf & (grown == growth_interval)
    bigger = (scale * scale_growth_factor).astype(self.dtype)
    new_scale = jnp.where(inf, (scale * scale_backoff_factor).astype(self.dtype),
                          jnp.where(grow & jnp.isfinite(bigger), bigger, self))
    new_tracker = jnp.where(inf | grow, jnp.zeros_like(growth_tracker), grown.astype(growth_tracker.dtype))
    return new_scale, new_tracker
