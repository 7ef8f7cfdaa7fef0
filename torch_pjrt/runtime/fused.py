"""Fused eager: eager calls are recorded into a region and run as one executable at a sync point.

In fused mode (the default; `TORCH_PJRT_EAGER=op` turns it off) an eager call does not run its executable: it
records the call (which executable, its static arguments, where each operand comes from)
and its outputs are `Pending` values, known by their abstract values (shape, dtype) until
the region runs. A storage's buffer may be a Pending, so views, in-place writes and
autograd work on them unchanged: they record too.

At a sync point the region's calls are traced into one JAX function (each call is the same
jitted function op-by-op mode runs, so XLA inlines and fuses them) and run as one
executable, cached by the region's structure: the calls, their operands' shapes and dtypes,
their static arguments, the wiring between them and which inputs are the same buffer.
Outputs no one holds any more when the region runs are never materialized; inputs only the
region holds are donated. Sync points: a host read or anything else that needs an array
(`concrete`), a data-dependent op, `torch.pjrt.synchronize()`, the end of an optimizer
step, and a bound on the region's calls (TORCH_PJRT_FUSED_MAX_OPS).

A region holds one thread's calls, in that thread's order (DDP's comm-hook callbacks run on a
completion thread, user threads have their own): XLA's fusion can change rounding (it contracts
a * b + c into an FMA inside a region), and DDP's replicas must compute the same bits from the
same reduced gradients. One exception: the autograd engine runs a backward on a thread of its
own while the caller only waits, so the caller lends its region to that thread (`lend_region`:
the forward's region ends where backward begins; backward, clipping and the optimizer step are
one region). A thread that needs another's pending value runs that thread's region first; that
cut depends on timing only where the read falls before the other thread's own next sync point
(DDP's reads come after the callbacks that produce them have returned, where the completion
thread ends its region anyway).

Errors keep naming the op: a call's shapes are computed when it is recorded (its meta check
and lowering are traced then, as op by op), and a region that fails to run is run again
call by call. A region structure that keeps compiling new variants (shapes change every
iteration) runs call by call from then on, and `stats()` says so.

Interrupted: an exception that is not the region's own failure (KeyboardInterrupt, or what a
signal handler raises: a SIGALRM timeout) may arrive between any two steps of recording or
running. As with CUDA, where an interrupted Python call leaves the work already queued on the
stream valid, the region stays valid: a call whose recording was interrupted is taken out again
(`_roll_back`: it was not queued), and a run that was interrupted before its results came leaves
the region as it was, to run at the next sync point. Only where the run had already consumed
donated inputs, and its results were lost, do its pending values read as an error that says so.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import logging
import os
import signal
import threading
import weakref

import jax
import numpy as np
import torch

from . import platform
from .build import load as _load_runtime
from . import default_dtype, executable_budget, executable_store
from .safe_point import safe_point

log = logging.getLogger("torch_pjrt.fused")

MAX_CALLS = int(os.environ.get("TORCH_PJRT_FUSED_MAX_OPS", "2048"))  # a region ends with this many calls
MAX_VARIANTS = int(os.environ.get("TORCH_PJRT_FUSED_MAX_VARIANTS", "8"))  # compiles of one call sequence
# A region seen for the first time (or past MAX_VARIANTS) runs op by op, each call on its own
# executable, unless its distinct call signatures without one are this fraction of its calls (and
# two): then its program compiles at once (_compiling_is_cheaper). 0, the default, turns that off
# (docs/eager.md, "First sights of new shapes": why it is not the default yet).
COLD_FRACTION = float(os.environ.get("TORCH_PJRT_FUSED_COLD_FRACTION") or "0")
RECURRING = 2  # first sights compiled with a call signature, after which it counts as built

_ARRAY = type(jax.numpy.zeros(()))
_compiled_at_first_sight: collections.Counter = collections.Counter()  # call signature -> first sights compiled with it
_lock = threading.RLock()


def _mode_from_environment() -> bool:
    mode = os.environ.get("TORCH_PJRT_EAGER", "fused")
    if mode not in ("fused", "op"):
        raise ValueError(f"TORCH_PJRT_EAGER must be 'fused' or 'op', not {mode!r}")
    return mode == "fused"


enabled = _mode_from_environment()


def active() -> bool:
    """Calls are recorded now: fused mode, outside deterministic mode (which runs op by op, as
    TorchNeuron's does: XLA's fusion changes rounding, so a result would depend on where regions end)."""
    return enabled and not torch.are_deterministic_algorithms_enabled()


class Pending:
    """The value of a recorded call's output: its abstract value now, its array once its region ran."""

    # replaces: id() of the array this value replaced as a storage's buffer (an in-place update:
    # region_plan donates that array to this value, so XLA writes it in place, no copy)
    __slots__ = ("aval", "value", "region", "slot", "replaces", "__weakref__")

    def __init__(self, aval, region, slot: int):
        self.aval, self.value, self.region, self.slot, self.replaces = aval, None, region, slot, None

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: self.aval.ndim)
    size = property(lambda self: self.aval.size)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(concrete(self), dtype)

    def __repr__(self) -> str:
        return f"Pending({self.aval.str_short()}{'' if self.value is None else ', ran'})"


