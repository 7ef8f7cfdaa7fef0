"""Eager executables on disk by call signature: a new process runs a call it met before without
tracing or lowering it.

JAX's persistent cache (compilation_cache.py) is keyed by the lowered program, so a call signature
new to a process pays a trace (the op's meta check included) and a lowering before that cache is
asked: about 10 ms of the 12 an op's executable costs here with a warm cache, 3 of them JAX
creating an MLIR context. Eager code meets many signatures once (a model's first step, a new
shape, a test file), so fused eager's op-by-op runs (runtime/fused.py: a region's first sight, a
region of one call) take their executables from here: each kept under a key made of what decides
its trace (the op table entry, the static arguments, the operands' tree and abstract values, the
default dtype and float32 matmul precision the lowerings read), in a folder named by what could
change any trace (this package's source, torch, jax and jaxlib, JAX's configuration, XLA flags,
the platform). Keys are pickles: two calls share an entry only when everything that decides the
trace pickles to the same bytes; anything that does not pickle is not kept. A region that compiles
(its second sight) is kept the same way, keyed by its calls' keys and wiring, the outputs it keeps,
the inputs it donates and their abstract values: a later process runs it compiled at first sight.
What it keeps is what XLA compiled in that process, keyed in JAX's persistent cache apart from the
same program compiled without the store (`_compile`): after an upgrade, JAX's cache would otherwise
answer for every program and the store would stay empty.

Only op-table kernels (a Recordable with a `key`) on pjrt:0 of a one-process job are kept, with
operands on that device; a user's lowerings and other devices go through JAX as before. A load
counts as a build (JAX's build event, runtime/executable_budget.py) and as a persistent-cache hit
(eager_stats). The store lives in `<cache dir>/executables` (runtime/build.py), or in the folder
`TORCH_PJRT_EXECUTABLE_STORE` names; `TORCH_PJRT_EXECUTABLE_STORE=0` (or `TORCH_PJRT_COMPILE_CACHE=0`)
turns it off.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import jax.monitoring
import torch
from jax.experimental import serialize_executable

from . import compilation_cache, default_dtype, executable_budget, platform
from .build import cache_dir

log = logging.getLogger("torch_pjrt")

# our event for each executable read from this store (eager_stats counts it as a persistent-cache hit)
HIT_EVENT = "/torch_pjrt/executable_store/hits"


class Entry(NamedTuple):
    """One signature's executable: its outputs' tree and abstract values, and the executable
    (a jax.stages.Compiled taking the dynamic arguments; None until first run)."""

    out_treedef: object
    out_avals: tuple
    run: Callable | None
    path: Path | None  # its file (None: not storable)


_memo: dict = {}  # the in-process key (fused's) -> Entry
_state: dict = {}  # "folder": the namespace folder, or None when the store is off
# What XLA did in this thread's last compile: only an executable XLA compiled just then is kept.
# Serializing one JAX read from its persistent cache (or took from its in-memory cache, which may
# hold such a read) loses the kernels' object code (XLA:CPU, jax 0.10: running the copy fails with
# "Function transpose_copy_fusion not found").
_compiling = threading.local()


def _on_event(name: str, **_) -> None:
    if name.endswith("compilation_cache/cache_hits"):
        _compiling.fresh = False


def _on_duration(name: str, _secs: float, **_) -> None:
    if name == executable_budget.BUILD_EVENT and getattr(_compiling, "fresh", None) is None:
        _compiling.fresh = True


jax.monitoring.register_event_listener(_on_event)
jax.monitoring.register_event_duration_secs_listener(_on_duration)


# the store's compile option: a debug option that changes nothing XLA builds (`_compile`)
_NAMESPACE_OPTION = "xla_debug_buffer_assignment_show_max"


def _compile(lowered, keep: bool):
    """`lowered` compiled, and whether XLA compiled it just now (no cache of JAX's gave it).

    One to `keep` is compiled with an option of this store's namespace, which JAX's persistent
    cache keys by: a program that cache holds from elsewhere (an earlier version of this package,
    whose namespace differs, or a process with the store off) is compiled afresh here, once, and
    can be kept. Left to hit that cache it never would be, and every later process would trace and
    lower it again. The option changes nothing XLA builds (how many buffers a debug dump lists)."""
    _compiling.fresh = None
    namespace = _state.get("namespace") if keep else None
    if namespace is None:
        return lowered.compile(), _compiling.fresh is True
    try:
        compiled = lowered.compile(compiler_options={_NAMESPACE_OPTION: namespace})
    except jax.errors.JaxRuntimeError as refused:
        if _NAMESPACE_OPTION not in str(refused):
            raise  # the program's own error
        # a PJRT plugin that takes no such XLA option ("No such compile option"): compiled without
        log.debug("pjrt: the executable store's compile option was refused (%s); compiling without it", refused)
        _state["namespace"] = None
        _compiling.fresh = None
        compiled = lowered.compile()
    return compiled, _compiling.fresh is True


_OFF, _ON = ("0", "false", "off", "no"), ("", "1", "true", "on", "yes")


def enabled() -> bool:
    return os.environ.get("TORCH_PJRT_EXECUTABLE_STORE", "").lower() not in _OFF and compilation_cache.enabled()


def _root() -> Path:
    """TORCH_PJRT_EXECUTABLE_STORE when it names a folder, else `<cache dir>/executables`."""
    setting = os.environ.get("TORCH_PJRT_EXECUTABLE_STORE", "")
    return Path(setting) if setting.lower() not in _ON else cache_dir() / "executables"


def _settings() -> list:
    """This package's environment settings a lowering may read at trace time (TORCH_PJRT_FLASH_SDPA...)."""
    return sorted((k, v) for k, v in os.environ.items()
                  if k.startswith("TORCH_PJRT_") and "CACHE" not in k and k != "TORCH_PJRT_EXECUTABLE_STORE")


def _folder() -> Path | None:
    if "folder" in _state:
        return _state["folder"]
    folder = None
    if enabled() and jax.process_count() == 1:
        config = sorted((k, repr(v)) for k, v in jax.config.values.items()
                        if "cache" not in k and "log" not in k and "explain" not in k)
        devices = platform.devices()
        world = (compilation_cache.source_digest(), torch.__version__, jax.__version__, jax.lib.__version__, sys.version,
                 config, os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""), _settings(),
                 devices[0].platform, devices[0].device_kind, len(devices),
                 getattr(devices[0].client, "platform_version", ""))
        name = hashlib.sha256(repr(world).encode()).hexdigest()[:32]
        folder = _root() / name
        _state["namespace"] = int(name[:12], 16)
        compilation_cache.tidy(folder)
    _state["folder"] = folder
    return folder


