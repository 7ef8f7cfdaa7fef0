"""transformers and accelerate on pjrt with no configuration (torch_pjrt/integrations/huggingface.py),
against the real packages pinned in the test extra; the CPU run is the reference."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from torch_pjrt.integrations import huggingface  # noqa: E402

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


def tiny_llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))


def tiny_tokenizer():
    """A word-level tokenizer over the tiny vocabulary, built here (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    # two digits: a special token's text is never a prefix of another's ("t01" in "t17" would split it)
    tokenizer = Tokenizer(models.WordLevel({f"t{i:02d}": i for i in range(TINY["vocab_size"])}, unk_token="t00"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t00", eos_token="t01")


def token_rows(n: int = 16, length: int = 16) -> list[list[int]]:
    return torch.randint(2, TINY["vocab_size"], (n, length), generator=torch.Generator().manual_seed(1)).tolist()


def train_losses(make_trainer, make_args, tmp_path, use_cpu: bool) -> tuple[list[float], torch.device]:
    """Losses of 4 logged steps of a Trainer-like class, and the device its model trained on."""
    args = make_args(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, logging_steps=1,
                     report_to=[], save_strategy="no", use_cpu=use_cpu, learning_rate=1e-3, seed=0,
                     disable_tqdm=True)
    trainer = make_trainer(tiny_llama(), args)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, next(trainer.model.parameters()).device


def assert_trains_as_on_the_cpu(make_trainer, make_args, tmp_path, monkeypatch) -> None:
    losses, device = train_losses(make_trainer, make_args, tmp_path / "pjrt", use_cpu=False)
    assert device.type == "pjrt"
    # accelerate lets ACCELERATE_TORCH_DEVICE win over use_cpu=True (docs/ecosystem.md): the CPU
    # reference names the CPU there too, as a user of use_cpu=True on a pjrt machine does.
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")
    cpu_losses, cpu_device = train_losses(make_trainer, make_args, tmp_path / "cpu", use_cpu=True)
    assert cpu_device.type == "cpu"
    assert len(losses) == 4
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)


def test_the_defaults_are_set_where_pjrt_is_the_accelerator():
    import os

    assert huggingface.applied == {"ACCELERATE_TORCH_DEVICE": "pjrt", "USE_HUB_KERNELS": "NO"} or all(
        name in os.environ for name in huggingface.ENV_DEFAULTS)  # set by the user before: theirs is kept
    assert os.environ["ACCELERATE_TORCH_DEVICE"] and os.environ["USE_HUB_KERNELS"]


def test_no_default_where_a_native_accelerator_is_available_or_the_user_chose():
    assert huggingface.env_defaults({}, ["cuda"]) == {}
    assert huggingface.env_defaults({}, ["mps"]) == {}
    assert huggingface.env_defaults({"ACCELERATE_TORCH_DEVICE": "cpu"}, []) == {"USE_HUB_KERNELS": "NO"}
    assert huggingface.env_defaults({}, []) == huggingface.ENV_DEFAULTS


def test_trainer_trains_on_pjrt_with_no_setting_as_on_the_cpu(tmp_path, monkeypatch):
    data = [{"input_ids": t, "labels": t} for t in torch.tensor(token_rows())]
    assert_trains_as_on_the_cpu(
        lambda model, args: transformers.Trainer(model=model, args=args, train_dataset=data),
        transformers.TrainingArguments, tmp_path, monkeypatch)


def test_trl_sft_trainer_trains_on_pjrt_as_on_the_cpu(tmp_path, monkeypatch):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"input_ids": token_rows()})
    # SFTConfig defaults to bf16=True, which transformers accepts only on devices it knows
    # (docs/ecosystem.md has the upstream change); float32 on both sides compares exactly.
    assert_trains_as_on_the_cpu(
        lambda model, args: trl.SFTTrainer(model=model, args=args, train_dataset=data,
                                           processing_class=tiny_tokenizer()),
        lambda **kw: trl.SFTConfig(bf16=False, **kw), tmp_path, monkeypatch)


def test_trl_import_names_the_bf16_setting_where_pjrt_is_the_accelerator():
    if not huggingface.applied.get("ACCELERATE_TORCH_DEVICE"):
        pytest.skip("the user set ACCELERATE_TORCH_DEVICE: torch-pjrt applied no default, so it stays quiet")
    with pytest.warns(UserWarning, match="Pass bf16=False"):
        huggingface.warn_bf16_default()


def test_text_generation_pipeline_on_pjrt_as_on_the_cpu():
    def generated(device: str) -> list[int]:
        generator = transformers.pipeline("text-generation", model=tiny_llama(), tokenizer=tiny_tokenizer(),
                                          device=device)
        assert generator.model.device.type == device
        out = generator("t05 t09 t17 t33", max_new_tokens=8, do_sample=False, return_tensors=True)
        return out[0]["generated_token_ids"]

    tokens = generated("pjrt")
    assert tokens[:4] == [5, 9, 17, 33] and len(tokens) > 4
    assert tokens == generated("cpu")


@pytest.mark.parametrize("device_map", ["pjrt", "auto", {"": 0}, 0, "pjrt:0"], ids=str)
def test_from_pretrained_device_map_loads_onto_pjrt(tmp_path_factory, device_map):
    path = tmp_path_factory.getbasetemp() / "tiny-llama"
    if not path.exists():
        tiny_llama().save_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, device_map=device_map)
    assert {p.device for p in model.parameters()} == {torch.device("pjrt:0")}
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="cpu")
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(ids.to("pjrt")).logits.cpu()
        expected = reference(ids).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_safetensors_load_file_then_to_pjrt(tmp_path):
    """safetensors' Rust side refuses device="pjrt"; the documented route loads on the CPU and moves."""
    from safetensors.torch import load_file, save_file

    tensors = {"w": torch.randn(3, 4), "b": torch.arange(5)}
    save_file(tensors, tmp_path / "t.safetensors")
    loaded = {name: t.to("pjrt") for name, t in load_file(tmp_path / "t.safetensors").items()}
    for name, t in tensors.items():
        assert loaded[name].device.type == "pjrt"
        torch.testing.assert_close(loaded[name].cpu(), t, rtol=0, atol=0)


def test_peft_lora_trains_on_pjrt_as_on_the_cpu():
    peft = pytest.importorskip("peft")

    def losses(device: str) -> list[float]:
        model = peft.get_peft_model(tiny_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        model.to(device)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(3)).to(device)
        out = []
        for _ in range(4):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        return out

    torch.testing.assert_close(losses("pjrt"), losses("cpu"), rtol=1e-5, atol=1e-5)