class Recordable:
    """A jitted function eager calls go through: run now (op by op), or recorded into the region.
    `static`: its static argument positions (as given to jax.jit); `jit=False`: a function
    whose output shape depends on data, which runs at once on arrays (a sync point);
    `device`: where a function without array operands puts its outputs (fresh memory);
    `describe(args)`: what the C++ recorder keeps per call signature for its kernel (the same
    for every call of one signature: eager.kernels.SignatureTraits); `key`: a name that says
    which function this is in every process (an op table entry's), so that its executables may be
    kept on disk (runtime/executable_store.py; None: never), and `loaded(args)`: called when one
    is read from there instead of traced. `alone(*args)`: the call's outputs without its
    executable, for a call that runs on its own (op by op, or in a first sight's region), or None
    where the executable should run: fresh memory's first fill of a size costs a host fill and a
    copy, where its executable would be compiled for that size alone (storage._fresh)."""

    __slots__ = ("fn", "static", "name", "jit", "device", "describe", "key", "loaded", "alone", "__weakref__")

    def __init__(self, fn, static: tuple = (), name: str | None = None, jit: bool = True, device: int | None = None,
                 describe=None, key: str | None = None, loaded=None, alone=None):
        self.fn, self.static, self.jit, self.device, self.describe = fn, tuple(static), jit, device, describe
        self.name = name or getattr(fn, "__name__", repr(fn))
        self.key, self.loaded, self.alone = key, loaded, alone

    def __call__(self, *args):
        if active():
            return record(self, args)
        if self.alone is not None:
            outputs = self.alone(*args)
            if outputs is not None:
                return outputs
        try:
            return self.fn(*args)
        except TypeError:  # a Pending left by fused mode (switched off since): its array
            if not _holds_pending(args):
                raise
            return self.fn(*concrete(args))

    def on(self, device: int, args: tuple):
        """`self(*args)` for a call that says where it runs (a factory, a decomposition): its
        outputs are committed to pjrt:device, as a computation on them must follow them there
        (JAX moves uncommitted arrays to its default device, pjrt:0)."""
        if active() and self.jit:
            return record(self, args, device)
        if device == 0:
            return self(*args)
        with _on(device):
            return committed(self(*args), device)

    def __repr__(self) -> str:
        return f"Recordable({self.name})"


def keyed(factory):
    """A factory of Recordables whose functions its arguments fix (with this package's source): each
    Recordable it makes is keyed by the factory's name and its arguments, so that its executables
    may be kept on disk (runtime/executable_store.py). Its arguments must pickle."""
    name = f"{factory.__module__}.{factory.__qualname__}"

    @functools.wraps(factory)
    def make(*args):
        rec = factory(*args)
        rec.key = (name, args)
        return rec

    return make


def committed(tree, device: int):
    """`tree`'s arrays committed to pjrt:device (a copy only for one that lies elsewhere)."""
    place = platform.device(device)
    return jax.tree_util.tree_map(lambda a: jax.device_put(a, place) if type(a) is _ARRAY and not a.committed else a,
                                  tree)


# ------------------------------------------------------------------------------ regions
class Region:
    __slots__ = ("calls", "structure", "digest", "inputs", "input_index", "outputs", "device", "ran", "done", "error")

    def __init__(self):
        self.calls: list = []       # (recordable, statics, treedef, refs, number of outputs)
        self.structure: list = []   # (call id, refs) per call (the recompile log compares them)
        # the structure folded call by call as it is recorded (runtime/csrc/recorder.cpp's digest_call):
        # with the region's device and liveness, its executable's key
        self.digest = bytearray(16)
        self.inputs: list = []      # arrays (and host scalars) the region reads, first use first
        self.input_index: dict = {}  # id(array) -> its position in inputs (the same buffer is one input)
        self.outputs: list = []     # every call's output leaves, in order (Pending)
        self.device: int | None = None
        self.ran = False            # flushed: its thread records into a new region
        self.done = False           # its outputs have their values (fused._materialize)
        self.error = None           # why its pending values have none (it failed, or its run was lost)


class _Slot:
    """Where a thread's region lies: its own, or (autograd's threads, during a backward) the
    slot of the thread that waits in that backward."""
    __slots__ = ("region",)

    def __init__(self):
        self.region: Region | None = None


_here = threading.local()  # .slot: this thread's _Slot
_open: set = set()         # regions holding calls, of every thread (synchronize runs them all)
# (thread ident, its _Slot) of each thread waiting in autograd's run_backward (lend_region)
_lenders: list = []


def _own_slot() -> _Slot:
    slot = getattr(_here, "slot", None)
    if slot is None:
        slot = _here.slot = _Slot()
    return slot


def _slot() -> _Slot:
    """This thread's slot; while one thread waits in a backward, autograd's threads running that
    backward's nodes share its slot (lend_region)."""
    if len(_lenders) == 1:
        ident, slot = _lenders[0]
        if ident != threading.get_ident() and torch._C._current_graph_task_id() != -1:
            return slot
    return _own_slot()


def _current() -> Region:
    slot = _slot()
    region = slot.region
    if region is None or region.ran:
        region = slot.region = Region()
    return region


