"""Launch N worker processes the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT set before `import torch`), each running one case of
tests/distributed/cases.py, with a hard deadline: on timeout every worker is killed and
the test fails with their output, so nothing can hang CI.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    rank: int
    returncode: int
    output: str
    value: dict | None  # what the case returned (JSON), None if it did not finish
    exited_after: float | None  # seconds from launch to exit, None if it was killed


def free_port_pair() -> int:
    """A port p with p and p+1 free: torch's store uses p, JAX's coordinator p+1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000:
            with socket.socket() as s2:
                try:
                    s2.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free port pair")


def launch(case: str, nprocs: int, timeout: float = 120.0, env: dict | None = None,
           args: list[str] | None = None) -> list[Result]:
    port = free_port_pair()
    outdir = Path(tempfile.mkdtemp(prefix="pjrt-dist-"))
    procs = []
    for rank in range(nprocs):
        worker_env = dict(os.environ)
        worker_env.update(RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                          TORCH_PJRT_PLATFORM="cpu", TORCH_PJRT_CPU_DEVICES="1", PYTHONUNBUFFERED="1",
                          OMP_NUM_THREADS="1", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false",
                          PYTHONPATH=str(REPO) + os.pathsep + worker_env.get("PYTHONPATH", ""))
        worker_env.update(env or {})
        log = open(outdir / f"log{rank}", "w")
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "tests.distributed.cases", case, str(outdir / f"out{rank}.json"), *(args or [])],
            env=worker_env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), log))
    start = time.monotonic()
    exited: dict[int, float] = {}  # rank -> seconds after launch when it exited
    while len(exited) < nprocs and time.monotonic() - start < timeout:
        for rank, (p, _) in enumerate(procs):
            if rank not in exited and p.poll() is not None:
                exited[rank] = time.monotonic() - start
        time.sleep(0.05)
    timed_out = len(exited) < nprocs
    if timed_out:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
        for p, _ in procs:
            p.wait()
    results = []
    for rank, (p, log) in enumerate(procs):
        log.close()
        out = outdir / f"out{rank}.json"
        value = json.loads(out.read_text()) if out.exists() else None
        results.append(Result(rank, p.returncode, (outdir / f"log{rank}").read_text(), value, exited.get(rank)))
    if timed_out:
        raise TimeoutError(f"case {case!r} with {nprocs} processes ran past {timeout:.0f} s; killed.\n"
                           + "\n".join(f"--- rank {r.rank} (rc {r.returncode}):\n{r.output[-3000:]}" for r in results))
    return results


def expect_success(results: list[Result]) -> list[dict]:
    """Every rank exited 0 and reported no failed check; returns their values."""
    problems = []
    for r in results:
        if r.value is not None and r.value.get("failures"):
            problems.append(f"--- rank {r.rank} failed checks:\n" + "\n".join(r.value["failures"]))
        elif r.returncode != 0 or r.value is None:
            problems.append(f"--- rank {r.rank} exited {r.returncode}:\n{r.output[-4000:]}")
    assert not problems, "\n".join(problems)
    return [r.value for r in results]


def torchrun(script_args: list[str], nprocs: int, outdir: Path, env: dict, timeout: float = 180.0,
             nnodes: int = 1, args: list[str] | None = None, max_restarts: int = 0) -> list[dict]:
    """`python -m torch.distributed.run` itself (not `launch`'s environment), each worker
    writing `outdir/out{rank}.json` (`args` follow that path): `--standalone` for one node,
    or `nnodes` launchers ("hosts" on this machine) meeting at a c10d rendezvous on
    localhost, `nprocs` workers each, restarted up to `max_restarts` times. On timeout the
    launchers and their workers are killed. Returns each rank's JSON."""
    if nnodes == 1:
        rendezvous = ["--standalone"]
    else:
        rendezvous = [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port_pair()}",
                      "--rdzv-id=pjrt-test"]
    command = [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc-per-node={nprocs}",
               f"--max-restarts={max_restarts}", *script_args, str(outdir / "out{rank}.json"), *(args or [])]
    jobs = [subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True) for _ in range(nnodes)]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for job in jobs:
            outputs.append(job.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
    except subprocess.TimeoutExpired:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        raise
    for job, output in zip(jobs, outputs):
        assert job.returncode == 0, output[-4000:]
    return [json.loads((outdir / f"out{rank}.json").read_text()) for rank in range(nnodes * nprocs)]
