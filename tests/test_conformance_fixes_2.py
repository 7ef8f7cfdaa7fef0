"""Fixes found by PyTorch's device-generic test files (issue 32) that are not differences of
value from CPU: host cost and the like. Each compares with CPU torch where it reads values."""
from __future__ import annotations

import torch

from torch_pjrt.eager import transfer


def test_reading_every_element_of_a_large_storage_copies_it_once(monkeypatch):
    # all() over 10^6 comparisons (test_tensor_creation_ops' test_linspace) read each element's
    # view on the device, 276 us each; the second read of the same buffer now copies it whole
    views = []
    monkeypatch.setattr(transfer.storage, "read_deferred", lambda t, _read=transfer.storage.read_deferred:
                        views.append(t) or _read(t))
    cpu = torch.arange(20000.0) % 7 - 3
    dev = cpu.to("pjrt")
    assert [dev[i].item() for i in range(0, 20000, 3)] == [cpu[i].item() for i in range(0, 20000, 3)]
    assert len(views) <= 1
    assert all(dev[:-1] >= -3) and bool((dev > -4).all())
    dev[5] = 100.0  # a write swaps the buffer: the next read is the new value
    assert dev[5].item() == 100.0 and dev[6].item() == cpu[6].item()
