"""The engine run by the Python interpreter, for the calls made while it compiles.

The engine's loops are numba code: ordinary Python in numba's dialect, which the
interpreter can run as it is, only slowly. Three kinds of name in it mean something
only to numba, and `python` gives each its plain-Python meaning:

- a compiled function (a dispatcher): its own Python function, with every global name
  it reads given this same treatment (`python` copies the function with new globals;
  the engine's source is not touched);
- an overloaded stub (``sys_f``, ``lin_solve``, ...): numba picks its implementation by
  the types of the arguments; here the same choice is made from `numba.typeof` of the
  values (found through numba's typing registry, so the overloads are declared once);
- an intrinsic: the stand-in given by `stand_in` beside its definition (a kernel call
  through its address becomes a ctypes call; ``borrow`` is the identity); a compiled or
  plain engine function may have one too, numpy or LAPACK doing what its loops do (the
  Rosenbrock step and its reverse, the LUs, forward sensitivities: 3-60x quicker than the
  loops interpreted; `tests/sciml/test_stand_ins.py` runs solves with and without them).

``math`` reads as numpy's functions, so that ``log(0)`` is ``-inf`` as in numba rather
than an exception. Everything else (numpy, constants, named tuples) is used as it is.
What numba and the interpreter do differently (fastmath's reassociation, contraction
into FMAs) changes results in the last bits only.
"""

import builtins
import math
import threading
import time
import types as pytypes

import numba
import numpy as np
from numba.core.dispatcher import Dispatcher
from numba.core.extending import _Intrinsic
from numba.core.typing import templates

__all__ = ["python", "stand_in", "NotInterpretable", "TooSlow", "interrupt", "deadline",
           "by_identity", "per_call", "begin_call", "ENGINE_MODULES"]

#: the engine's modules: what `python` rebinds, what `sciml._tier` tiers
ENGINE_MODULES = ("sciml.solvers.kernels", "adjoints.kernels")


class NotInterpretable(Exception):
    """Raised by a stand-in for what the interpreter cannot run (the caller compiles)."""


class TooSlow(Exception):
    """Raised by `interrupt` past the `deadline` (the caller compiles instead)."""


_DEADLINE = threading.local()  # per thread: when `interrupt` raises


_TICKS = [0]  # calls of `interrupt`: it looks at the clock at every 16th


def interrupt():
    """Raise `TooSlow` past the deadline, or once its event is set; called by the kernel
    calls' stand-ins, which every loop makes often (a few microseconds apart: it looks
    at every 16th, as often as a loop's step)."""
    _TICKS[0] += 1
    if _TICKS[0] & 15:
        return
    d = _DEADLINE
    if time.perf_counter() > getattr(d, "at", math.inf) or (
            getattr(d, "until", None) is not None and d.until.is_set()):
        raise TooSlow


class deadline:
    """Context manager: interpreted calls inside it stop (`TooSlow`) after ``seconds``,
    or once the `threading.Event` ``until`` is set (the compiled loop is ready)."""

    def __init__(self, seconds, until=None):
        self.seconds, self.until = seconds, until

    def __enter__(self):
        self.saved = getattr(_DEADLINE, "at", math.inf), getattr(_DEADLINE, "until", None)
        _DEADLINE.at = min(self.saved[0], time.perf_counter() + self.seconds)
        _DEADLINE.until = self.until

    def __exit__(self, *exc):
        _DEADLINE.at, _DEADLINE.until = self.saved


_PER_CALL = []  # the stand-ins' tables that hold only within one interpreted call


def per_call(table):
    """``table`` (a dict), emptied as each interpreted call of a loop begins: for what a
    stand-in keeps beside an engine buffer and stays true only while no compiled loop
    writes that buffer, which within one interpreted call none does."""
    _PER_CALL.append(table)
    return table


def begin_call():
    """An interpreted call of a loop begins (`sciml._tier`): the `per_call` tables empty."""
    for table in _PER_CALL:
        table.clear()


_STAND_INS = {}  # intrinsic, dispatcher or engine function -> its Python stand-in
_PY = {}  # id(engine object) -> (object, its interpreted version)


def stand_in(intrinsic):
    """Decorator: the plain-Python function that ``intrinsic`` means to the interpreter;
    also for an engine function whose loops the interpreter runs far slower than numpy
    or a library call doing the same (the dense LU's: LAPACK)."""

    def register(fn):
        _STAND_INS[intrinsic] = fn
        return fn

    return register


class _Math:
    """``math`` as numba computes it: numpy's functions, non-finite results instead of
    exceptions (``log(0)``, ``sqrt(-1)``)."""

    def __getattr__(self, name):
        value = getattr(np, name, None) if name in ("sqrt", "log", "exp", "log1p", "expm1",
                                                    "pow", "tanh", "atan2", "hypot") else None
        value = value if value is not None else getattr(math, name)
        setattr(self, name, value)  # looked up once: the loops read it at every step
        return value


