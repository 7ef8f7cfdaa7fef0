#!/usr/bin/env bash
# One device session on a GPU machine (the `device` tool's `run`): correctness first, then the
# kernel, training and inference benchmarks, each under a time limit, all output under $OUT.
#
#   bash benchmarks/gpu_session.sh        # from the repository root; OUT defaults to gpu-results
#
# Installs nothing (the machine has no network): it needs a CUDA torch (2.11+), jax with CUDA,
# g++ and ninja for the runtime's first build. If the image lacks ninja, copy this machine's
# binary to .device/bin/ninja (ignored by git) and carry .device. About 9 minutes in all; the steps
# run in order of what matters most, so a session cut at the device's 10-minute limit keeps those.
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export TORCH_PJRT_PLATFORM=gpu XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -x .device/bin/ninja ] && export PATH="$PWD/.device/bin:$PATH"

step() {  # step NAME SECONDS COMMAND...: run it, keep its output in $OUT/NAME.txt, show the tail
    local name=$1 limit=$2 start rc
    shift 2
    echo "== $name (limit ${limit}s)"
    start=$(date +%s)
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    rc=$?
    echo "   rc=$rc, $(( $(date +%s) - start )) s"
    grep -v "Warning\|warnings.warn\|trace_to_jaxpr" "$OUT/$name.txt" | tail -n 30
    return $rc
}

step env 60 sh -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; uptime;
  python -c "import torch, jax; print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available()); print(\"jax\", jax.__version__, jax.devices())"'
step build 300 python -c "import time; t = time.time(); import torch, torch_pjrt; print((torch.ones(4, device='pjrt') + 1).cpu(), torch.pjrt.get_device_name(), f'{time.time() - t:.0f} s')" \
  || { echo "== stopped: torch_pjrt did not build or import, so every later step would fail"; exit 1; }
step checks 150 python benchmarks/gpu_checks.py
step host 120 python benchmarks/host_overhead.py --peer cuda --rounds 5 --warmup 3 --why
step llm 240 python -m torch_pjrt.cli bench --workload llm --dtype bfloat16 --batch-sizes 1,8 --prompt-lengths 128 \
  --new-tokens 32 --targets pjrt,pjrt-compile,pjrt-reduce-overhead,cuda,cuda-inductor --json "$OUT/llm.json"
step train 150 python benchmarks/train_eager.py --peer cuda --no-profile
step kernels 240 python benchmarks/kernels_gpu.py --quick --out "$OUT/kernels_gpu"
echo "== done: $(ls "$OUT" | tr '\n' ' ')"
