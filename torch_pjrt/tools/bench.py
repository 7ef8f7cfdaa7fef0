"""`torch-pjrt bench`: the same workloads on pjrt and its peers, side by side.

A row is one (workload, mode, target): a workload (a built-in model or the user's
`module:function`) in one mode ("train": forward, backward, AdamW step; "infer": forward
under no_grad in eval mode) on one target:

    pjrt           pjrt device, eager
    pjrt-compile   pjrt device, torch.compile(backend="pjrt")
    cpu            CPU tensors, eager
    inductor       CPU tensors, torch.compile() (inductor, the default backend)
    cuda           CUDA eager              } only when torch.cuda.is_available()
    cuda-inductor  CUDA, torch.compile()   }

Every row runs the same model (weights drawn on the CPU from one seed, then moved) on the
same batch (built once on the CPU, moved once: the benchmark measures compute, not data
loading). A row times `warmup` untimed-for-statistics steps, the first of which compiles,
then `steps` timed steps, each ended by a device synchronize. A row that fails (a compile
error, a missing op) is recorded with its error and the run goes on.

`run_bench()` returns a JSON-ready dict; `render()` and `plot()` present it (the JSON is written by
`torch_pjrt.tools.output.write_json`, the convention of every `--json`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib
import importlib.util
import math
import os
import platform as _platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

SCHEMA_VERSION = 1

TARGETS = ("pjrt", "pjrt-compile", "cpu", "inductor", "cuda", "cuda-inductor")
DEFAULT_TARGETS = ("pjrt", "pjrt-compile", "cpu", "inductor")  # + cuda ones when available
MODES = ("train", "infer")
WORKLOADS = ("mlp", "cnn", "gpt", "hf")

# $/hour, illustrative on-demand prices; give your own with --price TARGET_OR_DEVICE=USD.
# "pjrt" is priced by the PJRT platform it runs on (a pjrt run on the CPU costs the CPU).
DEFAULT_PRICES = {
    "cpu": 0.10,   # a small general-purpose cloud VM (2-4 vCPUs)
    "cuda": 2.50,  # one data-centre NVIDIA GPU
    "gpu": 2.50,   # pjrt on a PJRT GPU platform (cuda/rocm)
    "tpu": 1.20,   # one TPU chip
}

# every row has exactly these keys (None where a value does not apply or the row failed)
ROW_FIELDS = (
    "workload", "mode", "target", "device", "status", "error",
    "params", "batch_size", "samples_per_step", "tokens_per_step",
    "warmup_steps", "steps", "first_call_s", "compile_s",
    "latency_p50_ms", "latency_p95_ms", "latency_mean_ms", "latency_min_ms",
    "samples_per_s", "tokens_per_s",
    "peak_memory_bytes", "memory_method",
    "price_usd_per_hour", "usd_per_million_tokens", "usd_per_million_samples",
    "graphs", "graph_breaks", "fallback_ops", "wall_s",
)


# ------------------------------------------------------------------------------------
# workloads
# ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Workload:
    """A model factory and its batch: `build()` -> (model on the CPU, tuple of CPU inputs).

    `loss(output)` turns the model's output into the scalar that training backpropagates.
    `tokens_per_step`: tokens in one batch, None for workloads without tokens.
    """
    name: str
    build: Callable[[], tuple[Any, tuple]]
    loss: Callable[[Any], Any]
    batch_size: int
    tokens_per_step: int | None = None
    description: str = ""


def _seed(seed: int = 0):
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


SIZES = {
    # --quick: small shapes (compile time, not size, dominates a quick run); the default
    # sizes are the DESIGN.md reference shapes (gpt: 4 layers, d=128, T=64, batch 8).
    "quick": dict(mlp=dict(n_in=32, hidden=128, batch=64),
                  cnn=dict(batch=16),
                  gpt=dict(n_layer=2, n_head=2, n_embd=64, block_size=32, batch=8),
                  hf=dict(n_layer=1, n_head=2, n_embd=64, block_size=32, batch=4)),
    "full": dict(mlp=dict(n_in=256, hidden=1024, batch=256),
                 cnn=dict(batch=64),
                 gpt=dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=8),
                 hf=dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=8)),
}
STEPS = {"quick": dict(warmup=2, steps=8), "full": dict(warmup=3, steps=30)}
# --quick runs two workloads: cold compiles (inductor's C++ builds above all) of every
# built-in in both modes would take an estimated 4-5 minutes on a loaded 2-core CPU.
QUICK_WORKLOADS = ("mlp", "gpt")


def builtin_workload(name: str, size: str) -> Workload:
    """One of WORKLOADS; raises `Unavailable` when its library is missing (hf)."""
    from torch_pjrt.tools import demo_models as dm

    s = SIZES[size][name]
    if name == "mlp":
        def build():
            gen = _seed()
            x, y = dm.blobs(gen, s["batch"], n_in=s["n_in"], n_out=10)
            return _Classifier(dm.MLP(n_in=s["n_in"], hidden=s["hidden"], n_out=10)), (x, y)
        return Workload("mlp", build, _loss_from_wrapper, s["batch"], None,
                        f"MLP {s['n_in']}-{s['hidden']}-{s['hidden']}-10, batch {s['batch']}")
    if name == "cnn":
        def build():
            gen = _seed()
            x, y = dm.shapes(gen, s["batch"])
            return _Classifier(dm.CNN(n_classes=4)), (x, y)
        return Workload("cnn", build, _loss_from_wrapper, s["batch"], None,
                        f"LeNet-sized CNN on 1x16x16 images, batch {s['batch']}")
    if name == "gpt":
        def build():
            data = dm.CharData(dm.load_text())
            gen = _seed()
            cfg = dm.GPTConfig(vocab_size=data.vocab_size, block_size=s["block_size"], n_layer=s["n_layer"],
                               n_head=s["n_head"], n_embd=s["n_embd"])
            return _CharGPT(dm.GPT(cfg)), data.batch(gen, s["batch"], s["block_size"])
        return Workload("gpt", build, _loss_from_wrapper, s["batch"], s["batch"] * s["block_size"],
                        f"char GPT {s['n_layer']} layers, d={s['n_embd']}, context {s['block_size']}, "
                        f"batch {s['batch']}")
    if name == "hf":
        reason = _hf_missing()
        if reason:
            raise Unavailable(reason)

        def build():
            import transformers

            _seed()
            cfg = transformers.GPT2Config(vocab_size=512, n_positions=s["block_size"], n_embd=s["n_embd"],
                                          n_layer=s["n_layer"], n_head=s["n_head"], bos_token_id=0,
                                          eos_token_id=0)
            model = transformers.GPT2LMHeadModel(cfg)  # randomly initialised: no download
            model.loss_type = "ForCausalLM"  # what transformers falls back to, minus its warning
            ids = torch.randint(512, (s["batch"], s["block_size"]), generator=torch.Generator().manual_seed(0))
            return _CausalLM(model), (ids,)
        return Workload("hf", build, _loss_from_wrapper, s["batch"], s["batch"] * s["block_size"],
                        f"transformers GPT2LMHeadModel {s['n_layer']} layers, d={s['n_embd']}, "
                        f"context {s['block_size']}, batch {s['batch']}")
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")


def _hf_missing() -> str | None:
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install transformers)"
    return None


class Unavailable(Exception):
    """A workload or target that cannot run here (a missing library or device)."""


# The built-in models are wrapped so that one call does what each mode needs: the loss in
# train mode, the model's prediction in eval mode (no loss computed).
class _Wrapper(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model


class _Classifier(_Wrapper):
    def forward(self, x, labels):
        out = self.model(x)
        return torch.nn.functional.cross_entropy(out, labels) if self.training else out


class _CharGPT(_Wrapper):
    def forward(self, idx, targets):
        return self.model(idx, targets)[1] if self.training else self.model(idx)


class _CausalLM(_Wrapper):
    def forward(self, ids):
        if self.training:
            return self.model(input_ids=ids, labels=ids).loss
        return self.model(input_ids=ids).logits


def _loss_from_wrapper(out):
    return out


def user_workload(spec: str) -> Workload:
    """`module:function` (or `path/to/file.py:function`); the function returns
    (model, example batch), the batch a tensor or a tuple of tensors passed as model(*batch)."""
    module_name, sep, function_name = spec.rpartition(":")
    if not sep or not module_name or not function_name:
        raise ValueError(f"--model {spec!r}: expected module:function (or path/to/file.py:function)")
    if module_name.endswith(".py") or os.sep in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"--model {spec!r}: no file {path}")
        mod_spec = importlib.util.spec_from_file_location(f"_bench_user_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"--model {spec!r}: {module_name} has no function {function_name}")

    def build():
        torch.manual_seed(0)
        result = function()
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(f"{spec} must return (model, example batch), got {type(result).__name__}")
        model, batch = result
        inputs = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
        return model, inputs

    # Build once here (on the CPU) to learn the batch size and whether it has tokens.
    _, inputs = build()
    first = next((t for t in inputs if isinstance(t, torch.Tensor)), None)
    batch = int(first.shape[0]) if first is not None and first.dim() > 0 else 1
    tokens = int(first.numel()) if (first is not None and first.dim() == 2
                                    and not first.dtype.is_floating_point and not first.dtype.is_complex) else None
    return Workload(spec, build, user_loss, batch, tokens, f"user model {spec}, batch {batch}")


def user_loss(out):
    """The scalar to backpropagate from a user model's output: the output itself when it is
    a scalar; else its `.loss` (transformers), else the first scalar tensor in a tuple/dict;
    else the mean of the first tensor (a synthetic loss: it still runs the full backward)."""
    if isinstance(out, torch.Tensor):
        return out if out.numel() == 1 else out.float().mean()
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    items = list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, (tuple, list)) else []
    tensors = [t for t in items if isinstance(t, torch.Tensor)]
    for t in tensors:
        if t.numel() == 1 and t.dtype.is_floating_point:
            return t
    if tensors:
        return tensors[0].float().mean()
    raise TypeError(f"cannot find a tensor to backpropagate in the model output ({type(out).__name__})")


# ------------------------------------------------------------------------------------
# targets
# ------------------------------------------------------------------------------------
def target_device(target: str) -> str:
    return {"pjrt": "pjrt", "pjrt-compile": "pjrt", "cpu": "cpu", "inductor": "cpu",
            "cuda": "cuda", "cuda-inductor": "cuda",
            # --workload llm's compiled targets with mode="reduce-overhead"
            "pjrt-reduce-overhead": "pjrt", "cuda-reduce-overhead": "cuda"}[target]


def available_targets() -> list[str]:
    targets = list(DEFAULT_TARGETS)
    if torch.cuda.is_available():
        targets += ["cuda", "cuda-inductor"]
    return targets


def _target_unavailable(target: str) -> str | None:
    if target_device(target) == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available (torch.cuda.is_available() is False)"
    if target_device(target) == "pjrt" and not hasattr(torch, "pjrt"):
        return "the pjrt device is not registered (run `torch-pjrt doctor`)"
    return None


def _compile(model, target: str):
    if target not in ("pjrt-compile", "inductor", "cuda-inductor"):
        return model
    if _defined_in_torch_pjrt(model) and hasattr(torch._dynamo, "dont_skip_tracing"):
        # torch_pjrt.compiler puts the whole torch_pjrt package on Dynamo's skip list (so it
        # never traces the eager kernels); the built-in models live in torch_pjrt too, and
        # Dynamo would silently run them eagerly. Let it trace them.
        model = torch._dynamo.dont_skip_tracing(model)
    if target == "pjrt-compile":
        import torch_pjrt.compiler  # noqa: F401  (registers the Dynamo backend "pjrt")

        return torch.compile(model, backend="pjrt")
    return torch.compile(model)


def _defined_in_torch_pjrt(model) -> bool:
    """A model whose code lives in torch_pjrt, bench's own wrappers aside: when Dynamo skips
    a wrapper's frame, it still compiles the frames the wrapper calls."""
    return any(type(m).__module__.split(".")[0] == "torch_pjrt" and not isinstance(m, _Wrapper)
               for m in model.modules())


