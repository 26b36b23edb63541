"""The Rosenbrock step, and `ros_integrate`: the integration loop with it.

A step of a Rosenbrock method in the transformed form of Hairer & Wanner
(*Solving ODEs II*, 2nd ed., Springer 1996, Sec. IV.7), which needs no
matrix-vector products with the Jacobian::

    (I/(h gamma) - J) K_i = f(t + c_i h, z + sum_{j<i} a_ij K_j)
                            + sum_{j<i} (C_ij / h) K_j + h d_i df/dt
    z_new = z + sum_i b_i K_i,   error = sum_i e_i K_i

with J and df/dt at the step's start. The system supplies f, the Jacobian
(`sys_jac`), the factorisation of ``I/(h gamma) - J`` (`sys_factor`) and the
solve with it (`sys_solve`), so forward solves, forward sensitivities and
stiff adjoints share `ros_step` and `ros_integrate`. ``df/dt`` is a forward
difference of f in t with step ``sqrt(eps) * max(1, |t|)`` (one more
evaluation per step), skipped for autonomous systems; the loop never steps
across a stop, so a rate constant on a segment cancels in it.

The interpolant of a step is
``z(theta) = (1 - theta) z0 + theta (z1 + (1 - theta) (K1 + theta (K2 + ...)))``
with ``K_j = sum_i H[j, i] K_i`` (the method's own, order 4 for Rodas5); a
stored step keeps ``z1`` (before any event at the step's end) and the ``K_j``.
"""

import math

import numpy as np

from sciml._interpret import by_identity, python, stand_in
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
from .erk import find_step
from .loop import ACCEPTED, AGAIN, REJECTED, Family, family_loop
from .record import copy_row
from .system import (
    sys_accept,
    sys_autonomous,
    sys_f,
    sys_factor,
    sys_jac,
    sys_mass,
    sys_solve,
)

_EPS = 2.220446049250313e-16


@jit(inline="always")
def ros_stage_input(tab, out, z, K, i):
    """``out = z + sum_{j<i} a_ij K_j``: the input of stage ``i``."""
    s = len(tab.c)
    for m in range(z.shape[0]):
        acc = z[m]
        for j in range(i):
            acc += tab.a[i * s + j] * K[j, m]
        out[m] = acc


@jit(inline="always")
def ros_step(sys, tab, K, z, znew, err, t, h, k, f0, dT, nonauto, U, r):
    """All stages of one step (``sys_factor`` done for this ``h``), ``znew`` and ``err``.

    ``f0 = f(t, z)``; ``dT`` = df/dt (read if ``nonauto``). Returns the evaluations made.
    """
    s = len(tab.c)
    nz = z.shape[0]
    ih = 1.0 / h
    mass = sys_mass(sys)  # M dz/dt = f: the C terms are M's (Hairer & Wanner VI.4)
    unit = mass.shape[0] == 0
    for st in range(s):
        if st == 0:
            for m in range(nz):
                r[m] = f0[m]
        else:
            ros_stage_input(tab, U, z, K, st)
            sys_f(sys, r, U, t + tab.c[st] * h, k)
            for m in range(nz):
                acc = 0.0
                for j in range(st):
                    acc += tab.C[st * s + j] * K[j, m]
                r[m] += acc * ih if unit else mass[m] * acc * ih
        if nonauto:
            hd = h * tab.d[st]
            for m in range(nz):
                r[m] += hd * dT[m]
        sys_solve(sys, r)
        for m in range(nz):
            K[st, m] = r[m]
    for m in range(nz):
        acc = z[m]
        ee = 0.0
        for j in range(s):
            acc += tab.b[j] * K[j, m]
            ee += tab.e[j] * K[j, m]
        znew[m] = acc
        err[m] = ee
    return s - 1


def _lower_parts(tab):
    """(a, C, (b; e)): the tableau's matrices as contiguous arrays, for products."""
    s = len(tab.c)
    return (np.ascontiguousarray(tab.a.reshape(s, s)), np.ascontiguousarray(tab.C.reshape(s, s)),
            np.stack((tab.b, tab.e)))


