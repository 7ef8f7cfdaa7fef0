"""The `torch-pjrt` command's conventions: instant --help, --version, one --json
convention, usage errors shown with the subcommand's usage, quiet on a closed pipe.

The import checks run the real command in a subprocess (the console script's code, and
`python -m torch_pjrt.cli`), since this test process has torch loaded already.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import torch_pjrt
from torch_pjrt.cli import main

from tests.checkout import ROOT, environment

SMALL = ROOT / "tests" / "fixtures" / "audit" / "small_project"
ENV = environment()

# What the installed `torch-pjrt` script runs (pip writes it with argv[0] = .../bin/torch-pjrt),
# reporting at exit whether torch or jax got imported.
CONSOLE_SCRIPT = """
import atexit, sys
atexit.register(lambda: print("imported:", sorted(m for m in ("torch", "jax") if m in sys.modules),
                              file=sys.stderr))
sys.argv = ["/venv/bin/torch-pjrt", *sys.argv[1:]]
from torch_pjrt.cli import main
sys.exit(main())
"""


def console_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, *args], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["audit", "--help"], ["bench", "--help"],
                                  ["audit", str(SMALL)], ["audit", str(SMALL), "--json"],
                                  ["audit", str(SMALL), "--fix"]])
def test_help_version_and_static_audit_import_neither_torch_nor_jax(args: list[str]) -> None:
    result = console_script(*args)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "imported: []"


def test_python_m_form_imports_no_torch_either() -> None:
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "torch_pjrt.cli", "audit", str(SMALL),
                             "--json"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "torch_pjrt.tools.audit" in imported
    assert not {name for name in imported if name.split(".")[0] in ("torch", "jax")}
    assert json.loads(result.stdout)["files_scanned"] == 4


def test_commands_that_use_the_device_still_set_it_up() -> None:
    """With autoload off, `import torch_pjrt` no longer sets the device up in the command:
    the command must (cli._device), or doctor would report no pjrt device."""
    result = subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, "doctor", "--json"], capture_output=True,
                            text=True, timeout=300, cwd=ROOT,
                            env=environment(TORCH_DEVICE_BACKEND_AUTOLOAD="0", TORCH_PJRT_PLATFORM="cpu"))
    assert result.returncode == 0, result.stderr
    pjrt = json.loads(result.stdout)["pjrt"]
    assert pjrt["error"] is None and pjrt["platform"] == "cpu" and pjrt["devices"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"torch-pjrt {torch_pjrt.__version__}\n"


def test_an_unknown_option_shows_the_subcommands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "--fixx"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: torch-pjrt audit ")
    assert "torch-pjrt audit: error: unrecognized arguments: --fixx" in err


@pytest.mark.parametrize("extra", [[], ["--fail-on", "automatic"], ["--json"]])
def test_audit_of_a_missing_path_fails_clearly(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               extra: list[str]) -> None:
    missing = tmp_path / "no_such_project"
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", str(missing), *extra])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"torch-pjrt audit: error: no such file or directory: {missing}" in captured.err


def test_audit_json_to_stdout_or_to_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["audit", str(SMALL), "--json"]) == 0
    on_stdout = json.loads(capsys.readouterr().out)  # the JSON alone: no table around it
    assert main(["audit", "--json", "-", str(SMALL)]) == 0
    assert json.loads(capsys.readouterr().out) == on_stdout
    assert main(["audit", "--json", str(SMALL)]) == 0  # a word after --json not ending in .json: the project
    assert json.loads(capsys.readouterr().out) == on_stdout
    out = tmp_path / "audit.json"
    assert main(["audit", str(SMALL), "--json", str(out)]) == 0
    assert json.loads(out.read_text()) == on_stdout
    assert "12 findings in 4 files" in capsys.readouterr().out  # the table stays on stdout
    monkeypatch.chdir(SMALL)
    assert main(["audit", "--json", str(out)]) == 0  # a .json file: the output, auditing "."
    assert json.loads(out.read_text()) == on_stdout


def test_doctor_json_to_stdout_or_to_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["doctor", "--json"]) == 0
    on_stdout = json.loads(capsys.readouterr().out)
    out = tmp_path / "doctor.json"
    assert main(["doctor", "--json", str(out)]) == 0
    assert "Versions" in capsys.readouterr().out  # the tables stay on stdout
    in_file = json.loads(out.read_text())
    assert in_file["packages"] == on_stdout["packages"]
    assert in_file["pjrt"]["devices"] == on_stdout["pjrt"]["devices"]


@pytest.mark.parametrize("args", [["audit", str(SMALL), "--json"], ["audit", str(SMALL)],
                                  ["audit", str(SMALL), "--markdown"], ["audit", str(SMALL), "--fix"],
                                  ["--help"], ["doctor", "--json"], ["doctor"]])
def test_a_closed_pipe_ends_the_command_quietly(args: list[str]) -> None:
    """`torch-pjrt audit --json | head -c1`: the reader is gone before the command writes
    (deterministic, whatever the pipe's buffer size) and nothing but silence may follow."""
    process = subprocess.Popen([sys.executable, "-m", "torch_pjrt.cli", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    process.stdout.close()
    err = process.stderr.read().decode()
    process.wait(timeout=300)
    process.stderr.close()
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert process.returncode in (0, 1)  # 1: cut short, as rich's Console ends on a closed pipe


def test_a_pipe_to_head_reads_the_start(tmp_path: Path) -> None:
    """The shell form: `| head -c1` after a report larger than the pipe's buffer."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "train.py").write_text("import torch\n" + "".join(
        f"x{i} = torch.zeros(1).cuda()\n" for i in range(3000)))
    result = subprocess.run(f"{sys.executable} -m torch_pjrt.cli audit {project} --json | head -c1",
                            shell=True, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    assert result.stdout == "{"
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr


@pytest.mark.parametrize("name", ["mlp", "cnn", "char_gpt", "lstm", "hf_finetune"])
def test_the_examples_help_shows_the_whole_description_and_the_defaults(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"examples_help_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert module.__doc__.strip() in out  # every line of it, as written (the command lines too)
    options = [line for line in out.splitlines() if line.lstrip().startswith("--")]
    assert len(options) >= 3
    assert out.count("(default: ") == len(options)  # every option shows its default
    assert "(default: pjrt)" in out


def test_the_demo_gives_a_speed_ratio_only_on_a_machine_that_is_not_overloaded() -> None:
    from torch_pjrt.tools.demo import Run, speed_verdict

    pjrt = Run("pjrt", tokens_per_step=100, step_s=[0.1, 0.5, 0.1])  # median 0.1 s: 1000 tokens/s
    cpu = Run("cpu", tokens_per_step=100, step_s=[0.2, 0.2, 9.0])  # median 0.2 s: 500 tokens/s
    quiet = speed_verdict(pjrt, cpu, warmup=5, threads=2, load_at_start=0.5, load_at_end=2.1, n_cores=2)
    assert quiet.startswith("pjrt speed: 2.00x torch CPU eager (median step time over steps 6-8, ")
    assert "interleaved step by step, torch on 2 threads" in quiet
    assert "load average 0.5 at the start, 2.1 at the end" in quiet and "on 2 cores" in quiet
    busy = speed_verdict(pjrt, cpu, warmup=5, threads=2, load_at_start=7.4, load_at_end=8.0, n_cores=2)
    assert busy.startswith("pjrt vs torch CPU eager: not a result here (load average 7.4 at the start")
    assert "x torch CPU eager" not in busy
