"""torch-pjrt audit: exact findings on the fixture projects, the false-positive traps,
the source-preserving --fix, and the command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_pjrt.cli import main
from torch_pjrt.tools.audit import audit, scan_python, summarize, to_json, to_markdown
from torch_pjrt.tools.audit_fix import apply_edits, unified_diff, write_fixes
from torch_pjrt.tools.audit_rules import CUDA_APIS, Severity, lookup_api

FIXTURES = Path(__file__).parent / "fixtures" / "audit"
REPO = FIXTURES / "cuda_train_repo"
SMALL = FIXTURES / "small_project"
KERNEL = FIXTURES / "cuda_kernel_project"
TREE = Path(__file__).resolve().parents[1]  # this checkout: subprocesses import torch_pjrt from it

# Each line was checked by hand against the fixture: (location, category, severity, message).
REPO_FINDINGS = [
    ('csrc/fused_bias_gelu.cpp:3', 'custom-extension', 'needs a port', 'C++ source includes CUDA headers (#include <c10/cuda/CUDAGuard.h>)'),
    ('csrc/fused_bias_gelu_kernel.cu:1', 'custom-extension', 'needs a port', 'CUDA source (1 __global__ kernel)'),
    ('model/attention.py:12', 'third-party', 'simple edit', 'imports flash-attn'),
    ('model/attention.py:18', 'third-party', 'simple edit', 'imports xformers'),
    ('model/attention.py:34', 'cuda-only', 'simple edit', '.is_cuda guards code that needs CUDA: flash_attn_func (flash-attn) (line 35)'),
    ('model/attention.py:36', 'cuda-only', 'simple edit', "compares a device with 'cuda' guards code that needs CUDA: xops.memory_efficient_attention (xformers) (line 37); xops.LowerTriangularMask (xformers) (line 37)"),
    ('model/kernels.py:2', 'triton', 'needs a port', 'imports Triton'),
    ('model/kernels.py:6', 'triton', 'needs a port', 'Triton kernel `softmax_kernel`'),
    ('model/layers.py:3', 'third-party', 'simple edit', 'imports apex.normalization'),
    ('model/layers.py:7', 'custom-extension', 'needs a port', 'cpp_extension.load builds .cu sources'),
    ('model/layers.py:24', 'custom-extension', 'needs a port', 'load_inline with cuda_sources builds a CUDA extension'),
    ('notebooks/explore.ipynb[cell 2]:1', 'third-party', 'needs a port', 'requires bitsandbytes'),
    ('notebooks/explore.ipynb[cell 2]:1', 'third-party', 'simple edit', 'requires flash-attn'),
    ('notebooks/explore.ipynb[cell 3]:4', 'device', 'automatic', "device 'cuda'"),
    ('notebooks/explore.ipynb[cell 3]:4', 'torch.cuda', 'automatic', 'torch.cuda.is_available'),
    ('notebooks/explore.ipynb[cell 3]:5', 'torch.cuda', 'simple edit', 'torch.cuda.get_device_name'),
    ('notebooks/explore.ipynb[cell 4]:3', 'amp', 'simple edit', "autocast for device type 'cuda'"),
    ('notebooks/explore.ipynb[cell 5]:2', 'torch.cuda', 'simple edit', 'torch.cuda.memory_summary'),
    ('pyproject.toml:6', 'third-party', 'simple edit', 'requires xformers'),
    ('pyproject.toml:7', 'triton', 'needs a port', 'requires triton'),
    ('pyproject.toml:11', 'third-party', 'simple edit', 'requires deepspeed, never imported'),
    ('requirements-dev.txt:3', 'cuda-library', 'simple edit', 'requires cupy-cuda12x, never imported'),
    ('requirements-dev.txt:4', 'third-party', 'simple edit', 'requires nvidia-ml-py, never imported'),
    ('requirements.txt:2', 'cuda-wheels', 'simple edit', 'CUDA wheel index https://download.pytorch.org/whl/cu118'),
    ('requirements.txt:3', 'cuda-wheels', 'simple edit', 'torch==2.1.0+cu118 is a CUDA build'),
    ('requirements.txt:5', 'third-party', 'simple edit', 'requires flash-attn'),
    ('requirements.txt:6', 'third-party', 'needs a port', 'requires apex'),
    ('requirements.txt:7', 'third-party', 'needs a port', 'requires bitsandbytes'),
    ('setup.py:13', 'custom-extension', 'needs a port', 'torch.utils.cpp_extension.CUDAExtension'),
    ('train.py:15', 'third-party', 'needs a port', 'imports bitsandbytes'),
    ('train.py:20', 'backend-flags', 'simple edit', 'torch.backends.cudnn.benchmark'),
    ('train.py:21', 'backend-flags', 'simple edit', 'torch.backends.cuda.matmul.allow_tf32'),
    ('train.py:26', 'device', 'simple edit', "command-line default 'cuda'"),
    ('train.py:35', 'device', 'automatic', '.cuda()'),
    ('train.py:38', 'amp', 'simple edit', 'torch.cuda.amp.GradScaler'),
    ('train.py:43', 'device', 'automatic', "device 'cuda'"),
    ('train.py:44', 'amp', 'simple edit', 'torch.cuda.amp.autocast'),
    ('train.py:51', 'torch.cuda', 'automatic', 'torch.cuda.synchronize'),
    ('train.py:52', 'torch.cuda', 'automatic', 'torch.cuda.max_memory_allocated'),
    ('train.py:57', 'device', 'simple edit', "device 'cuda:0'"),
    ('utils/dist.py:11', 'cuda-only', 'simple edit', 'torch.distributed.is_nccl_available guards code that needs CUDA: NCCL process group backend (line 11)'),
    ('utils/dist.py:11', 'distributed', 'simple edit', 'NCCL process group backend'),
    ('utils/dist.py:13', 'torch.cuda', 'automatic', 'torch.cuda.set_device'),
    ('utils/dist.py:14', 'torch.cuda', 'simple edit', 'torch.cuda.manual_seed_all'),
    ('utils/dist.py:19', 'device', 'simple edit', 'device string f"cuda:{rank}"'),
    ('utils/dist.py:23', 'distributed', 'simple edit', 'NCCL process group backend'),
    ('utils/dist.py:29', 'cuda-only', 'simple edit', 'torch.cuda.is_available guards code that needs CUDA: torch.cuda.get_device_name (line 30)'),
    ('utils/dist.py:30', 'torch.cuda', 'simple edit', 'torch.cuda.device_count'),
    ('utils/dist.py:30', 'torch.cuda', 'simple edit', 'torch.cuda.get_device_name'),
    ('utils/env.py:21', 'cuda-tools', 'simple edit', 'runs nvcc'),
    ('utils/env.py:40', 'device-check', 'simple edit', "compares a device with 'cuda'"),
    ('utils/profiling.py:3', 'nvtx', 'simple edit', 'imports NVTX'),
    ('utils/profiling.py:9', 'nvtx', 'simple edit', 'torch.cuda.nvtx.range_push'),
    ('utils/profiling.py:13', 'nvtx', 'simple edit', 'torch.cuda.nvtx.range_pop'),
    ('utils/profiling.py:18', 'torch.cuda', 'simple edit', 'torch.cuda.Event'),
    ('utils/profiling.py:19', 'torch.cuda', 'simple edit', 'torch.cuda.Event'),
    ('utils/profiling.py:24', 'torch.cuda', 'automatic', 'torch.cuda.synchronize'),
    ('utils/profiling.py:30', 'device', 'automatic', '.cuda()'),
    ('utils/profiling.py:31', 'cuda-graphs', 'needs a port', 'torch.cuda.CUDAGraph'),
    ('utils/profiling.py:32', 'cuda-graphs', 'needs a port', 'torch.cuda.graph'),
    ('utils/profiling.py:43', 'cuda-graphs', 'needs a port', 'torch.cuda.make_graphed_callables'),
]

# A project whose CUDA kernel and nvidia-smi call sit behind guards that --fix must keep.
KERNEL_FINDINGS = [
    ('gpu_info.py:8', 'cuda-only', 'simple edit', 'torch.cuda.is_available guards code that needs CUDA: torch.cuda.get_device_properties (line 10); runs nvidia-smi (line 11)'),
    ('gpu_info.py:10', 'torch.cuda', 'simple edit', 'torch.cuda.get_device_properties'),
    ('gpu_info.py:11', 'cuda-tools', 'simple edit', 'runs nvidia-smi'),
    ('gpu_info.py:17', 'torch.cuda', 'automatic', 'torch.cuda.is_available'),
    ('gpu_info.py:17', 'torch.cuda', 'automatic', 'torch.cuda.max_memory_allocated'),
    ('kernels.py:18', 'cuda-only', 'needs a port', 'torch.cuda.is_available guards code that needs CUDA: load_inline with cuda_sources builds a CUDA extension (line 19)'),
    ('kernels.py:19', 'custom-extension', 'needs a port', 'load_inline with cuda_sources builds a CUDA extension'),
    ('kernels.py:26', 'cuda-only', 'simple edit', '.is_cuda guards code that needs CUDA: _ext.fused_scale (a CUDA extension) (line 27)'),
    ('requirements.txt:2', 'third-party', 'simple edit', 'requires pynvml, never imported'),
    ('train.py:14', 'backend-flags', 'simple edit', 'torch.backends.cudnn.benchmark'),
    ('train.py:15', 'backend-flags', 'simple edit', 'torch.backends.cuda.matmul.allow_tf32'),
    ('train.py:17', 'device', 'automatic', "device 'cuda'"),
    ('train.py:25', 'amp', 'simple edit', 'torch.cuda.amp.GradScaler'),
    ('train.py:25', 'torch.cuda', 'automatic', 'torch.cuda.is_available'),
    ('train.py:26', 'device', 'automatic', '.cuda()'),
    ('train.py:30', 'amp', 'simple edit', 'torch.cuda.amp.autocast'),
    ('train.py:30', 'torch.cuda', 'automatic', 'torch.cuda.is_available'),
    ('train.py:37', 'torch.cuda', 'automatic', 'torch.cuda.is_available'),
    ('train.py:38', 'torch.cuda', 'automatic', 'torch.cuda.synchronize'),
]

SMALL_FINDINGS = [
    ('gpu.py:6', 'device', 'automatic', '.cuda()'),
    ('model.py:5', 'device', 'automatic', "device 'cuda'"),
    ('model.py:20', 'torch.cuda', 'simple edit', 'torch.cuda.manual_seed_all'),
    ('model.py:25', 'device-check', 'simple edit', "compares a device with 'cuda'"),
    ('train.py:7', 'backend-flags', 'simple edit', 'torch.backends.cudnn.benchmark'),
    ('train.py:10', 'device', 'automatic', "device 'cuda'"),
    ('train.py:23', 'torch.cuda', 'automatic', 'torch.cuda.is_available'),
    ('train.py:24', 'torch.cuda', 'automatic', 'torch.cuda.synchronize'),
    ('train.py:29', 'device', 'automatic', '.cuda()'),
    ('train.py:32', 'device', 'automatic', "torch.device('cuda')"),
    ('train.py:34', 'torch.cuda', 'automatic', 'torch.cuda.is_available'),
    ('train.py:34', 'torch.cuda', 'automatic', 'torch.cuda.max_memory_allocated'),
]


def rows(path: Path) -> list[tuple[str, str, str, str]]:
    return [(f.location, f.category, f.severity.value, f.message) for f in audit(path).findings]


def test_cuda_train_repo_findings_are_exact() -> None:
    assert rows(REPO) == REPO_FINDINGS


def test_small_project_findings_are_exact() -> None:
    assert rows(SMALL) == SMALL_FINDINGS


def test_cuda_kernel_project_findings_are_exact() -> None:
    assert rows(KERNEL) == KERNEL_FINDINGS


def test_every_file_of_the_repo_is_scanned() -> None:
    report = audit(REPO)
    # 10 .py (3 __init__/empty included), 1 notebook, 2 requirements, pyproject, .cu, .cpp
    assert report.files_scanned == 16
    assert report.skipped == []


def test_traps_file_has_only_its_real_findings() -> None:
    found = [f for f in audit(REPO).findings if f.path == "utils/env.py"]
    assert [(f.line, f.category) for f in found] == [(21, "cuda-tools"), (40, "device-check")]


def findings(source: str) -> list[tuple[int, str, str]]:
    return [(f.line, f.category, f.severity.value) for f in scan_python(source, "x.py")[0]]


def fixed(source: str) -> str:
    return apply_edits(source, scan_python(source, "x.py")[1])


@pytest.mark.parametrize("source", [
    "# x.cuda(); torch.cuda.synchronize(); device='cuda'\nx = 1\n",
    '"""Runs on cuda: call model.cuda() first."""\n',
    'cuda_version = "12.1"\nname = "cuda"\nbackends = ["cuda", "cpu"]\n',
    'print("cuda")\nlog.info("moving to cuda:0")\nd = {"cuda": 1}\n',
    'if backend == "cuda":\n    pass\n',
    # pinned memory is the current accelerator's (pjrt's too); without one DataLoader skips it
    'loader = DataLoader(ds, pin_memory=True)\nx = t.pin_memory()\n',
    'import subprocess\nsubprocess.run(["ls", "nvidia-smi"])\nprint("nvidia-smi")\n',
    'def cuda_toolkit(kind="cuda"):\n    return kind\n',
    'import torch\nv = torch.version.cuda\nok = torch.backends.mps.is_available()\n',
    'x = obj.cuda_graphs_enabled\ny = torch.device("cpu")\nz = t.to("cpu")\n',
    'from numba import njit\nimport numpy\n',
    'device_name = "cuda 12.1 on an A100"\nx = t.to(dtype="cuda_like")\n',
])
def test_false_positive_traps(source: str) -> None:
    assert findings(source) == []


def test_device_positions() -> None:
    source = (
        'import torch\n'
        'a = torch.zeros(2, device="cuda")\n'           # keyword
        'b = a.to("cuda")\n'                            # .to
        'c = torch.device("cuda")\n'                    # torch.device
        'device = "cuda" if ok else "cpu"\n'            # device-named variable
        'def f(x, dev="cuda:1"):\n    return x\n'      # parameter default
        'same = a.device.type == "cuda"\n'              # comparison
        'd = torch.load("m.pt", map_location="cuda")\n'
        'e = a.cuda(1)\n'                               # device index: by hand
        'g = torch.device("cuda", 1)\n'
        'torch.set_default_device("cuda")\n'
    )
    assert findings(source) == [
        (2, "device", "automatic"), (3, "device", "automatic"), (4, "device", "automatic"),
        (5, "device", "automatic"), (6, "device", "simple edit"),
        (8, "device-check", "simple edit"), (9, "device", "automatic"),
        (10, "device", "simple edit"), (11, "device", "simple edit"),
        (12, "device", "automatic"),
    ]


def test_names_resolve_through_imports() -> None:
    source = (
        "import torch as th\n"
        "from torch import cuda\n"
        "from torch.cuda import synchronize\n"
        "from torch.cuda.amp import autocast\n"
        "th.cuda.synchronize()\n"   # rewritable: written through the torch module
        "cuda.synchronize()\n"      # equivalent exists, but not written as torch.cuda.*
        "synchronize()\n"
        "with autocast():\n    pass\n"
        "th.cuda.not_a_real_api()\n"
    )
    assert findings(source) == [
        (5, "torch.cuda", "automatic"), (6, "torch.cuda", "simple edit"),
        (7, "torch.cuda", "simple edit"), (8, "amp", "simple edit"),
        (10, "torch.cuda", "needs a port"),
    ]
    assert fixed(source).splitlines()[4] == "th.accelerator.synchronize()"
    assert fixed(source).splitlines()[5:] == source.splitlines()[5:]


def test_libraries_and_kernels() -> None:
    source = (
        "import cupy as cp\n"
        "from numba import cuda\n"
        "import triton\n"
        "import triton.language as tl\n"   # same package, same file: one finding
        "from apex import amp\n"
        "from apex.optimizers import FusedAdam\n"
        "import deepspeed.ops.adam\n"
        "import vllm\n"
        "@cuda.jit\ndef add(a, b):\n    pass\n"
        "@triton.jit\ndef k(x):\n    pass\n"
        "import torch.distributed as dist\n"
        'dist.init_process_group("nccl")\n'
        "import subprocess, os\n"
        "import torch\n"
        "torch.cuda.nvtx.range_push('x')\n"
        "g = torch.cuda.CUDAGraph()\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        'with torch.autocast(device_type="cuda"):\n    pass\n'
        "torch.backends.cudnn.deterministic = True\n"
    )
    assert findings(source) == [
        (1, "cuda-library", "needs a port"), (2, "cuda-library", "needs a port"),
        (3, "triton", "needs a port"), (5, "third-party", "simple edit"),
        (6, "third-party", "simple edit"), (7, "third-party", "needs a port"),
        (8, "third-party", "no equivalent"), (9, "cuda-library", "needs a port"),
        (12, "triton", "needs a port"), (16, "distributed", "simple edit"),
        (19, "nvtx", "simple edit"),
        (20, "cuda-graphs", "needs a port"), (21, "amp", "simple edit"),
        (22, "amp", "simple edit"), (24, "backend-flags", "simple edit"),
    ]


def test_fix_is_source_preserving() -> None:
    source = (
        "import torch\r\n"
        's = "é"; x = t.cuda(non_blocking=True)  # é before the call: byte vs char columns\r\n'
        "y = t.to(\r\n    'cuda',  # keep this comment\r\n)\r\n"
        "if torch.cuda.is_available(): torch.cuda.synchronize()\r\n"
        "torch.cuda.manual_seed_all(0)\r\n"
    )
    assert fixed(source) == (
        "import torch\r\n"
        's = "é"; x = t.to(torch.accelerator.current_accelerator(), non_blocking=True)'
        "  # é before the call: byte vs char columns\r\n"
        "y = t.to(\r\n    torch.accelerator.current_accelerator(),  # keep this comment\r\n)\r\n"
        "if torch.accelerator.is_available(): torch.accelerator.synchronize()\r\n"
        "torch.cuda.manual_seed_all(0)\r\n"
    )


def test_fix_adds_import_torch_where_missing() -> None:
    assert fixed('"""Doc."""\nimport os\n\nx = t.cuda()\n') == (
        '"""Doc."""\nimport torch\nimport os\n\nx = t.to(torch.accelerator.current_accelerator())\n')
    assert fixed("x = t.cuda()\n") == (
        "import torch\nx = t.to(torch.accelerator.current_accelerator())\n")


def test_every_automatic_entry_has_a_real_replacement() -> None:
    import torch

    for name, api in CUDA_APIS.items():
        if api.severity is Severity.AUTOMATIC:
            assert api.replacement is not None
            module, attr = api.replacement.rsplit(".", 1)
            assert module == "torch.accelerator" and hasattr(torch.accelerator, attr), name
    assert lookup_api("torch.cuda.nvtx.range_push") is CUDA_APIS["torch.cuda.nvtx"]
    assert lookup_api("torch.cuda.some_new_api") is CUDA_APIS["torch.cuda"]
    assert lookup_api("torch.mps.synchronize") is None


SMALL_DIFF = """\
--- a/gpu.py
+++ b/gpu.py
@@ -1,6 +1,7 @@
 \"\"\"Helpers that move tensors to the GPU.\"\"\"
 from __future__ import annotations