_lower = by_identity(_lower_parts, 16)  # once a tableau
_rows = by_identity(list, 64)  # a stage array's rows as the same objects at every step


@stand_in(ros_step)
def _ros_step_numpy(sys, tab, K, z, znew, err, t, h, k, f0, dT, nonauto, U, r):
    # the interpreter's (`sciml._interpret`): each stage's sums as vector products and the
    # system's hooks chosen once a step, ~3x quicker than the loops interpreted. A stage
    # is computed in its row of K (the same row objects at every step: the kernel calls'
    # stand-ins remember the addresses of the arrays they were given, `calls._address`)
    s = len(tab.c)
    f = python(sys_f).impl(sys, r, U, t, k)
    solve = python(sys_solve).impl(sys, r)
    mass = python(sys_mass)(sys)
    a, C, be = _lower(tab)
    Ch = C * (1.0 / h)
    rows = _rows(K)  # (both callers' stage rows are as long as z)
    for st in range(s):
        row = rows[st]
        if st == 0:
            row[:] = f0
        else:
            np.dot(a[st, :st], K[:st], out=U)
            U += z
            f(sys, row, U, t + tab.c[st] * h, k)
            np.dot(Ch[st, :st], K[:st], out=err)  # scratch until the end
            if mass.shape[0] != 0:
                err *= mass
            row += err
        if nonauto:
            row += (h * tab.d[st]) * dT
        solve(sys, row)
    out = be @ K
    np.add(z, out[0], out=znew)
    err[:] = out[1]
    return s - 1


@jit(inline="always")
def ros_dense_rows(tab, D, znew, K):
    """A step's stored rows: ``D[0] = znew``, ``D[1 + j] = sum_i H[j, i] K_i`` (the
    interpolant's), then the stages ``K_i`` themselves where ``D`` has room for them (a
    discrete adjoint's forward solve: its reverse pass reads them, `_store_rows`)."""
    s = len(tab.c)
    nh = len(tab.H) // s
    for m in range(znew.shape[0]):
        D[0, m] = znew[m]
    for jh in range(nh):
        for m in range(znew.shape[0]):
            acc = 0.0
            for i in range(s):
                acc += tab.H[jh * s + i] * K[i, m]
            D[1 + jh, m] = acc
    for i in range(D.shape[0] - 1 - nh):
        for m in range(znew.shape[0]):
            D[1 + nh + i, m] = K[i, m]


@stand_in(ros_dense_rows)
def _ros_dense_rows_numpy(tab, D, znew, K):
    # the interpreter's: the rows as one matrix product
    s = len(tab.c)
    nh = len(tab.H) // s
    n = znew.shape[0]
    D[0, :n] = znew
    D[1:1 + nh, :n] = tab.H.reshape(nh, s) @ K[:s, :n]
    if D.shape[0] > 1 + nh:
        D[1 + nh:, :n] = K[:s, :n]


@jit(inline="always")
def ros_interp(out, theta, z0, D, nh):
    """The interpolant at ``theta`` from the step's start ``z0`` and stored rows ``D`` (its
    ``nh`` interpolant rows after the end state)."""
    nd = 1 + nh
    th1 = 1.0 - theta
    for m in range(out.shape[0]):
        acc = D[nd - 1, m]
        for j in range(nd - 2, 0, -1):
            acc = D[j, m] + theta * acc
        out[m] = th1 * z0[m] + theta * (D[0, m] + th1 * acc)


def _interp_numpy(out, theta, z0, end, rows):
    # the interpreter's interpolant (`ros_interp`, `_step_interp`) from the step's start,
    # end and rows ``K_j``: the Horner sum as weights on the rows, one vector product
    n = out.shape[0]
    th1 = 1.0 - theta
    w = []
    c = theta * th1
    for _ in range(rows.shape[0]):
        w.append(c)
        c *= theta
    out[:] = th1 * z0[:n] + theta * end[:n] + np.dot(w, rows[:, :n])


@stand_in(ros_interp)
def _ros_interp_numpy(out, theta, z0, D, nh):
    _interp_numpy(out, theta, z0, D[0], D[1:1 + nh])


