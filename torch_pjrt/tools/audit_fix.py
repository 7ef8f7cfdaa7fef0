"""`torch-pjrt audit --fix/--write`: apply the audit's automatic edits.

The edits are character spans of the original text (from the `ast` positions), so the
rewrite touches only the rewritten expressions: comments, formatting and everything the
audit does not rewrite stay byte for byte.
"""

from __future__ import annotations

import difflib

from torch_pjrt.tools.audit import AuditReport, Edit, read_source


def apply_edits(text: str, edits: list[Edit]) -> str:
    """`text` with every edit applied; an edit overlapping an earlier one is dropped."""
    out: list[str] = []
    position = 0
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        if edit.start < position:
            continue
        out.append(text[position:edit.start])
        out.append(edit.text)
        position = edit.end
    out.append(text[position:])
    return "".join(out)


def fixed_sources(report: AuditReport) -> dict[str, tuple[str, str]]:
    """Relative path -> (original text, fixed text), for every file with edits."""
    result: dict[str, tuple[str, str]] = {}
    for path, edits in sorted(report.edits.items()):
        original = read_source(report.root / path)
        result[path] = (original, apply_edits(original, edits))
    return result


def unified_diff(report: AuditReport) -> str:
    """The --fix diff, relative to the audited root (apply with `patch -p1` from there)."""
    chunks: list[str] = []
    for path, (original, fixed) in fixed_sources(report).items():
        chunks += difflib.unified_diff(original.splitlines(keepends=True),
                                       fixed.splitlines(keepends=True),
                                       f"a/{path}", f"b/{path}")
    return "".join(chunk if chunk.endswith("\n") else chunk + "\n\\ No newline at end of file\n"
                   for chunk in chunks)


def write_fixes(report: AuditReport) -> list[str]:
    """Apply the fixes in place; returns the rewritten paths."""
    written: list[str] = []
    for path, (_, fixed) in fixed_sources(report).items():
        # newline="" keeps the file's own line endings: the text still holds them
        with open(report.root / path, "w", encoding="utf-8", newline="") as handle:
            handle.write(fixed)
        written.append(path)
    return written
