"""Worker side of the distributed tests: `python -m tests.distributed.cases CASE OUT.json [ARGS]`.

Each case runs in every rank of a job started by launch.py, compares what the pjrt
backend computes with a reference (the same collective on CPU tensors over a gloo group,
or single-process training) and writes {"failures": [...], ...} to OUT.json.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

import torch.distributed as dist

from tests.distributed import (case_collectives, case_failures, case_p2p, case_parallel,  # noqa: F401
                               case_restart, case_training)  # (fill CASES)
from tests.distributed.common import CASES, failures


def main() -> None:
    name, out = sys.argv[1], sys.argv[2].replace("{rank}", os.environ.get("RANK", "0"))
    result: dict = {}
    try:
        result = CASES[name](*sys.argv[3:]) or {}
    except Exception:  # noqa: BLE001  (reported to the test, which shows it)
        failures.append(traceback.format_exc())
    result["failures"] = failures
    with open(out, "w") as f:
        json.dump(result, f)
    if dist.is_initialized() and not result.get("peer_failed"):
        dist.destroy_process_group()
        import jax

        jax.distributed.shutdown()  # a barrier: rank 0 hosts JAX's coordinator, it must not leave first


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    if os.environ.get("PJRT_TEST_NORMAL_EXIT") == "1":
        sys.exit(0 if not failures else 1)  # through the interpreter's exit handlers (JAX's shutdown, threads)
    os._exit(0 if not failures else 1)  # skip interpreter teardown: nothing left to wait for
