"""The `torch-pjrt` command line.

Each subcommand is one registration function in SUBCOMMANDS: it adds its parser and sets
`run`, a function of the parsed arguments that returns the exit code. Heavy modules (torch,
jax, rich) are imported inside `run`, and `import torch_pjrt` does not set the device up
in this command (torch_pjrt/__init__.py), so `--help`, `--version` and the static `audit`
never import torch; `doctor`, `demo` and `bench` set it up through `_device()`. To add a
subcommand, write one `_add_<name>(subparsers)` function and append it to SUBCOMMANDS.

Conventions shared by the subcommands: `--json [FILE]` (torch_pjrt/tools/output.py: stdout
by default or with `-`, else FILE); a usage error (an unknown option, a missing path) shows
the subcommand's own usage and exits 2; a closed pipe (`torch-pjrt audit --json | head`)
ends the command quietly, as Unix tools do.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence

import torch_pjrt
from torch_pjrt.tools.output import STDOUT


class HelpFormatter(argparse.HelpFormatter):
    """--help with each option's default, unless it has none worth showing (None, a flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


class RawDescriptionHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """HelpFormatter that keeps the description as written: the examples' docstrings, with
    their paragraphs and command lines."""


class UsageError(Exception):
    """A bad command line found while running: reported with the subcommand's usage, exit 2."""


def _add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", nargs="?", const=STDOUT, metavar="FILE",
                        help=f"{what} as JSON, to stdout (alone or with -) or to FILE")


def _device() -> None:
    """Register the pjrt device (a no-op when `import torch` autoloaded it): the commands
    that use it call this, since `import torch_pjrt` leaves it to them here."""
    torch_pjrt._setup()


def _add_audit(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "audit", help="inventory what binds a Python project to CUDA",
        description="Scan Python files, notebooks, requirements and setup files for CUDA "
                    "lock-in; classify each finding and estimate the effort to move off CUDA.")
    parser.add_argument("path", nargs="?", help="project directory or file (default: .)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", nargs="?", const=STDOUT, metavar="FILE.json",
                        help="the report as JSON, to stdout (alone or with -) or to FILE.json "
                             "(an argument not ending in .json is the project path)")
    output.add_argument("--markdown", action="store_true",
                        help="print a Markdown report with a per-category effort estimate")
    output.add_argument("--fix", action="store_true",
                        help="print a unified diff moving device strings and torch.cuda "
                             "calls with equivalents to torch.accelerator")
    output.add_argument("--write", action="store_true",
                        help="apply the --fix rewrite to the files in place")
    parser.add_argument("--fail-on", choices=["automatic", "simple-edit", "needs-port",
                                              "no-equivalent"],
                        help="exit 1 if any finding is at least this severe")
    parser.set_defaults(run=_run_audit)


def _audit_path_and_json(args: argparse.Namespace) -> tuple[str, str | None]:
    """(project path, JSON destination). `audit --json proj` means the project proj, JSON to
    stdout: argparse gives the word after --json to --json, and only a name ending in .json
    (never a source file) is taken as the output file."""
    path, destination = args.path, args.json
    if destination not in (None, STDOUT) and not destination.endswith(".json"):
        if path is not None:
            raise UsageError(f"--json {destination}: the output file must end in .json "
                             f"(or use --json alone for stdout)")
        path, destination = destination, STDOUT
    return (path if path is not None else "."), destination


def _run_audit(args: argparse.Namespace) -> int:
    from torch_pjrt.tools import audit, audit_fix
    from torch_pjrt.tools.audit_rules import Severity
    from torch_pjrt.tools.output import write_json

    path, json_destination = _audit_path_and_json(args)
    try:
        report = audit.audit(path)
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None
    if json_destination:
        write_json(audit.to_json(report), json_destination)
    if args.markdown:
        print(audit.to_markdown(report), end="")
    elif args.fix:
        print(audit_fix.unified_diff(report), end="")
    elif args.write:
        for rewritten in audit_fix.write_fixes(report):
            print(f"rewrote {rewritten}")
    elif json_destination != STDOUT:  # with --json alone, stdout carries the JSON only
        audit.print_table(report)
    if args.fail_on:
        threshold = Severity.from_slug(args.fail_on)
        if any(f.severity.rank >= threshold.rank for f in report.findings):
            return 1
    return 0


def _add_doctor(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "doctor", help="report versions, devices, compilers and the runtime build",
        description="Report what torch-pjrt runs on: torch, jax and plugin versions, the "
                    "PJRT platform and devices, autoload, compilers, the C++ runtime build.")
    _add_json_option(parser, "the report")
    parser.set_defaults(run=_run_doctor)


def _run_doctor(args: argparse.Namespace) -> int:
    from torch_pjrt.tools import doctor

    return doctor.run(json_destination=args.json)  # sets the device up itself, reporting a failure


