"""torch.save / torch.load of pjrt tensors, modules and optimizer state; safetensors."""
import io

import pytest
import torch


def roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_tensor_keeps_device_and_values():
    t = torch.arange(6.0).reshape(2, 3).to("pjrt:1")
    back = roundtrip(t)
    assert back.device == torch.device("pjrt:1")
    assert torch.equal(back.cpu(), t.cpu())
    assert roundtrip(t, map_location="cpu").device.type == "cpu"
    assert roundtrip(t, map_location="pjrt:0").device == torch.device("pjrt:0")
    assert roundtrip(t.cpu(), map_location="pjrt").device.type == "pjrt"


def test_view_sharing_survives():
    a = torch.arange(6.0, device="pjrt")
    d = roundtrip({"a": a, "v": a[2:4]})
    d["v"].fill_(-1)
    assert d["a"].cpu().tolist() == [0.0, 1.0, -1.0, -1.0, 4.0, 5.0]


def test_module_and_optimizer_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = model(torch.randn(3, 4, device="pjrt")).square().mean()
    loss.backward()
    opt.step()
    state = roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    for k, v in model.state_dict().items():
        assert state["model"][k].device.type == "pjrt"
        assert torch.equal(state["model"][k].cpu(), v.cpu())
    exp_avg = state["opt"]["state"][0]["exp_avg"]
    assert exp_avg.device.type == "pjrt"
    assert torch.equal(exp_avg.cpu(), opt.state_dict()["state"][0]["exp_avg"].cpu())
    on_cpu = roundtrip(model.state_dict(), map_location="cpu")
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fresh.load_state_dict(on_cpu)
    x = torch.randn(2, 4)
    torch.testing.assert_close(fresh(x), model(x.to("pjrt")).cpu())


def test_whole_module_pickle():
    model = torch.nn.Linear(3, 3).to("pjrt")
    back = roundtrip(model, weights_only=False)
    assert back.weight.device.type == "pjrt"
    assert torch.equal(back.weight.cpu(), model.weight.cpu())


def test_safetensors_state_dict(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is a test extra")
    sd = {"w": torch.randn(3, 4).to("pjrt"), "b": torch.arange(4, dtype=torch.int64).to("pjrt")}
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file(sd, str(path))  # pjrt tensors directly
    # safetensors only accepts its own list of device names, so load to cpu and move
    loaded = {k: v.to("pjrt") for k, v in safetensors_torch.load_file(str(path)).items()}
    for k in sd:
        assert loaded[k].device.type == "pjrt"
        assert torch.equal(loaded[k].cpu(), sd[k].cpu())
    safetensors_torch.save_model(torch.nn.Linear(2, 2).to("pjrt"), str(tmp_path / "lin.safetensors"))


# torch.save(..., _use_new_zipfile_serialization=False): the legacy format writes and reads
# storages through the C++ _write_file/_set_from_file, which pjrt routes through the host.
def legacy_roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_legacy_format_tensor_matches_cpu(dtype):
    cpu = (torch.arange(6) - 2).reshape(2, 3).to(dtype)
    t = cpu.to("pjrt:1")
    back = legacy_roundtrip(t)
    assert back.device == torch.device("pjrt:1") and back.dtype == dtype
    assert torch.equal(back.cpu(), legacy_roundtrip(cpu))
    on_cpu = legacy_roundtrip(t, map_location="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, cpu)
    assert legacy_roundtrip(t, map_location="pjrt:0").device == torch.device("pjrt:0")
    from_cpu = legacy_roundtrip(cpu, map_location="pjrt")
    assert from_cpu.device.type == "pjrt" and torch.equal(from_cpu.cpu(), cpu)


def test_legacy_format_real_file(tmp_path):
    t = torch.randn(4, 5).to("pjrt")
    path = tmp_path / "legacy.pt"
    torch.save({"t": t, "n": 3}, path, _use_new_zipfile_serialization=False)
    assert torch.equal(torch.load(path)["t"].cpu(), t.cpu())
    back = torch.load(path, map_location="cpu")
    assert back["n"] == 3 and back["t"].device.type == "cpu" and torch.equal(back["t"], t.cpu())


def test_legacy_format_view_sharing_survives():
    a = torch.arange(6.0, device="pjrt")
    d = legacy_roundtrip({"a": a, "v": a[2:4]})
    assert d["v"].untyped_storage().data_ptr() == d["a"].untyped_storage().data_ptr()
    d["v"].fill_(-1)
    assert d["a"].cpu().tolist() == [0.0, 1.0, -1.0, -1.0, 4.0, 5.0]
    cpu = torch.arange(6.0)
    expected = legacy_roundtrip({"a": cpu, "v": cpu[2:4]})  # CPU torch's behaviour, the reference
    on_cpu = legacy_roundtrip({"a": a, "v": a[2:4]}, map_location="cpu")
    assert on_cpu["v"].untyped_storage().data_ptr() == on_cpu["a"].untyped_storage().data_ptr()
    assert torch.equal(on_cpu["a"], a.cpu()) and torch.equal(expected["v"], on_cpu["v"])


def test_legacy_format_module_state_dict():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("pjrt")
    for kwargs in ({}, {"map_location": "cpu"}):
        state = legacy_roundtrip(model.state_dict(), **kwargs)
        for k, v in model.state_dict().items():
            assert state[k].device.type == ("cpu" if kwargs else "pjrt")
            assert torch.equal(state[k].cpu(), v.cpu())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fresh.load_state_dict(legacy_roundtrip(model.state_dict(), map_location="cpu"))
    x = torch.randn(2, 4)
    torch.testing.assert_close(fresh(x), model(x.to("pjrt")).cpu())
