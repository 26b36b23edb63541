"""The activation registry: builtin names plus user-registered scalar pairs.

Compiled code applies an activation through its row kernel's address (`row`;
`nets.activations.row_address`). A builtin's row kernel is cached on disk; a
registered activation's is built around the user's numba functions in the
process that uses it (numba cannot cache a function keyed on a user's function),
a small compile: the kernels that call it are the same disk-cached ones.

Builtins with constants (PyTorch's keyword arguments: ``leaky_relu``'s
``negative_slope``, ``elu``'s and ``celu``'s ``alpha``, ``hardtanh``'s ``min_val``
and ``max_val``) are named with them, ``"elu(alpha=2.0)"`` (`spec` writes the
canonical name); the bare name means PyTorch's defaults. They share one row
kernel, which takes the constants as data (`resolve`).
"""

import math
import re
import threading

import numba
import numpy as np

from .activations import BUILTIN, BY_NAME, CODES, Formula, compile_row, row_address

_custom = {}  # name -> (code, value_fn, deriv_fn, second_fn or None)
_addresses = {}  # (name, k) -> (cfunc, address): C-callable versions, compiled once
_rows = {}  # (name, dtype) -> row kernel of a registered activation (a numba cfunc)
# Row kernels of activations registered again: compiled code may still hold their
# addresses, so they are kept alive.
_retired = []
_rows_lock = threading.Lock()


def names():
    return list(BUILTIN) + list(_custom)


def _unknown(name, where=None):
    return ValueError(f"{_prefix(where)}unknown activation {name!r}; known: "
                      f"{', '.join(names())} (add one with nets.register_activation)")


def _prefix(where):
    return "" if where is None else f"{where}: "


def _what(name, where):
    """How a message names the activation `name`: the argument, if `where` calls it."""
    return f"activation {name!r}" if where is None else f"{where}: `activation` {name!r}"


_SPEC = re.compile(r"^([a-z_0-9]+)\((.*)\)$")


def _form(act):
    """How a name of `act` with constants looks, its defaults filled in."""
    if not act.constants:
        return repr(act.name)
    return repr(f"{act.name}({', '.join(f'{k}={v!r}' for k, v in act.constants)})")


def parse(name, where=None):
    """(builtin Activation, constants) of a builtin name with or without constants
    (``"elu(alpha=2.0)"``), or None for any other name (registered or unknown).

    A builtin's name with constants it does not take, a constant that is not a finite
    number, or unbalanced parentheses raise ValueError (prefixed with `where`, e.g.
    ``"Dense"``, saying what was expected and what came)."""
    if not isinstance(name, str):
        return None
    if name in BY_NAME:
        return BY_NAME[name], BY_NAME[name].defaults
    m = _SPEC.match(name)
    if m is None:
        head = name.partition("(")[0].strip()
        if head in BY_NAME and ("(" in name or ")" in name):
            raise ValueError(f"{_what(name, where)}: expected {head!r} or "
                             f"{head}(name=value, ...) as in {_form(BY_NAME[head])}")
        return None
    if m.group(1) not in BY_NAME:
        return None
    act = BY_NAME[m.group(1)]
    known = dict(act.constants)
    given = {}
    for item in filter(None, (s.strip() for s in m.group(2).split(","))):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or key not in known:
            raise ValueError(f"{_what(name, where)}: {act.name} takes "
                             + (f"the constants {', '.join(known)} (as in {_form(act)})"
                                if known else "no constants")
                             + f", got {item!r}")
        if key in given:
            raise ValueError(f"{_what(name, where)}: `{key}` is given twice")
        try:
            given[key] = float(val)
        except ValueError:
            raise ValueError(f"{_what(name, where)}: `{key}` must be a number, "
                             f"got {val.strip()!r}") from None
        if not math.isfinite(given[key]):
            raise ValueError(f"{_what(name, where)}: `{key}` must be a finite "
                             f"number, got {val.strip()!r}")
    if act.name == "celu" and given.get("alpha", 1.0) == 0.0:
        raise ValueError(f"{_what(name, where)}: celu's alpha must not be 0")
    return act, tuple(given.get(k, v) for k, v in act.constants)


def canonical(name, where=None):
    """The one name of activation `name`: a builtin's as `spec` writes it (the bare name
    when its constants are the defaults, so ``"elu(alpha=1.0)"`` is ``"elu"``), a
    registered one's as it is. Layers keep this name, so that equal activations are
    equal names everywhere (kernels, models, JAX, repr).

    Raises TypeError for a name that is not a str and ValueError for an unknown or
    malformed one, prefixed with `where` (e.g. ``"Dense"``)."""
    if not isinstance(name, str):
        raise TypeError(f"{_prefix(where)}`activation` must be a name (str), got {name!r}")
    parsed = parse(name, where)
    if parsed is not None:
        act, consts = parsed
        return spec(act.name, **dict(zip((k for k, _ in act.constants), consts)))
    if name in _custom:
        return name
    raise _unknown(name, where)


def spec(name, **constants):
    """The canonical name of builtin `name` with `constants` (PyTorch's keywords), e.g.
    ``spec("elu", alpha=2.0) == "elu(alpha=2.0)"``; the bare name when all are defaults."""
    if name not in BY_NAME:
        raise _unknown(name)
    act = BY_NAME[name]
    known = dict(act.constants)
    for key in constants:
        if key not in known:
            raise ValueError(f"activation {name!r} takes "
                             + (f"the constants {', '.join(known)}" if known else "no constants")
                             + f", got {key!r}")
    vals = [float(constants.get(k, v)) for k, v in act.constants]
    if tuple(vals) == act.defaults:
        return name
    return f"{name}({', '.join(f'{k}={v!r}' for (k, _), v in zip(act.constants, vals))})"


