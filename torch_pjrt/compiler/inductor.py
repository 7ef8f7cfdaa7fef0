"""torch.compile(model) with the default backend (inductor) on pjrt tensors.

Inductor has no code generator for pjrt, and it should not need one: XLA is the code
generator. torch.compile's default backend is not looked up in Dynamo's registry (torch
builds inductor's wrapper directly), so the hook is inductor's own out-of-tree device API,
`register_backend_for_device` (the one torch_tpu and other out-of-tree devices use):

- its `device_custom_pass` runs on every post-grad graph (functionalized ATen, after
  AOTAutograd) that touches a pjrt tensor. It replaces the graph's body by one call of the
  custom op `torch_pjrt::inductor_graph`, which runs the body through the same path as
  `backend="pjrt"` (`compile_graph`: the op-table interpreter, one XLA executable) and
  returns the graph's outputs and its mutated inputs' new values; `torch_pjrt::write_back`
  then stores those into the inputs (a static KV cache's `index_copy_`), an op that
  declares what it mutates, so inductor orders it like any mutating extern kernel.
- its scheduling and wrapper entries let inductor emit the Python wrapper that calls the op
  (an extern kernel: inductor generates no pjrt kernels; the scheduling refuses to).

Inductor's FX-graph cache stores that wrapper, and a later process can load it without
running the pass, so each graph is also stored on disk (pickled, keyed by its content) and
read back on the first call. Limits are in docs/compile.md.
"""
from __future__ import annotations

import functools
import hashlib
import operator
import os
import pickle
import threading
import uuid
from pathlib import Path

import torch
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    get_scheduling_for_device,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files

from ..runtime import storage
from ..runtime.build import cache_dir


class InductorGraph:
    """One post-grad graph handed over by inductor: its body (placeholders in order, the
    tensors ones and the symbolic sizes), and on first call its compiled executable."""

    def __init__(self, gm: torch.fx.GraphModule, placement):
        self.gm = gm
        self.placement = placement  # per placeholder: ("inputs" | "sizes", index)
        self.compiled = None
        self.lock = threading.Lock()

    def arguments(self, inputs, sizes):
        groups = {"inputs": inputs, "sizes": sizes}
        return [groups[group][i] for group, i in self.placement]

    def run(self, key, inputs, sizes):
        args = self.arguments(inputs, sizes)
        with self.lock:
            if self.compiled is None:
                from .backend import Config, compile_graph

                if any("val" not in n.meta for n in self.gm.graph.nodes if n.op != "output"):
                    _propagate_meta(self.gm, args)
                self.compiled = compile_graph(self.gm, args, config=Config(), name=f"inductor_{key[:12]}")
        return self.compiled(list(args))

    def __getstate__(self):
        return {"gm": self.gm, "placement": self.placement}

    def __setstate__(self, state):
        self.__init__(state["gm"], state["placement"])


_graphs: dict[str, InductorGraph] = {}


def _propagate_meta(gm: torch.fx.GraphModule, args) -> None:
    """A graph read back from disk lost its nodes' fake values (they do not pickle): the
    interpreter reads each node's shape and dtype from them, so recompute them for `args`."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fake)


def _store_dir() -> Path:
    return cache_dir() / "inductor_graphs"


def _store_id() -> str:
    """A random name the store takes when it is created, read back by later processes."""
    path = _store_dir() / "store-id"
    try:
        return path.read_text()
    except OSError:
        pass
    name = uuid.uuid4().hex
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(name)
        try:
            os.link(tmp, path)  # atomic, and refused where another process named the store first
        finally:
            tmp.unlink()
    except FileExistsError:
        return path.read_text()
    except OSError:
        pass  # an unwritable store keeps no graph either: a name of this process's own
    return name


def _lookup(key: str) -> InductorGraph:
    graph = _graphs.get(key)
    if graph is None:
        path = _store_dir() / f"{key}.pkl"
        try:
            with open(path, "rb") as f:
                graph = pickle.load(f)
        except OSError as e:
            raise RuntimeError(
                f"torch.compile on pjrt: inductor's cache refers to graph {key}, which is not in {path} "
                f"({e.strerror}); clear inductor's cache (torch._inductor.codecache.FxGraphCache.clear()) or "
                "set TORCHINDUCTOR_FX_GRAPH_CACHE=0") from None
        _graphs[key] = graph
    return graph


# A functional op and a separate write-back: inductor calls a custom op that mutates its
# arguments only when it returns plain tensors (no Tensor[]), and a graph's output count varies.
@torch.library.custom_op("torch_pjrt::inductor_graph", mutates_args=())
def inductor_graph(key: str, inputs: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
    """Run stored graph `key` (one XLA executable): its outputs, then its mutated inputs' new values."""
    return _lookup(key).run(key, inputs, sizes)


@inductor_graph.register_fake
def _(key, inputs, sizes):
    # the graph itself under fake tensors gives each output's shape, dtype and strides
    graph = _graphs[key]
    return [r.clone() for r in graph.gm(*graph.arguments(inputs, sizes))]


