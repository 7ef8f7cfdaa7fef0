"""Fused eager's op executables on disk by call signature (runtime/executable_store.py): a second
process runs the calls the first one met without tracing or lowering them, with the same numbers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch

import torch_pjrt

# Each region runs once (its first sight: call by call), so every executable is an op's.
SCRIPT = textwrap.dedent("""
    import json, sys
    import jax.monitoring
    events = {"lowerings": 0, "store_hits": 0, "jax_hits": 0}
    def on_duration(name, *args, **kw):
        if name == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            events["lowerings"] += 1
    def on_event(name, **kw):
        if name == "/torch_pjrt/executable_store/hits":
            events["store_hits"] += 1
        elif name.endswith("compilation_cache/cache_hits"):
            events["jax_hits"] += 1
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    import torch, torch_pjrt

    def work(device):
        torch.manual_seed(0)
        values = []
        for n in (3, 5, 7):  # each size a new signature for every op
            x = torch.linspace(-2, 2, n * 4, device=device).view(n, 4)
            y = (x.t() @ x).softmax(-1) * 2 + x.sum(0)
            mask = x > 0
            both = (mask * mask) & (x < 1)  # bool mul and bitwise_and: one XLA program (see below)
            values.append(torch.cat([y.flatten(), both.float().flatten(), x.abs().argmax(1).float()]).tolist())
            values.append((torch.arange(n, device=device) / 3).tolist())  # int in, default dtype out
        return values

    got, expected = work("pjrt"), work("cpu")
    stats = torch_pjrt.eager_stats()
    print("RESULT" + json.dumps({"got": got, "expected": expected, "executables": stats["executables"],
                                 "fused": stats["fused"], **events}))
""")


def _run(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert "RESULT" in out.stdout, out.stderr[-3000:]
    return json.loads(out.stdout.split("RESULT")[-1])


def _env(tmp_path, **settings) -> dict:
    # JAX_COMPILATION_CACHE_DIR (respected as the user's own) keeps the C++ runtime's build cache
    # (first sights op by op, as the region counts below expect: TORCH_PJRT_FUSED_COLD_FRACTION off)
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla"), TORCH_PJRT_PLATFORM="cpu",
               TORCH_PJRT_EAGER="fused", TORCH_PJRT_EXECUTABLE_STORE=str(tmp_path / "store"),
               TORCH_PJRT_FUSED_COLD_FRACTION="0",
               PYTHONPATH=os.path.dirname(os.path.dirname(torch_pjrt.__file__)))
    return {**env, **settings}


def _close(got, expected):
    for g, e in zip(got, expected):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(e))


def test_a_second_process_runs_the_first_ones_calls_without_lowering_them(tmp_path):
    first, second, third = (_run(_env(tmp_path)) for _ in range(3))
    for run in (first, second, third):
        _close(run["got"], run["expected"])
        assert run["got"] == first["got"]  # the same executables' numbers, however they were built
    assert first["store_hits"] == 0 and first["lowerings"] > 0
    # the second process lowers only what the first could not keep: an executable JAX read from its own
    # cache (the bool mul and bitwise_and lower to one program) serializes without its kernels, so it
    # is built again, from JAX's cache
    assert second["store_hits"] > 0 and second["lowerings"] == second["jax_hits"]
    assert second["lowerings"] * 5 < first["lowerings"]
    assert second["lowerings"] == third["lowerings"] and second["store_hits"] == third["store_hits"]
    # a read executable counts as a traced one (eager_stats, the recompile warning)
    assert second["executables"] == first["executables"]


def test_the_store_is_keyed_by_what_the_lowerings_read(tmp_path):
    """The default dtype and float32 matmul precision are read at trace time: another value is another
    executable, never the stored one."""
    _run(_env(tmp_path))
    script_env = _env(tmp_path)
    code = SCRIPT.replace("import torch, torch_pjrt\n", "import torch, torch_pjrt\ntorch.set_default_dtype(torch.float64)\n")
    out = subprocess.run([sys.executable, "-c", code], env=script_env, capture_output=True, text=True, timeout=300)
    assert "RESULT" in out.stdout, out.stderr[-3000:]
    run = json.loads(out.stdout.split("RESULT")[-1])
    _close(run["got"], run["expected"])
    # int64 / 3 has the same operands under either default dtype: its float32 executable is not reused
    assert run["got"][1::2] == run["expected"][1::2]
    assert run["store_hits"] == 0


def test_the_store_can_be_turned_off(tmp_path):
    first = _run(_env(tmp_path, TORCH_PJRT_EXECUTABLE_STORE="0"))
    second = _run(_env(tmp_path, TORCH_PJRT_EXECUTABLE_STORE="0"))
    assert first["store_hits"] == second["store_hits"] == 0
    assert second["lowerings"] == first["lowerings"]
    assert not (tmp_path / "store").exists() and not (tmp_path / "0").exists()
    _close(second["got"], second["expected"])



SAME_PROGRAM_TWICE = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp
    import jax.monitoring
    lowerings = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *a, **k: lowerings.append(name) if name == "/jax/core/compile/jaxpr_to_mlir_module_duration" else None)
    import torch, torch_pjrt
    from torch_pjrt.runtime import executable_store, fused, platform
    x = jax.device_put(jnp.linspace(-3, 3, 64 * 32, dtype=jnp.float32).reshape(64, 32), platform.device(0))
    treedef = jax.tree_util.tree_structure((x,))
    got = []
    for key in ("first", "second"):  # two signatures of one program: the second from JAX's in-memory cache
        rec = fused.Recordable(jax.jit(lambda x: jnp.sin(x.T) * 2), key=f"tests.sin_of_transpose.{key}")
        lowerings.clear()
        got.append(executable_store.executable((key,), rec, (), treedef, [x.aval], [x])(x).tolist())
        got.append(len(lowerings))
    print("RESULT" + json.dumps({"got": got, "expected": (jnp.sin(x.T) * 2).tolist()}))
""")


