"""PyTorch Lightning on pjrt (torch_pjrt/integrations/lightning.py), against the real package:
a small regression trained with the pjrt accelerator gives the CPU run's losses and weights,
on one device and with DDP on 2 processes (torchrun) over the "pjrt" process group.

Run as a script (`python tests/test_lightning.py ddp OUT`) this file is the DDP worker.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
STEPS = 4


def make_module(pl):
    class Regression(pl.LightningModule):
        """An MLP on fixed random data; records each step's loss."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            self.losses: list[torch.Tensor] = []

        def training_step(self, batch, index):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.detach())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    return Regression()


def fit(pl, **trainer_kwargs) -> tuple[list[float], dict[str, torch.Tensor], str]:
    """(losses, final weights on the CPU, device the batches ran on) of STEPS steps."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    module = make_module(pl)
    trainer = pl.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, **trainer_kwargs)
    trainer.fit(module, data)
    weights = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    return [loss.item() for loss in module.losses], weights, str(module.losses[0].device)


def assert_same_run(a, b) -> None:
    torch.testing.assert_close(torch.tensor(a[0]), torch.tensor(b[0]), rtol=1e-5, atol=1e-6)
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def pl():
    pytest.importorskip("lightning")
    import lightning.pytorch

    return lightning.pytorch


@pytest.fixture(scope="module")
def cpu_run(pl):
    return fit(pl, accelerator="cpu")


def test_pjrt_accelerator_is_registered_on_import(pl):
    assert "pjrt" in pl.accelerators.AcceleratorRegistry.available_accelerators()
    assert {"single_pjrt", "ddp_pjrt"} <= set(pl.strategies.StrategyRegistry.available_strategies())
    accelerator = pl.accelerators.AcceleratorRegistry.get("pjrt")
    devices = accelerator.get_parallel_devices(accelerator.parse_devices("0,1"))
    assert devices == [torch.device("pjrt", 0), torch.device("pjrt", 1)]
    assert "allocated_bytes.all.current" in accelerator.get_device_stats(torch.device("pjrt", 0))  # DeviceStatsMonitor
    with pytest.raises(ValueError, match="TORCH_PJRT_CPU_DEVICES"):
        accelerator.parse_devices(torch.pjrt.device_count() + 1)


def test_registered_whichever_is_imported_first_and_auto_says_pjrt_is_unused(tmp_path):
    """A fresh process that never imports torch_pjrt. `import pytorch_lightning` imports torch, and so
    torch-pjrt, from inside its own __init__. `Trainer()` ("auto") stays on the CPU and says so through the
    callback entry point, here declared by a distribution on PYTHONPATH as pyproject.toml declares it."""
    pytest.importorskip("pytorch_lightning")
    dist_info = tmp_path / "torch_pjrt_entry_points-0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-pjrt-entry-points\nVersion: 0\n")
    (dist_info / "entry_points.txt").write_text(
        "[lightning.pytorch.callbacks_factory]\npjrt = torch_pjrt.integrations.lightning:lightning_callbacks\n")
    code = f"""
import warnings, pytorch_lightning, lightning.pytorch as pl, torch, sys
sys.path.insert(0, {str(REPO)!r})
from tests.test_lightning import fit
print([('pjrt' in m.accelerators.AcceleratorRegistry, 'ddp_pjrt' in m.strategies.StrategyRegistry)
       for m in (pytorch_lightning, pl)], hasattr(torch, 'pjrt'))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    device = fit(pl)[2]
