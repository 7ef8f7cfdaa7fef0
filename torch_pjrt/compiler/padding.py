"""Padded execution of a graph with symbolic sizes: one executable per bucket, exact results.

Every dynamic dimension is rounded up to its bucket and the graph runs on zero-padded inputs.
Inside the trace every tensor carries a *layout*: per dimension either None (a static dim,
every element real) or a `Dim`, the tuple of factors the dim was flattened from, each factor a
sympy size expression (padded: real extent = the expression at the real sizes, padded extent
= the expression at the bucket sizes) or a Python int (a static factor). Element (i, j) of a
dim flattened from factors (s0, s1) sits at i * bucket(s1) + j, so the real elements are
those whose every factor index is below that factor's real extent. A `Wild` dim holds the same
valid value everywhere (an expand of a size-1 dim) and adopts its partner's layout.

Padded elements hold junk (anything, NaN included). Each op has a rule saying how junk moves:
elementwise ops and views keep it in padded positions; reductions, contractions and losses
over a padded dim replace it by the op's identity (`jnp.where`, so NaN junk cannot leak) and
divide by real counts; sizes used as values get the real size (a traced input), sizes used
as shapes the bucket. An op without a rule, or one whose rule cannot be exact (a random op,
a slice starting from the end of a padded dim, a reshape splitting a padded factor, ...)
raises `NotPaddable`, and the graph falls back to one executable per exact size.
"""
from __future__ import annotations

import functools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
import sympy
import torch
from torch.fx.node import map_aggregate

from ..eager.graph import find_lowering
from ..ops.call import OpCall

aten = torch.ops.aten


class NotPaddable(Exception):
    """The graph cannot run padded with results equal to the unpadded computation."""


# ------------------------------------------------------------------------------- sizes
def sym_expr(s):
    """The sympy expression of a (possibly symbolic) size, or None when it is a plain number."""
    if isinstance(s, torch.SymInt):
        e = s.node.expr
        return None if e.is_number else e
    return None


def host_eval(expr, env: dict) -> int:
    if isinstance(expr, int):
        return expr
    return int(expr.xreplace({s: sympy.Integer(v) for s, v in env.items() if s in expr.free_symbols}))


def trace_eval(expr, env: dict, weak: bool = False):
    """`expr` as a traced int64 (or float64) scalar, from traced symbol values in `env`. weak:
    from weakly typed symbol values, keeping the result weakly typed (the constants Python
    numbers), so it promotes as the Python number torch sees."""
    if isinstance(expr, int) or expr.is_Integer:
        return int(expr) if weak else jnp.asarray(int(expr), jnp.int64)
    if expr.is_number:
        return float(expr) if weak else jnp.asarray(float(expr), jnp.float64)
    if expr.is_Symbol:
        return env[expr]
    args = [trace_eval(a, env, weak) for a in expr.args]
    name = type(expr).__name__
    if expr.is_Add:
        return functools.reduce(operator.add, args)
    if expr.is_Mul:
        return functools.reduce(operator.mul, args)
    if expr.is_Pow and expr.args[1].is_Integer and int(expr.args[1]) >= 0:
        return args[0] ** int(expr.args[1])
    if name in ("FloorDiv", "CleanDiv"):
        return jnp.floor_divide(args[0], args[1])
    if name in ("PythonMod", "Mod"):
        return jnp.mod(args[0], args[1])
    if name == "ToFloat":
        return args[0] * 1.0 if weak else args[0].astype(jnp.float64)  # weak int * Python float: weak float64
    if name in ("FloatTrueDiv", "IntTrueDiv"):
        return jnp.true_divide(args[0], args[1])
    if name == "Max":
        return functools.reduce(jnp.maximum, args)
    if name == "Min":
        return functools.reduce(jnp.minimum, args)
    raise NotPaddable(f"size expression {expr} ({name}) has no traced form")


class Size:
    """A symbolic size inside a padded trace: its bucket value is static, its real value traced."""

    __slots__ = ("expr", "_ctx")

    def __init__(self, expr, ctx):
        self.expr, self._ctx = expr, ctx

    @property
    def bucket(self):
        return host_eval(self.expr, self._ctx.buckets)

    def real(self):
        return self._ctx.real(self.expr)

    def weak_real(self):
        return self._ctx.weak_real(self.expr)


# ------------------------------------------------------------------------------- layouts
class Dim(tuple):
    """A padded dim: the factors it was flattened from (sympy expressions or static ints)."""


class Wild:
    """Every element is the same valid value (expand of a size-1 dim); real extent `expr`."""

    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr

    def __eq__(self, other):
        return isinstance(other, Wild) and other.expr == self.expr

    def __hash__(self):
        return hash(("wild", self.expr))


def make_dim(factors):
    """Canonical form: consecutive static factors merged, size-1 factors dropped; None if static."""
    out = []
    for f in factors:
        if isinstance(f, int) or (not isinstance(f, int) and f.is_number):
            f = int(f)
            if f == 1:
                continue
            if out and isinstance(out[-1], int):
                out[-1] *= f
                continue
        out.append(f)
    if all(isinstance(f, int) for f in out):
        return None
    return Dim(out)


