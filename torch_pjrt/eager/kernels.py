"""Layer 4a: eager kernels on PrivateUse1, generated from the op table.

For every lowering the table holds, this module registers a kernel for the functional
overload and derives the in-place (`op_`) and `out=` overloads from it. A kernel binds
the dispatcher's arguments to the schema, checks devices as CUDA does, reads tensors
as JAX arrays (storage.read), calls the op's cached executable and wraps the results
(or writes them back for in-place and out= overloads). In fused mode (runtime/fused.py) the
call is recorded instead, and the results are pending values.

Ops the table lacks go to `fallback.py` (decomposition, else a loud CPU fallback).
"""
from __future__ import annotations

import functools
import types
import os
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..runtime import default_dtype, executable_budget, fused, index_checks as bounds, platform, storage
from ..runtime.fused import Pending, Recordable

from . import errors, paths, stats
from ..runtime.build import load as _load_runtime
from ..dtypes import TORCH_TO_JAX, c10_name, to_jax, to_torch
from ..ops.call import OpCall, weak_scalar
from ..ops.elementwise import NO_COMPLEX_IN_PLACE
from ..ops.growth import Growth, PaddedOperand
from ..ops.registry import LOWERINGS, Lowering
from ..ops.signature import TENSOR_LIST, Signature

aten = torch.ops.aten
_rt = _load_runtime()


class DeviceMismatch(RuntimeError):
    pass


def _device_index(device) -> int:
    if device is None:
        return _rt.current_device()
    device = torch.device(device)
    # checked before anything is recorded: a region of a device that does not exist would fail
    # the next call instead, with JAX's IndexError
    return _rt.current_device() if device.index is None else _rt.checked_device(device.index)


def _mismatch(op, a: str, b: str, arg: str):
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}! "
        f"(when checking argument '{arg}' in {errors.op_label(op)})"
    )


def _operand(op, arg: str, t: torch.Tensor, device: int | None):
    """(JAX value of tensor argument t, the call's device), checking devices as CUDA does."""
    index = t.get_device()
    if index >= 0:
        if device is None or index == device:
            return storage.read_lazily(t), index
        _mismatch(op, f"pjrt:{device}", f"pjrt:{index}", arg)
    if t.dim() == 0 and t.is_cpu:  # CPU scalars mix with device tensors, as with CUDA
        if _rt.is_wrapped_number(t):
            return weak_scalar(t.item()), device  # a Python number the arg parser wrapped: promotes as a Scalar
        return jax.device_put(np.asarray(t.item(), dtype=to_jax(t.dtype))), device  # a transfer (see storage.offset_operand)
    _mismatch(op, f"pjrt:{device if device is not None else _rt.current_device()}", str(t.device), arg)


def _wrap(result, device: int):
    if isinstance(result, (jax.Array, Pending, storage.Permuted, storage.Padded)):
        return storage.wrap(result, device)
    if isinstance(result, (tuple, list)):
        return type(result)(_wrap(r, device) for r in result)
    return result


class SignatureTraits(NamedTuple):
    """What a C++ kernel needs besides the call itself, the same for every call of one signature
    (shapes, dtypes, view geometry, static arguments): the recorder asks once (Recordable.describe)."""

    checks: tuple  # (exception factory, op) per index probe (index_checks.errors_of)
    appends: bool  # the result is an append's exact result: its storage grows if appended to again
    ints: tuple  # the op's int returns, in order (from its meta kernel)
    # a call over padded operands (ops/growth.py): how much longer than them its padded result is
    # (an append onto a KV cache: the new piece's length; 0 for an exact result, attention over the
    # cache); None where the C++ kernel leaves such calls to the Python kernel
    grows_by: int | None = None


def _storable(lowering: Lowering) -> bool:
    """Whether the executables of this table entry may be kept on disk (runtime/executable_store.py):
    an aten or prims op lowered by this package's own function, which its source fixes (a custom
    kernel's lowering is a method that runs the user's code; collectives close over a group)."""
    fn = lowering.fn
    return (lowering.op.namespace in ("aten", "prims") and type(fn) is types.FunctionType
            and fn.__module__.startswith(("torch_pjrt.ops.", "torch_pjrt.kernels.sdpa")))


