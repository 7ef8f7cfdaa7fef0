"""Errors are torch's: a failed pjrt op raises what CPU torch raises for the same call.

Two mechanisms, neither on the per-call fast path:
- Detection when an eager executable is traced (once per op and signature): the op's meta
  kernel runs on meta tensors of the call's shapes and dtypes, with its static arguments, so
  calls that JAX would accept but torch rejects (layer_norm's normalized_shape, embedding's
  1-D weight, exponential_'s lambda) fail instead of computing something.
- The oracle, when a call failed (the meta check, JAX's TypeError for mismatched shapes,
  numpy's ValueError for an empty reduction, a check of our own): the call runs again on CPU
  copies of its arguments, and CPU torch decides. If CPU raises, that exception is raised
  (type and message); if CPU accepts a call the meta check rejected, the meta check was wrong
  (a Scalar argument's placeholder value, a meta kernel stricter than CPU's): it is turned off
  for that op and the call runs; if CPU accepts a call the lowering failed on, the lowering
  has a bug, and the error says so, naming the op, the arguments' devices, shapes and dtypes,
  with the lowering's exception as the cause.
Writes (`check_writes`): out= calls, and in-place writes whose target may overlap an argument,
ask the out/in-place overload's meta kernel and, for overlaps (which CPU kernels check
themselves), CPU, before anything is written.
"""
from __future__ import annotations

import json
import pathlib
import warnings

import numpy as np
import torch
import torch.utils._pytree as pytree

from ..runtime import fused, platform, storage
from ..dtypes import to_torch
from ..ops.registry import Split
from ..ops.signature import SCALAR, SCALAR_LIST, TENSOR, TENSOR_LIST, Signature

# Failures that are about the device, not the call: re-running on the CPU would not say more.
_DEVICE_ERRORS = (torch.OutOfMemoryError, MemoryError)


class MetaRejected(Exception):
    """The meta kernel rejected a call while its executable was traced (carries meta's error, and
    the call's kind: what a later verdict of CPU's on the call is kept for)."""

    def __init__(self, error: BaseException, kind: tuple | None = None):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error, self.kind = error, kind


class DtypeRefused(MetaRejected):
    """The call dispatches on a dtype CPU torch has no kernel of this op for
    (ops/cpu_refused_dtypes.json; see `dispatch_dtype`): CPU's own call decides what to raise."""

    def __init__(self, op, dtype: torch.dtype, from_argument: bool, empty: bool = False, choices: tuple = ()):
        super().__init__(NotImplementedError(f"{op_label(op)}: no CPU kernel for {dtype}"))
        self.op, self.dtype, self.from_argument, self.empty, self.choices = op, dtype, from_argument, empty, choices

    def forget(self) -> None:
        """CPU accepted the call after all (its dtype is not the one its kernel dispatches on:
        cumsum of a bool tensor computes in int64). Only calls whose dtype comes from the same
        place are let through from now on: cumsum(dtype=torch.bool) is still asked. A call with an
        empty tensor speaks only for such calls: CPU returns before its dtype dispatch (mm of a
        bool [0, 2] matrix), and its bool mm of 2 x 2 still refuses. A call's string arguments choose
        CPU's kernel: scatter_reduce of bools with reduce="sum" speaks for "sum" only ("mean" refuses)."""
        _DTYPE_ACCEPTED.add((self.op, self.dtype, self.from_argument, self.empty, self.choices))


class MixedDtypesRefused(MetaRejected):
    """The tensors of a call of an op that is not elementwise hold several dtypes (index tensors
    and boolean masks aside): many of CPU's kernels refuse that (layer_norm's float64 or int64
    weight over float32 input, index_add's source, cdist, grid_sample) where torch's meta kernels
    accept it, so CPU's own call decides, once per op and combination of dtypes (an elementwise op
    promotes them: never asked)."""

    def __init__(self, op, dtypes: tuple, empty: bool = False, choices: tuple = ()):
        super().__init__(RuntimeError(f"{op_label(op)}: operands of the dtypes {', '.join(map(str, dict.fromkeys(dtypes)))}"))
        self.op, self.dtypes, self.empty, self.choices = op, dtypes, empty, choices

    def forget(self) -> None:
        """CPU accepted the combination: it is not asked again (for calls with an empty tensor, only
        for such calls, and for the same string arguments, as DtypeRefused.forget)."""
        _MIXED_ACCEPTED.add((self.op, self.dtypes, self.empty, self.choices))


