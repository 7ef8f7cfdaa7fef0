"""Build (once) and load the C++ runtime extension.

The extension is compiled on first import with torch.utils.cpp_extension into a cache
directory keyed by torch version, Python ABI and source hash, so a second process, or a
second virtualenv with the same torch, loads the built library in milliseconds. Why not
at install time: the runtime compiles against the torch that is installed, and a wheel
build that needed torch would make pip fetch a multi-GB torch into its isolated build
environment (docs/architecture.md, "The C++ runtime").

A cold build never hangs and is never silent:
- one process builds, under an exclusive `flock` on `<key>.lock` in the cache; the OS
  drops the lock when its owner dies, so a killed build never blocks a later import;
- it builds into a temporary directory and renames it into place when complete, so a
  half-built cache is never loaded; leftovers of an interrupted build are removed (said
  in one line) by the next build;
- it says on stderr what it builds, where and about how long it takes, and when it is done.
The warm path (library present) reads the sources' bytes for the key and loads the
library: no lock, no subprocess, no compiler probe.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

NAME = "torch_pjrt_runtime"
CSRC = Path(__file__).parent / "csrc"
# How long the last cold build took on a 2-core machine shared with other work
# (docs/benchmarks.md, "Cold install and first import"); the build line quotes it.
MEASURED_BUILD = "30-40 s on 2 free cores, 70-140 s on 2 busy ones, less with more cores"
# A build that holds the lock longer than this is stuck (a stopped process): say who holds it.
LOCK_WAIT_LIMIT_S = 30 * 60
_PARTIAL = ".partial-"  # prefix of a build in progress (or of one that was interrupted)


class RuntimeBuildError(RuntimeError):
    """The C++ runtime could not be built; the message says what is missing."""


def cache_dir() -> Path:
    root = os.environ.get("TORCH_PJRT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torch_pjrt"
    )
    return Path(root)


def _sources() -> list[Path]:
    """The translation units (runtime.h says what each holds): every .cpp in csrc, as the key hashes
    them, the largest first, so ninja does not leave the longest compiling alone at the end."""
    return sorted(CSRC.glob("*.cpp"), key=lambda path: (-path.stat().st_size, path.name))


# NDEBUG: a release build, as torch's own: without it pybind11 checks that the GIL is held on
# every reference count change of the hot path (PyGILState_Check, a thread-local lookup each).
CFLAGS = ["-O2", "-DNDEBUG"]


def _key() -> str:
    """Hash of every source and header, the compiler flags, the torch build and the Python ABI:
    a built library is reused exactly when all of them match."""
    digest = hashlib.sha256(f"{torch.__version__} {sys.implementation.cache_tag} {' '.join(CFLAGS)}".encode())
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _build_dir(key: str) -> Path:
    return cache_dir() / f"runtime-torch{torch.__version__}-{key}"


def _library(build_dir: Path) -> Path:
    return build_dir / f"{NAME}.so"


def _load_built(path: Path):
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_loader(NAME, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _say(message: str) -> None:
    print(f"torch-pjrt: {message}", file=sys.stderr, flush=True)


def _check_tools() -> None:
    """A missing compiler or ninja fails here, before anything is written."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeBuildError(
            f"torch-pjrt builds a small C++ runtime on first import and needs a C++ compiler, "
            f"but '{cxx}' is not on PATH. Install one (Debian/Ubuntu: apt-get install g++; "
            f"conda: conda install gxx_linux-64) or point CXX at it."
        )
    try:
        import ninja  # the PyPI package carries the binary; put it on PATH for this process

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        from torch.utils.cpp_extension import verify_ninja_availability

        verify_ninja_availability()
    except (ImportError, AttributeError, RuntimeError) as e:
        raise RuntimeBuildError(
            f"torch-pjrt builds a small C++ runtime on first import and needs ninja ({e}). "
            f"Install it with: pip install ninja"
        ) from None


