"""A model's kernels as small syntax trees: statements over sympy expressions.

A `Kernel` is a name, its arguments (float64 arrays, and the scalar ``t``) and a
body of three kinds of statement:

- `Assign`: ``target = value`` or ``target += value``, the target a scalar local
  (a sympy Symbol; integer symbols are loop counters) or an array element; the
  value a sympy expression or, in kernels of large functions, a node of
  `sciml.model.graph` (the same expression, without sympy's objects);
- `Loop`: ``for var in range(start, stop, step)`` with constant bounds;
- `Call`: ``sub(a + i, b + j, ...)``, another kernel (a subroutine) run on
  pointers into the caller's arrays: a network pass written once and called at
  each of a model's call sites (see `sciml.model.derivatives`);
- `Note`: a comment.

Values are sympy expressions in scalar symbols and array elements ``At(a, i)``
(``a`` a Symbol naming an argument, ``i`` an integer expression). Two printers
lower the same tree: `sciml.model.llvm` to machine code, and `python_source`
here to readable Python, which is what `Model.source` shows and what the tests
compile with numba as an independent reference for the machine code.

Functions beyond sympy's own (see `FUNCTIONS`) are sympy Function classes here:
`sigmoid` (the networks' logistic function) and `activation(name, k)` for a
registered custom activation (value, derivative, second derivative).
"""

import re
from dataclasses import dataclass

import numpy as np
import sympy
from sympy.printing.pycode import PythonCodePrinter

__all__ = ["At", "at", "Assign", "Loop", "Call", "Note", "Kernel", "sigmoid", "activation",
           "python_source", "function_source", "real", "index", "array", "SCALAR_ARGS"]


class At(sympy.Function):
    """The element ``a[i]`` of the array argument named by Symbol ``a`` (a real number)."""

    nargs = 2
    is_real = True


def at(a, i):
    """``At(a, i)`` for an int ``i``, made without sympy's argument checks (the same
    object, a twentieth of the time: kernels of large models hold one per element)."""
    return sympy.Basic.__new__(At, a, sympy.Integer(i))


class sigmoid(sympy.Function):  # noqa: N801 (a sympy function, named as sympy names them)
    """The logistic function 1 / (1 + exp(-x)), evaluated without overflow."""

    nargs = 1
    is_real = True

    def fdiff(self, argindex=1):
        s = sigmoid(self.args[0])
        return s * (1 - s)


_CUSTOM = {}


def activation(name, k):
    """The sympy function for derivative ``k`` (0 value, 1, 2) of custom activation ``name``.

    Printers call the registered numba functions by their compiled addresses
    (`sciml.model.llvm`) or by name (`python_source`).
    """
    key = (name, k)
    if key not in _CUSTOM:
        _CUSTOM[key] = type(f"act_{name}_{k}", (sympy.Function,),
                            {"nargs": 1, "is_real": True, "activation": key})
    return _CUSTOM[key]


def real(name):
    return sympy.Symbol(name, real=True)


def index(name):
    return sympy.Symbol(name, integer=True)


def array(name):
    """The Symbol naming an array argument (use with `At`)."""
    return sympy.Symbol(name)


@dataclass(frozen=True)
class Assign:
    """``target = value`` (or ``+=`` when ``add``); target: a Symbol or an `At`."""

    target: sympy.Expr
    value: sympy.Expr
    add: bool = False


@dataclass(frozen=True)
class Loop:
    """``for var in range(start, stop, step): body`` with constant bounds."""

    var: sympy.Symbol
    start: int
    stop: int
    body: tuple
    step: int = 1


@dataclass(frozen=True, eq=False)
class Call:
    """``sub(*(a + offset for a, offset in args))``: kernel ``sub`` run with its array
    arguments pointing into the caller's (``args``: one (array Symbol of the caller,
    integer offset expression) per argument of ``sub``, in order). Compared by identity:
    a subroutine is one object however many sites call it."""

    sub: "Kernel"
    args: tuple


@dataclass(frozen=True)
class Note:
    text: str


@dataclass(frozen=True)
class Kernel:
    """One kernel: ``name(*args)``; every argument is a float64 array except ``t``.

    ``tables``: ``(name, values)`` of constant arrays the body reads as ``At(name, i)``
    like arguments (the numbers of groups rolled into a loop, `sciml.model.roll`).
    """

    name: str
    args: tuple
    body: tuple
    tables: tuple = ()

    def statements(self):
        """Every statement, loops' bodies included (depth first)."""
        stack = list(reversed(self.body))
        while stack:
            s = stack.pop()
            yield s
            if isinstance(s, Loop):
                stack.extend(reversed(s.body))

    def subroutines(self):
        """The kernels this one calls, each once, in order of first call."""
        seen = {}
        for s in self.statements():
            if isinstance(s, Call):
                seen.setdefault(id(s.sub), s.sub)
        return list(seen.values())


