"""`torch-pjrt audit`: find what binds a Python project to CUDA.

Python is read with `ast`, so comments, docstrings and strings that are not devices never
count: a "cuda" string is a finding only where it is used as a device (a `device=`
argument, `.to("cuda")`, `torch.device("cuda")`, a default or assignment of a variable
named like a device, a comparison with a device). Dotted names are resolved through the
file's imports and classified by the tables in audit_rules.py. Notebooks, requirements,
setup.py/setup.cfg/pyproject.toml and native sources are scanned too.

Findings that `--fix` can rewrite carry an `Edit` (a character span of the original text
and its replacement), so the rewrite preserves everything else in the file.

A guard (`if torch.cuda.is_available():`, `if x.is_cuda:`, `"cuda" if ... else "cpu"`) is
rewritten only where the code it guards runs on any accelerator once fixed. Where that code
needs CUDA (an extension build, nvidia-smi, `torch.cuda.get_device_name`), rewriting the
guard would run it on pjrt, so the guard and its code stay as written and the audit reports
the path as one `cuda-only` finding.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: pyproject.toml files are skipped
    tomllib = None  # type: ignore[assignment]

from torch_pjrt.tools.audit_rules import (
    AMP_DEVICE_CALLS,
    CATEGORIES,
    CUDA_APIS,
    CUDA_TOOLS,
    EFFORT_HOURS,
    KERNEL_DECORATORS,
    PACKAGES,
    PROCESS_CALLS,
    Api,
    Package,
    Severity,
    lookup_api,
    package_for_dist,
    package_for_import,
    package_named,
)

SKIP_DIRS = frozenset({".git", "__pycache__", ".venv", "venv", "env", "node_modules", "build",
                       "dist", "site-packages", ".tox", ".eggs", ".mypy_cache", ".pytest_cache",
                       ".ipynb_checkpoints"})
NATIVE_CUDA_SUFFIXES = (".cu", ".cuh")
NATIVE_CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh")
CUDA_INCLUDE = re.compile(
    r'^\s*#\s*include\s*[<"](cuda[_./a-z]*|cub/|thrust/|ATen/cuda/|c10/cuda/|cublas|cudnn|'
    r'curand|cufft|cusparse|cusolver|nccl|nvToolsExt)')
CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
DEVICE_NAME = re.compile(r"^(.*_)?dev(ice)?s?(_.*)?$", re.IGNORECASE)
DEVICE_KEYWORDS = frozenset({"device", "map_location", "pin_memory_device"})
REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
CUDA_LOCAL_VERSION = re.compile(r"\+cu\d+")
CUDA_INDEX_URL = re.compile(r"/(cu\d+|cuda)")
SETUP_KEYWORDS = frozenset({"install_requires", "extras_require", "setup_requires",
                            "tests_require"})


@dataclass(frozen=True)
class Finding:
    """One thing that binds the project to CUDA."""

    path: str  # relative to the audited root, with forward slashes
    line: int
    category: str
    severity: Severity
    message: str
    suggestion: str
    cell: int | None = None  # 1-based cell of a notebook
    # Findings with one key are one piece of work, counted once in the estimate: a package's
    # imports and requirements; a CUDA-only path and the findings inside it.
    effort_key: str | None = None
    needs_cuda: bool = False  # the code, as --fix leaves it, fails where CUDA is absent

    @property
    def location(self) -> str:
        cell = f"[cell {self.cell}]" if self.cell is not None else ""
        return f"{self.path}{cell}:{self.line}"

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "cell": self.cell,
                "category": self.category, "severity": self.severity.value,
                "message": self.message, "suggestion": self.suggestion,
                "effort_key": self.effort_key, "needs_cuda": self.needs_cuda}


@dataclass(frozen=True)
class Edit:
    """Replace text[start:end] of a file with `text`."""

    start: int
    end: int
    text: str


@dataclass
class AuditReport:
    root: Path
    findings: list[Finding] = field(default_factory=list)
    files_scanned: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    edits: dict[str, list[Edit]] = field(default_factory=dict)  # path -> edits for --fix
    imported_packages: set[str] = field(default_factory=set)  # Package.name, by any file


@dataclass(frozen=True)
class CategorySummary:
    category: str
    findings: int
    by_severity: dict[Severity, int]
    effort_hours: float


# ---------------------------------------------------------------------------- Python


class _Text:
    """Source text with ast (line, utf-8 byte column) -> character offset conversion."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno <= len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]