def _choices(values) -> tuple:
    """A call's string arguments (scatter_reduce's reduce, div's rounding_mode, gelu's approximate):
    they choose which of CPU's kernels runs, and so whether it accepts a dtype."""
    return tuple(v for v in values if isinstance(v, str))


# (op, dtypes of its tensors, whether one is empty, string arguments) CPU accepted though they mix dtypes (see MixedDtypesRefused)
_MIXED_ACCEPTED: set = set()


def check_mixed_dtypes(op, sig, values) -> None:
    """Raise MixedDtypesRefused where the call's tensors (arrays, storage views or torch tensors)
    hold two dtypes or more, indices and masks aside, `op` is not elementwise, and CPU has not
    accepted that combination yet. (A boolean weight or source counts: CPU's layer_norm and
    index_add refuse it.)"""
    if torch.Tag.pointwise in op.tags:
        return
    dtypes = _dtypes(_operands(sig, values))
    # keyed by each operand's dtype in order: CPU accepting index_put's float32 values over float32
    # self says nothing of int64 values
    if len(set(dtypes)) > 1:
        empty, choices = _any_empty(_operands(sig, values)), _choices(values)
        if (op, dtypes, empty, choices) not in _MIXED_ACCEPTED:
            raise MixedDtypesRefused(op, dtypes, empty, choices)


def _any_empty(tensors) -> bool:
    """Whether one of the tensors (arrays, storage views, torch tensors) has no elements."""
    for v in tensors:
        geometry = getattr(v, "geometry", None)
        shape = geometry.size if geometry is not None else getattr(v, "shape", None)
        if shape is not None and 0 in tuple(shape):
            return True
    return False


def _operands(sig, values):
    """The call's tensors, those of tensor lists included, but indices and masks (arguments named
    so: gather's index, embedding's indices, index_put's masks, scaled_dot_product_attention's
    attn_mask), whose dtypes are checked where they are used."""
    for name, kind, v in zip(sig.names, sig.kinds, values):
        if "mask" in name or name in _INDEX_ARGUMENTS:
            continue
        yield from (v if kind == TENSOR_LIST and isinstance(v, (list, tuple)) else [v] if kind == TENSOR else ())


_INDEX_ARGUMENTS = {"index", "indices", "offsets"}


def _dtypes(tensors) -> tuple:
    return tuple(d for d in map(_dtype_of, tensors) if d is not None)


def _cpu_refused() -> dict:
    path = pathlib.Path(__file__).resolve().parents[1] / "ops" / "cpu_refused_dtypes.json"
    table = json.loads(path.read_text())["refused"]
    return {op: {getattr(torch, d[len("torch."):]) for d in dtypes} for op, dtypes in table.items()}


# aten overload name -> dispatch dtypes CPU has no kernel for (tools/cpu_dtypes.py)
_CPU_REFUSED: dict = _cpu_refused()
# (op, dtype, from its dtype argument, whether a tensor is empty, string arguments) CPU accepted though the table lists the dtype
# (DtypeRefused.forget)
_DTYPE_ACCEPTED: set = set()


def refused_dtypes(op) -> set:
    """The dispatch dtypes CPU and CUDA have no kernel of `op` for."""
    return _CPU_REFUSED.setdefault(str(op), set())


def _dtype_of(v) -> torch.dtype | None:
    """The torch dtype of an operand: an array, a storage view or a torch tensor (None: no tensor)."""
    geometry = getattr(v, "geometry", None)
    dtype = geometry.dtype if geometry is not None else getattr(v, "dtype", None)
    return dtype if dtype is None or isinstance(dtype, torch.dtype) else to_torch(dtype)


def dispatch_dtype(names, kinds, values) -> tuple[torch.dtype | None, bool]:
    """(the dtype a CPU kernel of the call dispatches on, whether it is the call's `dtype`
    argument): that argument where given (arange(dtype=torch.bool), cumsum(x, dtype=torch.bool)),
    else the first tensor's (an array, a storage view or a torch tensor). tools/cpu_dtypes.py
    builds the table by the same rule."""
    for name, v in zip(names, values):
        if name == "dtype" and isinstance(v, torch.dtype):
            return v, True
    for kind, v in zip(kinds, values):
        if kind == TENSOR_LIST and isinstance(v, (list, tuple)) and v:
            v = v[0]
        elif kind != TENSOR:
            continue
        dtype = _dtype_of(v)
        if dtype is not None:
            return dtype, False
    return None, False