def _dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) since the last torch._dynamo.reset()."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


def _sync(device: str) -> None:
    if device == "pjrt":
        torch.pjrt.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


def pjrt_platform() -> str | None:
    try:
        from torch_pjrt.runtime import platform

        return platform.devices()[0].platform
    except Exception:  # noqa: BLE001
        return None


def price_for(target: str, prices: dict[str, float]) -> float | None:
    """$/hour of a target: its own entry, else its device's ("pjrt", "cpu", "cuda"); pjrt
    with no entry is priced as the platform it runs on (cpu, gpu, tpu)."""
    if target in prices:
        return prices[target]
    device = target_device(target)
    if device in prices:
        return prices[device]
    if device == "pjrt":
        plat = pjrt_platform()
        if plat in prices:
            return prices[plat]
        if plat in ("cuda", "rocm") and "gpu" in prices:
            return prices["gpu"]
    return None


def parse_prices(items: Sequence[str]) -> dict[str, float]:
    prices = dict(DEFAULT_PRICES)
    for item in items or ():
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            prices[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--price {item!r}: expected TARGET=USD_PER_HOUR, e.g. pjrt=1.2") from None
    return prices


# ------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------
class _PeakMemory:
    """Peak memory over a row. pjrt and cuda: the device allocator's peak
    (max_memory_allocated after a reset). cpu: the process's peak resident set (Linux
    VmHWM, reset through /proc/self/clear_refs) minus the resident set before the row;
    without clear_refs, ru_maxrss (never reset: a lower bound of nothing, so reported as-is)."""

    def __init__(self, device: str):
        self.device = device
        self.method = None
        self.start = 0

    def __enter__(self):
        import gc

        gc.collect()  # an earlier row's model and optimizer may wait in reference cycles
        if self.device == "pjrt":
            torch.pjrt.reset_peak_memory_stats()
            self.start = int(torch.pjrt.memory_allocated())
            self.method = "torch.pjrt.max_memory_allocated"
        elif self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.start = int(torch.cuda.memory_allocated())
            self.method = "torch.cuda.max_memory_allocated"
        elif _reset_peak_rss():
            self.start = _rss("VmRSS")
            self.method = "process peak RSS minus RSS at start (VmHWM)"
        else:
            self.method = "process peak RSS (ru_maxrss, whole process)"
        return self

    def __exit__(self, *exc):
        return False

    def peak(self) -> int | None:
        if self.device == "pjrt":
            return int(torch.pjrt.max_memory_allocated())
        if self.device == "cuda":
            return int(torch.cuda.max_memory_allocated())
        if self.method.startswith("process peak RSS minus"):
            return max(0, _rss("VmHWM") - self.start)
        import resource

        scale = 1 if sys.platform == "darwin" else 1024
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale

    def increase(self) -> int | None:
        """The peak above what was allocated at the start: what the measured code itself
        needed, whatever else (another target's model) lives on the same device."""
        peak = self.peak()
        if peak is None or self.method.startswith("process peak RSS ("):
            return peak  # ru_maxrss cannot be reset: the whole process's peak, as-is
        return peak if self.method.startswith("process peak RSS minus") else max(0, peak - self.start)


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _rss("VmHWM") > 0
    except OSError:
        return False


def _rss(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ------------------------------------------------------------------------------------
# one row
# ------------------------------------------------------------------------------------
def _empty_row(workload: Workload | str, mode: str, target: str) -> dict:
    row = dict.fromkeys(ROW_FIELDS)
    name = workload if isinstance(workload, str) else workload.name
    row.update(workload=name, mode=mode, target=target, device=target_device(target), status="ok",
               fallback_ops={})
    if not isinstance(workload, str):
        row.update(batch_size=workload.batch_size, samples_per_step=workload.batch_size,
                   tokens_per_step=workload.tokens_per_step)
    return row


def _error_text(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    message = "\n".join(lines[:6]) + ("\n..." if len(lines) > 6 else "")
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _to(tree, device):
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, (tuple, list)):
        return type(tree)(_to(t, device) for t in tree)
    if isinstance(tree, dict):
        return {k: _to(v, device) for k, v in tree.items()}
    return tree


def run_row(workload: Workload, mode: str, target: str, *, warmup: int, steps: int,
            prices: dict[str, float], on_step: Callable[[], None] | None = None) -> dict:
    """Measure one (workload, mode, target); failures land in the row, never raise."""
    row = _empty_row(workload, mode, target)
    row.update(warmup_steps=warmup, steps=steps, price_usd_per_hour=price_for(target, prices))
    start = time.perf_counter()
    reason = _target_unavailable(target)
    if reason:
        row.update(status="unavailable", error=reason, wall_s=0.0)
        return row
    device = target_device(target)
    fallback_before = _fallback_counts() if device == "pjrt" else {}
    compiles = target not in ("pjrt", "cpu", "cuda")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        with _PeakMemory(device) as memory:
            model, inputs = workload.build()
            row["params"] = sum(p.numel() for p in model.parameters())
            model = model.to(device)
            inputs = _to(inputs, device)
            if mode == "train":
                model.train()
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
                compiled = _compile(model, target)

                def step():
                    opt.zero_grad(set_to_none=True)
                    loss = workload.loss(compiled(*inputs))
                    loss.backward()
                    opt.step()
                    return loss
            else:
                model.eval()
                compiled = _compile(model, target)

                def step():
                    with torch.no_grad():
                        return compiled(*inputs)

            times = []
            for _ in range(warmup + steps):
                t0 = time.perf_counter()
                out = step()
                # the output stays alive across the synchronize: torch.pjrt.synchronize waits
                # for live arrays, so work whose results were already dropped is not waited for
                _sync(device)
                times.append(time.perf_counter() - t0)
                del out
                if on_step:
                    on_step()
            peak = memory.peak()
        if compiles:
            row["graphs"], row["graph_breaks"] = _dynamo_counts()
            if row["graphs"] == 0:
                raise RuntimeError("torch.compile compiled no graph: the model ran eagerly")
        row["memory_method"] = memory.method
        row["peak_memory_bytes"] = peak
        _fill_timings(row, times[:warmup], times[warmup:], workload)
    except Exception as error:  # noqa: BLE001  (a failing target is a result, not a crash)
        row.update(status="error", error=_error_text(error))
        if os.environ.get("TORCH_PJRT_BENCH_TRACEBACK"):
            traceback.print_exc()
    finally:
        torch._dynamo.reset()
        if device == "pjrt":
            row["fallback_ops"] = {op: n - fallback_before.get(op, 0) for op, n in _fallback_counts().items()
                                   if n > fallback_before.get(op, 0)}
    row["wall_s"] = round(time.perf_counter() - start, 3)
    return row


def _fallback_counts() -> dict[str, int]:
    try:
        import torch_pjrt

        return dict(torch_pjrt.fallback_ops())
    except Exception:  # noqa: BLE001
        return {}


def _fill_timings(row: dict, warm: list[float], timed: list[float], workload: Workload) -> None:
    timed = timed or warm[-1:]
    p50 = statistics.median(timed)
    row["first_call_s"] = round(warm[0], 4) if warm else None
    # time to steady state: the warm-up steps minus what they would take at the steady p50
    row["compile_s"] = round(max(0.0, sum(warm) - len(warm) * p50), 4) if warm else None
    row["latency_p50_ms"] = round(p50 * 1e3, 3)
    row["latency_p95_ms"] = round(_percentile(timed, 95) * 1e3, 3)
    row["latency_mean_ms"] = round(statistics.fmean(timed) * 1e3, 3)
    row["latency_min_ms"] = round(min(timed) * 1e3, 3)
    total = sum(timed)
    row["samples_per_s"] = round(workload.batch_size * len(timed) / total, 2)
    if workload.tokens_per_step:
        row["tokens_per_s"] = round(workload.tokens_per_step * len(timed) / total, 2)
    price = row["price_usd_per_hour"]
    if price is not None:
        per_second = price / 3600.0
        row["usd_per_million_samples"] = _significant(per_second / row["samples_per_s"] * 1e6)
        if row["tokens_per_s"]:
            row["usd_per_million_tokens"] = _significant(per_second / row["tokens_per_s"] * 1e6)


def _significant(value: float, digits: int = 6) -> float:
    """Rounds to significant digits: costs of fast workloads are fractions of a cent."""
    return float(f"{value:.{digits}g}")


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------
def _split(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    return [part.strip() for item in value for part in item.split(",") if part.strip()]


def run_bench(*, workloads: Sequence[str] | None = None, models: Sequence[str] = (),
              modes: Sequence[str] | None = None, targets: Sequence[str] | None = None,
              quick: bool = False, steps: int | None = None, warmup: int | None = None,
              prices: dict[str, float] | None = None, progress: bool = True, cold: bool = False) -> dict:
    """Run every (workload, mode, target) and return the report (see ROW_FIELDS)."""
    t0 = time.perf_counter()
    load_at_start = _load_average()  # before our own work adds to it
    size = "quick" if quick else "full"
    workloads = _split(workloads)
    chosen = workloads is not None
    if workloads is None:
        workloads = [] if models else list(QUICK_WORKLOADS if quick else WORKLOADS)
    modes = _split(modes) or list(MODES)
    targets = _split(targets) or available_targets()
    for name, given, valid in (("workload", workloads, WORKLOADS), ("mode", modes, MODES),
                               ("target", targets, TARGETS)):
        bad = [g for g in given if g not in valid]
        if bad:
            raise ValueError(f"unknown {name}(s) {', '.join(bad)}; choose from {', '.join(valid)}")
    warmup = STEPS[size]["warmup"] if warmup is None else warmup
    steps = STEPS[size]["steps"] if steps is None else steps
    if warmup < 1 or steps < 1:
        raise ValueError("--warmup and --steps must be at least 1")
    prices = dict(DEFAULT_PRICES) if prices is None else prices

    loaded: list[Workload] = []
    unavailable: list[dict] = []
    for name in workloads:
        try:
            loaded.append(builtin_workload(name, size))
        except Unavailable as why:
            unavailable.append({"workload": name, "reason": str(why)})
    for spec in models:
        loaded.append(user_workload(spec))  # a bad spec is the user's error: raise
    not_run = []
    if quick and not models and not chosen:
        for name in WORKLOADS:
            if name not in workloads:
                reason = _hf_missing() if name == "hf" else None
                not_run.append({"workload": name, "reason": "not in --quick" + (f"; also unavailable: {reason}"
                                                                               if reason else "")})

    plan = [(w, m, t) for w in loaded for m in modes for t in targets]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(plan) * (warmup + steps), unit="step", disable=not progress, dynamic_ncols=True,
               file=sys.stderr, leave=False)
    rows = []
    with contextlib.ExitStack() as stack:
        caches = stack.enter_context(_compile_caches(cold))
        stack.callback(bar.close)
        for w, m, t in plan:
            bar.set_description(f"{w.name} {m} {t}")
            row = run_row(w, m, t, warmup=warmup, steps=steps, prices=prices, on_step=lambda: bar.update(1))
            rows.append(row)
            if bar.n != len(rows) * (warmup + steps):  # a failed row skips its remaining steps
                bar.n = len(rows) * (warmup + steps)
                bar.refresh()
    for item in unavailable:  # rows too, so that every (workload, mode, target) has one
        for m in modes:
            for t in targets:
                rows.append({**_empty_row(item["workload"], m, t), "status": "unavailable", "error": item["reason"],
                             "warmup_steps": warmup, "steps": steps, "price_usd_per_hour": price_for(t, prices)})
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {"quick": quick, "size": size, "warmup_steps": warmup, "steps": steps, "compile_caches": caches,
                     "workloads": workloads, "models": list(models), "modes": modes, "targets": targets,
                     "prices_usd_per_hour": prices},
        "host": {**_host(torch), "load_average_1min": load_at_start},
        "workloads": {w.name: w.description for w in loaded},
        "unavailable": unavailable,
        "not_run": not_run,
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 2),
    }