class Kernel:
    """The PrivateUse1 kernel of one functional overload."""

    def __init__(self, lowering: Lowering):
        self.op = lowering.op
        self.lowering = lowering
        self.call = call = OpCall.of(lowering)
        self.sig = call.sig
        self.executable = call.executable(traced=_traced_call)
        self.refused_dtypes = errors.refused_dtypes(self.op)  # see errors.check_dtype_on_cpu
        if not lowering.jit:  # a data-dependent op runs untraced: its dtype checks here
            self.executable = functools.partial(_dtype_checked, self, self.executable)
        self.index_probes = lowering.index_probes
        # int returns (SDPA's max_q, max_k): an executable's outputs are arrays, and torch would
        # read each back with .item(), a host sync; the op's meta kernel gives them on the host
        self.int_returns = [i for i, r in enumerate(self.op._schema.returns) if str(r.type) in ("int", "SymInt")]
        self._int_values: dict = {}  # the arguments' geometry -> the int returns (see int_values)
        # a kernel whose C++ path needs more than the call: SignatureTraits per signature
        self.described = bool(self.index_probes is not None or lowering.grows is not None or self.int_returns)
        describe = self.describe if self.described else None
        key = str(self.op) if _storable(lowering) else None
        loaded = functools.partial(stats.traced, call.op, call.sig.names)  # a stored executable counts as traced
        self.run = Recordable(self.executable, call.static, name=errors.op_label(self.op), jit=lowering.jit,
                              describe=describe, key=key, loaded=loaded)
        # an indexing op's bounds checks run in its own call (runtime/index_checks.py)
        self.checked = None if self.index_probes is None else Recordable(
            _checked_executable(call, self.executable), call.static, name=errors.op_label(self.op),
            jit=lowering.jit, describe=lambda values: describe(values[:-1]),  # the seen flag comes last
            key=key and f"{key} (checked)", loaded=loaded)
        self.device_arg = call.sig.names.index("device") if "device" in call.sig.names else None
        self.host_indices = lowering.host_indices
        self.in_range = _in_range(self.op, lowering)

    def describe(self, values) -> SignatureTraits:
        """The traits of a call of the op's executable on prepared `values` (see SignatureTraits)."""
        values = list(values[:len(self.sig.names)])
        padded = [place for place in _places(values) if isinstance(_at(values, place), PaddedOperand)]
        if padded:
            return self._describe_padded(values, padded)
        checks = bounds.errors_of(self.index_probes, self.op, values) if self.index_probes is not None else ()
        growth = self.lowering.grows(values) if self.lowering.grows is not None else None
        ints = self.int_values(*self.sig.split(errors.meta_values(self.lowering, self.sig, values))) \
            if self.int_returns else ()
        return SignatureTraits(checks, growth is not None and growth.length is not None, tuple(ints))

    def _describe_padded(self, values: list, padded: list) -> SignatureTraits:
        """The traits of a call whose operands at `padded` are PaddedOperands (their shapes are their
        capacities), served in C++ where _run_padded would make the same call: the entry's rule
        names those operands and axis, and either one operand grows (grows_by: by how much) or the
        result is exact (grows_by 0: attention over a cache), its int returns constant or the
        operands' length (None in `ints`, the C++ kernel puts the call's length there)."""
        refused = SignatureTraits((), False, (), None)
        growth = self.lowering.grows(values)
        operands = [_at(values, place) for place in padded]
        if (self.index_probes is not None or growth is None or list(growth.operands) != padded
                or any(o.axis != growth.axis for o in operands)):
            return refused
        if growth.length is not None:
            if len(operands) != 1 or self.int_returns:
                return refused
            return SignatureTraits((), False, (), growth.length - operands[0].shape[growth.axis])
        capacity = operands[0].shape[growth.axis]
        if not self.int_returns:
            return SignatureTraits((), False, (), 0)
        if capacity < 2:
            return refused
        # the int returns at two lengths: the ones that follow the length are the length
        at = [self._padded_ints(values, padded, growth.axis, length) for length in (capacity, capacity - 1)]
        if at[0] is None or at[1] is None:
            return refused
        ints = []
        for a, b in zip(*at):
            if a == b:
                ints.append(a)
            elif (a, b) == (capacity, capacity - 1):
                ints.append(None)
            else:
                return refused
        return SignatureTraits((), False, tuple(ints), 0)

    def _padded_ints(self, values: list, padded: list, axis: int, length: int) -> tuple | None:
        """The int returns of the call with its padded operands `length` long (the meta kernel's)."""
        exact = list(values)
        for place in padded:
            operand = _at(exact, place)
            shape = list(operand.shape)
            shape[axis] = length
            _put(exact, place, jax.ShapeDtypeStruct(tuple(shape), operand.dtype))
        try:
            return tuple(self.int_values(*self.sig.split(errors.meta_values(self.lowering, self.sig, exact))))
        except Exception:  # noqa: BLE001  (the Python kernel serves what the meta kernel refuses)
            return None

    def compute(self, args: tuple, kwargs: dict, grow: bool = False, refusals: int = 0):
        """(raw JAX result, device index, whether it is an append's exact result) for a dispatcher
        call. grow: the result may be a storage.Padded (a functional call of an op whose entry
        grows: ops/growth.py), and an exact append says so."""
        if self.in_range is not None:  # traced arguments' values: checked here, CPU torch names the error
            values = self.sig.bind(args, kwargs)
            if not self.in_range(values):
                errors.raise_as_cpu(self.op, *self.sig.split(values))
        queue = bounds.mark() if self.index_probes is not None else None
        try:
            if self.refused_dtypes:
                errors.check_dtype_on_cpu(self.op, self.sig, self.sig.bind(args, kwargs), self.refused_dtypes)
            return self._compute(args, kwargs, grow)
        except Exception as e:  # noqa: BLE001  (only the failure path pays: see errors.py)
            if queue is not None:
                bounds.forget_since(queue)  # this call's own index checks go with its error
            error = errors.as_torch_error(self.op, *self.sig.split(self.sig.bind(args, kwargs)), e)
            if error is None and refusals < 3:  # CPU accepts what a check refused, off for such calls now:
                return self.compute(args, kwargs, refusals=refusals + 1)  # again (another check may refuse too)
            if error is None or error is e:
                raise
            raise error from error.__cause__

    def _compute(self, args: tuple, kwargs: dict, grow: bool = False):
        call = self.call
        values = call.bind(args, kwargs)
        operands = list(values) if self.lowering.grows is not None else None  # the tensors, for _run_padded
        # a factory's device argument, where given, says where the result goes; else its operands do
        requested = values[self.device_arg] if self.device_arg is not None else None
        device = _device_index(requested) if requested is not None else None
        names, op = self.sig.names, self.op
        for i in call.tensors:
            t = values[i]
            if isinstance(t, torch.Tensor):
                index = t.get_device()
                buf = storage.whole_buffer(t) if index >= 0 and (device is None or index == device) else None
                if buf is not None:  # the hot path: a pjrt tensor that is exactly its buffer
                    values[i], device = buf, index
                elif index >= 0 and requested is not None:
                    # zeros_like(x, device="pjrt:1") with x on pjrt:0: the device argument says
                    # where the result goes, x gives its shape (CUDA's *_like allow it too)
                    values[i] = storage.read_lazily(t.to(torch.device("pjrt", device)))
                else:
                    values[i], device = _operand(op, names[i], t, device)
        for i in call.tensor_lists:
            if values[i] is not None:
                arrays = []
                for t in values[i]:
                    if isinstance(t, torch.Tensor):
                        if self.host_indices and t.device.type == "cpu" and device is not None:
                            t = t.to(torch.device("pjrt", device))  # CPU index tensors are fine, as with CUDA
                        t, device = _operand(op, names[i], t, device)
                    arrays.append(t)
                values[i] = arrays
        if device is None:
            device = _rt.current_device()
        if call.traced_static:  # the values the meta check sees if this call traces an executable
            _concrete[call] = {i: values[i] for i in call.traced_static}
        seed = None
        if call.random:
            generator = values[call.generator] if call.generator is not None else None
            seed = np.uint64(_rt.next_seed(generator, device))
        growth = self.lowering.grows(values) if self.lowering.grows is not None else None
        padded = growth is not None and _run_padded(self.op, growth, values, operands, grow)
        call.prepare(values, seed)
        if device != 0 and not (call.tensors or call.tensor_lists):  # factories say where; computations follow inputs
            return self.run.on(device, tuple(values)), device, False
        if self.checked is not None:  # out-of-range indices raise as on the CPU (XLA would clamp)
            return bounds.run_checked(self.checked, self.index_probes, op, values, device), device, False
        result = self.run(*values)
        appended = False
        if growth is not None and growth.length is not None and grow:
            if padded:
                result = storage.Padded(result.array, result.axis, growth.length)
            else:
                appended = type(result) in _VALUES
        return result, device, appended

    def __call__(self, *args, **kwargs):
        result, device, appended = self.compute(args, kwargs, grow=True)
        if type(result) in _VALUES:  # the common case, without isinstance's ABC machinery
            tensor = storage.wrap(result, device)
            if appended:
                _rt.set_appended(tensor)
            return tensor
        if self.int_returns:
            result = list(result)
            for i, value in zip(self.int_returns, self.int_values(args, kwargs)):
                result[i] = value
        return _wrap(result, device)

    def int_values(self, args: tuple, kwargs: dict) -> tuple:
        """The int returns, from the op's meta kernel. A meta kernel sees only what _as_meta
        keeps (geometry, dtypes, the other arguments), so they are cached by that: SDPA's meta
        kernel costs more than the rest of an eager SDPA call."""
        try:
            key = _geometry((args, kwargs))
            values = self._int_values.get(key)
        except TypeError:  # an unhashable argument: no cache
            key, values = None, None
        if values is None:
            args, kwargs = self.sig.split(self.sig.bind(args, kwargs))  # the C++ kernel passes keywords by position
            on_host = self.op(*_as_meta(args), **_as_meta(kwargs))
            values = tuple(on_host[i] for i in self.int_returns)
            if key is not None:
                if len(self._int_values) > 1024:
                    self._int_values.clear()
                self._int_values[key] = values
        return values


