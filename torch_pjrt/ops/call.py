"""How an op's lowering is called: one bound-call object serves every consumer.

`OpCall.of(lowering)` reads the op's schema and traits once: which arguments are static for
the executable (and must be hashable), which are traced (Scalars, and the numbers the entry
names in `traced=`: passed as weakly typed JAX scalars, so a new value does not recompile), where a random op's seed goes. Eager kernels,
the graph interpreter, padded graphs, custom kernels' host path and the test harness all
call lowerings through it, so none of them re-derives these rules; the C++ eager fast path
receives its per-argument plan (`fast_plan`) from it too.

`executable(traced)` is the op's cached XLA executable over schema-ordered values (JAX's
jit keys shapes and dtypes; static positions key the rest). Tensor operands may arrive as
storage views (anything with `resolve()`), read inside the executable, so a view costs no
executable of its own.
"""
from __future__ import annotations
import functools

import jax
import numpy as np
import jax.numpy as jnp
from .registry import Lowering, Split
from .signature import SCALAR, SCALAR_LIST, STATIC, TENSOR, TENSOR_LIST, Signature

_WEAK_SCALARS: dict = {}


def weak_scalar(value):
    """A Python number as a cached weakly typed JAX scalar: passing the number itself to an
    executable costs a host-to-device conversion on every call."""
    if value.__class__ not in (int, float, bool, complex):
        return value
    key = (type(value), value)
    array = _WEAK_SCALARS.get(key)
    if array is None:
        try:
            # a transfer, as weakly typed as jnp.asarray's value; jnp.asarray would run JAX's eager
            # stage op, an executable JAX builds again once a long process evicted it
            array = jax.device_put(_beyond_int64(value))
        except OverflowError:  # beyond uint64 too: let JAX report it in the op
            return value
        if isinstance(array, jax.core.Tracer):
            return array  # made inside a trace: it belongs to that trace alone (see _fresh_weak_scalar)
        if len(_WEAK_SCALARS) > 4096:
            _WEAK_SCALARS.clear()
        _WEAK_SCALARS[key] = array
    return array


def _fresh_weak_scalar(value):
    """A Python number as a new weakly typed JAX scalar, for use inside a trace (the graph
    interpreter): no cache lookup on a path where the value is staged anyway. A cache must
    never keep what jnp.asarray returns inside a trace: it is that trace's tracer, and a
    later trace that meets it (another graph's executable) takes it as an extra input its
    callers do not pass ("supplied N arguments but compiled program expected N+k");
    weak_scalar refuses to cache one."""
    if value.__class__ not in (int, float, bool, complex):
        return value
    try:
        return jnp.asarray(_beyond_int64(value))
    except OverflowError:  # beyond uint64 too: let JAX report it in the op
        return value


def _beyond_int64(value):
    """An int from 2**63 up to 2**64 (a uint64 value, which CPU takes for a uint64 tensor) as a
    uint64 scalar: no weakly typed JAX scalar holds it. Any other number as it is."""
    return np.uint64(value) if value.__class__ is int and 2 ** 63 <= value < 2 ** 64 else value


def hashable(v):
    if isinstance(v, list):
        return tuple(hashable(x) for x in v)
    return v


def _resolve(v):
    if hasattr(v, "resolve"):
        return v.resolve()
    if type(v) is list:
        return [x.resolve() if hasattr(x, "resolve") else x for x in v]
    return v


# How the C++ fast path (runtime/csrc/fast_path.cpp, FastKernel) passes each argument to the executable.
FAST_TENSOR, FAST_SCALAR, FAST_TENSOR_LIST, FAST_SCALAR_LIST = 0, 1, 6, 7
FAST_CHECKED_SCALAR = 9  # a Scalar whose value must fit the result's dtype (in the entry's `scalar_fits`)
FAST_CHECKED_STATIC = 10  # the same, for a static Scalar (a Scalar the entry lists in `static=`)
_FAST_STATIC = {"int": 2, "float": 2, "bool": 2, "str": 2, "number": 2, "SymInt": 2, "List[int]": 2,
                "List[SymInt]": 2, "List[float]": 2, "List[bool]": 2, "Scalar": 2, "ScalarType": 3, "Layout": 4,
                "MemoryFormat": 5, "Device": 8}


def _without_optional(type_name: str) -> str:
    """"Optional[List[int]]" -> "List[int]"; "List[int]" stays as it is."""
    return type_name[len("Optional["):-1] if type_name.startswith("Optional[") else type_name