+import torch
 
 
 def to_gpu(*tensors):
-    return tuple(t.cuda() for t in tensors)
+    return tuple(t.to(torch.accelerator.current_accelerator()) for t in tensors)
--- a/model.py
+++ b/model.py
@@ -2,7 +2,7 @@
 import torch
 from torch import nn
 
-DEVICE = "cuda"  # the production default; "cuda" in this comment is not a device
+DEVICE = torch.accelerator.current_accelerator()  # the production default; "cuda" in this comment is not a device
 
 
 class TinyNet(nn.Module):
--- a/train.py
+++ b/train.py
@@ -7,7 +7,7 @@
 torch.backends.cudnn.benchmark = True  # --fix leaves this (harmless) flag alone
 
 
-def make_batch(n: int = 64, device="cuda"):
+def make_batch(n: int = 64, device=torch.accelerator.current_accelerator()):
     g = torch.Generator().manual_seed(0)
     x = torch.randn(n, 8, generator=g)
     y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
@@ -20,17 +20,17 @@
     loss = F.cross_entropy(model(x), y)
     loss.backward()
     opt.step()
-    if torch.cuda.is_available():
-        torch.cuda.synchronize()
+    if torch.accelerator.is_available():
+        torch.accelerator.synchronize()
     return loss.item()
 
 
 def train(steps: int = 30):
