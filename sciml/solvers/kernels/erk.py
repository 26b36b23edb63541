"""The explicit Runge-Kutta step, and `erk_integrate`: the integration loop with it.

`erk_step` (the stages, the new state and its error estimate) and `erk_interp`
(the method's interpolant on a step) are the only ERK arithmetic in the
package: the forward solve, forward sensitivities and every continuous
adjoint integrate their system with `erk_integrate`, and the discrete adjoint
(`adjoints.kernels.discrete`) rebuilds stage inputs with `erk_stage_input`.

The tableau (`structs.ERKTableau`) is data: flat ``A`` (s x s) and ``P``
(s x d), ``b`` and ``e`` over the step's own stages (``len(b)``), so the same
code serves arrays (one compiled loop for all tableaus) and tuples of
constants (the lean entry points of `entries`, where LLVM folds the
coefficients).

Output inside a step (save times, stored steps) comes from the step's stages;
interpolants with extra stages (Vern7) get those only for steps that need
them; `store_eval` computes and keeps them on demand for the rest.
"""

import numpy as np

from sciml._jit import borrow, jit

from .control import (
    DT_UNDERFLOW,
    LOG_ERR0,
    NONFINITE,
    SUCCESS,
    all_finite,
    err_norm2,
    hinit,
    hmin,
    next_step,
    reject_factor,
    step_to,
)
from .loop import ACCEPTED, AGAIN, REJECTED, Family, family_loop
from .record import copy_row
from .system import sys_accept, sys_f, sys_interpolates

# ------------------------------------------------------------------ the step


# The sums over stages below run in one of two orders: for a few states, state by
# state with the stage sum in registers (with a constant tableau, LLVM unrolls it
# and folds the coefficients); for many states (an adjoint with its parameter
# integral), stage by stage over contiguous rows, which vectorises.
SMALL = 16


@jit(inline="always")
def erk_stage_input(tab, out, z, h, K, i):
    """``out = z + h * sum_{j<i} A[i, j] K[j]``: the input of stage ``i``."""
    s = len(tab.c)
    A = tab.A
    nz = z.shape[0]
    if nz <= SMALL:
        for m in range(nz):
            acc = 0.0
            for j in range(i):
                acc += A[i * s + j] * K[j, m]
            out[m] = z[m] + h * acc
    else:
        for m in range(nz):
            out[m] = z[m]
        for j in range(i):
            a = h * A[i * s + j]
            if a != 0.0:
                for m in range(nz):
                    out[m] += a * K[j, m]


@jit(inline="always")
def erk_stages(sys, tab, K, z, t, h, k, first, last, tmp):
    """Stages ``first .. last-1``: ``K[i] = f(t + c_i h, stage input i)``; rows below
    ``first`` already filled; tmp (nz,) scratch. Returns the evaluations made."""
    for i in range(first, last):
        erk_stage_input(tab, tmp, z, h, K, i)
        sys_f(sys, K[i], tmp, t + tab.c[i] * h, k)
    return last - first


@jit(inline="always")
def erk_combine(tab, znew, err, z, h, K):
    """``znew = z + h sum_i b_i K[i]`` and the error estimate ``err = h sum_i e_i K[i]``.

    Stages with both weights zero are left out, not multiplied by zero: a fixed-step
    method's end stage f(t + h, u_new) may overflow where u_new itself is finite.
    """
    b, e = tab.b, tab.e
    nz = z.shape[0]
    if nz <= SMALL:
        for m in range(nz):
            acc = 0.0
            ee = 0.0
            for i in range(len(b)):
                if b[i] != 0.0 or e[i] != 0.0:
                    acc += b[i] * K[i, m]
                    ee += e[i] * K[i, m]
            znew[m] = z[m] + h * acc
            err[m] = h * ee
    else:
        for m in range(nz):
            znew[m] = z[m]
            err[m] = 0.0
        for i in range(len(b)):
            if b[i] != 0.0 or e[i] != 0.0:
                hb, he = h * b[i], h * e[i]
                for m in range(nz):
                    znew[m] += hb * K[i, m]
                    err[m] += he * K[i, m]


@jit(inline="always")
def erk_step(sys, tab, K, z, znew, err, t, h, k, tmp):
    """One step of size ``h`` from ``(t, z)`` with ``K[0] = f(t, z)`` given: the other
    stages, ``znew`` and ``err``. Returns the evaluations made."""
    n = erk_stages(sys, tab, K, z, t, h, k, 1, len(tab.b), tmp)
    erk_combine(tab, znew, err, z, h, K)
    return n


@jit(inline="always")
def erk_weight(tab, i, theta):
    """Interpolant weight of stage ``i`` at ``theta``: ``sum_j P[i, j] theta**(j + 1)``."""
    s = len(tab.c)
    d = len(tab.P) // s
    w = 0.0
    for j in range(d - 1, -1, -1):
        w = w * theta + tab.P[i * d + j]
    return w * theta


