"""torch-pjrt: a native PyTorch device ("pjrt") for every accelerator PJRT reaches.

`import torch` loads this package through the `torch.backends` entry point; after that,
tensors and modules move with `.to("pjrt")`. Set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to
turn autoloading off; `import torch_pjrt` then sets the device up.
"""
from __future__ import annotations

# No module-level `import torch`: when `import torch_pjrt` comes first, importing torch
# runs our entry point (_autoload) while this module is still initialising, so
# everything it needs must already be defined.

from .version import __version__  # noqa: E402,F401
__all__ = ["fallback_ops", "decomposed_ops", "registered_ops", "compile_stats", "export", "eager_stats",
           "reset_eager_stats", "eager_mode", "set_eager_mode"]

_ready = False
_other_accelerator_at_setup: str | None = None


def _setup() -> None:
    """Register "pjrt" with torch: runtime, device module, kernels. Idempotent."""
    global _ready
    import torch  # first: it may run _autoload, which then does the whole setup

    if _ready:
        return
    from .runtime import build as _runtime, platform

    rt = _runtime.load()
    devices = platform.devices()
    from .runtime import compilation_cache

    compilation_cache.enable()  # before the first executable: eager ops persist too
    if rt.device_count() == 0:  # once per process, even if a later step of a previous attempt failed
        from .runtime import storage

        rt.init(len(devices), [platform.memory_capacity(i) for i in range(len(devices))], storage.synchronize)
    from . import dtypes

    rt.set_unsupported_dtype_handler(dtypes.raise_unsupported_dtype)  # empty() of a dtype JAX cannot hold
    global _other_accelerator_at_setup
    _other_accelerator_at_setup = other = other_accelerator()
    if other is not None:
        import warnings

        warnings.warn(f"torch-pjrt: pjrt is now torch's accelerator in this process, in place of {other} "
                      f"(torch takes a registered PrivateUse1 backend first). {other} tensors still work, but "
                      f"torch's autograd cannot run backward through them here: train on {other} in a process "
                      f"that does not import torch_pjrt.", stacklevel=2)
    torch.utils.rename_privateuse1_backend("pjrt")
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    from . import device as device_module

    device_module.default_generators = tuple(rt.default_generator(i) for i in range(len(devices)))
    torch._register_device_module("pjrt", device_module)

    from . import ops  # noqa: F401  (registers the lowerings)
    from .eager import fallback, kernels as eager, linalg_checks, nested, sparse, transfer, view_kernels

    eager.register(transfer.kernels() | view_kernels.kernels() | sparse.kernels() | linalg_checks.kernels())
    from .runtime import fused

    # the end of an optimizer step ends a fused region, so a training step is one region
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda *_: fused.flush("optimizer step"))
    transfer.keep_math_bits()
    transfer.legacy_serialization_through_cpu()  # torch.save(..., _use_new_zipfile_serialization=False)
    transfer.print_through_host()  # repr/print: one host copy, no executables
    global _fallback_library  # registrations live as long as their Library object
    _fallback_library = torch.library.Library("_", "IMPL")
    _fallback_library.fallback(fallback.run, "PrivateUse1")
    for key in fallback.SPARSE_KEYS:  # sparse layouts and quantized dtypes: one clear error (fallback.py)
        _fallback_library.fallback(fallback.refuse_sparse, key)
    sparse.register()  # COO on pjrt: what sparse gradients and their optimizers need (eager/sparse.py)
    nested.register()  # nested tensors of nn.TransformerEncoder's fast path (eager/nested.py)
    _fallback_library.fallback(fallback.refuse_quantized, fallback.QUANTIZED_KEY)
    from . import autocast

    autocast.register()
    _after_import("torch._dynamo", _load_compiler)
    torch.utils.dlpack.to_dlpack = transfer.refuse_dlpack(torch.utils.dlpack.to_dlpack)
    torch.Tensor.__dlpack__ = transfer.refuse_dlpack(torch.Tensor.__dlpack__)
    from . import distributed

    distributed.register()
    from .kernels import hooks

    hooks.install()  # custom kernels behind aten ops: SDPA -> flash attention, _grouped_mm (kernels/hooks.py)
    from .runtime import fork_safety

    fork_safety.install()  # DataLoader workers: no JAX fork warning; other forks: one explanation
    from . import integrations

    integrations.install()  # transformers, accelerate, Lightning find pjrt when imported (docs/ecosystem.md)
    from .integrations import lightning

    lightning.install()  # accelerator "pjrt", strategies "single_pjrt", "ddp_pjrt" in Lightning's registries
    _ready = True


def _load_compiler() -> None:
    """Registers backend "pjrt" and keeps Dynamo from tracing our eager kernels' frames."""
    from . import compiler  # noqa: F401


