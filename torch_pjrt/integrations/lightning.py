"""PyTorch Lightning on pjrt through Lightning's public registries.

Lightning keeps a registry of accelerators (`AcceleratorRegistry`) and of strategies
(`StrategyRegistry`) for out-of-tree devices. When `lightning` (or its other distribution,
`pytorch_lightning`: same code, other package name) is imported, we add:

- accelerator "pjrt": devices `pjrt:0..N-1` (torch.pjrt);
- strategy "single_pjrt": one pjrt device. Lightning 2.6 gives one device of an accelerator it
  does not know `SingleDeviceStrategy("cpu")`, so `Trainer(accelerator="pjrt")` alone would train
  on the CPU; the accelerator refuses that with an error naming this strategy;
- strategy "ddp_pjrt": Lightning's DDP without its CUDA-only stream; the process group backend
  is "pjrt" by itself (`torch.distributed.Backend.default_device_backend_map`).

Lightning's "auto" knows only TPU, MPS and CUDA and has no hook: a Trainer left on the CPU says
"pjrt available but not used" through a callback from Lightning's callback entry point.
docs/ecosystem.md (Lightning) gives the upstream change that makes all but the accelerator unnecessary.
"""
from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType
from typing import Any

import torch

from . import native_accelerators

NAME = "pjrt"
# Lightning's trainer package under its two distribution names (same code): `lightning` and `pytorch_lightning`.
PACKAGES = ("lightning.pytorch", "pytorch_lightning")
FABRIC = {"lightning.pytorch": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}  # each one's Fabric
SINGLE = "single_pjrt"  # strategy name: one pjrt device
DDP = "ddp_pjrt"  # strategy name: DDP over pjrt devices, one process each

# What `register` did, for `torch-pjrt doctor` and tests: package -> accelerator class.
registered: dict[str, type] = {}
_callback_classes: dict[str, type] = {}  # one class per package: Lightning keys callback state by class name


def parse_devices(devices: int | str | list[int]) -> list[int]:
    """Trainer's `devices` as pjrt indices: 3 -> [0, 1, 2], -1 or "auto" -> all, "0,2" or [0, 2] -> those."""
    count = torch.pjrt.device_count()
    if isinstance(devices, str):
        devices = devices.strip()
        if devices in ("auto", "-1"):
            return list(range(count))
        if "," in devices:
            devices = [int(d) for d in devices.split(",") if d.strip()]
        else:
            devices = int(devices)
    if isinstance(devices, int):
        indices = list(range(count)) if devices == -1 else list(range(devices))
    else:
        indices = [int(d) for d in devices]
    bad = [i for i in indices if not 0 <= i < count]
    if not indices or bad:
        raise ValueError(
            f"Trainer(accelerator='pjrt', devices={devices!r}): this process sees {count} pjrt device(s) "
            f"(pjrt:0..{count - 1}). For several devices on the CPU platform set TORCH_PJRT_CPU_DEVICES=N "
            "before starting Python."
        )
    return indices


def accelerator_class(pl: ModuleType) -> type:
    """The pjrt accelerator for a Lightning package (`lightning.pytorch` or `pytorch_lightning`)."""

    class PJRTAccelerator(pl.accelerators.Accelerator):
        """Lightning accelerator for torch-pjrt devices (`pjrt:i`, one per PJRT device)."""

        def setup_device(self, device: torch.device) -> None:
            if device.type != NAME:
                # Lightning 2.6 gives an accelerator it does not know SingleDeviceStrategy("cpu") for one
                # device (AcceleratorConnector._choose_strategy): without this the model would quietly
                # train on the CPU.
                raise ValueError(
                    f"The pjrt accelerator was handed device {device}: Lightning picks a CPU strategy for one "
                    f"device of an accelerator it does not know. Pass accelerator='pjrt', strategy='{SINGLE}' "
                    f"(one device) or, to Trainer, accelerator='pjrt', devices=N, strategy='{DDP}' (several)."
                )
            torch.pjrt.set_device(device)

        def setup(self, trainer: Any) -> None:
            # Called first in Strategy.setup, before the model moves or is wrapped, so a choice Lightning made
            # for "a device that is not CPU or MPS, hence CUDA" is caught here.
            if type(trainer.strategy) is pl.strategies.DDPStrategy:
                raise ValueError(
                    f"Trainer(accelerator='pjrt', strategy='ddp'): Lightning's DDPStrategy builds DDP inside a "
                    f"torch.cuda.stream for every non-CPU device. Pass strategy='{DDP}' (the same DDP, on the "
                    "'pjrt' process group)."
                )
            autocast_on_pjrt(trainer.precision_plugin, pl.plugins.MixedPrecision)

        def get_device_stats(self, device: torch.device | str | int) -> dict[str, Any]:
            return torch.pjrt.memory_stats(device)

        def teardown(self) -> None:
            pass  # storages free their buffers when collected: nothing is cached per Trainer

        @staticmethod
        def parse_devices(devices: int | str | list[int]) -> list[int]:
            return parse_devices(devices)

        @staticmethod
        def get_parallel_devices(devices: list[int]) -> list[torch.device]:
            return [torch.device(NAME, i) for i in devices]

        @staticmethod
        def auto_device_count() -> int:
            return torch.pjrt.device_count()

        @staticmethod
        def is_available() -> bool:
            return torch.pjrt.device_count() > 0

        @staticmethod
        def name() -> str:
            return NAME

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register(cls.name(), cls, description=cls.__name__, override=True)

    return PJRTAccelerator


