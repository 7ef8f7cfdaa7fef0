"""torch-pjrt bench --workload llm: every field of every row and how the fields relate, greedy
tokens equal to torch CPU float32's, a mismatch printed loudly, the PNG, usage errors.

The smallest settings (batch 1, an 8-token prompt, 4 new tokens, 2 warm-up + 2 timed passes)
keep a run of the tiny Llama on pjrt and cpu under a minute. No test asserts a timing beyond
its sign and the run's wall time: the machine is shared.
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from torch_pjrt.cli import main
from torch_pjrt.tools import bench_llm

pytest.importorskip("transformers")

SMALLEST = ["--workload", "llm", "--batch-sizes", "1", "--prompt-lengths", "8", "--new-tokens", "4",
            "--warmup", "2", "--steps", "2", "--no-progress"]
LATENCIES = ("first_pass_ttft_ms", "first_pass_tpot_ms", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms",
             "tpot_mean_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "output_tokens_per_s", "compile_s")


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "llm.json"
    assert main(["bench", *args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def eager_report(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("bench_llm")
    png = tmp / "llm.png"
    report = _run(tmp, *SMALLEST, "--targets", "pjrt,cpu", "--price", "pjrt=1.2", "--price", "cpu=0.1",
                  "--plot", str(png))
    return report, png


def test_every_row_has_every_field_and_they_agree(eager_report) -> None:
    report, _ = eager_report
    assert report["workload"] == "llm"
    assert [(r["target"], r["mode"], r["cache"]) for r in report["rows"]] == [
        ("pjrt", "eager", "dynamic"), ("cpu", "eager", "dynamic")]
    for r in report["rows"]:
        assert tuple(r) == bench_llm.LLM_ROW_FIELDS
        assert r["status"] == "ok" and r["error"] is None, r["error"]
        assert (r["batch_size"], r["prompt_length"], r["new_tokens"]) == (1, 8, 4)
        assert (r["warmup_passes"], r["timed_passes"], r["dtype"], r["quantization"]) == (2, 2, "float32", None)
        for key in LATENCIES:
            assert isinstance(r[key], float) and r[key] >= 0, (key, r[key])
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p95_ms"]
        assert 0 < r["tpot_p50_ms"] <= r["tpot_p95_ms"]
        # tokens/s are the per-token times inverted: decode from the mean TPOT, prefill per prompt token
        assert math.isclose(r["decode_tokens_per_s"], r["batch_size"] * 1e3 / r["tpot_mean_ms"], rel_tol=1e-2)
        assert r["prefill_tokens_per_s"] > 0 and r["output_tokens_per_s"] > 0  # their order is a timing: not asserted
        price = {"pjrt": 1.2, "cpu": 0.1}[r["target"]]
        assert r["price_usd_per_hour"] == price
        assert math.isclose(r["usd_per_million_output_tokens"], price / 3600 / r["output_tokens_per_s"] * 1e6,
                            rel_tol=1e-3)
        assert r["peak_memory_bytes"] >= r["weights_bytes"] == 4 * r["params"] > 0
        assert r["memory_method"]
        # GQA: 2 layers x keys and values x 2 KV heads x head_dim 16 x (8 + 4) positions, float32
        assert r["kv_cache_bytes"] == 2 * 2 * 2 * 16 * 12 * 4
        assert r["graphs"] is None and r["fallback_ops"] == {}
        if r["target"] == "pjrt":  # steady passes reuse the first pass's executables
            assert r["executables_first_pass"] >= 0 and r["executables_timed"] == 0
        else:
            assert r["executables_first_pass"] is None and r["executables_timed"] is None
        assert r["load_average_1min"] is not None


def test_pjrt_eager_greedy_tokens_equal_cpu_float32(eager_report) -> None:
    for r in eager_report[0]["rows"]:
        assert r["tokens_equal_cpu_float32"] is True, r["tokens_mismatch"]
        assert r["tokens_mismatch"] is None


def test_header_has_the_machine_and_the_run_is_short(eager_report) -> None:
    report, _ = eager_report
    host, settings = report["host"], report["settings"]
    for key in ("cpu_count", "torch_threads", "pjrt_platform", "pjrt_device", "load_average_1min",
                "load_average_1min_end"):
        assert host[key] is not None, key
    assert settings["decoding"] == "greedy" and settings["model"] == "llama-tiny"
    assert "GQA" in settings["description"]
    assert report["wall_s"] < 60


def test_plot_is_a_real_png(eager_report) -> None:
    _, png = eager_report
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_compiled_pjrt_is_the_static_cache_recipe_with_one_executable_per_phase(tmp_path: Path) -> None:
    report = _run(tmp_path, *SMALLEST, "--targets", "pjrt-compile")
    (row,) = report["rows"]
    assert row["status"] == "ok", row["error"]
    assert (row["mode"], row["cache"]) == ("compiled", "static")
    assert row["graphs"] == 2 and row["graph_breaks"] == 0  # prefill and decode, nothing more
    assert row["executables_timed"] == 0  # every timed token runs the executables built in warm-up
    assert row["tokens_equal_cpu_float32"] is True, row["tokens_mismatch"]


def test_reduce_overhead_pjrt_runs_the_same_recipe_with_one_executable_per_phase(tmp_path: Path) -> None:
    """torch.compile(model.forward, backend="pjrt", mode="reduce-overhead") with the static cache."""
    report = _run(tmp_path, *SMALLEST, "--targets", "pjrt-reduce-overhead", "--modes", "reduce-overhead")
    (row,) = report["rows"]
    assert row["status"] == "ok", row["error"]
    assert (row["target"], row["mode"], row["cache"], row["device"]) == (
        "pjrt-reduce-overhead", "reduce-overhead", "static", "pjrt")
    assert row["graphs"] == 2 and row["graph_breaks"] == 0  # prefill and decode
    assert row["executables_first_pass"] >= 2 and row["executables_timed"] == 0
    assert row["tokens_equal_cpu_float32"] is True, row["tokens_mismatch"]
    assert row["fallback_ops"] == {}


def test_torchao_int8_weight_only_on_pjrt_and_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    report = _run(tmp_path, *SMALLEST, "--targets", "pjrt,cpu", "--quantize", "int8-weight-only")
    assert report["settings"]["quantization"] == "int8-weight-only"
    assert "int8-weight-only alike" in report["settings"]["reference"]
    for row in report["rows"]:
        assert row["status"] == "ok", row["error"]
        assert row["quantization"] == "int8-weight-only"
        assert row["weights_bytes"] < 4 * row["params"]  # int8 linear weights, counted as stored
        assert row["tokens_equal_cpu_float32"] is True, row["tokens_mismatch"]
        assert row["fallback_ops"] == {}


def test_a_token_mismatch_is_printed_loudly(eager_report) -> None:
    from rich.console import Console

    import torch

    report = json.loads(json.dumps(eager_report[0]))
    row = report["rows"][0]
    row["tokens_mismatch"] = bench_llm.first_difference(torch.tensor([[1, 2, 3], [4, 5, 6]]),
                                                        torch.tensor([[1, 2, 3], [4, 9, 6]]))
    row["tokens_equal_cpu_float32"] = False
    assert row["tokens_mismatch"] == ("1 of 2 sequences differ; first at sequence 1, output token 1: 5 vs 9 on "
                                      "torch CPU float32")
    text = io.StringIO()
    bench_llm.render(report, Console(file=text, width=200))
    assert "GREEDY TOKENS DIFFER: pjrt eager" in text.getvalue()
    assert bench_llm.first_difference(torch.tensor([[7]]), torch.tensor([[7]])) is None


def test_hf_directory_without_weights_gets_random_ones(tmp_path: Path) -> None:
    import transformers

    directory = tmp_path / "tiny-mistral"
    transformers.MistralConfig(**bench_llm.TINY_LLAMA).save_pretrained(directory)
    report = _run(tmp_path, *SMALLEST, "--model", f"hf:{directory}", "--targets", "cpu")
    assert report["settings"]["model"] == f"hf:{directory}"
    assert "random weights" in report["settings"]["description"]
    (row,) = report["rows"]
    assert row["status"] == "ok" and row["tokens_equal_cpu_float32"] is True, row["error"]


def test_json_alone_goes_to_stdout_and_the_table_to_stderr(capsys) -> None:
    assert main(["bench", *SMALLEST, "--targets", "cpu", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # nothing but the JSON on stdout
    assert [(r["target"], r["status"]) for r in report["rows"]] == [("cpu", "ok")]
    assert "torch-pjrt bench --workload llm" in captured.err and "TTFT ms" in captured.err


def test_modes_select_targets() -> None:
    every = ["pjrt", "pjrt-compile", "pjrt-reduce-overhead", "cpu", "inductor"]
    assert bench_llm.llm_targets(every, ["eager"]) == ["pjrt", "cpu"]
    assert bench_llm.llm_targets(every, ["compiled"]) == ["pjrt-compile", "inductor"]
    assert bench_llm.llm_targets(every, ["reduce-overhead"]) == ["pjrt-reduce-overhead"]
    assert "pjrt-reduce-overhead" in bench_llm.llm_targets(None, None)  # a default target


@pytest.mark.parametrize("args, message", [
    (["--modes", "train"], "unknown mode(s) train for --workload llm"),
    (["--workloads", "llm,mlp"], "--workload llm runs alone"),
    (["--new-tokens", "1"], "--new-tokens must be at least 2"),
    (["--batch-sizes", "two"], "--batch-sizes: expected comma-separated integers"),
    (["--model", "hf:no-such-model-anywhere"], "not in the Hugging Face cache"),
    (["--targets", "cuda-inductor", "--modes", "eager"], "no target among cuda-inductor runs in mode(s) eager"),
    (["--targets", "cpu-reduce-overhead"], "unknown target(s) cpu-reduce-overhead"),
])
def test_bad_arguments_exit_2_with_a_message(args, message, capsys) -> None:
    assert main(["bench", "--workload", "llm", *args, "--no-progress"]) == 2
    assert message in capsys.readouterr().out.replace("\n", "")
