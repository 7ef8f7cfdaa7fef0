"""The op table: one registry of lowerings, aten overload -> JAX function.

A lowering is a pure function named after its op. It receives the op's arguments
exactly as the aten schema orders and names them, with:
  * Tensor / Tensor? / Tensor[] arguments as jax arrays (None where absent);
  * Scalar arguments as traced, weakly typed JAX scalars (so a new value does not
    recompile), unless the lowering lists them in `static=`; never branch on them in
    Python, use jnp.where;
  * every other argument (int, int[], float, bool, str, dtype, ...) as a plain Python
    value, static for the executable, unless the lowering lists it in `traced=`: an
    argument that does not fix an output shape (roll's shifts, tril's diagonal, a scatter's
    index) arrives as a traced weak JAX scalar (a list of them for int[]), so a new value
    does not compile again. The lowering then cannot check it in Python; where torch
    refuses some values, the entry's `in_range` tells eager (on the host, before the call)
    when to let CPU torch decide the exception. Graphs pass such arguments as JAX scalars
    too, and lowerings also accept plain Python numbers.
  * an argument the entry lists in `split=` (name -> rule) as a `Split`: its value traced
    as above (`.value`), and its static part `.static` = rule(value), which keys the
    executable. For a number whose value fixes no shape but some property of it does
    (embedding_bag's padding_idx: whether there is one decides offset2bag's shape), so the
    values of one static part share an executable. Eager serves such calls in Python (the
    C++ fast path keys static arguments by value and operands by aval only).
Random ops take their randomness from a `generator` argument that arrives as a traced
64-bit seed drawn from the torch generator (ops.random.key turns it into a JAX key).
It returns a jax array, or a tuple of them for multi-output ops, with exactly the dtype
and shape PyTorch gives (use `ops.promotion` for dtypes). In-place (`op_`) and `out=`
overloads are derived from the functional lowering; do not register them. Where an op
writes its arguments and has no functional form (random `op_`s, batch norm's running
statistics), register the lowering on that op: it returns the written arguments' new
values in schema order (just the array when only `self` is written), then the op's other
outputs.

An entry is the whole description of its op: besides the function it carries the traits
its consumers read (how padded execution treats it, which index tensors eager checks,
whether eager derives its kernel from it, what eager runs in place of torch's decomposition,
how it runs over storages that grow along one axis (ops/growth.py), its tests' special
cases). The consumers (eager kernels, the torch.compile
interpreter and its padding, custom kernels) keep no per-op tables of their own, and the
table knows nothing of them.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import jax
import torch
from torch._prims_common import suggest_memory_format

OpOverload = torch._ops.OpOverload


def refusal(error: Exception) -> Exception:
    """Mark `error`, raised by a lowering in torch's type and words, as the op's own refusal of
    the call: eager raises it as it is, without running the call on CPU (the oracle), so pjrt's
    answer does not depend on the host CPU (torch's CPU kernels differ by ISA: with oneDNN's
    float8 path, CPU _scaled_mm takes float64 scales, which CUDA and CPU's reference path refuse)
    and is given where CPU's kernel must not run (repeat_interleave's negative counts with an
    output_size: CPU writes past its result before it refuses)."""
    error.pjrt_refusal = True
    return error


@dataclass(frozen=True)
class Padding:
    """How padded execution (compiler/padding.py) runs an op over zero-padded dynamic dims:
    the name of its rule there, and the rule's parameters (a reduction's identity)."""

    rule: str
    identity: str | None = None  # reductions: "zero", "one", "low", "high"


POINTWISE = Padding("pointwise")  # elementwise with broadcasting: junk stays where it was
SAME = Padding("same")  # one input, output laid out like it (clone, fill, ...)
FACTORY = Padding("factory")  # a new tensor whose shape comes from the graph's sizes
BATCH_ONLY = Padding("batch_only")  # independent per sample of dim 0 (pooling)


def reduction(identity: str) -> Padding:
    """A reduction over `dim` (all dims without one): padded elements become `identity` first."""
    return Padding("reduction", identity)


@jax.tree_util.register_pytree_node_class
class Split:
    """An argument an entry lists in `split=`: `value` traced (a weakly typed JAX scalar, or a
    Python number in a graph), `static` its static part. A pytree whose aux data is the static
    part, so jax.jit and fused eager's region keys (treedefs) key on it and trace the value."""

    __slots__ = ("value", "static")

    def __init__(self, value, static):
        self.value, self.static = value, static

    def tree_flatten(self):
        return (self.value,), self.static

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(children[0], static)

    def __repr__(self):
        return f"Split({self.value!r}, static={self.static!r})"


