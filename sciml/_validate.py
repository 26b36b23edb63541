"""Argument checks: the checks of values every entry point shares, and their messages.

Each takes the value a user gave and either returns it converted (float64
arrays C-contiguous, numbers as float/int) or raises an error naming the
argument, what was expected and what came. This module imports nothing from
sciml; a check of an object's type stays with its class (`problem.problem_list`,
`solve`'s solver check, `fit`'s optimizer check), built on these. The public entry points
(`sciml.solve`, `sciml.loss_and_grad`, `sciml.fit`, `ODEProblem`, the JAX
backend) call these; their lean paths check types inline and leave the rest
to the compiled loops (which return -1 on an unexpected value, so that the
full path reruns the call through these checks and names the argument).
"""

import math
import numbers

import numpy as np

__all__ = ["is_number", "float_vector", "check_rtol", "check_atol", "atol_vector", "lean_atol",
           "check_dt", "check_max_steps", "saveat_times", "number", "positive_number", "integer",
           "positive_int", "optional_tolerance", "one_of"]

_F64 = np.dtype(np.float64)


def is_number(v):
    return not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))


def check_rtol(rtol):
    if not is_number(rtol) or not np.isfinite(rtol) or rtol <= 0:
        raise ValueError(f"`rtol` must be a finite number > 0, got {rtol!r}")
    if rtol < 1e-14:
        raise ValueError(f"`rtol` = {rtol!r} is below what float64 can resolve; use "
                         "rtol >= 1e-14")
    return float(rtol)


def check_atol(atol, n):
    if is_number(atol) and np.isfinite(atol) and atol > 0:
        return np.full(n, float(atol))
    a = np.array(atol, dtype=np.float64) if is_number(atol) or isinstance(
        atol, (list, tuple, np.ndarray)) else None
    if a is None or a.ndim > 1 or (a.ndim == 1 and a.shape != (n,)):
        raise ValueError(f"`atol` must be a number or an array of shape ({n},) (one per "
                         f"state), got {atol!r}")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"`atol` must be finite and > 0, got {atol!r}")
    # a copy, contiguous and writeable (a broadcast view is read-only: a type of its own
    # to numba, which compiled every loop a second time for it)
    return np.full(n, float(a)) if a.ndim == 0 else a


def check_dt(solver, dt):
    if dt is None:
        if not solver.adaptive:
            raise ValueError(f"`dt` is required: {solver!r} takes fixed steps; pass e.g. "
                             "dt=0.01 (or use an adaptive solver such as Tsit5())")
        return None
    if not is_number(dt) or not np.isfinite(dt) or dt <= 0:
        raise ValueError(f"`dt` must be a finite number > 0, got {dt!r}")
    return float(dt)


def check_max_steps(max_steps, where=None):
    return positive_int("max_steps", max_steps, optional=False, where=where)


