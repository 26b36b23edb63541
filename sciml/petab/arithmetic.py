"""PEtab math's arithmetic read without the `petab` library.

Importing `petab` (for its PEtab math grammar, `petab.v1.math.sympify_petab`) takes
1.2-1.5 s here: its package imports matplotlib, scipy.stats and pandas' I/O. Most of a
problem's formulas are arithmetic on names and numbers (``scale * x + offset``,
``log10(k1)``), where PEtab math and Python's expression grammar agree; `arithmetic`
reads those with Python's parser (``^`` as ``**``: both bind right to left and above a
unary minus) and builds what ``sympify_petab`` builds. Anything else (comparisons,
booleans, ``piecewise``, other functions, PEtab's reserved names) returns None, for the
grammar.
"""

import ast
import re

import sympy

__all__ = ["arithmetic"]

_NUMBER = re.compile(r"\d+(\.\d+)?([eE][+-]?\d+)?")  # PEtab's: not ".5", not "2."
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED = {"inf", "nan", "true", "false"}  # PEtab's, in any case
_OPS = {ast.Add: lambda a, b: sympy.Add(a, b), ast.Sub: lambda a, b: sympy.Add(a, -b),
        ast.Mult: lambda a, b: sympy.Mul(a, b), ast.Div: lambda a, b: a / b,
        ast.Pow: lambda a, b: sympy.Pow(a, b)}


def _log(x, base=None):
    if x.is_zero is True:  # PEtab math: log(0) is -inf
        return -sympy.oo
    return sympy.log(x) if base is None else sympy.log(x, base)


_FUNCTIONS = {"exp": ((1,), sympy.exp), "sqrt": ((1,), sympy.sqrt), "ln": ((1,), _log),
              "log": ((1, 2), _log), "log10": ((1,), lambda x: _log(x, 10)),
              "log2": ((1,), lambda x: _log(x, 2))}  # name: (argument counts, function)


class _Other(Exception):
    """Not the arithmetic subset."""


def arithmetic(text):
    """The sympy expression (symbols ``real=True``, numbers `sympy.Float`) of the PEtab
    math formula ``text``, or None where it is not plain arithmetic."""
    if "**" in text or not text.isascii():
        return None
    src = text.strip().replace("^", "**")  # both right-associative, above unary minus
    try:
        return _build(ast.parse(src, mode="eval").body, src)
    except (SyntaxError, _Other):
        return None


def _build(node, src):
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_build(node.left, src), _build(node.right, src))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _build(node.operand, src)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name):
        if not _NAME.fullmatch(node.id) or node.id.lower() in _RESERVED:
            raise _Other
        return sympy.Symbol(node.id, real=True)
    if isinstance(node, ast.Constant):
        token = ast.get_source_segment(src, node)
        if not isinstance(node.value, (int, float)) or isinstance(node.value, bool) \
                or token is None or not _NUMBER.fullmatch(token):
            raise _Other
        return sympy.Float(token)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords
            and node.func.id in _FUNCTIONS):
        counts, fn = _FUNCTIONS[node.func.id]
        if len(node.args) not in counts:
            raise _Other
        return fn(*(_build(a, src) for a in node.args))
    raise _Other