-    model = build().cuda()
+    model = build().to(torch.accelerator.current_accelerator())
     opt = torch.optim.SGD(model.parameters(), lr=0.5)
     x, y = make_batch()
-    mask = torch.ones(len(y), dtype=torch.bool, device=torch.device("cuda"))
+    mask = torch.ones(len(y), dtype=torch.bool, device=torch.accelerator.current_accelerator())
     losses = [train_step(model, opt, x[mask], y[mask]) for _ in range(steps)]
-    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
+    peak = torch.accelerator.max_memory_allocated() if torch.accelerator.is_available() else 0
     print(f"final loss {losses[-1]:.3f}, peak memory {peak} bytes")
     return model, losses
"""


def test_fix_diff_of_the_small_project_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    assert unified_diff(audit(SMALL)) == SMALL_DIFF
    assert main(["audit", str(SMALL), "--fix"]) == 0
    assert capsys.readouterr().out == SMALL_DIFF


# The fixed copy's own tests run on the device that torch.accelerator reports. "cpu": pjrt's
# autoload is off, so there is no accelerator; "pjrt": autoloaded, pjrt is the accelerator.
DEVICE_ENVIRONMENTS = {"cpu": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, "pjrt": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}}


def device_environment(device: str) -> dict[str, str]:
    """The environment of a subprocess that runs a project on `device`, with torch_pjrt
    imported from this checkout."""
    pythonpath = os.pathsep.join(filter(None, [str(TREE), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **DEVICE_ENVIRONMENTS[device], "PYTHONPATH": pythonpath}


def run_project_tests(project: Path, device: str) -> subprocess.CompletedProcess[str]:
    env = {**device_environment(device), "TINYNET_EXPECT_DEVICE": device}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_tinynet.py"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300)


def accelerator_without_pjrt() -> str:
    """What torch.accelerator reports with pjrt's autoload off: "None" for a CPU-only torch
    build, "cuda" for a CUDA build even on a machine with no GPU (torch reports the compiled-in
    accelerator, not an available one)."""
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.accelerator.current_accelerator())"],
                          env=device_environment("cpu"), capture_output=True, text=True,
                          timeout=300, check=True).stdout.strip()


@pytest.mark.parametrize("device", sorted(DEVICE_ENVIRONMENTS))
def test_fixed_copy_passes_its_own_tests(tmp_path: Path, device: str) -> None:
    if device == "cpu" and (found := accelerator_without_pjrt()) != "None":
        # The "cpu" environment means a torch without an accelerator. A CUDA (or ROCm, XPU) build
        # reports its accelerator even where no GPU is present, so the original and the fixed
        # project both target it, as they should, and fail without one: no CPU run to check here.
        pytest.skip(f"torch reports accelerator {found} without pjrt: this torch build is not CPU-only")
    copy = tmp_path / "small_project"
    shutil.copytree(SMALL, copy)
    if device == "cpu":  # without CUDA the original fails: the fix is what makes it pass
        before = run_project_tests(copy, device)
        assert before.returncode != 0 and "3 failed, 1 passed" in before.stdout, before.stdout
    assert main(["audit", str(copy), "--write"]) == 0
    assert [(f.location, f.severity.value) for f in audit(copy).findings
            if f.severity is Severity.AUTOMATIC] == []
    after = run_project_tests(copy, device)
    assert after.returncode == 0 and "4 passed" in after.stdout, after.stdout + after.stderr
    # what --fix does not touch is still there, byte for byte
    assert "torch.cuda.manual_seed_all(0)" in (copy / "model.py").read_text()
    assert 'return t.device.type == "cuda"' in (copy / "model.py").read_text()


def test_write_returns_the_rewritten_files(tmp_path: Path) -> None:
    copy = tmp_path / "p"
    shutil.copytree(SMALL, copy)
    assert write_fixes(audit(copy)) == ["gpu.py", "model.py", "train.py"]
    assert write_fixes(audit(copy)) == []  # a second run has nothing left to rewrite


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(REPO), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(to_json(audit(REPO))))
    assert [(f["path"], f["cell"], f["line"], f["category"], f["severity"])
            for f in data["findings"]][:2] == [
        ("csrc/fused_bias_gelu.cpp", None, 3, "custom-extension", "needs a port"),
        ("csrc/fused_bias_gelu_kernel.cu", None, 1, "custom-extension", "needs a port")]
    by_category = {s["category"]: s for s in data["summary"]}
    assert by_category["torch.cuda"]["by_severity"] == {
        "automatic": 5, "simple edit": 7, "needs a port": 0, "no equivalent": 0}
    # automatic ones cost nothing; utils/dist.py:30's two share their CUDA-only path's effort
    assert by_category["torch.cuda"]["effort_hours"] == 6 * 0.25
    # a package counts once: flash-attn, xformers, apex.normalization (simple edits),
    # bitsandbytes, apex (ports); DeepSpeed and nvidia-ml-py are required but never
    # imported: removing the requirement is a simple edit
    assert by_category["third-party"]["effort_hours"] == 0.25 * 3 + 8 * 2 + 0.25 * 2
    assert [f["effort_key"] for f in data["findings"] if f["path"] == "requirements.txt"] == [
        None, None, "flash-attn", "apex", "bitsandbytes"]
    assert data["effort_hours"] == sum(s["effort_hours"] for s in data["summary"])
    assert sum(s["findings"] for s in data["summary"]) == len(REPO_FINDINGS)


def test_markdown_output() -> None:
    text = to_markdown(audit(REPO))
    assert text.startswith("# CUDA lock-in audit of `cuda_train_repo`\n")
    assert f"{len(REPO_FINDINGS)} findings in 16 files scanned; 9 can be rewritten" in text
    assert "| custom-extension | 5 | 0 | 0 | 5 | 0 | 5.0 days |" in text
    assert "| `notebooks/explore.ipynb[cell 3]:4` | device | automatic |" in text
    assert [s.category for s in summarize(audit(REPO))][:3] == ["device", "device-check",
                                                                "torch.cuda"]


def test_table_output_and_fail_on(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(SMALL)]) == 0
    out = capsys.readouterr().out
    assert "12 findings in 4 files; 9 fixable with --fix" in out
    assert main(["audit", str(SMALL), "--fail-on", "simple-edit"]) == 1
    assert main(["audit", str(SMALL), "--fail-on", "needs-port"]) == 0
    assert main(["audit", str(REPO), "--fail-on", "needs-port", "--json"]) == 1
    assert main(["audit", str(REPO), "--fail-on", "no-equivalent", "--json"]) == 0


def kept(source: str) -> list[tuple[int, str, str]]:
    """The findings of `source` as (line, category, message) and whether --fix changes it."""
    return [(f.line, f.category, f.message) for f in scan_python(source, "x.py").findings]


def test_guard_over_code_that_needs_cuda_is_kept() -> None:
    source = (
        "import torch\n"
        "from torch.utils.cpp_extension import load_inline\n"
        "if torch.cuda.is_available():\n"
        "    ext = load_inline(name='k', cpp_sources='', cuda_sources=SRC)\n"
        "def f(x):\n"
        "    if x.is_cuda:\n"
        "        return ext.k(x)\n"
        "    return x\n"
    )
    assert fixed(source) == source  # neither guard flips: pjrt would run the CUDA path
    assert kept(source) == [
        (3, "cuda-only", "torch.cuda.is_available guards code that needs CUDA: "
                         "load_inline with cuda_sources builds a CUDA extension (line 4)"),
        (4, "custom-extension", "load_inline with cuda_sources builds a CUDA extension"),
        (6, "cuda-only", ".is_cuda guards code that needs CUDA: ext.k (a CUDA extension) (line 7)"),
    ]


@pytest.mark.parametrize("source, guard_line", [
    # the CUDA-only code after an early exit is what the negated test guards
    ("import torch, subprocess\ndef mem():\n    if not torch.cuda.is_available():\n"
     "        return 0\n    return subprocess.check_output('nvidia-smi -q', shell=True)\n", 3),
    ('import torch\ndef name(x):\n    if x.device.type != "cuda":\n        return "cpu"\n'
     "    else:\n        return torch.cuda.get_device_name(0)\n", 3),
    ('import torch\ndevice = "cuda:1" if torch.cuda.device_count() > 1 else "cpu"\n', 2),
])
def test_guard_forms(source: str, guard_line: int) -> None:
    assert fixed(source) == source
    assert [line for line, category, _ in kept(source) if category == "cuda-only"] == [guard_line]


def test_guard_through_a_flag_or_a_helper_keeps_its_definition() -> None:
    source = (
        "import torch\n"
        "USE_CUDA = torch.cuda.is_available()\n"
        "def has_gpu():\n"
        "    return torch.cuda.device_count() > 0\n"
        "if USE_CUDA:\n"
        "    ext = torch.utils.cpp_extension.load_inline(name='k', cpp_sources='', cuda_sources=S)\n"
        "if has_gpu():\n"
        "    torch.cuda.synchronize()\n"
    )
    # USE_CUDA stays a CUDA check; has_gpu() guards portable code, so it moves
    assert fixed(source) == source.replace("cuda.device_count", "accelerator.device_count"
                                           ).replace("cuda.synchronize", "accelerator.synchronize")
    assert kept(source)[:2] == [
        (4, "torch.cuda", "torch.cuda.device_count"),
        (5, "cuda-only", "torch.cuda.is_available (through USE_CUDA) guards code that needs "
                         "CUDA: load_inline with cuda_sources builds a CUDA extension (line 6)")]


def test_guard_over_portable_code_is_rewritten_and_nesting_is_innermost_first() -> None:
    source = (
        "import torch\n"
        "if torch.cuda.is_available():\n"        # holds only portable code once fixed
        "    torch.cuda.synchronize()\n"
        "    if x.is_cuda:\n"                     # holds a CUDA-only call: kept
        "        print(torch.cuda.get_device_name(0))\n"
    )
    assert fixed(source) == (
        "import torch\n"
        "if torch.accelerator.is_available():\n"
        "    torch.accelerator.synchronize()\n"
        "    if x.is_cuda:\n"
        "        print(torch.cuda.get_device_name(0))\n"
    )
    assert [c for _, c, _ in kept(source)] == ["torch.cuda", "torch.cuda", "cuda-only",
                                               "torch.cuda"]


def test_cuda_tools_are_flagged() -> None:
    source = (
        "import os, subprocess\n"
        'subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv"])\n'
        'subprocess.check_output(args=("/usr/local/cuda/bin/nvcc", "--version"))\n'
        'os.system("nvidia-smi -L")\n'
        'os.popen(f"nvcc {flags}")\n'
    )
    assert kept(source) == [(2, "cuda-tools", "runs nvidia-smi"), (3, "cuda-tools", "runs nvcc"),
                            (4, "cuda-tools", "runs nvidia-smi"), (5, "cuda-tools", "runs nvcc")]


def test_suggested_replacements_run_on_the_accelerator() -> None:
    """What the audit suggests instead of pinned-memory findings and torch.cuda device
    queries works on pjrt, here, through torch's device-generic APIs."""
    import torch
    from torch.utils.data import DataLoader

    if (torch.accelerator.current_accelerator() or torch.device("cpu")).type != "pjrt":
        pytest.skip("pjrt is not torch's accelerator in this process")
    assert torch.ones(3).pin_memory().is_pinned()
    batch = next(iter(DataLoader(torch.randn(4, 2), batch_size=2, pin_memory=True)))
    assert batch.is_pinned() and batch.to("pjrt", non_blocking=True).device.type == "pjrt"
    for name in ("torch.cuda.get_device_properties", "torch.cuda.get_device_name"):
        assert "torch.get_device_module()" in CUDA_APIS[name].suggestion
    assert torch.get_device_module() is torch.pjrt
    assert torch.get_device_module().get_device_name(0)
    assert torch.get_device_module().get_device_properties(0).name
    free, total = torch.accelerator.get_memory_info(0)
    assert isinstance(total / 2**30, float) and 0 < free <= total


