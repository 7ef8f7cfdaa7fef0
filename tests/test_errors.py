"""Bad input raises what CUDA raises, names the op and devices, and loses nothing."""
import os
import re
import subprocess
import sys

import pytest
import torch

from torch_pjrt import bounds


def test_cpu_and_pjrt_tensors_do_not_mix():
    a = torch.ones(3, device="pjrt")
    with pytest.raises(RuntimeError, match=r"same device.*pjrt:0.*cpu.*aten::add"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match=r"same device"):
        torch.ones(3).add_(a) if False else a.add_(torch.ones(3))
    assert torch.equal(a.cpu(), torch.ones(3))  # the failed in-place op lost nothing


def test_cpu_scalar_tensors_mix_like_cuda():
    a = torch.ones(3, device="pjrt")
    assert torch.equal((a * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))
    assert (torch.ones(3, dtype=torch.int32, device="pjrt") + torch.tensor(1.5)).dtype == torch.float32


def test_two_pjrt_devices_do_not_mix():
    with pytest.raises(RuntimeError, match=r"pjrt:0 and pjrt:1"):
        torch.ones(2, device="pjrt:0") + torch.ones(2, device="pjrt:1")


def test_numpy_type_error():
    with pytest.raises(TypeError, match="Use Tensor.cpu"):
        torch.zeros(1, device="pjrt").numpy()


def test_out_of_memory_is_an_error_and_the_process_keeps_working():
    with pytest.raises(torch.OutOfMemoryError, match=r"out of memory on pjrt:0"):
        torch.empty(1 << 45, dtype=torch.uint8, device="pjrt")  # 32 TiB
    assert torch.pjrt.memory_stats()["num_ooms"] >= 1
    assert (torch.ones(2, device="pjrt") + 1).sum().item() == 4.0


def test_unsupported_dtype_names_the_dtype():
    with pytest.raises(TypeError, match=r"complex32"):
        torch.zeros(2, dtype=torch.complex32).to("pjrt").cpu()


def test_in_place_result_type_and_shape_errors():
    ints = torch.ones(3, dtype=torch.int64, device="pjrt")
    with pytest.raises(RuntimeError, match=r"result type Float can't be cast to the desired output type Long"):
        ints.add_(torch.ones(3, device="pjrt"))
    small = torch.ones(3, device="pjrt")
    with pytest.raises(RuntimeError, match=r"doesn't match the broadcast shape"):
        small.add_(torch.ones(2, 3, device="pjrt"))
    assert torch.equal(ints.cpu(), torch.ones(3, dtype=torch.int64))


def test_shape_mismatch_is_a_runtime_error():
    with pytest.raises((RuntimeError, TypeError, ValueError)):
        torch.ones(2, 3, device="pjrt") + torch.ones(4, device="pjrt")