def dim_for_expr(expr, registry=None):
    """The layout of a dim of size `expr` that no op produced (an input, a factory): its
    flattening order when a graph has produced this expression before, else one prefix factor."""
    if expr is None:
        return None
    if registry is not None and expr in registry:
        return registry[expr]
    return Dim([expr])


def factors_of(d, size):
    if d is None:
        return [size] if size != 1 else []
    if isinstance(d, Wild):
        return [d.expr]
    return list(d)


def merge(dims):
    """Layout of a broadcast of dims (None entries are static or size 1)."""
    real = [d for d in dims if isinstance(d, Dim)]
    if real:
        if any(d != real[0] for d in real[1:]):
            raise NotPaddable(f"elements laid out differently along one dim ({', '.join(map(str, real))})")
        return real[0]
    wild = [d for d in dims if isinstance(d, Wild)]
    if wild:
        if any(w != wild[0] for w in wild[1:]):
            raise NotPaddable("broadcasts of different extents along one dim")
        return wild[0]
    return None


def broadcast_layouts(layouts, ndim):
    """Align layouts of broadcast operands to the right; size-1 dims are None."""
    out = []
    for k in range(ndim):
        dims = []
        for lay in layouts:
            j = len(lay) - ndim + k
            if j >= 0:
                dims.append(lay[j])
        out.append(merge(dims))
    return tuple(out)


# ------------------------------------------------------------------------------- the trace
class Context:
    """Per trace: bucket values (static) and real values (traced) of the graph's symbols."""

    def __init__(self, buckets: dict, weak_reals: dict, registry: dict):
        self.buckets, self.weak_reals, self.registry = buckets, weak_reals, registry
        # masks and counts compute in int64, whatever dtype they meet
        self.reals = {s: jnp.asarray(v, jnp.int64) for s, v in weak_reals.items()}
        self._cache, self._weak_cache = {}, {}

    def real(self, expr):
        if isinstance(expr, int):
            return jnp.asarray(expr, jnp.int64)
        if expr not in self._cache:
            self._cache[expr] = trace_eval(expr, self.reals)
        return self._cache[expr]

    def weak_real(self, expr):
        """The real value of a size used as a value: weakly typed, as a Python number in torch."""
        if expr not in self._weak_cache:
            self._weak_cache[expr] = trace_eval(expr, self.weak_reals, weak=True)
        return self._weak_cache[expr]

    def bucket(self, f) -> int:
        return f if isinstance(f, int) else host_eval(f, self.buckets)

    def dim_mask(self, d, size):
        """1-D bool mask of the real elements of a dim (None: all real)."""
        if d is None:
            return None
        if isinstance(d, Wild):
            return jnp.arange(size) < self.real(d.expr)
        masks = []
        for f in d:
            b = self.bucket(f)
            masks.append(jnp.ones((b,), bool) if isinstance(f, int) else jnp.arange(b) < self.real(f))
        m = masks[0]
        for other in masks[1:]:
            m = (m[:, None] & other[None, :]).reshape(-1)
        if m.shape[0] != size:
            raise NotPaddable(f"layout {d} does not cover a dim of size {size}")
        return m

    def real_extent(self, d, size):
        if d is None:
            return jnp.asarray(size, jnp.int64)
        if isinstance(d, Wild):
            return self.real(d.expr)
        return functools.reduce(operator.mul, [self.real(f) for f in d])

    def mask(self, x, layout, dims):
        """Bool mask (broadcastable to x) of elements real along `dims`, or None."""
        out = None
        for d in dims:
            m = self.dim_mask(layout[d], x.shape[d])
            if m is None:
                continue
            shape = [1] * x.ndim
            shape[d] = x.shape[d]
            m = m.reshape(shape)
            out = m if out is None else out & m
        return out

    def fill(self, x, layout, dims, value):
        m = self.mask(x, layout, dims)
        if m is None:
            return x
        return jnp.where(m, x, jnp.asarray(value, x.dtype) if not isinstance(value, jax.Array) else value)


def identity(kind, dtype):
    dtype = np.dtype(dtype)
    if kind == "zero":
        return False if dtype == np.bool_ else 0
    if kind == "one":
        return True if dtype == np.bool_ else 1
    if kind == "low":
        if dtype == np.bool_:
            return False
        return -np.inf if np.issubdtype(dtype, np.inexact) else np.iinfo(dtype).min
    if kind == "high":
        if dtype == np.bool_:
            return True
        return np.inf if np.issubdtype(dtype, np.inexact) else np.iinfo(dtype).max
    raise ValueError(kind)


