"""The folders are DESIGN.md's layers, and data flows down: no module imports from a layer above.

Read statically (every import statement, function-level ones included), so the test sees
imports that run only on some paths.
"""
from __future__ import annotations

import ast
import pathlib

import torch_pjrt

# Rank per top-level module or package of torch_pjrt; a module may import its own layer and
# lower ranks. ops and runtime share a rank but must not import each other: the op table
# is pure (no storage, no device), and the runtime knows no op.
RANKS = {
    "dtypes": 0, "version": 0,
    "ops": 1, "runtime": 1,
    "eager": 2,
    "distributed": 3,
    "compiler": 4,
    "kernels": 5,
    "device": 6, "autocast": 6, "cli": 6, "tools": 6, "integrations": 6, "__init__": 6,
}
APART = {("ops", "runtime"), ("runtime", "ops")}
ROOT = pathlib.Path(torch_pjrt.__file__).parent


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: pathlib.Path):
    rel = path.relative_to(ROOT.parent).with_suffix("")
    module = ".".join(rel.parts)
    package = module.removesuffix(".__init__") if rel.name == "__init__" else module.rsplit(".", 1)[0]
    module = module.removesuffix(".__init__")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - (node.level - 1)])
            targets = [f"{base}.{node.module}"] if node.module else [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = [node.module or ""]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            if target == "torch_pjrt" or target.startswith("torch_pjrt."):
                yield module, node.lineno, target


def test_every_module_has_a_layer():
    layers = {_layer(".".join(p.relative_to(ROOT.parent).with_suffix("").parts)) for p in ROOT.rglob("*.py")}
    assert layers <= set(RANKS), f"modules outside the known layers: {sorted(layers - set(RANKS))}"


def test_no_module_imports_from_a_layer_above():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        for module, line, target in _imports(path):
            src, dst = _layer(module), _layer(target)
            if RANKS[dst] > RANKS[src] or (src, dst) in APART:
                upward.append(f"{module}:{line} imports {target} ({src} -> {dst})")
    assert not upward, "imports that reach up a layer:\n" + "\n".join(upward)