class OpCall:
    """The calling convention of one lowering (see registry.py for the contract)."""

    def __init__(self, lowering: Lowering, op=None):
        """`op`: the overload called, where it borrows another's lowering (a graph's
        aten.uniform runs aten.uniform_'s); its schema binds the arguments."""
        self.lowering = lowering
        self.op = op = op if op is not None else lowering.op
        self.sig = sig = Signature.of(op)
        rules = dict(lowering.split)  # the entry's `split=` arguments: name -> rule giving a value's static part
        self.static = tuple(
            i for i, (name, kind) in enumerate(zip(sig.names, sig.kinds))
            if (kind == STATIC and name != "generator" and name not in lowering.traced and name not in rules)
            or (kind in (SCALAR, SCALAR_LIST) and name in lowering.static))
        self.scalars = tuple(i for i, (n, k) in enumerate(zip(sig.names, sig.kinds))
                             if (k == SCALAR and i not in self.static) or n in lowering.traced)
        self.split = tuple((i, rules[n]) for i, n in enumerate(sig.names) if n in rules)
        # the schema's static kinds (int, int[], float?) that the entry traces: roll's shifts, ...
        # (and the traced values of its split arguments)
        self.traced_static = tuple(i for i, (n, k) in enumerate(zip(sig.names, sig.kinds))
                                   if k == STATIC and (n in lowering.traced or n in rules))
        self.scalar_lists = tuple(i for i, k in enumerate(sig.kinds) if k == SCALAR_LIST and i not in self.static)
        self.tensors = tuple(i for i, k in enumerate(sig.kinds) if k == TENSOR)
        self.tensor_lists = tuple(i for i, k in enumerate(sig.kinds) if k == TENSOR_LIST)
        self.generator = sig.names.index("generator") if "generator" in sig.names else None
        self.random = lowering.random or self.generator is not None

    @staticmethod
    @functools.lru_cache(None)
    def of(lowering: Lowering, op=None) -> "OpCall":
        return OpCall(lowering, op)

    # ------------------------------------------------------------------ values
    def bind(self, args: tuple, kwargs: dict) -> list:
        return self.sig.bind(args, kwargs)

    def prepare(self, values: list, seed=None, cached: bool = True) -> list:
        """Bound values as the executable takes them: traced Scalars weak, the seed in place,
        static lists hashable. Changes `values` in place and returns it."""
        weak = weak_scalar if cached else _fresh_weak_scalar
        for i in self.scalars:
            v = values[i]
            values[i] = [weak(x) for x in v] if type(v) in (list, tuple) else weak(v)  # a traced int[]
        for i in self.scalar_lists:
            values[i] = [weak(v) for v in values[i]]
        for i, rule in self.split:
            v = values[i]
            if type(v) is not Split:
                values[i] = Split(weak(v), rule(v))
        if self.random:
            if self.generator is not None:
                values[self.generator] = seed
            else:
                values.append(seed)
        for i in self.static:
            if type(values[i]) is list:
                values[i] = hashable(values[i])
        return values

    def lower(self, *values):
        """The lowering on prepared values (inside a trace)."""
        values = [_resolve(v) for v in values]
        pos, kw = self.sig.split(values[: len(self.sig.names)])
        if len(values) > len(self.sig.names):  # the seed of a random op whose schema has no generator
            kw["generator"] = values[-1]
        return self.lowering.fn(*pos, **kw)

    def __call__(self, args, kwargs, seed=None):
        """A call inside a trace (a graph node): bind, prepare, lower."""
        return self.lower(*self.prepare(self.bind(tuple(args), kwargs), seed, cached=False))

    # ------------------------------------------------------------------ executables
    @functools.lru_cache(None)
    def executable(self, traced=None):
        """The jitted (or, for data-dependent ops, plain) callable taking prepared values.
        `traced(call, *values)`, if given, is what the executable traces instead of `lower`
        (a consumer's checks and output layouts around it)."""
        if not self.lowering.jit:
            return self.lower
        fn = self.lower if traced is None else functools.partial(traced, self)
        # keep_unused: an operand the op only writes (zero_, fill_, normal_) still says which device
        # the executable runs on (pruned, the output would go to JAX's default device, pjrt:0)
        return jax.jit(fn, static_argnums=self.static, keep_unused=True)

    def run(self, args: tuple, kwargs: dict, seed=None):
        """Bind, prepare and run the cached executable on JAX values (the host path of
        custom kernels, the test harness)."""
        return self.executable()(*self.prepare(self.bind(args, kwargs), seed))

    def fast_plan(self) -> list[int] | None:
        """Per argument, how the C++ eager fast path passes it (FAST_*); None when the op needs
        the Python kernel for every call (randomness, host range checks of traced
        arguments (`in_range`), a traced int[], `split=` arguments, lists of optional tensors, returns other than
        tensors, tensor lists and ints)."""
        lowering = self.lowering
        arguments = self.op._schema.arguments
        # split arguments (static part keyed, value traced): the C++ kernel and recorder key static
        # arguments by value and operands by aval, so these calls go to the Python kernel
        if (self.random or lowering.host_indices or lowering.in_range is not None or self.split
                or any(str(arguments[i].type) != "List[Tensor]" for i in self.tensor_lists)
                or any(str(arguments[i].type).startswith("List") for i in self.traced_static)):
            return None
        # int returns (SDPA's max_q): the C++ kernel takes them from its signature's description
        if not all(str(r.type) in ("Tensor", "List[Tensor]", "int", "SymInt") and r.alias_info is None
                   for r in self.op._schema.returns):
            return None
        plan = []
        for i, (arg, kind) in enumerate(zip(arguments, self.sig.kinds)):
            if kind == TENSOR:
                plan.append(FAST_TENSOR)
            elif kind == TENSOR_LIST:
                plan.append(FAST_TENSOR_LIST)
            elif kind == SCALAR_LIST:
                if i in self.static:  # a static Scalar[] (_foreach_pow's exponents): keyed by the Python kernel
                    return None
                plan.append(FAST_SCALAR_LIST)
            elif i in self.scalars:
                plan.append(FAST_CHECKED_SCALAR if arg.name in lowering.scalar_fits else FAST_SCALAR)
            else:
                fast = _FAST_STATIC.get(_without_optional(str(arg.real_type)))
                if fast is None:
                    return None
                plan.append(FAST_CHECKED_STATIC if arg.name in lowering.scalar_fits else fast)
        return plan