@jit(inline="always")
def erk_interp(tab, out, theta, h, z, K, w):
    """The interpolant on one step: ``out = z + h * sum_i b_i(theta) K[i]`` (all stages);
    ``w`` (s,) scratch for the weights (one pass over the states after them)."""
    s = len(tab.c)
    for i in range(s):
        w[i] = erk_weight(tab, i, theta) * h
    nz = out.shape[0]
    if nz <= SMALL:
        for m in range(nz):
            acc = z[m]
            for i in range(s):
                acc += w[i] * K[i, m]
            out[m] = acc
    else:
        for m in range(nz):
            out[m] = z[m]
        for i in range(s):
            if w[i] != 0.0:
                for m in range(nz):
                    out[m] += w[i] * K[i, m]


# ------------------------------------------------------------------ the loop


@jit(inline="always")
def _work(sys, tab, ctl, z):
    nz = z.shape[0]
    s_all = len(tab.c)
    own = np.zeros((s_all + 3) * nz + s_all)  # stages, znew, err, tmp, interpolant weights
    buf = borrow(own)  # views of it are not reference-counted (see sciml._jit)
    o = s_all * nz
    return own, (borrow(buf[:o].reshape((s_all, nz))), buf[o:o + nz], buf[o + nz:o + 2 * nz],
                 buf[o + 2 * nz:o + 3 * nz], buf[o + 3 * nz:])


# The state carried between steps: (h, the step tried, the next step, log of the last
# accepted error, the last try rejected, the last try non-finite, the step's extra stages
# evaluated).


@jit(inline="always")
def _begin(sys, tab, ctl, stops, z, work, t):
    K, znew, err, tmp, wts = work
    sys_f(sys, K[0], z, t, 0)
    nfev = 1
    status = SUCCESS if all_finite(K[0]) else NONFINITE
    h = ctl.h0
    if ctl.adaptive and not h > 0.0:
        h = hinit(sys, ctl, z, K[0], t, 0, tab.order, stops[stops.shape[0] - 1] - t, tmp, err)
        nfev += 1
    return (h, h, h, LOG_ERR0, False, False, False), status, nfev


@jit(inline="always")
def _attempt(sys, tab, ctl, stops, z, work, st, t, k):
    K, znew, err, tmp, wts = work
    h, _, h_next, log_prev, rejected, nonfinite, extra = st
    h_try, lands = step_to(t, h, stops[k + 1])
    t_new = stops[k + 1] if lands else t + h_try
    if not t_new > t:  # the step no longer moves t
        return (AGAIN, NONFINITE if nonfinite else DT_UNDERFLOW, t_new, lands, st, 0, 0, 0)
    nfev = erk_step(sys, tab, K, z, znew, err, t, h_try, k, tmp)
    if ctl.adaptive:
        en2 = err_norm2(ctl, err, z, znew)
        finite = all_finite(znew) and en2 == en2
        if not (finite and en2 <= 1.0):
            nonfinite = not finite
            h = h_try * reject_factor(ctl, en2 if finite else np.inf)
            status = (NONFINITE if nonfinite else DT_UNDERFLOW) if h < hmin(t) else SUCCESS
            return (REJECTED, status, t_new, lands,
                    (h, h_try, h_next, log_prev, True, nonfinite, extra), nfev, 0, 0)
        h_next, log_prev = next_step(ctl, en2, log_prev, h_try, h, rejected, lands)
    else:
        if not all_finite(znew):
            return (AGAIN, NONFINITE, t_new, lands, st, nfev, 0, 0)
        h_next = ctl.h0
    return (ACCEPTED, SUCCESS, t_new, lands,
            (h, h_try, h_next, log_prev, rejected, nonfinite, extra), nfev, 0, 0)


@jit(inline="always")
def _accept(sys, tab, z, work, st, t, t_new, k, want, d_k, j):
    K, znew, err, tmp, wts = work
    h, h_try, h_next, log_prev, rejected, nonfinite, _ = st
    s = len(tab.b)
    s_all = len(tab.c)
    nfev = 0
    extra = False
    if s_all > s and (want or sys_interpolates(sys)):
        nfev += erk_stages(sys, tab, K, z, t, h_try, k, s, s_all, tmp)
        extra = True
    nfev += sys_accept(sys, tab, t, h_try, z, znew, K, k)
    if j >= 0:
        for i in range(s_all if extra else s):
            for m in range(z.shape[0]):
                d_k[j, i, m] = K[i, m]
    return K, 1 if extra else 0, nfev, (h, h_try, h_next, log_prev, rejected, nonfinite, extra)


@jit(inline="always")
def _interp(tab, work, st, K, out, ts, t, t_new, z):
    h_try = st[1]
    erk_interp(tab, out, (ts - t) / h_try, h_try, z, K, work[4])