def _checked_executable(call: OpCall, executable):
    """The op's executable with its index checks folded in (index_checks.folded), jitted like it."""
    lowering = call.lowering
    if lowering.grows is not None:
        raise TypeError(f"{call.op}: an op whose storage grows cannot check indices (its entry says both)")
    checked = bounds.folded(executable, lowering.index_probes)
    return jax.jit(checked, static_argnums=call.static, keep_unused=True) if lowering.jit else checked


def _geometry(values):
    """What _as_meta keeps of `values`, as a hashable key (numbers by type too: 1, 1.0 and True differ)."""
    if isinstance(values, torch.Tensor):
        return values.shape, values.stride(), values.dtype
    if isinstance(values, dict):
        return tuple((k, _geometry(v)) for k, v in values.items())
    if isinstance(values, (list, tuple)):
        return type(values), tuple(_geometry(v) for v in values)
    return type(values), values


def _as_meta(values):
    """Tensors as meta tensors of the same geometry (the rest as is), for an op's meta kernel."""
    if isinstance(values, torch.Tensor):
        return torch.empty_strided(values.shape, values.stride(), dtype=values.dtype, device="meta")
    if isinstance(values, dict):
        return {k: _as_meta(v) for k, v in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(_as_meta(v) for v in values)
    return values



# ------------------------------------------------------------------ growing storages
# The exact result of an append flags its storage (the runtime's Holder::appended): appended to again, it grows.


def _run_padded(op, growth: Growth, values: list, operands: list, grow: bool) -> bool:
    """Give the growing operands to the lowering as PaddedOperands (in `values`); False when
    this call runs at exact sizes. An append onto the result of an append (a cache's second
    token) starts padding, so every pass of a loop builds the same executables. `operands`:
    the call's arguments before they became values (the tensors)."""
    current = [_at(values, place) for place in growth.operands]
    if growth.length is None:  # padded operands in, an exact result out (attention over a cache)
        if not all(isinstance(v, storage.Padded) and v.axis == growth.axis for v in current) or \
                len({(v.length, v.capacity) for v in current}) != 1:
            return False
    else:
        if not grow or len(current) != 1:
            return False
        (base,) = current
        capacity = storage.capacity_for(growth.length)
        if isinstance(base, storage.Padded) and base.axis == growth.axis:
            base = base.grown(capacity)
        elif type(base) in _VALUES and _rt.appended(_at(operands, growth.operands[0])):
            base = storage.Padded.of(base, growth.axis, capacity)
        else:
            return False
        current = [base]
    for place, v in zip(growth.operands, current):
        _put(values, place, PaddedOperand(v.array, v.axis, storage.offset_operand(v.length)))
    return True


def _places(values: list):
    """(argument position, list position or None) of every operand in `values`, as Growth names them."""
    for arg, value in enumerate(values):
        if isinstance(value, (list, tuple)):
            yield from ((arg, item) for item in range(len(value)))
        else:
            yield arg, None


def _at(values, place):
    arg, item = place
    return values[arg] if item is None else values[arg][item]


def _put(values, place, value):
    arg, item = place
    if item is None:
        values[arg] = value
    else:
        values[arg] = list(values[arg])
        values[arg][item] = value


def _dtype_checked(kernel: Kernel, lower, *values):
    errors.check_dtype_on_cpu(kernel.op, kernel.sig, values, kernel.refused_dtypes)
    errors.check_mixed_dtypes(kernel.op, kernel.sig, values)
    return lower(*values)


def _traced_call(call: OpCall, *values):
    """What an eager executable traces, once per signature: the op's meta kernel (torch's
    refusals, errors.py), the lowering, and its outputs laid out as the meta kernel lays
    them out (a channels_last input gives a channels_last output, as on CPU)."""
    stats.traced(call.op, call.sig.names, values)
    meta = errors.meta_check(call.lowering, call.sig, values, _concrete.get(call))
    return storage.laid_out(call.lower(*values), _as_results(call.sig, meta))


def _as_results(sig, meta):
    """The meta kernel's outputs (the op's returns) beside the lowering's results: an op that writes
    arguments returns their new values first, then its fresh outputs (registry.py), so only those
    take a layout from meta (batch norm's output, after the running statistics)."""
    if not sig.written or not isinstance(meta, (tuple, list)):
        return meta
    fresh = [m for m, argument in zip(meta, sig.returned_arguments) if argument is None]
    return [None] * len(sig.written) + fresh


def _in_range(op, lowering: Lowering):
    """The host check of a call's values: the entry's `in_range` and its `scalar_fits`, both where
    it has both (elu_backward: a negative slope with is_result, and alpha's range)."""
    checks = [check for check in (lowering.in_range, _fits_as_cpu(op, lowering.scalar_fits) if lowering.scalar_fits
                                  else None) if check is not None]
    if len(checks) < 2:
        return checks[0] if checks else None
    return lambda values: all(check(values) for check in checks)


def _fits_as_cpu(op, names: tuple):
    """An `in_range` for an entry's `scalar_fits`: whether each named Scalar converts to the result's
    dtype (the `dtype` argument, else the first tensor's, else each of the first tensor list's, else
    the value's own) as CPU converts it ("value cannot be converted to type int8_t without
    overflow"); where one does not, CPU names the error for the whole call (index_fill checks a
    complex value first, in its own words). The C++ fast path checks the same way
    (FastKernel::scalar_fits) and leaves such a call to this kernel."""
    arguments = op._schema.arguments
    at = [a.name for a in arguments]
    value_at = [at.index(name) for name in names if name in at]  # (an entry's other overloads may lack one)
    dtype_at = at.index("dtype") if "dtype" in at else None
    tensor_at = next((i for i, a in enumerate(arguments) if str(a.type) in ("Tensor", "List[Tensor]")), None)

    def fits(values) -> bool:
        dtypes = [values[dtype_at]] if dtype_at is not None and values[dtype_at] is not None else []
        if not dtypes and tensor_at is not None:
            first = values[tensor_at]
            if isinstance(first, (list, tuple)):
                dtypes = list(dict.fromkeys(t.dtype for t in first))
            elif isinstance(first, torch.Tensor):  # (a prim's Python number in a Tensor's place: no dtype to fit)
                dtypes = [first.dtype]
        for i in value_at:
            value = values[i]
            if isinstance(value, (bool, int, float, complex)):
                for dtype in dtypes or [None]:
                    try:
                        torch.full((0,), value, dtype=dtype)
                    except RuntimeError:
                        return False
        return True

    return fits


# Per OpCall with `traced=` arguments: their values in its latest Python-kernel call, so that
# the meta check of a trace sees real ones (slice_scatter's start must agree with src's size).
# The C++ fast path serves only entries without `in_range`, for which any value is valid.
_concrete: dict = {}


_ARRAY = type(jnp.zeros(()))  # jax's concrete array class
_VALUES = (_ARRAY, Pending)  # what an executable's (or a recorded call's) plain output is


def _check_castable(op, result_dtype, out: torch.Tensor):
    """CPU's words, without the op's name: a foreach op_ raises what its per-tensor op_ raises (test_foreach
    compares them), and CPU names neither."""
    if not torch.can_cast(result_dtype, out.dtype):
        raise RuntimeError(
            f"result type {c10_name(result_dtype)} can't be cast to the desired output type {c10_name(out.dtype)}")


def _dense_strides(shape: tuple, perm: tuple) -> tuple:
    """The strides of a dense layout of `shape` whose dims, outermost first, are `perm`."""
    strides, step = [0] * len(shape), 1
    for d in reversed(perm):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _store(op, target: torch.Tensor, value: jax.Array, resize: bool, warn_on_resize: bool = True,
           any_dtype: bool = False) -> None:
    """Write a kernel result into an existing tensor (self of op_, or an out= tensor). warn_on_resize:
    False for an op that resizes its out= itself on CPU, with its own warning or none. any_dtype: cast
    into target whatever its dtype (an op that computes in out's dtype)."""
    if _rt.store_whole(target, value):  # the common case (a foreach step's every tensor): in C++
        return
    perm = None
    if isinstance(value, storage.Permuted):  # the target keeps its own layout
        value, perm = value.logical(), value.perm
    if not any_dtype:
        _check_castable(op, to_torch(value.dtype), target)
    if not resize and target.is_complex() and not jnp.issubdtype(value.dtype, jnp.complexfloating):
        name = _name(op).rstrip("_")
        if name in NO_COMPLEX_IN_PLACE:
            raise RuntimeError(f"In-place {name} is not supported for complex tensors.")
    shape = tuple(value.shape)
    if tuple(target.shape) != shape:
        if resize:
            if target.numel() != 0 and warn_on_resize:
                warnings.warn(
                    f"An output with one or more elements was resized since it had shape {list(target.shape)}, "
                    f"which does not match the required output shape {list(shape)}. (in {errors.op_label(op)})"
                )
            target.resize_(shape)
            if perm is not None:  # as CPU's set_output_raw_strided: a resized out takes the op's strides
                target.as_strided_(shape, _dense_strides(shape, perm))
        elif np.broadcast_shapes(shape, tuple(target.shape)) != tuple(target.shape):
            raise RuntimeError(
                f"{errors.op_label(op)}: output with shape {list(target.shape)} doesn't match the broadcast shape {list(shape)}"
            )
    storage.write(target, value)


class InplaceKernel:
    """`op_` from the functional `op`: compute, then write into self."""

    def __init__(self, op, functional: Kernel):
        self.op, self.functional = op, functional
        self.self_is_list = Signature.of(op).kinds[0] == TENSOR_LIST
        # self is the out of an op that computes in out's dtype (cumsum_: CPU's cumsum_out(self, self)),
        # as the out= kernel passes it
        names = functional.sig.names
        self.dtype_at = names.index("dtype") if functional.lowering.computes_in_out_dtype and "dtype" in names \
            and not self.self_is_list else None

    def __call__(self, *args, **kwargs):
        target = args[0] if args else kwargs["self"]
        call = (args, kwargs)
        if self.dtype_at is not None:
            args, kwargs = _in_dtype_of(self.functional, self.dtype_at, args, kwargs, target)
        if not self.self_is_list and errors.may_overlap(self.op, target, args, kwargs):
            errors.check_writes(self.op, args, kwargs, [target])  # CPU refuses writes through overlapping memory
        if self.self_is_list and len({t.untyped_storage().data_ptr() for t in target}) < len(target):
            # tensors sharing memory (one tensor twice, two views of one storage): CPU applies the op
            # tensor by tensor, a later one seeing an earlier one's write; so does this
            for i in range(len(target)):
                self(*_item(args, i, len(target)), **{k: _item([v], i, len(target))[0] for k, v in kwargs.items()})
            return None
        try:
            result, _, _ = self.functional.compute(args, kwargs)
        except Exception as e:  # noqa: BLE001  (the failure path only)
            if not isinstance(e, errors._DEVICE_ERRORS) and not fused.interruption(e):
                errors.raise_as_cpu(self.op, *call)  # CPU checks self's dtype first (int.bitwise_and_(float))
            raise
        if self.self_is_list:
            for t, v in zip(target, result):
                _store(self.op, t, v, resize=False)
            return None
        value = result.array if isinstance(result, storage.Permuted) else result
        if not torch.can_cast(to_torch(value.dtype), target.dtype):
            errors.raise_as_cpu(self.op, *call)  # a refused cast in CPU's words: "ldexp can't be cast to the
            # desired output type Long", clamp_'s "... output type bool"; else _store's
        _store(self.op, target, result, resize=False)
        return target


class MutatingKernel:
    """A lowering registered directly on an op that writes arguments (random `op_`s,
    batch norm's running statistics). Per registry.py it returns the written arguments'
    new values in schema order, then the op's fresh outputs."""

    def __init__(self, lowering: Lowering):
        self.kernel = Kernel(lowering)
        self.op = lowering.op
        sig = self.kernel.sig
        self.written = sig.written
        fresh = 0
        self.returns = []  # ("arg", index) for a return that is a written argument, ("new", k) otherwise
        for argument in sig.returned_arguments:
            if argument is not None:
                self.returns.append(("arg", argument))
            else:
                self.returns.append(("new", fresh))
                fresh += 1
        self.single = len(self.written) == 1 and fresh == 0
        self.warn_on_resize = not lowering.resizes_out

    def __call__(self, *args, **kwargs):
        values = self.kernel.sig.bind(args, kwargs)
        written = _flat_tensors(values[i] for i in self.written)
        if any(errors.may_overlap(self.op, t, args, kwargs) for t in written):
            errors.check_writes(self.op, args, kwargs, written)  # CPU refuses writes through overlapping memory
        result, device, _ = self.kernel.compute(args, kwargs)
        results = [result] if self.single else list(result)
        kwarg_only = self.kernel.sig.kwarg_only
        for i, new in zip(self.written, results):
            resize = kwarg_only[i]  # out= arguments resize as the derived out= kernels' do; self never does
            if isinstance(values[i], (list, tuple)):
                for t, v in zip(values[i], new):
                    _store(self.op, t, v, resize=resize, warn_on_resize=self.warn_on_resize)
            else:
                _store(self.op, values[i], new, resize=resize, warn_on_resize=self.warn_on_resize)
        fresh = results[len(self.written):]
        out = [values[i] if kind == "arg" else _wrap(fresh[i], device) for kind, i in self.returns]
        return None if not out else out[0] if len(out) == 1 else tuple(out)


class OutKernel:
    """`op.out` from the functional `op`: compute, then resize and write the out tensors."""

    def __init__(self, op, functional: Kernel):
        self.op, self.functional = op, functional
        sig = Signature.of(op)
        self.out_names = [sig.names[i] for i in sig.written]
        names = functional.sig.names
        # an op that computes in out's dtype (its entry's computes_in_out_dtype) takes it as its `dtype`
        # argument where it has one, else its result is cast into out (bernoulli's 0 and 1: exact)
        in_out_dtype = functional.lowering.computes_in_out_dtype and len(self.out_names) == 1
        self.dtype_at = names.index("dtype") if in_out_dtype and "dtype" in names else None
        self.cast_into_out = in_out_dtype and self.dtype_at is None

    def __call__(self, *args, **kwargs):
        outs = [kwargs[n] for n in self.out_names]
        errors.check_writes(self.op, args, kwargs, _flat_tensors(outs))  # out='s rules are the op's own
        call = dict(kwargs)
        outs = [kwargs.pop(n) for n in self.out_names]
        functional_args, functional_kwargs = _in_dtype_of(self.functional, self.dtype_at, args, kwargs, outs[0]) \
            if self.dtype_at is not None else (args, kwargs)
        queue = bounds.mark() if self.functional.index_probes is not None else None
        try:
            result, _, _ = self.functional.compute(functional_args, functional_kwargs)
        except Exception as e:  # noqa: BLE001  (the failure path only)
            if not isinstance(e, errors._DEVICE_ERRORS) and not fused.interruption(e):  # (out of memory: CPU would not say more)
                errors.raise_as_cpu(self.op, args, call)  # CPU checks out='s own arguments first (its dtype)
            raise
        results = (result,) if len(outs) == 1 else result  # one out (a tensor or a Tensor[]) takes the whole result
        if any(t.dtype != to_torch(v.dtype) for t, v in zip(_flat_tensors(outs), _flat_values(results))):
            # (rare) an out tensor of another dtype than the result: some ops cast, others refuse
            # (aminmax, sort, amax want the exact dtype) where their meta kernels accept: CPU decides
            try:
                errors.raise_as_cpu(self.op, args, call)
            except BaseException:
                if queue is not None:
                    bounds.forget_since(queue)  # the call's index checks go with its error, not to the next sync
                raise
        for target, value in zip(outs, results):
            if isinstance(target, (tuple, list)):
                for t, v in zip(target, value):
                    _store(self.op, t, v, resize=True)
            else:
                _store(self.op, target, value, resize=True, any_dtype=self.cast_into_out)
        if not self.op._schema.returns:  # e.g. split_with_sizes_copy.out, whose Tensor[] out returns ()
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)