def has_index(value) -> bool:
    """A `split=` rule: whether an optional index argument (padding_idx: -1 for none) is given."""
    return value is not None and value >= 0


# One index tensor to check in eager (runtime/index_checks.py): (index, the size it
# addresses, whether negative indices count from the end, (flat position, value) of the
# first bad index -> the exception torch raises).
Probe = tuple[object, int, bool, Callable[[int, int], Exception]]


@dataclass(frozen=True)
class TestCases:
    """The special cases of an op's tests (tests/ops read them from its entry), set where its
    lowering is defined, as JAX registers an operation's rules beside it. Inputs every op is
    tested on stay in the tests."""

    # (dtype, atol, rtol) where torch's and XLA's formulas differ past the dtype's default tolerance
    tolerance: tuple[tuple[torch.dtype, float, float], ...] = ()
    nonzero_divisor: bool = False  # integer division by zero raises on CPU (data-dependent): no zero divisors
    # CPU gives a NaN input's gradient one way in its vectorized loop and another in its scalar
    # tail; we follow the vectorized loop, so NaN inputs are tested only on tensors that take it
    nan_input_by_size: bool = False

    def tolerance_for(self, dtype: torch.dtype) -> dict:
        """assert_close keywords for `dtype` ({} : the dtype's defaults)."""
        return next((dict(atol=atol, rtol=rtol) for d, atol, rtol in self.tolerance if d == dtype), {})


NO_TEST_CASES = TestCases()


@dataclass(frozen=True)
class Lowering:
    op: OpOverload
    fn: Callable
    static: frozenset  # names of Scalar arguments that must be concrete (shape-determining)
    jit: bool  # False: data-dependent output shape, runs op-by-op on concrete arrays
    random: bool  # True: receives `generator=` as a traced 64-bit seed even if the schema has none
    traced: frozenset  # names of non-Scalar number arguments traced, not static: they fix no output shape
    padding: Padding | None  # how a graph with symbolic sizes runs it padded; None: see not_paddable
    not_paddable: str  # why a graph holding it runs at exact sizes ("" when padding is set)
    index_probes: Callable[[list], Iterator[Probe]] | None  # the index tensors eager checks, from the values
    host_indices: bool  # its index tensors may live on the CPU, as with CUDA (x_cuda[cpu_index])
    eager: str  # "": eager derives its kernels from it; else which kernel serves eager instead, and why
    jit_for_integer_indices: bool = False  # jit=False only for boolean masks: with integer indices it traces
    # An op eager has no kernel for (torch decomposes it above autograd when tracing) runs as
    # this torch-level function over table ops instead of torch's decomposition (eager/fallback.py)
    decomposition: Callable | None = None
    tests: TestCases = NO_TEST_CASES  # its tests' special cases
    grows: Callable[[list], object] | None = None  # eager over growing storages: values -> growth.Growth or None
    # With `traced` arguments torch bounds-checks: values (schema order, Python numbers, tensors
    # with .shape) -> False where the call may be out of range; eager then lets CPU torch raise
    # its exception (the lowering never sees a concrete value to check). May be conservative.
    in_range: Callable[[list], bool] | None = None
    # (name, rule) per argument passed as a Split: traced value, static part rule(value) (see the top)
    split: tuple = ()
    # Why eager registers this lowering as the kernel of a CompositeImplicitAutograd op, one call
    # instead of its decomposition's ("": it does not). Sound where autograd needs no decomposition:
    # torch differentiates the op with a formula of its own once a backend has a kernel for it
    # (CUDA's and MPS's fused kernels; `_fused_rms_norm`), or its result takes no gradient (isclose).
    over_composite: str = ""
    # An op that resizes its out= tensor itself (CPU's range factories: linspace, logspace, arange):
    # eager resizes out without torch's generic "An output with one or more elements was resized"
    # warning (CPU's linspace says nothing; arange warns in its own words, from its `in_range`).
    resizes_out: bool = False
    # The Scalar arguments CPU converts to the result's dtype with an overflow check (fill's value,
    # clamp's min and max, add's alpha: "value cannot be converted to type int8_t without
    # overflow"): eager checks each call's values as CPU does, in the C++ fast path and the Python
    # kernel alike (their values are traced), and lets CPU name the error where one does not fit.
    scalar_fits: tuple = ()
    # CPU computes the op in its out= tensor's dtype when the call names no `dtype` (sum, prod, mean,
    # cumsum: the input is cast to out's dtype first, so sum([0.6, 0.6, 0.6], out=<int64>) is 0, not
    # 1; an integer out of a float input is accepted): eager's out= kernel passes out's dtype as `dtype`,
    # and the in-place kernel self's (CPU's cumsum_ is cumsum_out(self, self): a bool self is refused).
    computes_in_out_dtype: bool = False
    # Where torch's meta kernel lays the output out row-major but CPU's and CUDA's kernels follow
    # their input's memory format (convolution, reflection and replication padding, batch norm keep a
    # channels_last input channels_last): the call's values (schema order, tensors with their
    # strides) -> the (first) output's memory format. Eager lays that output out so.
    output_memory_format: Callable[[list], torch.memory_format] | None = None