def _dotted(node: ast.AST) -> list[str] | None:
    """['a', 'b', 'c'] for the chain a.b.c, None if node is not a pure name chain."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _cuda_string(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if CUDA_STRING.match(node.value):
            return node.value
    return None


def _is_device_name(name: str) -> bool:
    return DEVICE_NAME.match(name) is not None


def _target_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
Span = tuple[int, int]  # character offsets [start, end) in a source


@dataclass(frozen=True)
class _Guard:
    """An `if` (or `a if test else b`) and the code that runs only when its test holds."""

    line: int
    test: tuple[Span, ...]  # the test, and the values of the flags and helpers it calls
    guarded: tuple[Span, ...]
    flags: tuple[str, ...]  # those flags and helpers

    def covers(self, offset: int) -> bool:
        return any(start <= offset < end for start, end in self.guarded)

    def tests(self, offset: int) -> bool:
        return any(start <= offset < end for start, end in self.test)

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.guarded)


@dataclass(frozen=True)
class _Use:
    """A use of a name bound to something CUDA-only (a CUDA extension, a flash-attn function)."""

    offset: int
    line: int
    what: str


def _at_least_simple(severity: Severity) -> Severity:
    """Findings left as written cost at least a simple edit."""
    return max(severity, Severity.SIMPLE_EDIT, key=lambda s: s.rank)


def _test_operands(test: ast.expr) -> Iterator[str]:
    """Flags and helpers a test consists of: `use_cuda`, `has_gpu()`, `not x and self.y`."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yield from _test_operands(test.operand)
    elif isinstance(test, ast.BoolOp):
        for value in test.values:
            yield from _test_operands(value)
    elif isinstance(test, ast.Call) and not test.args:
        yield from _test_operands(test.func)
    elif (name := _target_name(test)) is not None:
        yield name


