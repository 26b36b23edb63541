"""Step-size control shared by every loop: error norm, PI controller, first step, landing.

The controller is the PI controller of Hairer, Norsett & Wanner, *Solving
Ordinary Differential Equations I* (2nd ed., Springer 1993), Sec. II.4 (as in
their DOPRI5 code): on acceptance ``h *= clip(safety / (err**beta1 /
err_prev**beta2), qmin, qmax)``, on rejection the same with ``beta2 = 0``
and no increase; the first step is their ``hinit`` heuristic (Sec. II.4,
"Starting step size"). Every function works in caller-owned buffers and is
inlined into the loops.
"""

import math

import numpy as np

from sciml._interpret import stand_in
from sciml._jit import jit

from .system import sys_f

# Status codes returned by every compiled loop (those of `sciml.solvers.base`).
SUCCESS, MAX_STEPS, DT_UNDERFLOW, NONFINITE = 0, 1, 2, 3

# log(1e-4): the previous step's error assumed at the start and after a jump (DOPRI5's).
LOG_ERR0 = -9.210340371976182


@jit(inline="always")
def err_norm2(ctl, err, z, znew):
    """Square of the weighted RMS norm of ``err[:n_err]``, scale ``atol_i + rtol *
    max(|z_i|, |znew_i|)``.

    A step is acceptable when this is <= 1; NaN when anything is non-finite. The
    square, because the next step size needs only its logarithm: a square root would
    sit on the chain of dependent operations from one step to the next.
    """
    atol = ctl.atol
    n = atol.shape[0]
    acc = 0.0
    for i in range(n):
        sc = atol[i] + ctl.rtol * max(abs(z[i]), abs(znew[i]))
        r = err[i] / sc
        acc += r * r
    return acc / max(n, 1)


@jit(inline="always")
def all_finite(z):
    for i in range(z.shape[0]):
        if not math.isfinite(z[i]):
            return False
    return True


@stand_in(err_norm2)
def _err_norm2_numpy(ctl, err, z, znew):
    # the interpreter's (`sciml._interpret`): the loops above as vector operations
    n = ctl.atol.shape[0]
    r = err[:n] / (ctl.atol + ctl.rtol * np.maximum(np.abs(z[:n]), np.abs(znew[:n])))
    return float(r @ r) / max(n, 1)


@stand_in(all_finite)
def _all_finite_numpy(z):
    return bool(np.isfinite(z).all())


@jit(inline="always")
def hinit(sys, ctl, z, f0, t, k, order, hmax, z1, f1):
    """Hairer's starting step for a method of order ``order`` (one evaluation of f).

    ``f0 = f(t, z)`` must be given; ``z1, f1`` are scratch. The step makes the
    local error of an explicit Euler step about 1% of the tolerance (norms over
    the error-controlled part); in ``(0, hmax]``. The arithmetic is in two functions
    that know nothing of the system, so they are compiled once for every system, not
    once per system type (only the one evaluation of f is the system's).
    """
    h0 = _hinit_probe(ctl, z, f0, hmax, z1)
    sys_f(sys, f1, z1, t + h0, k)
    return _hinit_step(ctl, z, f0, f1, h0, order, hmax)


@jit
def _hinit_probe(ctl, z, f0, hmax, z1):
    """The trial step h0 from the norms of z and f0; ``z1 = z + h0 f0``."""
    atol = ctl.atol
    n = atol.shape[0]
    d0 = 0.0
    d1 = 0.0
    for i in range(n):
        sc = atol[i] + ctl.rtol * abs(z[i])
        d0 += (z[i] / sc) ** 2
        d1 += (f0[i] / sc) ** 2
    d0 = math.sqrt(d0 / max(n, 1))
    d1 = math.sqrt(d1 / max(n, 1))
    h0 = 1e-6 if (d0 < 1e-5 or d1 < 1e-5) else 0.01 * d0 / d1
    h0 = min(h0, hmax)
    for i in range(z.shape[0]):
        z1[i] = z[i] + h0 * f0[i]
    return h0


@jit
def _hinit_step(ctl, z, f0, f1, h0, order, hmax):
    """The step from the second derivative estimated by ``(f1 - f0) / h0``."""
    atol = ctl.atol
    n = atol.shape[0]
    d1 = 0.0
    d2 = 0.0
    for i in range(n):
        sc = atol[i] + ctl.rtol * abs(z[i])
        d1 += (f0[i] / sc) ** 2
        d2 += ((f1[i] - f0[i]) / sc) ** 2
    d1 = math.sqrt(d1 / max(n, 1))
    d2 = math.sqrt(d2 / max(n, 1)) / h0
    dmax = max(d1, d2)
    h1 = max(1e-6, h0 * 1e-3) if dmax <= 1e-15 else (0.01 / dmax) ** (1.0 / (order + 1))
    h = min(100.0 * h0, h1, hmax)
    if not (h > 0.0):  # NaN from a non-finite f: let the step loop report it
        h = hmax
    return h


@jit(inline="always")
def next_step(ctl, en2, log_prev, h_try, h, rejected, lands):
    """After an accepted step with squared error ``en2`` (`err_norm2`): ``(next step, log
    of this error)``.

    PI control with ``log_prev`` carried between steps (one log and one exp a step);
    no growth right after a rejection; a step cut short by a stop keeps at least
    the proposal ``h``.
    """
    le = 0.5 * math.log(max(en2, 1e-20))
    q = ctl.safety * math.exp(ctl.beta2 * log_prev - ctl.beta1 * le)
    h_next = h_try * min(ctl.qmax, max(ctl.qmin, q))
    if rejected:
        h_next = min(h_next, h_try)
    elif lands and h_try < h:
        h_next = max(h_next, h)
    return h_next, max(le, LOG_ERR0)


@jit(inline="always")
def reject_factor(ctl, err2):
    """Factor (< 1) for retrying a rejected step (squared error ``err2 > 1`` or NaN)."""
    if not math.isfinite(err2):
        return ctl.qmin
    return max(ctl.qmin, min(1.0, ctl.safety / err2 ** (0.5 * ctl.beta1)))


@jit(inline="always")
def step_to(t, h, t_stop):
    """The step to try from ``t`` with proposal ``h`` before ``t_stop``: ``(h_try, lands)``.

    Stretches the step onto the stop when it would leave a sliver of under 1% of
    ``h`` (Hairer's rule), so no step shorter than that is ever forced.
    """
    if t + 1.01 * h >= t_stop:
        return t_stop - t, True
    return h, False


@jit(inline="always")
def hmin(t):
    """Smallest step allowed at time ``t`` before reporting step size underflow."""
    return 16.0 * 2.220446049250313e-16 * max(abs(t), 1e-300)