def _path(rec, statics, treedef, avals) -> Path | None:
    """The file of a signature (None: the store is off, or the signature does not pickle)."""
    if _folder() is None:
        return None
    return _file((rec.key, statics, treedef, [(a.shape, str(a.dtype), a.weak_type) for a in avals]))


def _file(key: tuple) -> Path | None:
    """The file of `key` with the state lowerings read at trace time (None: it does not pickle)."""
    try:
        blob = pickle.dumps((key, torch.get_default_dtype(), torch.get_float32_matmul_precision()), protocol=4)
    except Exception:  # noqa: BLE001  (a static argument that does not pickle: not kept)
        return None
    name = hashlib.sha256(blob).hexdigest()
    return _folder() / name[:2] / name


def on() -> bool:
    """Whether this process keeps executables here."""
    return _folder() is not None


def usable(leaves) -> bool:
    """Whether a call of an op-table kernel (a Recordable with a key) on `leaves` may use the
    store: every operand is an array on pjrt:0 (a sharded or other-device operand compiles
    another program)."""
    device = {platform.device(0)}
    return all(isinstance(leaf, jax.Array) and leaf.sharding.device_set == device for leaf in leaves)


def run_of(memo_key):
    """This process's executable of a signature, if it has one (the steady state's one lookup)."""
    entry = _memo.get(memo_key)
    return entry.run if entry is not None else None


def find(memo_key, rec, statics, treedef, avals) -> Entry | None:
    """The entry of a signature: this process's, else the one on disk (its outputs only; the
    executable is read at its first run)."""
    entry = _memo.get(memo_key)
    return entry if entry is not None else _read(memo_key, _path(rec, statics, treedef, avals))


def _read(memo_key, path: Path | None) -> Entry | None:
    if path is None or not path.exists():
        return None
    try:
        with open(path, "rb") as f:
            out_treedef, out_avals = pickle.load(f)
    except Exception as e:  # noqa: BLE001  (a file cut short, another version's pickle: built again)
        log.debug("pjrt: executable store entry %s unreadable (%s)", path, e)
        return None
    entry = _memo[memo_key] = Entry(out_treedef, out_avals, None, path)
    return entry


