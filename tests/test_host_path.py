"""What a steady eager step still runs in Python (torch_pjrt.eager_stats()["paths"], eager/paths.py).

After warm-up, a tiny GPT training step (AdamW, clip_grad_norm_, the loss read) and a tiny
Llama-style decode step (static cache written with index_copy_, argmax read) run once more;
the counts say which ops entered a Python kernel and which calls went through the Python
recorder. The expected lists are exact, so a change that moves an op onto the fast path (or off
it) updates them here; each entry says why the op is not on the C++ fast path yet (issue 29).
Both steps also compute what torch computes on the CPU, in both eager modes. HF generate()'s
decode steps are counted step by step: only those whose KV cache crosses a capacity enter Python.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import torch_pjrt
from torch_pjrt.eager import paths
from torch_pjrt.tools import demo_models as dm
from torch_pjrt.tools.tiny_llama import Decoder
from tests.checkout import environment

WARMUP = 4  # a fused region's structure compiles at its second sight; the rest is steady

# op -> why its calls still enter a Python kernel: none (the batch's uploads and the token's read
# back are ToCopyKernel's in C++ since 2026-12-05)
GPT_PYTHON_KERNELS: dict = {}
DECODE_PYTHON_KERNELS: dict = {}
# The ops of each step whose C++ kernels need their call signature's traits (kernels.SignatureTraits:
# index checks, appends, int returns): the recorder keeps them, so op by op these kernels leave
# each call to the Python kernel.
GPT_DESCRIBED = {"aten::embedding", "aten::cat"}
DECODE_DESCRIBED = {"aten::embedding", "aten::index_select", "aten::index_copy_", "aten::cat",
                    "aten::_scaled_dot_product_fused_attention_overrideable"}


def _expected(python_kernels: dict, described: set, mode: str) -> set:
    return set(python_kernels) | (described if mode == "op" else set())


@pytest.fixture(params=["fused", "op"])
def mode(request):
    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode(request.param)
    yield request.param
    torch_pjrt.set_eager_mode(before)


def _gpt_steps(device):
    data, model, opt = dm.gpt_setup(device, n_layer=2, n_embd=32, n_head=2, block_size=8)
    return dm.training_steps(data, model, opt, device, batch_size=1)


def _steady(step, warmup: int = WARMUP):
    """(counts of one steady step, the values every step returned)."""
    values = [step() for _ in range(warmup)]
    torch_pjrt.reset_eager_stats()
    values.append(step())
    return torch_pjrt.eager_stats()["paths"], values


def _python_kernels(counts: dict) -> set:
    return {name for name, c in counts.items() if c["python_kernel"]}


def _python_recorded(counts: dict) -> int:
    return sum(c["python_recorder"] for c in counts.values())


def test_gpt_training_step(mode):
    cpu, pjrt = _gpt_steps("cpu"), _gpt_steps("pjrt")
    counts, losses = _steady(lambda: float(next(pjrt)))
    expected = [float(next(cpu)) for _ in losses]
    assert losses == pytest.approx(expected, rel=1e-4)
    assert _python_kernels(counts) == _expected(GPT_PYTHON_KERNELS, GPT_DESCRIBED, mode), counts
    assert sum(c["fast"] for c in counts.values()) > 100  # the rest of the step: C++ kernels
    if mode == "op":
        assert _python_recorded(counts) == 0


def test_decode_step(mode):
    cpu, pjrt = Decoder("cpu"), Decoder("pjrt")
    counts, logits = _steady(lambda: (pjrt.step().cpu(), pjrt.token.cpu())[0])
    expected = [cpu.step() for _ in logits]
    torch.testing.assert_close(torch.stack(logits), torch.stack(expected), rtol=1e-4, atol=1e-4)
    assert torch.equal(pjrt.token.cpu(), cpu.token)
    assert _python_kernels(counts) == _expected(DECODE_PYTHON_KERNELS, DECODE_DESCRIBED, mode), counts
    assert sum(c["fast"] for c in counts.values()) > 100
    if mode == "op":
        assert _python_recorded(counts) == 0


_PYTHON_KERNEL = "recorded by its Python kernel (above)"
# what still goes through the Python recorder (fused.record) in fused mode, and why
GPT_PYTHON_RECORDED: dict = {}  # none: backward's first op runs the forward's region from C++ (recorder.cpp)
DECODE_PYTHON_RECORDED: dict = {}  # none: every call of a steady decode step is recorded in C++


def _python_recorder_names(counts: dict) -> set:
    return {name for name, c in counts.items() if c["python_recorder"]}


def test_fused_steps_record_fast_calls_in_cpp():
    """In fused mode, a fast call of a signature seen before is recorded in C++ (recorder.cpp);
    what still enters the Python recorder is exactly the lists above."""
    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode("fused")
    try:
        gpt = _gpt_steps("pjrt")
        gpt_counts, _ = _steady(lambda: float(next(gpt)))
        decoder = Decoder("pjrt")
        decode_counts, _ = _steady(lambda: decoder.step().cpu())
    finally:
        torch_pjrt.set_eager_mode(before)
    for counts, expected in ((gpt_counts, GPT_PYTHON_RECORDED), (decode_counts, DECODE_PYTHON_RECORDED)):
        assert _python_recorder_names(counts) == set(expected), paths.leaving_fast_path(counts)
        assert sum(c["cpp_recorder"] for c in counts.values()) > 50


def test_counts_name_each_path(mode):
    """A fast call counts as fast; a call the C++ kernel hands to its Python kernel (a CPU
    operand) counts there; the recorders count what fused mode records."""
    x = torch.ones(3, device="pjrt")
    torch_pjrt.reset_eager_stats()
    y = x + x
    z = x + torch.ones(3)[0]  # a CPU scalar tensor: the Python kernel allows it, as with CUDA
    counts = torch_pjrt.eager_stats()["paths"]["aten::add.Tensor"]
    assert (counts["fast"], counts["python_kernel"]) == (1, 1)
    # fused: the fast call recorded in C++ (a new signature too: recorder.cpp asks Python for it,
    # then records), the Python kernel's call by the Python recorder
    recorded = (1, 1) if mode == "fused" else (0, 0)
    assert (counts["cpp_recorder"], counts["python_recorder"]) == recorded
    assert torch.equal((y + z).cpu(), torch.full((3,), 4.0))


def test_factories_take_the_fast_path_on_their_device(mode):
    """A factory's device argument says where it runs: on the current device the C++ kernel
    serves it; on another device it commits its result there (the Python kernel); a device
    other than the operands' is the Python kernel's to check. Values equal the CPU's."""
    torch_pjrt.reset_eager_stats()
    made = [torch.scalar_tensor(2.5, device="pjrt"), torch.arange(1, 7, 2, device="pjrt"),
            torch.full((2, 3), 7, dtype=torch.int16, device="pjrt"),
            torch.ones_like(torch.zeros(2, 3, device="pjrt"), dtype=torch.float64)]
    counts = torch_pjrt.eager_stats()["paths"]
    for name in ("aten::scalar_tensor", "aten::arange.start_step", "aten::full", "aten::ones_like"):
        assert (counts[name]["fast"], counts[name]["python_kernel"]) == (1, 0), (name, counts[name])
    expected = [torch.scalar_tensor(2.5), torch.arange(1, 7, 2), torch.full((2, 3), 7, dtype=torch.int16),
                torch.ones(2, 3, dtype=torch.float64)]
    for got, want in zip(made, expected):
        assert got.device == torch.device("pjrt", 0) and got.dtype == want.dtype
        assert torch.equal(got.cpu(), want)
    with torch.pjrt.device(1):
        on_one = torch.arange(3.0, device="pjrt") + torch.scalar_tensor(1.0, device="pjrt:1")
    assert on_one.device == torch.device("pjrt", 1)
    assert torch.equal(on_one.cpu(), torch.arange(3.0) + 1)
    moved = torch.full_like(made[2], 5, device="pjrt:1")  # another device than its operand's, as CUDA allows
    assert moved.device == torch.device("pjrt", 1) and moved.dtype == torch.int16
    assert torch.equal(moved.cpu(), torch.full((2, 3), 5, dtype=torch.int16))