@torch.library.custom_op("torch_pjrt::write_back", mutates_args=("targets",))
def write_back(targets: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    """The graph's input mutations: each target takes its new value (a buffer swap where whole)."""
    for target, value in zip(targets, values):
        if target.device.type == "pjrt" and value.device.type == "pjrt":
            storage.write(target, storage.read(value))
        else:
            target.copy_(value)


@write_back.register_fake
def _(targets, values):
    return None


def _is_tensor(node) -> bool:
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)


def _is_input_mutation(node) -> bool:
    """AOTAutograd keeps an input mutation in the graph as `copy_(placeholder, new value)`."""
    return node.op == "call_function" and node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder"


class HandGraphToPjrt(CustomGraphModulePass):
    """Inductor's post-grad pass for pjrt: the graph's body becomes one `inductor_graph`
    call (and one `write_back` for its input mutations)."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        graph = gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        mutations = [n for n in graph.nodes if _is_input_mutation(n)]
        groups = {"inputs": [], "sizes": []}
        placement = []
        for node in placeholders:
            group = "inputs" if _is_tensor(node) else "sizes"
            placement.append((group, len(groups[group])))
            groups[group].append(node)
        output = graph.output_node()
        flat, spec = torch.utils._pytree.tree_flatten(output.args[0])
        # computed tensors come back from the op; placeholders and symbolic sizes stay as they are
        routed = [i for i, v in enumerate(flat) if _is_tensor(v) and v.op != "placeholder"]
        if not routed and not mutations:
            return
        returned = [flat[i] for i in routed] + [m.args[1] for m in mutations]
        body = torch.fx.GraphModule(gm, _body(graph, returned))
        signature = [(n.meta["val"].dtype, tuple(n.meta["val"].shape)) if _is_tensor(n) else None for n in placeholders]
        key = hashlib.sha256((body.code + repr(signature)).encode()).hexdigest()
        entry = InductorGraph(body, placement)
        _graphs[key] = entry
        _store(key, entry)
        with graph.inserting_before(output):
            call = graph.call_function(inductor_graph._opoverload, (key, groups["inputs"], groups["sizes"]))
            call.meta["val"] = [v.meta["val"] for v in returned]
            items = []
            for j, value in enumerate(returned):
                item = graph.call_function(operator.getitem, (call, j))
                item.meta["val"] = value.meta["val"]
                items.append(item)
            if mutations:
                graph.call_function(write_back._opoverload, ([m.args[0] for m in mutations], items[len(routed):]))
        for j, i in enumerate(routed):
            flat[i] = items[j]
        output.args = (torch.utils._pytree.tree_unflatten(flat, spec),)
        for node in mutations:
            graph.erase_node(node)
        graph.eliminate_dead_code()
        gm.recompile()

    def uuid(self):
        # Inductor's cache key holds this: a wrapper it stored is used only with the store that
        # holds its graphs (a new or cleared TORCH_PJRT_CACHE_DIR is a cache miss, not an error).
        return hashlib.sha256(get_hash_for_files((__file__,)) + _store_id().encode()).hexdigest()


def _body(graph: torch.fx.Graph, returned) -> torch.fx.Graph:
    """The graph the op runs: every node but the input mutations, returning `returned`."""
    body = torch.fx.Graph()
    env = {}
    for node in graph.nodes:
        if node.op == "output":
            break
        if not _is_input_mutation(node):
            env[node] = body.node_copy(node, lambda n: env[n])
    body.output(tuple(env[v] for v in returned))
    return body


def _store(key: str, entry: InductorGraph) -> None:
    folder = _store_dir()
    path = folder / f"{key}.pkl"
    if path.exists():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(entry, f)
        os.replace(tmp, path)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass  # a graph that cannot be stored still runs in this process; a cache hit elsewhere says so


def pjrt_scheduling(scheduler):
    """Inductor asks each device for a scheduling; pjrt graphs reach it holding one extern
    kernel, so there is never a kernel to generate (BaseScheduling raises if asked)."""
    return _scheduling_class()(scheduler)


@functools.lru_cache(1)
def _scheduling_class():
    # imported on first use: torch_pjrt.compiler loads while torch._inductor may still be
    # importing itself (it imports torch._dynamo), and the scheduler module needs all of it
    from torch._inductor.scheduler import BaseScheduling

    class PjrtScheduling(BaseScheduling):
        def ready_to_flush(self) -> bool:
            return False

        def flush(self) -> None:
            pass

        def codegen_sync(self) -> None:
            pass

    return PjrtScheduling


class _ForwardToPythonWrapper(type):
    def __getattr__(cls, name):
        from torch._inductor.codegen.wrapper import PythonWrapperCodegen

        return getattr(PythonWrapperCodegen, name)


class PjrtWrapperCodegen(metaclass=_ForwardToPythonWrapper):
    """Inductor's Python wrapper, looked up on first use (like the scheduling)."""


class PjrtDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name: str) -> str:
        return f"def {name}(_):\n    return 0\n"

    def set_device(self, device_idx: int) -> str:
        return f"torch.pjrt.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.pjrt.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.pjrt.device({device_idx})"


def register() -> None:
    if get_scheduling_for_device("pjrt") is not None:
        return
    register_device_op_overrides("pjrt", PjrtDeviceOpOverrides())
    register_backend_for_device("pjrt", pjrt_scheduling, PjrtWrapperCodegen, device_custom_pass=HandGraphToPjrt())