@contextlib.contextmanager
def lend_region():
    """While this thread waits in autograd's engine, the engine's threads record into its region.

    torch runs a device's backward nodes on a thread of the device's own while the caller waits.
    With a region per thread, that thread's first read of a forward output ran the forward's
    region ("another thread"), and the caller's first read of a gradient (clipping, the
    optimizer) ran the backward's: three executables a training step, and a hop between threads
    for each. Now backward is a sync point of the caller's region (its forward runs, in XLA,
    while backward records), and backward, clipping and the optimizer step are one region.
    The calls stay one thread's at a time (the caller records nothing while it waits), so the
    region is as deterministic as before. Nested or concurrent backwards (two lenders) record
    per thread, as without lending."""
    entry = (threading.get_ident(), _own_slot())
    with _lock:
        if entry[1].region is not None and entry[1].region.calls:
            _flush_locked(entry[1].region, "backward")  # the forward: XLA runs it while backward records
        _lenders.append(entry)
        _load_runtime().regions_moved()
    try:
        yield
    finally:
        with _lock:
            _lenders.remove(entry)
            _load_runtime().regions_moved()


def lend_regions_to_backward() -> None:
    """Make every backward run through `torch.autograd.backward`/`grad` (autograd's Python engine
    object) lend the caller's region to the engine's threads while it waits (lend_region)."""
    from torch.autograd.variable import Variable

    engine_type = type(Variable._execution_engine)
    if getattr(engine_type, "_pjrt_lends_regions", False):
        return

    class Engine(engine_type):  # the same C++ engine; only run_backward is wrapped
        _pjrt_lends_regions = True

        def run_backward(self, *args, **kwargs):
            if not active():
                return super().run_backward(*args, **kwargs)
            with lend_region():
                return super().run_backward(*args, **kwargs)

    Variable._execution_engine = Engine()


_shapes: dict = {}      # call key -> (call id, output treedef, output avals)
# call ids are never reused (not even when _shapes is cleared): a region's key holds them, and a
# reused id would give a cached executable built for other calls
_call_ids = itertools.count()
# region key -> jitted region function, least recently used first. Bounded: each holds a compiled
# XLA executable (megabytes for a training step), and a process meets many regions once or twice.
_executables: collections.OrderedDict = collections.OrderedDict()
MAX_EXECUTABLES = 32
# region key -> how a region of one call runs (_one_op_run: its call's own executable, no compile), so that
# the C++ runner runs it as it runs a cached region. Apart from _executables: these hold no executable
# of their own, and a loop's one-op regions must not push its compiled regions out.
_one_op_runs: collections.OrderedDict = collections.OrderedDict()
MAX_ONE_OP_RUNS = 256
executable_budget.on_release(_one_op_runs.clear)  # they may hold the store's executables, which a release drops
# The long-lived tables below keep hashes and names, not regions' keys or Recordables: a key can
# be a long tuple, and a Recordable holds its compiled executables (lru-cached ones must be freed).
_seen: set = set()      # hashes of region keys run once (op by op): seen again, they compile
_variants: collections.Counter = collections.Counter()  # call sequence (names) -> region structures compiled
_call_by_call: set = set()  # call sequences (names) that run call by call (they kept recompiling)
_stats = collections.Counter()
_ended_by: collections.Counter = collections.Counter()
_recent_regions: collections.deque = collections.deque(maxlen=64)
# Weak references to the latest regions' outputs: synchronize() waits for them (storage.synchronize).
# Weak, so that a region's output is donated to the next region as if nothing else held it.
_recent_outputs: collections.deque = collections.deque(maxlen=256)
_compiled_last: dict = {}  # call sequence (names) -> the last structure compiled for it (the recompile log's)
_single_device = None


def _devices_are_one() -> bool:
    global _single_device
    if _single_device is None:
        _single_device = len(platform.devices()) == 1
    return _single_device


_recorded: collections.Counter = collections.Counter()  # recordable name -> calls recorded here (eager_stats)