def test_a_factory_on_a_device_that_does_not_exist_raises_and_leaves_nothing_behind(mode):
    """As the device guard says it, at the call; the next call of the thread is not affected
    (a recorded call for the missing device once made it fail with JAX's IndexError)."""
    for make in (lambda: torch.arange(3, device="pjrt:5"), lambda: torch.full((2,), 1.0, device="pjrt:7"),
                 lambda: torch.ones_like(torch.ones(2, device="pjrt"), device="pjrt:9")):
        with pytest.raises(IndexError, match=r"invalid device index \d; this process has 2 pjrt device"):
            make()
    assert torch.equal((torch.ones(2, device="pjrt") + 1).cpu(), torch.full((2,), 2.0))


LIKE_DEVICES = """
import torch
x = torch.ones(2, device="pjrt:1")
print([str(t.device) for t in (torch.ones_like(x), torch.full_like(x, 3), torch.zeros_like(x, device="pjrt:0"))])
"""


def test_like_ops_follow_their_operand_or_device_argument_in_the_python_kernels_too():
    """The Python kernels decide what the C++ kernel leaves to them: `ones_like(x)` on pjrt:1 stays
    there (pjrt:0, the current device, was once returned), a device argument wins."""
    run = subprocess.run([sys.executable, "-c", LIKE_DEVICES], capture_output=True, text=True, timeout=300,
                         env=environment(TORCH_PJRT_EAGER_FAST_PATH="0", TORCH_PJRT_PLATFORM="cpu",
                                         TORCH_PJRT_CPU_DEVICES="2"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[-2] == "['pjrt:1', 'pjrt:1', 'pjrt:0']"


def test_indexing_ops_queue_their_checks_from_cpp(mode):
    """In fused mode an indexing op's C++ kernel records the op with its bounds checks folded in
    (index_checks.folded) and queues them: good calls give CPU's values, and a bad index of a
    steady signature raises CPU's error at the next sync, naming the op, on another device too."""
    for device in ("pjrt:0", "pjrt:1"):
        table = torch.arange(15.0).reshape(5, 3)
        x, cache, expected = table.to(device), torch.zeros(5, 3, device=device), torch.zeros(5, 3)
        for rows in ([0, 2], [4, 1], [3, 3]):  # the same signature each time: recorded in C++ from the second
            index = torch.tensor(rows, device=device)
            cache.index_copy_(0, index, torch.index_select(x, 0, index) + torch.nn.functional.embedding(index, x))
            expected.index_copy_(0, torch.tensor(rows), 2 * torch.index_select(table, 0, torch.tensor(rows)))
        torch.testing.assert_close(cache.cpu(), expected)
        torch_pjrt.reset_eager_stats()
        cache.index_copy_(0, torch.tensor([1, 9], device=device), x[:2])
        counts = torch_pjrt.eager_stats()["paths"]["aten::index_copy_"]
        served_in_cpp = (1, 0, 1) if mode == "fused" else (0, 1, 0)
        assert (counts["fast"], counts["python_kernel"], counts["cpp_recorder"]) == served_in_cpp, counts
        with pytest.raises(IndexError, match=r"index_copy_\(\): index 9 is out of bounds for dimension 0 with size 5"
                                             r"\n\(an earlier call of aten.index_copy"):
            cache.cpu()


def test_dtype_conversions_on_the_device_take_the_fast_path(mode):
    """`.to(dtype)`, `.float()`, `.to(device, dtype)` of a row-major pjrt tensor on its own device is
    the op table's `_to_copy` on the C++ path (HF's generate converts masks and logits every token);
    other layouts and copies between devices stay in transfer.to_copy. Values, dtypes and strides are
    the CPU's."""
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)) * 4
    px = x.to("pjrt")
    torch_pjrt.reset_eager_stats()
    conversions = [lambda t: t.to(torch.float64), lambda t: t.half(), lambda t: t.to(torch.bfloat16),
                   lambda t: t.int(), lambda t: t.bool(), lambda t: t.to(t.device, torch.float16),
                   lambda t: t.to(dtype=torch.float64, memory_format=torch.contiguous_format),
                   lambda t: t.t().to(torch.float64, memory_format=torch.contiguous_format)]
    got = [convert(px) for convert in conversions]
    counts = torch_pjrt.eager_stats()["paths"]["aten::_to_copy"]
    assert (counts["fast"], counts["python_kernel"]) == (len(conversions), 0), counts
    kept_layout = [lambda t: t.t().double(), lambda t: t[:, ::2].half()]  # preserve_format of a non-contiguous view
    got += [convert(px) for convert in kept_layout]
    counts = torch_pjrt.eager_stats()["paths"]["aten::_to_copy"]
    assert counts["python_kernel"] == len(kept_layout), counts
    for convert, value in zip(conversions + kept_layout, got):
        want = convert(x)
        assert value.device == px.device and value.dtype == want.dtype and value.stride() == want.stride()
        assert torch.equal(value.cpu(), want)


