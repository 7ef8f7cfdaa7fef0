"""Each example runs a few steps on cpu and on pjrt: the same losses and, in float32, the
same parameters (within float32 reassociation error, not bit-exact: XLA fuses and
reorders reductions)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_both(name: str, argv: list[str]):
    main = load(name).main
    cpu_losses, cpu_model = main(["--device", "cpu", *argv])
    pjrt_losses, pjrt_model = main(["--device", "pjrt", *argv])
    return cpu_losses, pjrt_losses, cpu_model, pjrt_model


def assert_same_training(cpu_losses, pjrt_losses, cpu_model, pjrt_model, loss_tol: float, param_tol: float):
    assert len(cpu_losses) == len(pjrt_losses) > 0
    torch.testing.assert_close(torch.tensor(pjrt_losses), torch.tensor(cpu_losses), rtol=loss_tol, atol=loss_tol)
    cpu_state, pjrt_state = cpu_model.state_dict(), pjrt_model.state_dict()
    assert cpu_state.keys() == pjrt_state.keys()
    for key, value in cpu_state.items():
        other = pjrt_state[key]
        assert other.device.type == "pjrt", key
        if value.is_floating_point():
            torch.testing.assert_close(other.cpu(), value, rtol=param_tol, atol=param_tol, msg=lambda m: f"{key}: {m}")
        else:  # e.g. BatchNorm's num_batches_tracked
            assert torch.equal(other.cpu(), value), key


def test_mlp():
    assert_same_training(*run_both("mlp", ["--steps", "5"]), loss_tol=1e-5, param_tol=1e-5)


def test_cnn():
    assert_same_training(*run_both("cnn", ["--steps", "3", "--batch-size", "8"]), loss_tol=1e-5, param_tol=1e-5)


def test_char_gpt():
    argv = ["--steps", "3", "--n-layer", "1", "--n-embd", "32", "--block-size", "16", "--batch-size", "4",
            "--sample-chars", "0"]
    cpu_losses, pjrt_losses, cpu_model, pjrt_model = run_both("char_gpt", argv)
    assert_same_training(cpu_losses, pjrt_losses, cpu_model, pjrt_model, loss_tol=1e-5, param_tol=1e-4)
    assert pjrt_model.head.weight is pjrt_model.tok.weight, "moving the model to pjrt untied the embeddings"


def test_char_gpt_sample_is_device_independent():
    """generate() on pjrt and on CPU from the same weights gives the same text."""
    from torch_pjrt.tools import demo_models as dm

    data, model, _ = dm.gpt_setup("cpu", n_layer=1, n_embd=32, block_size=16)
    prompt = torch.tensor([data.encode(dm.load_text()[:16])])
    cpu_text = model.generate(prompt, 6, torch.Generator().manual_seed(0))
    pjrt_text = model.to("pjrt").generate(prompt.to("pjrt"), 6, torch.Generator().manual_seed(0))
    assert torch.equal(pjrt_text.cpu(), cpu_text)


def test_lstm():
    argv = ["--steps", "3", "--batch-size", "4", "--seq-len", "8"]
    assert_same_training(*run_both("lstm", argv), loss_tol=1e-5, param_tol=1e-4)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_hf_finetune(attn):
    pytest.importorskip("transformers", reason="transformers is not installed (an optional dependency)")
    argv = ["--steps", "3", "--batch-size", "2", "--block-size", "16", "--attn", attn, "--generate", "4"]
    cpu_losses, pjrt_losses, cpu_model, pjrt_model = run_both("hf_finetune", argv)
    assert_same_training(cpu_losses, pjrt_losses, cpu_model, pjrt_model, loss_tol=1e-5, param_tol=1e-4)
    assert torch.equal(pjrt_model.generated, cpu_model.generated)  # greedy generate(): the same tokens
    assert pjrt_model.generated.shape[1] > 9


def test_hf_finetune_skips_without_transformers(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` raise ImportError
    assert load("hf_finetune").main(["--device", "cpu", "--steps", "1"]) == (None, None)
    assert "transformers is not installed" in capsys.readouterr().out


def test_demo_command_runs_and_reports(capsys):
    """`torch-pjrt demo` end to end at a tiny size: the table, the agreement line, a sample."""
    from torch_pjrt import cli

    assert cli.main(["demo", "--size", "tiny", "--steps", "8", "--cpu-steps", "8", "--batch-size", "2",
                     "--sample-chars", "5"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "loss curves, pjrt vs cpu" in out and "demo wall time" in out
    agreement = float(out.split("max |difference| ")[1].split()[0])
    assert agreement < 1e-4  # the first steps' losses agree closely