def _negated(test: ast.expr) -> bool:
    """Whether the test holds when CUDA is absent (`not torch.cuda.is_available()`)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return True
    return (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], (ast.NotEq, ast.IsNot))
            and any(_cuda_string(o) for o in (test.left, *test.comparators)))


def _command_tool(command: ast.AST | None) -> str | None:
    """The CUDA_TOOLS program a command line starts (["nvidia-smi", ...] or "nvcc -V")."""
    if isinstance(command, (ast.List, ast.Tuple)) and command.elts:
        command = command.elts[0]
    elif isinstance(command, ast.JoinedStr) and command.values:
        command = command.values[0]
    if not (isinstance(command, ast.Constant) and isinstance(command.value, str)):
        return None
    words = command.value.split()
    program = words[0].rsplit("/", 1)[-1] if words else ""
    return program if program in CUDA_TOOLS else None


class PythonScan(NamedTuple):
    findings: list[Finding]
    edits: list[Edit]
    imported_packages: set[str]  # Package.name of every package the source imports


class _PythonScanner(ast.NodeVisitor):
    def __init__(self, text: str, path: str, cell: int | None) -> None:
        self.text = _Text(text)
        self.path = path
        self.cell = cell
        self.findings: list[Finding] = []
        self.spans: list[Span] = []  # of each finding's node
        self.edit_of: dict[int, Edit] = {}  # finding index -> its --fix edit
        self.edits: list[Edit] = []
        self.aliases: dict[str, str] = {}  # local name -> dotted module or object name
        self.torch_alias: str | None = None  # module-level name bound to the torch module
        self.consumed: set[int] = set()  # ids of nodes already reported
        self.packages_seen: set[str] = set()
        self.cuda_only_names: dict[str, str] = {}  # name -> what it is bound to
        self.uses: list[_Use] = []
        self.guards: list[_Guard] = []
        self.following: dict[int, list[ast.stmt]] = {}  # id of an `if` -> statements after it
        self.flag_values: dict[str, list[Span]] = {}  # a variable's or helper's values

    # -- bookkeeping

    def scan(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for stmt in tree.body:
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.name == "torch" and alias.asname:
                        self.torch_alias = alias.asname
                    elif alias.name.split(".")[0] == "torch" and not alias.asname:
                        self.torch_alias = "torch"
        self.index_tree(tree)
        self.visit(tree)
        self.keep_cuda_only_paths()
        self.edits = [self.edit_of[i] for i in sorted(self.edit_of)]
        if self.edits and self.torch_alias is None:
            self.edits.append(self._import_torch_edit(tree))

    def index_tree(self, tree: ast.Module) -> None:
        """What guards need before the visit: names whose use needs CUDA (imports from
        CUDA-only packages, CUDA extensions built by load/load_inline), the values of each
        variable and helper function (`use_cuda = torch.cuda.is_available()`), and the
        statements that follow each `if`."""
        for name, target in self.aliases.items():
            package = package_for_import(target)
            if package is not None and not package.works_without_cuda:
                self.cuda_only_names[name] = package.name
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    name = _target_name(target)
                    if name is not None:
                        self.flag_values.setdefault(name, []).append(self.text.span(node.value))
                    if (isinstance(target, ast.Name) and isinstance(node.value, ast.Call)
                            and self.cuda_extension_build(node.value)):
                        self.cuda_only_names[target.id] = "a CUDA extension"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.flag_values.setdefault(node.name, []).extend(
                    self.text.span(r.value) for r in ast.walk(node)
                    if isinstance(r, ast.Return) and r.value is not None)
            for block in ("body", "orelse", "finalbody"):
                statements = getattr(node, block, None)
                if isinstance(statements, list):
                    for index, stmt in enumerate(statements):
                        if isinstance(stmt, ast.If):
                            self.following[id(stmt)] = statements[index + 1:]

    @property
    def torch(self) -> str:
        return self.torch_alias or "torch"

    # The replacements, written with the file's own name for torch.
    @property
    def accelerator(self) -> str:
        return f"{self.torch}.accelerator.current_accelerator()"

    @property
    def accelerator_type(self) -> str:  # a str even without an accelerator
        return f"getattr({self.accelerator}, 'type', 'cpu')"

    def indexed_device(self, index: str = "index") -> str:
        return f"{self.torch}.device({self.accelerator}.type, {index})"

    def resolve(self, node: ast.AST) -> str | None:
        parts = _dotted(node)
        if parts is None:
            return None
        root = self.aliases.get(parts[0], parts[0])
        return ".".join([root, *parts[1:]])

    def add(self, node: ast.AST, category: str, severity: Severity, message: str,
            suggestion: str, edit: tuple[ast.AST | Span, str] | None = None,
            works_without_cuda: bool = False, effort_key: str | None = None) -> None:
        """Report `node`. Automatic findings carry their edit; the others are left as
        written, so they need CUDA unless their rule says they work without it."""
        assert (edit is not None) == (severity is Severity.AUTOMATIC)
        self.consumed.add(id(node))
        needs_cuda = severity is not Severity.AUTOMATIC and not works_without_cuda
        if edit is not None:
            where, text = edit
            start, end = self.text.span(where) if isinstance(where, ast.AST) else where
            self.edit_of[len(self.findings)] = Edit(start, end, text)
        self.spans.append(self.text.span(node))
        self.findings.append(Finding(self.path, node.lineno,  # type: ignore[attr-defined]
                                     category, severity, message, suggestion, self.cell,
                                     effort_key, needs_cuda))

    def add_api(self, node: ast.AST, name: str, api: Api) -> None:
        """A finding classified by a table entry, left as written."""
        severity = Severity.SIMPLE_EDIT if api.severity is Severity.AUTOMATIC else api.severity
        self.add(node, api.category, severity, name, api.suggestion,
                 works_without_cuda=api.works_without_cuda)

    # -- guards

    def guard(self, node: ast.If | ast.IfExp, body: list[ast.AST], orelse: list[ast.AST]
              ) -> None:
        guarded = [body]
        if _negated(node.test):
            guarded = [orelse]
            if isinstance(node, ast.If) and isinstance(body[-1], EXITS):
                guarded.append(list(self.following.get(id(node), [])))
        spans = tuple((self.text.span(b[0])[0], self.text.span(b[-1])[1])
                      for b in guarded if b)
        # `if use_cuda:` tests what `use_cuda = torch.cuda.is_available()` assigned
        flags = tuple(name for name in _test_operands(node.test) if name in self.flag_values)
        test = [self.text.span(node.test)]
        test += [span for name in flags for span in self.flag_values[name]]
        if spans:
            self.guards.append(_Guard(node.lineno, tuple(test), spans, flags))

    def visit_If(self, node: ast.If) -> None:
        self.guard(node, node.body, node.orelse)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.guard(node, [node.body], [node.orelse])
        self.generic_visit(node)

    def keep_cuda_only_paths(self) -> None:
        """Where guarded code needs CUDA, drop the edits of the guard and of its code, and
        report the guard as one `cuda-only` finding (the path is skipped off CUDA).

        A guard is a test with findings. Innermost guards go first: a path kept
        CUDA-specific no longer needs CUDA from the point of view of an outer guard."""
        protected: set[int] = set()  # findings inside (or heading) a kept path
        protected_uses: set[int] = set()
        dropped: set[int] = set()  # findings of kept guards' tests, replaced by one
        for guard in sorted(self.guards, key=lambda g: g.size):
            settled = dropped | protected
            # a flag kept by another guard still makes this one a guard
            test = [i for i, (start, _) in enumerate(self.spans)
                    if guard.tests(start) and i not in protected]
            inside = [i for i, (start, _) in enumerate(self.spans)
                      if guard.covers(start) and i not in settled]
            uses = [n for n, use in enumerate(self.uses)
                    if guard.covers(use.offset) and n not in protected_uses]
            reasons = [(self.findings[i].line, self.findings[i].message,
                        self.findings[i].severity) for i in inside if self.findings[i].needs_cuda]
            # what a use calls is ported (and counted) where it is built or imported
            reasons += [(self.uses[n].line, self.uses[n].what, Severity.SIMPLE_EDIT)
                        for n in uses]
            if not test or not reasons:
                continue
            cell = f"[cell {self.cell}]" if self.cell is not None else ""
            key = f"cuda-only path {self.path}{cell}:{guard.line}"
            for i in inside:
                finding = self.findings[i]
                self.edit_of.pop(i, None)
                self.findings[i] = replace(
                    finding, effort_key=key, severity=_at_least_simple(finding.severity),
                    needs_cuda=finding.needs_cuda or finding.severity is Severity.AUTOMATIC)
            for i in test:
                self.edit_of.pop(i, None)
            dropped.update(test)
            protected.update(inside)
            protected_uses.update(uses)
            checks = " and ".join(dict.fromkeys(self.findings[i].message for i in test))
            through = [name for name in guard.flags if any(
                start <= self.spans[i][0] < end for i in test
                for start, end in self.flag_values[name])]
            if through:
                checks += f" (through {', '.join(through)})"
            reasons.sort(key=lambda reason: reason[0])  # by line, in source order within one
            shown = "; ".join(f"{what} (line {line})" for line, what, _ in reasons[:3])
            more = f"; {len(reasons) - 3} more" if len(reasons) > 3 else ""
            severity = max([s for _, _, s in reasons]
                           + [self.findings[i].severity for i in test], key=lambda s: s.rank)
            protected.add(len(self.findings))
            self.spans.append(guard.test[0])
            self.findings.append(Finding(
                self.path, guard.line, "cuda-only", _at_least_simple(severity),
                f"{checks} guards code that needs CUDA: {shown}{more}",
                "kept CUDA-specific by --fix, so this path is skipped off CUDA; port what it "
                "guards to run it on pjrt", self.cell, key))
        kept = [i for i in range(len(self.findings)) if i not in dropped]
        renumber = {old: new for new, old in enumerate(kept)}
        self.findings = [self.findings[i] for i in kept]
        self.spans = [self.spans[i] for i in kept]
        self.edit_of = {renumber[i]: edit for i, edit in self.edit_of.items()}

    def _import_torch_edit(self, tree: ast.Module) -> Edit:
        after_line = 0  # insert `import torch` before the first import, else after the header
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                after_line = stmt.end_lineno or 0
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                return Edit(*[self.text.offset(stmt.lineno, 0)] * 2, "import torch\n")
            elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                  and isinstance(stmt.value.value, str) and after_line == 0):
                after_line = stmt.end_lineno or 0
            else:
                break
        offset = self.text.starts[min(after_line, len(self.text.lines))]
        return Edit(offset, offset, "import torch\n")

    # -- device strings

    def device_value(self, node: ast.AST, name: str = "device") -> None:
        """Report the "cuda" strings of an expression used as a device (through if/else)."""
        if id(node) in self.consumed:
            return
        if isinstance(node, ast.IfExp):
            self.device_value(node.body, name)
            self.device_value(node.orelse, name)
            return
        value = _cuda_string(node)
        if value is None:
            if (isinstance(node, ast.JoinedStr) and node.values
                    and isinstance(node.values[0], ast.Constant)
                    and str(node.values[0].value).startswith("cuda:")):
                self.add(node, "device", Severity.SIMPLE_EDIT,
                         f"device string {self.text.segment(node)}",
                         self.indexed_device())
            return
        if name.lower().endswith("type"):
            self.add(node, "device", Severity.SIMPLE_EDIT, f"device type {value!r}",
                     self.accelerator_type)
        elif value == "cuda":
            self.add(node, "device", Severity.AUTOMATIC, "device 'cuda'",
                     self.accelerator, (node, self.accelerator))
        else:
            index = value.split(":")[1]
            self.add(node, "device", Severity.SIMPLE_EDIT, f"device {value!r}",
                     self.indexed_device(index))

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            name = _target_name(target)
            if name and _is_device_name(name):
                self.device_value(node.value, name)
            if name and "backend" in name.lower():
                self.nccl_value(node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        name = _target_name(node.target)
        if node.value is not None and name and _is_device_name(name):
            self.device_value(node.value, name)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        positional = node.args.posonlyargs + node.args.args
        pairs = list(zip(positional[len(positional) - len(node.args.defaults):],
                         node.args.defaults))
        pairs += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d]
        for arg, default in pairs:
            if _is_device_name(arg.arg):
                self.device_value(default, arg.arg)
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            kernel_of = KERNEL_DECORATORS.get(self.resolve(target) or "")
            if kernel_of is not None:
                package = package_named(kernel_of)
                self.add(decorator, package.category, Severity.NEEDS_PORT,
                         f"{kernel_of} kernel `{node.name}`", package.suggestion)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for operand in operands:
            value = _cuda_string(operand)
            if value is None or id(operand) in self.consumed:
                continue
            others = [o for o in operands if o is not operand]
            if any(_is_device_name(n) for o in others for n in _names(o)):
                self.add(operand, "device-check", Severity.SIMPLE_EDIT,
                         f"compares a device with {value!r}",
                         f"compare with {self.accelerator}, "
                         "or test device.type != 'cpu'", works_without_cuda=True)
        self.generic_visit(node)

    # -- calls

    def nccl_value(self, node: ast.AST) -> None:
        if isinstance(node, ast.IfExp):
            self.nccl_value(node.body)
            self.nccl_value(node.orelse)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.lower() == "nccl" and id(node) not in self.consumed):
            self.add(node, "distributed", Severity.SIMPLE_EDIT, "NCCL process group backend",
                     "backend='pjrt'")

    def visit_Call(self, node: ast.Call) -> None:
        func = self.resolve(node.func) or ""
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        first = node.args[0] if node.args else None
        if (isinstance(node.func, ast.Attribute) and node.func.attr == "cuda"
                and lookup_api(func) is None):
            self.dot_cuda(node)
        elif func == "torch.device" and first is not None:
            if _cuda_string(first) == "cuda" and len(node.args) == 1 and not node.keywords:
                self.consumed.add(id(first))
                self.add(node, "device", Severity.AUTOMATIC, "torch.device('cuda')",
                         self.accelerator, (node, self.accelerator))
            elif _cuda_string(first) == "cuda":  # torch.device("cuda", index)
                self.consumed.add(id(first))
                self.add(node, "device", Severity.SIMPLE_EDIT, self.text.segment(node),
                         self.indexed_device())
            else:  # "cuda:N", f"cuda:{rank}", "cuda" if ... else "cpu"
                self.device_value(first)
        if func in AMP_DEVICE_CALLS:
            for arg in [first, keywords.get("device_type"), keywords.get("device")]:
                if arg is not None and _cuda_string(arg) and id(arg) not in self.consumed:
                    self.add(arg, "amp", Severity.SIMPLE_EDIT,
                             f"{func.rsplit('.', 1)[-1]} for device type 'cuda'",
                             self.accelerator_type, works_without_cuda=True)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to" and first is not None:
            self.device_value(first)
        if func.endswith("set_default_device") and first is not None:
            self.device_value(first)
        for name, value in keywords.items():
            if name in DEVICE_KEYWORDS or name == "device_type":
                self.device_value(value, name)
            elif name == "backend":
                self.nccl_value(value)
        if func.endswith(("init_process_group", "new_group")) and first is not None:
            self.nccl_value(first)
        tool = _command_tool(keywords.get("args", first)) if func in PROCESS_CALLS else None
        if tool is not None:
            self.add(node, CUDA_TOOLS[tool].category, CUDA_TOOLS[tool].severity, f"runs {tool}",
                     CUDA_TOOLS[tool].suggestion)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
            default = keywords.get("default")
            if default is not None and _cuda_string(default) and any(
                    isinstance(f, str) and _is_device_name(f.lstrip("-").replace("-", "_"))
                    for f in flags):
                self.add(default, "device", Severity.SIMPLE_EDIT,
                         f"command-line default {_cuda_string(default)!r}",
                         f"default={self.accelerator_type}")
        built = self.cuda_extension_build(node)
        if built is not None:
            self.add(node, "custom-extension", Severity.NEEDS_PORT, built,
                     CUDA_APIS["torch.utils.cpp_extension.CUDAExtension"].suggestion)
        self.generic_visit(node)

    def cuda_extension_build(self, node: ast.Call) -> str | None:
        """What the call is, if it builds a CUDA extension (load_inline, load of .cu)."""
        func = self.resolve(node.func) or ""
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if func.endswith("cpp_extension.load_inline") and "cuda_sources" in keywords:
            return "load_inline with cuda_sources builds a CUDA extension"
        sources = keywords.get("sources", node.args[1] if len(node.args) > 1 else ast.Pass())
        if func.endswith("cpp_extension.load") and any(
                isinstance(n, ast.Constant) and str(n.value).endswith(NATIVE_CUDA_SUFFIXES)
                for n in ast.walk(sources)):
            return "cpp_extension.load builds .cu sources"
        return None

    def dot_cuda(self, node: ast.Call) -> None:
        assert isinstance(node.func, ast.Attribute)
        if node.args or any(k.arg is None for k in node.keywords):
            self.add(node, "device", Severity.SIMPLE_EDIT, ".cuda(index)",
                     f".to({self.indexed_device()})")
            return
        extra = "".join(", " + self.text.segment(k) for k in node.keywords)
        start = self.text.span(node.func.value)[1]
        end = self.text.span(node)[1]
        self.add(node, "device", Severity.AUTOMATIC, ".cuda()", f".to({self.accelerator})",
                 ((start, end), f".to({self.accelerator}{extra})"))

    # -- names

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.package_import(node, package_for_import(alias.name))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            for alias in node.names:
                self.package_import(node, package_for_import(f"{node.module}.{alias.name}"))

    def package_import(self, node: ast.AST, package: Package | None) -> None:
        if package is None or package.name in self.packages_seen:
            return
        self.packages_seen.add(package.name)
        self.add(node, package.category, package.severity, f"imports {package.name}",
                 package.suggestion, works_without_cuda=package.works_without_cuda,
                 effort_key=package.name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "is_cuda":
            # where it guards code that needs CUDA, keep_cuda_only_paths keeps it instead
            self.add(node, "device-check", Severity.SIMPLE_EDIT, ".is_cuda",
                     ".device.type != 'cpu'", works_without_cuda=True)
        self.dotted_name(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and (node.id in self.aliases
                                                or node.id in self.cuda_only_names):
            self.dotted_name(node)

    def dotted_name(self, node: ast.Attribute | ast.Name) -> None:
        name = self.resolve(node)
        if name is None:  # the chain starts with a call or subscript: look inside
            self.generic_visit(node)
            return
        written = _dotted(node) or [""]
        if written[0] in self.cuda_only_names:
            self.uses.append(_Use(self.text.span(node)[0], node.lineno,
                                  f"{'.'.join(written)} ({self.cuda_only_names[written[0]]})"))
        api = lookup_api(name)
        if api is None or id(node) in self.consumed:
            return
        parts = _dotted(node) or []
        rewritable = (api.replacement is not None and name in CUDA_APIS
                      and self.aliases.get(parts[0]) == "torch" and parts[1] == "cuda")
        if rewritable:
            assert api.replacement is not None
            text = parts[0] + api.replacement[len("torch"):]  # torch as this file spells it
            self.add(node, api.category, api.severity, name, text, (node, text))
        else:
            self.add_api(node, name, api)


def _names(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr


def scan_python(text: str, path: str, cell: int | None = None) -> PythonScan:
    """Findings, --fix edits and imported packages of one Python source. Raises SyntaxError."""
    tree = ast.parse(text)
    scanner = _PythonScanner(text, path, cell)
    scanner.scan(tree)
    findings = sorted(scanner.findings, key=lambda f: f.line)  # kept paths come last
    if Path(path).name == "setup.py":
        findings += _setup_py_requirements(tree, path)
    return PythonScan(findings, scanner.edits, scanner.packages_seen)


def _setup_py_requirements(tree: ast.Module, path: str) -> list[Finding]:
    findings: list[Finding] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in SETUP_KEYWORDS:
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    findings += requirement_findings(sub.value, path, sub.lineno)
    return findings


# ---------------------------------------------------------------------------- requirements


def requirement_findings(spec: str, path: str, line: int, cell: int | None = None
                         ) -> list[Finding]:
    """Findings of one requirement line (`name[extras] op version ; marker`, or an option)."""
    spec = spec.split(" #")[0].strip()
    if spec.startswith("-"):
        option, _, url = spec.partition(" ")
        if option.lstrip("-") in {"extra-index-url", "index-url", "f", "find-links", "i"} \
                and CUDA_INDEX_URL.search(url):
            return [Finding(path, line, "cuda-wheels", Severity.SIMPLE_EDIT,
                            f"CUDA wheel index {url.strip()}",
                            "the default index: torch's CPU wheel runs pjrt", cell)]
        return []
    match = REQUIREMENT_NAME.match(spec)
    if match is None:
        return []
    findings: list[Finding] = []
    if CUDA_LOCAL_VERSION.search(spec):
        findings.append(Finding(path, line, "cuda-wheels", Severity.SIMPLE_EDIT,
                                f"{spec} is a CUDA build", "the same version without +cuXXX",
                                cell))
    package = package_for_dist(match.group(1))
    if package is not None:
        findings.append(Finding(path, line, package.category, package.severity,
                                f"requires {match.group(1)}", package.suggestion, cell,
                                package.name, not package.works_without_cuda))
    return findings


def _requirements_txt(text: str, path: str) -> list[Finding]:
    findings: list[Finding] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            findings += requirement_findings(line, path, number)
    return findings


def _line_of(text: str, needle: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number
    return 1


def _pyproject(text: str, path: str) -> list[Finding]:
    data = tomllib.loads(text)
    project = data.get("project", {})
    specs: list[str] = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        specs += group
    for group in data.get("dependency-groups", {}).values():
        specs += [s for s in group if isinstance(s, str)]
    findings: list[Finding] = []
    for spec in specs:
        findings += requirement_findings(spec, path, _line_of(text, spec))
    poetry = data.get("tool", {}).get("poetry", {}).get("dependencies", {})
    for name in poetry:
        findings += requirement_findings(name, path, _line_of(text, name))
    return findings


def _setup_cfg(text: str, path: str) -> list[Finding]:
    parser = configparser.ConfigParser()
    parser.read_string(text)
    specs: list[str] = []
    if parser.has_option("options", "install_requires"):
        specs += parser.get("options", "install_requires").splitlines()
    if parser.has_section("options.extras_require"):
        for _, value in parser.items("options.extras_require"):
            specs += value.splitlines()
    findings: list[Finding] = []
    for spec in filter(None, (s.strip() for s in specs)):
        findings += requirement_findings(spec, path, _line_of(text, spec))
    return findings


# ---------------------------------------------------------------------------- other files


def _notebook(text: str, path: str) -> tuple[PythonScan, list[tuple[str, str]]]:
    """The notebook's findings and imports (its edits are not applied: empty), and the cells
    it could not parse."""
    findings: list[Finding] = []
    imported: set[str] = set()
    skipped: list[tuple[str, str]] = []
    for number, cell in enumerate(json.loads(text).get("cells", []), 1):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        lines = source.splitlines()
        for index, line in enumerate(lines):
            stripped = line.lstrip()
            if stripped.startswith(("!", "%")):  # shell and magics: not Python
                words = stripped.lstrip("!%").split()
                if words[:2] == ["pip", "install"]:
                    for word in words[2:]:
                        if not word.startswith("-"):
                            findings += requirement_findings(word, path, index + 1, number)
                lines[index] = line[: len(line) - len(stripped)] + "pass"
        try:
            cell_scan = scan_python("\n".join(lines), path, number)
        except SyntaxError as error:
            skipped.append((f"{path}[cell {number}]", f"syntax error: {error.msg}"))
            continue
        findings += cell_scan.findings
        imported |= cell_scan.imported_packages
    return PythonScan(findings, [], imported), skipped


def _native(text: str, path: str) -> list[Finding]:
    if path.endswith(NATIVE_CUDA_SUFFIXES):
        kernels = len(re.findall(r"\b__global__\b", text))
        return [Finding(path, 1, "custom-extension", Severity.NEEDS_PORT,
                        f"CUDA source ({kernels} __global__ kernel{'s' * (kernels != 1)})",
                        CUDA_APIS["torch.utils.cpp_extension.CUDAExtension"].suggestion)]
    for number, line in enumerate(text.splitlines(), 1):
        if CUDA_INCLUDE.match(line):
            return [Finding(path, number, "custom-extension", Severity.NEEDS_PORT,
                            f"C++ source includes CUDA headers ({line.strip()})",
                            CUDA_APIS["torch.utils.cpp_extension.CUDAExtension"].suggestion)]
    return []


def read_source(path: Path) -> str:
    """A file's text with its own line endings kept, so --write can preserve them."""
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def _kind(name: str) -> str | None:
    if name.endswith(".py"):
        return "python"
    if name.endswith(".ipynb"):
        return "notebook"
    if name.startswith("requirements") and name.endswith(".txt"):
        return "requirements"
    if name == "pyproject.toml":
        return "pyproject"
    if name == "setup.cfg":
        return "setup.cfg"
    if name.endswith(NATIVE_CUDA_SUFFIXES + NATIVE_CXX_SUFFIXES):
        return "native"
    return None


