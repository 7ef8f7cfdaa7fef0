"""`torch-pjrt doctor`: what torch-pjrt runs on, and what is missing.

`collect()` gathers everything into one JSON-ready dict; each probe catches its own
failures and records them as text, so the doctor reports a broken install instead of
crashing on it. `render()` prints that dict with rich.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

PACKAGES = ("torch", "jax", "jaxlib", "torch-pjrt", "numpy", "ml_dtypes")
PLUGIN_PREFIXES = ("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm", "libtpu", "jax-tpu",
                   "jax-neuronx", "jax-metal")
ENVIRONMENT = ("TORCH_DEVICE_BACKEND_AUTOLOAD", "JAX_PLATFORMS", "XLA_FLAGS",
               "XLA_PYTHON_CLIENT_MEM_FRACTION")
# Every TORCH_PJRT_* variable that README.md and docs/ document, and what applies when it is
# unset, as the code that reads it decides (tests/test_doctor.py checks both against the
# sources). Computed effective values (the platform, the cache directory) are in variables().
VARIABLES = {
    "TORCH_PJRT_PLATFORM": "JAX's default backend",
    "TORCH_PJRT_CPU_DEVICES": "1",
    "TORCH_PJRT_CPU_ASYNC_DISPATCH": "1",
    "TORCH_PJRT_FALLBACK": "warn",
    "TORCH_PJRT_SYNC_INDEX_CHECKS": "0",
    "TORCH_PJRT_EAGER": "fused",
    "TORCH_PJRT_FUSED_MAX_OPS": "2048",
    "TORCH_PJRT_FUSED_MAX_VARIANTS": "8",
    "TORCH_PJRT_FUSED_COLD_FRACTION": "0 (off)",
    "TORCH_PJRT_EAGER_FAST_PATH": "1",
    "TORCH_PJRT_RECOMPILE_WARN": "64",
    "TORCH_PJRT_CACHE_DIR": "$XDG_CACHE_HOME/torch_pjrt (~/.cache/torch_pjrt)",
    "TORCH_PJRT_COMPILE_CACHE": "1",
    "TORCH_PJRT_COMPILE_CACHE_MIN_SECONDS": "0",
    "TORCH_PJRT_EXECUTABLE_STORE": "1 (in <cache dir>/executables)",
    "TORCH_PJRT_COMPILE_FALLBACK": "error",
    "TORCH_PJRT_DUMP_DIR": "no dumps",
    "TORCH_PJRT_AUTOTUNE": "on GPU and TPU only",
    "TORCH_PJRT_FLASH_SDPA": "auto",
    "TORCH_PJRT_COLLECTIVES": "auto",
    "TORCH_PJRT_COLLECTIVE_CHECKS": "1",
    "TORCH_PJRT_JAX_DISTRIBUTED": "1",
    "TORCH_PJRT_COORDINATOR": "MASTER_ADDR:MASTER_PORT+1",
    "TORCH_PJRT_INIT_TIMEOUT_S": "300",
    "TORCH_PJRT_HEARTBEAT_S": "100",
    "TORCH_PJRT_SHUTDOWN_S": "30",
    "TORCH_PJRT_LOCAL_DEVICE_IDS": "LOCAL_RANK",
}
# read by the code but meant for its own tests and tools, so not documented for users
INTERNAL_VARIABLES = ("TORCH_PJRT_COMPILER_ID", "TORCH_PJRT_BENCH_TRACEBACK")
TOOLS = ("c++", "g++", "ninja")
AUTOLOAD_VARIABLE = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def jax_plugins() -> list[dict[str, str | None]]:
    """JAX PJRT plugins: `jax_plugins` entry points and plugin distributions."""
    found: dict[str, dict[str, str | None]] = {}
    for entry in metadata.entry_points(group="jax_plugins"):
        dist = entry.dist.name if entry.dist is not None else None
        found[entry.name] = {"name": entry.name, "entry_point": entry.value,
                             "distribution": dist,
                             "version": _version(dist) if dist else None}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith(PLUGIN_PREFIXES) and not any(
                p["distribution"] == name for p in found.values()):
            found[name] = {"name": name, "entry_point": None, "distribution": name,
                           "version": dist.version}
    return sorted(found.values(), key=lambda p: str(p["name"]))


def torch_info() -> dict[str, Any]:
    try:
        import torch
    except Exception as error:  # a failing autoload raises here too
        return {"version": _version("torch"), "imported": False, "error": _error(error)}
    accelerator = None
    try:
        current = torch.accelerator.current_accelerator()
        accelerator = str(current) if current is not None else None
    except Exception as error:
        return {"version": torch.__version__, "imported": True, "accelerator": None,
                "error": _error(error)}
    return {"version": torch.__version__, "imported": True, "accelerator": accelerator,
            "torch_pjrt_loaded": "torch_pjrt" in sys.modules, "error": None}


def jax_info() -> dict[str, Any]:
    try:
        import jax

        devices = []
        for device in jax.devices():
            try:
                stats = device.memory_stats()
            except Exception:  # some platforms raise instead of returning None
                stats = None
            memory = None
            if stats:
                memory = {key: stats[key] for key in
                          ("bytes_limit", "bytes_in_use", "peak_bytes_in_use") if key in stats}
            devices.append({"id": device.id, "platform": device.platform,
                            "kind": device.device_kind, "process": device.process_index,
                            "memory": memory})
        return {"version": jax.__version__, "backend": jax.default_backend(),
                "devices": devices, "error": None}
    except Exception as error:
        return {"version": _version("jax"), "backend": None, "devices": [],
                "error": _error(error)}


def autoload_info() -> dict[str, Any]:
    entry = next((e for e in metadata.entry_points(group="torch.backends")
                  if e.name == "pjrt"), None)
    value = os.environ.get(AUTOLOAD_VARIABLE)
    enabled_by_env = (value if value is not None else "1") == "1"  # torch's own rule
    import torch_pjrt

    return {"entry_point": entry.value if entry is not None else None,
            "variable": value, "enabled": entry is not None and enabled_by_env,
            "stands_aside_for": torch_pjrt.other_accelerator()}


def tool_info(name: str) -> dict[str, str | None]:
    path = shutil.which(name)
    if path is None:
        return {"path": None, "version": None}
    try:
        result = subprocess.run([path, "--version"], capture_output=True, text=True,
                                timeout=20, check=False)
        version = (result.stdout or result.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        version = None
    return {"path": path, "version": version}


def pjrt_info() -> dict[str, Any]:
    """The pjrt devices as torch sees them. Sets the device up (a no-op after autoload) and
    reports a failure. total_memory is the capacity the allocator enforces, also where JAX
    reports no memory statistics (the CPU platform)."""
    try:
        import torch

        import torch_pjrt

        torch_pjrt._setup()
        devices = []
        for index in range(torch.pjrt.device_count()):
            props = torch.pjrt.get_device_properties(index)
            devices.append({"index": index, "name": props.name, "platform": props.platform,
                            "total_memory": props.total_memory,
                            "memory_allocated": torch.pjrt.memory_allocated(index)})
        platform_name = devices[0]["platform"] if devices else None
        return {"available": True, "platform": platform_name, "devices": devices, "error": None}
    except Exception as error:
        return {"available": False, "platform": None, "devices": [], "error": _error(error)}


def variables(pjrt: dict[str, Any]) -> list[dict[str, Any]]:
    """Each documented TORCH_PJRT_* variable: whether it is set, its value, and the value in
    effect, computed by the code that reads it where that code can say; then any other
    TORCH_PJRT_* variable that is set, marked unknown (a typo is otherwise silently ignored)."""
    computed: dict[str, Any] = {}
    if pjrt["platform"]:
        computed["TORCH_PJRT_PLATFORM"] = lambda: pjrt["platform"]
        computed["TORCH_PJRT_CPU_DEVICES"] = lambda: (str(len(pjrt["devices"])) if pjrt["platform"] == "cpu"
                                                      else f"not used on {pjrt['platform']}")

        def autotune() -> str:
            from torch_pjrt.kernels import autotune as tuner

            return "on" if tuner.enabled(pjrt["platform"]) else "off"

        computed["TORCH_PJRT_AUTOTUNE"] = autotune

    def cache_dir() -> str:
        from torch_pjrt.runtime import build

        return str(build.cache_dir())

    def fallback() -> str:
        from torch_pjrt.eager import fallback as cpu_fallback

        return cpu_fallback.mode()

    computed["TORCH_PJRT_CACHE_DIR"] = cache_dir
    computed["TORCH_PJRT_FALLBACK"] = fallback
    out = []
    for name, default in VARIABLES.items():
        value = os.environ.get(name)
        effective = value if value is not None else default
        if name in computed:
            try:
                effective = computed[name]()
            except Exception as error:  # an invalid value: the code's own message
                effective = f"invalid: {_error(error)}"
        out.append({"name": name, "set": value is not None, "value": value, "effective": effective,
                    "known": True})
    for name in sorted(os.environ):
        if name.startswith("TORCH_PJRT_") and name not in VARIABLES and name not in INTERNAL_VARIABLES:
            out.append({"name": name, "set": True, "value": os.environ[name], "effective": None,
                        "known": False})
    return out


def runtime_info() -> dict[str, Any]:
    """The C++ runtime's build status, from torch_pjrt.runtime.build.build_info()."""
    try:
        from torch_pjrt.runtime import build as _runtime

        info = dict(_runtime.build_info())
    except (ImportError, AttributeError) as error:
        return {"available": False, "error": _error(error)}
    except Exception as error:  # build_info itself failed: report it, do not crash
        return {"available": False, "error": _error(error)}
    return {"available": True, "error": None, **info}