@jit(inline="always")
def _fsal(tab, lands, extra):
    """Whether the step's last stage is f at its end (then the next step's first)."""
    return not lands and tab.end_stage >= 0 and (tab.end_stage < len(tab.b) or extra)


@jit(inline="always")
def _advance(tab, z, work, st, lands):
    K, znew = work[0], work[1]
    e = tab.end_stage if _fsal(tab, lands, st[6]) else 0
    for m in range(z.shape[0]):
        z[m] = znew[m]
        K[0, m] = K[e, m]  # the FSAL stage reused (a no-op otherwise: f is evaluated below)


@jit(inline="always")
def _after(sys, tab, ctl, stops, z, work, st, t, k, nseg, lands, jumped):
    K, znew, err, tmp, wts = work
    h, h_try, h_next, log_prev, rejected, nonfinite, extra = st
    nfev = 0
    if lands:
        if k < nseg:
            # a stop: the rate or the state may jump, so f afresh
            sys_f(sys, K[0], z, t, k)
            nfev += 1
            if ctl.adaptive and jumped:
                h_next = min(h_next, hinit(sys, ctl, z, K[0], t, k, tab.order, stops[nseg] - t,
                                           tmp, err))
                nfev += 1
                log_prev = LOG_ERR0
    elif not _fsal(tab, lands, extra):
        sys_f(sys, K[0], z, t, k)
        nfev += 1
    return (h_next, h_try, h_next, log_prev, False, False, extra), nfev


erk_integrate = family_loop(
    "erk_integrate",
    "Integrate ``sys`` from ``stops[0]`` to ``stops[-1]`` with an explicit Runge-Kutta "
    "method (`loop.integrate`); fixed steps of ``ctl.h0`` when not adaptive. Returns "
    "``(status, t)``.",
    _work, _begin, _attempt, _accept, _interp, _advance, _after)


# ------------------------------------------------------------------ stored steps


@jit(inline="always")
def find_step(rec, n_steps, tt, k, j):
    """The stored step holding time ``tt`` in segment ``k`` (``k < 0``: any segment,
    right-continuous), searching from step ``j``.

    Steps are matched within the segment, so a time on a stop gets the state on
    the segment's side of it (for either method family's store).
    """
    d_t, d_seg = rec.d_t, rec.d_seg
    if k < 0:
        while j > 0 and d_t[j] > tt:
            j -= 1
        while j < n_steps - 1 and d_t[j + 1] <= tt:
            j += 1
    else:
        while j > 0 and (d_seg[j] > k or (d_t[j] > tt and d_seg[j - 1] == k)):
            j -= 1
        while j < n_steps - 1 and (d_seg[j] < k or (d_seg[j + 1] == k and d_t[j + 1] < tt)):
            j += 1
    return j


@jit
def store_step(sys, tab, rec, n_steps, tt, k, j, tmp):
    """`find_step`, with the step's extra interpolant stages computed and kept if missing."""
    j = find_step(rec, n_steps, tt, k, j)
    if len(tab.c) > len(tab.b) and rec.d_have[j] == 0:
        h = rec.d_t[j + 1] - rec.d_t[j]
        erk_stages(sys, tab, rec.d_k[j], rec.d_z[j], rec.d_t[j], h, rec.d_seg[j], len(tab.b),
                   len(tab.c), tmp)
        rec.d_have[j] = 1
    return j


@jit
def store_at(sys, tab, rec, n_steps, out, tt, k, j, tmp):
    """``out`` = the stored solution at ``tt`` in segment ``k`` (see `store_step`);
    returns the step used (the next search starts there). ``tmp``: scratch of
    ``max(nz, s)``."""
    j = store_step(sys, tab, rec, n_steps, tt, k, j, tmp)
    h = rec.d_t[j + 1] - rec.d_t[j]
    erk_interp(tab, out, (tt - rec.d_t[j]) / h, h, rec.d_z[j], rec.d_k[j], tmp)
    return j


@jit
def store_eval(sys, tab, rec, n_steps, tq, out, tmp):
    """Dense output at sorted times ``tq`` (q,) into ``out`` (q, nz), right-continuous:
    a time on a step boundary uses the later step (after events there); ``tmp``
    scratch of ``max(nz, s)``."""
    j = 0
    for q in range(tq.shape[0]):
        tt = tq[q]
        if n_steps == 0 or tt >= rec.d_t[n_steps]:
            copy_row(out, q, rec.d_z[n_steps])
            continue
        j = store_at(sys, tab, rec, n_steps, out[q], tt, -1, j, tmp)


def _stored_state(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
    return store_at(fsys, ftab, rec, n_steps, out, t, k, j, tmp)


def _store_rows(tab):
    return len(tab.c)


def _step_interp(tab, out, theta, h, z, znew, K, w):
    erk_interp(tab, out, theta, h, z, K, w)


FAMILY = Family(erk_integrate, _stored_state, _store_rows, _step_interp)