def test_dlpack_raises_instead_of_crashing():
    with pytest.raises((RuntimeError, TypeError, BufferError)):
        torch.utils.dlpack.to_dlpack(torch.ones(2, device="pjrt"))


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_a_lowering_module_imported_again_does_not_hide_the_first_error():
    """After a lowering module failed part way through its import, the next import runs it
    again; its lowerings register again instead of raising "already has a lowering" (which
    hid the real error). A second, different lowering for an op is still refused."""
    code = (
        "import importlib, sys, torch, torch_pjrt\n"
        "from torch_pjrt.ops.registry import lowering\n"
        "sys.modules.pop('torch_pjrt.ops.linalg')\n"
        "importlib.import_module('torch_pjrt.ops.linalg')\n"
        "try:\n"
        "    lowering(torch.ops.aten.linalg_cholesky_ex.default)(lambda x: x)\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert "already has a lowering (torch_pjrt.ops.linalg.linalg_cholesky_ex)" in result.stdout


def test_fallback_modes():
    # aten::_fft_c2c has no lowering in this table snapshot? use an op that certainly falls back: a test-only op
    code = (
        "import torch, warnings\n"
        "lib = torch.library.Library('pjrt_test', 'DEF')\n"
        "lib.define('twice(Tensor x) -> Tensor')\n"
        "lib.impl('twice', lambda x: x * 2, 'CPU')\n"
        "x = torch.arange(3.0, device='pjrt')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    y = torch.ops.pjrt_test.twice(x)\n"
        "    y = torch.ops.pjrt_test.twice(y)\n"
        "import torch_pjrt\n"
        "print(y.device, y.cpu().tolist(), torch_pjrt.fallback_ops(), sum('runs on the CPU' in str(m.message) for m in w))\n"
    )
    warn = _run(code)
    assert warn.returncode == 0, warn.stderr
    assert "pjrt:0 [0.0, 4.0, 8.0] {'pjrt_test.twice.default': 2} 1" in warn.stdout
    error = _run(code, TORCH_PJRT_FALLBACK="error")
    assert error.returncode != 0 and "NotImplementedError" in error.stderr and "pjrt_test.twice" in error.stderr
    silent = _run(code, TORCH_PJRT_FALLBACK="silent")
    assert silent.returncode == 0 and silent.stdout.strip().endswith("0")


OUT_OF_RANGE = {
    "index": lambda x, i: x[i],
    "index_put_": lambda x, i: x.clone().index_put_((i,), torch.ones(1, device=x.device)),
    "gather": lambda x, i: torch.gather(x, 0, i),
    "index_select": lambda x, i: x.index_select(0, i),
    "embedding": lambda x, i: torch.nn.functional.embedding(i, x.view(3, 1)),
    "take": lambda x, i: x.take(i),
    "scatter_": lambda x, i: x.clone().scatter_(0, i, 1.0),
    "index_add_": lambda x, i: x.clone().index_add_(0, i, torch.ones(1, device=x.device)),
    "index_copy_": lambda x, i: x.clone().index_copy_(0, i, torch.ones(1, device=x.device)),
    "index_fill_": lambda x, i: x.clone().index_fill_(0, i, 1.0),
}


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
@pytest.mark.parametrize("bad", [5, -7])
def test_out_of_range_indices_raise_like_cpu(name, bad):
    """XLA would clamp or drop these; torch raises, and so must pjrt (same type and message),
    at the next host sync as CUDA's device-side asserts do, naming the op."""
    op = OUT_OF_RANGE[name]
    x = torch.arange(3.0)
    with pytest.raises((IndexError, RuntimeError)) as on_cpu:
        op(x, torch.tensor([bad]))
    out = op(x.to("pjrt"), torch.tensor([bad], device="pjrt"))  # queued, not waited for
    with pytest.raises(on_cpu.type, match=re.escape(str(on_cpu.value).splitlines()[0])) as on_pjrt:
        out.cpu()
    assert "an earlier call of aten." in str(on_pjrt.value)
    out.cpu()  # raised once: the checks it reported are gone


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
def test_synchronous_index_checks_raise_at_the_op(name, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_SYNC_INDEX_CHECKS", "1")
    op = OUT_OF_RANGE[name]
    x = torch.arange(3.0)
    with pytest.raises((IndexError, RuntimeError)) as on_cpu:
        op(x, torch.tensor([3]))
    with pytest.raises(on_cpu.type, match=re.escape(str(on_cpu.value).splitlines()[0])):
        op(x.to("pjrt"), torch.tensor([3], device="pjrt"))


def test_queued_index_errors_raise_at_every_kind_of_host_sync():
    table = torch.randn(4, 2, device="pjrt")
    good, bad = torch.tensor([0, 3], device="pjrt"), torch.tensor([1, 4, 9], device="pjrt")
    for sync in (lambda t: t.cpu(), lambda t: t.sum().item(), lambda t: torch.pjrt.synchronize(), print):
        out = table[good]  # fine checks before and after the bad one are read too
        out = table[bad] + out.sum()
        out = out[good[:1]]
        with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
            sync(out)
    assert torch.equal(table[good].cpu(), table.cpu()[[0, 3]])  # nothing left queued, results intact


def test_an_index_error_raised_while_printing_leaves_vmap_working():
    """torch's tensor printing disables functorch inside its frame; the error must not keep
    that frame alive (through a reference cycle) after it was handled."""
    x = torch.randn(4, 2, device="pjrt")
    with pytest.raises(IndexError):
        print(x[torch.tensor([7], device="pjrt")])
    y = torch.randn(2, 3, 4, device="pjrt")
    torch.testing.assert_close(torch.func.vmap(torch.func.vmap(torch.dot))(y, y).cpu(), (y * y).sum(2).cpu())


def test_index_checks_stay_bounded_without_host_syncs():
    table, rows = torch.randn(8, 2, device="pjrt"), torch.tensor([1, 7], device="pjrt")
    for _ in range(5000):  # more than the queue holds: the queue is read on the way
        torch.index_select(table, 0, rows)
    assert len(bounds._queued) <= bounds._MAX_QUEUED
    bounds.raise_pending()
    assert not bounds._queued and not bounds._seen


def test_cpu_index_tensors_index_pjrt_tensors_like_cuda():
    x = torch.arange(6.0).view(2, 3)
    idx = torch.tensor([2, 0])
    assert torch.equal(x.to("pjrt")[:, idx].cpu(), x[:, idx])
    y = x.to("pjrt")
    y[:, idx[:1]] = -1.0
    x[:, idx[:1]] = -1.0
    assert torch.equal(y.cpu(), x)