def _files(root: Path) -> Iterator[Path]:
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(names):
            if _kind(name) is not None:
                yield Path(directory) / name


def audit(path: str | os.PathLike[str]) -> AuditReport:
    """Scan a project directory (or one file) for what binds it to CUDA."""
    target = Path(path).resolve()
    if not target.exists():  # else a typo would audit its parent directory and find nothing
        raise FileNotFoundError(f"no such file or directory: {path}")
    root = target if target.is_dir() else target.parent
    report = AuditReport(root=root)
    for file in (_files(root) if target.is_dir() else iter([target])):
        kind = _kind(file.name)
        rel = file.relative_to(root).as_posix()
        try:
            text = read_source(file)
        except (OSError, UnicodeDecodeError) as error:
            report.skipped.append((rel, f"unreadable: {error}"))
            continue
        report.files_scanned += 1
        try:
            if kind == "python":
                scan = scan_python(text, rel)
                report.findings += scan.findings
                report.imported_packages |= scan.imported_packages
                if scan.edits:
                    report.edits[rel] = scan.edits
            elif kind == "notebook":
                scan, skipped = _notebook(text, rel)
                report.findings += scan.findings
                report.imported_packages |= scan.imported_packages
                report.skipped += skipped
            elif kind == "requirements":
                report.findings += _requirements_txt(text, rel)
            elif kind == "pyproject" and tomllib is not None:
                report.findings += _pyproject(text, rel)
            elif kind == "setup.cfg":
                report.findings += _setup_cfg(text, rel)
            elif kind == "native":
                report.findings += _native(text, rel)
        except (SyntaxError, ValueError, configparser.Error) as error:
            report.skipped.append((rel, f"{type(error).__name__}: {error}"))
    report.findings = [_unused_requirement(f, report.imported_packages)
                       for f in report.findings]
    report.findings.sort(key=lambda f: (f.path, f.cell or 0, f.line, f.category, f.message))
    return report


