"""Ops the table lacks: torch's decomposition if it has one, else a loud CPU fallback.

The CPU fallback copies pjrt arguments to the host, runs the CPU kernel, writes back
every argument the op mutates and uploads the results. It is correct but slow, so it
warns once per op, counts every use (`torch_pjrt.fallback_ops()`), and
TORCH_PJRT_FALLBACK=error turns it into an error (=silent drops the warning).
"""
from __future__ import annotations

import collections
import os
import warnings

import torch

from ..ops.registry import LOWERINGS
from ..ops.signature import Signature
from ..runtime import storage
from . import decomposed, paths
from .errors import op_label

_counts: collections.Counter = collections.Counter()
_decomposed: collections.Counter = collections.Counter()
_decomposing: set = set()


def mode() -> str:
    value = os.environ.get("TORCH_PJRT_FALLBACK", "warn").lower()
    if value not in ("warn", "error", "silent"):
        raise ValueError(f"TORCH_PJRT_FALLBACK must be warn, error or silent, not {value!r}")
    return value


def fallback_ops() -> dict[str, int]:
    """{op name: calls} of ops that ran on the CPU because the pjrt op table lacks them."""
    return dict(_counts)


def decomposed_ops() -> dict[str, int]:
    """{op name: calls} of ops that ran as torch's decomposition into table ops."""
    return dict(_decomposed)


def _is_pjrt(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "pjrt"


def _mixed_dtypes_as_cpu(op, args, kwargs) -> None:
    """A decomposition traces into the graph interpreter, past the eager kernels' checks: tensors of
    two dtypes (native_batch_norm's float64 or int64 weight over float32 input) let CPU decide here,
    once per op and combination, as an eager kernel's trace does (errors.MixedDtypesRefused)."""
    dtypes = {t.dtype for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)}
    if len(dtypes) < 2:  # the common case, without binding the call (tensor lists: checked below)
        if not any(isinstance(a, (list, tuple)) for a in args):
            return
    from .errors import MixedDtypesRefused, as_torch_error, check_mixed_dtypes

    sig = Signature.of(op)
    try:
        check_mixed_dtypes(op, sig, sig.bind(args, kwargs))
    except MixedDtypesRefused as refused:
        error = as_torch_error(op, args, kwargs, refused)  # None: CPU accepts, and is not asked again
        if error is not None:
            raise error from error.__cause__


def _dispatch_dtype_as_cpu(op, args, kwargs) -> None:
    """The decomposed op's own dtypes CPU has no kernel for (ops/cpu_refused_dtypes.json) let CPU
    decide here, as an eager kernel's trace does (errors.DtypeRefused): the table ops a decomposition
    reaches are not the ones CPU's call passes through (native_batch_norm decomposes into
    _native_batch_norm_legit.no_stats, which the table learned nothing of), so their own entries do not
    stand in for it."""
    from .errors import DtypeRefused, as_torch_error, check_dtype_on_cpu, refused_dtypes

    refused = refused_dtypes(op)
    if not refused:
        return
    if args and isinstance(args[0], torch.Tensor) and args[0].dtype not in refused and not any(
            isinstance(v, torch.dtype) for v in (*args, *kwargs.values())):
        return  # the common case (a first tensor of a dtype CPU computes, no dtype argument), without binding
    sig = Signature.of(op)
    try:
        check_dtype_on_cpu(op, sig, sig.bind(args, kwargs), refused)
    except DtypeRefused as e:
        error = as_torch_error(op, args, kwargs, e)  # None: CPU accepts, and is not asked again
        if error is not None:
            raise error from error.__cause__


# (op, its tensors' dtypes and dtype arguments) of out= calls whose out dtype CPU accepted, not asked again
_OUT_DTYPES_CPU_ACCEPTS: set = set()


def _out_dtype_as_cpu(op, args, kwargs) -> None:
    """A decomposition casts its result into an out= tensor of another dtype where `can_cast`
    allows (torch._refs' out wrapper); CPU's kernels have rules of their own (conj_physical wants
    out's exact dtype, "Found dtype Double but expected Float"). An out= call with an out of
    another dtype than its first tensor lets CPU decide first, once per op and dtypes."""
    sig = Signature.of(op)
    if not sig.written or not args or not isinstance(args[0], torch.Tensor):
        return
    values = sig.bind(args, kwargs)
    if all(t.dtype == args[0].dtype for t in _tensors_in([values[i] for i in sig.written])):
        return
    key = (op, tuple(t.dtype for t in _tensors_in(values)), tuple(v for v in values if isinstance(v, torch.dtype)))
    if key in _OUT_DTYPES_CPU_ACCEPTS:
        return
    from .errors import raise_as_cpu

    raise_as_cpu(op, args, kwargs)
    _OUT_DTYPES_CPU_ACCEPTS.add(key)