@contextlib.contextmanager
def _compile_caches(cold: bool):
    """cold: compile as on a fresh machine. Inductor gets an empty cache directory and no
    FX-graph/AOTAutograd caches; torch-pjrt's persistent XLA cache is off. The in-process
    caches still hold what this process compiled before (each row compiles different graphs)."""
    if not cold:
        yield "on (compile s may be cache loads; --cold for fresh compiles)"
        return
    import tempfile

    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    import jax

    saved_env = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR",)}
    saved_cfg = (inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache)
    saved_xla = jax.config.jax_enable_compilation_cache  # on since import (runtime/compilation_cache.py)
    with tempfile.TemporaryDirectory(prefix="torch_pjrt_bench_") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
        jax.config.update("jax_enable_compilation_cache", False)
        inductor_config.fx_graph_cache = False
        functorch_config.enable_autograd_cache = False
        try:
            yield "off (--cold: fresh inductor cache directory, no persistent XLA cache)"
        finally:
            inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache = saved_cfg
            jax.config.update("jax_enable_compilation_cache", saved_xla)
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _host(torch) -> dict:
    info: dict[str, Any] = {"python": _platform.python_version(), "machine": _platform.machine(),
                            "cpu_count": os.cpu_count(),
                            "torch": torch.__version__,
                            "torch_threads": torch.get_num_threads(),
                            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        import jax

        info["jax"] = jax.__version__
        info["pjrt_platform"] = pjrt_platform()
        info["pjrt_device"] = torch.pjrt.get_device_name(0)
        info["pjrt_devices"] = torch.pjrt.device_count()
    except Exception as e:  # noqa: BLE001
        info["pjrt_error"] = _error_text(e)
    return info


# ------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------
def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _num(x: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(report: dict, console=None) -> None:
    """The report as a rich table, with the notes a reader needs to trust it."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    host = report["host"]
    console.print(f"[bold]torch-pjrt bench[/bold] ({report['settings']['size']} sizes, "
                  f"{report['settings']['warmup_steps']} warm-up + {report['settings']['steps']} timed steps per row) "
                  f"torch {host.get('torch')}, jax {host.get('jax')}, pjrt device: {host.get('pjrt_device')}, "
                  f"{host.get('cpu_count')} CPUs")
    table = Table(show_lines=False)
    for col, just in (("workload", "left"), ("mode", "left"), ("target", "left"), ("p50 ms", "right"),
                      ("p95 ms", "right"), ("samples/s", "right"), ("tokens/s", "right"), ("compile s", "right"),
                      ("peak mem", "right"), ("$/M tok|smp", "right"), ("status", "left")):
        table.add_column(col, justify=just)
    missing = {item["workload"] for item in report["unavailable"]}
    prev = None
    for r in (r for r in report["rows"] if r["workload"] not in missing):
        if prev is not None and (r["workload"], r["mode"]) != prev:
            table.add_section()
        prev = (r["workload"], r["mode"])
        if r["status"] != "ok":
            status = f"[red]{r['status']}[/red]: " + escape(_short(r["error"]))
        else:
            status = "ok" + (f" [yellow](CPU fallback: {', '.join(r['fallback_ops'])})[/yellow]"
                             if r.get("fallback_ops") else "")
        cost = r["usd_per_million_tokens"]
        cost_text = _num(cost, "${:.3g}") + " tok" if cost is not None else (
            _num(r["usd_per_million_samples"], "${:.3g}") + " smp" if r["usd_per_million_samples"] is not None else "-")
        table.add_row(r["workload"], r["mode"], r["target"], _num(r["latency_p50_ms"], "{:,.2f}"),
                      _num(r["latency_p95_ms"], "{:,.2f}"), _num(r["samples_per_s"], "{:,.0f}"),
                      _num(r["tokens_per_s"], "{:,.0f}"), _num(r["compile_s"], "{:,.2f}"),
                      _bytes(r["peak_memory_bytes"]), cost_text, status)
    console.print(table)
    methods = sorted({(r["device"], r["memory_method"]) for r in report["rows"] if r["memory_method"]})
    for device, method in methods:
        console.print(f"peak mem on {device}: {method}", highlight=False)
    console.print(prices_note(report), highlight=False)
    console.print("compile s: warm-up steps' time minus the same number of steady p50 steps "
                  "(eager pjrt compiles one executable per op signature).", highlight=False)
    print_load_warning(host, console)
    for item in report["unavailable"]:
        console.print(f"[yellow]{item['workload']}: unavailable[/yellow] ({escape(item['reason'])})")
    for item in report.get("not_run", ()):
        console.print(f"{item['workload']}: {escape(item['reason'])} (run without --quick, or --workloads)",
                      highlight=False)
    for r in report["rows"]:
        if r["status"] == "error":
            console.print(f"[red]{r['workload']} {r['mode']} {r['target']}[/red]: {escape(r['error'])}",
                          highlight=False)
    console.print(f"bench wall time: {report['wall_s']:.0f} s")


def prices_note(report: dict) -> str:
    prices = report["settings"]["prices_usd_per_hour"]
    return ("prices ($/hour, --price to change): " + ", ".join(f"{k}={v:g}" for k, v in prices.items())
            + f"; pjrt runs on the {report['host'].get('pjrt_platform')} platform")


def print_load_warning(host: dict, console) -> None:
    """A busy machine makes every timing noisy, the CPU peers' thread pool above all: say so."""
    load, cpus, threads = host.get("load_average_1min"), host.get("cpu_count") or 1, host.get("torch_threads")
    if load is not None and load > cpus:
        advice = "; --threads 1 steadies it" if threads and threads > 1 else ""
        console.print(f"[yellow]warning: the machine was busy (load average {load:.1f} on {cpus} CPUs at the start): "
                      f"timings are noisy and ratios between rows are not results; torch's CPU thread pool ({threads} thread{'s' if threads != 1 else ''}) suffers most"
                      f"{advice}[/yellow]", highlight=False)


def _short(text: str | None, width: int = 70) -> str:
    first = (text or "").splitlines()[0] if text else ""
    return first if len(first) <= width else first[: width - 1] + "…"


PLOT_NEEDS_MATPLOTLIB = "--plot needs matplotlib: pip install 'torch-pjrt[bench]' (or pip install matplotlib)"


def plot_unavailable() -> str | None:
    """Why --plot cannot work here (matplotlib missing or broken), checked before the run so
    that a long run does not end in that error."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return PLOT_NEEDS_MATPLOTLIB
    return None


def plot(report: dict, path: str | os.PathLike) -> None:
    """Side-by-side bars of throughput on a log axis (CPU rows and compiled GPU rows differ by
    orders of magnitude): a panel per (workload, mode), a bar per target, in the same colour
    everywhere. Tokens/s for workloads with tokens, samples/s otherwise. A whisker reaches down
    to the throughput of a step at the p95 latency; a failed or unavailable target gets an
    empty slot marked with its status. The title names the platform, device and machine load."""
    reason = plot_unavailable()
    if reason:
        raise RuntimeError(reason)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    missing = {item["workload"] for item in report["unavailable"]}
    rows = [r for r in report["rows"] if r["workload"] not in missing]
    workloads = list(dict.fromkeys(r["workload"] for r in rows)) or ["(no rows)"]
    modes = list(dict.fromkeys(r["mode"] for r in rows)) or ["-"]
    targets = list(dict.fromkeys(r["target"] for r in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(len(modes), len(workloads), squeeze=False,
                             figsize=(max(4.0, 3.2 * len(workloads)), 0.8 + 2.8 * len(modes)))
    for i, mode in enumerate(modes):
        for j, workload in enumerate(workloads):
            ax = axes[i][j]
            mine = {r["target"]: r for r in rows if r["workload"] == workload and r["mode"] == mode}
            key = "tokens_per_s" if any(r["tokens_per_s"] for r in mine.values()) else "samples_per_s"
            values = [(mine.get(t) or {}).get(key) or 0 for t in targets]
            at_p95 = [_throughput_at_p95(mine.get(t), key) for t in targets]
            drawn = [v for v in values + at_p95 if v > 0] or [1.0]
            bottom, top = min(drawn) / 3, max(drawn) * 4  # room below the whiskers, above the labels
            ax.set_yscale("log")
            # bars start at the axis' bottom (a log axis has no 0): height is value - bottom
            ax.bar(range(len(targets)), [v - bottom if v > 0 else float("nan") for v in values],
                   bottom=bottom, color=[colors[k % len(colors)] for k in range(len(targets))],
                   yerr=[[max(0.0, v - w) if v > 0 and w > 0 else 0.0 for v, w in zip(values, at_p95)],
                         [0.0] * len(values)], capsize=3, error_kw={"elinewidth": 1})
            for k, t in enumerate(targets):
                r = mine.get(t)
                if r is not None and r["status"] != "ok":
                    ax.text(k, bottom * 1.2, r["status"], rotation=90, ha="center", va="bottom", fontsize=8,
                            color="red")
                elif values[k]:
                    ax.text(k, values[k] * 1.1, _si(values[k]), ha="center", va="bottom", fontsize=7)
            ax.set_ylim(bottom, top)
            ax.set_xlim(-0.6, len(targets) - 0.4)  # a slot without a bar (a failed target) stays in view
            ax.set_xticks(range(len(targets)), targets, rotation=30, ha="right", fontsize=8)
            name = workload if len(workload) < 28 else workload[:27] + "…"
            ax.set_title(f"{name} {mode}", fontsize=10)
            ax.set_ylabel(key.replace("_per_s", "/s"), fontsize=8)
            ax.tick_params(axis="y", which="both", labelsize=7)
            ax.grid(axis="y", alpha=0.3)
    host = report["host"]
    load = host.get("load_average_1min")
    fig.suptitle("torch-pjrt bench: throughput, log scale\nwhisker: a step at p95 latency\n"
                 f"pjrt on {host.get('pjrt_platform')}, {host.get('pjrt_device')}; "
                 f"load {'?' if load is None else f'{load:.1f}'} on {host.get('cpu_count')} CPUs",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _throughput_at_p95(row: dict | None, key: str) -> float:
    """Throughput of one step that took the p95 latency (0 without one): the whisker's end."""
    if not row or row["status"] != "ok" or not row["latency_p95_ms"]:
        return 0.0
    per_step = row["tokens_per_step"] if key == "tokens_per_s" else row["samples_per_step"]
    return per_step / (row["latency_p95_ms"] / 1e3) if per_step else 0.0


def _si(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def is_llm_run(args) -> bool:
    """`--workload llm`, or a `--model hf:...` (a causal LM: only the llm workload takes one)."""
    return "llm" in (_split(args.workloads) or []) or any(m.startswith("hf:") for m in args.model or ())


def main(args) -> int:
    """The CLI's `bench` (see cli._add_bench)."""
    from rich.console import Console
    from rich.markup import escape

    from torch_pjrt.tools.output import to_stdout

    # --json alone: stdout carries the JSON, the table goes to stderr
    stream = sys.stderr if to_stdout(args.json) else sys.stdout
    # wide enough for the table when the output is a file or a pipe (rich assumes 80 there)
    console = Console(file=stream, width=None if stream.isatty() else int(os.environ.get("COLUMNS", 160)))
    if args.plot and plot_unavailable():
        console.print(escape(plot_unavailable()), style="red", highlight=False)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if is_llm_run(args):
        from torch_pjrt.tools import bench_llm

        if (_split(args.workloads) or ["llm"]) != ["llm"]:
            console.print("[red]torch-pjrt bench: --workload llm runs alone (its rows are prefill and decode, "
                          "not steps)[/red]", highlight=False)
            return 2

        return bench_llm.main(args, console)
    try:
        prices = parse_prices(args.price)
        report = run_bench(workloads=args.workloads, models=args.model or (), modes=args.modes, targets=args.targets,
                           quick=args.quick, steps=args.steps, warmup=args.warmup, prices=prices,
                           progress=not args.no_progress, cold=args.cold)
    except (ValueError, TypeError, ImportError) as e:
        console.print(f"[red]torch-pjrt bench: {e}[/red]", highlight=False)
        return 2
    return show(report, args, console, render, plot)


def show(report: dict, args, console, render, plot) -> int:
    """The table, then the JSON and the plot where asked (every workload's last step)."""
    from rich.markup import escape

    from torch_pjrt.tools.output import to_stdout, write_json

    render(report, console)
    if args.json:
        write_json(report, args.json)
        if not to_stdout(args.json):
            console.print(f"wrote {escape(args.json)}", highlight=False)
    if args.plot:
        plot(report, args.plot)
        console.print(f"wrote {escape(args.plot)}", highlight=False)
    return 0
