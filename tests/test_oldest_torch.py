"""torch_pjrt imports on the oldest torch it supports (2.11): every aten op and overload the
package names exists there, or its file names it behind a `hasattr(aten, "...")` guard. (The
first GPU session's image had torch 2.11, and `import torch_pjrt` failed on `_foreach_clone`.)
The list of torch 2.11's overloads is tests/fixtures/aten_ops_torch_2_11.txt."""
from __future__ import annotations

import ast
import pathlib
import re

import torch

import torch_pjrt

PACKAGE = pathlib.Path(torch_pjrt.__file__).parent
OLDEST = pathlib.Path(__file__).parent / "fixtures" / "aten_ops_torch_2_11.txt"


def _is_aten(node: ast.AST) -> bool:
    """`aten` or `torch.ops.aten`."""
    return (isinstance(node, ast.Name) and node.id == "aten") or (
        isinstance(node, ast.Attribute) and node.attr == "aten" and isinstance(node.value, ast.Attribute)
        and node.value.attr == "ops")


def aten_names(source: str) -> set[tuple[str, str | None]]:
    """(op, overload or None) for every `aten.op.overload` and bare `aten.op` in the source's code."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and _is_aten(node.value.value):
            found.add((node.value.attr, node.attr))
        elif isinstance(node, ast.Attribute) and _is_aten(node.value):
            found.add((node.attr, None))
    return found


def test_every_aten_op_named_exists_in_torch_2_11_or_is_guarded():
    overloads = {line for line in OLDEST.read_text().splitlines() if line and not line.startswith("#")}
    packets = {o.split(".")[0] for o in overloads}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        guarded = set(re.findall(r'hasattr\(aten, "(\w+)"\)', source))
        for op, overload in sorted(aten_names(source), key=str):
            if op in guarded:
                continue
            absent = op not in packets if overload is None else f"{op}.{overload}" not in overloads
            if absent:
                missing.append(f"{path.relative_to(PACKAGE)}: aten.{op}{'.' + overload if overload else ''}")
    assert not missing, "named but absent in torch 2.11 (guard with `if hasattr(aten, ...)`):\n" + "\n".join(missing)


def test_the_check_sees_an_op_newer_than_2_11():
    names = aten_names('aten = torch.ops.aten\n@lowering(aten._foreach_clone.default)\ndef f(): pass\n'
                       'x = torch.ops.aten.add.Tensor\n"aten.foo.default in a docstring"\n')
    assert names >= {("_foreach_clone", "default"), ("add", "Tensor")} and ("foo", "default") not in names
    assert hasattr(torch.ops.aten, "_foreach_clone")  # this torch has it; the fixture's 2.11 does not
    assert "_foreach_clone.default" not in OLDEST.read_text().split()
