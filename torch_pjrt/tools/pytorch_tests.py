"""PyTorch's own device-generic test files, run on pjrt and on the CPU, compared test by test.

    python -m torch_pjrt.tools.pytorch_tests --pytorch PATH [--commit 54a673bd]
        [--files test_view_ops,nn/test_embedding] [--select EXPR] [--timeout 60] [--json out.json] [--out report.md]

PATH is a PyTorch repository (a git directory or a work tree; `fetch github:wey-code/pytorch`
gives one holding commit 54a673bd). Its test files are not in the wheel and are never
committed here: each is copied from PATH into a scratch folder and run with pytest twice,
once per device (`PYTORCH_TESTING_DEVICE_ONLY_FOR`, so `instantiate_device_type_tests`
instantiates only that device's class), against the installed torch. `--select` runs only the
tests a pytest `-k` expression selects (e.g. "padding_idx", to time a few). Only the
device-generic tests count (a file's other classes, TestAutograd or TestNN, run on the CPU
whatever the device); a file that does not import is reported with its error. The snapshot's
files (July 2023) import a few names torch's testing internals dropped since: the plugin
defines them as they were (`_DROPPED`), and the packages of test/ a file imports (test_autograd's
`autograd/`) are copied beside it.

A small pytest plugin in the scratch folder records each test's outcome and duration as it
finishes and puts every test under `signal.alarm(timeout)`. A run that dies (a crash) or hangs
in native code (killed after the file's time budget) is restarted without the tests already
recorded, and the test it was on is recorded as crash or timeout. The report gives, per
file, the pjrt pass rate over the tests that pass on the CPU, the tests over 60 s, and each
remaining failure's first line, grouped by kind.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_FILES = ("test_torch", "test_view_ops", "test_indexing", "test_scatter_gather_ops", "test_sort_and_select",
                 "test_shape_ops", "test_reductions", "test_binary_ufuncs", "test_unary_ufuncs", "test_type_promotion",
                 "test_tensor_creation_ops", "test_foreach", "test_linalg", "test_autograd", "test_serialization",
                 "test_nn", "nn/test_embedding", "nn/test_convolution", "nn/test_pooling", "nn/test_dropout",
                 "nn/test_multihead_attention", "nn/test_packed_sequence", "test_modules")
SLOW_SECONDS = 60.0
DEVICE_CLASS = {"cpu": "CPU", "pjrt": "PRIVATEUSE1 or PJRT"}  # pytest -k: a device's instantiated classes

_PLUGIN = '''
import json, os, signal

import pytest

# The snapshot's test files (commit 54a673bd, July 2023) import a few names torch's testing internals
# have dropped since; each is defined as it was then, where that meaning holds for this run (no MPS,
# no CUDA), so the files import against the installed torch.
import torch.testing._internal.common_cuda as _common_cuda
import torch.testing._internal.common_methods_invocations as _methods
import torch.testing._internal.common_nn as _common_nn
import torch.testing._internal.common_utils as _common_utils

_DROPPED = {
    (_common_utils, "skipIfMps"): lambda: (lambda fn: fn),  # skips on MPS only
    (_common_cuda, "tf32_is_not_fp32"): lambda: (lambda: False),  # TF32 is a CUDA mode
    (_common_nn, "new_module_tests"): lambda: _common_nn.get_new_module_tests(),
    (_methods, "binary_ufuncs_and_refs"): lambda: tuple(
        op for op in _methods.op_db + _methods.python_ref_db
        if isinstance(op, __import__("torch.testing._internal.opinfo.core", fromlist=["x"]).BinaryUfuncInfo)),
    (_methods, "foreach_lerp_op_db"): lambda: [op for op in _methods.foreach_other_op_db if op.name == "_foreach_lerp"],
}
for (_module, _name), _value in _DROPPED.items():
    if not hasattr(_module, _name):
        setattr(_module, _name, _value())


# The foreach OpInfos' samples carried their test's flags as kwargs then: `zero_size` (True only for
# float32 on CUDA), `disable_fastpath` (now an attribute) and, for pointwise ops, `values` (now
# `value` or `scalars`); test_foreach pops them (a KeyError on every device without them).
def _foreach_samples_as_in_2023(sample_inputs):
    def samples(self, device, dtype, requires_grad=False, **kwargs):
        for sample in sample_inputs(self, device, dtype, requires_grad, **kwargs):
            if isinstance(self, _methods.ForeachFuncInfo) and "zero_size" not in sample.kwargs:
                sample.kwargs["zero_size"] = False
                sample.kwargs["disable_fastpath"] = getattr(sample, "disable_fastpath", False)
                if any(self is op for op in _methods.foreach_pointwise_op_db):
                    sample.kwargs["values"] = sample.kwargs.pop("value", sample.kwargs.pop("scalars", None))
            yield sample
    return samples


if not hasattr(_methods.ForeachFuncInfo, "_pjrt_samples_as_in_2023"):
    _methods.ForeachFuncInfo.sample_inputs = _foreach_samples_as_in_2023(_methods.ForeachFuncInfo.sample_inputs)
    _methods.ForeachFuncInfo._pjrt_samples_as_in_2023 = True

_LOG = os.environ["PJRT_TESTS_LOG"]
_TIMEOUT = int(os.environ.get("PJRT_TESTS_TIMEOUT", "60"))


def _write(record):
    with open(_LOG, "a") as f:
        f.write(json.dumps(record) + "\\n")


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout(f"timed out after {_TIMEOUT} s")


def pytest_collection_modifyitems(items):
    """--only-cpu-passing: the tests that did not pass on the CPU are skipped on pjrt (not in the rate)."""
    if os.environ.get("PJRT_TESTS_NOT_RUN"):
        with open(os.environ["PJRT_TESTS_NOT_RUN"]) as f:
            not_run = set(json.load(f))
        mark = pytest.mark.skip(reason="not run on pjrt: it did not pass on the CPU (--only-cpu-passing)")
        for item in items:
            if item.nodeid in not_run:
                item.add_marker(mark)


def pytest_collection_finish(session):
    _write({"collected": [item.nodeid for item in session.items]})


@pytest.fixture(autouse=True)
def _queued_errors_fail_their_test():
    """pjrt queues its index checks as CUDA queues device asserts: a sync after each test raises
    what the test left queued in its own teardown, not in a later test's body."""
    yield
    if os.environ.get("PYTORCH_TESTING_DEVICE_ONLY_FOR") == "pjrt":
        import torch
        torch.pjrt.synchronize()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _write({"started": item.nodeid})  # a crash or a kill leaves this as the last line
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(_TIMEOUT)
    try:
        yield
    finally:
        signal.alarm(0)