def check_dtype_on_cpu(op, sig, values, refused: set | None = None) -> None:
    """Raise DtypeRefused where the call's dispatch dtype is listed for `op` and CPU has not
    accepted such a call yet."""
    refused = refused_dtypes(op) if refused is None else refused
    if not refused:
        return
    dtype, from_argument = dispatch_dtype(sig.names, sig.kinds, values)
    if dtype in refused:
        empty = _any_empty(v for kind, v in zip(sig.kinds, values) if kind == TENSOR) or any(
            _any_empty(v) for kind, v in zip(sig.kinds, values) if kind == TENSOR_LIST and isinstance(v, (list, tuple)))
        choices = _choices(values)
        if (op, dtype, from_argument, empty, choices) not in _DTYPE_ACCEPTED:
            raise DtypeRefused(op, dtype, from_argument, empty, choices)


# (op, call kind) whose meta check rejected a call that CPU accepts: such calls trace unchecked. Kept
# per kind of call, not per op: one call meta refuses wrongly (a complex value with no imaginary
# part) must not turn the op's checks off for every other call (a uint8 mask) in the process.
_META_UNRELIABLE: set = set()
_NUMBER_KINDS = {bool: "b", int: "i", float: "f", complex: "c"}
_WEAK_KINDS = {"b": "b", "u": "i", "i": "i", "f": "f", "c": "c"}


def _call_kind(values) -> tuple:
    """A traced call's arguments as its meta verdict depends on them, static values aside: each
    tensor's dtype and shape, each traced Python number's kind, lists item by item. (An executable
    traced unchecked is kept in the executable store: only calls CPU accepted may be traced so.)"""
    return tuple(_kind_of(v) for v in values)


def _kind_of(v):
    if isinstance(v, (list, tuple)):
        return tuple(_kind_of(x) for x in v)
    number = _NUMBER_KINDS.get(type(v))
    if number is not None:
        return number
    geometry = getattr(v, "geometry", None)
    dtype = geometry.dtype if geometry is not None else getattr(v, "dtype", None)
    if dtype is None:
        return None  # a static value
    if getattr(getattr(v, "aval", None), "weak_type", False):  # a Python number, traced
        return _WEAK_KINDS.get(np.dtype(dtype).kind)
    shape = geometry.size if geometry is not None else v.shape
    return str(dtype if isinstance(dtype, torch.dtype) else to_torch(dtype)), tuple(shape)
# A failure of the meta machinery rather than a verdict on the call (an op without a meta kernel raises
# NotImplementedError: _run_meta asks CPU for its layout); the exceptions torch's checks raise.
_NO_VERDICT = torch._subclasses.fake_tensor.DataDependentOutputException
_VERDICTS = (RuntimeError, ValueError, IndexError, TypeError, AssertionError)


def meta_check(lowering, sig, values, concrete=None):
    """Raise MetaRejected if torch's meta kernel refuses a call of these shapes, strides, dtypes
    and static arguments (runs at trace time; values may be storage views). Returns the meta
    kernel's outputs (None where it gave no verdict), whose strides the eager outputs follow.
    `concrete`: {position: value} of the traced call's `traced=` arguments, where known; else
    a neutral value stands in (the entry's `in_range` is what checks their values)."""
    op = lowering.op
    replaying = fused.replaying()  # a recorded call: accepted already, only its layout is wanted
    if not replaying:
        check_dtype_on_cpu(op, sig, values)
        check_mixed_dtypes(op, sig, values)
    kind = _call_kind(values)
    if (op, kind) in _META_UNRELIABLE:
        return None
    metas = meta_values(lowering, sig, values, concrete)
    outputs, refusal = _run_meta(op, *sig.split(metas))
    if refusal is not None and not replaying:  # the oracle decides what to raise
        raise MetaRejected(refusal, kind) from None
    return in_memory_format(lowering, metas, outputs)


def in_memory_format(lowering, values: list, outputs):
    """`outputs` (meta tensors) with the first laid out in the entry's `output_memory_format` of
    `values`, where it has one (CPU's kernels follow a channels_last input; torch's meta kernels
    do not)."""
    if lowering is None or lowering.output_memory_format is None or outputs is None:
        return outputs
    fmt = lowering.output_memory_format(values)
    if isinstance(outputs, torch.Tensor):
        return outputs.contiguous(memory_format=fmt)
    if isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        return type(outputs)([outputs[0].contiguous(memory_format=fmt), *outputs[1:]])
    return outputs


