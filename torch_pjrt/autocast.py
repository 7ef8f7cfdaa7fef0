"""`torch.autocast("pjrt", dtype=torch.bfloat16 or torch.float16)` with CUDA's cast lists.

torch has no autocast rules for a PrivateUse1 device: without a kernel on the
AutocastPrivateUse1 key every op fails inside `torch.autocast("pjrt")`. `register()`
installs a fallthrough for that key (ops not on a list run unchanged, as on CUDA) and one
Python kernel per listed overload that casts the arguments and calls the op again with the
autocast key excluded, as aten/src/ATen/autocast_mode.cpp does for CUDA:

* lower precision: tensor arguments go to the autocast dtype (matmuls, convolutions, linear, RNN cells);
* float32: tensor arguments go to float32 (pointwise ops that lose range, norms, losses, softmax
  via its dtype argument, reductions);
* promote: tensor arguments go to the widest floating type among them.

Only floating pjrt tensors other than float64 are cast (CUDA's `is_eligible`). The backward
pass runs outside autocast, as on CUDA. Unlike CUDA, casts of weights are not cached
across uses within one autocast region: each use casts again (same values, more ops).
"""
from __future__ import annotations

import torch

from .eager.fallback import flat_arguments

aten = torch.ops.aten
_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_DEVICE_TYPE = "pjrt"

# CUDA's policy, one source: autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCUDA, m), torch 2.13.
# Not traits of op entries: most of these ops are composites with no lowering (linear,
# conv2d, layer_norm, the losses), and the policy is CUDA's, not the table's. torch is the
# oracle for which ops have a rule (tests/test_autocast.py compares the lists with the
# AutocastCUDA registrations of the running torch); the policy kind cannot be read back from
# the dispatcher (every kernel is registered from the same macro line, with no policy in its
# debug name), so the lists name it, and the tests check it against CUDA autocast run on fake
# CUDA tensors. Where the lists name an overload CUDA has no kernel for (conv1d.padding, the
# upsample .vec overloads), it is a CompositeImplicitAutograd op that CUDA casts after its
# decomposition; casting before it gives the same result.
LOWER_PRECISION = [
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "conv1d.padding", "conv2d.padding", "conv3d.padding",
]
FLOAT32 = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm", "rms_norm",
    "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    "upsample_nearest1d.vec", "_upsample_nearest_exact1d.vec", "upsample_nearest2d.vec",
    "_upsample_nearest_exact2d.vec", "upsample_nearest3d.vec", "_upsample_nearest_exact3d.vec",
    "upsample_linear1d.vec", "upsample_bilinear2d.vec", "_upsample_bilinear2d_aa.vec", "upsample_trilinear3d.vec",
    "upsample_bicubic2d.vec", "_upsample_bicubic2d_aa.vec",
    # fp32_append_dtype on CUDA (norm gets dtype=float32): casting the input gives the same result
    "norm.Scalar", "norm.ScalarOpt_dim", "norm.names_ScalarOpt_dim",
]
# fp32_set_opt_dtype: when the first argument is eligible and no dtype was given, dtype=float32
FLOAT32_DTYPE = [
    "prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname", "log_softmax.int",
    "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum", "cumsum.dimname", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList", "sum.dim_DimnameList",
]
PROMOTE = [
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
    "tensordot", "scatter_add",
]
# CUDA refuses binary_cross_entropy under autocast (unsafe in float16); so do we, with CUDA's message
BANNED = ["binary_cross_entropy"]


def _eligible(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.device.type == _DEVICE_TYPE and x.is_floating_point()
            and x.dtype != torch.float64)


def _cast(x, dtype):
    """x with every eligible tensor in it (also inside lists, e.g. einsum's operands) cast."""
    if _eligible(x) and x.dtype != dtype:
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _lower_precision(op):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype(_DEVICE_TYPE)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})
    return kernel


def _float32(op):
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*_cast(args, torch.float32), **{k: _cast(v, torch.float32) for k, v in kwargs.items()})
    return kernel


def _float32_dtype(op):
    names = [a.name for a in op._schema.arguments]
    position = names.index("dtype")

    def kernel(*args, **kwargs):
        given = args[position] if len(args) > position else kwargs.get("dtype")
        if given is None and args and _eligible(args[0]):
            if len(args) > position:
                args = args[:position] + (torch.float32,) + args[position + 1:]
            else:
                kwargs = {**kwargs, "dtype": torch.float32}
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return kernel


def _promote(op):
    def kernel(*args, **kwargs):
        widest = torch.get_autocast_dtype(_DEVICE_TYPE)
        for x in flat_arguments(args, kwargs):
            if _eligible(x):
                widest = torch.promote_types(widest, x.dtype)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*_cast(args, widest), **{k: _cast(v, widest) for k, v in kwargs.items()})
    return kernel


def _banned(op):
    def kernel(*args, **kwargs):
        raise RuntimeError(
            "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
            "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
            "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
            "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
            "safe to autocast.")
    return kernel


def _overload(name: str):
    """aten overload for "op" or "op.overload"; None when this torch lacks it."""
    base, _, overload = name.partition(".")
    packet = getattr(aten, base, None)
    return None if packet is None else getattr(packet, overload or "default", None)


_libraries: list = []  # registrations live as long as their Library objects


def rules() -> dict:
    """{overload: policy name} of every op autocast casts on pjrt."""
    table = {}
    for policy, names in (("lower_precision", LOWER_PRECISION), ("float32", FLOAT32),
                          ("float32_dtype", FLOAT32_DTYPE), ("promote", PROMOTE), ("banned", BANNED)):
        for name in names:
            op = _overload(name)
            if op is not None:
                table[op] = policy
    return table


_MAKERS = {"lower_precision": _lower_precision, "float32": _float32, "float32_dtype": _float32_dtype,
           "promote": _promote, "banned": _banned}


def register() -> None:
    """Install the AutocastPrivateUse1 fallthrough and cast kernels. Idempotent."""
    if _libraries:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    kernels = torch.library.Library("aten", "IMPL")
    for op, policy in rules().items():
        name = op._schema.name.split("::")[1] + ("" if op._overloadname == "default" else "." + op._overloadname)
        kernels.impl(name, _MAKERS[policy](op), _KEY)
    _libraries.extend([fallthrough, kernels])