@jit(inline="always")
def _work(sys, tab, ctl, z):
    nz = z.shape[0]
    s = len(tab.c)
    nh = len(tab.H) // s
    own = np.zeros((s + 7 + nh, nz))
    buf = borrow(own)
    # K, then f0, dT, U, r, znew, err, and a step's rows D1 when they are not stored
    return own, (buf[:s], buf[s], buf[s + 1], buf[s + 2], buf[s + 3], buf[s + 4], buf[s + 5],
                 buf[s + 6:s + 7 + nh])


# The state carried between steps: (h, the step tried, the next step, log of the last
# accepted error, the last try rejected, the last try non-finite, J, f and df/dt to be
# evaluated at the step's start, a starting step to be estimated).


@jit(inline="always")
def _begin(sys, tab, ctl, stops, z, work, t):
    h = ctl.h0
    return (h, h, h, LOG_ERR0, False, False, True, ctl.adaptive and not h > 0.0), SUCCESS, 0


@jit(inline="always")
def _attempt(sys, tab, ctl, stops, z, work, st, t, k):
    K, f0, dT, U, r, znew, err, _ = work
    h, h_try, h_next, log_prev, rejected, nonfinite, fresh, estimate = st
    nfev = njac = 0
    if fresh:
        # Once per accepted state; every retry of the step reuses them.
        sys_f(sys, f0, z, t, k)
        nfev += 1
        if not all_finite(f0):
            return AGAIN, NONFINITE, t, False, st, nfev, njac, 0
        sys_jac(sys, z, t, k)
        njac += 1
        if not sys_autonomous(sys):
            # Forward: at a stop it looks into the segment the step will cover.
            t_fd = t + math.sqrt(_EPS) * max(1.0, abs(t))
            sys_f(sys, dT, z, t_fd, k)
            nfev += 1
            for m in range(z.shape[0]):
                dT[m] = (dT[m] - f0[m]) / (t_fd - t)
        if estimate:
            h_est = hinit(sys, ctl, z, f0, t, k, tab.order, stops[stops.shape[0] - 1] - t, U, r)
            nfev += 1
            h = h_est if not h > 0.0 else min(h, h_est)
            estimate = False
        fresh = False
    h_try, lands = step_to(t, h, stops[k + 1])
    t_new = stops[k + 1] if lands else t + h_try
    st = (h, h_try, h_next, log_prev, rejected, nonfinite, fresh, estimate)
    if not t_new > t:
        return AGAIN, NONFINITE if nonfinite else DT_UNDERFLOW, t_new, lands, st, nfev, njac, 0
    # singular only if 1/(h gamma) is an eigenvalue of J: a smaller step avoids it
    singular = not sys_factor(sys, 1.0 / (h_try * tab.gamma))
    en2 = np.inf
    finite = False
    if not singular:
        nfev += ros_step(sys, tab, K, z, znew, err, t, h_try, k, f0, dT, not sys_autonomous(sys),
                         U, r)
        en2 = err_norm2(ctl, err, z, znew)
        finite = all_finite(znew) and en2 == en2
    if not ctl.adaptive:
        if not finite:
            return AGAIN, NONFINITE, t_new, lands, st, nfev, njac, 1
        h_next = ctl.h0
    elif not (finite and en2 <= 1.0):
        nonfinite = not finite and not singular
        h = h_try * reject_factor(ctl, en2 if finite else np.inf)
        status = (NONFINITE if nonfinite else DT_UNDERFLOW) if h < hmin(t) else SUCCESS
        return (REJECTED, status, t_new, lands,
                (h, h_try, h_next, log_prev, True, nonfinite, fresh, estimate), nfev, njac, 1)
    else:
        h_next, log_prev = next_step(ctl, en2, log_prev, h_try, h, rejected, lands)
    return (ACCEPTED, SUCCESS, t_new, lands,
            (h, h_try, h_next, log_prev, rejected, nonfinite, fresh, estimate), nfev, njac, 1)


@jit(inline="always")
def _accept(sys, tab, z, work, st, t, t_new, k, want, d_k, j):
    K, znew, D1 = work[0], work[5], work[7]
    nfev = sys_accept(sys, tab, t, st[1], z, znew, K, k)
    D = d_k[j] if j >= 0 else D1
    if j >= 0 or want:
        ros_dense_rows(tab, D, znew, K)
    return D, 1, nfev, st