def record(rec: Recordable, args: tuple, device: int | None = None):
    """Record `rec(*args)` into the region; its outputs as Pending values (same pytree)."""
    _recorded[rec.name] += 1
    if not rec.jit:
        return rec.fn(*concrete(args))
    if device is None:
        device = rec.device
    statics, leaves, treedef = _split(rec, args)
    with _lock:
        region = _current()
        kinds, avals = [], []
        for leaf in leaves:
            kind = type(leaf)
            if kind is Pending:
                if leaf.value is None:
                    if leaf.region is region:
                        kinds.append(leaf)
                        avals.append(leaf.aval)
                        continue
                    concrete(leaf, "another thread")  # another thread's region runs first
                leaf = leaf.value
                kind = type(leaf)
            if kind is _ARRAY:
                avals.append(leaf.aval)
            elif kind in _scalar_avals:  # a host scalar (a seed, a number): an input of its own
                avals.append(_scalar_avals[kind])
            elif isinstance(leaf, jax.core.Tracer):  # inside someone's trace: nothing to record
                return rec.fn(*args)
            else:
                avals.append(_scalar_aval(leaf))
            kinds.append(leaf)
        if device is None and not _devices_are_one():
            device = _device_of(kinds)
        if region.calls and device is not None and region.device is not None and device != region.device:
            _flush_locked(region, "another device")
            return record(rec, args, device)
        key = (rec, _typed(statics) if statics else (), treedef, tuple(avals))
        shape = _shapes.get(key)
        if shape is None:
            shape = _shape_of(rec, args, leaves, treedef, avals, key)  # raises what the call raises
        call_id, out_treedef, out_avals = shape
        # the region's state before this call: an exception between two of the steps below (a signal
        # handler's) takes the call out again, so the region's lists, structure and digest still agree
        before = (len(region.calls), len(region.inputs), len(region.outputs), bytes(region.digest), region.device)
        try:
            refs = []
            index = region.input_index
            for leaf, aval in zip(kinds, avals):
                if type(leaf) is Pending:
                    refs.append(leaf.slot)
                    continue
                # the same array twice is one input (which inputs alias is part of the structure), but a
                # scalar is not: the cached scalar of a loop's counter would meet a constant's by chance
                if type(leaf) is _ARRAY and aval.shape:
                    k = index.get(id(leaf))
                    if k is None:
                        k = index[id(leaf)] = len(region.inputs)
                        region.inputs.append(leaf)
                else:
                    k = len(region.inputs)
                    region.inputs.append(leaf)
                refs.append(-1 - k)
            refs = tuple(refs)
            base = len(region.outputs)
            outs = [Pending(aval, region, base + j) for j, aval in enumerate(out_avals)]
            if not region.calls:
                _open.add(region)
            region.outputs.extend(outs)
            region.calls.append((rec, statics, treedef, refs, len(outs)))
            region.structure.append((call_id, refs))
            _load_runtime().digest_call(region.digest, call_id, refs)
            if device is not None:
                region.device = device
        except BaseException:
            _roll_back(region, *before)
            raise
        if len(region.calls) >= MAX_CALLS:
            _flush_locked(region, "max ops")
    return outs[0] if out_treedef is None else jax.tree_util.tree_unflatten(out_treedef, outs)


def _roll_back(region: Region, calls: int, inputs: int, outputs: int, digest: bytes, device) -> None:
    """Take out of `region` what a call's recording had added when an exception interrupted it."""
    for key, k in list(region.input_index.items()):
        if k >= inputs:
            del region.input_index[key]
    del region.inputs[inputs:]
    del region.outputs[outputs:]
    del region.calls[calls:]
    del region.structure[calls:]
    region.digest[:] = digest
    region.device = device
    if not region.calls:
        _open.discard(region)


def interruption(error: BaseException) -> bool:
    """Whether `error` interrupted pjrt's work rather than came from it: an exception that is not an
    Exception (KeyboardInterrupt, pytest's timeout), or one a Python signal handler raised (a SIGALRM
    timeout's, whatever its class). Such an error is passed on as it is: never taken for an op's
    failure (which would run the op again, or raise CPU's error in its place)."""
    if not isinstance(error, Exception):
        return True
    handlers = set()
    for number in signal.valid_signals():
        try:
            handler = signal.getsignal(number)
        except (OSError, ValueError):
            continue
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        if code is not None:
            handlers.add(code)
    trace = error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code in handlers:
            return True
        trace = trace.tb_next
    return False


def _split(rec: Recordable, args: tuple):
    """(static arguments, the dynamic ones' leaves, their treedef) of a call of `rec`."""
    static = rec.static
    if static:
        statics = tuple(args[i] for i in static)
        dynamic = [a for i, a in enumerate(args) if i not in static]
    else:
        statics, dynamic = (), args
    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    return statics, leaves, treedef


def call_signature(rec: Recordable, args: tuple):
    """What the C++ recorder (runtime/csrc/recorder.cpp) keeps of a call signature it records:
    (call id, the dynamic arguments' treedef, the static arguments, the outputs' treedef, their
    avals, the dynamic arguments' leaves, rec.describe(args)), as `record` computes them (tracing the call on first sight: raises what it raises).
    None for a call it must leave to `record` (a data-dependent function, a leaf that is not an
    array or a Pending of this thread's region)."""
    if not rec.jit:
        return None
    statics, leaves, treedef = _split(rec, args)
    if any(type(leaf) is not _ARRAY and type(leaf) is not Pending for leaf in leaves):
        return None
    avals = [leaf.aval for leaf in leaves]
    key = (rec, _typed(statics) if statics else (), treedef, tuple(avals))
    shape = _shapes.get(key)
    if shape is None:
        shape = _shape_of(rec, args, leaves, treedef, avals, key)
    call_id, out_treedef, out_avals = shape
    description = rec.describe(args) if rec.describe is not None else None
    return call_id, treedef, statics, out_treedef, out_avals, leaves, description


def current_region() -> Region:
    """This thread's region (the C++ recorder's way in)."""
    return _current()


def end_region(region: Region, reason: str) -> None:
    """Run `region` (the C++ recorder's bound on a region's calls)."""
    with _lock:
        _flush_locked(region, reason)


_scalar_avals: dict = {}  # the abstract value of a host scalar, by type