def _run_meta(op, pos: list, kw: dict):
    """(meta outputs, None); (None, the exception of the meta kernel's refusal); or (None, None)
    where the meta machinery gave no verdict (no meta kernel, data-dependent, its own bug)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return op(*pos, **kw), None
    except NotImplementedError:  # no meta kernel (geqrf...): CPU's layout, from a run on zeros
        return _cpu_layout(op, pos, kw), None
    except _NO_VERDICT:
        return None, None
    except _VERDICTS as e:
        if "meta tensor" in str(e) or "meta device" in str(e):  # e.g. .item() inside a decomposition
            return None, None
        return None, e
    except Exception:  # noqa: BLE001  (a meta kernel's own bug, e.g. AttributeError)
        return None, None


# The most elements a CPU stand-in run (_cpu_layout) computes over; past it, outputs stay row-major.
STAND_IN_ELEMENTS = 1 << 20


def _cpu_layout(op, pos: list, kw: dict):
    """For an op torch gives no meta kernel: its outputs as meta tensors with the sizes and strides
    CPU torch gives them, found by running CPU's kernel on zeros laid out as the meta inputs
    (geqrf's reflectors are column-major on CPU). Only a layout: a refusal on zeros says nothing
    of the real values, so any exception is no verdict (None), as is a call too large to run here."""
    metas = [t for t in pytree.tree_leaves((pos, kw)) if isinstance(t, torch.Tensor)]
    if sum(t.numel() for t in metas) > STAND_IN_ELEMENTS:
        return None

    def on_cpu(v):
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype).zero_()
        return torch.device("cpu") if isinstance(v, torch.device) else v

    def as_meta(v):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outputs = op(*pytree.tree_map(on_cpu, pos), **pytree.tree_map(on_cpu, kw))
    except Exception:  # noqa: BLE001  (zeros stand in for the values: no verdict on the call)
        return None
    return pytree.tree_map(as_meta, outputs)


def meta_values(lowering, sig, values, concrete=None) -> list:
    """A call's prepared values (arrays, Pendings, storage views, static arguments) as the op's
    meta kernel takes them, in schema order (see meta_check for `concrete`)."""
    concrete = concrete or {}
    return [concrete[i] if i in concrete else _as_meta(name, SCALAR if name in lowering.traced else kind, v)
            for i, (name, kind, v) in enumerate(zip(sig.names, sig.kinds, values))]


def _as_meta(name, kind, v):
    if type(v) is Split:  # a split argument (its value is in `concrete` where known): a neutral value
        return _as_meta(name, SCALAR, v.value)
    if isinstance(v, (list, tuple)):
        return [_as_meta(name, kind, x) for x in v]
    if name == "generator":
        return None
    if isinstance(v, torch.device) or name == "device":
        return torch.device("meta")
    geometry = getattr(v, "geometry", None)
    if geometry is not None:  # a storage view: the meta tensor gets its sizes and strides
        return torch.empty_strided(geometry.size, geometry.stride, dtype=to_torch(geometry.dtype), device="meta")
    shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
    if shape is None or dtype is None:
        return v  # a static Python value: the meta kernel sees what the lowering sees
    if kind in (SCALAR, SCALAR_LIST):  # a traced Scalar: its value is unknown here, a neutral one stands in
        return {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1.0 + 0j}.get(np.dtype(dtype).kind, 1)
    return torch.empty(tuple(shape), dtype=to_torch(dtype), device="meta")


def op_label(op) -> str:
    return f"{op._schema.name}.{op._overloadname}" if op._overloadname != "default" else op._schema.name


def cpu_error(op, args: tuple, kwargs: dict) -> BaseException | None:
    """The exception CPU torch raises for this call, or None if CPU accepts it."""
    if len(args) > Signature.of(op).kwarg_only.count(False):
        # the dispatcher passes keyword-only arguments by position (cumsum_'s dtype): as the schema says
        args, kwargs = Signature.of(op).split(Signature.of(op).bind(args, kwargs))
    try:
        # read without a host sync's side effect: queued index errors stay queued for the user's sync
        twins = _Twins(lambda flat: storage.from_numpy(np.asarray(storage.read(flat))), "cpu")
        cpu_args = [twins(a) for a in args]
        cpu_kwargs = {k: twins(v) for k, v in kwargs.items()}
    except Exception:  # noqa: BLE001  (the arguments cannot be read back: no oracle)
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*cpu_args, **cpu_kwargs)
    except NotImplementedError as e:
        # an op without a CPU kernel (CUDA-only, or an operator for privateuse1 backends): no oracle
        if "from the 'CPU' backend" in str(e) or "operator for privateuse1 backends" in str(e):
            return None
        e.__traceback__ = None
        return e
    except Exception as e:  # noqa: BLE001  (whatever CPU raises is the expected error)
        e.__traceback__ = None
        return e
    return None


def as_torch_error(op, args: tuple, kwargs: dict, error: Exception) -> BaseException | None:
    """What to raise when the pjrt kernel of `op` failed with `error` for (args, kwargs);
    None when the call should run again (a meta check CPU disagrees with, now turned off)."""
    if isinstance(error, _DEVICE_ERRORS) or fused.interruption(error):  # (a signal handler's timeout: no op's error)
        return error
    device_error = platform.torch_error(error)
    if device_error is not error:  # XLA's out of memory: torch.OutOfMemoryError
        return device_error
    if getattr(error, "pjrt_refusal", False):  # registry.refusal: the op's answer, without running CPU's kernel
        return error
    expected = cpu_error(op, args, kwargs)
    if expected is not None:
        return expected
    if isinstance(error, (DtypeRefused, MixedDtypesRefused)):
        error.forget()
        return None
    if isinstance(error, MetaRejected):
        _META_UNRELIABLE.add((op, error.kind))
        return None
    if isinstance(error, (RuntimeError, IndexError)) and not _from_jax(error):
        return error  # a pjrt-specific refusal of our own (an unsupported dtype, ...): already clear
    described = ", ".join(_describe(a) for a in (*args, *kwargs.values()) if _describe(a))
    wrapped = RuntimeError(f"{op_label(op)}: the pjrt lowering failed for ({described}) although CPU torch accepts "
                           f"the same call; please report it. {type(error).__name__}: {error}")
    wrapped.__cause__ = error
    return wrapped


def _from_jax(error: BaseException) -> bool:
    return type(error).__module__.split(".")[0] in ("jax", "jaxlib", "numpy")


class _Twins:
    """Arguments with pjrt tensors replaced by twins on another device that keep their
    layouts and aliasing: tensors sharing a pjrt storage become views of one twin storage
    (out= overlapping an input must be seen as such). `flat_twin(flat)` makes a storage's twin."""

    def __init__(self, flat_twin, device: str):
        self.flat_twin, self.device, self.storages, self.tensors = flat_twin, device, {}, {}

    def __call__(self, x):
        if isinstance(x, torch.Tensor) and x.device.type == "pjrt":
            if id(x) in self.tensors:  # the same tensor twice (out= one of the inputs) stays one tensor
                return self.tensors[id(x)][1]
            key = (x.untyped_storage()._cdata, x.dtype)  # (not data_ptr: empty storages all have 0)
            if key not in self.storages:
                n = x.untyped_storage().nbytes() // x.element_size()
                flat = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage(), 0, (n,), (1,))
                self.storages[key] = self.flat_twin(flat)
            twin = self.storages[key].as_strided(x.size(), x.stride(), x.storage_offset())
            self.tensors[id(x)] = (x, twin)  # (x kept alive: its id stays its own)
            return twin
        if isinstance(x, (list, tuple)):
            return type(x)(self(v) for v in x)
        if isinstance(x, torch.device) and x.type == "pjrt":
            return torch.device(self.device)
        if isinstance(x, torch.Generator):
            return None  # other devices' kernels refuse a pjrt generator; the error does not depend on it
        return x


