"""`torch-pjrt bench --workload llm`: a causal LM's prefill and decode, timed apart.

A row is one (target, batch size, prompt length): greedy generation of `new_tokens` tokens
with a decode loop this module controls, so that time to first token and time per output
token are measured, not inferred from `model.generate` as a whole:

    prefill   one forward over the prompt with an empty KV cache, then the argmax of the
              last position: the first output token. Its time is the TTFT.
    decode    one forward per further token (the previous token in, the cache extended),
              then its argmax. Each is one time per output token (TPOT).

Every forward is followed by the device's synchronize while its token is alive
(`torch.pjrt.synchronize`, `torch.cuda.synchronize`; the CPU runs synchronously).

Modes, as a user of transformers would run them:

    eager     model(...) with the default dynamic cache (DynamicCache): the cache grows by
              one position per token; eager pjrt pads it to power-of-two capacities, so its
              first pass compiles a few executables per capacity (docs/eager.md)
    compiled  HF's documented static-cache recipe: a StaticCache of prompt + new tokens and
              torch.compile(model.forward, backend=...) (pjrt for pjrt, inductor otherwise)
    reduce-overhead  the same recipe with torch.compile(..., mode="reduce-overhead"): on
              pjrt the same executables with a leaner per-call path, on CUDA inductor's CUDA
              graphs (no CPU peer: inductor's reduce-overhead is CUDA graphs, nothing on a CPU)

A pass is one whole generation. The first `warmup` passes of every shape are warm-up (2 by
default: fused eager runs a region on its ops' executables the first time it sees it and
compiles it the second, so the timed passes are steady in both eager modes): the
first one is reported apart (first_pass_*), none is in the p50/p95, and their excess over a
steady pass is `compile_s`. The targets' passes are interleaved (pass 1 of every target, then
pass 2 of every target...), so a change in the machine's load hits every target alike.

Greedy tokens of every pass are compared with those of an untimed torch CPU float32 eager
pass of the same model and prompt; a difference is in the row and printed in red.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.util
import inspect
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from torch_pjrt.tools import bench

LLM_MODES = ("eager", "compiled", "reduce-overhead")
# every target of --workload llm and its mode; a row's mode is read from its target
TARGET_MODES = {"pjrt": "eager", "cpu": "eager", "cuda": "eager",
                "pjrt-compile": "compiled", "inductor": "compiled", "cuda-inductor": "compiled",
                "pjrt-reduce-overhead": "reduce-overhead", "cuda-reduce-overhead": "reduce-overhead"}
LLM_TARGETS = tuple(TARGET_MODES)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# --quantize: torchao configs, applied with torchao.quantization.quantize_ after the model is on its device
QUANTIZATIONS = {"int8-weight-only": "Int8WeightOnlyConfig",
                 "int8-dynamic": "Int8DynamicActivationInt8WeightConfig"}

# The built-in model: a randomly initialised Llama with grouped-query attention (4 query
# heads share 2 KV heads), small enough that a 2-core CPU runs every target in a minute.
TINY_LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16)

DEFAULTS = dict(batch_sizes=(1,), prompt_lengths=(32,), new_tokens=16, warmup=2, steps=3)

# every row has exactly these keys (None where a value does not apply or the row failed)
LLM_ROW_FIELDS = (
    "workload", "target", "mode", "device", "cache", "dtype", "quantization", "status", "error",
    "params", "weights_bytes", "kv_cache_bytes", "batch_size", "prompt_length", "new_tokens",
    "warmup_passes", "timed_passes",
    "first_pass_ttft_ms", "first_pass_tpot_ms", "compile_s",
    "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms", "tpot_mean_ms",
    "prefill_tokens_per_s", "decode_tokens_per_s", "output_tokens_per_s",
    "peak_memory_bytes", "memory_method",
    "price_usd_per_hour", "usd_per_million_output_tokens",
    "tokens_equal_cpu_float32", "tokens_mismatch",
    "executables_first_pass", "executables_timed",
    "graphs", "graph_breaks", "fallback_ops", "load_average_1min", "wall_s",
)


# ------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------
@dataclasses.dataclass
class CausalLM:
    """`build()` -> a transformers causal LM on the CPU in float32, the same weights every call."""
    name: str
    build: Callable[[], Any]
    description: str


def is_hf_spec(spec: str) -> bool:
    return spec.startswith("hf:")


def causal_lm(spec: str | None, max_length: int) -> CausalLM:
    """The built-in tiny Llama (spec None) or `hf:<directory | model type | cached name>`:
    a directory with a config.json (its weights when it has them, else random ones), a model
    type transformers knows (llama, mistral, qwen2, gpt2...: the built-in's tiny sizes with
    that architecture, random weights), or a name already in the Hugging Face cache (no
    download is attempted)."""
    reason = bench._hf_missing()
    if reason:
        raise bench.Unavailable(reason)
    import transformers

    if spec is None:
        config = transformers.LlamaConfig(**TINY_LLAMA, max_position_embeddings=max(256, max_length))
        return CausalLM("llama-tiny", _random_weights(config),
                        f"random Llama, {TINY_LLAMA['num_hidden_layers']} layers, d={TINY_LLAMA['hidden_size']}, "
                        f"{TINY_LLAMA['num_attention_heads']} query / {TINY_LLAMA['num_key_value_heads']} KV heads "
                        f"(GQA), vocab {TINY_LLAMA['vocab_size']}")
    name = spec[len("hf:"):]
    if not name:
        raise ValueError("--model hf:: expected hf:<directory, model type or cached model name>")
    path = Path(name).expanduser()
    if path.is_dir():
        config = transformers.AutoConfig.from_pretrained(path)
        weights = [*path.glob("*.safetensors"), *path.glob("pytorch_model*.bin")]
        if weights:
            return CausalLM(spec, lambda: transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32), f"{config.model_type} from {path} (its weights)")
        return CausalLM(spec, _random_weights(config), f"{config.model_type} from {path}/config.json, random weights "
                                                       f"(the directory has no weights)")
    if name in transformers.CONFIG_MAPPING:
        config = transformers.AutoConfig.for_model(name, **TINY_LLAMA, max_position_embeddings=max(256, max_length))
        return CausalLM(spec, _random_weights(config), f"random {name} at the built-in's tiny sizes")
    try:
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=True)
    except OSError as e:
        raise ValueError(f"--model {spec}: not a directory, not a model type transformers knows, and not in the "
                         f"Hugging Face cache ({e.__class__.__name__}); no download is attempted") from None
    return CausalLM(spec, lambda: transformers.AutoModelForCausalLM.from_pretrained(
        name, local_files_only=True, dtype=torch.float32), f"{name} from the Hugging Face cache")


def _random_weights(config) -> Callable[[], Any]:
    def build():
        import transformers

        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return build


def quantize(model, name: str | None):
    """`model` with torchao's `name` config applied in place (None: unchanged)."""
    if name is None:
        return model
    if importlib.util.find_spec("torchao") is None:
        raise bench.Unavailable(f"--quantize {name} needs torchao (pip install torchao)")
    import torchao.quantization

    torchao.quantization.quantize_(model, getattr(torchao.quantization, QUANTIZATIONS[name])())
    return model


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds: a wrapper subclass (torchao's quantized weights) is the sum of the
    tensors inside it (int8 data and scales), not its logical float size."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, name)) for name in names)
    return t.numel() * t.element_size()


def _cache_keyword(model) -> str:
    """transformers 5 names the forward's cache argument `cache`; earlier ones `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _new_cache(model, kind: str, max_cache_len: int):
    import transformers

    if kind == "static":
        return transformers.StaticCache(config=model.config, max_cache_len=max_cache_len)
    try:
        return transformers.DynamicCache(config=model.config)
    except TypeError:  # transformers before 4.56 takes no config
        return transformers.DynamicCache()


def kv_cache_bytes(config, batch: int, length: int, dtype: torch.dtype) -> int | None:
    """Keys and values of every layer for `length` positions: what the static cache holds."""
    try:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return 2 * text.num_hidden_layers * batch * kv_heads * head_dim * length * dtype.itemsize
    except (AttributeError, TypeError):
        return None


class XlaExecutables:
    """How many XLA executables this process has built, compiled or loaded from the
    persistent cache: JAX reports each one as a backend-compile event (eager pjrt's per-op
    executables and the pjrt backend's graphs alike), so a pass's count says whether it
    compiled anything."""

    count = 0
    _listening = False

    @classmethod
    def listen(cls) -> None:
        if cls._listening:
            return
        import jax.monitoring

        from ..runtime.executable_budget import BUILD_EVENT

        def on_duration(name: str, seconds: float, **_) -> None:
            if name == BUILD_EVENT:
                cls.count += 1

        jax.monitoring.register_event_duration_secs_listener(on_duration)
        cls._listening = True


# ------------------------------------------------------------------------------------
# one pass: prefill, then the decode loop
# ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Pass:
    ttft_s: float
    decode_s: list[float]  # one per output token after the first
    tokens: torch.Tensor  # (batch, new_tokens) on the CPU

    @property
    def total_s(self) -> float:
        return self.ttft_s + sum(self.decode_s)


def greedy_pass(forward, model, prompt: torch.Tensor, new_tokens: int, cache_kind: str, device: str) -> Pass:
    """Greedy generation of `new_tokens` tokens after `prompt` (already on `device`)."""
    cache = _new_cache(model, cache_kind, prompt.shape[1] + new_tokens)
    kwargs = {_cache_keyword(model): cache, "use_cache": True}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1  # as generate() does: the LM head on the last position only
    tokens, decode_s = [], []
    with torch.no_grad():
        start = time.perf_counter()
        token = forward(input_ids=prompt, **kwargs).logits[:, -1].argmax(-1, keepdim=True)
        bench._sync(device)  # `token` is alive: the synchronize waits for it
        ttft = time.perf_counter() - start
        tokens.append(token)
        for _ in range(new_tokens - 1):
            start = time.perf_counter()
            token = forward(input_ids=token, **kwargs).logits[:, -1].argmax(-1, keepdim=True)
            bench._sync(device)
            decode_s.append(time.perf_counter() - start)
            tokens.append(token)
    return Pass(ttft, decode_s, torch.cat(tokens, dim=1).cpu())


def first_difference(tokens: torch.Tensor, reference: torch.Tensor) -> str | None:
    """None when equal; else where the first difference is, in words."""
    if torch.equal(tokens, reference):
        return None
    rows = (tokens != reference).any(dim=1)
    row = int(rows.nonzero()[0])
    col = int((tokens[row] != reference[row]).nonzero()[0])
    return (f"{int(rows.sum())} of {tokens.shape[0]} sequences differ; first at sequence {row}, output token {col}: "
            f"{int(tokens[row, col])} vs {int(reference[row, col])} on torch CPU float32")


# ------------------------------------------------------------------------------------
# a target over one shape
# ------------------------------------------------------------------------------------
class TargetRun:
    """One target's model and forward, and the passes it ran at the current shape."""

    def __init__(self, target: str, lm: CausalLM, dtype: torch.dtype, quantization: str | None):
        self.target = target
        self.device = bench.target_device(target)
        self.mode = TARGET_MODES[target]
        self.cache = "dynamic" if self.mode == "eager" else "static"
        self.error: str | None = bench._target_unavailable(target)
        self.unavailable = self.error is not None
        self.build_error: str | None = None  # a model that failed to build fails every shape
        self.model = self.forward = None
        self.params = self.weights_bytes = None
        if self.unavailable:
            return
        try:
            model = lm.build()
            self.params = sum(p.numel() for p in model.parameters())
            self.model = quantize(model.to(dtype=dtype, device=self.device).eval(), quantization)
            self.weights_bytes = sum(tensor_bytes(p) for p in self.model.parameters())
            self.forward = self.model.forward if self.mode == "eager" else self._compiled_forward()
        except Exception as error:  # noqa: BLE001  (a failing target is a result)
            self._fail(error)
            self.build_error = self.error

    def next_shape(self) -> None:
        """A pass that failed at one shape does not stop the next shape from trying."""
        if not self.unavailable:
            self.error = self.build_error

    def _compiled_forward(self):
        # HF's static-cache recipe compiles model.forward; the backend and mode are the target's
        mode = "reduce-overhead" if self.mode == "reduce-overhead" else None
        if self.device == "pjrt":
            import torch_pjrt.compiler  # noqa: F401  (registers the Dynamo backend "pjrt")

            return torch.compile(self.model.forward, backend="pjrt", mode=mode)
        return torch.compile(self.model.forward, backend="inductor", mode=mode)

    def _fail(self, error: BaseException) -> None:
        self.error = bench._error_text(error)
        if os.environ.get("TORCH_PJRT_BENCH_TRACEBACK"):
            traceback.print_exc()

    @property
    def ok(self) -> bool:
        return self.error is None

    def start_shape(self) -> None:
        self.passes: list[Pass] = []
        self.peaks: list[int] = []
        self.executables: list[int] = []  # per pass, pjrt targets only
        self.memory_method = None
        self.graphs = self.graph_breaks = 0
        self.fallback_before = bench._fallback_counts() if self.device == "pjrt" else {}
        self.wall_s = 0.0

    def run_pass(self, prompt_cpu: torch.Tensor, new_tokens: int) -> None:
        start = time.perf_counter()
        graphs_before, breaks_before = bench._dynamo_counts()
        executables_before = XlaExecutables.count
        try:
            prompt = prompt_cpu.to(self.device)
            with bench._PeakMemory(self.device) as memory:
                result = greedy_pass(self.forward, self.model, prompt, new_tokens, self.cache, self.device)
                self.peaks.append(memory.increase())
            self.memory_method = memory.method
            self.passes.append(result)
        except Exception as error:  # noqa: BLE001
            self._fail(error)
        if self.device == "pjrt":
            self.executables.append(XlaExecutables.count - executables_before)
        graphs, breaks = bench._dynamo_counts()
        self.graphs += graphs - graphs_before
        self.graph_breaks += breaks - breaks_before
        self.wall_s += time.perf_counter() - start


def _row(run: TargetRun, workload: str, dtype_name: str, quantization: str | None, batch: int, prompt_length: int, new_tokens: int,
         warmup: int, steps: int, reference: torch.Tensor | None, prices: dict[str, float], load: float | None,
         kv_bytes: int | None) -> dict:
    row = dict.fromkeys(LLM_ROW_FIELDS)
    row.update(workload=workload, target=run.target, mode=run.mode, device=run.device, cache=run.cache,
               dtype=dtype_name, quantization=quantization, status="ok", params=run.params, weights_bytes=run.weights_bytes,
               kv_cache_bytes=kv_bytes, batch_size=batch, prompt_length=prompt_length, new_tokens=new_tokens,
               warmup_passes=warmup, timed_passes=steps, price_usd_per_hour=bench.price_for(run.target, prices),
               load_average_1min=load, fallback_ops={}, wall_s=round(getattr(run, "wall_s", 0.0), 3))
    if run.unavailable:
        row.update(status="unavailable", error=run.error)
        return row
    if run.device == "pjrt":
        after = bench._fallback_counts()
        row["fallback_ops"] = {op: n - run.fallback_before.get(op, 0) for op, n in after.items()
                               if n > run.fallback_before.get(op, 0)}
    if run.mode != "eager":
        row["graphs"], row["graph_breaks"] = run.graphs, run.graph_breaks
        if run.ok and run.graphs == 0:
            run.error = "RuntimeError: torch.compile compiled no graph: the model ran eagerly"
    if not run.ok:
        row.update(status="error", error=run.error)
        return row
    _fill_llm_timings(row, run.passes[:warmup], run.passes[warmup:], batch, prompt_length, new_tokens)
    if run.executables:
        row["executables_first_pass"], row["executables_timed"] = run.executables[0], sum(run.executables[warmup:])
    timed_peaks = [p for p in run.peaks[warmup:] if p is not None]
    if timed_peaks:
        # the pass's own peak (cache, activations) plus the model's weights, on every device alike
        row["peak_memory_bytes"] = max(timed_peaks) + (run.weights_bytes or 0)
        row["memory_method"] = f"weights + peak of a timed pass above its start ({run.memory_method})"
    if reference is not None:
        mismatches = [d for d in (first_difference(p.tokens, reference) for p in run.passes) if d]
        row["tokens_equal_cpu_float32"] = not mismatches
        row["tokens_mismatch"] = mismatches[0] if mismatches else None
    return row


def _fill_llm_timings(row: dict, warm: list[Pass], timed: list[Pass], batch: int, prompt_length: int,
                      new_tokens: int) -> None:
    first = warm[0]
    row["first_pass_ttft_ms"] = round(first.ttft_s * 1e3, 3)
    row["first_pass_tpot_ms"] = round(statistics.fmean(first.decode_s) * 1e3, 3)
    steady_pass = statistics.median(p.total_s for p in timed)
    row["compile_s"] = round(max(0.0, sum(p.total_s for p in warm) - len(warm) * steady_pass), 4)
    ttfts = [p.ttft_s for p in timed]
    decode = [t for p in timed for t in p.decode_s]
    row["ttft_p50_ms"] = round(statistics.median(ttfts) * 1e3, 3)
    row["ttft_p95_ms"] = round(bench._percentile(ttfts, 95) * 1e3, 3)
    row["tpot_p50_ms"] = round(statistics.median(decode) * 1e3, 3)
    row["tpot_p95_ms"] = round(bench._percentile(decode, 95) * 1e3, 3)
    row["tpot_mean_ms"] = round(statistics.fmean(decode) * 1e3, 3)
    row["prefill_tokens_per_s"] = round(batch * prompt_length * len(ttfts) / sum(ttfts), 2)
    row["decode_tokens_per_s"] = round(batch * len(decode) / sum(decode), 2)
    # output tokens over the whole generation (prefill included): what a request costs
    row["output_tokens_per_s"] = round(batch * new_tokens * len(timed) / sum(p.total_s for p in timed), 2)
    price = row["price_usd_per_hour"]
    if price is not None:
        row["usd_per_million_output_tokens"] = bench._significant(price / 3600.0 / row["output_tokens_per_s"] * 1e6)


# ------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------
def llm_targets(targets: Sequence[str] | None, modes: Sequence[str] | None) -> list[str]:
    """The targets to run: those given (or every available one) whose mode is selected."""
    modes = bench._split(modes) or list(LLM_MODES)
    bad = [m for m in modes if m not in LLM_MODES]
    if bad:
        raise ValueError(f"unknown mode(s) {', '.join(bad)} for --workload llm; choose from {', '.join(LLM_MODES)}")
    chosen = bench._split(targets) or available_llm_targets()
    bad = [t for t in chosen if t not in LLM_TARGETS]
    if bad:
        raise ValueError(f"unknown target(s) {', '.join(bad)}; choose from {', '.join(LLM_TARGETS)}")
    picked = [t for t in chosen if TARGET_MODES[t] in modes]
    if not picked:
        raise ValueError(f"no target among {', '.join(chosen)} runs in mode(s) {', '.join(modes)}")
    return picked


def available_llm_targets() -> list[str]:
    """The shared bench's available targets, each followed by its reduce-overhead twin where it has one."""
    twins = {"pjrt-compile": "pjrt-reduce-overhead", "cuda-inductor": "cuda-reduce-overhead"}
    return [name for t in bench.available_targets() for name in (t, twins.get(t)) if name]


def _positive_ints(values, name: str) -> list[int]:
    items = bench._split([str(v) for v in values] if isinstance(values, (list, tuple)) else values)
    try:
        numbers = [int(v) for v in items]
    except ValueError:
        raise ValueError(f"--{name}: expected comma-separated integers, got {','.join(items)}") from None
    if not numbers or min(numbers) < 1:
        raise ValueError(f"--{name}: every value must be at least 1")
    return numbers


def run_llm_bench(*, model: str | None = None, batch_sizes=None, prompt_lengths=None, new_tokens: int | None = None,
                  modes=None, targets=None, warmup: int | None = None, steps: int | None = None,
                  dtype: str = "float32", quantization: str | None = None, prices: dict[str, float] | None = None, progress: bool = True,
                  cold: bool = False) -> dict:
    """Every (target, batch size, prompt length) of a causal LM; returns the report (LLM_ROW_FIELDS)."""
    t0 = time.perf_counter()
    load_at_start = bench._load_average()
    batch_sizes = _positive_ints(batch_sizes or DEFAULTS["batch_sizes"], "batch-sizes")
    prompt_lengths = _positive_ints(prompt_lengths or DEFAULTS["prompt_lengths"], "prompt-lengths")
    new_tokens = DEFAULTS["new_tokens"] if new_tokens is None else new_tokens
    if new_tokens < 2:
        raise ValueError("--new-tokens must be at least 2 (one prefill token, then at least one decoded)")
    warmup = DEFAULTS["warmup"] if warmup is None else warmup
    steps = DEFAULTS["steps"] if steps is None else steps
    if warmup < 1 or steps < 1:
        raise ValueError("--warmup and --steps (passes, for --workload llm) must be at least 1")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype}: choose from {', '.join(DTYPES)}")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"--quantize {quantization}: choose from {', '.join(QUANTIZATIONS)}")
    if model is not None and not is_hf_spec(model):
        raise ValueError(f"--model {model!r}: --workload llm takes hf:<directory, model type or cached name>")
    targets = llm_targets(targets, modes)
    prices = dict(bench.DEFAULT_PRICES) if prices is None else prices
    lm = causal_lm(model, max(prompt_lengths) + new_tokens)
    if any(bench.target_device(t) == "pjrt" for t in targets):
        XlaExecutables.listen()
    shapes = [(b, p) for b in batch_sizes for p in prompt_lengths]

    from tqdm.auto import tqdm

    bar = tqdm(total=len(shapes) * (warmup + steps) * len(targets), unit="pass", disable=not progress,
               dynamic_ncols=True, file=sys.stderr, leave=False)
    rows = []
    with contextlib.ExitStack() as stack:
        caches = stack.enter_context(bench._compile_caches(cold))
        stack.callback(bar.close)
        # the reference is quantized alike: the check is of the device, not of the quantization
        reference_model = quantize(lm.build().eval(), quantization)
        runs = [TargetRun(t, lm, DTYPES[dtype], quantization) for t in targets]
        prompt_gen = torch.Generator().manual_seed(0)
        vocab = reference_model.config.get_text_config().vocab_size
        for batch, prompt_length in shapes:
            load = bench._load_average()
            prompt = torch.randint(vocab, (batch, prompt_length), generator=prompt_gen)
            reference = greedy_pass(reference_model.forward, reference_model, prompt, new_tokens, "dynamic", "cpu").tokens
            # a shape's graphs are its own (the static cache's length is part of them); the
            # reset also keeps Dynamo's per-function recompile limit from being reached
            torch._dynamo.reset()
            for run in runs:
                run.start_shape()
            for _ in range(warmup + steps):
                for run in runs:  # interleaved: pass i of every target before pass i + 1
                    bar.set_description(f"b{batch} p{prompt_length} {run.target}")
                    if run.ok:
                        run.run_pass(prompt, new_tokens)
                    bar.update(1)
            kv = kv_cache_bytes(reference_model.config, batch, prompt_length + new_tokens, DTYPES[dtype])
            rows += [_row(run, lm.name, dtype, quantization, batch, prompt_length, new_tokens, warmup, steps, reference, prices,
                          load, kv) for run in runs]
            for run in runs:
                run.next_shape()
        torch._dynamo.reset()
    return {
        "schema_version": bench.SCHEMA_VERSION,
        "workload": "llm",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {"model": lm.name, "description": lm.description, "batch_sizes": batch_sizes,
                     "prompt_lengths": prompt_lengths, "new_tokens": new_tokens, "dtype": dtype,
                     "quantization": quantization,
                     "warmup_passes": warmup, "timed_passes": steps, "targets": targets,
                     "compile_caches": caches, "prices_usd_per_hour": prices, "decoding": "greedy",
                     "reference": "untimed torch CPU float32 eager pass, dynamic cache"
                                  + (f", {quantization} alike" if quantization else "")},
        "host": {**bench._host(torch), "load_average_1min": load_at_start,
                 "load_average_1min_end": bench._load_average()},
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 2),
    }


