"""torch.compile(model) with the default backend (inductor) on pjrt tensors.

Inductor has no code generator for pjrt, and it should not need one: XLA is the code
generator. torch.compile's default backend is not looked up in Dynamo's registry (torch
builds inductor's wrapper directly), so the hook is inductor's own out-of-tree device API,
`register_backend_for_device` (the one torch_tpu and other out-of-tree devices use):

- its `device_custom_pass` runs on every post-grad graph (functionalized ATen, after
  AOTAutograd) that touches a pjrt tensor. It replaces the graph's body by one call of the
  custom op `torch_pjrt::inductor_graph_<n>`, which runs the body through the same path as
  `backend="pjrt"` (`compile_graph`: the op-table interpreter, one XLA executable). Input
  mutations (a static KV cache's `index_copy_`) stay inside that executable; the op
  declares the mutated inputs, so inductor orders the call like any mutating extern kernel.
- its scheduling and wrapper entries let inductor emit the Python wrapper that calls the op
  (an extern kernel: inductor generates no pjrt kernels; the scheduling refuses to).

Inductor's FX-graph cache stores that wrapper, and a later process can load it without
running the pass, so each graph is also stored on disk (pickled, keyed by its content) and
read back on the first call. Limits are in docs/compile.md.
"""
from __future__ import annotations

import hashlib
import operator
import os
import pickle
import threading
from pathlib import Path

import torch
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    get_scheduling_for_device,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.scheduler import BaseScheduling
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files

from . import cache


class InductorGraph:
    """One post-grad graph handed over by inductor: the graph, where each of the op's
    arguments sits among its placeholders, and (on first call) its compiled executable."""

    def __init__(self, gm: torch.fx.GraphModule, placement):
        self.gm = gm
        self.placement = placement  # per placeholder: ("mutated" | "inputs" | "sizes", index)
        self.compiled = None
        self.lock = threading.Lock()

    def arguments(self, mutated, inputs, sizes):
        groups = {"mutated": mutated, "inputs": inputs, "sizes": sizes}
        return [groups[group][i] for group, i in self.placement]

    def run(self, key, mutated, inputs, sizes):
        args = self.arguments(mutated, inputs, sizes)
        with self.lock:
            if self.compiled is None:
                from .backend import Config, compile_graph

                self.compiled = compile_graph(self.gm, args, config=Config(), name=f"inductor_{key[:12]}")
        return self.compiled(list(args))

    def __getstate__(self):
        return {"gm": self.gm, "placement": self.placement}

    def __setstate__(self, state):
        self.__init__(state["gm"], state["placement"])


_graphs: dict[str, InductorGraph] = {}


def _store_dir() -> Path:
    return cache.directory().parent / "inductor_graphs"


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


_library = torch.library.Library("torch_pjrt", "FRAGMENT")
_ops: dict[int, torch._ops.OpOverload] = {}


def graph_op(n_outputs: int) -> torch._ops.OpOverload:
    """`torch_pjrt::inductor_graph_<n>`: run graph `key`, returning its n tensor outputs.

    One op per output count because inductor calls a mutating custom op only when its
    returns are plain tensors (no `Tensor[]`), so the arity must be in the schema."""
    op = _ops.get(n_outputs)
    if op is None:
        name = f"inductor_graph_{n_outputs}"
        returns = "()" if n_outputs == 0 else "Tensor" if n_outputs == 1 else f"({', '.join(['Tensor'] * n_outputs)})"
        _library.define(f"{name}(str key, Tensor(a!)[] mutated, Tensor[] inputs, SymInt[] sizes) -> {returns}")

        def run(key, mutated, inputs, sizes):
            return _results(_lookup(key).run(key, mutated, inputs, sizes), n_outputs)

        def fake(key, mutated, inputs, sizes):
            # the graph itself under fake tensors gives each output's shape, dtype and strides
            graph = _graphs[key]
            return _results([r.clone() for r in graph.gm(*graph.arguments(mutated, inputs, sizes))], n_outputs)

        _library.impl(name, run, "CompositeExplicitAutograd")
        torch.library.register_fake(f"torch_pjrt::{name}", fake, lib=_library)
        op = _ops[n_outputs] = getattr(torch.ops.torch_pjrt, name).default
    return op


