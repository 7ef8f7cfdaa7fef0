"""Build (once) and load the C++ runtime extension.

The extension is compiled on first import with torch.utils.cpp_extension into a cache
directory keyed by torch version, compiler and source hash, so a second process, or a
second virtualenv with the same torch, loads the built library in milliseconds.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import torch

NAME = "torch_pjrt_runtime"
SOURCE = Path(__file__).parent / "csrc" / "runtime.cpp"


class RuntimeBuildError(RuntimeError):
    """The C++ runtime could not be built; the message says what is missing."""


def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        raise RuntimeBuildError(
            f"torch-pjrt builds a small C++ runtime on first import and needs a C++ compiler, "
            f"but '{cxx}' is not on PATH. Install one (Debian/Ubuntu: apt-get install g++; "
            f"conda: conda install gxx_linux-64) or point CXX at it."
        )
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        version = "unknown"
    return f"{path} {version}"


def cache_dir() -> Path:
    root = os.environ.get("TORCH_PJRT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torch_pjrt"
    )
    return Path(root)


def _build_dir(compiler: str) -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + compiler.encode()).hexdigest()[:16]
    return cache_dir() / f"runtime-torch{torch.__version__}-{key}"


def _library(build_dir: Path) -> Path:
    return build_dir / f"{NAME}.so"


def _load_built(path: Path):
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_loader(NAME, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _build(build_dir: Path):
    try:
        import ninja  # the PyPI package carries the binary; put it on PATH for this process

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        from torch.utils.cpp_extension import load, verify_ninja_availability

        verify_ninja_availability()
    except (ImportError, AttributeError, RuntimeError) as e:
        raise RuntimeBuildError(
            f"torch-pjrt builds a small C++ runtime on first import and needs ninja ({e}). "
            f"Install it with: pip install ninja"
        ) from None
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        return load(name=NAME, sources=[str(SOURCE)], extra_cflags=["-O2"], build_directory=str(build_dir), verbose=False)
    except Exception as e:  # compiler errors arrive as RuntimeError with the log
        raise RuntimeBuildError(
            f"building the torch-pjrt C++ runtime in {build_dir} failed with torch {torch.__version__}. "
            f"Check that the compiler works and that torch's headers are installed.\n{e}"
        ) from e


_module = None


def load():
    """The runtime extension module, built on first use."""
    global _module
    if _module is None:
        compiler = os.environ.get("TORCH_PJRT_COMPILER_ID") or _compiler()
        build_dir = _build_dir(compiler)
        lib = _library(build_dir)
        _module = _load_built(lib) if lib.exists() else _build(build_dir)
    return _module


def build_info() -> dict:
    """Where the runtime is cached and whether it is built (for `torch-pjrt doctor`)."""
    try:
        compiler = _compiler()
    except RuntimeBuildError as e:
        return {"cache_dir": str(cache_dir()), "built": False, "compiler": None, "torch_version": torch.__version__, "error": str(e)}
    build_dir = _build_dir(compiler)
    return {
        "cache_dir": str(build_dir),
        "built": _library(build_dir).exists(),
        "compiler": compiler,
        "torch_version": torch.__version__,
    }