# ------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------
def render(report: dict, console=None) -> None:
    """The report as a rich table, the machine first, loud about token mismatches."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    host, s = report["host"], report["settings"]
    console.print(f"[bold]torch-pjrt bench --workload llm[/bold]: {escape(s['model'])} ({escape(s['description'])}), "
                  f"{s['dtype']}" + (f", torchao {s['quantization']}" if s.get("quantization") else "")
                  + f", greedy, {s['new_tokens']} new tokens", highlight=False)
    load, load_end = host.get("load_average_1min"), host.get("load_average_1min_end")
    console.print(f"machine: {host.get('cpu_count')} CPUs, load average {_load(load)} at the start, {_load(load_end)} "
                  f"at the end; torch {host.get('torch')} with {host.get('torch_threads')} CPU thread(s); jax "
                  f"{host.get('jax')}; pjrt platform {host.get('pjrt_platform')}, device {host.get('pjrt_device')}"
                  + (f"; CUDA {host['cuda']}" if host.get("cuda") else ""), highlight=False)
    console.print(f"passes per shape and target: {s['warmup_passes']} warm-up (the first is 'first pass'; "
                  f"none is in p50/p95) + {s['timed_passes']} timed, interleaved across targets", highlight=False)
    columns = ("target", "mode", "b x p", "TTFT ms p50/p95", "TPOT ms p50/p95", "first pass TTFT/TPOT ms",
               "tok/s decode/out", "compile s", "XLA exe", "peak mem", "$/M out", "= cpu f32", "status")
    cells, sections = [], []
    for r in report["rows"]:
        sections.append((r["batch_size"], r["prompt_length"]))
        equal = r["tokens_equal_cpu_float32"]
        status = "ok" if r["status"] == "ok" else f"[red]{r['status']}[/red]"  # the message is under the table
        if r["fallback_ops"]:
            status += f" [yellow](CPU fallback: {', '.join(r['fallback_ops'])})[/yellow]"
        cells.append((r["target"], r["mode"], f"{r['batch_size']}x{r['prompt_length']}",
                      _pair(r["ttft_p50_ms"], r["ttft_p95_ms"]), _pair(r["tpot_p50_ms"], r["tpot_p95_ms"]),
                      _pair(r["first_pass_ttft_ms"], r["first_pass_tpot_ms"]),
                      _pair(r["decode_tokens_per_s"], r["output_tokens_per_s"]),
                      bench._num(r["compile_s"], "{:,.2f}"),
                      "-" if r["executables_first_pass"] is None else f"{r['executables_first_pass']}/{r['executables_timed']}",
                      bench._bytes(r["peak_memory_bytes"]),
                      bench._num(r["usd_per_million_output_tokens"], "${:.3g}"),
                      "-" if equal is None else "yes" if equal else "[bold red]NO[/bold red]", status))
    table = Table()
    for i, col in enumerate(columns):
        # numbers keep their width (headers wrap instead); the status column takes what is left
        widest = max((Text.from_markup(row[i]).cell_len for row in cells), default=0) if col != "status" else None
        table.add_column(col, justify="left" if col in ("target", "mode", "status") else "right", min_width=widest)
    for i, row in enumerate(cells):
        if i and sections[i] != sections[i - 1]:
            table.add_section()
        table.add_row(*row)
    console.print(table)
    console.print("modes: eager = model.forward with the dynamic cache; compiled = static cache + "
                  "torch.compile(model.forward) (pjrt backend on pjrt, inductor elsewhere); reduce-overhead = the "
                  "same with mode=\"reduce-overhead\" (pjrt: a leaner per-call path; CUDA: CUDA graphs).",
                  highlight=False)
    console.print("TTFT: prefill forward + first token's argmax; TPOT: one decode forward with the KV cache + argmax; "
                  "each ends with the device's synchronize. decode tok/s = batch / mean TPOT; out tok/s = "
                  "batch x new tokens / whole generation (prefill included), the base of $/M out. compile s: "
                  "warm-up passes' time minus as many steady passes. first pass: eager pjrt compiles its executables "
                  "there (a few per KV-cache capacity: a power of two); later passes at the same shape reuse them. XLA exe: "
                  "first/timed, executables pjrt built (compiled, or loaded from the persistent cache) in the first pass / in all "
                  "timed passes (0: nothing compiled while measuring). = cpu f32: every pass's greedy tokens equal those of "
                  "an untimed torch CPU float32 eager pass.", highlight=False)
    console.print("peak mem: the model's weights + a timed pass's peak above its start "
                  "(pjrt/cuda: the allocator's max_memory_allocated; cpu: process RSS, coarse)", highlight=False)
    console.print(bench.prices_note(report), highlight=False)
    bench.print_load_warning(host, console)
    for r in report["rows"]:
        if r["tokens_equal_cpu_float32"] is False:
            console.print(f"[bold red]GREEDY TOKENS DIFFER: {r['target']} {r['mode']} ({r['dtype']}) batch "
                          f"{r['batch_size']} prompt {r['prompt_length']}: {escape(r['tokens_mismatch'])}[/bold red]",
                          highlight=False)
        if r["status"] == "error":
            console.print(f"[red]{r['target']} batch {r['batch_size']} prompt {r['prompt_length']}[/red]: "
                          f"{escape(r['error'])}", highlight=False)
        elif r["status"] == "unavailable" and r is _first_with_target(report, r["target"]):
            console.print(f"[yellow]{r['target']}: unavailable[/yellow] ({escape(r['error'])})", highlight=False)
    console.print(f"bench wall time: {report['wall_s']:.0f} s")


def _first_with_target(report: dict, target: str) -> dict:
    return next(r for r in report["rows"] if r["target"] == target)


def _load(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None else f"{_short_number(a)}/{_short_number(b)}"


def _short_number(x: float) -> str:
    """Three significant digits, never in scientific notation: 0.812, 51.7, 4,012."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


