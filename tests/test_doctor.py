"""torch-pjrt doctor: what it reports, and that a missing piece is reported, not raised."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import re
import sys
import types
from pathlib import Path

import pytest

import torch_pjrt
from torch_pjrt.cli import main
from torch_pjrt.tools import doctor

KEYS = {"python", "packages", "jax_plugins", "autoload", "environment", "torch", "jax", "pjrt",
        "compilers", "runtime", "variables", "problems"}
ROOT = Path(__file__).resolve().parents[1]
VARIABLE = re.compile(r"TORCH_PJRT_[A-Z][A-Z0-9_]*")


@pytest.fixture(scope="module")
def info() -> dict:
    return doctor.collect()


def test_versions_match_the_installed_packages(info: dict) -> None:
    import jax
    import torch

    assert set(info) == KEYS
    assert info["packages"]["torch"] == metadata.version("torch")
    assert info["packages"]["jax"] == metadata.version("jax") == jax.__version__
    assert info["packages"]["jaxlib"] == metadata.version("jaxlib")
    assert info["torch"]["version"] == torch.__version__
    assert info["torch"]["error"] is None


def test_devices_are_the_ones_jax_sees(info: dict) -> None:
    import jax

    assert info["jax"]["error"] is None
    assert info["jax"]["backend"] == jax.default_backend()
    assert [(d["id"], d["platform"], d["kind"]) for d in info["jax"]["devices"]] == [
        (d.id, d.platform, d.device_kind) for d in jax.devices()]
    for device, jax_device in zip(info["jax"]["devices"], jax.devices()):
        stats = jax_device.memory_stats()
        assert device["memory"] == (
            None if not stats else {k: stats[k] for k in device["memory"]})


def test_plugins_are_listed_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = metadata.EntryPoint("cuda", "jax_cuda12_plugin", "jax_plugins")

    def entry_points(group: str) -> list[metadata.EntryPoint]:
        return [entry] if group == "jax_plugins" else []

    monkeypatch.setattr(doctor.metadata, "entry_points", entry_points)
    assert doctor.jax_plugins()[0] == {"name": "cuda", "entry_point": "jax_cuda12_plugin",
                                       "distribution": None, "version": None}


@pytest.mark.parametrize("value, enabled_by_env", [(None, True), ("1", True), ("0", False),
                                                   ("true", False)])
def test_autoload_follows_torchs_rule(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                      enabled_by_env: bool) -> None:
    if value is None:
        monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    else:
        monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", value)
    installed = any(e.name == "pjrt" for e in metadata.entry_points(group="torch.backends"))
    autoload = doctor.autoload_info()
    assert autoload["variable"] == value
    assert autoload["enabled"] == (installed and enabled_by_env)
    assert (autoload["entry_point"] is not None) == installed


def fake_runtime(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType | None) -> None:
    monkeypatch.setitem(sys.modules, "torch_pjrt.runtime.build", module)
    import torch_pjrt.runtime

    if module is None:
        monkeypatch.delattr(torch_pjrt.runtime, "build", raising=False)
    else:
        monkeypatch.setattr(torch_pjrt.runtime, "build", module, raising=False)


def test_runtime_build_info_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("torch_pjrt.runtime.build")
    module.build_info = lambda: {"cache_dir": "/cache/x", "built": False,  # type: ignore[attr-defined]
                                 "compiler": "c++ 12", "torch_version": "2.13.0"}
    fake_runtime(monkeypatch, module)
    assert doctor.runtime_info() == {"available": True, "error": None, "cache_dir": "/cache/x",
                                     "built": False, "compiler": "c++ 12",
                                     "torch_version": "2.13.0"}


def test_missing_runtime_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_runtime(monkeypatch, types.ModuleType("torch_pjrt.runtime.build"))  # no build_info
    runtime = doctor.runtime_info()
    assert runtime["available"] is False and runtime["error"].startswith("AttributeError")
    fake_runtime(monkeypatch, None)  # the module itself is missing
    runtime = doctor.runtime_info()
    assert runtime["available"] is False and runtime["error"].startswith("ModuleNotFoundError")


def test_missing_compilers_are_problems(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        info: dict) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert doctor.tool_info("c++") == {"path": None, "version": None}
    broken = {**info, "compilers": {name: doctor.tool_info(name) for name in doctor.TOOLS}}
    problems = doctor.problems(broken)
    assert "no C++ compiler on PATH: the runtime extension cannot be built" in problems
    assert "ninja is not on PATH: the runtime extension cannot be built" in problems


def test_compiler_versions_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tool = tmp_path / "ninja"
    tool.write_text("#!/bin/sh\necho 9.9.9\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert doctor.tool_info("ninja") == {"path": str(tool), "version": "9.9.9"}


def test_cli_json_and_table(capsys: pytest.CaptureFixture[str], info: dict) -> None:
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == KEYS
    assert data["packages"] == info["packages"]
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for title in ("Versions", "JAX / PJRT", "PyTorch", "Build", "Environment"):
        assert title in out
    assert info["packages"]["torch"] in out


def test_every_documented_variable_is_listed_and_every_one_the_code_reads_is_known() -> None:
    documented = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        documented |= set(VARIABLE.findall(doc.read_text(encoding="utf-8")))
    assert documented == set(doctor.VARIABLES)
    read = set()
    for source in (ROOT / "torch_pjrt").rglob("*.py"):
        if not source.name.startswith("audit"):  # the audit's rules mention variables of scanned projects
            read |= set(VARIABLE.findall(source.read_text(encoding="utf-8")))
    assert read <= set(doctor.VARIABLES) | set(doctor.INTERNAL_VARIABLES)


def test_the_defaults_are_the_ones_the_code_applies() -> None:
    """Each `environ.get("TORCH_PJRT_X", "default")` in the sources has doctor's default."""
    applied = {}
    for source in (ROOT / "torch_pjrt").rglob("*.py"):
        for name, default in re.findall(r"\.get\(\"(TORCH_PJRT_[A-Z0-9_]+)\", \"([^\"]*)\"\)", source.read_text()):
            if default:  # "" stands for unset: the behaviour is described in words
                applied[name] = default
    assert applied  # the pattern still finds the reads
    for name, default in applied.items():
        assert doctor.VARIABLES[name] == default, name


