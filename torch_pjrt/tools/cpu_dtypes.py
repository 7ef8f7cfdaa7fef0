"""Which aten ops neither CPU nor CUDA torch has a kernel for in which dtypes, learned from
PyTorch's OpInfos.

torch's meta kernels accept every dtype; CPU's kernels refuse many ("max_values_cpu" not
implemented for 'ComplexFloat', "cholesky_cpu" not implemented for 'Half'), and XLA computes
most of them anyway. So eager checks a call's dispatch dtype (its `dtype` argument where given,
else its first tensor's) against this table at trace time (errors.meta_check), and where it is listed, CPU's own call decides what to raise.

For every OpInfo and every dtype its CPU and CUDA lists leave out, a sample per input rank runs on the CPU
under a dispatch mode that notes each aten op the error passed through, with the dtype of
that op's dispatch dtype; the table is those (op, dtype) pairs where that dtype is the
sample's and CPU's error names it (or its kind: complex, boolean, integral).

    python -m torch_pjrt.tools.cpu_dtypes          # rewrites torch_pjrt/ops/cpu_refused_dtypes.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import re
import signal
import warnings

TABLE = pathlib.Path(__file__).resolve().parents[1] / "ops" / "cpu_refused_dtypes.json"

DTYPE_NAMES = {"torch.bool": "Bool", "torch.uint8": "Byte", "torch.int8": "Char", "torch.int16": "Short",
               "torch.int32": "Int", "torch.int64": "Long", "torch.float16": "Half", "torch.bfloat16": "BFloat16",
               "torch.float32": "Float", "torch.float64": "Double", "torch.complex64": "ComplexFloat",
               "torch.complex128": "ComplexDouble"}


def _names(dtype, message: str) -> bool:
    """Whether CPU's error is about `dtype` ("not implemented for 'Half'", "Sort does not support
    complex dtypes", "may not be a boolean tensor"), not about the sample's other arguments."""
    words = {f"'{DTYPE_NAMES[str(dtype)]}'", str(dtype)[len("torch."):]}
    words |= {"complex"} if dtype.is_complex else {"bool"} if str(dtype) == "torch.bool" else set()
    words |= {"integral", "integer"} if not dtype.is_floating_point and not dtype.is_complex else set()
    if any(re.search(rf"(?<![\w.:]){re.escape(n)}\b", message) for n in _other_names(dtype)):
        return False  # a mismatch of two dtypes ("c10::BFloat16 != float"): bf16 mm itself is fine
    message = message.lower()
    return any(w.lower() in message for w in words)


_CPP_NAMES = {"torch.float32": "float", "torch.float64": "double", "torch.float16": "c10::Half",
              "torch.bfloat16": "c10::BFloat16", "torch.int64": "long", "torch.int32": "int", "torch.bool": "bool"}


def _other_names(dtype) -> list[str]:
    """How errors name the dtypes other than `dtype`: c10's names, C++'s, torch's."""
    names = []
    for torch_name, c10 in DTYPE_NAMES.items():
        if torch_name != str(dtype):
            names += [c10, torch_name] + ([_CPP_NAMES[torch_name]] if torch_name in _CPP_NAMES else [])
    return names


def _dispatch_dtype(func, args, kwargs):
    """The dtype the call of aten op `func` dispatches on, by eager's rule
    (errors.dispatch_dtype: its `dtype` argument where given, else its first tensor's)."""
    from ..eager.errors import dispatch_dtype
    from ..ops.signature import Signature

    try:
        sig = Signature.of(func)
        dtype, _ = dispatch_dtype(sig.names, sig.kinds, sig.bind(args, kwargs))
    except (AttributeError, TypeError):  # not an aten overload with a schema
        return None
    return dtype


def refusals(seconds_per_case: int = 20) -> dict[str, list[str]]:
    """{aten overload name: [dispatch dtypes CPU refuses]}."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from .conformance import all_opinfos

    class Innermost(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.failed = []  # (op, its dispatch dtype), innermost first

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            try:
                return func(*args, **kwargs)
            except Exception:
                dtype = _dispatch_dtype(func, args, kwargs)
                self.failed.append((str(func), str(dtype) if dtype is not None else None))
                raise

    def expire(*_):
        raise TimeoutError

    signal.signal(signal.SIGALRM, expire)

    def refusals_of(op, dtype) -> set:
        """refusal() per input rank among the OpInfo's first 30 samples (1-d, 2-d and 3-d
        upsampling each reach an op of their own): a rank's samples until one is refused, at most
        5 (a factory's first samples may run no kernel: linspace of 0 and 1 steps; all of them)."""
        found, tried = set(), {}
        samples = _samples(op, dtype)
        for sample in samples:
            rank = getattr(sample.input, "ndim", None)
            if tried.get(rank, 0) < (30 if rank is None else 5):  # a factory's samples: cheap
                refused = refusal(op, dtype, sample)
                found.update(refused)
                tried[rank] = 5 if refused else tried.get(rank, 0) + 1
        return found

    def _samples(op, dtype) -> list:
        """The OpInfo's first 30 samples in `dtype`; where it makes none (max_unpool's come from max_pool,
        eigh's from an SVD, neither of which takes bool), its samples in a dtype it declares, their
        tensors of that dtype converted to `dtype` (CPU's kernels of eigh, max_unpool2d, searchsorted and
        _softmax_backward_data refuse bool or complex, and were never asked)."""
        declared = [d for d in (torch.float32, torch.float64, torch.int64) if d in op.supported_dtypes("cpu")]
        for made_in in [dtype] + declared[:1]:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    samples = list(itertools.islice(op.sample_inputs("cpu", made_in), 30))
            except Exception:  # noqa: BLE001  (no samples in this dtype)
                continue
            if samples and made_in != dtype:
                def convert(x):
                    return x.to(dtype) if isinstance(x, torch.Tensor) and x.dtype == made_in else x

                samples = [s.transform(convert) for s in samples]
            if samples:
                return samples
        return []

    def refusal(op, dtype, sample) -> list:
        """[(aten op, dtype)] where CPU refuses `sample` in `dtype` for that dtype: the op that
        raised and every op above it that passed it on (eager lowers some of them whole:
        nanmean, where CPU's nansum refuses complex)."""
        signal.alarm(seconds_per_case)
        mode = Innermost()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with mode:
                    op(sample.input, *sample.args, **sample.kwargs)
        except Exception as e:  # noqa: BLE001  (a refusal, or an error of the sample's own)
            if _names(dtype, str(e)):
                return [f for f in mode.failed if f[1] == str(dtype)]
        finally:
            signal.alarm(0)
        return []

    refused, cuda_only = set(), set()
    everything = [getattr(torch, n[len("torch."):]) for n in DTYPE_NAMES]
    for _, op in all_opinfos():
        cpu, cuda = op.supported_dtypes("cpu"), op.supported_dtypes("cuda")
        for dtype in everything:
            if dtype not in cpu:
                # CUDA's behaviour is the default answer: an aten op CUDA has a kernel of in this
                # dtype (integer histc), through any OpInfo, is computed, whatever CPU says
                (cuda_only if dtype in cuda else refused).update(refusals_of(op, dtype))
    table: dict[str, list] = {}
    for op, dtype in sorted(refused - cuda_only):
        table.setdefault(op, []).append(dtype)
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(TABLE))
    args = parser.parse_args(argv)
    import torch

    table = refusals()
    payload = {"torch": torch.__version__, "refused": table}
    pathlib.Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")
    print(f"{len(table)} ops, {sum(map(len, table.values()))} (op, dtype) refusals -> {args.out}")


if __name__ == "__main__":
    main()