def check_writes(op, args: tuple, kwargs: dict, written: list) -> None:
    """Before an out= or in-place call writes `written`: raise what CPU raises for their dtypes,
    shapes and overlaps. The meta kernel of the same overload (on meta tensors with the
    arguments' layouts) detects dtype and shape refusals; overlaps, which CPU kernels check
    themselves, are looked for only where a written tensor may overlap. CPU torch decides the
    exception (where CPU accepts the call, meta was stricter: the call goes on)."""
    sig = Signature.of(op)
    args, kwargs = sig.split(sig.bind(args, kwargs))  # the C++ kernels pass keyword-only ones by position
    twins = _Twins(lambda flat: torch.empty(flat.shape, dtype=flat.dtype, device="meta"), "meta")
    outs = {sig.names[i] for i in sig.written if sig.kwarg_only[i]}
    inputs = {t.untyped_storage().data_ptr() for t in _tensors([*args, *(v for k, v in kwargs.items() if k not in outs)])}
    # an out= sharing an input's memory keeps its twin: the meta kernel's overlap check needs it
    _, refusal = _run_meta(op, [twins(a) for a in args],
                           {k: _emptied(twins(v)) if k in outs and not any(
                               t.untyped_storage().data_ptr() in inputs for t in _tensors([v])) else twins(v)
                            for k, v in kwargs.items()})
    overlaps = {overlap(t, args, kwargs) for t in written}
    if refusal is None and "partial" not in overlaps and ("same" not in overlaps or op in _SAME_TENSOR_OK):
        return
    expected = cpu_error(op, args, kwargs)
    if expected is not None:
        raise expected from None
    if refusal is None and "same" in overlaps and overlaps <= {None, "same"}:
        _SAME_TENSOR_OK.add(op)  # (x.add_(x), add(x, y, out=x): CPU allows it, so ask it once per op)