def _add_demo(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "demo", help="train a char-level GPT on pjrt and on the CPU, and compare",
        description="Train a small character-level GPT on the pjrt device with a progress bar, "
                    "then the same run on the CPU; print tokens/s on each, how closely the loss "
                    "curves agree, and text sampled from the model trained on pjrt.")
    parser.add_argument("--steps", type=int, default=250, help="training steps on pjrt")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--size", choices=["small", "tiny"], default="small", help="model size")
    parser.add_argument("--cpu-steps", type=int, default=40,
                        help="steps of the CPU run (the first steps of the same run), for its speed and "
                             "the loss curves' agreement")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU run and the comparison")
    parser.add_argument("--sample-chars", type=int, default=200, help="characters of text to generate")
    parser.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    _device()
    from torch_pjrt.tools import demo

    return demo.run(steps=args.steps, batch_size=args.batch_size, size=args.size, cpu=not args.no_cpu,
                    sample_chars=args.sample_chars, cpu_steps=args.cpu_steps)


def _add_bench(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "bench", help="benchmark workloads on pjrt, pjrt compiled, CPU, inductor (and CUDA)",
        description="Run built-in workloads (mlp, cnn, gpt, hf) or your own model, in training "
                    "and inference, on pjrt eager, torch.compile(backend='pjrt'), CPU eager, "
                    "inductor and CUDA when available; report latency p50/p95, throughput, "
                    "compile time, peak memory and cost per million tokens or samples.")
    parser.add_argument("--quick", action="store_true",
                        help="mlp and gpt only, small shapes, few steps (about a minute with "
                             "warm compile caches on a 2-core CPU)")
    parser.add_argument("--workloads", "--workload", dest="workloads",
                        help="comma-separated: mlp,cnn,gpt,hf (default: all; none when --model is "
                             "given); or llm alone: a causal LM's prefill and decode (TTFT, time per "
                             "output token, $ per million output tokens)")
    parser.add_argument("--model", action="append", metavar="MODULE:FUNCTION",
                        help="your workload: a function returning (model, example batch); "
                             "MODULE may be a dotted name or path/to/file.py (repeatable); with "
                             "--workload llm: hf:<directory | model type | cached model name>")
    parser.add_argument("--modes", help="comma-separated: train,infer (default: both); with "
                                        "--workload llm: eager,compiled,reduce-overhead")
    llm = parser.add_argument_group("--workload llm")
    llm.add_argument("--batch-sizes", help="comma-separated batch sizes (default 1)")
    llm.add_argument("--prompt-lengths", help="comma-separated prompt lengths in tokens (default 32)")
    llm.add_argument("--new-tokens", type=int, help="tokens generated per pass (default 16)")
    llm.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                     help="the model's dtype on every target (default float32)")
    llm.add_argument("--quantize", choices=("int8-weight-only", "int8-dynamic"),
                     help="torchao config applied on every target (and to the CPU reference)")
    parser.add_argument("--targets", help="comma-separated: pjrt,pjrt-compile,cpu,inductor,cuda,"
                                          "cuda-inductor (default: all available); with --workload llm "
                                          "also pjrt-reduce-overhead, cuda-reduce-overhead")
    parser.add_argument("--steps", type=int, help="timed steps per row (default 30, --quick 8; "
                                                  "llm: timed passes, default 3)")
    parser.add_argument("--warmup", type=int, help="warm-up steps per row, the first compiles "
                                                   "(default 3, --quick 2; llm: warm-up passes, default 1)")
    parser.add_argument("--price", action="append", metavar="TARGET=USD_PER_HOUR",
                        help="price per hour of a target or device, e.g. pjrt=1.2 cpu=0.1 "
                             "(repeatable; defaults: cpu=0.1, cuda=2.5, tpu=1.2, pjrt priced "
                             "as its platform)")
    _add_json_option(parser, "every field of every row")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of throughput bars (matplotlib)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (torch.set_num_threads); "
                                                    "1 gives steadier CPU timings on a shared machine")
    parser.add_argument("--cold", action="store_true",
                        help="compile without inductor's and torch-pjrt's on-disk caches, so "
                             "compile s is a fresh compile")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=_run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    _device()
    from torch_pjrt.tools import bench

    return bench.main(args)


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [  # type: ignore[type-arg]
    _add_audit,
    _add_doctor,
    _add_demo,
    _add_bench,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torch-pjrt", description="torch-pjrt: PyTorch on every PJRT accelerator.",
        formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"torch-pjrt {torch_pjrt.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND",
                                       parser_class=functools.partial(argparse.ArgumentParser,
                                                                      formatter_class=HelpFormatter))
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def _subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        # stdout is gone: point it at /dev/null so that the flush at exit raises nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1  # what rich's Console does on a closed pipe, so every subcommand ends alike


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    # parse_known_args: argparse reports a subcommand's unknown option with the top-level
    # usage; the subcommand's own usage is the one that helps
    args, unknown = parser.parse_known_args(argv)
    if args.command is None:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        parser.print_help()
        return 2
    command = _subcommand_parser(parser, args.command)
    if unknown:
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.run(args))
    except UsageError as error:
        command.error(str(error))


if __name__ == "__main__":
    sys.exit(main())