def _tensors_in(values) -> list:
    out = []
    for v in values:
        out.extend(t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor))
    return out


def run(op, *args, **kwargs):
    """The boxed PrivateUse1 fallback: every op without a pjrt kernel lands here."""
    paths.entered(op_label(op))
    name = str(op)
    from torch._decomp import decomposition_table  # imported on first use: it costs 0.3 s

    entry = LOWERINGS.get(op)  # an entry may name what eager runs instead of torch's decomposition
    decomposition = (entry.decomposition if entry is not None else None) or decomposition_table.get(op)
    if decomposition is not None and op not in _decomposing:  # some decompositions reach their own op again
        _dispatch_dtype_as_cpu(op, args, kwargs)
        _mixed_dtypes_as_cpu(op, args, kwargs)
        _out_dtype_as_cpu(op, args, kwargs)
        _decomposed[name] += 1
        _decomposing.add(op)
        try:
            result = decomposed.run(op, decomposition, args, kwargs)  # one executable per signature
            if result is not decomposed.NOT_TRACED:
                return result
            return decomposition(*args, **kwargs)  # op by op
        except Exception as e:  # noqa: BLE001  (a decomposition's own checks are not always CPU's)
            from .errors import as_torch_error

            error = as_torch_error(op, args, kwargs, e)
            if error is e or error is None:
                raise
            raise error from error.__cause__
        finally:
            _decomposing.discard(op)
    how = mode()
    devices = sorted({str(x.device) for x in flat_arguments(args, kwargs) if isinstance(x, torch.Tensor)})
    if how == "error":
        raise NotImplementedError(
            f"pjrt: {name} has no pjrt lowering (devices: {', '.join(devices)}) and TORCH_PJRT_FALLBACK=error "
            f"forbids running it on the CPU"
        )
    if any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns):
        raise NotImplementedError(f"pjrt: view op {name} has no pjrt kernel; a CPU copy would break aliasing")
    result = _on_cpu(op, args, kwargs)  # counted and warned about once it ran (not when it raised)
    if _counts[name] == 0 and how == "warn":
        warnings.warn(
            f"pjrt: {name} has no pjrt lowering and runs on the CPU (slow: copies to host and back). "
            f"See torch_pjrt.fallback_ops(); TORCH_PJRT_FALLBACK=error makes this an error.",
            stacklevel=2,
        )
    _counts[name] += 1
    return result


# Layouts and dtypes pjrt storages cannot hold. A pjrt storage is one dense JAX array, so
# torch's quantized dtypes (quint8, qint8, qint32, quint4x2, quint2x4: a tensor plus a
# quantizer) and compressed sparse layouts (CSR/CSC/BSR/BSC) have no pjrt form; a COO tensor
# is indices and values as two dense pjrt tensors, with kernels for the ops sparse gradients
# need (eager/sparse.py, runtime/csrc/sparse.cpp). The dispatch keys (SparsePrivateUse1,
# SparseCsrPrivateUse1, QuantizedPrivateUse1) get a fallback that raises these errors for
# every other op, as does a CPU fallback whose result has such a layout or dtype.
# NotImplementedError, the type torch raises for a kernel a backend lacks.
SPARSE_KEYS = ("SparsePrivateUse1", "SparseCsrPrivateUse1")
QUANTIZED_KEY = "QuantizedPrivateUse1"


def sparse_unsupported(name: str, devices=()) -> NotImplementedError:
    where = f" (devices: {', '.join(devices)})" if devices else ""
    return NotImplementedError(
        f"pjrt: {name}: no pjrt kernel for sparse tensors{where}. On pjrt a torch.sparse_coo tensor supports "
        f"creation, .to()/.cpu(), coalesce, to_dense, add/sub (into dense or sparse), sparse_mask, index_select, "
        f"sparse @ dense (mm, addmm), neg, mul (by a scalar, a sparse or a dense tensor) and div by a scalar: "
        f"what the sparse gradients of nn.Embedding and "
        f"nn.EmbeddingBag(sparse=True) need with SGD, Adagrad and SparseAdam (docs/training.md, 'Sparse "
        f"gradients'); sparse_csr, sparse_csc, sparse_bsr and sparse_bsc tensors are not supported. Use "
        f"x.to_dense() on pjrt, or keep the sparse tensor on the CPU.")