def autocast_on_pjrt(precision: Any, mixed_precision: type) -> None:
    """Point the mixed precision plugin Lightning built for the pjrt accelerator at pjrt.

    Lightning names "cuda" for every accelerator but CPU and MPS; a CUDA autocast does nothing to pjrt
    tensors, so the run would quietly stay float32. bf16 needs no grad scaler: the device is the whole fix."""
    if not isinstance(precision, mixed_precision) or precision.device != "cuda":
        return
    if precision.precision != "bf16-mixed":
        raise ValueError(
            f"accelerator='pjrt', precision={precision.precision!r}: Lightning builds a CUDA autocast and grad "
            "scaler for it. Pass plugins=[MixedPrecision('16-mixed', 'pjrt', scaler=torch.amp.GradScaler('pjrt'))] "
            "instead of precision=, or use 'bf16-mixed'."
        )
    precision.device = NAME


def single_device_strategy_class(pl: ModuleType, accelerator: type) -> type:
    """`strategy="single_pjrt"`: one pjrt device (`pjrt:0` unless given)."""

    class SinglePJRTStrategy(pl.strategies.SingleDeviceStrategy):
        strategy_name = SINGLE

        def __init__(self, device: torch.device | str | int = 0, **kwargs: Any) -> None:
            super().__init__(device=torch.device(NAME, device) if isinstance(device, int) else device, **kwargs)

        def setup_environment(self) -> None:
            # A strategy from the registry gets Lightning's "auto" accelerator (the CPU) unless one is named.
            if not isinstance(self.accelerator, accelerator):
                raise ValueError(f"strategy='{SINGLE}' needs accelerator='pjrt': Trainer(accelerator='pjrt', "
                                 f"strategy='{SINGLE}').")
            super().setup_environment()

        @classmethod
        def register_strategies(cls, strategy_registry: Any) -> None:
            strategy_registry.register(cls.strategy_name, cls, description=cls.__name__, override=True)

    return SinglePJRTStrategy


def fabric_single_device_strategy_class(fabric: ModuleType, accelerator: type) -> type:
    """Fabric's `strategy="single_pjrt"`. Fabric has no accelerator hook that sees the precision plugin,
    so the strategy points bf16 autocast at pjrt."""

    class SinglePJRTStrategy(fabric.strategies.SingleDeviceStrategy):
        def __init__(self, device: torch.device | str | int = 0, **kwargs: Any) -> None:
            super().__init__(device=torch.device(NAME, device) if isinstance(device, int) else device, **kwargs)

        def _check(self) -> None:
            if not isinstance(self.accelerator, accelerator):
                raise ValueError(f"strategy='{SINGLE}' needs accelerator='pjrt': Fabric(accelerator='pjrt', "
                                 f"strategy='{SINGLE}').")
            autocast_on_pjrt(self.precision, fabric.plugins.MixedPrecision)

        def setup_environment(self) -> None:
            self._check()
            super().setup_environment()

        def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
            # Fabric runs setup_environment only under fabric.launch(), which one device does not need.
            self._check()
            return super().setup_module(module)

        @classmethod
        def register_strategies(cls, strategy_registry: Any) -> None:
            strategy_registry.register(SINGLE, cls, description=cls.__name__, override=True)

    return SinglePJRTStrategy


