"""The Rosenbrock step and the one loop every stiff integration runs.

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

from sciml._jit import borrow, jit, keep_alive

from .control import (
    DT_UNDERFLOW,
    LOG_ERR0,
    MAX_STEPS,
    NEED_STORAGE,
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
from .record import copy_row, record_at, record_counts, saves_inside, storage_full
from .system import (
    sys_accept,
    sys_autonomous,
    sys_event,
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


@jit(inline="always")
def ros_dense_rows(tab, D, znew, K):
    """A step's stored rows: ``D[0] = znew``, ``D[1 + j] = sum_i H[j, i] K_i``."""
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


@jit(inline="always")
def ros_interp(out, theta, z0, D):
    """The interpolant at ``theta`` from the step's start ``z0`` and stored rows ``D``."""
    nd = D.shape[0]
    th1 = 1.0 - theta
    for m in range(out.shape[0]):
        acc = D[nd - 1, m]
        for j in range(nd - 2, 0, -1):
            acc = D[j, m] + theta * acc
        out[m] = th1 * z0[m] + theta * (D[0, m] + th1 * acc)


@jit
def ros_integrate(sys, tab, ctl, stops, z, rec):
    """Integrate ``sys`` from ``stops[0]`` to ``stops[-1]`` with a Rosenbrock method.

    As `erk.erk_integrate` (stops, events, record, status); one Jacobian per
    accepted step and one factorisation per attempted step. Stored steps hold
    ``1 + nh`` rows (see `ros_dense_rows`).

    Returns
    -------
    (status, t)
    """
    sys, tab, ctl, stops, z, rec = borrow((sys, tab, ctl, stops, z, rec))  # see sciml._jit
    nz = z.shape[0]
    s = len(tab.c)
    nh = len(tab.H) // s
    own = np.zeros((s + 7 + nh, nz))
    buf = borrow(own)
    K = buf[:s]
    f0, dT, U, r, znew, err = buf[s], buf[s + 1], buf[s + 2], buf[s + 3], buf[s + 4], buf[s + 5]
    D1 = buf[s + 6:s + 7 + nh]  # a step's rows when they are not stored
    save_t, save_z = rec.save_t, rec.save_z
    d_k, d_have, d_seg = rec.d_k, rec.d_have, rec.d_seg
    dense = rec.dense
    nonauto = not sys_autonomous(sys)
    nseg = stops.shape[0] - 1
    tf = stops[nseg]
    t = stops[0]
    sys_event(sys, z, 0)
    sp, nsave = record_at(rec, t, z, 0, 0, 0)
    nfev = njac = nlu = nacc = nrej = 0
    status = SUCCESS
    h = ctl.h0
    estimate = ctl.adaptive and not h > 0.0
    log_prev = LOG_ERR0
    fresh = True  # J, f, df/dt to be evaluated at (t, z)
    rejected = False
    nonfinite = False
    k = 0
    while k < nseg:
        if nacc + nrej >= ctl.max_steps:
            status = MAX_STEPS
            break
        if storage_full(rec, nsave, nacc):
            status = NEED_STORAGE
            break
        if fresh:
            # Once per accepted state; every retry of the step reuses them.
            sys_f(sys, f0, z, t, k)
            nfev += 1
            if not all_finite(f0):
                status = NONFINITE
                break
            sys_jac(sys, z, t, k)
            njac += 1
            if nonauto:
                # Forward: at a stop it looks into the segment the step will cover.
                t_fd = t + math.sqrt(_EPS) * max(1.0, abs(t))
                sys_f(sys, dT, z, t_fd, k)
                nfev += 1
                for m in range(nz):
                    dT[m] = (dT[m] - f0[m]) / (t_fd - t)
            if estimate:
                h_est = hinit(sys, ctl, z, f0, t, k, tab.order, tf - t, U, r)
                nfev += 1
                h = h_est if not h > 0.0 else min(h, h_est)
                estimate = False
            fresh = False
        h_try, lands = step_to(t, h, stops[k + 1])
        t_new = stops[k + 1] if lands else t + h_try
        if not t_new > t:
            status = NONFINITE if nonfinite else DT_UNDERFLOW
            break
        nlu += 1
        # singular only if 1/(h gamma) is an eigenvalue of J: a smaller step avoids it
        singular = not sys_factor(sys, 1.0 / (h_try * tab.gamma))
        en2 = np.inf
        finite = False
        if not singular:
            nfev += ros_step(sys, tab, K, z, znew, err, t, h_try, k, f0, dT, nonauto, U, r)
            en2 = err_norm2(ctl, err, z, znew)
            finite = all_finite(znew) and en2 == en2
        if not ctl.adaptive:
            if not finite:
                status = NONFINITE
                break
            h_next = ctl.h0
        elif not (finite and en2 <= 1.0):
            nrej += 1
            rejected = True
            nonfinite = not finite and not singular
            h = h_try * reject_factor(ctl, en2 if finite else np.inf)
            if h < hmin(t):
                status = NONFINITE if nonfinite else DT_UNDERFLOW
                break
            continue
        else:
            h_next, log_prev = next_step(ctl, en2, log_prev, h_try, h, rejected, lands)
        nacc += 1
        nfev += sys_accept(sys, tab, t, h_try, z, znew, K, k)
        # ---- accepted: the step's rows, then output inside it
        if dense or saves_inside(rec, sp, t_new):
            D = d_k[nacc - 1] if dense else D1
            ros_dense_rows(tab, D, znew, K)
            if dense:
                d_have[nacc - 1] = 1
                d_seg[nacc - 1] = k
            while saves_inside(rec, sp, t_new):
                ros_interp(save_z[sp], (save_t[sp] - t) / h_try, z, D)
                sp += 1
        t = t_new
        for m in range(nz):
            z[m] = znew[m]
        if lands:
            k += 1
            if sys_event(sys, z, k) and ctl.adaptive:
                estimate = True  # a dose: cap the next step by a fresh estimate
                log_prev = LOG_ERR0
        h = h_next
        rejected = False
        nonfinite = False
        fresh = True
        sp, nsave = record_at(rec, t, z, sp, nsave, nacc)
    keep_alive(own)
    record_counts(rec, nfev, nacc, nrej, sp, nsave, njac, nlu)
    return status, t


@jit
def ros_store_at(rec, n_steps, out, tt, k, j):
    """``out`` = the stored Rosenbrock solution at ``tt`` in segment ``k`` (``k < 0``: any),
    searching from step ``j``; returns the step used."""
    j = find_step(rec, n_steps, tt, k, j)
    h = rec.d_t[j + 1] - rec.d_t[j]
    ros_interp(out, (tt - rec.d_t[j]) / h, rec.d_z[j], rec.d_k[j])
    return j


@jit
def ros_store_eval(rec, n_steps, tq, out):
    """Dense output at sorted times ``tq`` (q,) into ``out`` (q, nz), right-continuous."""
    j = 0
    for q in range(tq.shape[0]):
        tt = tq[q]
        if n_steps == 0 or tt >= rec.d_t[n_steps]:
            copy_row(out, q, rec.d_z[n_steps])
            continue
        j = ros_store_at(rec, n_steps, out[q], tt, -1, j)