LOWERINGS: dict[OpOverload, Lowering] = {}


def suggested_memory_format(values) -> torch.memory_format:
    """An `output_memory_format` rule: the first argument's suggested memory format (channels_last
    where its strides are), the layout CPU's and CUDA's kernels give an output that follows it."""
    return suggest_memory_format(values[0])


def lowering(*ops: OpOverload, static: Iterable[str] = (), jit: bool = True, random: bool = False,
             traced: Iterable[str] = (), padding: Padding | None = None, not_paddable: str = "",
             index_probes: Callable | None = None, host_indices: bool = False, eager: str = "",
             jit_for_integer_indices: bool = False, decomposition: Callable | None = None,
             tests: TestCases = NO_TEST_CASES, grows: Callable | None = None,
             in_range: Callable | None = None, split: dict | None = None,
             over_composite: str = "", resizes_out: bool = False, scalar_fits: str | tuple = (),
             computes_in_out_dtype: bool = False, output_memory_format: Callable | None = None) -> Callable:
    """Register `fn` as the lowering of each overload in `ops`, with its traits. An op torch
    tags pointwise pads as POINTWISE unless told otherwise; any other op names its padding
    rule or says why it has none (`family` gives a module's ops one reason)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if not isinstance(op, OpOverload):
                raise TypeError(f"lowering({op}): pass an overload such as aten.add.Tensor, not a packet")
            known = LOWERINGS.get(op)
            # The same function again is its module imported again after an import failed part
            # way; that failure, not this, is the error to show.
            if known is not None and (known.fn.__module__, known.fn.__qualname__) != (fn.__module__, fn.__qualname__):
                raise ValueError(f"{op} already has a lowering ({known.fn.__module__}.{known.fn.__qualname__})")
            pad = padding
            if pad is None and torch.Tag.pointwise in op.tags and not random:
                pad = POINTWISE
            LOWERINGS[op] = Lowering(op, fn, frozenset(static), jit, random, frozenset(traced), pad,
                                     "" if pad is not None else not_paddable, index_probes, host_indices, eager,
                                     jit_for_integer_indices, decomposition, tests, grows, in_range,
                                     tuple(sorted((split or {}).items())), over_composite, resizes_out,
                                     (scalar_fits,) if isinstance(scalar_fits, str) else tuple(scalar_fits),
                                     computes_in_out_dtype, output_memory_format)
        return fn

    return register


def family(**defaults) -> Callable:
    """`lowering` with traits a module's ops share (elementwise ops pad as POINTWISE; linear
    algebra says once why it has no padding rule); an entry may still give its own."""

    def decorator(*ops: OpOverload, **traits) -> Callable:
        return lowering(*ops, **{**defaults, **traits})

    return decorator