def test_what_jax_cached_elsewhere_is_compiled_afresh_and_kept(tmp_path):
    """An executable JAX gives from a cache of its own serializes without its kernels' object code
    (XLA:CPU, jax 0.10: another process fails running it, "Function transpose_copy_fusion not
    found"), so only what XLA compiled in this process is kept. A program JAX's persistent cache
    holds from elsewhere (here a process with the store off; after an upgrade, the earlier version)
    is compiled afresh for the store (JAX's cache keys it by the store's namespace) and kept: a later
    process runs it without lowering. JAX's in-memory copy of it (the same program under another
    signature) is not kept."""
    def run(**settings):
        out = subprocess.run([sys.executable, "-c", SAME_PROGRAM_TWICE], env=_env(tmp_path, **settings),
                             capture_output=True, text=True, timeout=300)
        assert "RESULT" in out.stdout, out.stderr[-3000:]
        result = json.loads(out.stdout.split("RESULT")[-1])
        assert result["got"][0] == result["got"][2] == result["expected"]
        return result["got"][1], result["got"][3]  # each signature's lowerings

    def kept():
        return [p for p in (tmp_path / "store").rglob("*") if p.is_file()]

    assert run(TORCH_PJRT_EXECUTABLE_STORE="0") == (1, 1)  # compiled once (the second from memory): JAX's caches hold it
    assert run() == (1, 1) and len(kept()) == 1  # the first signature compiled afresh and kept; not the second
    assert run() == (0, 1) and len(kept()) == 1  # the first read from the store; the second from JAX's cache again


LOOP = textwrap.dedent("""
    import json
    import torch, torch_pjrt
    torch.manual_seed(0)
    w = torch.randn(6, 6)
    def step(device):
        x = torch.linspace(-1, 1, 36, device=device).view(6, 6)
        out = []
        for i in range(3):  # one region per iteration: first sight, then compiled (or read) and cached
            x = torch.tanh(x @ w.to(device)) * 1.5 + i
            out.append(x.sum(0).tolist())
        return out
    got, expected = step("pjrt"), step("cpu")
    fused = torch_pjrt.eager_stats()["fused"]
    print("RESULT" + json.dumps({"got": got, "expected": expected, "compiles": fused["region_compiles"],
                                 "store_hits": fused["region_store_hits"], "first_sight": fused["regions_first_sight"],
                                 "recent": [r["executable"] for r in fused["recent_regions"]]}))
""")


def test_a_region_an_earlier_process_compiled_runs_compiled_at_its_first_sight(tmp_path):
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", LOOP], env=_env(tmp_path), capture_output=True, text=True,
                             timeout=300)
        assert "RESULT" in out.stdout, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.split("RESULT")[-1]))
    first, second = runs
    for run in runs:
        _close(run["got"], run["expected"])
    # iteration 0 runs op by op in both; iteration 1 runs op by op in the first process and compiled in
    # the second, where XLA may contract a * b + c into an FMA (docs/eager.md, "Numerics"): 1 ulp apart
    # on some CPUs, and iteration 2 starts from there
    assert second["got"][0] == first["got"][0]
    # iteration 0's region (with linspace) is seen once; iterations 1 and 2 share one structure
    assert first["recent"] == ["first sight", "first sight", "compiled"]
    assert first["compiles"] == 1 and first["store_hits"] == 0
    assert second["recent"] == ["first sight", "stored", "cached"]  # read at its first sight, then cached
    assert second["compiles"] == 0 and second["store_hits"] == 1