def _scalar_aval(value):
    aval = jax.api_util.shaped_abstractify(value)
    # the same for every value of these types (not int: one too large for int64 must raise here)
    if type(value) in (float, bool, complex) or isinstance(value, np.generic):
        _scalar_avals[type(value)] = aval
    return aval


def _typed(value):
    """A static argument as a key that tells 6 from 6.0 and True from 1 (equal and equally hashed in
    Python, but arange(6) is int64 and arange(6.0) float32)."""
    if type(value) in (tuple, list):
        return tuple(_typed(v) for v in value)
    return type(value), value


def _device_of(leaves) -> int | None:
    for leaf in leaves:
        if type(leaf) is Pending:
            return leaf.region.device
        if type(leaf) is _ARRAY and leaf.committed:  # uncommitted: a cached scalar, say, which follows the others
            return platform.devices().index(next(iter(leaf.devices())))
    return None


def _shape_of(rec, args, leaves, treedef, avals, key):
    """The outputs' abstract values of a call (from the executable store, else tracing it, as its
    first op-by-op call would)."""
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) if type(leaf) is Pending else leaf
                for leaf, a in zip(leaves, avals)]
    stored = executable_store.find(key, rec, key[1], treedef, avals) if rec.key is not None else None
    if stored is not None:
        out_treedef, out_avals = stored.out_treedef, stored.out_avals
    else:
        full = _merge(rec, [args[i] for i in rec.static], jax.tree_util.tree_unflatten(treedef, abstract))
        out_leaves, out_treedef = jax.tree_util.tree_flatten(rec.fn.eval_shape(*full))
        out_avals = tuple(jax.core.ShapedArray(o.shape, o.dtype, weak_type=o.weak_type) for o in out_leaves)
    if out_treedef.num_nodes == 1 and out_treedef.num_leaves == 1:  # one array: returned as is
        out_treedef = None
    shape = (next(_call_ids), out_treedef, out_avals)
    if len(_shapes) > 16384:
        _shapes.clear()
    _shapes[key] = shape
    return shape


def _holds_pending(tree) -> bool:
    return any(type(leaf) is Pending for leaf in jax.tree_util.tree_leaves(tree))


def concrete(tree, reason: str = "host read"):
    """`tree` with every Pending leaf replaced by its array, running its region if needed (a sync point)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not any(type(leaf) is Pending for leaf in leaves):
        return tree
    out = []
    for leaf in leaves:
        if type(leaf) is Pending:
            if leaf.value is None:
                region = leaf.region
                if region is not None:
                    with _lock:
                        _flush_locked(region, reason)
                if leaf.value is None:
                    why = getattr(leaf.region, "error", None) or "failed (see that error, raised earlier)"
                    raise RuntimeError(f"pjrt fused eager: this tensor has no value: the region that computes it {why}")
            leaf = leaf.value
        out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)


def flush(reason: str = "synchronize") -> None:
    """Run this thread's region now (a sync point named `reason`, as eager_stats reports it)."""
    region = _slot().region
    if region is not None and region.calls:
        with _lock:
            _flush_locked(region, reason)


def flush_all(reason: str = "synchronize") -> None:
    """Run every thread's region now."""
    with _lock:
        for region in list(_open):
            _flush_locked(region, reason)


@default_dtype.on_change
def _forget_traces() -> None:
    """Calls' output shapes and regions' executables, traced under another default dtype."""
    with _lock:
        for table in (_shapes, _executables, _one_op_runs, _seen, _variants, _call_by_call, _compiled_last,
                      _compiled_at_first_sight):
            table.clear()


def _flush_locked(region: Region, reason: str) -> None:
    safe_point()  # before the test: a change of the default dtype runs this region itself
    if region.ran or not region.calls:
        return
    if _load_runtime().run_cached_region(region, reason):  # a cached executable: run from C++
        return
    try:
        region.ran = True
        _open.discard(region)
        _run(region, reason)
    except BaseException as error:
        if region.done:
            _release(region)  # its values came: an interruption after them loses nothing
        elif interruption(error):
            _after_interruption(region, error)
        else:
            _fail(region, error)
        raise
    _release(region)


def _after_interruption(region: Region, error: BaseException) -> None:
    """`error` interrupted `region`'s run before its results came. With its inputs intact, the
    region stays as it was (its thread goes on recording into it) and runs at the next sync point;
    where the run had consumed donated inputs, its values are lost and say so when read."""
    if any(type(a) is _ARRAY and a.is_deleted() for a in region.inputs):
        _fail(region, error)
    else:
        region.ran = False
        _open.add(region)


def _release(region: Region) -> None:
    """A region that ran lets go of its arrays. (Pending.region <-> region.outputs is a cycle: break it,
    so the region's arrays go now.)"""
    for pending in region.outputs:
        pending.region = None
    region.outputs.clear()
    region.inputs.clear()
    region.input_index.clear()


def _fail(region: Region, error: BaseException) -> None:
    """A region whose run raised `error` and cannot run again: its pending values keep the region,
    which says why they have no value when one is read."""
    if interruption(error):
        region.error = (f"was interrupted ({type(error).__name__}) after its run had consumed its inputs "
                        "(donated buffers): its results are lost")
    else:
        region.error = f"failed: {type(error).__name__}: {error}"
    region.calls.clear()
    region.structure.clear()
    region.outputs.clear()  # the Pendings keep the region (for its error), the region nothing
    region.inputs.clear()
    region.input_index.clear()