def _in_dtype_of(functional: Kernel, dtype_at: int, args: tuple, kwargs: dict, out: torch.Tensor):
    """The functional call of an op that computes in out's dtype, with out's (an out= tensor's, or
    self's of `op_`) dtype as its `dtype` where it names none, unless out has the float input's own
    dtype (the usual call keeps its executable; an integer input's result is int64 without `dtype`, so
    sum(bool, out=<bool>) needs it, and cumsum_ of a bool tensor is refused as CPU refuses it)."""
    values = functional.sig.bind(args, kwargs)
    if values[dtype_at] is not None or out.dtype == values[0].dtype and (
            out.dtype.is_floating_point or out.dtype.is_complex):
        return args, kwargs
    values[dtype_at] = out.dtype
    return functional.sig.split(values)


def _item(args, i: int, n: int) -> list:
    """A foreach call's arguments for its i-th tensor: each list of its n per-tensor values cut to
    the i-th (a one-element list); the other arguments as they are."""
    return [[a[i]] if isinstance(a, (list, tuple)) and len(a) == n else a for a in args]


def _flat_values(results) -> list:
    """A kernel's array results in order (a column-major result, storage.Permuted, by its array)."""
    out = []
    for r in results:
        out.extend(r if isinstance(r, (list, tuple)) else [r])
    return [r.array if isinstance(r, storage.Permuted) else r for r in out
            if hasattr(r, "dtype") or isinstance(r, storage.Permuted)]