def ddp_strategy_class(pl: ModuleType) -> type:
    """`strategy="ddp_pjrt"`: Lightning's DDP on the "pjrt" process group."""

    class DDPPJRTStrategy(pl.strategies.DDPStrategy):
        strategy_name = DDP

        def determine_ddp_device_ids(self) -> list[int] | None:
            # With device ids DDPStrategy builds DDP inside torch.cuda.stream(...), which needs CUDA. A module on
            # one device needs none: DDP takes its device from the parameters.
            return None

        @classmethod
        def register_strategies(cls, strategy_registry: Any) -> None:
            strategy_registry.register(cls.strategy_name, cls, description=cls.__name__, override=True)

    return DDPPJRTStrategy


def register(package: str) -> None:
    """Add "pjrt" to the accelerator registry and "single_pjrt", "ddp_pjrt" to the strategy registry
    of one Lightning package; run when that package is imported."""
    if package in registered:
        return
    pl = sys.modules[package]
    accelerator = accelerator_class(pl)
    accelerator.register_accelerators(pl.accelerators.AcceleratorRegistry)
    single_device_strategy_class(pl, accelerator).register_strategies(pl.strategies.StrategyRegistry)
    ddp_strategy_class(pl).register_strategies(pl.strategies.StrategyRegistry)
    # Fabric (same accelerator interface, its own registries): one device; its DDP has no public hook.
    fabric = sys.modules[FABRIC[package]]
    accelerator.register_accelerators(fabric.accelerators.ACCELERATOR_REGISTRY)
    fabric_single_device_strategy_class(fabric, accelerator).register_strategies(fabric.strategies.STRATEGY_REGISTRY)
    registered[package] = accelerator


def callback_class(pl: ModuleType) -> type:
    """The "pjrt available but not used" callback for a Lightning package."""
    if pl.__name__ in _callback_classes:
        return _callback_classes[pl.__name__]

    class PJRTUnused(pl.callbacks.Callback):
        """Says once that Trainer runs on the CPU while pjrt is this machine's accelerator, as Lightning
        itself says "GPU available but not used": its "auto" choice knows only TPU, MPS and CUDA."""

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if (isinstance(trainer.accelerator, pl.accelerators.CPUAccelerator) and torch.pjrt.device_count() > 0
                    and not native_accelerators()):
                pl.utilities.rank_zero_warn(
                    f"pjrt available but not used. You can set it by doing `Trainer(accelerator='pjrt', "
                    f"strategy='{SINGLE}')`, or `Trainer(accelerator='pjrt', devices=N, strategy='{DDP}')`.",
                    category=importlib.import_module(pl.__name__ + ".utilities.warnings").PossibleUserWarning,
                )

    _callback_classes[pl.__name__] = PJRTUnused
    return PJRTUnused


def _callbacks(package: str) -> list[Any]:
    """Entry point factory (group `<package>.callbacks_factory`): Lightning calls it for every Trainer."""
    if not torch.pjrt.is_available():
        return []
    register(package)  # the entry point may load before our import hook has run: same registries either way
    return [callback_class(sys.modules[package])()]


def lightning_callbacks() -> list[Any]:
    """Entry point of group `lightning.pytorch.callbacks_factory`."""
    return _callbacks("lightning.pytorch")


def pytorch_lightning_callbacks() -> list[Any]:
    """Entry point of group `pytorch_lightning.callbacks_factory`."""
    return _callbacks("pytorch_lightning")


def _register_quietly(package: str) -> None:
    """`register`, run inside the user's `import lightning`: a failure here must not break that import."""
    try:
        register(package)
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"torch-pjrt: Trainer(accelerator='pjrt') is unavailable: registering with {package} "
                      f"failed: {e!r}")


def install() -> None:
    """Register with each Lightning package once its trainer is imported (now, if it already is).

    The hook is on `<package>.trainer`, not the package: `import pytorch_lightning` imports torch (and so
    us) from inside its own `__init__`, when the package is in sys.modules but has no submodules yet. The
    trainer module comes later and imports the accelerators, strategies, plugins and callbacks we use."""
    from torch_pjrt import _after_import  # the package itself (layer 6), defined before setup runs

    for package in PACKAGES:
        _after_import(package + ".trainer", lambda package=package: _register_quietly(package))
