"""torch-pjrt bench: every field of every row, the PNG, user models, failures as rows.

Small selections (a few steps of tiny models on cpu and pjrt) keep this under a minute;
the full `--quick` run (about 1.5 minutes here) is marked slow. No test asserts a timing
beyond its sign: the machine is shared.
"""
from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from torch_pjrt.cli import main
from tests.checkout import ROOT, environment
from torch_pjrt.tools import bench


@pytest.fixture(autouse=True)
def _wide_output(monkeypatch):
    """The report's text is checked verbatim: a non-terminal output is 160 columns wide unless COLUMNS
    says otherwise, and pytest-xdist's workers set COLUMNS to the controller's terminal (80 here)."""
    monkeypatch.delenv("COLUMNS", raising=False)

FAST = ["--steps", "2", "--warmup", "1", "--no-progress"]
TIMINGS = ("first_call_s", "compile_s", "latency_p50_ms", "latency_p95_ms", "latency_mean_ms",
           "latency_min_ms", "samples_per_s", "wall_s")


# -- user models (referenced as tests.test_bench:<function>) ------------------------------
class TinyLM(nn.Module):
    def __init__(self, vocab: int = 17, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))  # (B, T, vocab): not a scalar


def tiny_lm():
    return TinyLM(), torch.randint(17, (3, 5))


class RefusesPjrt(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x, scale):
        if x.device.type == "pjrt":
            raise RuntimeError("deliberate failure on pjrt")
        return self.lin(x * scale)


def refuses_pjrt():
    return RefusesPjrt(), (torch.randn(6, 4), torch.tensor(2.0))