def _run(region: Region, reason: str) -> None:
    _ended_by[reason] += 1
    _stats["regions"] += 1
    _stats["python_runs"] += 1
    _stats["ops"] += len(region.calls)
    inputs = region.inputs
    # the outputs someone holds (the rest are never materialized), the inputs XLA may write in place
    live, donate = _load_runtime().region_plan(region.outputs, inputs, region.input_index)
    key = (region.device, bytes(region.digest), live, donate)
    run = _executables.get(key)
    if run is not None:
        how = "cached"
        _stats["cache_hits"] += 1
        _executables.move_to_end(key)
    else:
        how = _first_run(region, key)
        stored = _storable(region)
        # a first sight compiled by an earlier process: neither run op by op nor compiled again
        if how in ("first sight", "first compile") and stored:
            run = executable_store.stored_region(region.calls, live, donate, inputs)
            if run is not None:
                how = "stored"
                _stats["store_hits"] += 1
        if how == "first compile":  # its calls would each compile: the region compiles instead
            how = _counted_compile(tuple(call[0].name for call in region.calls), region)
            _stats["compiled_at_first_sight"] += 1
        if how == "compiled":
            if len(_compiled_last) > 256:
                _compiled_last.clear()
            calls = region.calls
            build = functools.partial(_region_function, calls, live, donate)
            run = executable_store.region_executable(calls, live, donate, inputs, build) if stored else build()
    _note(region, reason, how, live)
    if run is None:
        _run_call_by_call(region, live)
        if how == "one op" and region.device in (None, 0):  # the C++ runner runs it from now on (pjrt:0's regions)
            _keep(_one_op_runs, MAX_ONE_OP_RUNS, key, _one_op_run(region, live))
        return
    try:
        with _on(region.device):
            results = run(*inputs)
    except Exception as e:  # noqa: BLE001
        if interruption(e):
            raise
        _after_failed_run(region, live, donate, e)
        return
    try:
        _materialize(region, live, results)
    except BaseException:  # interrupted half way: the run's values are kept all the same
        _materialize(region, live, results)
        raise
    if how in ("compiled", "stored"):  # cached once it ran: the C++ runner (run_cached_region) finds built ones only
        _keep(_executables, MAX_EXECUTABLES, key, run)


def _keep(table: collections.OrderedDict, limit: int, key: tuple, run) -> None:
    while len(table) >= limit:
        table.popitem(last=False)
    table[key] = run


def _one_op_run(region: Region, live: tuple):
    """How a region of one call runs, as a function of the region's inputs: the call's own executable
    (op-by-op mode's, from the executable store where the region may use it: found now, after its
    first run), which a region of one call shares rather than compiling one of its own."""
    rec, statics, treedef, refs, _ = region.calls[0]
    operands = [-1 - r for r in refs]  # (a region of one call: every operand is a region input)
    stored = _storable(region) and rec.key is not None
    compiled = executable_store.run_of(_memo_key(rec, statics, treedef, [region.inputs[i] for i in operands])) \
        if stored else None
    if compiled is not None:
        def run(*inputs):
            values = jax.tree_util.tree_leaves(compiled(*jax.tree_util.tree_unflatten(treedef, [inputs[i] for i in operands])))
            return [values[i] for i in live]
    else:
        def run(*inputs):
            env = []
            _apply(rec, statics, treedef, [inputs[i] for i in operands], env, stored, alone=True)
            return [env[i] for i in live]
    return run


def _storable(region: Region) -> bool:
    """Whether a region's executables may come from the executable store (on pjrt:0)."""
    return region.device in (None, 0) and executable_store.on()


def _after_failed_run(region: Region, live: tuple, donate: tuple, error: Exception) -> None:
    """A region's executable raised `error`: run its calls one by one, so the failing call raises
    naming its op, and the calls before it keep their values (out of memory too: as op by op).
    Raised as it is: an interruption (a signal handler's exception is no failure of the calls), and
    any error once the run consumed donated inputs (they are gone; a one-op region's call donates
    none), the device's failure as torch's (platform.torch_error)."""
    if interruption(error):  # (the C++ runner's: fused._run passes interruptions to _flush_locked)
        _after_interruption(region, error)
        raise error
    inputs = region.inputs
    if any(type(inputs[i]) is _ARRAY and inputs[i].is_deleted() for i in donate):
        device_error = platform.torch_error(error)
        if device_error is not error:
            raise device_error from error
        raise error
    # out of memory included: the calls before the one that runs out keep their values (as op by op)
    _run_call_by_call(region, live)


def _materialize(region: Region, live, values, done: bool = True) -> None:
    """Bind the region's live outputs to their values (done: all of them, the region ran)."""
    outputs = region.outputs
    if region.device not in (None, 0):  # a region of factories alone computes uncommitted arrays
        values = committed(values, region.device)
    for i, value in zip(live, values):
        outputs[i].value = value
        _recent_outputs.append(weakref.ref(value))
    region.done = done


