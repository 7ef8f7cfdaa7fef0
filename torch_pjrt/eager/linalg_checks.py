"""Host checks of linalg ops that an XLA executable cannot raise. check_errors=True of the linalg
`_ex` factorizations and solves: after the table's kernel, the
info it returned is checked on the host by torch's own `_linalg_check_errors`, as CPU's and CUDA's
kernels do (a LinAlgError naming the function, the batch element and the failing minor or pivot).
An XLA executable cannot raise, so the lowerings return info and nothing else checks it: pjrt gave
a factor of a singular matrix where CPU raises (test_linalg's test_cholesky_ex_non_pd).
The composite `linalg.cholesky`, `linalg.inv` and friends call the `_ex` ops with
check_errors=False and check info themselves; this is for the `_ex` functions called directly.
linalg.eig refuses a matrix with infs or NaNs, as CPU's kernel does (test_eig_with_nan); LAPACK's
geev would return NaNs for it."""
from __future__ import annotations

import torch

from ..ops.signature import Signature

aten = torch.ops.aten

# op -> the name its CPU kernel gives _linalg_check_errors (the errors' first words)
API_NAMES = {
    aten.linalg_cholesky_ex.default: "linalg.cholesky_ex",
    aten.linalg_inv_ex.default: "linalg.inv_ex",
    aten.linalg_lu_factor_ex.default: "torch.linalg.lu_factor_ex",
    aten._linalg_solve_ex.default: "torch.linalg.solve_ex",
    aten.linalg_ldl_factor_ex.default: "torch.linalg.ldl_factor_ex",
}


class CheckedErrors:
    """The table's kernel of an `_ex` op (info its last output), then CPU's check where asked."""

    def __init__(self, kernel, api_name: str):
        self.kernel, self.api_name = kernel, api_name
        self.sig = Signature.of(kernel.op)
        self.check_errors = self.sig.names.index("check_errors")

    def __call__(self, *args, **kwargs):
        result = self.kernel(*args, **kwargs)
        values = self.sig.bind(args, kwargs)
        if values[self.check_errors]:
            aten._linalg_check_errors(result[-1], self.api_name, is_matrix=values[0].dim() == 2)
        return result


class FiniteInput:
    """CPU's check that the input holds no inf or NaN (a host read of one bool), then the table's kernel."""

    def __init__(self, kernel, message: str):
        self.kernel, self.message = kernel, message

    def __call__(self, self_, *args, **kwargs):
        if not torch.isfinite(self_).all().item():
            raise RuntimeError(self.message)
        return self.kernel(self_, *args, **kwargs)


def kernels() -> dict:
    """PrivateUse1 kernels that replace a lowering's (eager/kernels.register's `special`)."""
    from ..ops.registry import LOWERINGS
    from .kernels import Kernel

    eig = aten.linalg_eig.default
    return {op: CheckedErrors(Kernel(LOWERINGS[op]), name) for op, name in API_NAMES.items()} | {
        eig: FiniteInput(Kernel(LOWERINGS[eig]), "torch.linalg.eig: input tensor should not contain infs or NaNs.")}