def test_copies_between_the_host_and_pjrt_take_the_fast_path(mode):
    """A row-major upload in the same dtype (a batch's `.to(device)`) and a whole storage read back
    (`.cpu()` of a loss, a token) are ToCopyKernel's in C++: equal to the source, the source stays
    the user's to change (the CPU client aliases host memory), the read is a host sync (a queued
    index check raises there); other copies (a view, a dtype change on the way, bfloat16's upload)
    stay in transfer.to_copy."""
    g = torch.Generator().manual_seed(0)
    sources = [torch.randn(3, 4, generator=g), torch.arange(6), torch.tensor([True, False]), torch.tensor(2.5),
               torch.randn(2, 3, generator=g, dtype=torch.complex64), torch.empty(0, 3)]
    torch_pjrt.reset_eager_stats()
    uploaded = [s.to("pjrt") for s in sources]
    read = [u.cpu() for u in uploaded]
    counts = torch_pjrt.eager_stats()["paths"]["aten::_to_copy"]
    assert (counts["fast"], counts["python_kernel"]) == (2 * len(sources), 0), counts
    for s, u, r in zip(sources, uploaded, read):
        assert u.device.type == "pjrt" and r.device.type == "cpu" and r.dtype == s.dtype
        assert torch.equal(r, s)
    before = sources[0].clone()
    sources[0].add_(1)
    assert torch.equal(uploaded[0].cpu(), before)
    slow = [lambda: sources[0].t().to("pjrt"), lambda: uploaded[0][:, 1].cpu(),
            lambda: uploaded[0].to("cpu", torch.float64), lambda: sources[0].bfloat16().to("pjrt")]
    torch_pjrt.reset_eager_stats()
    for copy in slow:
        copy()
    assert torch_pjrt.eager_stats()["paths"]["aten::_to_copy"]["python_kernel"] == len(slow)
    x = torch.zeros(4, device="pjrt")
    picked = x[torch.tensor([7], device="pjrt")]
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        picked.cpu()