def _first_run(region: Region, key: tuple) -> str:
    """How a region without an executable runs: "compiled" (a structure seen before: a loop; or one
    whose calls would each compile an executable of their own, _compiling_is_cheaper), or op by op:
    "one op", "first sight" (a structure that may never come back costs no compile), "recompiling"
    (its calls compiled MAX_VARIANTS structures already: shapes keep changing)."""
    if len(region.calls) == 1:  # its own executable, shared with op-by-op mode
        return "one op"
    seen = hash(key)  # a collision only compiles a region at its first sight
    first_sight = seen not in _seen
    if first_sight:
        if len(_seen) > 65536:
            _seen.clear()
        _seen.add(seen)
        _stats["first_sight"] += 1
    ops = tuple(call[0].name for call in region.calls)
    if len(_variants) > 16384:
        _variants.clear()
    recompiling = ops in _call_by_call or _variants[ops] >= MAX_VARIANTS
    if first_sight or recompiling:
        if _compiling_is_cheaper(region):
            return "first compile" if first_sight else _counted_compile(ops, region)
        if first_sight:
            return "first sight"
        if ops not in _call_by_call:
            _call_by_call.add(ops)
            log.warning("pjrt fused eager: a region of %d ops compiled %d variants (its shapes or static arguments "
                        "keep changing); it runs op by op from now on, unless most of its calls are new", len(ops),
                        _variants[ops])
        _stats["regions_op_by_op"] += 1
        return "recompiling"
    return _counted_compile(ops, region)


def _counted_compile(ops: tuple, region: Region) -> str:
    _variants[ops] += 1
    _log_compile(ops, region)
    _stats["compiles"] += 1
    return "compiled"


def _compiling_is_cheaper(region: Region) -> bool:
    """Whether compiling the region costs less than running it op by op. Op by op compiles one
    executable per distinct call signature that has none in this process or the executable store;
    one program for the region compiles in time that grows with its calls. So: true where the
    distinct new signatures are at least COLD_FRACTION of the calls, and two. A new shape of a
    model's step or of a test's sweep is all new signatures; a loop whose length changes between
    syncs repeats a few (an LSTM cell's), which op by op builds once for every length. A signature
    compiled inside RECURRING earlier first sights counts as built: it keeps coming back in new
    structures (a sweep of one op's out= dtypes), where its own executable would serve them all
    (a model's first steps differ from the next ones once or twice: those still compile whole)."""
    if COLD_FRACTION <= 0 or not _storable(region):  # (without the store op by op runs JAX's own jit,
        return False                                 # whose cache is not asked here)
    cold: set = set()
    inputs, outputs = region.inputs, region.outputs
    for rec, statics, treedef, refs, _ in region.calls:
        if rec.key is None:
            continue
        leaves = [outputs[r] if r >= 0 else inputs[-1 - r] for r in refs]
        memo_key = _memo_key(rec, statics, treedef, leaves)
        if memo_key[3] is None or memo_key in cold or _compiled_at_first_sight[memo_key] >= RECURRING:
            continue
        if executable_store.find(memo_key, rec, memo_key[1], treedef, memo_key[3]) is None:
            cold.add(memo_key)
    if len(cold) < max(2, int(len(region.calls) * COLD_FRACTION)):
        return False
    if len(_compiled_at_first_sight) > 100_000:  # a long sweep's; forgetting costs a compile, no error
        _compiled_at_first_sight.clear()
    _compiled_at_first_sight.update(cold)
    return True


def _region_function(calls: list, live: tuple, donate: tuple):
    def region(*inputs):
        env = []
        for rec, statics, treedef, refs, _ in calls:
            _apply(rec, statics, treedef, [env[r] if r >= 0 else inputs[-1 - r] for r in refs], env)
        return [env[i] for i in live]

    return jax.jit(region, donate_argnums=donate)


def _apply(rec, statics, treedef, leaves, env, stored: bool = False, alone: bool = False) -> None:
    """Call `rec` on the recorded operands (`leaves`) and its static arguments; its outputs go to env.
    alone: it runs on its own (not traced into a region), by `rec.alone` where that serves it;
    stored: on its own, its executable from the executable store where it may come from there."""
    dynamic = jax.tree_util.tree_unflatten(treedef, leaves)
    if alone and rec.alone is not None:
        outputs = rec.alone(*_merge(rec, statics, dynamic))
        if outputs is not None:
            env.extend(jax.tree_util.tree_leaves(outputs))
            return
    if stored and rec.key is not None:
        memo_key = _memo_key(rec, statics, treedef, leaves)
        run = executable_store.run_of(memo_key)
        avals = memo_key[3]
        if run is None and avals is not None and executable_store.usable(leaves):
            run = executable_store.executable(memo_key, rec, memo_key[1], treedef, avals,
                                              _merge(rec, statics, dynamic))
        if run is not None:
            env.extend(jax.tree_util.tree_leaves(run(*dynamic)))
            return
    outer, _here.replaying = replaying(), True
    try:
        env.extend(jax.tree_util.tree_leaves(rec.fn(*_merge(rec, statics, dynamic))))
    finally:
        _here.replaying = outer


