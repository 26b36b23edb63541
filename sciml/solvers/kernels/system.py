"""What a loop integrates: systems, and the one forward system of a model.

A loop (`loop.integrate`, with any family's step) knows nothing about what it
integrates: it calls the hooks below on its ``sys`` argument, and numba picks
the implementation by the type of ``sys`` (a named tuple class registered with
`register`). A system is the state ``z`` it evolves and:

- ``sys_f(sys, out, z, t, k)``: dz/dt at time ``t`` in segment ``k`` (between
  ``stops[k]`` and ``stops[k + 1]``);
- ``sys_event(sys, z, k)``: what happens on arrival at ``stops[k]`` (a dose, an
  adjoint jump); returns True if the step size is to start afresh (a dose moved
  the state, so its time scale may have changed; an adjoint's jump at an
  observation does not: its dynamics are linear, the same before and after);
- ``sys_accept(sys, tab, t, h, z, znew, K, k)``: work after each accepted step
  (quadratures); returns the evaluations it made; ``sys_interpolates(sys)``: whether
  that work reads the step's interpolant (so extra interpolant stages are needed);
- for implicit methods, ``sys_jac(sys, z, t, k)`` (the Jacobian at a step's
  start), ``sys_factor(sys, ihg)`` (factor ``ihg M - Jacobian``; False if
  singular), ``sys_solve(sys, r)`` (``r <- (ihg M - Jacobian)^-1 r``),
  ``sys_autonomous(sys)`` and ``sys_mass(sys)``: the diagonal of the mass matrix
  M of ``M dz/dt = f`` (empty, the default: the identity).

`Forward` is a model's own ODE, du/dt = f(u, p, t) plus the infusion rate of
each dose segment, with boluses as events. The adjoint and sensitivity systems
live in `adjoints.kernels`, beside their settings.
"""

from typing import NamedTuple

import numpy as np
from numba.extending import overload

from sciml._jit import OPTIONS

from . import calls
from .linsolve import lin_factor, lin_jac, lin_mass, lin_solve
from .structs import BoundModel, Lin

# `sys_f` is typed and lowered once per system type and inlined by LLVM (its
# `alwaysinline`), not copied into each of a loop's three or four call sites by numba's
# IR inliner, which types and lowers every copy again.
_LLVM_INLINE = {**OPTIONS, "forceinline": True}
_IMPLS = {}  # hook name -> {system class: implementation}


def _outside(*args):
    raise NotImplementedError("system hooks run only inside compiled loops")


def _impl(name, sys):
    return _IMPLS.get(name, {}).get(getattr(sys, "instance_class", None))


# The hooks: stubs whose numba implementation is chosen by the class of ``sys``.
# (numba needs each overload's signature spelled out.)
def sys_f(sys, out, z, t, k):
    _outside()


def sys_event(sys, z, k):
    _outside()


def sys_accept(sys, tab, t, h, z, znew, K, k):
    _outside()


def sys_interpolates(sys):
    _outside()


def sys_jac(sys, z, t, k):
    _outside()


def sys_factor(sys, ihg):
    _outside()


def sys_solve(sys, r):
    _outside()


def sys_autonomous(sys):
    _outside()


def sys_mass(sys):
    _outside()


@overload(sys_f, jit_options=_LLVM_INLINE)
def _ov_f(sys, out, z, t, k):
    return _impl("f", sys)


@overload(sys_event, jit_options=OPTIONS, inline="always")
def _ov_event(sys, z, k):
    return _impl("event", sys)


@overload(sys_accept, jit_options=OPTIONS, inline="always")
def _ov_accept(sys, tab, t, h, z, znew, K, k):
    return _impl("accept", sys)


@overload(sys_interpolates, jit_options=OPTIONS, inline="always")
def _ov_interpolates(sys):
    return _impl("interpolates", sys)


@overload(sys_jac, jit_options=OPTIONS)
def _ov_jac(sys, z, t, k):
    return _impl("jac", sys)


@overload(sys_factor, jit_options=OPTIONS)
def _ov_factor(sys, ihg):
    return _impl("factor", sys)


@overload(sys_solve, jit_options=OPTIONS)
def _ov_solve(sys, r):
    return _impl("solve", sys)


@overload(sys_autonomous, jit_options=OPTIONS, inline="always")
def _ov_autonomous(sys):
    return _impl("autonomous", sys)


_NO_MASS = np.zeros(0)


@overload(sys_mass, jit_options=OPTIONS, inline="always")
def _ov_mass(sys):
    impl = _impl("mass", sys)
    return impl if impl is not None else (lambda sys: _NO_MASS)


def register(cls, **hooks):
    """Register implementations (plain Python functions, compiled by numba) of the hooks
    ``f, event, accept, interpolates, jac, factor, solve, autonomous`` (and optionally
    ``mass``) for systems of class ``cls``."""
    for name, fn in hooks.items():
        _IMPLS.setdefault(name, {})[cls] = fn


def no_accept(sys, tab, t, h, z, znew, K, k):
    return 0


def never(sys):
    return False


# ---------------------------------------------------------------- the forward systems


class Forward(NamedTuple):
    """du/dt = f(u, p, t); boluses on arrival at stops.

    bolus_off : (m + 2,) int64, boluses of stop k at ``bolus_off[k]:bolus_off[k + 1]``
    of ``bolus_i`` (state indices) and ``bolus_a`` (amounts), or empty for none;
    lin : the implicit steps' linear algebra (`linsolve`; empty for explicit methods).
    """

    m: BoundModel
    bolus_off: np.ndarray
    bolus_i: np.ndarray
    bolus_a: np.ndarray
    lin: Lin


class Infused(NamedTuple):
    """`Forward` plus ``seg_rate`` (m, n): the summed infusion rate of each segment.

    A type of its own, so that the common case has no branch around its
    right-hand side call (a branch there kept LLVM from unrolling the stages).
    """

    m: BoundModel
    bolus_off: np.ndarray
    bolus_i: np.ndarray
    bolus_a: np.ndarray
    lin: Lin
    seg_rate: np.ndarray


def _fwd_f(sys, out, z, t, k):
    calls.rhs(sys.m, out, z, t)


def _infused_f(sys, out, z, t, k):
    calls.rhs(sys.m, out, z, t)
    r = sys.seg_rate[k]
    for i in range(out.shape[0]):
        out[i] += r[i]


def _fwd_event(sys, z, k):
    off = sys.bolus_off
    if k + 1 >= off.shape[0]:
        return False
    lo, hi = off[k], off[k + 1]
    for b in range(lo, hi):
        z[sys.bolus_i[b]] += sys.bolus_a[b]
    return hi > lo


def _fwd_jac(sys, z, t, k):
    lin_jac(sys.m, sys.lin, z, t)


def _fwd_factor(sys, ihg):
    return lin_factor(sys.lin, ihg, -1.0)


def _fwd_solve(sys, r):
    lin_solve(sys.lin, r)


def _fwd_autonomous(sys):
    return sys.m.kern[calls.K_AUTONOMOUS] != 0


def _fwd_mass(sys):
    return lin_mass(sys.lin)


for _cls, _f in ((Forward, _fwd_f), (Infused, _infused_f)):
    register(_cls, f=_f, event=_fwd_event, accept=no_accept, interpolates=never, jac=_fwd_jac,
             factor=_fwd_factor, solve=_fwd_solve, autonomous=_fwd_autonomous, mass=_fwd_mass)