def test_estimate_counts_only_code_that_runs() -> None:
    data = to_json(audit(KERNEL))
    pynvml = [f for f in data["findings"] if f["effort_key"] == "pynvml"]
    assert [(f["severity"], f["message"]) for f in pynvml] == [
        ("simple edit", "requires pynvml, never imported")]
    by_category = {s["category"]: s["effort_hours"] for s in data["summary"]}
    # the CUDA kernel is the one port; its guard shares that effort; the rest are simple edits
    assert by_category == {"device": 0.0, "torch.cuda": 0.25, "backend-flags": 0.5, "amp": 0.5,
                           "custom-extension": 8.0, "third-party": 0.25, "cuda-tools": 0.0,
                           "cuda-only": 0.25}
    assert data["effort_hours"] == 9.75
    assert "| cuda-tools | 1 | 0 | 1 | 0 | 0 | counted in another row |" in to_markdown(audit(KERNEL))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=audit", "-c", "user.email=audit@test",
                           *args], cwd=repo, capture_output=True, text=True, check=True,
                          timeout=60).stdout


def run_entry_script(project: Path, device: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "train.py", "3"], cwd=project,
                          env=device_environment(device),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("device", sorted(DEVICE_ENVIRONMENTS))
def test_fix_applied_with_git_leaves_a_project_that_runs(tmp_path: Path, device: str,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    if device == "cpu" and (found := accelerator_without_pjrt()) != "None":
        pytest.skip(f"torch reports accelerator {found} without pjrt: this torch build is not CPU-only")
    copy = tmp_path / "cuda_kernel_project"
    shutil.copytree(KERNEL, copy)
    git(copy, "init", "-q")
    git(copy, "add", ".")
    git(copy, "commit", "-qm", "the CUDA project")
    if device == "cpu":  # the original needs CUDA: "cuda" devices
        before = run_entry_script(copy, device)
        assert before.returncode != 0 and "CUDA" in before.stderr, before.stderr
    assert main(["audit", str(copy), "--fix"]) == 0
    (tmp_path / "fix.diff").write_text(capsys.readouterr().out)
    git(copy, "apply", str(tmp_path / "fix.diff"))
    assert git(copy, "status", "--short").split() == ["M", "gpu_info.py", "M", "train.py"]
    after = run_entry_script(copy, device)
    assert after.returncode == 0, after.stdout + after.stderr
    assert f"trained on {device}" in after.stdout and "no CUDA GPU" in after.stdout
    # the guards over the CUDA kernel and nvidia-smi stay CUDA-specific
    assert "if torch.cuda.is_available():" in (copy / "kernels.py").read_text()
    assert "if x.is_cuda and" in (copy / "kernels.py").read_text()
    assert "if not torch.cuda.is_available():" in (copy / "gpu_info.py").read_text()