def _unused_requirement(finding: Finding, imported: set[str]) -> Finding:
    """A requirement of a package that no scanned code imports is a cleanup, not a port:
    code that never runs costs nothing to move."""
    package = next((p for p in PACKAGES if p.name == finding.effort_key and p.imports), None)
    if package is None:  # not a package, or one without import names (NVIDIA wheels)
        return finding
    # `from apex.normalization import ...` uses the apex that requirements.txt names
    modules = [m for name in imported for m in package_named(name).imports]
    if any(m == prefix or m.startswith(prefix + ".") for m in modules for prefix in package.imports):
        return finding
    return replace(finding, severity=Severity.SIMPLE_EDIT, needs_cuda=False,
                   message=f"{finding.message}, never imported",
                   suggestion=f"remove the requirement: no scanned code imports {package.name}")


# ---------------------------------------------------------------------------- reports


def summarize(report: AuditReport) -> list[CategorySummary]:
    """Per category: number of findings, by severity, and the effort estimate.

    Effort is EFFORT_HOURS per finding, except that findings sharing an effort key (a
    package in the requirements, a notebook and three imports; a CUDA-only path and the
    findings in it) are one piece of work, counted once at its most severe finding. On a
    tie the code counts rather than its guard, so the work shows in the code's category.
    """
    def weight(f: Finding) -> tuple[int, bool]:
        return f.severity.rank, f.category != "cuda-only"

    heads: dict[str, Finding] = {}  # effort key -> the finding that carries its effort
    for f in report.findings:
        if f.effort_key is not None:
            head = heads.setdefault(f.effort_key, f)
            if weight(f) > weight(head):
                heads[f.effort_key] = f
    out: list[CategorySummary] = []
    for category in CATEGORIES:
        found = [f for f in report.findings if f.category == category]
        if found:
            by_severity = {s: sum(f.severity is s for f in found) for s in Severity}
            hours = sum((EFFORT_HOURS[f.severity] for f in found
                         if f.effort_key is None or heads[f.effort_key] is f), 0.0)
            out.append(CategorySummary(category, len(found), by_severity, hours))
    return out