def test_in_place_writes_of_a_whole_storage_reshape_take_the_fast_path(mode):
    """A tensor that is a reshape of its whole storage (a bias gradient: a (96,) view of a (1, 96)
    sum) written in place (clip_grad_norm_'s `_foreach_mul_`, `mul_`) replaces its storage's buffer
    in C++, as storage.write does; the base and other views read the new values, as on CPU."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    results = {}
    for device in ("cpu", "pjrt"):
        base = x.to(device).sum(0, keepdim=True)
        flat, grid = base.view(6), base.view(2, 3)
        torch_pjrt.reset_eager_stats()
        flat.mul_(2)
        torch._foreach_mul_([flat], torch.tensor(0.5, device=device))
        grid.add_(1)
        if device == "pjrt":
            counts = torch_pjrt.eager_stats()["paths"]
            for name in ("aten::mul_.Tensor", "aten::_foreach_mul_.Tensor", "aten::add_.Tensor"):
                assert counts[name]["python_kernel"] == 0, (name, counts[name])
        results[device] = [t.cpu() for t in (base, flat, grid)]
    for got, want in zip(results["pjrt"], results["cpu"]):
        assert got.shape == want.shape and torch.equal(got, want)


def test_hf_generate_steady_decode_steps_stay_in_cpp():
    """HF generate() on the tiny Llama (its dynamic cache: appends onto padded storages, attention
    over them): once warm, a decode step enters no Python kernel and no Python recorder, except the
    steps whose cache crosses a capacity (16, 32: the padded storages grow there, in Python) and the
    prompt's first two exact lengths; the tokens equal CPU torch's (fused mode, the default)."""
    pytest.importorskip("transformers")
    from transformers import LogitsProcessor, LogitsProcessorList

    from torch_pjrt.tools import bench_llm

    class CountsPerStep(LogitsProcessor):
        def __init__(self):
            self.seen = []

        def __call__(self, input_ids, scores):
            counts = torch_pjrt.eager_stats()["paths"].values()
            self.seen.append((input_ids.shape[1], sum(c["python_kernel"] + c["python_recorder"] for c in counts)))
            return scores

    before = torch_pjrt.eager_mode()
    torch_pjrt.set_eager_mode("fused")
    try:
        lm = bench_llm.causal_lm(None, 128)
        torch.manual_seed(0)
        cpu = lm.build().eval()
        dev = lm.build().to("pjrt").eval()
        prompt = torch.randint(0, 500, (1, 12), generator=torch.Generator().manual_seed(5))
        kwargs = dict(do_sample=False, pad_token_id=0, max_new_tokens=30, min_new_tokens=30)
        with torch.no_grad():
            dev.generate(prompt.to("pjrt"), **kwargs)  # warm-up: every shape and region seen
            per_step = CountsPerStep()
            torch_pjrt.reset_eager_stats()
            got = dev.generate(prompt.to("pjrt"), logits_processor=LogitsProcessorList([per_step]), **kwargs)
            want = cpu.generate(prompt, **kwargs)
    finally:
        torch_pjrt.set_eager_mode(before)
    assert torch.equal(got.cpu(), want)
    entered = {length: after - before for (_, before), (length, after) in zip(per_step.seen, per_step.seen[1:])}
    growing = {13, 14, 16, 17, 32, 33}  # the prompt's next two exact lengths; each capacity and the step after
    assert {length for length, n in entered.items() if n} <= growing, entered
    assert sum(1 for length, n in entered.items() if not n) >= len(entered) - len(growing), entered


def test_cpu_dispatch_follows_its_variable():
    """XLA:CPU hands a program to its thread pool (JAX's default) unless TORCH_PJRT_CPU_ASYNC_DISPATCH=0
    runs it on the calling thread (runtime/platform.py; docs/eager.md)."""
    import os

    import jax

    expected = os.environ.get("TORCH_PJRT_CPU_ASYNC_DISPATCH", "1") != "0"
    assert jax.config.values["jax_cpu_enable_async_dispatch"] is expected