def pytest_runtest_logreport(report):
    if report.when != "call" and report.passed:
        return  # one record per test: its call, or the setup or teardown that did not pass
    text = str(report.longrepr) if report.longrepr is not None else ""
    errors = [line[2:].strip() for line in text.splitlines() if line.startswith("E ")]
    message = errors[0] if errors else (text.splitlines() or [""])[-1]
    outcome = "timeout" if "_Timeout" in text else report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfail" if report.skipped else "xpass"
    _write({"test": report.nodeid, "when": report.when, "outcome": outcome, "seconds": report.duration,
            "message": message[:300]})
'''


# Source the 2023 files wrote for the torch of then, which today's torch runs differently, as the
# file meant it (regular expressions over the file's bytes, and what replaces each match):
# - test_linalg's setUp and tearDown call `super(self.__class__, self)`: in 2023 each device's class
#   (TestLinalgCPU) was built beside a copy of the generic class, so that named the generic class's
#   base; now it derives from the generic class and the call calls itself (a RecursionError in every
#   test, on every device).
# - OpInfo entries name the test class each skip, expected failure and tolerance is for, and today's
#   entries name test_binary_ufuncs' class TestBinaryUfuncsDevice (renamed since 2023): under its
#   2023 name none of its 169 decorators applied, so pjrt's results were held to the default
#   tolerances where the OpInfo widens them (pow of complex64, ...), and CPU ran what they skip.
_SOURCE_AS_MEANT = ((rb"super\(self\.__class__, self\)", rb"super()"),
                    (rb"\bTestBinaryUfuncs\b", rb"TestBinaryUfuncsDevice"))


def _copy_tests(pytorch: Path, commit: str | None, files: list[str], scratch: Path) -> None:
    """test/<file>.py for each file, from a git directory (at `commit`) or a work tree, with the
    packages of test/ it imports (test_autograd's `autograd.test_complex`...)."""
    git_dir = pytorch if (pytorch / "objects").exists() else pytorch / ".git"

    def read(path: str) -> bytes | None:
        if (pytorch / path).is_file():
            return (pytorch / path).read_bytes()
        shown = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit or 'HEAD'}:{path}"], capture_output=True)
        return shown.stdout if shown.returncode == 0 else None

    def listing(folder: str) -> list[str]:
        if (pytorch / folder).is_dir():
            return [str(p.relative_to(pytorch)) for p in (pytorch / folder).glob("*.py")]
        shown = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "--name-only", f"{commit or 'HEAD'}",
                                f"{folder}/"], capture_output=True, text=True)
        return [p for p in shown.stdout.split() if p.endswith(".py")] if shown.returncode == 0 else []

    for name in files:
        source = read(f"test/{name}.py")
        if source is None:
            raise FileNotFoundError(f"test/{name}.py is not in {pytorch} (commit {commit or 'HEAD'})")
        target = scratch / f"{name}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        for then, meant in _SOURCE_AS_MEANT:
            source = re.sub(then, meant, source)
        target.write_bytes(source)
        for package in set(re.findall(rb"^from (\w+)\.\w+ import", source, re.M)):
            for path in listing(f"test/{package.decode()}"):
                (scratch / path[len("test/"):]).parent.mkdir(parents=True, exist_ok=True)
                (scratch / path[len("test/"):]).write_bytes(read(path))
    (scratch / "conftest.py").write_text(_PLUGIN)


def _records(log: Path) -> tuple[dict, str | None]:
    """Outcomes by test id from the plugin's log, and the test that started last without an outcome.
    The tests each run collected are recorded under the id "collected" (a set of test ids)."""
    results, last = {"collected": set()}, None
    if not log.exists():
        return results, None
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "collected" in record:
            results["collected"].update(record["collected"])
            continue
        if "started" in record:
            last = record["started"]
            continue
        if record["test"] in results and results[record["test"]]["outcome"] != "passed":
            continue  # a setup error and a teardown error: the first one names the cause
        results[record["test"]] = record
        if record["test"] == last:
            last = None
    return results, last


def run_file(scratch: Path, name: str, device: str, timeout: int, budget: float,
             select: str | None = None, not_run: list[str] | None = None) -> dict:
    """Every test of one file on one device (those `select`, a pytest -k expression, selects; those
    `not_run` names are skipped): {test id: record}."""
    log = scratch / f"{name.replace('/', '_')}.{device}.jsonl"
    log.unlink(missing_ok=True)
    environment = {**os.environ, "PYTORCH_TESTING_DEVICE_ONLY_FOR": device, "PJRT_TESTS_LOG": str(log),
                   "PJRT_TESTS_TIMEOUT": str(timeout)}
    if not_run:
        (scratch / "not_run.json").write_text(json.dumps(not_run))
        environment["PJRT_TESTS_NOT_RUN"] = str(scratch / "not_run.json")
    done: dict = {"collected": set()}
    deadline = time.monotonic() + budget
    # only the device-generic tests (the device's instances: class TestFooCPU, TestFooPRIVATEUSE1); a
    # file's other classes (TestAutograd, TestNN) run on the CPU whatever the device
    keyword = DEVICE_CLASS[device] if not select else f"({select}) and ({DEVICE_CLASS[device]})"
    while True:
        deselect = [arg for test in done if test != "collected" for arg in ("--deselect", test)]
        command = [sys.executable, "-m", "pytest", f"{name}.py", "-q", "-p", "no:cacheprovider", *deselect,
                   "-k", keyword]
        try:
            run = subprocess.run(command, cwd=scratch, env=environment, capture_output=True, text=True,
                                 timeout=max(deadline - time.monotonic(), 1))
            status = run.returncode
        except subprocess.TimeoutExpired:
            status = "killed"
        results, last = _records(log)
        # nothing collected and pytest failed (2: the file did not import; 4: the plugin did not, as when
        # `import torch` fails to load pjrt): say why, rather than report 0 of 0 tests
        if status not in (0, 1, 5, "killed") and not results["collected"] and not done["collected"]:
            output = run.stdout + run.stderr
            errors = [line[1:].strip() for line in output.splitlines() if line.startswith("E ")]
            done["collection_error"] = errors[-1] if errors else " ".join(output.strip().splitlines()[-1:])
            return done
        collected = done["collected"] | results.pop("collected")
        done.update(results)
        done["collected"] = collected
        if last is None or last in done:
            break  # the run ended between tests: normally, or at an error outside any test
        # the run ended inside a test: record it, and restart without the tests already run
        done[last] = {"test": last, "outcome": "timeout" if status == "killed" else "crash", "seconds": None,
                      "message": "killed at the file's time budget" if status == "killed" else f"died ({status})"}
        if time.monotonic() >= deadline:
            break
    return done


def _key(test: str, device: str) -> str:
    """One test's id with its device taken out, so the CPU's and pjrt's instances pair up:
    the class suffix and the last `_<device>` of the name (instantiate_device_type_tests puts
    it after the test's own name, before the dtype's)."""
    test = re.sub(r"(PRIVATEUSE1|PJRT|CPU)(?=::)", "", test)
    head, sep, tail = test.rpartition(f"_{device}")
    return head + tail if sep else test


def _pjrt_id(test: str) -> str:
    """The id pjrt's instance of a CPU test has (TestFooCPU::test_x_cpu_float32 ->
    TestFooPRIVATEUSE1::test_x_pjrt_float32)."""
    test = re.sub(r"CPU(?=::)", "PRIVATEUSE1", test)
    head, sep, tail = test.rpartition("_cpu")
    return head + "_pjrt" + tail if sep else test


# Failures that follow torch's conventions for PrivateUse1 devices where the 2023 test expects a
# CPU's or CUDA's internals: (what the failure message says, why it is pjrt's correct answer[, which
# tests: where the message alone says too little]). They are counted apart ("by convention" in the
# report), never in the rate.
CONVENTIONS = (
    (r"<_ConvBackend\.Overrideable: \d+> != <_ConvBackend\.",
     "torch's `_select_conv_backend` answers ConvBackend.Overrideable for every PrivateUse1 tensor "
     "(torch routes their convolutions to `convolution_overrideable`, which pjrt implements); "
     "test_conv_backend expects the CPU's backend enum (Slow2d, SlowDilated3d...) of every 'native' "
     "device type, a list that in 2023 included the PrivateUse1 backend"),
    (r"`driver` other than `gels` is not supported on CUDA",
     "test_linalg_lstsq_input_checks expects CUDA's refusal of every lstsq driver but gels on any device "
     "other than the CPU; pjrt solves through the SVD whatever the driver and accepts the CPU's four "
     "drivers (gels, gelsy, gelsd, gelss), with the CPU's outputs for each and the CPU's error for others"),
    (r"RuntimeError not raised",
     "test_upsamplingBiMode2d_nonsupported_dtypes expects CUDA's refusal of uint8 bilinear and bicubic "
     "upsampling on every device but the CPU; pjrt computes them as the CPU does (its rounding and clamping)",
     r"test_upsamplingBiMode2d_nonsupported_dtypes_.*_mode_(bilinear|bicubic)_uint8"),
    (r"(Runtime|Index)Error not raised",
     "the test expects a bounds or count check to raise at the call, and exempts CUDA, whose kernels check "
     "on the device and fail later (each test says so: 'no out-of-bounds check on CUDA for perf', 'CUDA "
     "asserts instead of raising', 'cuda throws device assert', 'can't test cuda because it is a device "
     "assert'); pjrt checks on the device the same way and "
     "raises CPU's error at the next sync (TORCH_PJRT_SYNC_INDEX_CHECKS=1 raises at the call, and these "
     "tests pass)",
     r"::(test_embedding_bag_out_of_bounds_idx_|test_masked_scatter_pjrt_|test_one_hot_pjrt$|"
     r"test_trivial_fancy_out_of_bounds_pjrt$|test_advancedindex_pjrt_)"),
    (r"Type comparison failed: <class 'torch\.pjrt\.(\w+Storage)'> != <class 'torch\.\1'>",
     "test_tensor_storage_type expects torch.cuda's legacy storage class on CUDA and the CPU's on every other "
     "device; torch's `Tensor.storage_type()` looks the class up in the PrivateUse1 backend's device module as "
     "in torch.cuda, and pjrt defines them there (torch.pjrt.FloatStorage, a storage on pjrt)"),
    (r"tensor\(False, device='pjrt:\d+'\) is not true|Tensor-likes are not equal",
     "test_fmod_remainder_by_zero_integral expects a device's undefined values for an integer remainder by "
     "zero: CUDA's (all ones) or, under ROCm, x itself; pjrt gives ROCm's x (XLA's remainder by zero), "
     "where CPU raises ZeroDivisionError (a value check no device makes, docs/conformance-notes.md)",
     r"::test_fmod_remainder_by_zero_integral_pjrt_"),
    (r"Expected all tensors to be on the same device, but found at least two devices, pjrt:\d+ and cpu",
     "test_stable_sort_against_numpy returns before its other samples on CUDA: they index_fill a tensor on "
     "the device with an index on the CPU, which CUDA's kernel refuses as pjrt does",
     r"::test_stable_sort_against_numpy_pjrt_"),
)


def _by_convention(record: dict) -> str | None:
    """The convention a failure follows (its reason), if any."""
    for pattern, reason, *tests in CONVENTIONS:
        if (record.get("outcome") == "failed" and re.search(pattern, record.get("message", ""))
                and all(re.search(t, record.get("test", "")) for t in tests)):
            return reason
    return None


def _generic(test: str, device: str) -> bool:
    """A device-generic test's instance for `device` (its class named for the device)."""
    suffix = ("CPU",) if device == "cpu" else ("PRIVATEUSE1", "PJRT")
    return test != "collected" and any(f"{s}::" in test for s in suffix)


def _device_restricted(record: dict) -> bool:
    """A skip that torch's decorators give tests written for other devices (onlyCPU, onlyCUDA...)."""
    # "Unknown device type": largeTensorTest measures free memory on cuda, xpu, cpu and mps only, and
    # skips any other device
    return record.get("outcome") == "skipped" and bool(re.search(r"[Oo]nly runs on|onlyNativeDeviceTypes|"
                                                                  r"doesn't run on|not supported on|Unknown device type",
                                                                  record.get("message", "")))


def compare(cpu: dict, pjrt: dict) -> dict:
    """The pjrt pass rate over the tests that pass on the CPU, less those torch's own
    decorators restrict to other devices (counted apart, as `device_restricted`: skipped on
    pjrt, or never instantiated for it, as a dtype only `dtypesIfCPU` lists)."""
    error = cpu.get("collection_error") or pjrt.get("collection_error")
    if error:
        return {"collection_error": str(error), "cpu_passing": 0, "pjrt_passing": 0, "failures": {}, "slow": {},
                "device_restricted": 0, "crashes": [], "pjrt_only_passing": 0}
    cpu = {t: r for t, r in cpu.items() if _generic(t, "cpu")}
    collected = {_key(t, "pjrt") for t in pjrt.get("collected", ()) if _generic(t, "pjrt")}
    pjrt_by_key = {_key(t, "pjrt"): r for t, r in pjrt.items() if _generic(t, "pjrt")}
    cpu_by_key = {_key(t, "cpu"): r for t, r in cpu.items()}
    restricted = {k for k, r in pjrt_by_key.items() if _device_restricted(r)}
    if collected:
        restricted |= {k for k in cpu_by_key if k not in collected and k not in pjrt_by_key}
    passing = [k for k, r in cpu_by_key.items() if r["outcome"] == "passed" and k not in restricted]
    passed = [k for k in passing if pjrt_by_key.get(k, {}).get("outcome") == "passed"]
    failures = {k: pjrt_by_key.get(k, {"outcome": "missing", "message": "not run on pjrt"})
                for k in passing if k not in passed}
    conventional = {k: _by_convention(r) for k, r in failures.items() if _by_convention(r)}
    passing = [k for k in passing if k not in conventional]
    failures = {k: r for k, r in failures.items() if k not in conventional}
    slow = {k: r["seconds"] for k, r in pjrt_by_key.items()
            if r.get("seconds") and r["seconds"] > SLOW_SECONDS}
    return {"cpu_passing": len(passing), "pjrt_passing": len(passed), "failures": failures, "slow": slow,
            "device_restricted": len(restricted), "by_convention": conventional,
            "crashes": sorted(k for k, r in pjrt_by_key.items() if r["outcome"] == "crash"),
            "pjrt_only_passing": sum(1 for k, r in pjrt_by_key.items()
                                     if r["outcome"] == "passed" and k not in cpu_by_key)}


def _kind(record: dict) -> str:
    message = re.sub(r"\d+(\.\d+)?", "N", record.get("message", ""))
    return f"{record['outcome']}: {message[:120]}"


def report(results: dict, command: str) -> str:
    lines = ["# PyTorch's device-generic tests on pjrt", "",
             f"Generated by `torch_pjrt/tools/pytorch_tests.py`: `{command}`", "",
             f"Load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.", "",
             "Rate: pjrt passes over the tests that pass on the CPU, less the tests torch's decorators",
             "restrict to other devices (onlyCPU, onlyCUDA...: the `restricted` column).", "",
             "`by convention`: failures that follow torch's conventions for PrivateUse1 devices where the test",
             "expects the CPU's internals (listed below with the reason); counted in neither column before them.", "",
             "| file | pass on CPU | pass on pjrt too | rate | restricted | by convention | crashes | tests > 60 s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    total_cpu = total_pjrt = 0
    kinds: collections.Counter = collections.Counter()
    examples: dict = {}
    for name, r in results.items():
        total_cpu += r["cpu_passing"]
        total_pjrt += r["pjrt_passing"]
        if r.get("collection_error"):  # counted nowhere: a file that does not import has no rate
            lines.append(f"| {name} | did not import: {r['collection_error'][:150].replace('|', '/')} | | | | | | |")
            continue
        rate = r["pjrt_passing"] / r["cpu_passing"] if r["cpu_passing"] else 1.0
        lines.append(f"| {name} | {r['cpu_passing']} | {r['pjrt_passing']} | {rate:.1%} | {r['device_restricted']} | "
                     f"{len(r.get('by_convention', {}))} | {len(r['crashes'])} | {len(r['slow'])} |")
        for test, record in r["failures"].items():
            kind = _kind(record)
            kinds[kind] += 1
            examples.setdefault(kind, test)
    rate = total_pjrt / total_cpu if total_cpu else 1.0
    lines += [f"| **all** | {total_cpu} | {total_pjrt} | {rate:.1%} | | | | |", "", "## Failures by kind", "",
              "| tests | kind | first test |", "|---:|---|---|"]
    for kind, count in kinds.most_common():
        lines.append(f"| {count} | {kind.replace('|', '/')} | `{examples[kind]}` |")
    reasons = collections.Counter(reason for r in results.values() for reason in r.get("by_convention", {}).values())
    if reasons:
        lines += ["", "## Failures by convention", ""] + [f"- {n} tests: {reason}" for reason, n in reasons.items()]
    slow = [(name, test, s) for name, r in results.items() for test, s in r["slow"].items()]
    if slow:
        lines += ["", "## Tests over 60 s on pjrt", ""] + [f"- `{t}` ({name}): {s:.0f} s" for name, t, s in slow]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pytorch", required=True, type=Path, help="a PyTorch repository: git directory or work tree")
    parser.add_argument("--commit", default=None, help="the commit to read test files from (git directory)")
    parser.add_argument("--files", default=",".join(DEFAULT_FILES), help="test files under test/, without .py")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test (signal.alarm)")
    parser.add_argument("--budget", type=float, default=3600, help="seconds per file and device")
    parser.add_argument("--select", default=None, help="only the tests this pytest -k expression selects")
    parser.add_argument("--only-cpu-passing", action="store_true",
                        help="run on pjrt only the tests that passed on the CPU (the rate's tests; the others are "
                             "skipped there, so tests that pass on pjrt alone are not counted)")
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    opts = parser.parse_args(argv)
    files = [f for f in opts.files.split(",") if f]
    results, raw = {}, {}
    with tempfile.TemporaryDirectory(prefix="pytorch-tests-") as scratch:
        _copy_tests(opts.pytorch, opts.commit, files, Path(scratch))
        for name in files:
            by_device = {"cpu": run_file(Path(scratch), name, "cpu", opts.timeout, opts.budget, opts.select)}
            not_run = [_pjrt_id(t) for t, r in by_device["cpu"].items()
                       if _generic(t, "cpu") and r["outcome"] != "passed"] if opts.only_cpu_passing else None
            by_device["pjrt"] = run_file(Path(scratch), name, "pjrt", opts.timeout, opts.budget, opts.select, not_run)
            raw[name] = by_device
            results[name] = compare(by_device["cpu"], by_device["pjrt"])
            r = results[name]
            if r.get("collection_error"):
                print(f"{name}: did not import: {r['collection_error']}", flush=True)
                continue
            print(f"{name}: {r['pjrt_passing']}/{r['cpu_passing']} of the CPU-passing tests pass on pjrt, "
                  f"{len(r['crashes'])} crashes, {len(r['slow'])} over 60 s", flush=True)
    command = "python -m torch_pjrt.tools.pytorch_tests " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(results, command)
    if opts.json:
        opts.json.write_text(json.dumps({"results": results, "tests": raw}, indent=1,
                                         default=lambda o: sorted(o) if isinstance(o, set) else str(o)))
    if opts.out:
        opts.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