def category_effort(summary: CategorySummary) -> str:
    if summary.effort_hours == 0 and summary.by_severity[Severity.AUTOMATIC] < summary.findings:
        return "counted in another row"  # each of its findings shares another's effort
    return format_hours(summary.effort_hours)


def format_hours(hours: float) -> str:
    if hours == 0:
        return "none (--fix)"
    if hours < 1:
        return f"{round(hours * 60)} min"
    if hours < 8:
        return f"{hours:.1f} h"
    return f"{hours / 8:.1f} days"


def to_json(report: AuditReport) -> dict[str, object]:
    summary = summarize(report)
    return {
        "root": str(report.root),
        "files_scanned": report.files_scanned,
        "findings": [f.to_json() for f in report.findings],
        "summary": [{"category": s.category, "findings": s.findings,
                     "by_severity": {k.value: v for k, v in s.by_severity.items()},
                     "effort_hours": s.effort_hours} for s in summary],
        "effort_hours": sum(s.effort_hours for s in summary),
        "skipped": [{"path": p, "reason": r} for p, r in report.skipped],
    }


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(report: AuditReport) -> str:
    summary = summarize(report)
    total = sum(s.effort_hours for s in summary)
    automatic = sum(f.severity is Severity.AUTOMATIC for f in report.findings)
    lines = [
        f"# CUDA lock-in audit of `{report.root.name}`", "",
        f"{len(report.findings)} findings in {report.files_scanned} files scanned; "
        f"{automatic} can be rewritten by `torch-pjrt audit --fix`. "
        f"Estimated effort for the rest: {format_hours(total)}.", "",
        "## Summary", "",
        "| category | findings | " + " | ".join(s.value for s in Severity) + " | effort |",
        "|---|---:|" + "---:|" * len(Severity) + "---|",
    ]
    for s in summary:
        counts = " | ".join(str(s.by_severity[v]) for v in Severity)
        lines.append(f"| {s.category} | {s.findings} | {counts} | {category_effort(s)} |")
    lines += ["", "## Findings", "", "| location | category | severity | finding | suggestion |",
              "|---|---|---|---|---|"]
    for f in report.findings:
        lines.append(f"| `{f.location}` | {f.category} | {f.severity.value} | {_md(f.message)} "
                     f"| `{_md(f.suggestion)}` |")
    if report.skipped:
        lines += ["", "## Skipped", ""] + [f"- `{p}`: {r}" for p, r in report.skipped]
    return "\n".join(lines) + "\n"