_MATH = _Math()


class _Module:
    """An engine module whose names read as their interpreted versions."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        value = python(getattr(self._module, name))
        setattr(self, name, value)
        return value


def by_identity(make, bound):
    """``make`` as a function computed once per object and found again by the object's
    identity: for what the interpreted loops pass call after call (the same tableaus and
    buffers), where hashing would cost more than the lookup or is not defined (arrays).
    At most ``bound`` are kept, each with its object, which stays alive meanwhile (so no
    other object takes its id)."""
    table = {}
    get = table.get

    def lookup(obj):
        hit = get(id(obj))
        if hit is None or hit[0] is not obj:
            if len(table) >= bound:
                table.clear()
            hit = table[id(obj)] = (obj, make(obj))
        return hit[1]

    return lookup


class _Chosen:
    """An overloaded stub: the implementation that numba's overload chooses for the types
    of the arguments, interpreted. Found again by the arguments' classes: every engine
    overload chooses by the class of one argument (a system, a linear solver, a tableau,
    a model; ``bind`` by None or not), none by the types of a struct's fields or of an
    array, so the classes (`type`, a C call) are as good a key as numba's types and a
    quarter of the cost of any finer one, at every hook call of an interpreted step."""

    def __init__(self, choose):
        self.choose = choose
        self.impls = {}

    def __call__(self, *args):
        impl = self.impls.get(tuple(map(type, args)))
        return (impl or self.impl(*args))(*args)

    def impl(self, *args):
        """The interpreted implementation for ``args``' types: for a caller that calls it
        again and again with arguments of the same types (a Rosenbrock step's stages)."""
        key = tuple(map(type, args))
        impl = self.impls.get(key)
        if impl is None:
            chosen = self.choose(*(numba.typeof(a) for a in args))
            if chosen is None:
                raise NotInterpretable(f"no implementation of {self.choose.__name__} for {key}")
            impl = self.impls[key] = python(chosen)
        return impl


_OVERLOADS = {}  # id(stub) -> (stub, the overload function numba registered for it)
_SEEN = [0]  # how many registrations `_OVERLOADS` was built from


def _overload_of(fn):
    """The overload function numba registered for the stub ``fn``, or None."""
    reg = templates.builtin_registry.globals
    if _SEEN[0] != len(reg):  # new registrations since the last look
        _OVERLOADS.clear()
        for f, ty in reg:
            found = [t._overload_func for t in getattr(ty, "templates", ())
                     if hasattr(t, "_overload_func")]
            if found:
                _OVERLOADS[id(f)] = (f, found[0])
        _SEEN[0] = len(reg)
    hit = _OVERLOADS.get(id(fn))
    return hit[1] if hit is not None and hit[0] is fn else None


def _refuse(name):
    def refuse(*args):
        raise NotInterpretable(f"the intrinsic {name} has no stand-in")

    return refuse


def _is_engine(module_name):
    return isinstance(module_name, str) and module_name.startswith(ENGINE_MODULES)


def _names(code):
    """Every global name ``code`` and the code nested in it may read."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            out |= _names(c)
    return out


def _rebind(fn):
    """``fn`` with its global names (and closure) read as their interpreted versions."""
    cells = None
    if fn.__closure__:
        cells = tuple(pytypes.CellType() for _ in fn.__closure__)
    g = {"__builtins__": builtins, "__name__": fn.__globals__.get("__name__")}
    new = pytypes.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, cells)
    new.__kwdefaults__ = fn.__kwdefaults__
    _PY[id(fn)] = (fn, new)  # before the names: the engine's functions call each other
    src = fn.__globals__
    for name in _names(fn.__code__):
        if name in src:
            g[name] = python(src[name])
    if cells:
        for cell, old in zip(cells, fn.__closure__):
            cell.cell_contents = python(old.cell_contents)
    return new


def python(obj):
    """``obj`` as the interpreter runs it (see the module text); ``obj`` itself where it
    means the same to both."""
    hit = _PY.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    if isinstance(obj, (_Intrinsic, Dispatcher, pytypes.FunctionType)) and obj in _STAND_INS:
        out = _STAND_INS[obj]
    elif isinstance(obj, _Intrinsic):
        out = _refuse(obj._name)
    elif isinstance(obj, Dispatcher):
        out = python(obj.py_func)
    elif isinstance(obj, pytypes.FunctionType):
        choose = _overload_of(obj)
        if choose is not None:
            out = _Chosen(choose)
        elif _is_engine(obj.__globals__.get("__name__")):
            return _rebind(obj)
        else:
            return obj
    elif isinstance(obj, pytypes.ModuleType):
        if obj is math:
            return _MATH
        if not _is_engine(obj.__name__):
            return obj
        out = _Module(obj)
    else:
        return obj
    _PY[id(obj)] = (obj, out)
    return out