def test_set_variables_are_listed_with_their_effective_values(monkeypatch: pytest.MonkeyPatch,
                                                             info: dict, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCH_PJRT_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_PJRT_FALLBACK", "Error")
    monkeypatch.setenv("TORCH_PJRT_FALBACK", "error")  # a typo
    monkeypatch.delenv("TORCH_PJRT_COLLECTIVES", raising=False)
    listed = {v["name"]: v for v in doctor.variables(info["pjrt"])}
    assert [name for name in listed if listed[name]["known"]] == list(doctor.VARIABLES)
    assert listed["TORCH_PJRT_DUMP_DIR"] == {"name": "TORCH_PJRT_DUMP_DIR", "set": True, "value": str(tmp_path),
                                             "effective": str(tmp_path), "known": True}
    assert listed["TORCH_PJRT_CACHE_DIR"]["effective"] == str(tmp_path / "cache")
    assert listed["TORCH_PJRT_FALLBACK"]["effective"] == "error"  # fallback.mode() lowercases it
    assert listed["TORCH_PJRT_COLLECTIVES"] == {"name": "TORCH_PJRT_COLLECTIVES", "set": False, "value": None,
                                                "effective": "auto", "known": True}
    assert listed["TORCH_PJRT_PLATFORM"]["effective"] == "cpu"  # conftest: the CPU platform
    assert listed["TORCH_PJRT_CPU_DEVICES"]["effective"] == "2"
    assert listed["TORCH_PJRT_FALBACK"]["known"] is False
    problems = doctor.problems({**info, "variables": list(listed.values())})
    assert "TORCH_PJRT_FALBACK is set but torch-pjrt reads no such variable (a typo?)" in problems

    monkeypatch.setenv("TORCH_PJRT_FALLBACK", "loud")
    listed = {v["name"]: v for v in doctor.variables(info["pjrt"])}
    assert listed["TORCH_PJRT_FALLBACK"]["effective"].startswith("invalid: ValueError: TORCH_PJRT_FALLBACK must be")


def test_total_memory_is_the_allocators_capacity_on_the_cpu_platform(info: dict) -> None:
    import torch

    props = torch.pjrt.get_device_properties(0)
    assert isinstance(props.total_memory, int) and props.total_memory > 0
    assert props.total_memory / 2**30 > 0  # the usual CUDA idiom works
    assert props.total_memory == torch.pjrt.memory_stats(0)["capacity_bytes"]
    assert f"capacity: {props.total_memory / 2**20:.0f} MiB" in torch.pjrt.memory_summary(0)
    assert [d["total_memory"] for d in info["pjrt"]["devices"]] == [
        torch.pjrt.get_device_properties(i).total_memory for i in range(torch.pjrt.device_count())]


def test_the_table_shows_capacity_and_variables(capsys: pytest.CaptureFixture[str], info: dict) -> None:
    doctor.render(info)
    out = capsys.readouterr().out
    assert "memory unknown" not in out
    capacity = info["pjrt"]["devices"][0]["total_memory"]
    assert f"of {capacity / 2**30:.1f} GiB (allocator capacity)" in out
    for name in doctor.VARIABLES:
        assert name in out
