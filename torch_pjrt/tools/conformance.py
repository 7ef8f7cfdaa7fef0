"""OpInfo conformance runner: every op in PyTorch's op_db, on pjrt, against CPU torch.

    python -m torch_pjrt.tools.conformance [--ops a,b] [--out docs/conformance.md]
                                           [--json results.json] [--quick]

For each OpInfo with a CPU kernel (op_db plus the `_foreach_*` OpInfo databases), for
each dtype the OpInfo supports on CPU, the runner takes the OpInfo's own sample inputs,
runs them on CPU torch (the reference) and on pjrt, and records one case per
(op, dtype, check):

  forward        values of op(sample) after the sample's output_process_fn_grad;
  gradient       input gradients of a weighted sum of the differentiable outputs
                 (fixed random weights: a plain sum hides gradients such as softmax's);
  out            out= into preallocated pjrt tensors of the right shape, then into
                 wrongly sized ones (empty, and one of the wrong shape) that must resize;
  inplace        the OpInfo's inplace_variant; where CPU rejects the in-place call the
                 pjrt call must raise too;
  noncontiguous  the sample's .noncontiguous() tensors, rebuilt on pjrt with the same
                 storage layout (sizes, strides, offset and the NaN-filled gaps);
  errors         the OpInfo's error_inputs (bad input with the exception type and message
                 regex PyTorch expects), one case per error input (dtype column: its number):
                 pjrt must raise the exception type CPU raises, with a message matching the
                 regex, by the next host sync (queued checks raise there, as CUDA's do).

Values are compared with torch.testing.assert_close using the default tolerances of
the dtype, loosened only where the OpInfo's decorators give a toleranceOverride or
precisionOverride for TestCommon on CPU. Ops whose output is random (two CPU runs with
different seeds differ) are compared on structure, shapes and dtypes, and must be
reproducible under torch.manual_seed; their gradients are skipped.

A case is pass, fail (a mismatch), error (pjrt raised where CPU did not), timeout, crash
(the worker process died or hung) or skip (always with a written reason). Every case also
records the aten ops that ran on the CPU fallback and those that ran as a decomposition
(diff of torch_pjrt.fallback_ops()/decomposed_ops() around the case).

Robustness: ops run in worker subprocesses; each case has a signal.alarm timeout, and the
parent kills a worker that stops reporting (a hang inside native code) or restarts one
that died (a crash), records the case it was on, and carries on with the next case.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import zlib

CHECKS = ("forward", "gradient", "out", "inplace", "noncontiguous", "errors")
CHECK_TITLES = {"forward": "forward", "gradient": "gradient", "out": "out=", "inplace": "in-place",
                "noncontiguous": "noncontiguous", "errors": "error inputs"}
RAN = ("pass", "fail", "error", "timeout", "crash")  # statuses that count in a pass rate
FAMILIES = ("elementwise", "reductions", "indexing", "shape", "views", "nn", "linalg", "fft", "random",
            "foreach", "factories", "other")

# ----------------------------------------------------------------------------------------
# Which family an OpInfo belongs to (static: by OpInfo class and name; stable across runs)
# ----------------------------------------------------------------------------------------
# Not read from the op table: an OpInfo names a Python function, not an aten op. By aten name
# about half of op_db reaches no lowering (composites: matmul, einsum, hstack, atleast_1d),
# and the table's modules group by implementation (mm, bmm, addmm live in ops/nn.py; the
# factories in ops/shape.py), so the families the committed reports count would change.

_RANDOM = {"bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal", "uniform",
           "rand_like", "randn", "randn_like", "randint", "randint_like", "nn.functional.dropout",
           "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
           "nn.functional.feature_alpha_dropout", "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
           "nn.functional.fractional_max_pool3d", "svd_lowrank", "pca_lowrank"}
_LINALG = {"addmm", "addmv", "addbmm", "baddbmm", "dot", "vdot", "bmm", "mv", "addr", "mm", "matmul", "__rmatmul__",
           "cholesky", "cholesky_inverse", "cholesky_solve", "cross", "geqrf", "lu_unpack", "lu", "lu_solve",
           "matrix_exp", "ormqr", "qr", "svd", "triangular_solve", "einsum", "pinverse", "inner", "outer", "kron",
           "tensordot", "logdet", "det", "slogdet", "trace", "chain_matmul", "dist", "cdist", "norm",
           "sparse.sampled_addmm", "sparse.mm", "torch._scaled_mm", "torch._scaled_mm_v2", "corrcoef", "cov",
           "renorm", "block_diag"}
_REDUCTIONS = {"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "kthvalue", "median", "nanmedian", "mode",
               "quantile", "nanquantile", "var_mean", "std_mean", "aminmax", "max", "min", "sort", "argsort",
               "msort", "topk", "unique", "unique_consecutive", "histc", "histogram", "histogramdd", "bincount",
               "bucketize", "searchsorted", "logsumexp", "trapz", "trapezoid", "cumulative_trapezoid", "diff",
               "gradient", "equal", "allclose", "_segment_reduce", "isin"}
_INDEXING = {"gather", "index_fill", "index_copy", "index_select", "index_add", "index_reduce", "index_put",
             "_unsafe_masked_index", "_unsafe_masked_index_put_accumulate", "__getitem__", "put", "take",
             "take_along_dim", "scatter", "scatter_add", "scatter_reduce", "masked_fill", "masked_scatter",
             "masked_select", "nonzero", "nonzero_static", "argwhere", "where", "unravel_index",
             "nn.functional.embedding", "nn.functional.embedding_bag", "nn.functional.one_hot",
             "select_scatter", "slice_scatter", "diagonal_scatter", "as_strided_scatter"}
_VIEWS = {"alias_copy", "as_strided", "as_strided_copy", "broadcast_to", "broadcast_tensors", "chunk", "conj",
          "diagonal", "diagonal_copy", "expand", "expand_as", "expand_copy", "imag", "real", "mT", "mH", "T", "H",
          "movedim", "narrow", "narrow_copy", "permute", "permute_copy", "reshape", "reshape_as", "resolve_conj",
          "resolve_neg", "select", "slice", "split", "split_with_sizes", "split_with_sizes_copy", "squeeze",
          "squeeze_copy", "t", "t_copy", "tensor_split", "hsplit", "vsplit", "dsplit", "transpose",
          "transpose_copy", "unbind", "unbind_copy", "unflatten", "unfold", "unfold_copy", "unsqueeze",
          "unsqueeze_copy", "unsafe_chunk", "unsafe_split", "view", "view_as", "view_copy", "view_as_real",
          "view_as_complex", "ravel", "flatten", "linalg.diagonal", "contiguous", "atleast_1d", "atleast_2d",
          "atleast_3d", "meshgrid", "sum_to_size"}
_SHAPE = {"cat", "stack", "hstack", "vstack", "dstack", "column_stack", "flip", "fliplr", "flipud", "roll", "rot90",
          "repeat", "tile", "repeat_interleave", "tril", "triu", "constant_pad_nd", "nn.functional.pad", "diag",
          "diag_embed", "diagflat", "combinations", "cartesian_prod", "_chunk_cat", "resize_", "resize_as_",
          "clone", "broadcast_shapes", "tril_indices", "triu_indices", "nn.functional.pixel_shuffle",
          "nn.functional.pixel_unshuffle", "nn.functional.channel_shuffle", "nn.functional.unfold"}
_FACTORIES = {"arange", "linspace", "logspace", "empty_like", "zeros_like", "ones_like", "full_like", "new_zeros",
              "new_ones", "ones", "zeros", "full", "new_empty", "new_empty_strided", "empty_strided", "empty",
              "eye", "empty_permuted", "scalar_tensor", "new_full", "fill", "zero_", "to", "bfloat16", "bool",
              "byte", "char", "double", "float", "half", "int", "long", "short", "cdouble", "cfloat", "chalf",
              "complex", "polar", "item"}
_NN = {"softmax", "log_softmax", "_softmax_backward_data", "native_group_norm", "native_layer_norm",
       "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update", "max_pool2d_with_indices_backward",
       "native_dropout_backward", "grid_sampler_2d", "grid_sampler_3d", "_upsample_bilinear2d_aa",
       "torch.ops.aten._safe_softmax.default", "torch.ops.aten._flash_attention_forward",
       "torch.ops.aten._efficient_attention_forward", "sigmoid", "logit"}


def op_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def family(op) -> str:
    name, kind = op.name, type(op).__name__
    if kind == "ForeachFuncInfo" or name.startswith("_foreach"):
        return "foreach"
    if name in _RANDOM or (name.startswith("nn.functional.") and "dropout" in name):
        return "random"
    if kind == "SpectralFuncInfo" or name.startswith(("fft.", "signal.")) or name in ("stft", "istft"):
        return "fft"
    if name in _VIEWS:
        return "views"
    if name.startswith("linalg.") or name in _LINALG:
        return "linalg"
    if kind == "ReductionOpInfo" or name in _REDUCTIONS or name.startswith("masked."):
        return "reductions"
    if name in _INDEXING:
        return "indexing"
    if name in _SHAPE or kind == "ShapeFuncInfo":
        return "shape"
    if name in _FACTORIES:
        return "factories"
    if name.startswith("nn.functional.") or name in _NN:
        return "nn"
    if kind in ("UnaryUfuncInfo", "BinaryUfuncInfo") or name.startswith("special.") or name.startswith("__r"):
        return "elementwise"
    return "other"


def all_opinfos():
    """op_db plus the foreach OpInfo databases, in a fixed order, with unique names."""
    from torch.testing._internal import common_methods_invocations as cmi

    ops = list(cmi.op_db)
    for db in ("foreach_unary_op_db", "foreach_binary_op_db", "foreach_pointwise_op_db", "foreach_reduce_op_db",
               "foreach_other_op_db"):
        ops.extend(getattr(cmi, db, ()))
    seen: dict = {}
    result = []
    for op in ops:
        name = op_name(op)
        seen[name] = seen.get(name, 0) + 1
        result.append((name if seen[name] == 1 else f"{name}#{seen[name]}", op))
    return result


# ----------------------------------------------------------------------------------------
# Moving samples between CPU and pjrt, and comparing results
# ----------------------------------------------------------------------------------------

class Mismatch(AssertionError):
    """pjrt's result differs from CPU's: the case fails (as opposed to errors)."""


class CaseTimeout(Exception):
    pass


def _map(fn, x):
    """Apply fn to every tensor in a (nested list/tuple/dict) structure."""
    import torch

    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    if isinstance(x, list):
        return [_map(fn, v) for v in x]
    if isinstance(x, tuple):
        mapped = [_map(fn, v) for v in x]
        if hasattr(x, "n_fields"):  # torch.return_types structseq
            return type(x)(mapped)
        if hasattr(x, "_fields"):  # namedtuple
            return type(x)(*mapped)
        return tuple(mapped)
    return x


def _leaves(x) -> list:
    """Flattened leaves of a nested output structure (tensors, numbers, None, ...)."""
    if isinstance(x, dict):
        return [leaf for k in sorted(x, key=str) for leaf in _leaves(x[k])]
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in _leaves(v)]
    return [x]


def _tensors(x) -> list:
    import torch

    return [t for t in _leaves(x) if isinstance(t, torch.Tensor)]


def clone_cpu(x, requires_grad: bool = False):
    """A fresh CPU copy of a sample's tensors (leaves, keeping requires_grad when asked)."""
    def copy(t):
        c = t.detach().clone()
        return c.requires_grad_(True) if requires_grad and t.requires_grad else c
    return _map(copy, x)