def _flat_tensors(values) -> list:
    out = []
    for v in values:
        out.extend(t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor))
    return out


def _name(op) -> str:
    return op._schema.name.split("::")[1] + ("" if op._overloadname == "default" else "." + op._overloadname)


def _is_view(op) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


def _composite_implicit(op) -> bool:
    """Such ops decompose above autograd; a backend kernel would bypass their gradients. The
    dispatcher's own table decides, not the OpOverload's: torch._decomp adds Python
    CompositeImplicitAutograd kernels (upsample_nearest*, native_batch_norm) that only the Python
    dispatcher runs (tracing); eager calls reach the C++ kernels, which have autograd formulas, and
    without a pjrt kernel went to the boxed fallback (torch's decomposition, without the checks of
    the op's own kernel: CPU's dtype refusals)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), torch._C.DispatchKey.CompositeImplicitAutograd)
    except RuntimeError:  # an overload only Python knows (aten.split.default)
        return op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)


def _composite_explicit(op) -> bool:
    """torch's generated kernel (out= overloads: the functional op, then a resize and copy)."""
    return op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeExplicitAutograd)


def _named_types(op) -> list:
    """(name, type) of each argument, written ones' alias annotations aside."""
    return [(a.name, str(a.type)) for a in op._schema.arguments]