def _dims(dim, ndim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return sorted(d % ndim if ndim else 0 for d in dim)


def _padded(layout, dims):
    return [d for d in dims if layout[d] is not None]


# ------------------------------------------------------------------------------- rules
# A rule: (run, node, args, kwargs, layouts) -> (value, layout). `run(args, kwargs)` calls the
# node's lowering on (converted) arguments; `layouts` mirrors args/kwargs (None for non-tensors).
# Rules are found by name: an op's entry in the table names its rule (registry.Padding).
RULES: dict = {}


def rule(name):
    def register(fn):
        RULES[name] = fn
        return fn

    return register


def rule_for(node):
    """The padding rule the node's op table entry names; NotPaddable, with the entry's reason, if none."""
    lowering = find_lowering(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
    if lowering is None or lowering.padding is None:
        raise NotPaddable(lowering.not_paddable if lowering is not None else "no padding rule for this op")
    return RULES[lowering.padding.rule]


def _out_exprs(node):
    val = node.meta.get("val")
    return [sym_expr(s) for s in val.shape]


@rule("same")
def _same(run, node, args, kwargs, lay):
    return run(args, kwargs), lay[0][0]




@rule("pointwise")
def pointwise(run, node, args, kwargs, lay):
    out = run(args, kwargs)
    tensors = [l for l in _flat_layouts(lay) if l is not None]
    if isinstance(out, (tuple, list)):  # several elementwise outputs (log_sigmoid_forward)
        return out, [broadcast_layouts(tensors, o.ndim) for o in out]
    return out, broadcast_layouts(tensors, out.ndim)


def _flat_layouts(lay):
    args, kwargs = lay
    flat = list(args) + list(kwargs.values())
    return [l for l in flat if isinstance(l, tuple)]


@rule("view")
def view(run, node, args, kwargs, lay):
    x = args[0]
    out = run(args, kwargs)
    queue = []
    for d, size in zip(lay[0][0], x.shape):
        queue.extend(factors_of(d, size))
    ctx = _CTX[0]
    layout = []
    for size in out.shape:
        taken, prod = [], 1
        while prod < size or (queue and size == prod and ctx.bucket(queue[0]) == 1):
            if not queue:
                raise NotPaddable("reshape does not line up with the padded layout")
            f = queue.pop(0)
            b = ctx.bucket(f)
            if prod * b > size:
                if not isinstance(f, int) or (size % prod) or (b % (size // prod)):
                    raise NotPaddable("reshape splits a padded dim")
                need = size // prod
                queue.insert(0, b // need)
                f, b = need, need
            taken.append(f)
            prod *= b
        if prod != size:
            raise NotPaddable("reshape does not line up with the padded layout")
        layout.append(make_dim(taken))
    if any(ctx.bucket(f) != 1 for f in queue):
        raise NotPaddable("reshape does not line up with the padded layout")
    return out, tuple(layout)


@rule("permute")
def permute(run, node, args, kwargs, lay):
    x = args[0]
    perm = [p % x.ndim for p in args[1]]
    return run(args, kwargs), tuple(lay[0][0][p] for p in perm)


@rule("transpose")
def transpose(run, node, args, kwargs, lay):
    x = args[0]
    layout = list(lay[0][0])
    if x.ndim:
        a, b = args[1] % x.ndim, args[2] % x.ndim
        layout[a], layout[b] = layout[b], layout[a]
    return run(args, kwargs), tuple(layout)


@rule("t")
def t(run, node, args, kwargs, lay):
    return run(args, kwargs), tuple(reversed(lay[0][0]))


@rule("unsqueeze")
def unsqueeze(run, node, args, kwargs, lay):
    out = run(args, kwargs)
    layout = list(lay[0][0])
    layout.insert(args[1] % out.ndim, None)
    return out, tuple(layout)


@rule("squeeze")
def squeeze(run, node, args, kwargs, lay):
    x = args[0]
    out = run(args, kwargs)
    dims = _dims(args[1] if len(args) > 1 else None, x.ndim)
    keep = [d for d in range(x.ndim) if not (d in dims and x.shape[d] == 1)]
    return out, tuple(lay[0][0][d] for d in keep)


@rule("expand")
def expand(run, node, args, kwargs, lay):
    x = args[0]
    out = run(args, kwargs)
    exprs = _out_exprs(node)
    old = (None,) * (out.ndim - x.ndim) + tuple(lay[0][0])
    layout = []
    for k in range(out.ndim):
        j = k - (out.ndim - x.ndim)
        if j >= 0 and x.shape[j] == out.shape[k]:
            layout.append(old[k])
        else:
            layout.append(Wild(exprs[k]) if exprs[k] is not None else None)
    return out, tuple(layout)


@rule("slice")
def slice_(run, node, args, kwargs, lay):
    x = args[0]
    values = list(args) + [None] * (5 - len(args))
    dim = (values[1] or 0) % x.ndim
    start, end, step = values[2], values[3], values[4] if values[4] is not None else 1
    d = lay[0][0][dim]
    exprs = _out_exprs(node)
    if d is None and not isinstance(end, Size) and not isinstance(start, Size):
        return run(args, kwargs), lay[0][0]
    if isinstance(start, Size) or (isinstance(start, int) and start < 0) or isinstance(step, Size):
        raise NotPaddable("slice with a symbolic or negative start along a padded dim")
    if d is not None and (isinstance(d, Wild) or len(d) != 1):
        if (start in (None, 0)) and (end is None or (isinstance(end, int) and end >= x.shape[dim])) and step == 1:
            return run(args, kwargs), lay[0][0]
        raise NotPaddable("slice of a dim flattened from a padded one")
    out = run(args, kwargs)
    ctx = _CTX[0]
    want = ctx.bucket(exprs[dim]) if exprs[dim] is not None else out.shape[dim]
    if out.shape[dim] < want:  # e.g. buffer[:T] with the bucket beyond the buffer: junk after it
        pad = [(0, 0)] * out.ndim
        pad[dim] = (0, want - out.shape[dim])
        out = jnp.pad(out, pad)
    layout = list(lay[0][0])
    layout[dim] = Dim([exprs[dim]]) if exprs[dim] is not None else None
    return out, tuple(layout)


@rule("select")
def select(run, node, args, kwargs, lay):
    x, dim, index = args[0], args[1] % args[0].ndim, args[2]
    d = lay[0][0][dim]
    if d is not None and (not isinstance(index, int) or index < 0 or isinstance(d, Wild) or len(d) != 1):
        raise NotPaddable("select of a padded dim from its end or by a symbolic index")
    layout = list(lay[0][0])
    del layout[dim]
    return run(args, kwargs), tuple(layout)


@rule("split")
def split(run, node, args, kwargs, lay):
    x = args[0]
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) if node.target is not aten.unbind.int else \
        (args[1] if len(args) > 1 else kwargs.get("dim", 0))
    dim %= x.ndim
    if lay[0][0][dim] is not None:
        raise NotPaddable("split along a padded dim")
    outs = run(args, kwargs)
    layout = list(lay[0][0])
    if node.target is aten.unbind.int:
        del layout[dim]
    return outs, [tuple(layout)] * len(outs)


@rule("cat")
def cat(run, node, args, kwargs, lay):
    tensors = args[0]
    out = run(args, kwargs)
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % out.ndim
    lays = [l for l, t in zip(lay[0][0], tensors) if t.ndim == out.ndim]
    if any(l[dim] is not None for l in lays):
        raise NotPaddable("cat along a padded dim")
    layout = []
    for k in range(out.ndim):
        layout.append(None if k == dim else merge([l[k] for l in lays]))
    return out, tuple(layout)


@rule("stack")
def stack(run, node, args, kwargs, lay):
    out = run(args, kwargs)
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % out.ndim
    layout = list(broadcast_layouts(list(lay[0][0]), out.ndim - 1))
    layout.insert(dim, None)
    return out, tuple(layout)


@rule("factory")
def factory(run, node, args, kwargs, lay):
    out = run(args, kwargs)
    ctx = _CTX[0]
    return out, tuple(dim_for_expr(e, ctx.registry) for e in _out_exprs(node))




@rule("arange")
def arange(run, node, args, kwargs, lay):
    if node.target is not aten.arange.default and isinstance(args[0], Size):
        raise NotPaddable("arange with a symbolic start")
    if node.target is aten.arange.start_step and len(args) > 2 and isinstance(args[2], Size):
        raise NotPaddable("arange with a symbolic step")
    args = [a.bucket if isinstance(a, Size) else a for a in args]  # values 0..bucket-1: a real prefix
    return factory(run, node, args, kwargs, lay)


@rule("tril")
def tril(run, node, args, kwargs, lay):
    layout = lay[0][0]
    for d in layout[-2:]:
        if d is not None and (isinstance(d, Wild) or len(d) != 1):
            raise NotPaddable("tril/triu over a flattened padded dim")
    return run(args, kwargs), layout


# ---- reductions
def _reduce_dims(node, args, kwargs, pos, x):
    if pos is None:
        return list(range(x.ndim)), False
    names = [a.name for a in node.target._schema.arguments]
    dim = args[pos] if len(args) > pos else kwargs.get(names[pos])
    return _dims(dim, x.ndim), dim is None


def _keepdim(node, args, kwargs, pos):
    if pos is None:
        return False
    names = [a.name for a in node.target._schema.arguments]
    return bool(args[pos] if len(args) > pos else kwargs.get(names[pos], False))


def _reduced_layout(layout, dims, keepdim):
    if keepdim:
        return tuple(None if k in dims else d for k, d in enumerate(layout))
    return tuple(d for k, d in enumerate(layout) if k not in dims)


@rule("reduction")
def reduction(run, node, args, kwargs, lay):
    """Over the schema's `dim` (every dim without one), padded elements first set to the
    entry's identity (registry.reduction)."""
    kind = find_lowering(node.target).padding.identity
    names = [a.name for a in node.target._schema.arguments]
    dpos = names.index("dim") if "dim" in names else None
    kpos = names.index("keepdim") if "keepdim" in names else None
    x, layout = args[0], lay[0][0]
    dims, all_dims = _reduce_dims(node, args, kwargs, dpos, x)
    padded = _padded(layout, dims)
    if padded and node.target in (aten.argmax.default, aten.argmin.default) and (all_dims and x.ndim > 1):
        raise NotPaddable("argmax/argmin over all dims of a padded tensor (the flat index depends on the padding)")
    if padded:
        args = [_CTX[0].fill(x, layout, padded, identity(kind, x.dtype))] + list(args[1:])
    out = run(args, kwargs)
    keep = _keepdim(node, args, kwargs, kpos)
    new = _reduced_layout(layout, dims, keep)
    if isinstance(out, (tuple, list)):
        return out, [new] * len(out)
    return out, new


@rule("mean")
def mean(run, node, args, kwargs, lay):
    x, layout = args[0], lay[0][0]
    dpos = 1 if node.target is aten.mean.dim else None
    dims, _ = _reduce_dims(node, args, kwargs, dpos, x)
    keep = _keepdim(node, args, kwargs, 2 if dpos else None)
    padded = _padded(layout, dims)
    if not padded:
        return run(args, kwargs), _reduced_layout(layout, dims, keep)
    ctx = _CTX[0]
    masked = ctx.fill(x, layout, padded, 0)
    names = [a.name for a in node.target._schema.arguments]
    dtype = kwargs.get("dtype", args[names.index("dtype")] if len(args) > names.index("dtype") else None)
    total = _SUM()([masked, dims, keep, dtype], {})  # sum of the real elements, divided by their count
    count = functools.reduce(operator.mul, [ctx.real_extent(layout[d], x.shape[d]) for d in dims])
    return (total / count.astype(total.dtype)).astype(total.dtype), _reduced_layout(layout, dims, keep)


@functools.lru_cache(1)
def _SUM():

    return OpCall.of(find_lowering(aten.sum.dim_IntList))


@rule("var")
def var(run, node, args, kwargs, lay):
    x, layout = args[0], lay[0][0]
    dims, _ = _reduce_dims(node, args, kwargs, 1, x)
    keep = bool(kwargs.get("keepdim", False))
    padded = _padded(layout, dims)
    new = _reduced_layout(layout, dims, keep)
    if not padded:
        out = run(args, kwargs)
        return out, ([new, new] if isinstance(out, (tuple, list)) else new)
    if jnp.iscomplexobj(x):
        raise NotPaddable("complex variance over a padded dim")
    ctx = _CTX[0]
    correction = kwargs.get("correction")
    correction = 1 if correction is None else correction
    m = ctx.mask(x, layout, padded)
    count = functools.reduce(operator.mul, [ctx.real_extent(layout[d], x.shape[d]) for d in dims]).astype(x.dtype)
    mean_ = jnp.sum(jnp.where(m, x, 0), axis=tuple(dims), keepdims=True) / count
    dev = jnp.where(m, x - mean_, 0)
    v = jnp.sum(dev * dev, axis=tuple(dims), keepdims=keep) / (count - correction)
    mean_ = mean_ if keep else jnp.squeeze(mean_, axis=tuple(dims))
    if node.target is aten.std.correction:
        return jnp.sqrt(v), new
    if node.target is aten.var_mean.correction:
        return (v, mean_), [new, new]
    return v, new


@rule("cumulative")
def cumulative(run, node, args, kwargs, lay):
    x, layout = args[0], lay[0][0]
    dim = args[1] % x.ndim
    if layout[dim] is not None:
        kind = "zero" if node.target is aten.cumsum.default else "one"
        args = [_CTX[0].fill(x, layout, [dim], identity(kind, x.dtype))] + list(args[1:])
    return run(args, kwargs), layout


@rule("softmax")
def softmax(run, node, args, kwargs, lay):
    x, layout = args[0], lay[0][0]
    dim = args[1] % x.ndim
    if layout[dim] is not None:
        args = [_CTX[0].fill(x, layout, [dim], -jnp.inf)] + list(args[1:])
    return run(args, kwargs), layout


@rule("softmax_backward")
def softmax_backward(run, node, args, kwargs, lay):
    grad, out = args[0], args[1]
    layout = broadcast_layouts([lay[0][0], lay[0][1]], grad.ndim)
    dim = args[2] % grad.ndim
    if layout[dim] is not None:
        ctx = _CTX[0]
        # the lowering sums grad (* output) over dim: zero both in padded positions
        fill_out = 0 if node.target is aten._softmax_backward_data.default else -jnp.inf
        args = [ctx.fill(grad, layout, [dim], 0), ctx.fill(out, layout, [dim], fill_out)] + list(args[2:])
    return run(args, kwargs), layout


# ---- contractions
def _contract(ctx, a, la, ka, b, lb, kb):
    d = merge([la[ka], lb[kb]])
    if d is None:
        return a, b
    if isinstance(d, Wild):
        d = Dim([d.expr])
    ma = ctx.dim_mask(d, a.shape[ka])
    sa = [1] * a.ndim
    sa[ka] = -1
    sb = [1] * b.ndim
    sb[kb] = -1
    return jnp.where(ma.reshape(sa), a, jnp.zeros((), a.dtype)), jnp.where(ma.reshape(sb), b, jnp.zeros((), b.dtype))


@rule("contraction")
def contraction(run, node, args, kwargs, lay):
    ctx = _CTX[0]
    op = node.target
    first = 1 if op in (aten.addmm.default, aten.baddbmm.default) else 0
    a, b = args[first], args[first + 1]
    la, lb = lay[0][first], lay[0][first + 1]
    ka = a.ndim - 1
    kb = 0 if b.ndim == 1 else b.ndim - 2
    a, b = _contract(ctx, a, la, ka, b, lb, kb)
    args = list(args)
    args[first], args[first + 1] = a, b
    out = run(args, kwargs)
    if op in (aten.mm.default, aten.addmm.default, aten._int_mm.default, aten._scaled_mm.default,
              aten._scaled_mm_v2.default):
        layout = (la[0], lb[1])
    elif op in (aten.bmm.default, aten.baddbmm.default):
        layout = (merge([la[0], lb[0]]), la[1], lb[2])
    elif op is aten.mv.default:
        layout = (la[0],)
    else:
        layout = ()
    if first:
        layout = broadcast_layouts([layout, lay[0][0]], out.ndim)
    return out, layout


# ---- nn
@rule("embedding")
def embedding(run, node, args, kwargs, lay):
    if any(d is not None for d in lay[0][0]):
        raise NotPaddable("embedding table with a padded dim")
    return run(args, kwargs), tuple(lay[0][1]) + (None,)


@rule("embedding_backward")
def embedding_backward(run, node, args, kwargs, lay):
    grad, indices = args[0], args[1]
    li = lay[0][1]
    if any(d is not None for d in li):
        if args[4] if len(args) > 4 else kwargs.get("scale_grad_by_freq", False):
            raise NotPaddable("embedding backward with scale_grad_by_freq counts padded indices")
        # junk rows would be scattered into real rows of the table: zero them
        layout = tuple(li) + (None,)
        args = [_CTX[0].fill(grad, layout, range(len(li)), 0)] + list(args[1:])
    return run(args, kwargs), (None, None)


@rule("layer_norm")
def layer_norm(run, node, args, kwargs, lay):
    x, layout = args[0], lay[0][0]
    k = len(args[1])
    if any(d is not None for d in layout[x.ndim - k:]):
        raise NotPaddable("layer norm over a padded dim")
    stats = tuple(layout[: x.ndim - k]) + (None,) * k
    return run(args, kwargs), [layout, stats, stats]


@rule("layer_norm_backward")
def layer_norm_backward(run, node, args, kwargs, lay):
    grad, x = args[0], args[1]
    k = len(args[2])
    layout = broadcast_layouts([lay[0][0], lay[0][1]], x.ndim)
    if any(d is not None for d in layout[x.ndim - k:]):
        raise NotPaddable("layer norm over a padded dim")
    lead = _padded(layout, range(x.ndim - k))
    if lead:
        # weight/bias gradients sum over rows: zero every input of padded rows (NaN junk included)
        ctx = _CTX[0]
        args = list(args)
        args[0] = ctx.fill(grad, layout, lead, 0)
        args[1] = ctx.fill(x, layout, lead, 0)
        args[3] = ctx.fill(args[3], layout, lead, 0)
        args[4] = ctx.fill(args[4], layout, lead, 0)
    return run(args, kwargs), [layout, (None,) * args[5].ndim if args[5] is not None else None,
                               (None,) * args[6].ndim if args[6] is not None else None]


def _target_masked(args, lay, pos_target, pos_ignore, kwargs, name="ignore_index"):
    target, lt = args[pos_target], lay[0][pos_target]
    padded = _padded(lt, range(target.ndim))
    if not padded:
        return args
    ignore = args[pos_ignore] if len(args) > pos_ignore else kwargs.get(name, -100)
    args = list(args)
    args[pos_target] = _CTX[0].fill(target, lt, padded, ignore)
    return args


@rule("nll_loss_forward")
def nll_loss_forward(run, node, args, kwargs, lay):
    args = _target_masked(args, lay, 1, 4, kwargs)  # padded rows: ignore_index (out of sum and count)
    out = run(args, kwargs)
    reduction = args[3]
    return out, [tuple(lay[0][1]) if reduction == 0 else (), ()]


@rule("nll_loss_backward")
def nll_loss_backward(run, node, args, kwargs, lay):
    args = _target_masked(args, lay, 2, 5, kwargs)
    return run(args, kwargs), lay[0][1]


@rule("mse_loss")
def mse_loss(run, node, args, kwargs, lay):
    x, y = args[0], args[1]
    reduction = args[2] if len(args) > 2 else kwargs.get("reduction", 1)
    layout = broadcast_layouts([lay[0][0], lay[0][1]], max(x.ndim, y.ndim))
    if reduction == 0 or not any(d is not None for d in layout):
        return run(args, kwargs), (layout if reduction == 0 else ())
    ctx = _CTX[0]
    d = jnp.subtract(x, y)
    sq = ctx.fill(d * d, layout, range(d.ndim), 0)
    total = jnp.sum(sq)
    if reduction == 1:
        count = functools.reduce(operator.mul, [ctx.real_extent(l, n) for l, n in zip(layout, sq.shape)])
        total = total / count.astype(total.dtype)
    return total.astype(x.dtype), ()


@rule("mse_loss_backward")
def mse_loss_backward(run, node, args, kwargs, lay):
    grad, x, y, reduction = args[0], args[1], args[2], args[3]
    layout = broadcast_layouts([lay[0][1], lay[0][2]], max(x.ndim, y.ndim))
    if reduction != 1 or not any(d is not None for d in layout):
        return run(args, kwargs), broadcast_layouts([lay[0][0], layout], x.ndim)
    ctx = _CTX[0]
    count = functools.reduce(operator.mul, [ctx.real_extent(l, n) for l, n in zip(layout, x.shape)])
    scale = (2 / count.astype(x.dtype)).astype(x.dtype)
    return (jnp.subtract(x, y) * scale * grad).astype(x.dtype), layout


@rule("convolution")
def convolution(run, node, args, kwargs, lay):
    lx = lay[0][0]
    if any(d is not None for d in lx[1:]) or any(d is not None for d in lay[0][1]):
        raise NotPaddable("convolution over a padded channel or spatial dim")
    out = run(args, kwargs)
    return out, (lx[0],) + (None,) * (out.ndim - 1)


@rule("convolution_backward")
def convolution_backward(run, node, args, kwargs, lay):
    lg, lx = lay[0][0], lay[0][1]
    if any(d is not None for d in list(lg[1:]) + list(lx[1:])):
        raise NotPaddable("convolution over a padded channel or spatial dim")
    batch = merge([lg[0], lx[0]])
    if batch is not None:  # weight and bias gradients sum over the batch
        ctx = _CTX[0]
        args = list(args)
        args[0] = ctx.fill(args[0], (batch,) + (None,) * (args[0].ndim - 1), [0], 0)
        args[1] = ctx.fill(args[1], (batch,) + (None,) * (args[1].ndim - 1), [0], 0)
    outs = run(args, kwargs)
    return outs, [lx, tuple(None for _ in range(args[2].ndim)), (None,)]


@rule("batch_only")
def batch_only(run, node, args, kwargs, lay):
    """Ops independent per sample of dim 0 (pooling): fine while only dim 0 is padded."""
    tensors = _flat_layouts(lay)
    if any(d is not None for l in tensors for d in l[1:]):
        raise NotPaddable(f"{node.target} over a padded non-batch dim")
    batch = merge([l[0] for l in tensors if l])
    outs = run(args, kwargs)
    if isinstance(outs, (tuple, list)):
        return outs, [(batch,) + (None,) * (o.ndim - 1) for o in outs]
    return outs, (batch,) + (None,) * (outs.ndim - 1)



_CTX: list = [None]  # the Context of the trace in progress (traces run one at a time per graph lock)


# ------------------------------------------------------------------------------- the program
class PaddedProgram:
    """`program` (a GraphProgram) traced on padded inputs, with layouts and masking rules."""

    def __init__(self, program, input_layouts, symbols, registry):
        self.program = program
        self.input_layouts = input_layouts  # per placeholder: tuple of per-dim layouts, or a Size expr, or None
        self.symbols = symbols  # sympy symbols, in the order of the `reals` input vector
        self.registry = registry
        self.output_layouts: dict = {}  # bucket key -> (flat output layouts, mutated value layouts)
        self.python_outputs: dict = {}  # bucket key -> flat outputs, Size where a symbolic size

    def function(self, key, seeds, constants, reals, *arrays):
        """`program.function` on padded arrays at bucket `key` (static); `reals` holds the
        symbols' real sizes as weakly typed scalars (Python ints at the call)."""
        program = self.program
        buckets = dict(zip(self.symbols, key))
        ctx = Context(buckets, dict(zip(self.symbols, reals)), self.registry)
        _CTX[0] = ctx
        env, lay = {}, {}
        it = iter(arrays)
        for n, spec in zip(program.placeholders, self.input_layouts):
            if isinstance(spec, tuple):
                v = next(it)
                env[n], lay[n] = (v.resolve() if hasattr(v, "resolve") else v), spec
            elif spec is None:
                env[n], lay[n] = n.meta.get("val"), None
            else:
                env[n], lay[n] = Size(spec, ctx), None
        for n, v in zip(program.constant_nodes, constants):
            env[n], lay[n] = v, tuple(None for _ in getattr(v, "shape", ()))

        def step(node, args, kwargs, seeds):
            try:
                value, lay[node] = self._run(node, args, kwargs, lay, seeds, ctx)
            except NotPaddable as e:
                raise NotPaddable(f"node %{node.name} ({_label(node)}): {e}") from None
            self._check(node, value, ctx)
            return value

        program.evaluate(env, seeds, step)
        for i in program.mutated:
            dst, src = program.mutations[i].args
            if isinstance(env[src], jax.Array) and env[src].shape != env[dst].shape:
                raise NotPaddable("an input mutation broadcasts a padded value")
        outputs, new_values = program.results(env)
        new_layouts = []
        for i in program.mutated:
            node = program.mutations[i]
            lay[node] = lay[node.args[0]]
            new_layouts.append(lay[node])
        flat = torch.utils._pytree.tree_flatten(program.output_args)[0]
        layouts = [lay[a] if isinstance(a, torch.fx.Node) else None for a in flat]
        self.python_outputs[key] = [None if isinstance(o, jax.Array) else o for o in outputs]
        self.output_layouts[key] = ([l for o, l in zip(outputs, layouts) if isinstance(o, jax.Array)], new_layouts)
        for l in self.output_layouts[key][0]:  # teach graphs reading these tensors back their flattening order
            for d in l or ():
                if isinstance(d, Dim) and len(d) > 1:
                    self.registry.setdefault(sympy.Mul(*[sympy.Integer(f) if isinstance(f, int) else f for f in d]), d)
        _CTX[0] = None
        return tuple(o for o in outputs if isinstance(o, jax.Array)), tuple(new_values)

    def _run(self, node, args, kwargs, lay, seeds, ctx):
        """One node: (value, layout)."""
        program = self.program
        val = node.meta.get("val")
        if isinstance(val, torch.SymBool):
            if node.target in (aten._assert_scalar.default, aten._assert_async.msg):
                return None, None
            raise NotPaddable("a symbolic bool")
        if isinstance(val, torch.SymFloat) and not val.node.expr.is_number:
            return Size(val.node.expr, ctx), None  # a size used as a float value: real only
        if isinstance(val, torch.SymInt) and sym_expr(val) is not None:
            return Size(sym_expr(val), ctx), None  # sym_size, int arithmetic on sizes: read from the graph
        if node.target in (aten._assert_scalar.default, aten._assert_async.msg):
            return None, None
        if isinstance(val, torch.SymInt):
            return int(val), None
        if node.target is operator.getitem:
            return args[0][args[1]], (lay[node.args[0]][args[1]] if lay[node.args[0]] is not None else None)
        look_lay = lambda a: lay[a] if isinstance(a, torch.fx.Node) else None  # noqa: E731
        layouts = (map_aggregate(node.args, look_lay), map_aggregate(node.kwargs, look_lay))
        padded_inputs = any(isinstance(l, tuple) and any(d is not None for d in l)
                            for l in torch.utils._pytree.tree_flatten(layouts)[0] if l is not None) or \
            any(_has_padded(l) for l in list(layouts[0]) + list(layouts[1].values()))
        has_size = any(isinstance(a, Size) for a in torch.utils._pytree.tree_flatten((args, kwargs))[0])
        symbolic_out = _symbolic_output(val)
        if node in program.seed_index and (padded_inputs or symbolic_out):
            raise NotPaddable("a random op: its draws depend on the padded shape")

        def run(a, kw):
            return program.apply(node, *_convert(node, a, kw), seeds)

        if not padded_inputs and not has_size and not symbolic_out:
            out = run(args, kwargs)
            return out, _static_layout(out)
        return rule_for(node)(run, node, args, kwargs, layouts)

    def _check(self, node, value, ctx):
        """Safety net: every array has the shape the graph's sizes give at the bucket sizes."""
        val = node.meta.get("val")
        vals, values = (val, value) if isinstance(val, (tuple, list)) else ([val], [value])
        for v, a in zip(vals, values if isinstance(values, (tuple, list)) else [values]):
            if isinstance(v, torch.Tensor) and isinstance(a, jax.Array):
                want = tuple(host_eval(e, ctx.buckets) if e is not None else int(s)
                             for e, s in zip([sym_expr(s) for s in v.shape], v.shape))
                if tuple(a.shape) != want:
                    raise NotPaddable(f"node %{node.name} gave shape {tuple(a.shape)}, expected {want} at the buckets")


def _label(node):
    return getattr(node.target, "__name__", str(node.target))


def _has_padded(l):
    if isinstance(l, list):
        return any(_has_padded(x) for x in l)
    return isinstance(l, tuple) and any(d is not None for d in l)


def _symbolic_output(val):
    vals = val if isinstance(val, (tuple, list)) else [val]
    return any(isinstance(v, torch.Tensor) and any(sym_expr(s) is not None for s in v.shape) for v in vals)


def _static_layout(out):
    if isinstance(out, (tuple, list)):
        return [_static_layout(o) for o in out]
    if isinstance(out, jax.Array):
        return (None,) * out.ndim
    return None


def _convert(node, args, kwargs):
    """Sizes used as shapes (SymInt arguments) get the bucket; sizes used as values the real size."""
    schema = node.target._schema.arguments if isinstance(node.target, torch._ops.OpOverload) else None
    types = {a.name: str(a.type) for a in schema} if schema else {}
    names = [a.name for a in schema] if schema else []

    def conv(v, typ):
        if isinstance(v, Size):
            return v.bucket if ("SymInt" in typ or typ.startswith("int") or "List[int]" in typ) else v.weak_real()
        if isinstance(v, (list, tuple)):
            return type(v)(conv(x, typ) for x in v)
        return v

    args = tuple(conv(a, types.get(names[i], "") if i < len(names) else "") for i, a in enumerate(args))
    kwargs = {k: conv(v, types.get(k, "")) for k, v in kwargs.items()}
    return args, kwargs


# ------------------------------------------------------------------------------- host side
@functools.lru_cache(4096)
def pad_fn(real_factors: tuple, padded_factors: tuple, final: tuple):
    """Zero-pad a real tensor into its padded layout (one cached executable per real shape)."""
    pads = tuple((0, p - r) for r, p in zip(real_factors, padded_factors))
    return jax.jit(lambda x: jnp.pad(x.reshape(real_factors), pads).reshape(final))


@functools.lru_cache(4096)
def unpad_fn(padded_factors: tuple, real_factors: tuple, final: tuple):
    """The real elements of a padded result, laid out densely."""
    index = tuple(slice(0, r) for r in real_factors)
    return jax.jit(lambda x: x.reshape(padded_factors)[index].reshape(final))


def expand_layout(layout, shape, buckets: dict, reals: dict):
    """(real factor sizes, padded factor sizes, real shape, padded shape) of a tensor with `layout`."""
    real_f, pad_f, real_s, pad_s = [], [], [], []
    for d, size in zip(layout, shape):
        if d is None:
            real_f.append(size), pad_f.append(size), real_s.append(size), pad_s.append(size)
            continue
        factors = [d.expr] if isinstance(d, Wild) else list(d)
        r = [host_eval(f, reals) for f in factors]
        p = [host_eval(f, buckets) for f in factors]
        real_f += r
        pad_f += p
        real_s.append(math.prod(r))
        pad_s.append(math.prod(p))
    return tuple(real_f), tuple(pad_f), tuple(real_s), tuple(pad_s)