class _BuildLock:
    """An exclusive flock on `path`, held while one process builds; it holds the owner's pid
    so a waiting process can say whom it waits for."""

    def __init__(self, path: Path):
        self.path = path
        self.file = None

    def __enter__(self):
        self.file = open(self.path, "a+")
        announced = False
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            time.sleep(0.5)  # also gives a new owner the moment it needs to write its pid
            owner = self._owner()
            if not announced:
                _say(f"waiting for process {owner} to finish building the C++ runtime in {self.path.parent}")
                announced = True
            if time.monotonic() - started > LOCK_WAIT_LIMIT_S:
                self.file.close()
                raise RuntimeBuildError(
                    f"process {owner} has held the torch-pjrt runtime build lock {self.path} for more than "
                    f"{LOCK_WAIT_LIMIT_S // 60} minutes. If it is stopped or stuck, end it (kill {owner}) and import again."
                )
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"{os.getpid()}\n")
        self.file.flush()
        return self

    def _owner(self) -> str:
        try:
            return self.path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def __exit__(self, *exc):
        self.file.close()  # closing the file releases the flock


def _remove_interrupted_builds(key: str) -> None:
    """Leftovers of builds of this key whose process died (only the lock holder builds)."""
    for partial in cache_dir().glob(f"{_PARTIAL}{key}-*"):
        _say(f"removing an interrupted build of the C++ runtime: {partial}")
        shutil.rmtree(partial, ignore_errors=True)


def _build(build_dir: Path, key: str):
    from torch.utils.cpp_extension import load as build_and_load

    _check_tools()
    cache_dir().mkdir(parents=True, exist_ok=True)
    with _BuildLock(cache_dir() / f"{build_dir.name}.lock"):
        if _library(build_dir).exists():  # another process built it while this one waited
            return _load_built(_library(build_dir))
        _remove_interrupted_builds(key)
        partial = Path(tempfile.mkdtemp(prefix=f"{_PARTIAL}{key}-", dir=cache_dir()))
        _say(
            f"building the C++ runtime for torch {torch.__version__} ({len(_sources())} files) in {build_dir}; "
            f"once per torch version; it takes {MEASURED_BUILD}"
        )
        started = time.monotonic()
        try:
            module = build_and_load(name=NAME, sources=[str(path) for path in _sources()], extra_cflags=CFLAGS,
                                    build_directory=str(partial), verbose=False)
        except Exception as e:  # compiler errors arrive as RuntimeError with the log
            shutil.rmtree(partial, ignore_errors=True)
            raise RuntimeBuildError(
                f"building the torch-pjrt C++ runtime for {build_dir} failed with torch {torch.__version__}. "
                f"Check that the compiler works and that torch's headers are installed.\n{e}"
            ) from e
        except BaseException:  # KeyboardInterrupt: leave nothing half-built behind
            shutil.rmtree(partial, ignore_errors=True)
            raise
        if build_dir.exists():  # not a complete build (those arrive by rename only): an older layout
            shutil.rmtree(build_dir)
        partial.chmod(0o755)  # mkdtemp's 0700 would keep a shared cache from other users
        # The library stays mapped from its inode, so the loaded module survives the rename.
        os.rename(partial, build_dir)
        _say(f"built the C++ runtime in {time.monotonic() - started:.0f} s")
        return module


_module = None


def load():
    """The runtime extension module, built on first use."""
    global _module
    if _module is None:
        key = _key()
        build_dir = _build_dir(key)
        lib = _library(build_dir)
        _module = _load_built(lib) if lib.exists() else _build(build_dir, key)
    return _module


def build_info() -> dict:
    """Where the runtime is cached and whether it is built (for `torch-pjrt doctor`)."""
    build_dir = _build_dir(_key())
    info = {"cache_dir": str(build_dir), "built": _library(build_dir).exists(),
            "compiler": shutil.which(os.environ.get("CXX", "c++")), "torch_version": torch.__version__}
    try:
        _check_tools()
    except RuntimeBuildError as e:
        info["error"] = str(e)
    return info
