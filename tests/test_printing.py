"""Printing a pjrt tensor: torch's own text for the values, from one host copy (no
executables for a whole-buffer tensor; printing once took a minute of compiles)."""
from __future__ import annotations

import re

import jax.monitoring
import pytest
import torch

_compiles: list = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: _compiles.append(name) if "backend_compile" in name else None)


def _words(text: str) -> list:
    return re.sub(r",\s*device='pjrt:0'", "", text).split()


CASES = {
    "int8 row": lambda: torch.randint(-100, 100, (1, 512), dtype=torch.int8),
    "summarized float": lambda: torch.randn(300, 400),
    "nan and inf": lambda: torch.tensor([1.5, float("nan"), float("inf"), -0.0]),
    "bool": lambda: torch.rand(3, 4) > 0.5,
    "complex": lambda: torch.randn(3, dtype=torch.complex64),
    "empty": lambda: torch.zeros(0, 3),
    "scalar": lambda: torch.tensor(3.25, dtype=torch.float64),
}


@pytest.mark.parametrize("name", CASES)
def test_repr_matches_cpu_and_compiles_nothing(name):
    x = CASES[name]()
    p = x.to("pjrt")
    torch.pjrt.synchronize()
    _compiles.clear()
    text = repr(p)
    assert not _compiles, f"printing compiled {len(_compiles)} executables"
    assert "device='pjrt:0'" in text
    assert _words(text) == _words(repr(x))


def test_header_keeps_autograd_information():
    y = torch.randn(2, 2, requires_grad=True)
    text = repr(y.to("pjrt") * 2)
    assert "device='pjrt:0'" in text and "grad_fn=<MulBackward0>" in text
