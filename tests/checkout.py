"""Subprocesses of the tests import torch_pjrt from this checkout, not an installed copy."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def environment(**variables: str) -> dict[str, str]:
    """os.environ with this checkout first on PYTHONPATH, plus `variables`."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath, **variables}