def quantized_unsupported(name: str, devices=(), dtype=None) -> NotImplementedError:
    where = ", ".join(([f"dtype {dtype}"] if dtype is not None else []) + list(devices))
    return NotImplementedError(
        f"pjrt: {name}: quantized tensors (torch.quint8, qint8, qint32, quint4x2, quint2x4) are not supported on "
        f"pjrt devices{f' ({where})' if where else ''}. Keep quantized values as plain int8/uint8 tensors with "
        f"float scales (as torchao's int8 schemes store them; those are ordinary pjrt tensors), or quantize on the "
        f"CPU and move q.dequantize() (or q.int_repr()) to pjrt.")


def _tensor_devices(args, kwargs) -> list[str]:
    """The devices of a call's tensors and device arguments (pjrt without an index: the current one)."""
    found = {str(x.device) for x in flat_arguments(args, kwargs) if isinstance(x, torch.Tensor)}
    for x in flat_arguments(args, kwargs):
        if isinstance(x, torch.device) and x.type == "pjrt":
            found.add(str(x) if x.index is not None else f"pjrt:{torch.pjrt.current_device()}")
    return sorted(found)


def refuse_sparse(op, *args, **kwargs):
    """The boxed fallback of the sparse pjrt dispatch keys: every op reaching one raises."""
    raise sparse_unsupported(str(op), _tensor_devices(args, kwargs))


def refuse_quantized(op, *args, **kwargs):
    """The boxed fallback of QuantizedPrivateUse1: every op reaching it raises."""
    dtype = kwargs.get("dtype")
    dtype = dtype if isinstance(dtype, torch.dtype) else next(
        (x.dtype for x in flat_arguments(args, kwargs) if isinstance(x, torch.Tensor) and x.is_quantized), None)
    raise quantized_unsupported(str(op), _tensor_devices(args, kwargs), dtype)


def _check_holdable(name: str, result, devices) -> None:
    """A CPU result pjrt cannot hold (sparse, quantized) raises instead of failing in the upload."""
    results = result if isinstance(result, (list, tuple)) else [result]
    for r in results:
        if isinstance(r, torch.Tensor):
            if r.layout != torch.strided:
                raise sparse_unsupported(name, devices)
            if r.is_quantized:
                raise quantized_unsupported(name, devices, r.dtype)


def flat_arguments(args, kwargs):
    """Every argument of a call, with lists and tuples opened one level."""
    for x in list(args) + list(kwargs.values()):
        if isinstance(x, (list, tuple)):
            yield from x
        else:
            yield x


def _written(op, args, kwargs, cpu_args, cpu_kwargs):
    """(pjrt tensor, its CPU twin) for every argument the schema marks as written."""
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if i < len(args):
            original, twin = args[i], cpu_args[i]
        else:
            original, twin = kwargs.get(arg.name), cpu_kwargs.get(arg.name)
        pairs = zip(original, twin) if isinstance(original, (list, tuple)) else [(original, twin)]
        yield from ((o, t) for o, t in pairs if _is_pjrt(o))


def _on_cpu(op, args, kwargs):
    device = next((x.get_device() for x in flat_arguments(args, kwargs) if _is_pjrt(x)), None)
    if device is None:  # a factory: the device argument says where
        where = next((x for x in flat_arguments(args, kwargs) if isinstance(x, torch.device) and x.type == "pjrt"), None)
        device = where.index if where is not None and where.index is not None else torch.pjrt.current_device()
    twins: dict[int, torch.Tensor] = {}  # id(cpu twin) -> pjrt original
    cpu_args = [_to_cpu(a, twins) for a in args]
    cpu_kwargs = {k: _to_cpu(v, twins) for k, v in kwargs.items()}
    result = op(*cpu_args, **cpu_kwargs)
    _check_holdable(str(op), result, [f"pjrt:{device}"])
    for original, twin in _written(op, args, kwargs, cpu_args, cpu_kwargs):  # write back what the op mutated
        if tuple(original.shape) != tuple(twin.shape):
            original.resize_(twin.shape)
        storage.write(original, storage.upload(twin, original.get_device()))
    return _to_device(result, twins, device)


# (module-level, not closures: a recursive closure is a reference cycle that would keep
# the call's tensors alive until the next garbage collection)
def _to_cpu(x, twins: dict):
    if _is_pjrt(x):
        twin = storage.download(x)
        twins[id(twin)] = x
        return twin
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v, twins) for v in x)
    if isinstance(x, torch.device) and x.type == "pjrt":
        return torch.device("cpu")
    return x


def _to_device(r, twins: dict, device: int):
    if isinstance(r, torch.Tensor):
        if id(r) in twins:  # the op returned a mutated argument: return the pjrt original
            return twins[id(r)]
        return storage.wrap(storage.upload(r, device), device) if r.device.type == "cpu" else r
    if isinstance(r, (list, tuple)):
        return type(r)(_to_device(v, twins, device) for v in r)
    return r