def _results(values, n_outputs):
    return None if n_outputs == 0 else values[0] if n_outputs == 1 else tuple(values)


def _is_tensor(node) -> bool:
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)


def _mutated_placeholders(gm) -> set:
    """Placeholders written by a `copy_` (AOTAutograd's input mutations kept in the graph)."""
    written = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder":
            written.add(node.args[0])
    return written


class HandGraphToPjrt(CustomGraphModulePass):
    """Inductor's post-grad pass for pjrt: the graph's body becomes one `inductor_graph` call."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        graph = gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        written = _mutated_placeholders(gm)
        groups = {"mutated": [], "inputs": [], "sizes": []}
        placement = []
        for node in placeholders:
            group = "mutated" if node in written else "inputs" if _is_tensor(node) else "sizes"
            placement.append((group, len(groups[group])))
            groups[group].append(node)
        output = graph.output_node()
        flat, spec = torch.utils._pytree.tree_flatten(output.args[0])
        # computed tensors come back from the op; placeholders and symbolic sizes stay as they are
        routed = [i for i, v in enumerate(flat) if _is_tensor(v) and v.op != "placeholder"]
        if not routed and not written:
            return
        body = torch.fx.GraphModule(gm, copy_graph(graph, placeholders, routed, flat))
        key = hashlib.sha256(body.code.encode() + repr([(n.meta["val"].dtype, n.meta["val"].shape) if _is_tensor(n) else None
                                                        for n in placeholders]).encode()).hexdigest()
        entry = InductorGraph(body, placement)
        _graphs[key] = entry
        _store(key, entry)
        with graph.inserting_before(output):
            call = graph.call_function(graph_op(len(routed)), (key, groups["mutated"], groups["inputs"], groups["sizes"]))
            call.meta["val"] = _results([flat[i].meta["val"] for i in routed], len(routed))
            if len(routed) == 1:
                flat[routed[0]] = call
            for j, i in enumerate(routed if len(routed) > 1 else ()):
                item = graph.call_function(operator.getitem, (call, j))
                item.meta["val"] = flat[i].meta["val"]
                flat[i] = item
        output.args = (torch.utils._pytree.tree_unflatten(flat, spec),)
        for node in reversed(list(graph.nodes)):
            if node.op == "call_function" and node.target is torch.ops.aten.copy_.default and node.args[0] in written:
                graph.erase_node(node)
        graph.eliminate_dead_code()
        gm.recompile()

    def uuid(self):
        return get_hash_for_files((__file__,))


def copy_graph(graph: torch.fx.Graph, placeholders, routed, flat) -> torch.fx.Graph:
    """The body the op runs: every node, returning the routed outputs (mutations included)."""
    body = torch.fx.Graph()
    env = {}
    for node in graph.nodes:
        if node.op == "output":
            break
        env[node] = body.node_copy(node, lambda n: env[n])
    body.output(tuple(env[flat[i]] for i in routed))
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


class PjrtScheduling(BaseScheduling):
    """Inductor asks each device for a scheduling; pjrt graphs reach it holding one extern
    kernel, so there is never a kernel to generate (BaseScheduling raises if asked)."""

    def ready_to_flush(self) -> bool:
        return False

    def flush(self) -> None:
        pass

    def codegen_sync(self) -> None:
        pass


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
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    register_device_op_overrides("pjrt", PjrtDeviceOpOverrides())
    register_backend_for_device("pjrt", PjrtScheduling, PythonWrapperCodegen, device_custom_pass=HandGraphToPjrt())