@jit(inline="always")
def _interp(tab, work, st, D, out, ts, t, t_new, z):
    ros_interp(out, (ts - t) / st[1], z, D, len(tab.H) // len(tab.c))


@jit(inline="always")
def _advance(tab, z, work, st, lands):
    znew = work[5]
    for m in range(z.shape[0]):
        z[m] = znew[m]


@stand_in(_advance)
def _advance_numpy(tab, z, work, st, lands):
    z[:] = work[5]


@jit(inline="always")
def _after(sys, tab, ctl, stops, z, work, st, t, k, nseg, lands, jumped):
    h, h_try, h_next, log_prev, rejected, nonfinite, fresh, estimate = st
    if lands and jumped and ctl.adaptive:
        estimate = True  # a dose: cap the next step by a fresh estimate
        log_prev = LOG_ERR0
    return (h_next, h_try, h_next, log_prev, False, False, True, estimate), 0


ros_integrate = family_loop(
    "ros_integrate",
    "Integrate ``sys`` from ``stops[0]`` to ``stops[-1]`` with a Rosenbrock method "
    "(`loop.integrate`): one Jacobian per accepted step and one factorisation per "
    "attempted step; stored steps hold ``1 + nh`` rows, then the stages where there is "
    "room (`ros_dense_rows`). Returns ``(status, t, rec)``.",
    _work, _begin, _attempt, _accept, _interp, _advance, _after)


@jit
def ros_store_at(rec, n_steps, out, tt, k, j, nh):
    """``out`` = the stored Rosenbrock solution at ``tt`` in segment ``k`` (``k < 0``: any),
    searching from step ``j``; returns the step used. ``nh``: the interpolant's rows."""
    j = find_step(rec, n_steps, tt, k, j)
    h = rec.d_t[j + 1] - rec.d_t[j]
    ros_interp(out, (tt - rec.d_t[j]) / h, rec.d_z[j], rec.d_k[j], nh)
    return j


@jit
def ros_store_eval(rec, n_steps, tq, out, nh):
    """Dense output at sorted times ``tq`` (q,) into ``out`` (q, nz), right-continuous
    (``nh``: the interpolant's rows of a stored step)."""
    j = 0
    for q in range(tq.shape[0]):
        tt = tq[q]
        if n_steps == 0 or tt >= rec.d_t[n_steps]:
            copy_row(out, q, rec.d_z[n_steps])
            continue
        j = ros_store_at(rec, n_steps, out[q], tt, -1, j, nh)


def _stored_state(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
    return ros_store_at(rec, n_steps, out, t, k, j, len(ftab.H) // len(ftab.c))


def _store_rows(tab):
    # the end state, the interpolant's rows and the stages (`ros_dense_rows`): the
    # discrete adjoint's reverse pass reads the stages instead of computing them again
    return 1 + len(tab.H) // len(tab.c) + len(tab.c)


def _step_interp(tab, out, theta, h, z, znew, K, w):
    # the step's rows D (end state, then K_j = sum_i H[j, i] K_i), then the interpolant
    s = len(tab.c)
    nh = len(tab.H) // s
    th1 = 1.0 - theta
    for m in range(out.shape[0]):
        acc = 0.0
        for jh in range(nh - 1, -1, -1):
            row = 0.0
            for i in range(s):
                row += tab.H[jh * s + i] * K[i, m]
            acc = row + theta * acc if jh < nh - 1 else row
        out[m] = th1 * z[m] + theta * (znew[m] + th1 * acc)


@stand_in(_step_interp)
def _step_interp_numpy(tab, out, theta, h, z, znew, K, w):
    # the interpreter's (`sciml._interpret`): the rows as one matrix product, ~5x quicker
    # than the loops interpreted at 9 states (the adjoints call it at every stage)
    s = len(tab.c)
    n = out.shape[0]
    _interp_numpy(out, theta, z, znew, tab.H.reshape(len(tab.H) // s, s) @ K[:s, :n])


FAMILY = Family(ros_integrate, _stored_state, _store_rows, _step_interp)