def collect() -> dict[str, Any]:
    """Everything the doctor reports, as one JSON-ready dict."""
    torch = torch_info()
    pjrt = pjrt_info()  # before jax_info: the device's platform settings precede JAX's first backend
    info: dict[str, Any] = {
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "platform": platform.platform()},
        "packages": {name: _version(name) for name in PACKAGES},
        "jax_plugins": jax_plugins(),
        "autoload": autoload_info(),
        "environment": {name: os.environ.get(name) for name in ENVIRONMENT},
        "torch": torch,
        "jax": jax_info(),
        "pjrt": pjrt,
        "compilers": {name: tool_info(name) for name in TOOLS},
        "runtime": runtime_info(),
    }
    info["variables"] = variables(info["pjrt"])
    info["problems"] = problems(info)
    return info


def problems(info: dict[str, Any]) -> list[str]:
    """What stops torch-pjrt from working, in words, from a collect() dict."""
    out: list[str] = []
    if info["torch"]["error"]:
        out.append(f"torch: {info['torch']['error']}")
    if info["jax"]["error"]:
        out.append(f"jax: {info['jax']['error']}")
    if info["pjrt"]["error"]:
        out.append(f"the pjrt device could not be set up: {info['pjrt']['error']}")
    for variable in info["variables"]:
        if not variable["known"]:
            out.append(f"{variable['name']} is set but torch-pjrt reads no such variable (a typo?)")
        elif str(variable["effective"]).startswith("invalid: "):
            out.append(f"{variable['name']}={variable['value']}: {variable['effective'][len('invalid: '):]}")
    if info["autoload"]["entry_point"] is None:
        out.append("the torch.backends entry point 'pjrt' is not installed "
                   "(pip install torch-pjrt); `import torch_pjrt` is needed")
    if not (info["compilers"]["c++"]["path"] or info["compilers"]["g++"]["path"]):
        out.append("no C++ compiler on PATH: the runtime extension cannot be built")
    if not info["compilers"]["ninja"]["path"]:
        out.append("ninja is not on PATH: the runtime extension cannot be built")
    runtime = info["runtime"]
    if not runtime["available"]:
        out.append(f"runtime build status unavailable ({runtime['error']})")
    elif runtime.get("error"):
        out.append(f"runtime: {runtime['error']}")
    elif runtime.get("built") is False:
        out.append("the C++ runtime is not built yet: it builds on the first `import torch_pjrt`")
    return out