def _after_import(name: str, callback) -> None:
    """Run `callback` once module `name` is imported (now, if it already is): importing
    torch._dynamo ourselves would cost seconds at startup."""
    import importlib.abc
    import importlib.util
    import sys

    if name in sys.modules:
        callback()
        return

    class Finder(importlib.abc.MetaPathFinder):
        # Libraries probe with importlib.util.find_spec(name) without importing (accelerate,
        # transformers' is_*_available): the hook stays until the module really executes.
        searching = False

        def find_spec(self, fullname, path, target=None):
            if fullname != name or self.searching:
                return None
            self.searching = True  # the real spec, from the finders after this one
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                self.searching = False
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                # a loader may serve other modules too (a zip's): only this one's import counts
                if module.__name__ == name and self in sys.meta_path:
                    sys.meta_path.remove(self)
                    callback()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())


def _autoload() -> None:
    """Entry point called by `import torch` (group torch.backends).

    A failure here must not break `import torch` for everything else: warn and leave
    "pjrt" unregistered; `import torch_pjrt` raises the full error.

    Where torch already has an accelerator with devices (CUDA, XPU, MPS), autoload stands
    aside: torch keeps one accelerator per process and takes a registered PrivateUse1
    backend first, so pjrt would replace `torch.accelerator` for every script on the machine,
    and torch's autograd cannot then run backward through CUDA tensors (torch 2.11 asserts in
    engine.cpp, seen on an H200). `import torch_pjrt` registers pjrt there all the same.
    """
    if other_accelerator() is not None:
        return
    try:
        _setup()
    except Exception as e:  # noqa: BLE001
        import warnings

        warnings.warn(f"torch-pjrt: the pjrt device is unavailable: {e}\nRun `torch-pjrt doctor` for details.")


def other_accelerator() -> str | None:
    """The accelerator torch had before pjrt registered ("cuda", "xpu", "mps"), where it has
    devices; None on a CPU-only torch or machine."""
    if _ready:  # torch's accelerator is pjrt now: the answer is the one setup saw
        return _other_accelerator_at_setup
    import torch

    try:
        device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    except Exception:  # noqa: BLE001  (a broken driver: no other accelerator to stand aside for)
        return None
    # pjrt itself where an earlier setup failed after registering it
    return device.type if device is not None and device.type != "pjrt" else None


def fallback_ops() -> dict[str, int]:
    """{aten op: calls} that ran on the CPU because the op table lacks a pjrt lowering."""
    from .eager.fallback import fallback_ops as counts

    return counts()


def decomposed_ops() -> dict[str, int]:
    """{aten op: calls} that ran as torch's decomposition into table ops."""
    from .eager.fallback import decomposed_ops as counts

    return counts()


def compile_stats() -> dict:
    """Counters of torch.compile(backend="pjrt"): graphs, executables, cache hits, recompiles, seconds."""
    from .compiler import compile_stats as stats

    return stats()


def export(model, example_args, example_kwargs=None, **kwargs) -> str:
    """StableHLO text of `model` (through torch.export and the op table), for deployment outside Python."""
    from .compiler import export as export_stablehlo

    return export_stablehlo(model, example_args, example_kwargs, **kwargs)


def eager_stats() -> dict:
    """What eager execution compiled: executables per op, compile seconds, cache hits (eager/stats.py)."""
    from .eager.stats import eager_stats as snapshot

    return snapshot()


def eager_mode() -> str:
    """"fused" (the default: eager calls are recorded and run as regions, runtime/fused.py) or "op"
    (one executable per call). TORCH_PJRT_EAGER sets it at start; deterministic mode runs op by op."""
    from .runtime import fused

    return "fused" if fused.enabled else "op"


def set_eager_mode(mode: str) -> None:
    """Switch eager execution to "fused" or "op" from now on; recorded work runs first."""
    if mode not in ("fused", "op"):
        raise ValueError(f"eager mode must be 'fused' or 'op', not {mode!r}")
    from .runtime import fused

    fused.set_enabled(mode == "fused")


def reset_eager_stats() -> None:
    from .eager.stats import reset_eager_stats as reset

    reset()


def registered_ops() -> list[str]:
    """Names of the aten overloads with a pjrt kernel."""
    from .eager.kernels import registered_ops as names

    return names()


def _imported_by_torch() -> bool:
    """True while `import torch` itself is loading us through the entry point."""
    import sys

    spec = getattr(sys.modules.get("torch"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _running_the_command() -> bool:
    """True while the `torch-pjrt` command imports us (its console script, or
    `python -m torch_pjrt.cli`): cli.py sets the device up for the subcommands that use it,
    so `--help` and the static `audit` never import torch."""
    import re
    import sys

    argv = getattr(sys, "argv", None) or [""]
    if re.search(r"(^|[/\\])torch-pjrt(-script\.pyw?|\.exe)?$", argv[0]):
        return True
    # `python -m`: runpy imports the package while sys.argv[0] is "-m"
    interpreter_argv = getattr(sys, "orig_argv", [])
    if argv[0] != "-m" or "-m" not in interpreter_argv[1:]:
        return False
    module = interpreter_argv[interpreter_argv.index("-m", 1) + 1:][:1]
    return module == ["torch_pjrt.cli"]


if not _imported_by_torch() and not _running_the_command():  # autoload calls _autoload(), which must not raise
    _setup()