def _variants(op):
    """The in-place and out= overloads derived from functional overload `op`: those whose
    other arguments have the same names and kinds (pow_.Scalar is not pow.Scalar's)."""
    namespace, base = op._schema.name.split("::")
    if namespace != "aten":  # custom ops have no derived variants
        return None, []
    # names and types: kinds alone take all.out (int dim) for all.dims' (int[]? dim) out= overload
    arguments = _named_types(op)
    inplace, outs = None, []
    for packet_name in (base + "_", base):
        packet = getattr(aten, packet_name, None)
        for overload in packet.overloads() if packet is not None else ():
            if "hacked_twin" in overload:  # TorchScript-only aliases the dispatcher does not know
                continue
            candidate = getattr(packet, overload)
            other = Signature.of(candidate)
            if not other.written:
                continue
            kept = [a for i, a in enumerate(_named_types(candidate)) if packet_name == base + "_" or i not in other.written]
            if kept != arguments:
                continue
            if packet_name == base + "_":
                inplace = candidate
            elif all(other.kwarg_only[i] for i in other.written):
                outs.append(candidate)
    return inplace, outs


_REGISTERED: dict = {}
_LIBRARIES: dict = {}  # namespace -> the torch.library IMPL library holding its Python kernels
# TORCH_PJRT_EAGER_FAST_PATH=0 registers only the Python kernels (to compare, or to debug).
FAST_PATH_DISABLED = os.environ.get("TORCH_PJRT_EAGER_FAST_PATH", "1") == "0"