def _pjrt_devices(x):
    """Samples are built for device "cpu"; factory arguments (device=) must say pjrt."""
    import torch

    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("pjrt")
    if isinstance(x, str) and x == "cpu":
        return "pjrt"
    if isinstance(x, dict):
        return {k: (_pjrt_devices(v) if k == "device" or isinstance(v, (list, tuple, dict)) else v)
                for k, v in x.items()}
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields") and not hasattr(x, "n_fields"):
        return type(x)(_pjrt_devices(v) if isinstance(v, (torch.device, dict, list, tuple, str)) else v for v in x)
    return x


def to_pjrt(x, requires_grad: bool = False):
    def move(t):
        m = t.detach().to("pjrt")
        return m.requires_grad_(True) if requires_grad and t.requires_grad else m
    return _pjrt_devices(_map(move, x))


def _to_cpu(x):
    return _map(lambda t: t.detach().cpu(), x)


def tolerance(op, dtype, device_types=("cpu",)) -> tuple[float, float]:
    """(atol, rtol): assert_close's defaults for dtype, loosened by the OpInfo's overrides."""
    from torch.testing._comparison import default_tolerances
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride

    rtol, atol = default_tolerances(dtype)  # (rtol, atol), whatever its docstring says
    tests = ("test_compare_cpu", "test_noncontiguous_samples", "test_variant_consistency_eager", "test_out")
    for device in device_types:
        for test in tests:
            try:
                decorators = op.get_decorators("TestCommon", test, device, dtype, {})
            except Exception:  # noqa: BLE001  (an active_if that needs arguments we lack)
                continue
            for d in decorators:
                if isinstance(d, toleranceOverride) and dtype in d.d:
                    atol, rtol = max(atol, d.d[dtype].atol), max(rtol, d.d[dtype].rtol)
                elif isinstance(d, precisionOverride) and dtype in d.d:
                    atol = max(atol, d.d[dtype])
    return atol, rtol


def _summary(e: BaseException) -> str:
    """One line for a report: the exception's first line, or a mismatch's key numbers."""
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    if isinstance(e, AssertionError) and len(lines) > 1:
        keep = [lines[0]] + [ln for ln in lines[1:] if ln.startswith(("Mismatched", "Greatest", "Expected", "Absolute", "Relative"))]
        line = "; ".join(keep)
    else:
        line = lines[0]
    if not isinstance(e, (Mismatch, AssertionError)):
        line = f"{type(e).__name__}: {line}"
    line = re.sub(r" at 0x[0-9a-f]+", "", line)  # object addresses change from run to run
    return line[:300]


def compare(actual, expected, tol, where: str = "") -> None:
    """Raise Mismatch unless pjrt's `actual` matches CPU's `expected` (structure, devices,
    shapes, dtypes, values)."""
    import torch

    a_leaves, e_leaves = _leaves(actual), _leaves(expected)
    prefix = f"{where}: " if where else ""
    if len(a_leaves) != len(e_leaves):
        raise Mismatch(f"{prefix}structure differs: {len(a_leaves)} outputs vs CPU {len(e_leaves)}")
    from torch.testing._comparison import default_tolerances

    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        atol, rtol = tol
        if isinstance(e, torch.Tensor):  # an integer sample can give a float result: its dtype's defaults
            r, a_ = default_tolerances(e.dtype)
            atol, rtol = max(atol, a_), max(rtol, r)
        label = f"{prefix}output {i}" if len(a_leaves) > 1 else prefix.rstrip(": ") or "output"
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{label}: pjrt returned {type(a).__name__}, CPU a tensor")
            if a.device.type != "pjrt":
                raise Mismatch(f"{label}: result on {a.device}, expected on pjrt")
            if a.dtype != e.dtype:
                raise Mismatch(f"{label}: dtype {a.dtype} vs CPU {e.dtype}")
            if a.shape != e.shape:
                raise Mismatch(f"{label}: shape {list(a.shape)} vs CPU {list(e.shape)}")
            try:
                torch.testing.assert_close(a.detach().cpu(), e.detach(), atol=atol, rtol=rtol, equal_nan=True,
                                           check_device=False, check_stride=False)
            except AssertionError as err:
                raise Mismatch(f"{label}: {_summary(err)}") from None
        elif isinstance(a, torch.Tensor):
            raise Mismatch(f"{label}: pjrt returned a tensor, CPU {type(e).__name__}")
        elif isinstance(e, (int, float, complex)) and not isinstance(e, bool) and isinstance(a, (int, float, complex)):
            try:
                torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True)
            except AssertionError as err:
                raise Mismatch(f"{label}: {_summary(err)}") from None
        elif a != e and not (isinstance(a, float) and isinstance(e, float) and math.isnan(a) and math.isnan(e)):
            raise Mismatch(f"{label}: {a!r} vs CPU {e!r}")