def not_a_pair():
    return TinyLM()


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "bench.json"
    assert main(["bench", *args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# -- tests ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlp_report(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("bench")
    png = tmp / "bars.png"
    report = _run(tmp, "--workloads", "mlp", "--targets", "cpu,pjrt", "--price", "pjrt=1.2",
                  "--price", "cpu=0.1", "--plot", str(png), *FAST)
    return report, png


def test_json_has_every_field_of_every_row(mlp_report) -> None:
    report, _ = mlp_report
    assert {"schema_version", "created", "settings", "host", "workloads", "unavailable", "not_run", "rows",
            "wall_s"} <= set(report)
    rows = report["rows"]
    assert [(r["workload"], r["mode"], r["target"]) for r in rows] == [
        ("mlp", "train", "cpu"), ("mlp", "train", "pjrt"), ("mlp", "infer", "cpu"), ("mlp", "infer", "pjrt")]
    for r in rows:
        assert tuple(r) == bench.ROW_FIELDS
        assert r["status"] == "ok", r["error"]
        assert r["error"] is None
        for key in TIMINGS:
            assert isinstance(r[key], float) and r[key] >= 0, (key, r[key])
        assert r["latency_p95_ms"] >= r["latency_p50_ms"] >= r["latency_min_ms"] > 0
        assert r["steps"] == 2 and r["warmup_steps"] == 1
        assert r["batch_size"] == r["samples_per_step"] == bench.SIZES["full"]["mlp"]["batch"]
        assert r["params"] == sum(p.numel() for p in bench.builtin_workload("mlp", "full").build()[0].parameters())
        assert r["tokens_per_step"] is None and r["tokens_per_s"] is None and r["usd_per_million_tokens"] is None
        assert r["peak_memory_bytes"] >= 0 and r["memory_method"]
        assert r["graphs"] is None and r["graph_breaks"] is None  # eager targets compile nothing
        assert r["fallback_ops"] == {}


def test_pjrt_memory_is_the_device_allocator_peak(mlp_report) -> None:
    pjrt = [r for r in mlp_report[0]["rows"] if r["target"] == "pjrt"]
    for r in pjrt:
        assert r["memory_method"] == "torch.pjrt.max_memory_allocated"
        # at least the float32 weights live on the device during the row
        assert r["peak_memory_bytes"] >= 4 * r["params"]
    assert pjrt[0]["peak_memory_bytes"] > pjrt[1]["peak_memory_bytes"]  # train holds grads and Adam state


def test_cost_follows_the_price_table(mlp_report) -> None:
    report, _ = mlp_report
    assert report["settings"]["prices_usd_per_hour"]["pjrt"] == 1.2
    for r in report["rows"]:
        price = {"pjrt": 1.2, "cpu": 0.1}[r["target"]]
        assert r["price_usd_per_hour"] == price
        expected = price / 3600 / r["samples_per_s"] * 1e6
        assert math.isclose(r["usd_per_million_samples"], expected, rel_tol=1e-3)


def test_plot_is_a_real_png(mlp_report) -> None:
    _, png = mlp_report
    width, height = _png_size(png)
    assert (width, height) == (400, 640)  # one workload, two modes: 4.0 x 6.4 inches at 100 dpi
    assert png.stat().st_size > 5000  # bars, labels and a legend, not an empty canvas


def test_user_model_by_module_and_by_file(tmp_path: Path) -> None:
    report = _run(tmp_path, "--model", "tests.test_bench:tiny_lm", "--targets", "cpu,pjrt", *FAST)
    rows = report["rows"]
    assert [(r["workload"], r["mode"], r["target"]) for r in rows] == [
        ("tests.test_bench:tiny_lm", m, t) for m in ("train", "infer") for t in ("cpu", "pjrt")]
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert r["batch_size"] == 3 and r["tokens_per_step"] == 15  # integer (B, T) input: tokens
        assert math.isclose(r["tokens_per_s"], 5 * r["samples_per_s"], rel_tol=1e-3)
        assert r["usd_per_million_tokens"] is not None
        assert r["params"] == 17 * 16 + 16 * 17 + 17

    source = tmp_path / "my_model.py"
    source.write_text(textwrap.dedent("""
        import torch
        def build():
            return torch.nn.Sequential(torch.nn.Linear(8, 3)), torch.randn(5, 8)
    """))
    report = _run(tmp_path, "--model", f"{source}:build", "--targets", "pjrt", "--modes", "train", *FAST)
    (row,) = report["rows"]
    assert row["status"] == "ok", row["error"]
    assert row["batch_size"] == 5 and row["tokens_per_s"] is None and row["params"] == 27


def test_a_failing_target_is_a_row_not_a_crash(tmp_path: Path, capsys) -> None:
    report = _run(tmp_path, "--model", "tests.test_bench:refuses_pjrt", "--targets", "pjrt,cpu", *FAST)
    status = {(r["mode"], r["target"]): (r["status"], r["error"]) for r in report["rows"]}
    assert status[("train", "cpu")] == ("ok", None)
    assert status[("infer", "cpu")] == ("ok", None)
    for mode in ("train", "infer"):
        state, error = status[(mode, "pjrt")]
        assert state == "error"
        assert error == "RuntimeError: deliberate failure on pjrt"
    failed = [r for r in report["rows"] if r["status"] == "error"]
    assert all(r["latency_p50_ms"] is None and r["samples_per_s"] is None for r in failed)
    assert "deliberate failure on pjrt" in capsys.readouterr().out  # and the table says so


def test_compiled_targets_compile_the_builtin_models() -> None:
    # The built-in models live in torch_pjrt, which torch_pjrt.compiler puts on Dynamo's
    # skip list: without bench's dont_skip_tracing they would silently run eagerly.
    workload = bench.builtin_workload("mlp", "quick")
    row = bench.run_row(workload, "infer", "pjrt-compile", warmup=1, steps=1, prices={})
    assert row["status"] == "ok", row["error"]
    assert row["graphs"] == 1 and row["graph_breaks"] == 0


def test_unavailable_hf_is_reported_not_raised(monkeypatch) -> None:
    monkeypatch.setattr(bench, "_hf_missing", lambda: "transformers is not installed (pip install transformers)")
    report = bench.run_bench(workloads=["hf"], modes=["infer"], targets=["cpu", "pjrt"], steps=1, warmup=1,
                             progress=False)
    assert report["unavailable"] == [{"workload": "hf",
                                      "reason": "transformers is not installed (pip install transformers)"}]
    assert [(r["target"], r["status"]) for r in report["rows"]] == [("cpu", "unavailable"), ("pjrt", "unavailable")]
    assert all(tuple(r) == bench.ROW_FIELDS for r in report["rows"])


def test_cuda_target_without_cuda_is_unavailable() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    row = bench.run_row(bench.builtin_workload("mlp", "quick"), "infer", "cuda", warmup=1, steps=1, prices={})
    assert row["status"] == "unavailable" and "CUDA is not available" in row["error"]
    assert "cuda" not in bench.available_targets()


@pytest.mark.parametrize("args, message", [
    (["--model", "tests.test_bench:no_such_function"], "has no function no_such_function"),
    (["--model", "nomodule"], "expected module:function"),
    (["--model", "tests.test_bench:not_a_pair"], "must return (model, example batch)"),
    (["--targets", "tpu-magic"], "unknown target(s) tpu-magic"),
    (["--price", "pjrt"], "expected TARGET=USD_PER_HOUR"),
])
def test_bad_arguments_exit_2_with_a_message(args, message, capsys) -> None:
    assert main(["bench", *args, "--no-progress"]) == 2
    assert message in capsys.readouterr().out.replace("\n", "")


def test_prices_resolve_target_then_device_then_platform() -> None:
    prices = bench.parse_prices(["pjrt-compile=3", "cpu=0.5"])
    assert bench.price_for("pjrt-compile", prices) == 3.0
    assert bench.price_for("inductor", prices) == 0.5  # its device's price
    assert bench.price_for("pjrt", prices) == 0.5  # pjrt here runs on the cpu platform
    assert bench.price_for("cuda", prices) == bench.DEFAULT_PRICES["cuda"]


def test_percentile_matches_numpy() -> None:
    import numpy as np

    values = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0]
    for q in (50, 95):
        assert math.isclose(bench._percentile(values, q), float(np.percentile(values, q)))


@pytest.mark.slow
def test_quick_finishes_in_two_minutes(tmp_path: Path) -> None:
    # with the compile caches as they are (a first run on a fresh, busy machine can take
    # longer: docs/bench.md has both times)
    report = _run(tmp_path, "--quick", "--no-progress")
    assert report["wall_s"] < 120
    assert {(r["workload"], r["mode"], r["target"]) for r in report["rows"]} == {
        (w, m, t) for w in bench.QUICK_WORKLOADS for m in bench.MODES for t in bench.available_targets()}
    assert all(r["status"] == "ok" for r in report["rows"]), [r["error"] for r in report["rows"]]
    assert all(r["graphs"] >= 1 for r in report["rows"] if r["target"] in ("pjrt-compile", "inductor"))


def test_json_alone_goes_to_stdout_and_the_table_to_stderr(capsys) -> None:
    assert main(["bench", "--model", "tests.test_bench:tiny_lm", "--targets", "cpu", "--modes", "infer",
                 "--json", *FAST]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # nothing but the JSON on stdout
    assert [(r["target"], r["status"]) for r in report["rows"]] == [("cpu", "ok")]
    assert "torch-pjrt bench" in captured.err and "p50 ms" in captured.err


def test_plot_without_matplotlib_stops_before_the_run_with_the_hint_verbatim(tmp_path: Path) -> None:
    """matplotlib made unimportable in a real `torch-pjrt` process (no mock of torch)."""
    script = ("import sys\n"
              "sys.modules['matplotlib'] = None  # `import matplotlib` raises ImportError\n"
              "sys.argv = ['/venv/bin/torch-pjrt', *sys.argv[1:]]\n"
              "from torch_pjrt.cli import main\n"
              "sys.exit(main())\n")
    png = tmp_path / "bars.png"
    result = subprocess.run([sys.executable, "-c", script, "bench", "--workloads", "mlp", "--targets", "cpu",
                             "--plot", str(png), *FAST], capture_output=True, text=True, env=environment(),
                            cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stderr
    assert bench.PLOT_NEEDS_MATPLOTLIB in result.stdout  # `[bench]` survives rich's markup
    assert "pip install 'torch-pjrt[bench]'" in result.stdout
    assert "bench wall time" not in result.stdout  # nothing ran
    assert not png.exists()