def register(special: dict) -> None:
    """Register table kernels, derived variants and `special` (overload -> kernel: the
    kernels that are not lowerings) on PrivateUse1. A special kernel replaces a lowering's
    functional kernel only where the entry says so (its `eager` trait); an entry that says
    so without a special kernel gets none (aten.copy: torch's copy_ serves eager)."""
    unannounced = sorted(str(op) for op in special if op in LOWERINGS and not LOWERINGS[op].eager)
    if unannounced:
        raise RuntimeError(f"eager kernels replace lowerings whose entries do not say so (eager=...): {unannounced}")
    kernels: dict = {}
    for op, lowering in LOWERINGS.items():
        if _is_view(op) or Signature.of(op).written or (lowering.eager and op not in special):
            continue  # views stay views (C++ metadata kernels)
        functional = Kernel(lowering)
        inplace, outs = _variants(op)
        if inplace is not None and inplace not in LOWERINGS and not _composite_implicit(inplace):
            kernels[inplace] = InplaceKernel(inplace, functional)
        if not lowering.over_composite and _composite_implicit(op) or lowering.decomposition is not None:
            # a composite keeps its autograd; its in-place form, where torch does not decompose it
            # (conj_physical_ reaches a DispatchStub), takes the functional's kernel. An entry's
            # `decomposition` serves eager in place of a kernel (eager/fallback.py: native_batch_norm,
            # whose schema hides its writes)
            continue
        kernels[op] = functional
        for out in outs:
            if _composite_implicit(out) or (op in special and _composite_explicit(out)):
                continue  # torch's out= wrapper serves it over the special functional kernel, as on CPU
            kernels[out] = OutKernel(out, functional)
    for op, lowering in LOWERINGS.items():  # lowerings registered on ops that write their arguments
        if Signature.of(op).written and not _is_view(op) and op not in kernels:
            kernels[op] = MutatingKernel(lowering)
    kernels.update(special)
    _rt.set_eager_helpers(weak_scalar, storage.read_lazily, storage._recent.append, _ARRAY, storage.view_of,
                          fused.record, Pending, TORCH_TO_JAX)
    _rt.set_recorder_helpers(fused.current_region, fused.call_signature, fused.end_region, fused._lock, fused._open,
                             Pending, _ARRAY, storage.StridedView, fused, fused._devices_are_one())
    _rt.set_index_check_helpers(bounds._lock, bounds._seen, bounds._queued, bounds._nothing_seen,
                                bounds.raise_pending, bounds.raise_if_found, bounds._MAX_QUEUED)
    _rt.set_growth_helpers(storage.Padded, PaddedOperand, storage.offset_operand)
    _rt.set_safe_point(executable_budget._state, executable_budget.release_if_due, default_dtype.check)
    _rt.set_fused(fused.enabled)
    fused.lend_regions_to_backward()
    for op, kernel in kernels.items():
        _install(op, kernel)


