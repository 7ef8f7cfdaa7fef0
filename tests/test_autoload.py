"""`import torch` alone makes "pjrt" work; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns that off."""
import os
import subprocess
import sys


def run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_import_torch_is_enough():
    r = run("import torch, sys\n"
            "x = torch.arange(4.0, device='pjrt') * 2\n"
            "print(x.cpu().tolist(), 'torch_pjrt' in sys.modules, torch.accelerator.current_accelerator())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0.0, 2.0, 4.0, 6.0] True pjrt"
    assert r.stderr == "", "import must not print"


def test_autoload_off_then_explicit_import():
    r = run("import torch, sys\n"
            "print('torch_pjrt' in sys.modules, hasattr(torch, 'pjrt'))\n"
            "import torch_pjrt\n"
            "print(torch.ones(2, device='pjrt').sum().item())", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "2.0"]


def test_runtime_is_cached_between_processes():
    from torch_pjrt.runtime import build as _runtime

    info = _runtime.build_info()
    assert info["built"] and os.path.isdir(info["cache_dir"])


def test_build_failure_names_what_is_missing(tmp_path):
    r = run("import torch_pjrt", TORCH_DEVICE_BACKEND_AUTOLOAD="0", CXX="no-such-compiler",
            TORCH_PJRT_CACHE_DIR=str(tmp_path))
    assert r.returncode != 0
    assert "RuntimeBuildError" in r.stderr and "needs a C++ compiler" in r.stderr and "apt-get install g++" in r.stderr


def test_failed_autoload_does_not_break_import_torch(tmp_path):
    r = run("import torch; print(torch.ones(2).sum().item(), hasattr(torch, 'pjrt'))", CXX="no-such-compiler",
            TORCH_PJRT_CACHE_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2.0", "False"]
    assert "the pjrt device is unavailable" in r.stderr and "torch-pjrt doctor" in r.stderr


def test_import_hook_survives_a_probe_without_import(tmp_path, monkeypatch):
    """accelerate and transformers probe packages with importlib.util.find_spec: that must not
    consume the hook that applies our defaults when the package is really imported (CI once ran
    the whole suite with transformers imported and no default applied)."""
    import importlib.util
    import sys

    import torch_pjrt

    (tmp_path / "pjrt_probed_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pjrt_probed_module", raising=False)
    calls = []
    torch_pjrt._after_import("pjrt_probed_module", lambda: calls.append(sys.modules["pjrt_probed_module"].VALUE))
    assert importlib.util.find_spec("pjrt_probed_module") is not None
    assert calls == []
    import pjrt_probed_module  # noqa: F401

    assert calls == [1]
    del sys.modules["pjrt_probed_module"]
    import pjrt_probed_module  # noqa: F401,F811  (a second import: the hook ran once)

    assert calls == [1]