def _tensors(values) -> list:
    """The tensors among `values` and in their lists."""
    found = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(t for t in v if isinstance(t, torch.Tensor))
    return found


def _emptied(out):
    """An out= tensor's meta twin as an empty tensor of its dtype. A non-empty out= of another
    shape makes torch's resize_output warn in C++, where Python's catch_warnings cannot hold it:
    the warning reached the user after the call, beside the one eager's store gives (three
    warnings for linalg.cholesky(out=) where CPU gives one). Resizing, and its warning, are the
    store's; an out kernel that refuses another shape outright is asked of CPU (a refusal here)."""
    if isinstance(out, (list, tuple)):
        return type(out)(_emptied(t) for t in out)
    if isinstance(out, torch.Tensor) and out.numel() != 0:
        return torch.empty((0,), dtype=out.dtype, device="meta")
    return out


def raise_as_cpu(op, args: tuple, kwargs: dict) -> None:
    """Raise what CPU raises for this call, if it raises."""
    expected = cpu_error(op, args, kwargs)
    if expected is not None:
        raise expected from None


# Ops CPU lets write into a tensor that is also one of their inputs (elementwise ops do; cat,
# index_select and friends refuse): learned from CPU the first time.
_SAME_TENSOR_OK: set = set()


def may_overlap(op, target: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """Cheap test before an in-place write: must `check_writes` look at the overlaps?"""
    kind = overlap(target, args, kwargs)
    return kind == "partial" or (kind == "same" and op not in _SAME_TENSOR_OK)


def overlap(target: torch.Tensor, args: tuple, kwargs: dict) -> str | None:
    """How the written `target` overlaps itself or the call's other arguments: None, "same"
    (another argument is exactly the same view) or "partial" (anything else that may share
    elements, as far as cheap arithmetic on the layouts can tell)."""
    if may_overlap_itself(target):
        return "partial"
    ptr, span = target.untyped_storage().data_ptr(), _span(target)
    others = _tensors([*args, *kwargs.values()])
    mine = next((i for i, a in enumerate(others) if a is target), None)  # the written argument itself
    kind = None
    for i, a in enumerate(others):
        if i == mine or a.device != target.device or a.untyped_storage().data_ptr() != ptr:
            continue
        if a.shape == target.shape and a.stride() == target.stride() and \
                a.storage_offset() == target.storage_offset():
            kind = "same"
            continue
        other = _span(a)
        if other[0] < span[1] and span[0] < other[1] or not (a.numel() and target.numel()):
            return "partial"  # element ranges intersect (or an empty tensor on the storage: CPU decides)
    return kind


def may_overlap_itself(t: torch.Tensor) -> bool:
    """Whether two of t's elements may be one memory location. torch's own test
    (`_debug_has_internal_overlap`) answers "too hard" for every non-contiguous layout, which sent
    each in-place write through a transposed or strided view to CPU's oracle (a host read of its
    storages per call). A layout is free of overlap when, its dims ordered by stride, each stride
    passes the extent of the smaller ones; an interleaved layout that fails this stays "may"."""
    if t.numel() <= 1:
        return False
    extent = 0  # the last offset the dims of smaller stride reach
    for stride, size in sorted((abs(s), n) for n, s in zip(t.shape, t.stride()) if n != 1):
        if stride <= extent:
            return True
        extent += (size - 1) * stride
    return False


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte of the storage that `t` can touch."""
    if t.numel() == 0:
        return (0, 0)
    last = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    start = t.storage_offset() * t.element_size()
    return start, start + (last + 1) * t.element_size()


def _describe(a) -> str:
    if isinstance(a, torch.Tensor):
        return f"{a.device} {str(a.dtype).removeprefix('torch.')}{list(a.shape)}"
    if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
        return "[" + ", ".join(_describe(x) for x in a) + "]"
    return ""