def replaying() -> bool:
    """Whether this thread traces a recorded call again (into its region's program, or on its own).
    Its kind of call was accepted when it was recorded: by its own first trace in this process, or
    by an earlier process whose executable the store held (then this trace is its first here), so
    a trace now wants the meta kernel's layout, not its verdict (errors.meta_check)."""
    return getattr(_here, "replaying", False)


def _memo_key(rec, statics, treedef, leaves) -> tuple:
    """A call's key in the executable store's memo (avals None: a host operand, JAX's own path)."""
    try:
        avals = tuple(leaf.aval for leaf in leaves)
    except AttributeError:  # a host value (a numpy seed)
        avals = None
    return rec, _typed(statics) if statics else (), treedef, avals


def _merge(rec, statics, dynamic) -> list:
    """A call's arguments in order: its static ones (at rec.static) and its dynamic ones."""
    if not rec.static:
        return dynamic
    given, rest = dict(zip(rec.static, statics)), iter(dynamic)
    return [given[i] if i in given else next(rest) for i in range(len(statics) + len(dynamic))]


def _run_call_by_call(region: Region, live: tuple) -> None:
    """The region's calls one by one (each its own executable, as op-by-op mode runs them)."""
    env = []
    stored = _storable(region)
    with _on(region.device):
        for rec, statics, treedef, refs, _ in region.calls:
            leaves = [env[r] if r >= 0 else region.inputs[-1 - r] for r in refs]
            try:
                _apply(rec, statics, treedef, leaves, env, stored, alone=True)
            except Exception as e:  # noqa: BLE001
                if interruption(e):  # (the region goes back to its thread and runs whole: _after_interruption)
                    raise
                # the calls before this one ran, as they would have op by op (CUDA's): their values stay
                ran = [i for i in live if i < len(env)]
                _materialize(region, ran, [env[i] for i in ran], done=False)
                device_error = platform.torch_error(e)
                if device_error is not e:  # the device's failure (out of memory): torch's type
                    raise device_error from e
                raise RuntimeError(f"pjrt fused eager: {rec.name} failed when its region ran: "
                                   f"{type(e).__name__}: {e}") from e
    _materialize(region, live, [env[i] for i in live])


def _on(device: int | None):
    """JAX's default device set to pjrt:device, where a call without committed operands (a factory)
    puts its outputs. Only set off pjrt:0: the default device is part of JAX's trace cache's key,
    so setting it always would trace every executable again."""
    return contextlib.nullcontext() if device in (None, 0) else jax.default_device(platform.device(device))


def _note(region: Region, reason: str, how: str, live: tuple) -> None:
    _recent_regions.append({"ops": len(region.calls), "ended_by": reason, "executable": how,
                            "outputs": len(region.outputs), "materialized": len(live)})


def _log_compile(ops: tuple, region: Region) -> None:
    """Say why a region compiles: new, or what differs from the last structure of the same ops."""
    previous = _compiled_last.get(ops)
    _compiled_last[ops] = region.structure
    if not log.isEnabledFor(logging.INFO):
        return
    if previous is None:
        log.info("pjrt fused eager: compiling a new region of %d ops (%s ... %s)", len(ops), ops[0], ops[-1])
        return
    for k, (a, b) in enumerate(zip(previous, region.structure)):
        if a != b:
            log.info("pjrt fused eager: recompiling a region of %d ops: op %d (%s) has other shapes, dtypes, static "
                     "arguments or operands than when it last compiled", len(ops), k, ops[k])
            return
    log.info("pjrt fused eager: recompiling a region of %d ops: other outputs are used, or other inputs donated",
             len(ops))


# ------------------------------------------------------------------------------ controls
def set_enabled(on: bool) -> None:
    """Fused (True) or op-by-op (False) eager from now on; what is recorded runs first."""
    global enabled
    flush_all("mode change")
    enabled = bool(on)
    from .build import load

    load().set_fused(enabled)


def stats() -> dict:
    with _lock:
        regions = _stats["regions"]
        return {
            "mode": "fused" if enabled else "op",
            "regions": regions,
            "ops_per_region": _stats["ops"] / regions if regions else 0.0,
            "region_compiles": _stats["compiles"],
            "region_cache_hits": _stats["cache_hits"],
            "regions_first_sight": _stats["first_sight"],
            # first sights whose calls had no executables yet: compiled at once, not op by op (_compiling_is_cheaper)
            "region_compiles_at_first_sight": _stats["compiled_at_first_sight"],
            "regions_op_by_op": _stats["regions_op_by_op"],
            "region_store_hits": _stats["store_hits"],  # compiled by an earlier process (executable_store.py)
            # run by this Python (first sight, compile, op by op, another device's); the rest by the C++ runner
            "regions_run_in_python": _stats["python_runs"],
            "ended_by": dict(_ended_by),
            "recent_regions": list(_recent_regions),
            "pending_ops": sum(len(region.calls) for region in _open),
        }


def recorded_counts() -> dict:
    """Calls this Python recorder took, by what was recorded (an op's name, a storage step's)."""
    return dict(_recorded)


def reset_stats() -> None:
    with _lock:
        _recorded.clear()
        _stats.clear()
        _ended_by.clear()
        _recent_regions.clear()