print(device, any("pjrt available but not used" in str(w.message) for w in caught))
"""
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert done.stdout.strip().splitlines()[-2:] == ["[(True, True), (True, True)] True", "cpu True"], \
        done.stdout[-1000:] + done.stderr[-3000:]
    assert "torch-pjrt:" not in done.stderr, done.stderr[-3000:]


def test_one_device_matches_cpu(pl, cpu_run):
    run = fit(pl, accelerator="pjrt", devices=1, strategy="single_pjrt")
    assert run[2] == "pjrt:0"
    assert_same_run(run, cpu_run)


def test_pytorch_lightning_package_too(cpu_run):
    """The same code shipped as `pytorch_lightning`: its own registries, the same run."""
    pytorch_lightning = pytest.importorskip("pytorch_lightning")
    assert "pjrt" in pytorch_lightning.accelerators.AcceleratorRegistry.available_accelerators()
    assert_same_run(fit(pytorch_lightning, accelerator="pjrt", devices=1, strategy="single_pjrt"), cpu_run)


def fabric_run(**fabric_kwargs) -> tuple[list[float], str]:
    """STEPS steps of the same regression in a hand-written Fabric loop: (losses, device of the batches)."""
    import lightning

    fabric = lightning.Fabric(**fabric_kwargs)
    module = make_module(lightning.pytorch)
    optimizer = module.configure_optimizers()
    net, optimizer = fabric.setup(module.net, optimizer)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
    data = fabric.setup_dataloaders(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8))
    losses = []
    for _, (xb, yb) in zip(range(STEPS), data):
        loss = torch.nn.functional.mse_loss(net(xb), yb)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, str(xb.device)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fabric_one_device_matches_cpu(pl, precision):
    run = fabric_run(accelerator="pjrt", devices=1, strategy="single_pjrt", precision=precision)
    cpu = fabric_run(accelerator="cpu", devices=1, precision=precision)
    assert run[1] == "pjrt:0"
    torch.testing.assert_close(torch.tensor(run[0]), torch.tensor(cpu[0]), rtol=1e-5, atol=1e-6)


def test_accelerator_alone_names_the_strategy(pl):
    """Lightning 2.6 gives an accelerator it does not know a CPU strategy for one device: an error, not CPU training."""
    with pytest.raises(ValueError, match="strategy='single_pjrt'"):
        fit(pl, accelerator="pjrt", devices=1)


def test_single_pjrt_without_accelerator_says_so(pl):
    with pytest.raises(ValueError, match="needs accelerator='pjrt'"):
        fit(pl, strategy="single_pjrt", devices=1)


def test_bf16_mixed_autocasts_on_pjrt(pl, cpu_run):
    """precision="bf16-mixed": Lightning builds a CUDA autocast for an accelerator it does not know; the
    accelerator points it at pjrt, so the run matches the CPU's bf16 autocast (and not float32)."""
    from lightning.pytorch.plugins import MixedPrecision

    run = fit(pl, accelerator="pjrt", devices=1, strategy="single_pjrt", precision="bf16-mixed")
    cpu = fit(pl, accelerator="cpu", devices=1, plugins=[MixedPrecision("bf16-mixed", "cpu")])
    torch.testing.assert_close(torch.tensor(run[0]), torch.tensor(cpu[0]), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(torch.tensor(run[0]), torch.tensor(cpu_run[0]), rtol=1e-4, atol=0)


def test_fp16_mixed_names_the_plugin(pl):
    """Lightning would build a CUDA grad scaler for it."""
    with pytest.raises(ValueError, match="GradScaler"):
        fit(pl, accelerator="pjrt", devices=1, strategy="single_pjrt", precision="16-mixed")


def test_callbacks_entry_point_is_declared():
    from importlib.metadata import entry_points

    names = [e.value for e in entry_points(group="lightning.pytorch.callbacks_factory")]
    if not names:
        pytest.skip("entry point not installed yet: add it to pyproject.toml and reinstall (pip install -e .)")
    assert "torch_pjrt.integrations.lightning:lightning_callbacks" in names


def test_ddp_two_processes_matches_gloo(tmp_path):
    """torchrun, 2 processes, Trainer(accelerator="pjrt", devices=2, strategy="ddp_pjrt") on the "pjrt" process group
    against the same run on the CPU with gloo. The workers never import torch_pjrt: `import lightning` finds pjrt."""
    pytest.importorskip("lightning")
    env = dict(os.environ, TORCH_PJRT_PLATFORM="cpu", TORCH_PJRT_CPU_DEVICES="2", PYTHONPATH=str(REPO),
               OMP_NUM_THREADS="1", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false")
    from tests.distributed.launch import torchrun

    for rank, value in enumerate(torchrun([str(Path(__file__)), "ddp"], 2, tmp_path, env)):
        assert value["backend"] == "pjrt" and value["device"] == f"pjrt:{rank}"
        assert value["cpu_backend"] == "gloo"
        assert "strategy='ddp_pjrt'" in value["plain_ddp_error"]
        torch.testing.assert_close(torch.tensor(value["pjrt"]), torch.tensor(value["cpu"]), rtol=1e-5, atol=1e-6)


def ddp_worker(out: str) -> None:
    """One torchrun worker: the DDP run on pjrt, then on the CPU (gloo); losses and weights to `out`.

    The process group is initialised once per backend on fresh store keys: torch names every default
    group "0", so a group re-created on the same store can read the previous group's addresses."""
    from datetime import timedelta

    import lightning.pytorch as pl

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result = {}
    losses, weights, result["device"] = fit(pl, accelerator="pjrt", devices=2, strategy="ddp_pjrt")
    result["backend"] = torch.distributed.get_backend()  # Lightning's choice for pjrt devices
    result["pjrt"] = losses + [v for w in weights.values() for v in w.flatten().tolist()]
    try:  # Lightning's own DDPStrategy (what strategy="ddp" and "auto" with 2 devices give): a clear error
        fit(pl, accelerator="pjrt", devices=2, strategy="ddp")  # reuses the group: Lightning skips init
    except ValueError as e:
        result["plain_ddp_error"] = str(e)
    torch.distributed.destroy_process_group()
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                       timeout=timedelta(seconds=60))  # torchrun's agent store
    torch.distributed.init_process_group("gloo", store=torch.distributed.PrefixStore("cpu-run/", store),
                                         rank=rank, world_size=world)
    losses, weights, _ = fit(pl, accelerator="cpu", devices=2, strategy="ddp")
    result["cpu_backend"] = torch.distributed.get_backend()
    result["cpu"] = losses + [v for w in weights.values() for v in w.flatten().tolist()]
    Path(out.format(rank=rank)).write_text(json.dumps(result))


if __name__ == "__main__" and sys.argv[1] == "ddp":
    ddp_worker(sys.argv[2])
