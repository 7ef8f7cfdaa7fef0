"""How the tools write a JSON report: one convention for `audit`, `doctor` and `bench`.

`--json` alone (or `--json -`) prints the report to stdout, and nothing else goes there,
so `torch-pjrt doctor --json | jq .` works; `--json FILE` writes it to FILE and the usual
human-readable output stays on stdout.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

STDOUT = "-"


def to_stdout(destination: str | None) -> bool:
    """True when `--json` sends the report to stdout (the human-readable output moves off it)."""
    return destination == STDOUT


def write_json(data: object, destination: str) -> None:
    """`data` as indented JSON to `destination`: a file path, or "-" for stdout."""
    text = json.dumps(data, indent=2, default=str) + "\n"
    if to_stdout(destination):
        sys.stdout.write(text)
        sys.stdout.flush()  # a closed pipe raises here, inside the CLI's BrokenPipeError handler
    else:
        Path(destination).write_text(text, encoding="utf-8")