def register_lowering(op) -> None:
    """The eager kernel of a lowering added to the table after setup (custom kernels,
    collectives); its in-place and out= variants are not derived."""
    lowering = LOWERINGS[op]
    _install(op, MutatingKernel(lowering) if Signature.of(op).written else Kernel(lowering))


def _install(op, kernel) -> None:
    """Register `kernel` as op's PrivateUse1 kernel, through the C++ fast path where it applies."""
    kinds = store = None
    if isinstance(kernel, Kernel):
        kinds = kernel.call.fast_plan()
    elif isinstance(kernel, InplaceKernel) and kernel.dtype_at is None:
        # (cumsum_ and cumprod_, which compute in self's dtype, stay Python kernels: the C++ kernel runs the
        # functional executable as called, without self's dtype, and would store an int64 sum into bool)
        kinds, store = kernel.functional.call.fast_plan(), functools.partial(_store, op, resize=False)
    namespace = op._schema.name.split("::")[0]
    if op is aten.clone.default and not FAST_PATH_DISABLED:  # transfer.clone behind a C++ kernel (CloneKernel)
        _rt.register_clone_kernel(storage._read_view.fn, storage._read_view, kernel)
    elif op is aten._to_copy.default and not FAST_PATH_DISABLED:  # transfer.to_copy behind ToCopyKernel
        table = Kernel(LOWERINGS[op])  # a copy on the tensor's own device is the table's lowering
        keywords = Signature.of(op).names[1:]  # the C++ kernel passes them by position
        _rt.register_to_copy_kernel(table.executable, table.run,
                                    lambda self, *rest: kernel(self, **dict(zip(keywords, rest))),
                                    table.call.fast_plan())
        from . import transfer  # its uploads to pjrt and reads back in C++ as well

        _rt.set_transfer_helpers(platform.put, transfer.device_facts)
    elif op is aten._local_scalar_dense.default and not FAST_PATH_DISABLED:  # ScalarReadKernel; large storages here
        from .transfer import WHOLE_STORAGE_READ

        _rt.register_scalar_read_kernel(kernel, WHOLE_STORAGE_READ)
    elif kinds is not None and not FAST_PATH_DISABLED:
        functional = kernel if store is None else kernel.functional
        checked = functional.checked is not None  # its calls record the checked executable, and queue its checks
        _rt.register_fast_kernel(namespace, _name(op), functional.executable,
                                 functional.checked if checked else functional.run, kernel, store, kinds,
                                 functional.described, checked, functional.lowering.grows is not None)
    else:
        if namespace not in _LIBRARIES:
            _LIBRARIES[namespace] = torch.library.Library(namespace, "IMPL")
        _LIBRARIES[namespace].impl(_name(op), paths.counted(op, kernel), "PrivateUse1")
    _REGISTERED[op] = kernel


def registered_ops() -> list:
    return sorted(_name(op) for op in _REGISTERED)