def executable(memo_key, rec, statics, treedef, avals, full: list) -> Callable:
    """The executable of a call of `rec` on `full` (its static and dynamic arguments, in order):
    this process's, else read from disk, else built by JAX (and written)."""
    entry = _memo.get(memo_key)
    path = entry.path if entry is not None else _path(rec, statics, treedef, avals)
    if entry is None:
        entry = _read(memo_key, path)
    if entry is not None and entry.run is not None:
        return entry.run
    if entry is not None:
        run = _load(path)
        if run is not None:
            _memo[memo_key] = entry._replace(run=run)
            if rec.loaded is not None:
                rec.loaded(full)
            return run
    lowered = rec.fn.lower(*full)
    compiled, fresh = _compile(lowered, keep=path is not None)
    out_leaves, out_treedef = jax.tree_util.tree_flatten(compiled.out_info)
    out_avals = tuple(jax.core.ShapedArray(o.shape, o.dtype, weak_type=getattr(o, "weak_type", False))
                      for o in out_leaves)
    _memo[memo_key] = Entry(out_treedef, out_avals, compiled, path)
    if path is not None and fresh and _keepable(lowered):
        _write(path, compiled, out_treedef, out_avals)
    return compiled


def _keepable(lowered) -> bool:
    """Whether a program compiled afresh may be kept: it calls no custom call. A custom call's target
    (LAPACK's, FFT's, a host callback) is registered in the process that lowered it, when it
    lowered it: another process that only reads the executable has none, and XLA:CPU crashes (a
    segfault, not an error) running it (linalg.det, jax 0.10.2)."""
    return "custom_call" not in lowered.as_text()


def _region_path(calls: list, live: tuple, donate: tuple, inputs: list) -> Path | None:
    """The file of a region (None: a call that is not kept, an operand that is no array on pjrt:0)."""
    if any(call[0].key is None for call in calls) or not usable(inputs):
        return None
    return _file(([(rec.key, statics, treedef, refs, n) for rec, statics, treedef, refs, n in calls],
                  live, donate, [(x.shape, str(x.dtype), x.aval.weak_type) for x in inputs]))


def stored_region(calls: list, live: tuple, donate: tuple, inputs: list) -> Callable | None:
    """The executable of a region an earlier process compiled (runtime/fused.py's region: its calls,
    the outputs it keeps, the inputs it donates, its inputs), or None."""
    path = _region_path(calls, live, donate, inputs)
    return _load(path) if path is not None and path.exists() else None


def region_executable(calls: list, live: tuple, donate: tuple, inputs: list, build: Callable) -> Callable:
    """A region's executable, compiled now: `build()` (its jitted function) lowered and compiled on
    `inputs`, and kept for later processes; `build()` itself where the region cannot be kept."""
    path = _region_path(calls, live, donate, inputs)
    if path is None:
        return build()
    lowered = build().lower(*inputs)
    compiled, fresh = _compile(lowered, keep=True)
    if fresh and _keepable(lowered):
        _write(path, compiled, None, ())
    return compiled


def _load(path: Path):
    start = time.perf_counter()
    try:
        with open(path, "rb") as f:
            pickle.load(f)  # the outputs (find read them)
            serialized, in_tree, out_tree = pickle.load(f)
        run = serialize_executable.deserialize_and_load(serialized, in_tree, out_tree,
                                                        execution_devices=[platform.device(0)])
    except Exception as e:  # noqa: BLE001  (unreadable: built again)
        log.debug("pjrt: executable store entry %s not loaded (%s)", path, e)
        return None
    jax.monitoring.record_event_duration_secs(executable_budget.BUILD_EVENT, time.perf_counter() - start)
    jax.monitoring.record_event(HIT_EVENT)
    return run


def _write(path: Path, compiled, out_treedef, out_avals) -> None:
    try:
        serialized = serialize_executable.serialize(compiled)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")
        with open(partial, "wb") as f:
            pickle.dump((out_treedef, out_avals), f, protocol=4)
            pickle.dump(serialized, f, protocol=4)
        os.replace(partial, path)  # whole or absent: a concurrent reader never sees half a file
    except Exception as e:  # noqa: BLE001  (an executable JAX cannot serialize, a full disk: not kept)
        log.debug("pjrt: executable store could not keep %s (%s)", path, e)


@default_dtype.on_change
def _forget_traces() -> None:
    _memo.clear()


executable_budget.on_release(_memo.clear)