def compare_meta(actual, expected, where: str = "") -> None:
    """Structure, devices, shapes and dtypes only (random ops)."""
    import torch

    a_leaves, e_leaves = _leaves(actual), _leaves(expected)
    if len(a_leaves) != len(e_leaves):
        raise Mismatch(f"{where}structure differs: {len(a_leaves)} outputs vs CPU {len(e_leaves)}")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{where}output {i}: pjrt returned {type(a).__name__}, CPU a tensor")
            if a.device.type != "pjrt":
                raise Mismatch(f"{where}output {i}: result on {a.device}, expected on pjrt")
            if (a.dtype, a.shape) != (e.dtype, e.shape):
                raise Mismatch(f"{where}output {i}: {a.dtype}{list(a.shape)} vs CPU {e.dtype}{list(e.shape)}")


def compare_cpu_exact(a, b) -> None:
    import torch

    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb):
        raise AssertionError("structure")
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, atol=0, rtol=0, equal_nan=True)
        elif x != y and not (isinstance(x, float) and math.isnan(x) and math.isnan(y)):
            raise AssertionError("value")


# ----------------------------------------------------------------------------------------
# The checks. Each takes the op, its samples for one dtype and the tolerance, and returns
# (samples compared, note); it raises Mismatch (fail) or anything else (error). Samples
# CPU itself rejects are not compared; a case where CPU rejects every sample is skipped.
# ----------------------------------------------------------------------------------------

def same_layout_on_pjrt(x):
    """pjrt tensors with exactly the CPU tensors' sizes, strides, offset and storage contents,
    and their aliasing: tensors that share a CPU storage become views of one pjrt storage, and
    the same tensor twice stays one tensor (error inputs test out= overlapping an input)."""
    import torch

    storages: dict = {}
    tensors: dict = {}  # the same tensor twice (out= one of the inputs) stays one tensor

    def rebuild(t):
        if id(t) not in tensors:
            tensors[id(t)] = (t, moved(t))
        return tensors[id(t)][1]

    def moved(t):
        if t.device.type != "cpu":  # an error input about devices (a meta tensor): keep it
            return t
        t = t.detach()
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        key = (t.untyped_storage()._cdata, t.dtype)  # (not data_ptr: empty storages all have 0)
        n = t.untyped_storage().nbytes() // t.element_size()
        if t.numel() and t.storage_offset() + sum((d - 1) * s for d, s in zip(t.shape, t.stride())) >= n:
            return t.to("pjrt")  # a view past its storage's end (an earlier error input resized it)
        if key not in storages:
            flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
            storages[key] = flat.clone().to("pjrt")  # (a copy: the upload must not pin the CPU storage's size)
        return storages[key].as_strided(t.size(), t.stride(), t.storage_offset())
    return _pjrt_devices(_map(rebuild, x))


class Skip(Exception):
    pass


def _call(fn, sample_args):
    inp, args, kwargs = sample_args
    return fn(inp, *args, **kwargs)


def _triple(sample):
    return sample.input, sample.args, sample.kwargs


