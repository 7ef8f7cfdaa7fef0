"""What the audit knows: severities, categories, and the tables it classifies with.

`CUDA_APIS` maps dotted torch names (torch.cuda.*, torch.backends.cudnn/cuda.*, ...) to a
classification and, where a drop-in exists, the `torch.accelerator` name `--fix` rewrites
to. `PACKAGES` maps third-party CUDA-only packages, by import name and by distribution
name, to a classification. `CUDA_TOOLS` classifies the NVIDIA programs a project runs.
Every finding of the audit is classified through one of them or through the few syntactic
rules in audit.py (device strings, `.cuda()`, comparisons).

Entries also say whether the code, as `--fix` leaves it, still works where CUDA is absent
(`works_without_cuda`): a cuDNN flag or a seed does, an extension build or
`torch.cuda.get_device_name` does not. A guard (`if torch.cuda.is_available():`) over code
that does not is kept CUDA-specific by `--fix`.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Severity(enum.Enum):
    """How much work one finding costs, from none to a redesign. Ordered."""

    AUTOMATIC = "automatic"  # `torch-pjrt audit --fix` rewrites it
    SIMPLE_EDIT = "simple edit"  # a one-line change by hand
    NEEDS_PORT = "needs a port"  # code must be rewritten (kernels, fused libraries)
    NO_EQUIVALENT = "no equivalent"  # nothing to port to; drop the feature or redesign

    @property
    def rank(self) -> int:
        return list(Severity).index(self)

    @property
    def slug(self) -> str:
        return {"automatic": "automatic", "simple edit": "simple-edit",
                "needs a port": "needs-port", "no equivalent": "no-equivalent"}[self.value]

    @classmethod
    def from_slug(cls, slug: str) -> Severity:
        for severity in cls:
            if severity.slug == slug:
                return severity
        raise ValueError(f"unknown severity {slug!r}")


# Rough effort of one finding, in hours, used by the report's per-category estimate.
EFFORT_HOURS: dict[Severity, float] = {
    Severity.AUTOMATIC: 0.0,  # reviewing the --fix diff
    Severity.SIMPLE_EDIT: 0.25,
    Severity.NEEDS_PORT: 8.0,
    Severity.NO_EQUIVALENT: 16.0,
}

# Categories, with the one-line description the reports print.
CATEGORIES: dict[str, str] = {
    "device": "device placement: 'cuda' device strings, .cuda(), torch.device('cuda')",
    "device-check": "code that tests whether something is on CUDA",
    "torch.cuda": "torch.cuda API calls",
    "backend-flags": "torch.backends.cudnn / torch.backends.cuda flags",
    "amp": "CUDA automatic mixed precision APIs",
    "distributed": "NCCL process groups",
    "cuda-graphs": "CUDA graph capture",
    "nvtx": "NVTX profiler ranges",
    "custom-extension": "custom CUDA/C++ extensions",
    "triton": "Triton kernels",
    "cuda-library": "CUDA array and kernel libraries (CuPy, Numba CUDA, PyCUDA)",
    "third-party": "CUDA-only third-party libraries",
    "cuda-wheels": "requirements pinned to CUDA builds",
    "cuda-tools": "NVIDIA programs run from Python (nvidia-smi, nvcc)",
    "cuda-only": "code paths that need CUDA, behind guards (torch.cuda.is_available(), "
                 ".is_cuda) that --fix keeps CUDA-specific",
}

A = Severity.AUTOMATIC
S = Severity.SIMPLE_EDIT
P = Severity.NEEDS_PORT
N = Severity.NO_EQUIVALENT


@dataclass(frozen=True)
class Api:
    """One torch name bound to CUDA. `replacement` is set only for exact drop-ins."""

    category: str
    severity: Severity
    suggestion: str
    replacement: str | None = None
    works_without_cuda: bool = False  # as written: a flag, a seed, a deprecated alias

    def __post_init__(self) -> None:
        assert (self.replacement is not None) == (self.severity is A), self


def _auto(name: str) -> Api:
    return Api("torch.cuda", A, f"torch.accelerator.{name}", f"torch.accelerator.{name}")


_RECORD = "torch.profiler.record_function(name) (shows in the torch profiler and XLA traces)"
_GRAPHS = ("torch.compile(model, backend='pjrt'): XLA compiles the whole graph into one "
           "executable, which is what CUDA graphs buy")

# Keys are dotted names; a key also covers every name below it (torch.cuda.nvtx covers
# torch.cuda.nvtx.range_push) unless a longer key matches.
CUDA_APIS: dict[str, Api] = {
    # drop-in torch.accelerator equivalents (`--fix` rewrites these)
    "torch.cuda.is_available": _auto("is_available"),
    "torch.cuda.device_count": _auto("device_count"),
    "torch.cuda.current_device": _auto("current_device_index"),
    "torch.cuda.set_device": _auto("set_device_index"),
    "torch.cuda.synchronize": _auto("synchronize"),
    "torch.cuda.current_stream": _auto("current_stream"),
    "torch.cuda.set_stream": _auto("set_stream"),
    "torch.cuda.empty_cache": _auto("empty_cache"),
    "torch.cuda.memory_allocated": _auto("memory_allocated"),
    "torch.cuda.max_memory_allocated": _auto("max_memory_allocated"),
    "torch.cuda.memory_reserved": _auto("memory_reserved"),
    "torch.cuda.max_memory_reserved": _auto("max_memory_reserved"),
    "torch.cuda.memory_stats": _auto("memory_stats"),
    "torch.cuda.reset_peak_memory_stats": _auto("reset_peak_memory_stats"),
    "torch.cuda.reset_accumulated_memory_stats": _auto("reset_accumulated_memory_stats"),
    "torch.cuda.mem_get_info": _auto("get_memory_info"),
    # equivalents that need a small change by hand
    "torch.cuda.device": Api("torch.cuda", S, "torch.accelerator.device_index(index) (takes an int)"),
    "torch.cuda.Stream": Api("torch.cuda", S, "torch.Stream(device)"),
    "torch.cuda.Event": Api("torch.cuda", S, "torch.Event(device, enable_timing=...)"),
    "torch.cuda.stream": Api("torch.cuda", S, "torch.accelerator.set_stream(stream) or `with stream:`"),
    "torch.cuda.manual_seed": Api("torch.cuda", S, "torch.manual_seed(seed) (seeds every device)", works_without_cuda=True),
    "torch.cuda.manual_seed_all": Api("torch.cuda", S, "torch.manual_seed(seed) (seeds every device)", works_without_cuda=True),
    "torch.cuda.get_rng_state": Api("torch.cuda", S, "torch.pjrt.get_rng_state()"),
    "torch.cuda.set_rng_state": Api("torch.cuda", S, "torch.pjrt.set_rng_state(state)"),
    "torch.cuda.get_device_name": Api("torch.cuda", S, "torch.get_device_module().get_device_name(index) (the current accelerator's module)"),
    "torch.cuda.get_device_properties": Api("torch.cuda", S, "total memory: torch.accelerator.get_memory_info(index)[1]; the rest: torch.get_device_module().get_device_properties(index) (fields differ by device)"),
    "torch.cuda.get_device_capability": Api("torch.cuda", S, "torch.accelerator.get_device_capability() (returns a dict, not a tuple)"),
    "torch.cuda.is_bf16_supported": Api("torch.cuda", S, "torch.pjrt.is_bf16_supported()"),
    "torch.cuda.is_initialized": Api("torch.cuda", S, "torch.accelerator.is_available()", works_without_cuda=True),
    "torch.cuda.init": Api("torch.cuda", S, "remove: the pjrt device initialises on first use"),
    "torch.cuda.memory_summary": Api("torch.cuda", S, "torch.accelerator.memory_stats()"),
    "torch.cuda.FloatTensor": Api("torch.cuda", S, "torch.tensor(data, dtype=torch.float32, device=...)"),
    "torch.cuda.HalfTensor": Api("torch.cuda", S, "torch.tensor(data, dtype=torch.float16, device=...)"),
    "torch.cuda.LongTensor": Api("torch.cuda", S, "torch.tensor(data, dtype=torch.int64, device=...)"),
    "torch.cuda.IntTensor": Api("torch.cuda", S, "torch.tensor(data, dtype=torch.int32, device=...)"),
    "torch.cuda.BoolTensor": Api("torch.cuda", S, "torch.tensor(data, dtype=torch.bool, device=...)"),
    # no equivalent
    "torch.cuda.set_per_process_memory_fraction": Api("torch.cuda", N, "XLA_PYTHON_CLIENT_MEM_FRACTION in the environment, before start-up"),
    "torch.cuda.memory_snapshot": Api("torch.cuda", N, "torch.accelerator.memory_stats() gives totals only"),
    "torch.cuda.memory._record_memory_history": Api("torch.cuda", N, "jax.profiler.save_device_memory_profile"),
    "torch.cuda.utilization": Api("torch.cuda", N, "read the vendor's tools (nvidia-smi, tpu-info)"),
    "torch.cuda.temperature": Api("torch.cuda", N, "read the vendor's tools (nvidia-smi, tpu-info)"),
    "torch.cuda.power_draw": Api("torch.cuda", N, "read the vendor's tools (nvidia-smi, tpu-info)"),
    "torch.cuda.ipc_collect": Api("torch.cuda", N, "remove: CUDA IPC has no PJRT counterpart"),
    "torch.cuda.comm": Api("torch.cuda", N, "torch.distributed collectives with backend='pjrt'"),
    "torch.cuda.jiterator": Api("torch.cuda", N, "a plain torch function (torch.compile fuses it)"),
    "torch.cuda.cudart": Api("torch.cuda", N, "remove: no CUDA runtime under PJRT"),
    "torch.cuda.get_arch_list": Api("torch.cuda", N, "remove: PJRT compiles for the device it finds"),
    # the rest of torch.cuda: unknown to this table
    "torch.cuda": Api("torch.cuda", P, "not in the audit's table: look for a torch.accelerator or torch.pjrt counterpart"),
    # automatic mixed precision
    "torch.cuda.amp.autocast": Api("amp", S, "torch.autocast(device_type, dtype=...)", works_without_cuda=True),
    "torch.cuda.amp.GradScaler": Api("amp", S, "torch.amp.GradScaler(device_type)", works_without_cuda=True),
    "torch.cuda.amp.custom_fwd": Api("amp", S, "torch.amp.custom_fwd(device_type=...)", works_without_cuda=True),
    "torch.cuda.amp.custom_bwd": Api("amp", S, "torch.amp.custom_bwd(device_type=...)", works_without_cuda=True),
    "torch.cuda.amp": Api("amp", S, "torch.amp", works_without_cuda=True),
    # CUDA graphs
    "torch.cuda.graph": Api("cuda-graphs", P, _GRAPHS),
    "torch.cuda.CUDAGraph": Api("cuda-graphs", P, _GRAPHS),
    "torch.cuda.make_graphed_callables": Api("cuda-graphs", P, _GRAPHS),
    "torch.cuda.graph_pool_handle": Api("cuda-graphs", P, _GRAPHS),
    "torch.cuda.graphs": Api("cuda-graphs", P, _GRAPHS),
    # NVTX
    "torch.cuda.nvtx": Api("nvtx", S, _RECORD),
    # backend flags
    "torch.backends.cudnn.benchmark": Api("backend-flags", S, "remove: XLA chooses its own algorithms", works_without_cuda=True),
    "torch.backends.cudnn.deterministic": Api("backend-flags", S, "torch.use_deterministic_algorithms(True)", works_without_cuda=True),
    "torch.backends.cudnn.allow_tf32": Api("backend-flags", S, "torch.set_float32_matmul_precision('high')", works_without_cuda=True),
    "torch.backends.cudnn": Api("backend-flags", S, "remove: cuDNN flags have no effect off CUDA", works_without_cuda=True),
    "torch.backends.cuda.matmul.allow_tf32": Api("backend-flags", S, "torch.set_float32_matmul_precision('high')", works_without_cuda=True),
    "torch.backends.cuda.sdp_kernel": Api("backend-flags", S, "torch.nn.attention.sdpa_kernel(backends)", works_without_cuda=True),
    "torch.backends.cuda.enable_flash_sdp": Api("backend-flags", S, "torch.nn.attention.sdpa_kernel(backends)", works_without_cuda=True),
    "torch.backends.cuda.enable_mem_efficient_sdp": Api("backend-flags", S, "torch.nn.attention.sdpa_kernel(backends)", works_without_cuda=True),
    "torch.backends.cuda.enable_math_sdp": Api("backend-flags", S, "torch.nn.attention.sdpa_kernel(backends)", works_without_cuda=True),
    "torch.backends.cuda": Api("backend-flags", S, "remove: CUDA backend flags have no effect off CUDA", works_without_cuda=True),
    # distributed
    "torch.distributed.is_nccl_available": Api("distributed", S, "torch.distributed.is_backend_available('pjrt')", works_without_cuda=True),
    "torch.distributed.Backend.NCCL": Api("distributed", S, "backend='pjrt'"),
    # extensions
    "torch.utils.cpp_extension.CUDAExtension": Api("custom-extension", P, "port the kernels to torch ops, a torch.library custom op, or a Pallas/JAX kernel"),
    "torch.utils.cpp_extension.CUDA_HOME": Api("custom-extension", S, "remove: nothing is built against CUDA"),
}

# Calls whose first positional argument (or device_type=/device=) names a device type for
# mixed precision: a "cuda" there is an amp finding, not a device placement.
AMP_DEVICE_CALLS: frozenset[str] = frozenset({
    "torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler",
    "torch.get_autocast_dtype", "torch.is_autocast_enabled", "torch.set_autocast_enabled",
    "torch.amp.custom_fwd", "torch.amp.custom_bwd",
})


def lookup_api(name: str) -> Api | None:
    """The entry of CUDA_APIS for a dotted name, matching the longest key that covers it."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        api = CUDA_APIS.get(".".join(parts[:end]))
        if api is not None:
            return api
    return None