def _bytes(count: int | None) -> str:
    if count is None:
        return "?"
    return f"{count / 2**30:.1f} GiB"


def render(info: dict[str, Any], console: Any = None) -> None:
    """Print a collect() dict as rich tables."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = console if console is not None else Console()

    def section(title: str, rows: list[tuple[str, str]]) -> None:
        table = Table(title=title, show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for key, value in rows:
            table.add_row(key, value)
        out.print(table)

    def show(value: object) -> str:
        return "[red]missing[/]" if value is None else str(value)

    section("Versions", [("python", info["python"]["version"])]
            + [(name, show(version)) for name, version in info["packages"].items()]
            + [(f"plugin {p['name']}", f"{show(p['version'])} ({p['entry_point'] or 'no entry point'})")
               for p in info["jax_plugins"]])
    jax_rows = [("backend", show(info["jax"]["backend"]))]
    for device in info["jax"]["devices"]:
        memory = device["memory"]
        described = (f"{_bytes(memory.get('bytes_in_use'))} used of "
                     f"{_bytes(memory.get('bytes_limit'))}" if memory
                     else "no memory statistics from JAX (the pjrt allocator's capacity: below)")
        jax_rows.append((f"device {device['id']}", f"{device['platform']} {device['kind']}, "
                                                   f"{described}"))
    if info["jax"]["error"]:
        jax_rows.append(("error", f"[red]{info['jax']['error']}[/]"))
    section("JAX / PJRT", jax_rows)
    torch_rows = [("accelerator", info["torch"].get("accelerator") or "none")]
    autoload = info["autoload"]
    torch_rows += [
        ("autoload entry point", show(autoload["entry_point"])),
        (AUTOLOAD_VARIABLE, autoload["variable"] if autoload["variable"] is not None
         else "unset (enabled)"),
        ("autoload", f"[yellow]stands aside for {autoload['stands_aside_for']}: import torch_pjrt[/]"
         if autoload["enabled"] and autoload["stands_aside_for"] else
         "[green]enabled[/]" if autoload["enabled"] else "[yellow]off[/]"),
    ]
    if info["torch"]["error"]:
        torch_rows.append(("error", f"[red]{info['torch']['error']}[/]"))
    section("PyTorch", torch_rows)
    pjrt = info["pjrt"]
    section("pjrt device", [(f"pjrt:{d['index']}", f"{d['name']}, {_bytes(d['memory_allocated'])} allocated of "
                                                  f"{_bytes(d['total_memory'])} (allocator capacity)")
                            for d in pjrt["devices"]]
            or [("error", f"[red]{escape(str(pjrt['error']))}[/]")])
    section("Build", [(name, f"{show(tool['path'])} {tool['version'] or ''}".strip())
                      for name, tool in info["compilers"].items()]
            + [(f"runtime {key}", str(value)) for key, value in info["runtime"].items()
               if key not in ("available", "error") and value is not None]
            + ([("runtime", f"[yellow]unavailable: {info['runtime']['error']}[/]")]
               if not info["runtime"]["available"] else []))
    section("Environment", [(k, v) for k, v in info["environment"].items() if v is not None]
            or [("(none set)", "")])
    variable_rows = []
    for v in info["variables"]:
        if not v["known"]:
            state = f"[yellow]set to {escape(v['value'])}: unknown variable[/]"
        elif v["set"]:
            state = f"[bold]set[/] to {escape(v['value'])}" + (
                f", in effect {escape(str(v['effective']))}" if v["effective"] != v["value"] else "")
        else:
            state = f"unset: {escape(str(v['effective']))}"
        variable_rows.append((v["name"], state))
    section("torch-pjrt variables", variable_rows)
    if info["problems"]:
        for problem in info["problems"]:
            out.print(f"[yellow]![/] {problem}")
    else:
        out.print("[green]no problems found[/]")


def run(json_destination: str | None = None) -> int:
    """The `doctor` command: 1 if torch or jax cannot be used, else 0. `json_destination`:
    see torch_pjrt/tools/output.py."""
    from torch_pjrt.tools.output import to_stdout, write_json

    info = collect()
    if json_destination:
        write_json(info, json_destination)
    if not to_stdout(json_destination):
        render(info)
    return 1 if info["torch"]["error"] or info["jax"]["error"] else 0
