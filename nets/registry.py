"""The activation registry: builtin names plus user-registered scalar pairs.

Builtin activations run in the disk-cached kernels. Registering a custom
activation builds one extra kernel set that dispatches to the user's numba
functions; it is compiled in the process that uses it (numba cannot cache a
kernel keyed on a user's function), so its first call takes a few seconds.
"""

import numba

from .activations import BUILTIN, CODES, activate_row

_custom = {}  # name -> (code, value_fn, deriv_fn, second_fn or None)
_kernels = {}  # frozenset of custom names -> recompiled kernel namespace
_addresses = {}  # (name, k) -> (cfunc, address): C-callable versions, compiled once


def names():
    return list(BUILTIN) + list(_custom)


def code(name):
    if name in CODES:
        return CODES[name]
    if name in _custom:
        return _custom[name][0]
    raise ValueError(f"unknown activation {name!r}; known: {', '.join(names())} "
                     "(add one with nets.register_activation)")


def is_builtin(name):
    return name in CODES


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
    if name in CODES:
        raise ValueError(f"register_activation: {name!r} is a builtin activation")
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
    _kernels.clear()
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


def kernels_for(activation_names):
    """The kernel namespace that can run these activations."""
    from . import kernels

    custom = frozenset(n for n in activation_names if n not in CODES)
    if not custom:
        return vars(kernels)
    if custom not in _kernels:
        _kernels[custom] = kernels.with_activation(_make_dispatch(custom))
    return _kernels[custom]


def _make_dispatch(custom):
    """An `activate_row` that also runs the custom activations ``custom`` (names)."""
    entries = tuple(_custom[name][:3] for name in sorted(custom))  # (code, value, derivative)
    n_builtin = len(BUILTIN)

    @numba.njit
    def activate(code, buf, zo, do, n, need_d):
        if code < n_builtin:
            activate_row(code, buf, zo, do, n, need_d)
            return
        for entry in numba.literal_unroll(entries):
            if code == entry[0]:
                f, df = entry[1], entry[2]
                for j in range(n):
                    z = buf[zo + j]
                    if need_d:
                        buf[do + j] = df(z)
                    buf[zo + j] = f(z)

    return activate