def resolve(name):
    """``(code, c0, c1)``: activation `name`'s code and constants (zeros where it takes
    none)."""
    parsed = parse(name)
    if parsed is not None:
        act, consts = parsed
        c = (consts + (0.0, 0.0))[:2]
        return act.code, float(c[0]), float(c[1])
    if name in _custom:
        return _custom[name][0], 0.0, 0.0
    raise _unknown(name)


def code(name):
    """The kernels' code of activation `name`; constants other than the defaults are
    refused here (a caller that passes them on uses `resolve`)."""
    parsed = parse(name)
    if parsed is not None:
        act, consts = parsed
        if consts != act.defaults:
            raise ValueError(f"activation {name!r}: constants other than the defaults need a "
                             f"kernel that takes them (nets.registry.resolve); here use "
                             f"{act.name!r}")
        return act.code
    if name in _custom:
        return _custom[name][0]
    raise _unknown(name)


def formula(name):
    """The `nets.activations.Formula` of builtin `name`, its constants bound."""
    parsed = parse(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not a builtin activation")
    act, consts = parsed
    f = act.formula
    return Formula(lambda z, m: f.value(z, m, *consts), lambda z, a, m: f.slope(z, a, m, *consts))


def constants(name):
    """The constants of builtin `name` as a dict (PyTorch's keywords), defaults filled in."""
    parsed = parse(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not a builtin activation")
    act, consts = parsed
    return dict(zip((k for k, _ in act.constants), consts))


def is_builtin(name):
    """Whether `name` is a builtin activation (with or without constants)."""
    try:
        return parse(name) is not None
    except ValueError:
        return False


def name_of(c):
    """The activation name of code ``c``."""
    if 0 <= c < len(BUILTIN):
        return BUILTIN[c]
    for name, entry in _custom.items():
        if entry[0] == c:
            return name
    raise ValueError(f"no activation has code {c}")


def register_activation(name, value, derivative, second=None):
    """Add an activation usable as ``Dense(n, name)``.

    Parameters
    ----------
    name : str
        New name (not a builtin).
    value, derivative : numba-compiled scalar functions
        ``value(z)`` and ``d value / dz`` at the pre-activation ``z``, e.g.
        made with ``numba.njit``. Plain Python functions are compiled for you.
    second : numba-compiled scalar function, optional
        ``d^2 value / dz^2``: needed only by second-order sensitivities of models
        using this activation (stiff discrete adjoints, forward sensitivities and
        backsolve with `Rodas5`).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_activation: `name` must be a non-empty str, got {name!r}")
    if name in CODES or _SPEC.match(name):
        raise ValueError(f"register_activation: {name!r} is a builtin activation or has the "
                         "form of one with constants, name(key=value)")
    fns = []
    for arg, fn in (("value", value), ("derivative", derivative), ("second", second)):
        if fn is None and arg == "second":
            fns.append(None)
            continue
        if not callable(fn):
            raise TypeError(f"register_activation: `{arg}` must be callable, got {fn!r}")
        fns.append(fn if isinstance(fn, numba.core.dispatcher.Dispatcher)
                   else numba.njit(inline="always")(fn))
    prev = _custom.get(name)
    c = prev[0] if prev else len(BUILTIN) + len(_custom)
    _custom[name] = (c, fns[0], fns[1], fns[2])
    with _rows_lock:
        for key in [key for key in _rows if key[0] == name]:
            _retired.append(_rows.pop(key))
    for k in range(3):
        _addresses.pop((name, k), None)


def activation_function(name, k):
    """The registered numba function: value (k = 0), derivative (1) or second derivative (2)."""
    if name not in _custom:
        raise ValueError(f"{name!r} is not a registered custom activation")
    fn = _custom[name][1 + k]
    if fn is None:
        raise ValueError(f"activation {name!r} was registered without its second derivative; "
                         f"register it again with `second=`")
    return fn


def activation_address(name, k):
    """The address of a C-callable ``double f(double)`` for `activation_function`.

    Compiled once per process (numba cannot cache a function built around a user's
    function), then shared by every model using the activation.
    """
    key = (name, k)
    if key not in _addresses:
        fn = activation_function(name, k)

        def call(z):
            return fn(z)

        cf = numba.cfunc("float64(float64)")(call)
        _addresses[key] = (cf, cf.address)
    return _addresses[key][1]


def row(name, dtype):
    """``(address, c0, c1)``: how compiled code applies activation `name` to a row of
    `dtype` (float32 or float64): its row kernel's address and constants
    (`nets.activations.call_row`). The row kernel is compiled or loaded on first use."""
    parsed = parse(name)
    if parsed is not None:
        code_, c0, c1 = resolve(name)
        return row_address(code_, dtype), c0, c1
    if name not in _custom:
        raise _unknown(name)
    key = (name, np.dtype(dtype))
    with _rows_lock:
        if key not in _rows:
            _rows[key] = compile_row(_custom_row(*_custom[name][1:3]), dtype, cache=False)
        return _rows[key].address, 0.0, 0.0


def _custom_row(f, df):
    """A row kernel (`nets.activations.row_signature`) of the value `f` and derivative
    `df` of a registered activation."""

    def row(zp, dp, n, c0, c1, need_d):
        z = numba.carray(zp, n)
        d = numba.carray(dp, n)
        for j in range(n):
            v = z[j]
            if need_d:
                d[j] = df(v)
            z[j] = f(v)

    return row
