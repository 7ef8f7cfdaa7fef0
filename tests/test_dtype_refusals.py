"""A dtype neither CPU nor CUDA torch has a kernel for raises CPU's error on pjrt (XLA would
compute it): torch's meta kernels accept every dtype, so eager checks a call's first tensor
against ops/cpu_refused_dtypes.json (tools/cpu_dtypes.py, learned from the OpInfos) and lets
CPU's own call decide. A dtype CUDA computes is computed, as CUDA does."""
from __future__ import annotations

import pytest
import torch

from tests.ops.harness import assert_raises_like_cpu
from torch_pjrt.eager import errors

_Z = torch.tensor([[1 + 1j, 2 - 1j], [0.5j, 3.0]])
REFUSED = {
    "amax complex": lambda d: torch.amax(_Z.to(d)),
    "max complex": lambda d: torch.max(_Z.to(d)),
    "sort complex": lambda d: torch.sort(_Z.to(d)),
    "amax complex out=": lambda d: torch.amax(_Z.to(d), 0, out=torch.empty(0, dtype=_Z.dtype, device=d)),
    "cholesky half": lambda d: torch.linalg.cholesky(torch.eye(3, dtype=torch.half, device=d)),
    "logcumsumexp int": lambda d: torch.logcumsumexp(torch.arange(4, device=d), 0),
    "mm bool": lambda d: torch.ones(2, 2, dtype=torch.bool, device=d) @ torch.ones(2, 2, dtype=torch.bool, device=d),
    "unique complex": lambda d: torch.unique(_Z.to(d)),
    # CPU's cross does not promote (pjrt's computed int x float)
    "cross mixed dtypes": lambda d: torch.linalg.cross(torch.ones(3, dtype=torch.long, device=d), torch.ones(3, device=d)),
    "cross out= of another dtype": lambda d: torch.cross(torch.ones(3, dtype=torch.long, device=d), torch.ones(3, device=d),
                                                         out=torch.empty(3, device=d)),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_dtype_cpu_and_cuda_refuse_raises_cpus_error(case):
    with pytest.raises(Exception) as cpu:
        REFUSED[case]("cpu")
    with pytest.raises(Exception) as pjrt:
        REFUSED[case]("pjrt")
        torch.pjrt.synchronize()
    assert type(pjrt.value) is type(cpu.value) and str(pjrt.value) == str(cpu.value)


def test_a_dtype_cuda_computes_is_computed():
    x = torch.randint(0, 8, (50,), dtype=torch.int32)  # CPU refuses integer histc, CUDA counts it
    assert torch.histc(x.to("pjrt"), bins=8, min=0, max=7).cpu().tolist() == \
        torch.histc(x.double(), bins=8, min=0, max=7).int().tolist()


def test_a_listed_dtype_cpu_accepts_in_this_call_is_computed_and_forgotten(monkeypatch):
    """The table keys the first tensor's dtype; `floor_divide(bool, int)` promotes to int, which CPU
    accepts (two bools it refuses): that call runs, and such calls are not asked again."""
    from torch_pjrt.runtime import executable_store

    # The check runs where the call is traced: not when an executable of the same signature is read
    # from the store (kept by an earlier process or another test worker) or traced earlier in this
    # process. No store, and shapes no other test uses.
    monkeypatch.setitem(executable_store._state, "folder", None)
    monkeypatch.setattr(errors, "_DTYPE_ACCEPTED", set())  # (a call earlier in this process may have been accepted)
    op = torch.ops.aten.floor_divide.default
    assert torch.bool in errors.refused_dtypes(op)
    a = torch.tensor([True, False, True, True, False, True, False]).reshape(7, 1, 1)
    b = torch.tensor([2, 3, -1, 5, -7]).reshape(1, 5, 1)
    assert torch.equal(torch.floor_divide(a.to("pjrt"), b.to("pjrt")).cpu(), torch.floor_divide(a, b))
    assert errors._DTYPE_ACCEPTED == {(op, torch.bool, False, False, ())}


def test_a_string_argument_cpu_accepted_speaks_for_that_argument_only():
    """CPU's scatter_reduce sums bools but has no bool mean: accepting reduce="sum" must not let
    reduce="mean" through (a whole run once computed the mean after the sum had been asked)."""
    def call(d, reduce):
        x = torch.tensor([True, False, True, False, True], device=d)
        index = torch.tensor([0, 1, 0, 1, 2], device=d)
        return torch.zeros(3, dtype=torch.bool, device=d).scatter_reduce(0, index, x, reduce)

    assert torch.equal(call("pjrt", "sum").cpu(), call("cpu", "sum"))
    assert_raises_like_cpu(lambda d: call(d, "mean"), "scatter_reduce mean of bools")


# A call's `dtype=` argument is the dtype CPU's kernel dispatches on: factories have no tensor, and
# cumsum of a float tensor into bool is refused though cumsum of a bool tensor (computed in int64)
# is accepted: accepting the second must not let the first through.
DTYPE_ARGUMENT_REFUSED = {
    "arange bool": lambda d: torch.arange(0, 5, dtype=torch.bool, device=d),
    "arange complex": lambda d: torch.arange(0, 5, 2, dtype=torch.complex64, device=d),
    "linspace bool": lambda d: torch.linspace(0, 5, 3, dtype=torch.bool, device=d),
    "randn int": lambda d: torch.randn(3, dtype=torch.int32, device=d),
    "cumsum float into bool": lambda d: torch.cumsum(torch.ones(3, device=d), 0, dtype=torch.bool),
}


@pytest.mark.parametrize("name", DTYPE_ARGUMENT_REFUSED)
def test_a_refused_dtype_argument_raises_as_cpu(name):
    torch.cumsum(torch.ones(3, dtype=torch.bool, device="pjrt"), 0)  # CPU accepts: a bool tensor's cumsum
    assert_raises_like_cpu(DTYPE_ARGUMENT_REFUSED[name], name)


def test_common_dtypes_of_hot_ops_are_not_listed():
    """A listed (op, dtype) costs its first call a CPU run of the same arguments: never for what
    models compute (bfloat16 and float16 matmuls, float casts, copies)."""
    for op in ("aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten._to_copy.default",
               "aten.copy_.default", "aten.add.Tensor", "aten.mul.Tensor", "aten._softmax.default"):
        listed = errors._CPU_REFUSED.get(op, set())
        assert not listed & {torch.float16, torch.bfloat16, torch.float32, torch.float64}, (op, listed)
