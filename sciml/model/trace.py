"""Tracing a model function once with sympy symbols.

The user's ``f(u, p, t, nets)`` is called with proxy objects: states and
parameters are sympy symbols wrapped in `Sym`, arithmetic and numpy math
build sympy expressions (numpy dispatches to `Sym.__array_ufunc__` /
`__array_function__`), and a network call ``nets.U(x)`` records its input
expressions and returns fresh symbols (an opaque node). The result is a
`Trace`: one expression per state derivative plus the recorded net calls, in
call order (a later call may take an earlier call's outputs as inputs).

A model of `GRAPH_FROM` states or more without networks is traced into a
`sciml.model.graph.Graph` instead: the same operations build its nodes, at a
few microseconds each where sympy's cost tens to hundreds (its flattening and
assumption queries), and the `Trace` gives the sympy expressions only when
asked (`Trace.exprs`, unevaluated: the graph's own structure). ``Sym.expr`` is
sympy in both modes.

Anything tracing cannot express raises `ModelError` with the place in the
user's code (file:line): branching on a traced value, unknown names, wrong
shapes, unsupported numpy functions.
"""

import contextlib
import inspect
import keyword
import operator
import os
import threading
from dataclasses import dataclass

import numpy as np
import sympy
from sympy.codegen.cfunctions import expm1, log1p, log2, log10

from .graph import Graph, quiet_gc, to_sympy

_HERE = os.path.abspath(__file__)
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__))
_SYMPY_DIR = os.path.dirname(os.path.abspath(sympy.__file__))


class ModelError(ValueError):
    """A model function that tracing cannot turn into kernels."""


# ------------------------------------------------------------------ symbols


def state_symbols(n):
    return tuple(sympy.Symbol(f"u{i}", real=True) for i in range(n))


def param_symbols(n):
    return tuple(sympy.Symbol(f"p{j}", real=True) for j in range(n))


T = sympy.Symbol("t", real=True)


@dataclass(frozen=True)
class NetCall:
    """One network call: ``outputs = net(inputs)``; `index` numbers calls in order."""

    net: str
    index: int
    inputs: tuple
    outputs: tuple


# Models of at least this many states (and no networks) are traced into a graph.
GRAPH_FROM = 256


class Trace:
    """A traced function: ``y[i] = exprs[i]`` in the symbols u0.. (states; none for
    initial values), p0.., t, and the outputs of the recorded net calls.

    A trace into a graph holds ``graph`` and ``nodes`` (one per output) and makes
    ``exprs`` on first use; it pickles as its sympy expressions.
    """

    def __init__(self, exprs, calls, u, p, graph=None, nodes=None):
        self._exprs = None if exprs is None else tuple(exprs)
        self.calls, self.u, self.p = tuple(calls), tuple(u), tuple(p)
        self.graph = graph
        self.nodes = None if nodes is None else tuple(nodes)

    @property
    def exprs(self):
        if self._exprs is None:
            memo = {}
            self._exprs = tuple(to_sympy(x, memo) for x in self.nodes)
        return self._exprs

    def __len__(self):
        return len(self.nodes) if self.nodes is not None else len(self._exprs)

    def __reduce__(self):
        return (Trace, (self.exprs, self.calls, self.u, self.p))


# ------------------------------------------------------------ error context

_active = threading.local()


def _label():
    return getattr(_active, "label", ("the model function", ""))