SEVERITY_STYLE = {Severity.AUTOMATIC: "green", Severity.SIMPLE_EDIT: "cyan",
                  Severity.NEEDS_PORT: "yellow", Severity.NO_EQUIVALENT: "red"}


def print_table(report: AuditReport, console: object | None = None) -> None:
    """The terminal report: one table of findings and one of categories (rich)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = console if isinstance(console, Console) else Console()
    findings = Table(title=f"CUDA lock-in: {report.root}", show_lines=False)
    for column in ("location", "category", "severity", "finding", "suggestion"):
        findings.add_column(column, overflow="fold")
    for f in report.findings:
        style = SEVERITY_STYLE[f.severity]
        findings.add_row(escape(f.location), f.category, f"[{style}]{f.severity.value}[/]",
                         escape(f.message), escape(f.suggestion))
    out.print(findings)
    summary = Table(title="Summary")
    summary.add_column("category")
    summary.add_column("findings", justify="right")
    for severity in Severity:
        summary.add_column(severity.value, justify="right", style=SEVERITY_STYLE[severity])
    summary.add_column("effort", justify="right")
    rows = summarize(report)
    for s in rows:
        summary.add_row(s.category, str(s.findings),
                        *[str(s.by_severity[v]) for v in Severity], category_effort(s))
    out.print(summary)
    automatic = sum(f.severity is Severity.AUTOMATIC for f in report.findings)
    out.print(f"{len(report.findings)} findings in {report.files_scanned} files; "
              f"{automatic} fixable with --fix; estimated effort "
              f"{format_hours(sum(s.effort_hours for s in rows))}.")
    for path, reason in report.skipped:
        out.print(f"[yellow]skipped[/] {escape(path)}: {escape(reason)}")