TWO_DEVICES = textwrap.dedent("""
    import json
    import torch, torch_pjrt
    def work(a, b):
        x = torch.linspace(-1, 1, 12, device=a).view(3, 4)
        y = torch.linspace(0, 2, 12, device=b).view(3, 4)
        out = []
        for i in range(3):
            x = torch.tanh(x * 2 + i)
            y = (y.t() @ y).softmax(-1)[:3, :4] + i
            out.append([x.sum().item(), y.sum().item(), str(x.device), str(y.device)])
        return out
    got, expected = work("pjrt:1", "pjrt:0"), work("cpu", "cpu")
    print("RESULT" + json.dumps({"got": got, "expected": expected}))
""")


def test_calls_on_another_device_are_right_in_every_process(tmp_path):
    """pjrt:1's calls and regions are not kept (an executable is compiled for its device); pjrt:0's beside
    them are: every process computes CPU's numbers on the right devices."""
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", TWO_DEVICES], env=_env(tmp_path, TORCH_PJRT_CPU_DEVICES="2"),
                             capture_output=True, text=True, timeout=300)
        assert "RESULT" in out.stdout, out.stderr[-3000:]
        run = json.loads(out.stdout.split("RESULT")[-1])
        for (gx, gy, dx, dy), (ex, ey, _, _) in zip(run["got"], run["expected"]):
            assert (dx, dy) == ("pjrt:1", "pjrt:0")
            torch.testing.assert_close(torch.tensor([gx, gy]), torch.tensor([ex, ey]), rtol=1e-5, atol=1e-5)


CUSTOM_CALLS = textwrap.dedent("""
    import json
    import torch, torch_pjrt
    def work(device):
        a = (torch.eye(3, dtype=torch.float64) * 2 + 0.1).to(device)
        values = [torch.linalg.det(a).item(), torch.linalg.svdvals(a).tolist(),
                  torch.fft.fft(torch.arange(4.0, device=device)).abs().tolist()]
        for _ in range(2):  # a region with LAPACK's custom call, compiled at its second sight
            values.append(torch.linalg.inv(a * 3).sum().item())
        return values
    print("RESULT" + json.dumps({"got": work("pjrt"), "expected": work("cpu")}))
""")


def test_programs_with_custom_calls_run_in_every_process(tmp_path):
    """LAPACK's and FFT's custom calls are registered where a program is lowered: a process that read
    such an executable would crash running it (a segfault), so they are not kept."""
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", CUSTOM_CALLS], env=_env(tmp_path), capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0 and "RESULT" in out.stdout, (out.returncode, out.stderr[-3000:])
        run = json.loads(out.stdout.split("RESULT")[-1])
        for g, e in zip(run["got"], run["expected"]):
            torch.testing.assert_close(torch.tensor(g), torch.tensor(e))


# cumsum of a bool tensor: ops/cpu_refused_dtypes.json lists bool for cumsum (CPU refuses
# cumsum(bool, dtype=bool)); CPU's call accepts this one, in the first process. The second process
# reads the op's executable from the store and never traces it alone, and its region is new (it
# ends in another op): the region's trace is the op's first, and must not refuse what the store's
# entry says was accepted.
ACCEPTED_IN_AN_EARLIER_PROCESS = textwrap.dedent("""
    import json, sys
    import torch, torch_pjrt
    def step(device):
        out = []
        for i in range(3):
            first = torch.arange(12, device=device).view(3, 4) % (i + 2) != 0
            rank = torch.cumsum(first, 1)
            out.append((rank - 1 if sys.argv[1] == "minus" else rank * 2).tolist())
        return out
    print("RESULT" + json.dumps({"got": step("pjrt"), "expected": step("cpu")}))
""")


def test_a_call_an_earlier_process_accepted_is_not_refused_when_its_region_compiles(tmp_path):
    for variant in ("minus", "times"):
        out = subprocess.run([sys.executable, "-c", ACCEPTED_IN_AN_EARLIER_PROCESS, variant], env=_env(tmp_path),
                             capture_output=True, text=True, timeout=300)
        assert "RESULT" in out.stdout, out.stderr[-3000:]
        run = json.loads(out.stdout.split("RESULT")[-1])
        assert run["got"] == run["expected"]


def test_a_platform_that_refuses_the_store_option_compiles_without_it(monkeypatch):
    """A PJRT plugin that takes no such XLA option ("No such compile option") gets the plain compile,
    and the store stops asking; an option XLA knows nothing of stands in for that plugin here."""
    import jax
    import jax.numpy as jnp

    from torch_pjrt.runtime import executable_store

    monkeypatch.setattr(executable_store, "_NAMESPACE_OPTION", "xla_no_such_option_of_torch_pjrt")
    monkeypatch.setitem(executable_store._state, "namespace", 12345)
    compiled, _ = executable_store._compile(jax.jit(lambda x: x * 2).lower(jnp.ones(3)), keep=True)
    assert compiled(jnp.ones(3)).tolist() == [2.0, 2.0, 2.0]
    assert executable_store._state["namespace"] is None