def _site():
    """'file:line' of the innermost frame in user code (outside this module, numpy, sympy)."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            fn = os.path.abspath(frame.f_code.co_filename)
            if fn != _HERE and not fn.startswith((_NUMPY_DIR, _SYMPY_DIR)) \
                    and not fn.startswith("<__array_function__"):
                return f"{frame.f_code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"
    finally:
        del frame


def _fail(message):
    label, where = _label()
    site = _site()
    raise ModelError(f"{label}, at {site if site != '?' else where}: {message}")


BRANCH = ("the model branches on a traced value (`if`/`while` on a state or parameter): "
          "use np.where(condition, a, b) (combine conditions with &, |, ~, not and/or/not)")


# ------------------------------------------------------------------ proxies


def _graph():
    """The graph of the trace in progress, None when it builds sympy expressions."""
    return getattr(_active, "graph", None)


def _lift(x):
    """A sympy expression (a graph node when tracing into a graph) from a proxy or a
    number; None for anything else."""
    g = getattr(_active, "graph", None)
    if isinstance(x, Sym):
        v = x._v
        if g is not None and isinstance(v, sympy.Basic):
            return g.from_sympy(v)
        return v
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, np.integer)):
        return sympy.Integer(int(x)) if g is None else g.num(int(x))
    if isinstance(x, (float, np.floating)):
        return sympy.Float(float(x)) if g is None else g.num(float(x))
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return _lift(x[()])
    return None


def _sympy_form(v):
    return v if isinstance(v, sympy.Basic) else to_sympy(v)


def _scalar(x, what):
    e = _lift(x)
    if e is None:
        if isinstance(x, Rel):
            _fail(f"{what} is a condition; conditions only go into np.where(condition, a, b)")
        _fail(f"{what} must be a number or a traced expression, got {type(x).__name__}")
    return e


def _is_sequence(x):
    return isinstance(x, (Vec, list, tuple)) or (isinstance(x, np.ndarray) and x.ndim == 1)


def _elementwise(fn, args, what):
    """Apply `fn` to scalars, or element by element when any argument is a sequence."""
    seqs = [a for a in args if _is_sequence(a)]
    if not seqs:
        return fn(*args)
    n = len(seqs[0])
    if any(len(s) != n for s in seqs):
        _fail(f"{what}: sequences of different lengths {[len(s) for s in seqs]}")
    return Vec([fn(*[a[k] if _is_sequence(a) else a for a in args]) for k in range(n)])


_GRAPH_ARITH = {operator.add: Graph.add, operator.sub: Graph.sub, operator.mul: Graph.mul,
                operator.truediv: Graph.div, operator.pow: Graph.pow}


def _arith(op):
    gop = _GRAPH_ARITH[op]

    def forward(self, other):
        if _is_sequence(other):
            return NotImplemented
        o = _lift(other)
        if o is None:
            return NotImplemented
        g = _graph()
        if g is None:
            return Sym(op(self._v, o))
        return Sym(gop(g, _lift(self), o))

    def reverse(self, other):
        if _is_sequence(other):
            return NotImplemented
        o = _lift(other)
        if o is None:
            return NotImplemented
        g = _graph()
        if g is None:
            return Sym(op(o, self._v))
        return Sym(gop(g, o, _lift(self)))

    return forward, reverse


def _compare(make, kind):
    def method(self, other):
        if _is_sequence(other):
            return NotImplemented
        o = _lift(other)
        if o is None:
            return NotImplemented
        g = _graph()
        if g is None:
            return Rel(make(self._v, o))
        return Rel(g.rel(kind, _lift(self), o))
    return method


class Sym:
    """A traced scalar: a sympy expression (or graph node) that behaves like a float
    under numpy; ``expr`` is its sympy form."""

    __slots__ = ("_v",)
    __array_priority__ = 1000

    def __init__(self, expr):
        self._v = expr

    @property
    def expr(self):
        return _sympy_form(self._v)

    def __repr__(self):
        return f"Sym({self.expr})"

    __add__, __radd__ = _arith(operator.add)
    __sub__, __rsub__ = _arith(operator.sub)
    __mul__, __rmul__ = _arith(operator.mul)
    __truediv__, __rtruediv__ = _arith(operator.truediv)
    __pow__, __rpow__ = _arith(operator.pow)

    def __neg__(self):
        g = _graph()
        return Sym(-self._v) if g is None else Sym(g.neg(_lift(self)))

    def __pos__(self):
        return self

    def __abs__(self):
        g = _graph()
        return Sym(sympy.Abs(self._v)) if g is None else Sym(g.fn(sympy.Abs, _lift(self)))

    __lt__ = _compare(sympy.StrictLessThan, "lt")
    __le__ = _compare(sympy.LessThan, "le")
    __gt__ = _compare(sympy.StrictGreaterThan, "gt")
    __ge__ = _compare(sympy.GreaterThan, "ge")
    __eq__ = _compare(lambda a, b: sympy.Eq(a, b), "eq")
    __ne__ = _compare(lambda a, b: sympy.Ne(a, b), "ne")
    __hash__ = None

    def __floordiv__(self, other):
        _fail("`//` is not supported on traced values (use np.floor(a / b) is not "
              "differentiable either: rewrite the model)")

    __rfloordiv__ = __mod__ = __rmod__ = __floordiv__

    def __bool__(self):
        _fail(BRANCH)

    def _number(self):
        _fail("a traced value was converted to a Python number (math.* functions, int(), "
              "float(), indexing or range() with a state or parameter); use numpy "
              "functions such as np.exp on traced values")

    __float__ = __int__ = __index__ = __complex__ = _number

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _array_function(func, args, kwargs)


class Rel:
    """A traced condition (from a comparison); usable only inside np.where and & | ~."""

    __slots__ = ("_v",)
    __array_priority__ = 1000

    def __init__(self, expr):
        self._v = expr

    @property
    def expr(self):
        return _sympy_form(self._v)

    def __repr__(self):
        return f"Rel({self.expr})"

    def __bool__(self):
        v = self._v
        if isinstance(v, sympy.Basic):
            if not v.free_symbols and v in (sympy.true, sympy.false):
                return bool(v)
        elif v.op in ("true", "false"):
            return v.op == "true"
        _fail(BRANCH)

    def _logic(op, kind):
        def method(self, other):
            if not isinstance(other, (bool, np.bool_, Rel)):
                return NotImplemented
            return Rel(_logic_of(op, kind, self, other))
        return method

    __and__ = __rand__ = _logic(sympy.And, "and")
    __or__ = __ror__ = _logic(sympy.Or, "or")
    __xor__ = __rxor__ = _logic(sympy.Xor, "xor")
    del _logic

    def __invert__(self):
        g = _graph()
        if g is None:
            return Rel(sympy.Not(self._v))
        return Rel(g.logic_not(_cond(self, "~")))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _array_function(func, args, kwargs)


def _logic_of(op, kind, a, b):
    """``op(a, b)`` of two conditions (Rel or bool) as sympy or a graph node."""
    g = _graph()
    if g is None:
        return op(_cond(a, kind), _cond(b, kind))
    return g.logic(kind, _cond(a, kind), _cond(b, kind))


def _vec_binary(op):
    def forward(self, other):
        return _elementwise(lambda a, b: op(a, b), (self, other), "arithmetic")

    def reverse(self, other):
        return _elementwise(lambda a, b: op(b, a), (self, other), "arithmetic")

    return forward, reverse


class Vec:
    """A traced vector (the state, a net's outputs): indexable, iterable, elementwise math."""

    __array_priority__ = 1000

    def __init__(self, items):
        self._items = list(items)

    def __len__(self):
        return len(self._items)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return Vec(self._items[k])
        if isinstance(k, Sym):
            _fail("indexing with a traced value is not supported")
        return self._items[k]

    def __iter__(self):
        return iter(self._items)

    def __repr__(self):
        return f"Vec({self._items})"

    __add__, __radd__ = _vec_binary(operator.add)
    __sub__, __rsub__ = _vec_binary(operator.sub)
    __mul__, __rmul__ = _vec_binary(operator.mul)
    __truediv__, __rtruediv__ = _vec_binary(operator.truediv)
    __pow__, __rpow__ = _vec_binary(operator.pow)

    def __neg__(self):
        return Vec([-x for x in self._items])

    def __pos__(self):
        return self

    def __abs__(self):
        return Vec([abs(x) for x in self._items])

    def __bool__(self):
        _fail(BRANCH)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _array_function(func, args, kwargs)


class Named(Vec):
    """The state or parameter vector: items by position, by unpacking, or by name."""

    def __init__(self, items, names, kind, other=()):
        object.__setattr__(self, "_items", list(items))
        object.__setattr__(self, "_names", {n: i for i, n in enumerate(names)})
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_other", other)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        index = self.__dict__["_names"]
        if name in index:
            return self._items[index[name]]
        kind = self.__dict__["_kind"]
        hint = ""
        if name in self.__dict__["_other"]:
            hint = (f" ({name!r} is a {'parameter' if kind == 'state' else 'state'}: "
                    f"use {'p' if kind == 'state' else 'u'}.{name})")
        _fail(f"unknown {kind} {name!r}{hint}; {kind}s: {', '.join(index) or '(none)'}")

    def __setattr__(self, name, value):
        _fail(f"{self._kind}s are read-only inside the model function")


class NetFn:
    """``nets.NAME``: calling it records an opaque network node."""

    def __init__(self, name, chain, calls):
        self.name, self.chain, self.calls = name, chain, calls

    def __call__(self, x):
        n_in = self.chain.n_in
        if isinstance(x, (Sym, int, float, np.number)) and n_in == 1:
            x = [x]
        if not _is_sequence(x) or (isinstance(x, np.ndarray) and x.ndim != 1):
            _fail(f"net `{self.name}` takes a sequence of {n_in} inputs, got "
                  f"{type(x).__name__}")
        if len(x) != n_in:
            _fail(f"net `{self.name}` takes {n_in} inputs, got {len(x)}")
        inputs = tuple(_scalar(v, f"input {k} of net `{self.name}`") for k, v in enumerate(x))
        c = len(self.calls)
        outputs = tuple(sympy.Symbol(f"z{c}_{k}", real=True) for k in range(self.chain.n_out))
        self.calls.append(NetCall(self.name, c, inputs, outputs))
        return Vec(Sym(z) for z in outputs)


class Nets:
    """The `nets` argument of a model function: ``nets.U(x)`` or ``nets["U"](x)``."""

    def __init__(self, chains, calls):
        object.__setattr__(self, "_fns", {k: NetFn(k, c, calls) for k, c in chains.items()})

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        fns = self.__dict__["_fns"]
        if name not in fns:
            known = ", ".join(fns) if fns else "(none: pass nets={'NAME': chain} to Model)"
            _fail(f"unknown net {name!r}; nets: {known}")
        return fns[name]

    __getitem__ = __getattr__


# ------------------------------------------------------------ numpy mapping


def _max(a, b):
    # As a Piecewise, so that derivatives come out as plain branches (not Heaviside).
    g = _graph()
    if g is not None:
        return g.piecewise((a, g.rel("ge", a, b)), (b, g.TRUE))
    return sympy.Piecewise((a, a >= b), (b, True))


def _min(a, b):
    g = _graph()
    if g is not None:
        return g.piecewise((a, g.rel("le", a, b)), (b, g.TRUE))
    return sympy.Piecewise((a, a <= b), (b, True))


UNARY = {
    "negative": operator.neg, "positive": lambda a: a, "absolute": sympy.Abs,
    "fabs": sympy.Abs, "sign": sympy.sign, "square": lambda a: a**2,
    "reciprocal": lambda a: 1 / a, "sqrt": sympy.sqrt, "exp": sympy.exp,
    "exp2": lambda a: 2**a, "expm1": expm1, "log": sympy.log, "log2": log2,
    "log10": log10, "log1p": log1p, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan,
    "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan, "sinh": sympy.sinh,
    "cosh": sympy.cosh, "tanh": sympy.tanh, "arcsinh": sympy.asinh, "arccosh": sympy.acosh,
    "arctanh": sympy.atanh,
}
BINARY = {
    "add": operator.add, "subtract": operator.sub, "multiply": operator.mul,
    "divide": operator.truediv, "true_divide": operator.truediv, "power": operator.pow,
    "float_power": operator.pow, "maximum": _max, "minimum": _min, "fmax": _max,
    "fmin": _min, "arctan2": sympy.atan2, "hypot": lambda a, b: sympy.sqrt(a**2 + b**2),
}
COMPARE = {
    "greater": sympy.StrictGreaterThan, "greater_equal": sympy.GreaterThan,
    "less": sympy.StrictLessThan, "less_equal": sympy.LessThan, "equal": sympy.Eq,
    "not_equal": sympy.Ne,
}
LOGIC = {"logical_and": sympy.And, "logical_or": sympy.Or, "logical_xor": sympy.Xor}

# The same functions on graph nodes: f(graph, *args).


def _gfn(f):
    return lambda g, *a: g.fn(f, *a)


G_UNARY = {
    "negative": Graph.neg, "positive": lambda g, a: a, "absolute": _gfn(sympy.Abs),
    "fabs": _gfn(sympy.Abs), "sign": _gfn(sympy.sign),
    "square": lambda g, a: g.pow(a, g.num(2)), "reciprocal": lambda g, a: g.pow(a, g.num(-1)),
    "sqrt": lambda g, a: g.pow(a, g.num(0.5)), "exp2": lambda g, a: g.pow(g.num(2), a),
    **{k: _gfn(v) for k, v in UNARY.items() if isinstance(v, type)},
}
G_BINARY = {
    "add": Graph.add, "subtract": Graph.sub, "multiply": Graph.mul, "divide": Graph.div,
    "true_divide": Graph.div, "power": Graph.pow, "float_power": Graph.pow,
    "maximum": lambda g, a, b: _max(a, b), "minimum": lambda g, a, b: _min(a, b),
    "fmax": lambda g, a, b: _max(a, b), "fmin": lambda g, a, b: _min(a, b),
    "arctan2": _gfn(sympy.atan2),
    "hypot": lambda g, a, b: g.pow(g.add(g.pow(a, g.num(2)), g.pow(b, g.num(2))), g.num(0.5)),
}
G_COMPARE = {"greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le",
             "equal": "eq", "not_equal": "ne"}
G_LOGIC = {"logical_and": "and", "logical_or": "or", "logical_xor": "xor"}


def _cond(x, what):
    g = _graph()
    if isinstance(x, Rel):
        v = x._v
        if g is not None and isinstance(v, sympy.Basic):
            return g.from_sympy(v)
        return v
    if isinstance(x, (bool, np.bool_)):
        if g is not None:
            return g.TRUE if x else g.FALSE
        return sympy.true if x else sympy.false
    _fail(f"{what} must be a condition (a comparison such as `x > 0`), got "
          f"{type(x).__name__}")


def _ufunc(ufunc, method, inputs, kwargs):
    name = ufunc.__name__
    if method != "__call__":
        _fail(f"np.{name}.{method} is not supported on traced values")
    if kwargs:
        _fail(f"np.{name}: keyword arguments ({', '.join(kwargs)}) are not supported on "
              "traced values")
    what = f"np.{name}"
    g = _graph()
    if g is not None:
        return _graph_ufunc(g, name, inputs, what)
    if name in UNARY:
        f = UNARY[name]
        return _elementwise(lambda a: Sym(f(_scalar(a, what))), inputs, what)
    if name in BINARY:
        f = BINARY[name]
        return _elementwise(lambda a, b: Sym(f(_scalar(a, what), _scalar(b, what))), inputs,
                            what)
    if name in COMPARE:
        f = COMPARE[name]
        return _elementwise(lambda a, b: Rel(f(_scalar(a, what), _scalar(b, what))), inputs,
                            what)
    if name in LOGIC:
        f = LOGIC[name]
        return _elementwise(lambda a, b: Rel(f(_cond(a, what), _cond(b, what))), inputs, what)
    if name == "logical_not":
        return _elementwise(lambda a: Rel(sympy.Not(_cond(a, what))), inputs, what)
    _unsupported(what)


def _graph_ufunc(g, name, inputs, what):
    if name in G_UNARY:
        f = G_UNARY[name]
        return _elementwise(lambda a: Sym(f(g, _scalar(a, what))), inputs, what)
    if name in G_BINARY:
        f = G_BINARY[name]
        return _elementwise(lambda a, b: Sym(f(g, _scalar(a, what), _scalar(b, what))), inputs,
                            what)
    if name in G_COMPARE:
        k = G_COMPARE[name]
        return _elementwise(lambda a, b: Rel(g.rel(k, _scalar(a, what), _scalar(b, what))),
                            inputs, what)
    if name in G_LOGIC:
        k = G_LOGIC[name]
        return _elementwise(lambda a, b: Rel(g.logic(k, _cond(a, what), _cond(b, what))),
                            inputs, what)
    if name == "logical_not":
        return _elementwise(lambda a: Rel(g.logic_not(_cond(a, what))), inputs, what)
    _unsupported(what)


def _where(cond, a=None, b=None):
    if a is None or b is None:
        _fail("np.where needs three arguments on traced values: np.where(condition, a, b)")

    def one(c, x, y):
        c = _cond(c, "np.where: the condition")
        x, y = _scalar(x, "np.where: `a`"), _scalar(y, "np.where: `b`")
        g = _graph()
        if g is not None:
            return Sym(g.piecewise((x, c), (y, g.TRUE)))
        if c == sympy.true:
            return Sym(x)
        if c == sympy.false:
            return Sym(y)
        return Sym(sympy.Piecewise((x, c), (y, True)))

    return _elementwise(one, (cond, a, b), "np.where")


def _clip(a, a_min, a_max):
    def one(x, lo, hi):
        e = _scalar(x, "np.clip: `a`")
        if lo is not None:
            e = _max(e, _scalar(lo, "np.clip: `a_min`"))
        if hi is not None:
            e = _min(e, _scalar(hi, "np.clip: `a_max`"))
        return Sym(e)
    return _elementwise(one, (a, a_min, a_max), "np.clip")


def _sum(a):
    if not _is_sequence(a):
        return Sym(_scalar(a, "np.sum"))
    xs = [_scalar(x, "np.sum") for x in a]
    g = _graph()
    return Sym(sympy.Add(*xs) if g is None else g.add(*xs))


def _prod(a):
    if not _is_sequence(a):
        return Sym(_scalar(a, "np.prod"))
    xs = [_scalar(x, "np.prod") for x in a]
    g = _graph()
    return Sym(sympy.Mul(*xs) if g is None else g.mul(*xs))


def _dot(a, b):
    if not (_is_sequence(a) and _is_sequence(b)) or len(a) != len(b):
        _fail("np.dot on traced values takes two 1-D sequences of the same length")
    xs = [(_scalar(x, "np.dot"), _scalar(y, "np.dot")) for x, y in zip(a, b)]
    g = _graph()
    if g is None:
        return Sym(sympy.Add(*[x * y for x, y in xs]))
    return Sym(g.add(*[g.mul(x, y) for x, y in xs]))


FUNCTIONS = {"where": _where, "clip": _clip, "sum": _sum, "prod": _prod, "dot": _dot}


def _array_function(func, args, kwargs):
    name = func.__name__
    if name not in FUNCTIONS:
        _unsupported(f"np.{name}")
    try:
        inspect.signature(FUNCTIONS[name]).bind(*args, **kwargs)
    except TypeError as e:
        _fail(f"np.{name}: {e} (traced values support the plain form only)")
    return FUNCTIONS[name](*args, **kwargs)


def _unsupported(what):
    known = sorted([*UNARY, *BINARY, *COMPARE, *LOGIC, "logical_not", *FUNCTIONS])
    _fail(f"{what} is not supported on traced values; supported numpy functions: "
          f"{', '.join(known)}")


def _object_method(name):
    # numpy calls these on the elements of object arrays (np.exp(np.array([x, y]))).
    def method(self):
        return _ufunc(getattr(np, name), "__call__", (self,), {})
    return method


for _name in ("exp", "log", "sqrt", "sin", "cos", "tan", "tanh", "sinh", "cosh", "arcsin",
              "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "expm1", "log1p", "log2",
              "log10", "exp2", "square", "reciprocal", "absolute", "fabs", "sign"):
    setattr(Sym, _name, _object_method(_name))


# ------------------------------------------------------------------ tracing


def check_names(kind, names):
    """Validate a list of state/parameter/net names; returns them as a tuple."""
    if isinstance(names, str):
        raise TypeError(f"`{kind}` must be a list of names, got the string {names!r}")
    try:
        names = tuple(names)
    except TypeError:
        raise TypeError(f"`{kind}` must be a list of names, got {names!r}") from None
    for n in names:
        if not isinstance(n, str) or not n.isidentifier() or keyword.iskeyword(n) \
                or n.startswith("_"):
            raise ValueError(f"`{kind}`: {n!r} is not a valid name (a Python identifier not "
                             "starting with `_`)")
    seen, dup = set(), set()
    for n in names:
        (dup if n in seen else seen).add(n)
    dup = sorted(dup)
    if dup:
        raise ValueError(f"`{kind}`: duplicate names {', '.join(dup)}")
    return names


def _describe(fn):
    """The function's name and 'file:line' of its definition."""
    name = getattr(fn, "__name__", type(fn).__name__)
    code = getattr(fn, "__code__", None)
    where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else "?"
    return name, where


def _arity(fn, allowed, what):
    """Number of positional arguments to pass `fn` (the largest in `allowed` it accepts)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return max(allowed)
    params = list(sig.parameters.values())
    if any(q.kind == q.VAR_POSITIONAL for q in params):
        return max(allowed)
    positional = [q for q in params if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    required = [q for q in positional if q.default is q.empty]
    for n in sorted(allowed, reverse=True):
        if len(required) <= n <= len(positional):
            return n
    raise TypeError(f"{what} must take {' or '.join(map(str, sorted(allowed)))} positional "
                    f"arguments, it takes {len(positional)}")


_nothing = contextlib.nullcontext


class _Context:
    """Names the function being traced, for error messages raised by the proxies, and
    the graph it is traced into (None: sympy)."""

    def __init__(self, label, where, graph=None):
        self.label = (label, where)
        self.graph = graph

    def __enter__(self):
        self.prev = getattr(_active, "label", None), getattr(_active, "graph", None)
        _active.label, _active.graph = self.label, self.graph

    def __exit__(self, *exc):
        label, graph = self.prev
        if label is None:
            del _active.label
        else:
            _active.label = label
        _active.graph = graph


def _as_exprs(out, states, label, what="derivatives"):
    """The returned values (derivatives, initial values) as sympy expressions, one per state."""
    n = len(states)
    expected = f"one per state ({', '.join(states)})"
    if isinstance(out, (Sym, Rel)) or _lift(out) is not None:
        raise ModelError(f"{label}: returned a single value; return a list of {n} "
                         f"{what}, {expected}")
    if not _is_sequence(out):
        shape = f" of shape {out.shape}" if isinstance(out, np.ndarray) else ""
        raise ModelError(f"{label}: must return a list of {n} {what}, {expected}; "
                         f"got {type(out).__name__}{shape}")
    if len(out) != n:
        raise ModelError(f"{label}: returned {len(out)} {what} for {n} states; "
                         f"return {expected}")
    exprs = []
    for i, v in enumerate(out):
        e = _lift(v)
        if e is None:
            kind = "a condition" if isinstance(v, Rel) else f"a {type(v).__name__}"
            raise ModelError(f"{label}: value {i} ({states[i]}) is {kind}, not a number "
                             "or a traced expression")
        exprs.append(e)
    return tuple(exprs)


def _proxies(states, params, graph=None):
    u_sym, p_sym = state_symbols(len(states)), param_symbols(len(params))
    leaf = (lambda s: s) if graph is None else graph.sym
    u = Named([Sym(leaf(s)) for s in u_sym], states, "state", other=params)
    p = Named([Sym(leaf(s)) for s in p_sym], params, "parameter", other=states)
    return u_sym, p_sym, u, p


def trace_model(f, states, params, chains):
    """Trace ``f(u, p, t, nets)`` (or ``f(u, p, t)`` without nets) into a `Trace`.

    Parameters
    ----------
    f : callable
    states, params : tuple of str
    chains : dict of str -> nets.Chain
    """
    if not callable(f):
        raise TypeError(f"the model function must be callable, got {f!r}")
    name, where = _describe(f)
    label = f"model function `{name}`"
    nargs = _arity(f, (4,) if chains else (3, 4), label)
    graph = Graph() if not chains and len(states) >= GRAPH_FROM else None
    u_sym, p_sym, u, p = _proxies(states, params, graph)
    calls = []
    t = Sym(T if graph is None else graph.sym(T))
    with _Context(label, where, graph), quiet_gc() if graph is not None else _nothing():
        out = f(*(u, p, t, Nets(chains, calls))[:nargs])
        exprs = _as_exprs(out, states, f"{label} (defined at {where})")
    if graph is not None:
        return Trace(None, (), u_sym, p_sym, graph=graph, nodes=exprs)
    return Trace(exprs, tuple(calls), u_sym, p_sym)


def trace_observables(observables, states, params, chains):
    """Trace ``{name: g}`` (each ``g(u, p)``, ``g(u, p, t)`` or ``g(u, p, t, nets)``,
    returning one value) into one `Trace`, one expression per observable."""
    _, _, u, p = _proxies(states, params)
    calls = []
    exprs = []
    for name, g in observables.items():
        if not callable(g):
            raise TypeError(f"observable {name!r} must be a function g(u, p), g(u, p, t) or "
                            f"g(u, p, t, nets), got {g!r}")
        _, where = _describe(g)
        label = f"observable {name!r}"
        nargs = _arity(g, (2, 3, 4), label)
        with _Context(label, where):
            out = g(*(u, p, Sym(T), Nets(chains, calls))[:nargs])
        e = _lift(out)
        if e is None:
            raise ModelError(f"{label} (defined at {where}): must return one number or traced "
                             f"expression, got {type(out).__name__}")
        exprs.append(e)
    return Trace(tuple(exprs), tuple(calls), state_symbols(len(states)),
                 param_symbols(len(params)))


def trace_initial(fn, states, params, chains):
    """Trace initial values ``fn(p)`` or ``fn(p, nets)`` (a list, one per state) into a
    `Trace` over the parameters alone (no state symbols)."""
    if not callable(fn):
        raise TypeError(f"`u0` must be an array or a function u0(p, nets), got {fn!r}")
    name, where = _describe(fn)
    label = f"initial-value function `{name}`"
    nargs = _arity(fn, (1, 2), label)
    p_sym = param_symbols(len(params))
    p = Named([Sym(s) for s in p_sym], params, "parameter", other=states)
    calls = []
    with _Context(label, where):
        out = fn(*(p, Nets(chains, calls))[:nargs])
    exprs = _as_exprs(out, states, f"{label} (defined at {where})", what="initial values")
    if any(T in e.free_symbols for e in exprs):
        raise ModelError(f"{label}: initial values cannot depend on t")
    return Trace(exprs, tuple(calls), (), p_sym)


def trace_event(condition, affect, states, params):
    """Trace an event's ``condition(u, p, t)`` (one value) and ``affect(u, p, t)`` (a dict
    of new values of the states it names) into ``(g, {state index: expression}, u
    symbols, p symbols)`` over the states, the mechanistic parameters and t."""
    u_sym, p_sym, u, p = _proxies(states, params)
    out = []
    for fn, what in ((condition, "condition"), (affect, "affect")):
        if fn is None:
            out.append(None)
            continue
        if not callable(fn):
            raise TypeError(f"Event: `{what}` must be a function of (u, p, t), got {fn!r}")
        name, where = _describe(fn)
        label = f"event {what} `{name}`"
        nargs = _arity(fn, (2, 3), label)
        with _Context(label, where):
            out.append(fn(*(u, p, Sym(T))[:nargs]))
    g = _lift(out[0])
    if g is None:
        raise ModelError("Event: `condition` must return one number or traced expression (its "
                         f"root is the event), got {type(out[0]).__name__}")
    new = {}
    if out[1] is not None:
        if not isinstance(out[1], dict):
            raise ModelError("Event: `affect` must return a dict of state name -> new value, "
                             f"got {type(out[1]).__name__}")
        for k, v in out[1].items():
            if k not in states:
                raise ModelError(f"Event: `affect` sets {k!r}, which is not a state "
                                 f"({', '.join(states)})")
            e = _lift(v)
            if e is None:
                raise ModelError(f"Event: `affect`'s value for {k!r} is not a number or a "
                                 "traced expression")
            new[states.index(k)] = e
    return g, new, u_sym, p_sym