def _seeded(fn, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    return fn()


# OpInfos whose output values are undefined (uninitialized memory): compared on metadata.
UNDEFINED_VALUES = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
# OpInfos with tensor arguments that the op requires on the CPU (torch's own device tests
# build these samples on the device and keep such arguments on the CPU).
CPU_ARGUMENTS = {"tensor_split"}


class Context:
    """Per-op state shared by the checks of one dtype."""

    def __init__(self, op, dtype, tol, max_samples):
        self.op, self.dtype, self.tol, self.max_samples = op, dtype, tol, max_samples
        self.random = False
        self.meta_only = op.name in UNDEFINED_VALUES

    def move(self, triple, mover):
        """The sample's tensors on pjrt (by `mover`), except arguments the op needs on the CPU."""
        if self.op.name in CPU_ARGUMENTS:
            inp, args, kwargs = triple
            return mover(inp), args, kwargs
        return mover(triple)

    def samples(self, requires_grad=False, keep=None):
        """The OpInfo's sample inputs (seeded), at most max_samples of those `keep` accepts."""
        import torch

        torch.manual_seed(0)
        it = self.op.sample_inputs("cpu", self.dtype, requires_grad=requires_grad)
        if keep is not None:
            it = (s for s in itertools.islice(it, 64) if keep(s))
        return list(itertools.islice(it, self.max_samples)) if self.max_samples else list(it)


def _cpu_reference(ctx, sample, fn=None):
    """CPU result of the op on a fresh copy of the sample (seed 0)."""
    fn = fn or ctx.op
    return _seeded(lambda: sample.output_process_fn_grad(_call(fn, clone_cpu(_triple(sample)))))


def _compare(ctx, actual, expected, where=""):
    if ctx.random or ctx.meta_only:
        compare_meta(actual, expected, where)
    else:
        compare(actual, expected, ctx.tol, where)


def _run_samples(ctx, samples, one):
    """Run `one(sample)` per sample; it returns a reason string when the sample does not
    apply (CPU rejects it, nothing to differentiate, ...)."""
    done, rejected = 0, None
    for i, sample in enumerate(samples):
        try:
            ok = one(sample)
        except Mismatch as e:
            raise Mismatch(f"sample {i}: {e}") from None
        except CaseTimeout:
            raise
        except Exception as e:  # noqa: BLE001
            raise type(e)(f"sample {i}: {e}") if _rebuildable(e) else e
        if isinstance(ok, str):  # the sample does not apply: why
            rejected = rejected or ok
            continue
        done += 1
    if done == 0:
        raise Skip(rejected or "the OpInfo has no sample inputs for this dtype")
    return done


def _rebuildable(e) -> bool:
    try:
        type(e)("x")
        return True
    except Exception:  # noqa: BLE001
        return False


# name: (dim's position in args, index output). kthvalue's index among equal k-th values is
# implementation-defined too (torch's docs; CPU's quickselect picks any of them). msort
# (an unstable sort along dim 0) returns no indices, but its gradient follows them.
TIE_OPS = {"sort": (0, 1), "argsort": (0, 0), "topk": (1, 1), "kthvalue": (1, 1), "msort": (None, None)}


def _unstable_indices(ctx, sample):
    """(dim, which output) when the op returns indices whose order among equal values is
    implementation-defined (unstable sort, topk); else None."""
    spec = TIE_OPS.get(ctx.op.name)
    if spec is None or sample.kwargs.get("stable") or not hasattr(sample.input, "dim") or sample.input.dim() == 0:
        return None
    pos, which = spec
    if pos is None:  # msort
        return 0, None
    args = sample.args
    dim = sample.kwargs.get("dim", args[pos] if len(args) > pos and isinstance(args[pos], int) else -1)
    return dim, which


def _indices_as_values(ctx, sample, actual, expected, moved_input):
    """Replace index outputs by the input values they point at: ties may be ordered either way."""
    spec = _unstable_indices(ctx, sample)
    if spec is None or spec[1] is None:
        return actual, expected
    dim, which = spec

    def values_at(inp, index):
        if index.dim() < inp.dim():  # a reduced dim (kthvalue without keepdim)
            return inp.gather(dim, index.unsqueeze(dim)).squeeze(dim)
        return inp.gather(dim, index)

    def swap(out, inp):
        if isinstance(out, (tuple, list)):
            items = list(out)
            items[which] = values_at(inp, items[which])
            return tuple(items)
        return values_at(inp, out)
    return swap(actual, moved_input), swap(expected, sample.input.detach())


def check_forward(ctx, samples):
    def one(sample):
        try:
            expected = _cpu_reference(ctx, sample)
        except Exception as e:  # noqa: BLE001
            return f"CPU raises on every sample ({_summary(e)})"
        moved = ctx.move(_triple(sample), to_pjrt)
        actual = _seeded(lambda: sample.output_process_fn_grad(_call(ctx.op, moved)))
        actual, expected = _indices_as_values(ctx, sample, actual, expected, moved[0])
        _compare(ctx, actual, expected)
        if ctx.random:  # same seed, same numbers
            again = _seeded(lambda: sample.output_process_fn_grad(_call(ctx.op, ctx.move(_triple(sample), to_pjrt))))
            try:
                compare_cpu_exact(_to_cpu(actual), _to_cpu(again))
            except AssertionError:
                raise Mismatch("random op not reproducible under torch.manual_seed") from None
        return True
    return _run_samples(ctx, samples, one)


def has_noncontiguous(sample) -> bool:
    """Whether the sample's .noncontiguous() version has a noncontiguous tensor at all
    (it leaves 0-d and one-element tensors alone)."""
    import torch

    tensors = _tensors(_triple(sample))
    if any(t.layout != torch.strided for t in tensors):  # sparse inputs have no strides to vary
        return False
    return any(not t.is_contiguous() for t in _tensors(_triple(sample.noncontiguous())))


def check_noncontiguous(ctx, samples):
    if not samples:
        raise Skip("no sample input has a tensor that can be made noncontiguous")

    def one(sample):
        nc = sample.noncontiguous()
        try:
            expected = _cpu_reference(ctx, nc)
        except Exception as e:  # noqa: BLE001
            return f"CPU raises on every noncontiguous sample ({_summary(e)})"
        moved = ctx.move(_triple(nc), same_layout_on_pjrt)
        actual = _seeded(lambda: nc.output_process_fn_grad(_call(ctx.op, moved)))
        actual, expected = _indices_as_values(ctx, nc, actual, expected, moved[0])
        _compare(ctx, actual, expected)
        return True
    return _run_samples(ctx, samples, one)


def _differentiable(outputs) -> list:
    return [t for t in _tensors(outputs) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _grads(op, sample, triple):
    import torch

    outputs = _differentiable(sample.output_process_fn_grad(_call(op, triple)))
    inputs = [t for t in _tensors(triple) if t.requires_grad]
    if not outputs or not inputs:
        return None
    gen = torch.Generator().manual_seed(1234)  # the same weights on both sides

    def weight(o):
        w = torch.rand(o.shape, generator=gen, dtype=torch.float64) * 2 - 1
        if o.is_complex():
            w = torch.complex(w, torch.rand(o.shape, generator=gen, dtype=torch.float64) * 2 - 1)
        return w.to(o.dtype).to(o.device)

    return torch.autograd.grad(outputs, inputs, [weight(o) for o in outputs], allow_unused=True)


def check_gradient(ctx, samples):
    def one(sample):
        if _unstable_indices(ctx, sample) is not None and sample.input.unique().numel() < sample.input.numel():
            return "every sample has ties, whose gradients go to implementation-defined positions (unstable sort)"
        try:
            expected = _seeded(lambda: _grads(ctx.op, sample, clone_cpu(_triple(sample), requires_grad=True)))
        except Exception as e:  # noqa: BLE001
            return f"CPU backward raises on every sample ({_summary(e)})"
        if expected is None:
            return "no sample has a differentiable output"
        actual = _seeded(lambda: _grads(ctx.op, sample, ctx.move(_triple(sample), lambda x: to_pjrt(x, True))))
        if actual is None:
            raise Mismatch("no differentiable output on pjrt")
        actual = [a if a is not None else None for a in actual]
        if [a is None for a in actual] != [e is None for e in expected]:
            raise Mismatch(f"gradients defined for inputs {[a is not None for a in actual]}, "
                           f"CPU {[e is not None for e in expected]}")
        compare(list(actual), list(expected), ctx.tol, "input gradients")
        return True
    return _run_samples(ctx, samples, one)


def _out_like(expected, device, shape_fn):
    import torch

    if isinstance(expected, torch.Tensor):
        return torch.empty(shape_fn(expected.shape), dtype=expected.dtype, device=device)
    return tuple(torch.empty(shape_fn(e.shape), dtype=e.dtype, device=device) for e in expected)


def _wrong_shape(shape):
    return (0,) if tuple(shape) != (0,) else (1,)


def _other_shape(shape):
    return (2, 3) if tuple(shape) != (2, 3) else (3, 2)


def check_out(ctx, samples):
    import torch

    fn = ctx.op.op

    def one(sample):
        try:
            raw = _seeded(lambda: _call(ctx.op, clone_cpu(_triple(sample))))
        except Exception as e:  # noqa: BLE001
            return f"CPU raises on every sample ({_summary(e)})"
        if not (isinstance(raw, torch.Tensor) or (isinstance(raw, (tuple, list)) and raw
                                                   and all(isinstance(t, torch.Tensor) for t in raw))):
            return "the op returns no tensor to write out= into"
        inp, args, kwargs = clone_cpu(_triple(sample))
        try:
            cpu_out = _out_like(raw, "cpu", lambda s: s)
            cpu_ret = _seeded(lambda: fn(inp, *args, **kwargs, out=cpu_out))
        except Exception as e:  # noqa: BLE001
            return f"CPU rejects out= on every sample ({_summary(e)})"
        for what, shape_fn in (("out=", lambda s: s), ("out= resized from empty", _wrong_shape),
                               ("out= resized from a wrong shape", _other_shape)):
            inp, args, kwargs = ctx.move(_triple(sample), to_pjrt)
            out = _out_like(raw, "pjrt", shape_fn)
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    ret = _seeded(lambda: fn(inp, *args, **kwargs, out=out))
                except Exception as e:  # noqa: BLE001
                    raise type(e)(f"{what}: {e}") if _rebuildable(e) else e
            out_v, cpu_v = _indices_as_values(ctx, sample, out, cpu_out, inp)
            # as in the forward check (eigenvectors' signs, SVD's phases): the same function on both
            out_v, cpu_v = sample.output_process_fn_grad(out_v), sample.output_process_fn_grad(cpu_v)
            _compare(ctx, out_v, cpu_v, what)
            if cpu_ret is None:  # a Tensor[] out= (split_with_sizes_copy.out) returns nothing on CPU
                if ret is not None:
                    raise Mismatch(f"{what}: returned a value where CPU returns None")
                continue
            outs = out if isinstance(out, tuple) else (out,)
            rets = ret if isinstance(ret, (tuple, list)) else (ret,)
            if len(rets) != len(outs) or any(r is not o for r, o in zip(rets, outs)):
                raise Mismatch(f"{what}: the returned tensor is not the out= argument")
        return True
    return _run_samples(ctx, samples, one)


def check_inplace(ctx, samples):
    fn = ctx.op.inplace_variant

    def one(sample):
        cpu = clone_cpu(_triple(sample))
        try:
            cpu_ret = _seeded(lambda: _call(fn, cpu))
            cpu_error = None
        except Exception as e:  # noqa: BLE001
            cpu_error = e
        moved = ctx.move(_triple(sample), to_pjrt)
        if cpu_error is not None:
            try:
                _seeded(lambda: _call(fn, moved))
            except Exception:  # noqa: BLE001
                return True  # both reject it
            raise Mismatch(f"CPU raises ({_summary(cpu_error)}) but pjrt accepts the in-place call")
        ret = _seeded(lambda: _call(fn, moved))
        _compare(ctx, moved[0], cpu[0], "self after in-place")
        if cpu_ret is cpu[0] and ret is not moved[0]:
            raise Mismatch("in-place call does not return self")
        return True
    return _run_samples(ctx, samples, one)


# ----------------------------------------------------------------------------------------
# Worker: runs cases and streams them, one JSON line each
# ----------------------------------------------------------------------------------------

def _raised(fn):
    """The exception fn() raises, by the next host sync included; None if none."""
    import torch

    try:
        fn()
        torch.pjrt.synchronize()
    except Exception as e:  # noqa: BLE001
        return e
    return None


FOREIGN = {"jax": "JAX", "jaxlib": "JAX", "numpy": "numpy"}  # exception modules that must never reach a user


def _error_type_name(t) -> str:
    return "/".join(x.__name__ for x in t) if isinstance(t, tuple) else t.__name__


def error_cases(op):
    """(number, check function) for each of the OpInfo's error inputs, generated lazily (as
    PyTorch's test_errors runs them: an input may reuse tensors an earlier call changed): each
    is built for the CPU (where the OpInfo states what CPU raises), run there, then moved to
    pjrt with its layouts and aliasing and run again."""
    import torch

    torch.manual_seed(0)
    for i, expected in enumerate(op.error_inputs("cpu")):
        def one(expected=expected):
            si = expected.sample_input
            moved = same_layout_on_pjrt(_triple(si))  # before the CPU call: out= arguments get written
            cpu_error = _raised(lambda: op(si.input, *si.args, **si.kwargs))
            if cpu_error is None or not isinstance(cpu_error, expected.error_type) or \
                    not re.search(expected.error_regex, str(cpu_error)):
                raise Skip(f"CPU itself does not raise {_error_type_name(expected.error_type)} matching the "
                           f"OpInfo's regex here ({_summary(cpu_error) if cpu_error else 'no error'})")
            error = _raised(lambda: _call(op, moved))
            if error is None:
                raise Mismatch(f"raised nothing; CPU raises {_summary(cpu_error)}")
            if type(error) is not type(cpu_error) or not re.search(expected.error_regex, str(error)):
                origin = type(error).__module__.split(".")[0]
                foreign = f"{FOREIGN[origin]} exception: " if origin in FOREIGN else ""
                raise Mismatch(f"{foreign}raised {_summary(error)}; CPU raises {_summary(cpu_error)} "
                               f"(regex {expected.error_regex!r})")
            return 1
        yield i, one


def _alarm(seconds):
    def handler(signum, frame):
        raise CaseTimeout(f"timed out after {seconds} s")
    signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)


def run_case(emit, key, fn, timeout):
    """Run one case: status, reason, fallback and decomposition diffs, time."""
    import torch_pjrt

    op, dtype, check = key
    emit({"event": "start", "op": op, "dtype": dtype, "check": check})
    fb0, dc0 = torch_pjrt.fallback_ops(), torch_pjrt.decomposed_ops()
    t0 = time.monotonic()
    status, reason, samples = "pass", "", 0
    try:
        if timeout:
            _alarm(timeout)
        try:
            samples = fn()
        finally:
            signal.alarm(0)
    except Skip as e:
        status, reason = "skip", str(e)
    except CaseTimeout as e:
        status, reason = "timeout", str(e)
    except Mismatch as e:
        status, reason = "fail", _summary(e)
    except Exception as e:  # noqa: BLE001
        status, reason = "error", _summary(e)
    fb1, dc1 = torch_pjrt.fallback_ops(), torch_pjrt.decomposed_ops()
    case = {"op": op, "dtype": dtype, "check": check, "status": status, "reason": reason, "samples": samples,
            "fallback": sorted(k for k in fb1 if fb1[k] != fb0.get(k, 0)),
            "decomposed": sorted(k for k in dc1 if dc1[k] != dc0.get(k, 0)),
            "seconds": round(time.monotonic() - t0, 3)}
    emit(case)
    return case


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def run_op(name, op, emit, *, checks=CHECKS, max_samples=0, timeout=120, skip_keys=frozenset(), dtypes=None,
           device_types=("cpu",)):
    """All cases of one OpInfo. `emit` receives event dicts (start markers and cases)."""
    fam = family(op)
    emit({"event": "op", "op": name, "family": fam})
    supported = sorted(op.supported_dtypes("cpu"), key=_dtype_name)
    if dtypes:
        supported = [d for d in supported if _dtype_name(d) in dtypes]

    def skip(dtype, check, reason):
        key = (name, dtype, check)
        if key not in skip_keys:
            emit({"op": name, "dtype": dtype, "check": check, "status": "skip", "reason": reason, "samples": 0,
                  "fallback": [], "decomposed": [], "seconds": 0.0})

    if "errors" in checks:
        run_error_cases(name, op, emit, timeout=timeout, skip_keys=skip_keys)
        checks = [c for c in checks if c != "errors"]
    if not checks:
        return
    if not supported:
        for check in checks:
            skip("-", check, "the OpInfo declares no CPU dtypes")
        return
    backward = set(op.supported_backward_dtypes("cpu")) if op.supports_autograd else set()
    quick = max_samples == 1
    preferred = [d for d in supported if _dtype_name(d) in ("float32", "int64", "float64", "bool")]
    representative = min(preferred, key=lambda d: ("float32", "int64", "float64", "bool").index(_dtype_name(d))) \
        if preferred else supported[0]
    random_op = False
    for dtype in supported:
        dname = _dtype_name(dtype)
        ctx = Context(op, dtype, tolerance(op, dtype, device_types), max_samples)
        ctx.random = random_op or fam == "random"
        cache: dict = {}

        def samples(requires_grad=False, keep=None, ctx=ctx, cache=cache):
            if (requires_grad, keep) not in cache:
                cache[(requires_grad, keep)] = ctx.samples(requires_grad, keep)
            return cache[(requires_grad, keep)]

        plan = []
        one_dtype_only = quick and dtype != representative
        for check in checks:
            if one_dtype_only and check in ("out", "inplace", "noncontiguous"):
                skip(dname, check, f"quick run: out=, in-place and noncontiguous are checked in one dtype per op "
                                   f"({_dtype_name(representative)} here)")
                continue
            if check == "forward":
                plan.append((check, lambda: check_forward(ctx, samples())))
            elif check == "noncontiguous":
                plan.append((check, lambda: check_noncontiguous(ctx, samples(keep=has_noncontiguous))))
            elif check == "gradient":
                if not op.supports_autograd:
                    skip(dname, check, "the OpInfo says the op is not differentiable")
                elif dtype not in backward:
                    skip(dname, check, "no backward for this dtype in the OpInfo")
                else:
                    plan.append((check, lambda: check_gradient(ctx, samples(True))))
            elif check == "out":
                if not op.supports_out:
                    skip(dname, check, "the OpInfo has no out= variant")
                else:
                    plan.append((check, lambda: check_out(ctx, samples())))
            elif check == "inplace":
                if op.inplace_variant is None:
                    skip(dname, check, "the OpInfo has no in-place variant")
                else:
                    plan.append((check, lambda: check_inplace(ctx, samples())))
        for check, fn in plan:
            key = (name, dname, check)
            if key in skip_keys:
                continue
            if check == "gradient" and ctx.random:
                skip(dname, check, "random op: gradients depend on the random draw, not comparable with CPU")
                continue
            run_case(emit, key, fn, timeout)
        random_op = random_op or ctx.random


def run_error_cases(name, op, emit, *, timeout, skip_keys):
    """One case per error input of the OpInfo (one skip when it has none)."""
    def skip(reason):
        emit({"op": name, "dtype": "-", "check": "errors", "status": "skip", "reason": reason, "samples": 0,
              "fallback": [], "decomposed": [], "seconds": 0.0})

    if op.error_inputs_func is None:
        skip(NO_ERROR_INPUTS)
        return

    cases = error_cases(op)
    ran = 0
    while True:
        try:
            i, fn = next(cases)
        except StopIteration:
            break
        except Exception as e:  # noqa: BLE001  (the OpInfo's generator itself failed on the CPU)
            skip(f"error_inputs could not be generated on the CPU: {_summary(e)}")
            break
        ran += 1
        key = (name, f"#{i}", "errors")
        if key not in skip_keys:
            run_case(emit, key, fn, timeout)
    if not ran:
        skip("the OpInfo's error_inputs yield no input for the CPU")


def _worker(args) -> None:
    os.environ.setdefault("TORCH_PJRT_FALLBACK", "silent")
    import warnings

    warnings.simplefilter("ignore")
    import torch  # noqa: F401  (autoloads pjrt)

    import torch_pjrt  # noqa: F401

    todo = json.loads(open(args.worker).read())
    skip_keys = {tuple(k) for k in todo["skip"]}
    with open(todo["results"], "a", buffering=1) as f:
        def emit(record):
            f.write(json.dumps(record) + "\n")
            f.flush()
        opinfos = dict(all_opinfos())
        for name in todo["ops"]:  # in the parent's order
            op = opinfos[name]
            if todo.get("deadline") and time.time() > todo["deadline"]:
                emit({"event": "op", "op": name, "family": family(op)})
                for check in todo["checks"]:
                    emit({"op": name, "dtype": "-", "check": check, "status": "skip",
                          "reason": "not run: the run's time budget (--budget) ran out", "samples": 0,
                          "fallback": [], "decomposed": [], "seconds": 0.0})
            else:
                run_op(name, op, emit, checks=todo["checks"], max_samples=todo["max_samples"],
                       timeout=todo["timeout"], skip_keys=skip_keys, dtypes=todo["dtypes"],
                       device_types=tuple(todo["device_types"]))
            emit({"event": "done", "op": name})


# ----------------------------------------------------------------------------------------
# Parent: worker processes, hang and crash recovery
# ----------------------------------------------------------------------------------------

class Worker:
    def __init__(self, ops, opts, workdir, index):
        self.ops, self.opts, self.index = list(ops), opts, index
        self.results_path = os.path.join(workdir, f"worker{index}.jsonl")
        self.todo_path = os.path.join(workdir, f"worker{index}.todo.json")
        open(self.results_path, "w").close()
        self.offset = 0
        self.records: list = []
        self.done_keys: set = set()
        self.done_ops: set = set()
        self.current = None  # the case in progress (start event)
        self.proc = None
        self.restarts = 0
        self.start()

    def start(self):
        skip = sorted(self.done_keys)
        remaining = [o for o in self.ops if o not in self.done_ops]
        with open(self.todo_path, "w") as f:
            json.dump({"ops": remaining, "skip": [list(k) for k in skip], "results": self.results_path,
                       **self.opts}, f)
        self.proc = subprocess.Popen([sys.executable, "-m", "torch_pjrt.tools.conformance", "--worker",
                                      self.todo_path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.last_progress = time.monotonic()

    def poll(self, hard_timeout, progress):
        with open(self.results_path) as f:
            f.seek(self.offset)
            data = f.read()
        if data:
            complete = data[: data.rfind("\n") + 1]
            self.offset += len(complete)
            for line in complete.splitlines():
                rec = json.loads(line)
                self.last_progress = time.monotonic()
                event = rec.get("event")
                if event == "start":
                    self.current = rec
                elif event == "done":
                    self.done_ops.add(rec["op"])
                    progress(rec["op"])
                elif event is None:
                    self.records.append(rec)
                    self.done_keys.add((rec["op"], rec["dtype"], rec["check"]))
                    self.current = None
                elif event == "op":
                    self.records.append(rec)
        code = self.proc.poll()
        if code is None and time.monotonic() - self.last_progress < hard_timeout:
            return True
        if code is None:  # hung where signal.alarm cannot reach (native code): kill it
            self.proc.kill()
            self.proc.wait()
            status, reason = "timeout", f"no progress for {hard_timeout} s: worker killed"
        elif code == 0:
            return False
        else:
            tail = (self.proc.stderr.read() or b"").decode(errors="replace").strip().splitlines()
            status, reason = "crash", f"worker died (exit {code}): {tail[-1][:200] if tail else 'no message'}"
        if self.current is not None:
            cur = self.current
            key = (cur["op"], cur["dtype"], cur["check"])
            self.records.append({"op": key[0], "dtype": key[1], "check": key[2], "status": status, "reason": reason,
                                 "samples": 0, "fallback": [], "decomposed": [], "seconds": 0.0})
            self.done_keys.add(key)
            self.current = None
        elif code is not None and code != 0:  # died outside a case: drop the op it was on
            pending = [o for o in self.ops if o not in self.done_ops]
            if pending:
                self.records.append({"op": pending[0], "dtype": "-", "check": "forward", "status": "crash",
                                     "reason": reason, "samples": 0, "fallback": [], "decomposed": [],
                                     "seconds": 0.0})
                self.done_ops.add(pending[0])
        self.restarts += 1
        if all(o in self.done_ops for o in self.ops):
            return False
        self.start()
        return True


def run_all(names, opts, jobs=1, hard_timeout=None, verbose=True):
    """Run the named ops in `jobs` worker processes; return the list of case records."""
    hard_timeout = hard_timeout or (opts["timeout"] * 2 + 120)
    workdir = tempfile.mkdtemp(prefix="pjrt-conformance-")
    # A stable pseudo-random order: workers get similar mixes, and a --budget cut leaves
    # out a sample across families rather than the tail of op_db.
    names = sorted(names, key=lambda n: zlib.crc32(n.encode()))
    workers = [Worker(names[i::jobs], opts, workdir, i) for i in range(jobs) if names[i::jobs]]
    done = [0]
    t0 = time.monotonic()

    def progress(op):
        done[0] += 1
        if verbose:
            print(f"[{done[0]}/{len(names)} {time.monotonic() - t0:7.0f}s] {op}", file=sys.stderr, flush=True)

    active = list(workers)
    while active:
        time.sleep(0.5)
        active = [w for w in active if w.poll(hard_timeout, progress)]
    records = [r for w in workers for r in w.records]
    return records


# ----------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------

def is_core_aten(name: str):
    """True/False for an aten overload name such as 'aten.foo.default' (None if unknown)."""
    import torch

    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "aten":
        return None
    packet = getattr(torch.ops.aten, parts[1], None)
    if packet is None:
        return None
    overload = getattr(packet, parts[2] if len(parts) > 2 else "default", None)
    if overload is None:
        return None
    return torch.Tag.core in overload.tags


def normalize_reason(reason: str) -> str:
    """A failure reason without its numbers, shapes and sample indices, for grouping."""
    r = re.sub(r"sample \d+: ", "", reason)
    r = re.sub(r"output \d+: ", "", r)
    r = re.sub(r"(Scalars|Tensor-likes) are not (close|equal)!.*", "values differ", r)
    r = re.sub(r"\[[\d, ]*\]", "[...]", r)
    r = re.sub(r"\(\d+(, ?\d+)*,?\)", "(...)", r)
    r = re.sub(r"torch\.\w+", "DTYPE", r) if "dtype" in r else r
    r = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?%?", "N", r)
    r = r.split("; Mismatched")[0].split("; Greatest")[0]
    return r[:160]


UNSUPPORTED_DTYPE = "is not supported on pjrt devices"


def dtype_class(dtype: str) -> str:
    if dtype.startswith("complex"):
        return "complex"
    if dtype in ("float16", "bfloat16") or dtype.startswith("float8"):
        return "half/bf16"
    if dtype in ("float32", "float64"):
        return "float32/64"
    if dtype == "-":
        return "-"
    return "int/bool"


def _pct(n, d):
    return f"{100.0 * n / d:.1f}%" if d else "n/a"


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def render(records, meta) -> str:
    """docs/conformance.md from case records (deterministic for the same records and meta)."""
    ops_family = {r["op"]: r["family"] for r in records if r.get("event") == "op"}
    cases = sorted((r for r in records if r.get("event") is None),
                   key=lambda r: (r["op"], r["dtype"], CHECKS.index(r["check"]) if r["check"] in CHECKS else 99))
    for c in cases:
        ops_family.setdefault(c["op"], "other")
    by_check = {c: collections.Counter() for c in CHECKS}
    by_family = collections.defaultdict(lambda: {c: collections.Counter() for c in CHECKS})
    for c in cases:
        by_check[c["check"]][c["status"]] += 1
        by_family[ops_family[c["op"]]][c["check"]][c["status"]] += 1

    def rate(counter):
        ran = sum(counter[s] for s in RAN)
        return counter["pass"], ran

    out = []
    w = out.append
    w("# Conformance: pjrt against CPU torch over PyTorch's OpInfo database")
    w("")
    w("Generated by `torch_pjrt/tools/conformance.py`; do not edit by hand.")
    w("")
    w(f"- Date: {meta['date']}")
    w(f"- torch {meta['torch']}, jax {meta['jax']}, torch-pjrt {meta.get('torch_pjrt', '?')}, "
      f"PJRT platform `{meta.get('platform', '?')}`")
    w(f"- Command: `{meta['command']}`")
    if "; then " in meta["command"]:
        w(f"- Merged report: the first command is a full sweep; each later one (`--merge`) reran the OpInfos "
          f"it names and replaced their cases; every other OpInfo's cases come from the run before it")
    w(f"- OpInfos: {len(ops_family)} ({meta.get('source', 'op_db + foreach OpInfo databases')}); "
      f"cases: {len(cases)}; wall time: {meta.get('seconds', 0) / 60:.1f} min")
    samples = meta.get("max_samples") or 0
    w(f"- Sample inputs per case: {'all the OpInfo yields' if not samples else f'the first {samples}'}"
      f" (`op.sample_inputs('cpu', dtype)`, seeded); per-case timeout {meta.get('timeout')} s")
    w("")
    w("How to read this: a case is one (OpInfo, dtype, check). Pass rate = pass / (pass + fail + error + "
      "timeout + crash); skipped cases are listed with their reasons below and count in no rate. "
      "See docs/conformance-notes.md for what each check does.")
    w("")
    w("PyTorch's own device-generic test files (test_torch, test_indexing, nn/test_embedding...) run on pjrt "
      "with `python -m torch_pjrt.tools.pytorch_tests`: the pass rate of each file and what is left are in "
      "docs/conformance-notes.md (\"Where each file stands\").")
    w("")

    # acceptance
    fwd_p, fwd_n = rate(by_check["forward"])
    grd_p, grd_n = rate(by_check["gradient"])
    fallback_ops = collections.defaultdict(set)
    fallback_cases = collections.Counter()
    for c in cases:
        for f in c["fallback"]:
            fallback_ops[f].add(c["op"])
            fallback_cases[f] += 1
    core_fallback = sorted(f for f in fallback_ops if is_core_aten(f))
    w("## Acceptance (issue 3)")
    w("")
    w("| target | measured | met |")
    w("|---|---|---|")
    w(f"| >= 97% of (op, dtype) forward cases pass | {_pct(fwd_p, fwd_n)} ({fwd_p}/{fwd_n}) | "
      f"{'yes' if fwd_n and fwd_p / fwd_n >= 0.97 else 'no'} |")
    w(f"| >= 95% of gradient cases pass | {_pct(grd_p, grd_n)} ({grd_p}/{grd_n}) | "
      f"{'yes' if grd_n and grd_p / grd_n >= 0.95 else 'no'} |")
    w(f"| 0 core ATen ops served by the CPU fallback | {len(core_fallback)} | {'yes' if not core_fallback else 'no'} |")
    w("")
    by_design = collections.Counter(c["check"] for c in cases
                                    if c["status"] == "error" and UNSUPPORTED_DTYPE in c["reason"])
    if by_design:
        kinds = sorted({m.group(1) for c in cases if c["status"] == "error" and UNSUPPORTED_DTYPE in c["reason"]
                        for m in [re.search(r"dtype torch\.(\w+) is not supported", c["reason"])] if m})
        w(f"Of the errors, {sum(by_design.values())} are dtypes pjrt refuses by design with a clear error "
          f"({', '.join(kinds)}: XLA has no such type). They count as failures above; without them the forward "
          f"rate is {_pct(fwd_p, fwd_n - by_design['forward'])} and the gradient rate "
          f"{_pct(grd_p, grd_n - by_design['gradient'])}.")
        w("")

    w("## Pass rate per check")
    w("")
    w("| check | pass | fail | error | timeout | crash | skip | pass rate |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|")
    for check in CHECKS:
        k = by_check[check]
        p, n = rate(k)
        w(f"| {CHECK_TITLES[check]} | {k['pass']} | {k['fail']} | {k['error']} | {k['timeout']} | {k['crash']} | "
          f"{k['skip']} | {_pct(p, n)} |")
    w("")

    w("## Pass rate per op family")
    w("")
    w("Each cell: pass rate (passed/ran).")
    w("")
    w("| family | OpInfos | " + " | ".join(CHECK_TITLES[c] for c in CHECKS) + " |")
    w("|---|---:|" + "---:|" * len(CHECKS))
    fam_ops = collections.Counter(ops_family.values())
    for fam in sorted(by_family, key=lambda f: FAMILIES.index(f) if f in FAMILIES else 99):
        cells = []
        for check in CHECKS:
            p, n = rate(by_family[fam][check])
            cells.append(f"{_pct(p, n)} ({p}/{n})" if n else "-")
        w(f"| {fam} | {fam_ops[fam]} | " + " | ".join(cells) + " |")
    w("")

    if by_check["errors"]:
        out.extend(render_error_inputs(cases))

    failures = [c for c in cases if c["status"] in ("fail", "error", "timeout", "crash")]
    w("## Top failure reasons")
    w("")
    if failures:
        groups = collections.defaultdict(list)
        for c in failures:
            groups[(c["status"], normalize_reason(c["reason"]), dtype_class(c["dtype"]))].append(c)
        w("Grouped by status, reason (numbers, shapes and sample indices elided) and dtype class.")
        w("")
        w("| cases | status | dtypes | reason | OpInfos |")
        w("|---:|---|---|---|---|")
        ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        for (status, reason, kind), cs in ranked[:40]:
            ops = sorted({c["op"] for c in cs})
            shown = ", ".join(f"`{o}`" for o in ops[:10]) + (f" and {len(ops) - 10} more" if len(ops) > 10 else "")
            w(f"| {len(cs)} | {status} | {kind} | {_esc(reason)} | {shown} |")
        if len(ranked) > 40:
            w(f"| ... | | {len(ranked) - 40} more distinct reasons, all listed per op below | |")
    else:
        w("None.")
    w("")

    w("## Ops served by the CPU fallback")
    w("")
    if fallback_ops:
        w("An aten op listed here ran on the CPU (copy to host and back) in at least one case. "
          "Core = `torch.Tag.core` in the overload's tags.")
        w("")
        w("| aten op | core ATen | cases | OpInfos that reached it |")
        w("|---|---|---:|---|")
        for f in sorted(fallback_ops, key=lambda f: (not is_core_aten(f), f)):
            ops = sorted(fallback_ops[f])
            shown = ", ".join(f"`{o}`" for o in ops[:8]) + (f" and {len(ops) - 8} more" if len(ops) > 8 else "")
            w(f"| `{f}` | {'**yes**' if is_core_aten(f) else 'no'} | {fallback_cases[f]} | {shown} |")
    else:
        w("None: no case used the CPU fallback.")
    w("")

    decomposed = collections.defaultdict(set)
    for c in cases:
        for d in c["decomposed"]:
            decomposed[d].add(c["op"])
    w("## Ops run as torch decompositions")
    w("")
    if decomposed:
        w("Not failures: these aten ops have no lowering and ran as torch's decomposition into table ops. "
          "Core ATen ops among them are candidates for a direct lowering.")
        w("")
        w("| aten op | core ATen | OpInfos |")
        w("|---|---|---:|")
        for d in sorted(decomposed, key=lambda d: (not is_core_aten(d), d)):
            w(f"| `{d}` | {'yes' if is_core_aten(d) else 'no'} | {len(decomposed[d])} |")
    else:
        w("None.")
    w("")

    w("## Skipped cases and why")
    w("")
    skips = collections.Counter((c["check"], c["reason"]) for c in cases if c["status"] == "skip")
    if skips:
        w("| check | reason | cases |")
        w("|---|---|---:|")
        for (check, reason), n in sorted(skips.items(), key=lambda kv: (CHECKS.index(kv[0][0]), -kv[1], kv[0][1])):
            w(f"| {CHECK_TITLES[check]} | {_esc(normalize_reason(reason) if reason.startswith('sample') else reason)} "
              f"| {n} |")
    else:
        w("None.")
    w("")

    refused = [c for c in failures if c["status"] == "error" and UNSUPPORTED_DTYPE in c["reason"]]
    if refused:
        w("## Cases in dtypes pjrt refuses by design")
        w("")
        w(f"These errors all read `TypeError: pjrt: dtype ... {UNSUPPORTED_DTYPE} (JAX/XLA has no such type)`.")
        w("")
        w("| dtype | check | cases | OpInfos |")
        w("|---|---|---:|---|")
        table = collections.defaultdict(set)
        for c in refused:
            table[(c["dtype"], c["check"])].add(c["op"])
        for (dtype, check), ops in sorted(table.items(), key=lambda kv: (kv[0][0], CHECKS.index(kv[0][1]))):
            w(f"| {dtype} | {CHECK_TITLES[check]} | {len(ops)} | {', '.join(f'`{o}`' for o in sorted(ops))} |")
        w("")

    w("## Every failure, by op")
    w("")
    if refused:
        w("(Cases in dtypes pjrt refuses by design are in the table above, not repeated here.)")
        w("")
    if not failures:
        w("None.")
    by_op = collections.defaultdict(list)
    for c in failures:
        if not (c["status"] == "error" and UNSUPPORTED_DTYPE in c["reason"]):
            by_op[c["op"]].append(c)
    for op in sorted(by_op):
        w(f"### `{op}` ({ops_family[op]})")
        w("")
        w("| check | status | dtypes | reason |")
        w("|---|---|---|---|")
        merged = collections.defaultdict(list)
        for c in by_op[op]:
            merged[(c["check"], c["status"], c["reason"])].append(c["dtype"])
        for (check, status, reason), dts in sorted(merged.items(), key=lambda kv: (CHECKS.index(kv[0][0]), kv[0])):
            w(f"| {CHECK_TITLES[check]} | {status} | {', '.join(dts)} | {_esc(reason)} |")
        w("")
    return "\n".join(out).rstrip() + "\n"


ERROR_INPUTS_TITLE = "## Error inputs"
NO_ERROR_INPUTS = "the OpInfo has no error_inputs"


def render_error_inputs(cases) -> list[str]:
    """The error-inputs section: rate, exceptions from JAX or numpy, every case that did not pass."""
    errors = [c for c in cases if c["check"] == "errors"]
    ran = [c for c in errors if c["status"] in RAN]
    passed = sum(c["status"] == "pass" for c in ran)
    foreign = [c for c in ran if any(c["reason"].startswith(f"{name} exception") for name in set(FOREIGN.values()))]
    crashes = [c for c in ran if c["status"] == "crash"]
    ops = sorted({c["op"] for c in errors})
    out = [ERROR_INPUTS_TITLE, "",
           "PyTorch's own bad inputs: every `error_inputs` entry of the OpInfos above, run on pjrt. A case passes when "
           "pjrt raises the exception type CPU raises, with a message matching the OpInfo's regex, by the next host "
           "sync. Error inputs that CPU itself does not raise as the OpInfo says are skipped (listed below).", "",
           "| target | measured | met |", "|---|---|---|",
           f"| >= 98% of error-input cases raise what CPU raises | {_pct(passed, len(ran))} ({passed}/{len(ran)}, "
           f"{len(ops)} OpInfos) | {'yes' if ran and passed >= 0.98 * len(ran) else 'no'} |",
           f"| 0 JAX or numpy exceptions reach the user | {len(foreign)} | {'yes' if not foreign else 'no'} |",
           f"| 0 crashes | {len(crashes)} | {'yes' if not crashes else 'no'} |", ""]
    without = [c for c in errors if c["status"] == "skip" and c["reason"] == NO_ERROR_INPUTS]
    if without:
        out += [f"{len(without)} OpInfos have no error_inputs (listed as skips in the table of skipped cases).", ""]
    missed = [c for c in errors if c["status"] != "pass" and c not in without]
    if missed:
        out += ["| OpInfo | error input | status | reason |", "|---|---|---|---|"]
        for c in sorted(missed, key=lambda c: (c["status"] == "skip", c["op"], c["dtype"])):
            out.append(f"| `{c['op']}` | {c['dtype']} | {c['status']} | {_esc(c['reason'])} |")
        out.append("")
    return out


def splice_section(report: str, section: str, title: str) -> str:
    """`report` with its `title` section replaced by `section` (added before the per-check table if absent)."""
    lines = report.splitlines()
    if title in lines:
        start = lines.index(title)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = section.rstrip().splitlines() + [""]
    else:
        at = next((i for i, ln in enumerate(lines) if ln == "## Pass rate per check"), len(lines))
        lines[at:at] = section.rstrip().splitlines() + [""]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------

def _select(all_names, spec):
    if not spec:
        return list(all_names)
    wanted = [s.strip() for s in spec.split(",") if s.strip()]

    def selects(w, name):
        base = name.split("#")[0]
        return base == w or base.startswith(w + ".")

    chosen = [n for n in all_names if any(selects(w, n) for w in wanted)]
    missing = [w for w in wanted if not any(selects(w, n) for n in all_names)]
    if missing:
        raise SystemExit(f"conformance: no OpInfo named {', '.join(missing)}")
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_pjrt.tools.conformance", description=__doc__.split("\n")[0])
    parser.add_argument("--ops", help="comma-separated OpInfo names (a name also selects its variants)")
    parser.add_argument("--out", help="write the Markdown report here (e.g. docs/conformance.md)")
    parser.add_argument("--json", help="write every case record here")
    parser.add_argument("--quick", action="store_true", help="one sample input per case (same as --max-samples 1)")
    parser.add_argument("--max-samples", type=int, default=0, help="at most N sample inputs per case (0: all)")
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"subset of {','.join(CHECKS)}")
    parser.add_argument("--dtypes", help="only these dtypes (e.g. float32,int64)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per case before it is recorded as timeout")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--budget", type=float, default=0,
                        help="minutes; ops not started by then are recorded as skipped (not run)")
    parser.add_argument("--from-json", help="render the report from a previous --json file without running")
    parser.add_argument("--merge", help="a previous --json file: rerun only --ops and replace their cases in it")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0

    import jax
    import torch

    import torch_pjrt

    if args.from_json:
        data = json.load(open(args.from_json))
        records, meta = data["records"], data["meta"]
    else:
        names = _select([n for n, _ in all_opinfos()], args.ops)
        checks = [c.strip() for c in args.checks.split(",") if c.strip()]
        bad = [c for c in checks if c not in CHECKS]
        if bad:
            raise SystemExit(f"conformance: unknown check(s) {bad}; choose from {CHECKS}")
        max_samples = 1 if args.quick else args.max_samples
        platform = jax.default_backend()
        opts = {"checks": checks, "max_samples": max_samples, "timeout": args.timeout,
                "dtypes": [d.strip() for d in args.dtypes.split(",")] if args.dtypes else None,
                "device_types": ["cpu"] if platform == "cpu" else ["cpu", "cuda"],
                "deadline": time.time() + 60 * args.budget if args.budget else None}
        t0 = time.monotonic()
        records = run_all(names, opts, jobs=max(1, args.jobs))
        meta = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                "jax": jax.__version__, "torch_pjrt": torch_pjrt.__version__, "platform": platform,
                "command": "python -m torch_pjrt.tools.conformance " + " ".join(argv if argv is not None
                                                                                else sys.argv[1:]),
                "seconds": round(time.monotonic() - t0, 1), "max_samples": max_samples, "timeout": args.timeout,
                "load": round(os.getloadavg()[0], 1)}
        if args.merge:
            old = json.load(open(args.merge))
            rerun = set(names)
            records = [r for r in old["records"] if r["op"] not in rerun] + records
            first = old["meta"]["date"].split(";")[0]
            meta = dict(old["meta"], command=old["meta"]["command"] + "; then " + meta["command"],
                        date=f"{first}; reruns merged until {meta['date']}",
                        seconds=old["meta"].get("seconds", 0) + meta["seconds"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "records": records}, f, indent=0)
    report = render(records, meta)
    if args.out:
        checks_run = {r["check"] for r in records if r.get("event") is None}
        if checks_run == {"errors"} and os.path.exists(args.out) and not args.from_json:
            # an error-inputs sweep updates its section of an existing full report
            errors = [r for r in records if r.get("event") is None]
            section = "\n".join(render_error_inputs(errors)) + (
                f"\nMeasured {meta['date']} with `{meta['command']}` ({meta['seconds'] / 60:.1f} min, load "
                f"average {meta.get('load', '?')} at the end).\n")
            report = splice_section(open(args.out).read(), section, ERROR_INPUTS_TITLE)
        with open(args.out, "w") as f:
            f.write(report)
    cases = [r for r in records if r.get("event") is None]
    counts = collections.Counter((r["check"], r["status"]) for r in cases)
    for check in CHECKS:
        ran = sum(counts[(check, s)] for s in RAN)
        if ran or counts[(check, "skip")]:
            print(f"{CHECK_TITLES[check]:>14}: {_pct(counts[(check, 'pass')], ran):>6} "
                  f"({counts[(check, 'pass')]}/{ran}), skipped {counts[(check, 'skip')]}")
    for c in cases:
        if c["status"] not in ("pass", "skip"):
            print(f"  {c['status']:7} {c['op']} {c['dtype']} {c['check']}: {c['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