@dataclass(frozen=True)
class Package:
    """A third-party package that ties a project to CUDA."""

    name: str  # as printed
    imports: tuple[str, ...]  # import names (dotted prefixes)
    dists: tuple[str, ...]  # normalised distribution names; a trailing '*' is a prefix
    category: str
    severity: Severity
    suggestion: str
    works_without_cuda: bool = False


_SDPA = "torch.nn.functional.scaled_dot_product_attention"

# A more specific entry (apex.amp) comes before the general one (apex).
PACKAGES: tuple[Package, ...] = (
    Package("flash-attn", ("flash_attn",), ("flash-attn",), "third-party", S, _SDPA),
    Package("xformers", ("xformers",), ("xformers",), "third-party", S, _SDPA),
    Package("apex.amp", ("apex.amp",), (), "third-party", S, "torch.amp (autocast, GradScaler)"),
    Package("apex.optimizers", ("apex.optimizers",), (), "third-party", S, "torch.optim (AdamW, SGD, LAMB from a library)"),
    Package("apex.normalization", ("apex.normalization",), (), "third-party", S, "torch.nn.LayerNorm / torch.nn.RMSNorm"),
    Package("apex.parallel", ("apex.parallel",), (), "third-party", S, "torch.nn.parallel.DistributedDataParallel"),
    Package("apex", ("apex",), ("apex",), "third-party", P, "torch.amp, torch.optim and torch.nn counterparts, one module at a time"),
    Package("bitsandbytes", ("bitsandbytes",), ("bitsandbytes",), "third-party", P, "torch.optim optimizers; quantize with torchao"),
    Package("DeepSpeed ops", ("deepspeed.ops",), (), "third-party", P, "torch.optim optimizers and torch.nn layers"),
    Package("DeepSpeed", ("deepspeed",), ("deepspeed",), "third-party", P, "torch.distributed (FSDP) with backend='pjrt'; DeepSpeed's fused ops are CUDA kernels"),
    Package("vLLM", ("vllm",), ("vllm",), "third-party", N, "serve through another runtime; vLLM's kernels are CUDA/ROCm only"),
    Package("Transformer Engine", ("transformer_engine",), ("transformer-engine*",), "third-party", P, "torch.nn layers with torch.autocast"),
    Package("TensorRT", ("tensorrt", "torch_tensorrt"), ("tensorrt*", "torch-tensorrt"), "third-party", N, "torch.compile(backend='pjrt') or torch.export"),
    Package("pynvml", ("pynvml",), ("pynvml", "nvidia-ml-py*"), "third-party", N, "torch.accelerator.memory_stats() for memory; vendor tools for the rest"),
    Package("NVTX", ("nvtx",), ("nvtx",), "nvtx", S, _RECORD, works_without_cuda=True),
    Package("Triton", ("triton",), ("triton",), "triton", P, "a torch function under torch.compile(backend='pjrt'), or a Pallas kernel"),
    Package("CuPy", ("cupy", "cupyx"), ("cupy*",), "cuda-library", P, "torch or jax.numpy on the pjrt device"),
    Package("Numba CUDA", ("numba.cuda",), ("numba-cuda",), "cuda-library", P, "torch or jax.numpy; kernels as Pallas"),
    Package("PyCUDA", ("pycuda",), ("pycuda",), "cuda-library", P, "torch or jax.numpy; kernels as Pallas"),
    Package("NVIDIA wheels", (), ("nvidia-*",), "cuda-wheels", S, "drop it: the PJRT plugin (jax[cuda12], libtpu, ...) brings its own runtime"),
)

