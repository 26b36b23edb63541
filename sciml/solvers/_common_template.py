"""Pieces every integration loop shares (template): doses, error norm, step-size control.

Both loop families (explicit Runge-Kutta in `_erk_template`, Rosenbrock in
`_ros_template`) integrate over the same *schedule*, built in Python by
`sciml.solvers.common.schedule`:

* ``stops`` (m + 1,): ``t0``, every dose boundary and user tstop strictly
  inside the span, ``tf``. The loop lands on each exactly (the step before a
  stop is shortened to end on it) and never steps across one.
* ``seg_rate`` (m, n): the summed infusion rate added to du/dt on segment
  ``[stops[k], stops[k+1])``. The active infusions are found by segment
  *index*, never by comparing stage times with dose times.
* ``bolus_k, bolus_i, bolus_a`` (nb,): stop index, state index and amount of
  each bolus, sorted by stop index; applied on arrival at that stop (at
  ``t0`` before the first step), so states are right-continuous.

The step-size controller is the PI controller of Hairer, Norsett & Wanner,
*Solving Ordinary Differential Equations I* (2nd ed., Springer 1993), Sec. II.4
(as in their DOPRI5 code): on acceptance ``h *= clip(safety / (err**beta1 /
err_prev**beta2), qmin, qmax)``, on rejection the same with ``beta2 = 0``
and no increase; the initial step is their ``hinit`` heuristic (Sec. II.4,
"Starting step size"). All functions here work in caller-owned buffers.
The small ones called for every stage or step are inlined into the loops
(``inline="always"``): on Lotka-Volterra with Tsit5 that took the loop from
40 to 25 us for 100 steps, for about a second more compile time per model.

The lines between the template markers are pasted into every generated model
module (see `sciml._codegen.template_source`); names carry the ``com_`` prefix.
"""

import math

from sciml._jit import jit
from sciml.solvers._stubs import obs_into, rhs_into

# --- template begin

# Status codes (the values of `sciml.solvers.base`; a test checks they agree).
COM_SUCCESS, COM_MAX_STEPS, COM_DT_UNDERFLOW, COM_NONFINITE, COM_NEED_STORAGE = 0, 1, 2, 3, 4


@jit(inline="always")
def com_rhs(du, u, p, t, ws, rate):
    """``du = f(u, p, t) + rate``: the model's right-hand side plus the segment's infusions.

    du, u, rate : (n,); ``rate`` is a row of ``seg_rate``.
    """
    rhs_into(du, u, p, t, ws)
    for i in range(du.shape[0]):
        du[i] += rate[i]


@jit
def com_apply_boluses(u, k, bolus_k, bolus_i, bolus_a, bp):
    """Add every bolus scheduled at stop ``k`` to ``u``, starting at pointer ``bp``.

    Returns the pointer past the last bolus applied (``bp`` if none was):
    boluses are sorted by stop index, so the loop only ever moves forward.
    """
    nb = bolus_k.shape[0]
    while bp < nb and bolus_k[bp] < k:  # before the span (not scheduled): skip
        bp += 1
    while bp < nb and bolus_k[bp] == k:
        u[bolus_i[bp]] += bolus_a[bp]
        bp += 1
    return bp


@jit(inline="always")
def com_err_norm(err, u, unew, rtol, atol):
    """Weighted RMS norm of ``err`` with scale ``atol_i + rtol * max(|u_i|, |unew_i|)``.

    A step is acceptable when this is <= 1. NaN when ``err`` or the states are
    non-finite (the caller then rejects the step).
    """
    n = err.shape[0]
    acc = 0.0
    for i in range(n):
        sc = atol[i] + rtol * max(abs(u[i]), abs(unew[i]))
        r = err[i] / sc
        acc += r * r
    return math.sqrt(acc / n)


@jit(inline="always")
def com_all_finite(u):
    for i in range(u.shape[0]):
        if not math.isfinite(u[i]):
            return False
    return True