SCALAR_ARGS = frozenset({"t"})

# ------------------------------------------------------------------ Python printer


class _Printer(PythonCodePrinter):
    """Python (numba) text: `math.*` functions, exact float literals, `a[i]` elements."""

    def _print_Float(self, expr):
        v = float(expr)
        if np.isfinite(v):
            return repr(v)  # round-trips exactly; sympy's default prints 15 digits
        return "math.nan" if np.isnan(v) else ("math.inf" if v > 0 else "(-math.inf)")

    def _print_At(self, expr):
        a, i = expr.args
        return f"{a}[{self._print(i)}]"

    def _print_sigmoid(self, expr):
        return f"_sigmoid({self._print(expr.args[0])})"

    def _print_tanh(self, expr):
        return f"_tanh({self._print(expr.args[0])})"

    def _print_Function(self, expr):
        key = getattr(type(expr), "activation", None)
        if key is not None:
            return f"_act_{key[0]}_{key[1]}({self._print(expr.args[0])})"
        return super()._print_Function(expr)


_PRINTER = _Printer({"standard": "python3"})


def text(expr):
    if not isinstance(expr, sympy.Basic):  # a `sciml.model.graph.Node`
        expr = expr.sympy()
    return _PRINTER.doprint(expr)


def _lines(body, depth):
    for s in body:
        pad = "    " * depth
        if isinstance(s, Note):
            yield f"{pad}# {s.text}"
        elif isinstance(s, Assign):
            yield f"{pad}{text(s.target)} {'+=' if s.add else '='} {text(s.value)}"
        elif isinstance(s, Call):
            args = ", ".join(str(a) if o == 0 else f"{a}[{text(o)}:]" for a, o in s.args)
            yield f"{pad}{s.sub.name}({args})"
        elif isinstance(s, Loop):
            step = f", {s.step}" if s.step != 1 else ""
            yield f"{pad}for {s.var} in range({s.start}, {s.stop}{step}):"
            yield from _lines(s.body, depth + 1)
            if not s.body:
                yield f"{pad}    pass"
        else:
            raise TypeError(f"not a statement: {s!r}")


def function_source(kernel):
    """The text of one kernel as a numba function (its tables module constants named
    ``<kernel>_<table>``)."""
    lines = [f"@jit\ndef {kernel.name}({', '.join(kernel.args)}):"]
    lines += [f"    {t} = {kernel.name}_{t}" for t, _ in kernel.tables]
    body = list(_lines(kernel.body, 1))
    return "\n".join(lines + (body or ["    return"])) + "\n"


HEADER = '''"""{title} (generated by sciml; a rendering of the kernels' syntax trees)."""

import math

import numpy as np

from nets.activations import sigmoid as _sigmoid
from nets.activations import tanh as _tanh
from sciml._jit import jit
'''


def _float(v):
    return _PRINTER._print_Float(v)


def python_source(title, kernels, constants=()):
    """A Python module holding `kernels` (numba functions) and ``NAME = value`` constants."""
    parts = [HEADER.format(title=title)]
    subs = {}
    for k in kernels:
        for sub in k.subroutines():
            subs.setdefault(sub.name, sub)
    kernels = list(subs.values()) + list(kernels)
    custom = sorted({type(f).activation for k in kernels for s in k.statements()
                     if isinstance(s, Assign) and isinstance(s.value, sympy.Basic)
                     for f in s.value.atoms(sympy.Function)
                     if getattr(type(f), "activation", None)})
    if custom:
        parts.append("from nets.registry import activation_function as _af\n" + "".join(
            f"_act_{n}_{k} = _af({n!r}, {k})\n" for n, k in custom))
    if constants:
        parts.append("".join(f"{k} = {v!r}\n" for k, v in constants))
    tables = [(f"{k.name}_{t}", v) for k in kernels for t, v in k.tables]
    if tables:
        parts.append("".join(f"{name} = np.array([{', '.join(map(_float, v))}])\n"
                             for name, v in tables))
    parts += [function_source(k) for k in kernels]
    return "\n\n".join(p.rstrip("\n") + "\n" for p in parts)


def natural_key(name):
    m = re.match(r"([a-z_]+)(\d+)$", str(name))
    return (m.group(1), int(m.group(2))) if m else (str(name), 0)