PLOT_PANELS = (("ttft_p50_ms", "ttft_p95_ms", "time to first token, ms"),
               ("tpot_p50_ms", "tpot_p95_ms", "time per output token, ms"),
               ("usd_per_million_output_tokens", None, "$ per million output tokens"))


def plot(report: dict, path: str | os.PathLike) -> None:
    """Three panels (TTFT, TPOT, $/M output tokens), a group of bars per (batch, prompt) and a
    bar per target, on log axes; latency whiskers reach up to the p95. The title names the
    platform, device, threads and load."""
    reason = bench.plot_unavailable()
    if reason:
        raise RuntimeError(reason)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    rows = report["rows"]
    targets = list(dict.fromkeys(r["target"] for r in rows))
    shapes = list(dict.fromkeys((r["batch_size"], r["prompt_length"]) for r in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(1, len(targets))
    fig, axes = plt.subplots(1, len(PLOT_PANELS), figsize=(max(9.0, 1.2 * len(shapes) * len(PLOT_PANELS) + 3), 3.8))
    for ax, (key, high_key, title) in zip(axes, PLOT_PANELS):
        for k, target in enumerate(targets):
            by_shape = {(r["batch_size"], r["prompt_length"]): r for r in rows if r["target"] == target}
            values = [(by_shape.get(sh) or {}).get(key) or math.nan for sh in shapes]
            highs = [(by_shape.get(sh) or {}).get(high_key) or math.nan for sh in shapes] if high_key else values
            xs = [i + (k - (len(targets) - 1) / 2) * width for i in range(len(shapes))]
            whiskers = [[0.0] * len(values), [max(0.0, h - v) if v == v and h == h else 0.0
                                              for v, h in zip(values, highs)]] if high_key else None
            ax.bar(xs, values, width, color=colors[k % len(colors)], label=target, yerr=whiskers, capsize=2,
                   error_kw={"elinewidth": 1})
            for x, shape in zip(xs, shapes):
                row = by_shape.get(shape)
                if row is not None and row["status"] != "ok":  # an empty slot says why
                    ax.text(x, 0.02, row["status"], rotation=90, ha="center", va="bottom", fontsize=7, color="red",
                            transform=ax.get_xaxis_transform())
        ax.set_yscale("log")
        ax.set_xticks(range(len(shapes)), [f"batch {b}\nprompt {p}" for b, p in shapes], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="y", which="both", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    host, s = report["host"], report["settings"]
    load, cpus = host.get("load_average_1min"), host.get("cpu_count") or 1
    busy = " (busy machine: noisy, ratios are not results)" if load is not None and load > cpus else ""
    fig.suptitle(f"torch-pjrt bench --workload llm: {s['model']}, {s['dtype']}, {s['new_tokens']} new tokens "
                 f"(whisker: p95)\npjrt on {host.get('pjrt_platform')}, {host.get('pjrt_device')}; "
                 f"{host.get('torch_threads')} torch threads; load {_load(host.get('load_average_1min'))} on "
                 f"{host.get('cpu_count')} CPUs{busy}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args, console) -> int:
    """`torch-pjrt bench --workload llm` (bench.main hands the parsed arguments over)."""
    from rich.markup import escape

    models = args.model or []
    if len(models) > 1:
        console.print("[red]torch-pjrt bench: --workload llm takes one --model[/red]", highlight=False)
        return 2
    try:
        report = run_llm_bench(model=models[0] if models else None, batch_sizes=args.batch_sizes,
                               prompt_lengths=args.prompt_lengths, new_tokens=args.new_tokens, modes=args.modes,
                               targets=args.targets, warmup=args.warmup, steps=args.steps, dtype=args.dtype,
                               quantization=args.quantize,
                               prices=bench.parse_prices(args.price), progress=not args.no_progress, cold=args.cold)
    except (ValueError, TypeError, ImportError, bench.Unavailable) as e:
        console.print(f"[red]torch-pjrt bench: {escape(str(e))}[/red]", highlight=False)
        return 2
    return bench.show(report, args, console, render, plot)