def saveat_times(saveat, tspan):
    """None (every step), or the sorted float64 save times inside ``tspan``."""
    t0, tf = tspan
    if saveat is None:
        return None
    if is_number(saveat):
        if not np.isfinite(saveat) or saveat <= 0:
            raise ValueError(f"`saveat` as a number is the spacing of saved times and must be "
                             f"> 0, got {saveat!r}")
        k = int(np.floor((tf - t0) / saveat * (1 + 1e-12)))
        times = np.minimum(t0 + saveat * np.arange(k + 1), tf)
        return times if times[-1] == tf else np.append(times, tf)
    try:
        times = np.array(saveat, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("`saveat` must be None, a number (spacing) or a 1-D array of times, "
                         f"got {saveat!r}") from None
    if times.ndim != 1:
        raise ValueError(f"`saveat` must be a 1-D array of times, got shape {times.shape}")
    if times.size == 0 or (times[0] >= t0 and times[-1] <= tf
                           and (times[1:] >= times[:-1]).all()):
        return times  # sorted, inside tspan, no NaN (a NaN fails every comparison)
    if not np.all(np.isfinite(times)):
        raise ValueError("`saveat` contains NaN or Inf")
    outside = (times < t0) | (times > tf)
    if np.any(outside):
        i = int(np.argmax(outside))
        raise ValueError(f"`saveat` times must lie in tspan [{t0:g}, {tf:g}]; "
                         f"saveat[{i}] = {float(times[i])!r}")
    i = int(np.argmax(times[1:] < times[:-1]))
    raise ValueError(f"`saveat` must be sorted (increasing): saveat[{i + 1}] = "
                     f"{float(times[i + 1])!r} < saveat[{i}] = {float(times[i])!r}")


_ATOLS = {}


def atol_vector(atol, n):
    """``np.full(n, atol)``, shared between calls (never written to).

    Left writeable: a read-only array is another numba type, and every compiled loop
    would be compiled a second time for it (check_atol's arrays are writeable).
    """
    key = (atol, n)
    a = _ATOLS.get(key)
    if a is None:
        if len(_ATOLS) > 256:
            _ATOLS.clear()
        a = _ATOLS[key] = np.full(n, atol)
    return a


def lean_atol(atol, n):
    """A per-state atol the lean path can pass as it is."""
    return (type(atol) is np.ndarray and atol.dtype is _F64 and atol.shape == (n,)
            and atol.flags.c_contiguous)


def float_vector(value, n, where, name, expected):
    """``value`` as a finite, C-contiguous float64 (n,) array (the same object when it
    already is one); otherwise a ValueError naming ``where``, ``name`` and ``expected``."""
    a = np.ascontiguousarray(value, dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(f"{where}: `{name}` must have {expected}; got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{where}: `{name}` contains NaN or Inf")
    return a


def _prefix(where):
    return f"{where}: " if where else ""


def number(v, name, where=None, lo=-math.inf, hi=math.inf, lo_open=True, hi_open=False,
           want=None):
    """``float(v)`` if ``v`` is a real number (not a bool) in the interval from ``lo`` to
    ``hi`` (open or closed at each end; an infinite end is open); else a ValueError naming
    ``where``, ``name`` and the interval (or ``want``, e.g. "a standard deviation > 0")."""
    if is_number(v) and math.isfinite(v) and (v > lo if lo_open else v >= lo) \
            and (v < hi if hi_open else v <= hi):
        return float(v)
    want = want or _interval(lo, hi, lo_open, hi_open)
    raise ValueError(f"{_prefix(where)}`{name}` must be {want}, got {v!r}")


def _interval(lo, hi, lo_open, hi_open):
    """What `number` expects, in words."""
    if lo == -math.inf and hi == math.inf:
        return "a finite number"
    if hi == math.inf:
        return f"a finite number {'>' if lo_open else '>='} {lo:g}"
    if lo == -math.inf:
        return f"a finite number {'<' if hi_open else '<='} {hi:g}"
    return f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def real(v, name, where=None, lo=-math.inf, hi=math.inf, lo_open=True, hi_open=False,
         want=None):
    """`number`, but a value that is no number at all is a TypeError."""
    if not is_number(v):
        raise TypeError(f"{_prefix(where)}`{name}` must be a number, got {v!r}")
    return number(v, name, where, lo, hi, lo_open, hi_open, want)


def optional_tolerance(v, name, where):
    """None, or a finite tolerance > 0 (a method's own ``rtol=``, ``atol=``)."""
    if v is None:
        return None
    if not is_number(v) or not 0 < v < math.inf:
        raise ValueError(f"{where}: `{name}` must be None or a finite number > 0, got {v!r}")
    return float(v)


def positive_number(name, v, allow_zero=False, where="fit"):
    return number(v, name, where, lo=0.0, lo_open=not allow_zero)


def integer(v, name, where=None, lo=1, optional=False):
    """``int(v)`` if ``v`` is an integer (not a bool) >= ``lo`` (or None when ``optional``);
    else a ValueError naming ``where`` and ``name``."""
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        want = "a positive int" if lo == 1 else f"an int >= {lo}"
        raise ValueError(f"{_prefix(where)}`{name}` must be {want}"
                         f"{' or None' if optional else ''}, got {v!r}")
    return int(v)


def positive_int(name, v, optional=True, where="fit"):
    return integer(v, name, where, optional=optional)


def one_of(name, v, choices, where):
    """``v`` if it is one of ``choices`` (strings), else a ValueError naming the argument."""
    if not isinstance(v, str) or v not in choices:
        raise ValueError(f"{where}: `{name}` must be one of {', '.join(map(repr, choices))}, "
                         f"got {v!r}")
    return v