# Decorators that mark a function as a device kernel: (dotted name, package name).
KERNEL_DECORATORS: dict[str, str] = {"triton.jit": "Triton", "numba.cuda.jit": "Numba CUDA"}

# NVIDIA programs, by executable name, that a project may start (subprocess, os.system).
CUDA_TOOLS: dict[str, Api] = {
    "nvidia-smi": Api("cuda-tools", S, "memory: torch.accelerator.get_memory_info() or "
                      "memory_stats(); the rest: the platform's own tool (rocm-smi, tpu-info)"),
    "nvcc": Api("cuda-tools", S, "nothing is compiled for PJRT: `torch-pjrt doctor` or "
                "jax.devices() reports the platform"),
}

# Calls that start a program: their first argument (or args=) is the command line.
PROCESS_CALLS: frozenset[str] = frozenset({
    "subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output",
    "subprocess.Popen", "subprocess.getoutput", "subprocess.getstatusoutput",
    "os.system", "os.popen",
})


def normalize_dist(name: str) -> str:
    """PEP 503 normalisation of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def package_named(name: str) -> Package:
    return next(package for package in PACKAGES if package.name == name)


def package_for_import(module: str) -> Package | None:
    for package in PACKAGES:
        for prefix in package.imports:
            if module == prefix or module.startswith(prefix + "."):
                return package
    return None


def package_for_dist(dist: str) -> Package | None:
    dist = normalize_dist(dist)
    for package in PACKAGES:
        for pattern in package.dists:
            if pattern.endswith("*") and dist.startswith(pattern[:-1]) or dist == pattern:
                return package
    return None