@jit
def com_hinit(u, f0, p, t, ws, rate, rtol, atol, order, hmax, u1, f1):
    """Hairer's starting step size for a method of order ``order`` (one rhs evaluation).

    ``f0 = f(t, u)`` must be given; ``u1, f1`` (n,) are scratch. Estimates the
    step from the sizes of ``u``, ``f`` and a difference quotient of ``f``,
    so that the local error of an explicit Euler step is about 1% of the
    tolerance; returns a step in ``(0, hmax]``.
    """
    n = u.shape[0]
    d0 = 0.0
    d1 = 0.0
    for i in range(n):
        sc = atol[i] + rtol * abs(u[i])
        d0 += (u[i] / sc) ** 2
        d1 += (f0[i] / sc) ** 2
    d0 = math.sqrt(d0 / n)
    d1 = math.sqrt(d1 / n)
    if d0 < 1e-5 or d1 < 1e-5:
        h0 = 1e-6
    else:
        h0 = 0.01 * d0 / d1
    h0 = min(h0, hmax)
    for i in range(n):
        u1[i] = u[i] + h0 * f0[i]
    com_rhs(f1, u1, p, t + h0, ws, rate)
    d2 = 0.0
    for i in range(n):
        sc = atol[i] + rtol * abs(u[i])
        d2 += ((f1[i] - f0[i]) / sc) ** 2
    d2 = math.sqrt(d2 / n) / h0
    dmax = max(d1, d2)
    if dmax <= 1e-15:
        h1 = max(1e-6, h0 * 1e-3)
    else:
        h1 = (0.01 / dmax) ** (1.0 / (order + 1))
    h = min(100.0 * h0, h1, hmax)
    if not (h > 0.0):  # NaN from a non-finite f: let the step loop report it
        h = hmax
    return h


# log(1e-4): the previous step's error assumed at the start and after a dose (DOPRI5's).
COM_LOG_ERR0 = -9.210340371976182


@jit(inline="always")
def com_next_step(en, log_prev, h_try, h, rejected, lands, safety, qmin, qmax, beta1, beta2):
    """After an accepted step with error ``en``: ``(next step, log_prev for the next one)``.

    PI controller: ``h_try * clip(safety * prev**beta2 / en**beta1, qmin, qmax)``, with
    ``log_prev = log(prev)`` carried between steps: one log and one exp a step, no
    division on the path from one step to the next. No growth right after a rejection;
    a step cut short by a stop (``lands`` with ``h_try < h``) says little, so the
    proposal ``h`` is kept at least.
    """
    le = math.log(max(en, 1e-10))
    h_next = h_try * min(qmax, max(qmin, safety * math.exp(beta2 * log_prev - beta1 * le)))
    if rejected:
        h_next = min(h_next, h_try)
    elif lands and h_try < h:
        h_next = max(h_next, h)
    return h_next, max(le, COM_LOG_ERR0)


@jit(inline="always")
def com_reject_factor(err, safety, qmin, beta1):
    """Factor (< 1) for retrying a rejected step (``err > 1`` or NaN)."""
    if not math.isfinite(err):
        return qmin
    return max(qmin, min(1.0, safety / err ** beta1))


@jit(inline="always")
def com_step_to(t, h, t_stop):
    """The step to try from ``t`` with proposal ``h`` before ``t_stop``: ``(h_try, lands)``.

    Stretches the step onto the stop when it would leave a sliver of under 1%
    of ``h`` (Hairer's rule), so no step shorter than that is ever forced.
    """
    if t + 1.01 * h >= t_stop:
        return t_stop - t, True
    return h, False


@jit(inline="always")
def com_hmin(t):
    """Smallest step allowed at time ``t`` before reporting step size underflow."""
    return 16.0 * 2.220446049250313e-16 * max(abs(t), 1e-300)  # 16 ulp-ish of t


@jit
def com_observe(Y, ts, U, p, ws):
    """Observables along a trajectory: ``Y[i] = g(U[i], p, ts[i])``; Y (T, n_obs), U (T, n)."""
    for i in range(ts.shape[0]):
        obs_into(Y[i], U[i], p, ts[i], ws)


# --- template end
