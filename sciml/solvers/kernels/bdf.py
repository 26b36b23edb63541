"""The variable-order BDF loop: numerical differentiation formulas of orders 1 to 5.

The method is the quasi-constant-step NDF family of Shampine & Reichelt ("The
MATLAB ODE Suite", SIAM J. Sci. Comput. 18, 1997), in backward differences:
the history is the array ``D`` of differences ``D[0] = y_n, D[j] = nabla^j
y_n`` (scaled to the current step), so a step-size change by a factor ``r``
is a small linear map of ``D`` (`rescale`) and an order change costs nothing.

A step of order k from t with step h:

- predictor ``y0 = sum_{j<=k} D[j]``, and ``psi = sum_{1<=j<=k} gamma_j D[j] /
  alpha_k``;
- corrector: simplified Newton on ``d = y - y0`` solving
  ``M (d + psi) / c - f(t + h, y0 + d) = 0`` with ``c = h / alpha_k``, on
  ``W = M / c' - J``, J and the factorisation kept across steps (as CVODE
  keeps them): J is refreshed only when Newton fails to converge with an old
  one; W is refactored when Newton fails with it, or when c has moved more
  than ``LU_RATIO`` from the ``c'`` it was factored with. With ``rho = c / c'``
  the solve gives the exact correction for the stiff modes (J dominating) and
  ``1 / rho`` of it for the others (M / c' dominating); every correction is
  scaled by ``2 rho / (1 + rho)``, between the two (CVODE's scaling, in
  SUNDIALS' ``cvLsSolve``, in this form of the equations; A. C. Hindmarsh et
  al., "SUNDIALS", ACM TOMS 31, 2005, Section 2.1). Convergence is judged by
  the contraction rate, which is remembered from the steps before (decaying
  by ``RATE_DOWN`` an iteration; 1 after a new factorisation), so a step may
  converge in one iteration; the tolerance is Hairer's (``sqrt(rtol)`` of the
  error weights, RADAU5), and an iteration that stops contracting short of it
  is accepted where CVODE's looser test would accept it (``error_k min(1,
  rate) |correction| <= 0.1``): at tight tolerances the sensitivity columns of
  an augmented system stall at a rounding floor above Hairer's;
- local error ``err = error_k * d``, weighted RMS norm as every loop's, with
  the weights ``1 / (atol_i + rtol |y_i|)`` computed once for the Newton
  iteration (at the predictor) and once for the error test (at the result);
- on acceptance the differences are updated from ``d``; after k + 1 steps of
  the same size the order may move by one where the error estimates at
  orders k - 1 and k + 1 allow a larger step; the safety factor on every new step
  falls with the Newton iterations the last one took (as in Hairer's RADAU5).

``alpha_k = (1 - kappa_k) gamma_k``, ``gamma_k = sum_{j<=k} 1/j``, ``error_k =
kappa_k gamma_k + 1 / (k + 1)``; ``kappa = (0, -0.185, -1/9, -0.0823,
-0.0415)`` gives the NDFs (kappa = 0 the classical BDFs).

The loop lands on stops like the other families (the landing step's
right-hand side at the stop's left limit) and restarts at order 1 after
each. Dense output is the Newton backward-difference interpolant of the
step's differences: ``y(t_n + s h) = D[0] + sum_j D[j] prod_{m<j} (s + m) /
(m + 1)`` (s in [-1, 0]); a stored step keeps ``D[0..k]`` and its order.
"""

import math

import numpy as np

from sciml._jit import borrow, jit, keep_alive

from .control import (
    DT_UNDERFLOW,
    MAX_STEPS,
    NEED_STORAGE,
    NONFINITE,
    SUCCESS,
    all_finite,
    hinit,
    hmin,
)
from .erk import find_step
from .record import copy_row, record_at, record_counts, saves_inside, storage_full
from .system import sys_event, sys_f, sys_factor, sys_jac, sys_mass, sys_solve

MAX_ORDER = 5
NEWTON_MAXITER = 4
MIN_FACTOR = 0.2
MAX_FACTOR = 10.0
# The factorisation of W = M/c - J is kept while c stays within this ratio of the c it was
# made with (CVODE's DGMAX); the Newton corrections are then scaled (see the module text).
LU_RATIO = 0.3
# The Newton contraction rate remembered from one step to the next decays by this factor
# per iteration (CVODE's CRDOWN).
RATE_DOWN = 0.3
# A Newton iteration that stops contracting short of its tolerance is still accepted
# where CVODE's test would accept it: ``error_k min(1, rate) |correction| <= NLS_COEF``
# (CVODE's nlscoef; weighted norm), a tenth of what the error test allows.
NLS_COEF = 0.1
_BLOCK = 64  # states per block of `rescale`
_EPS = 2.220446049250313e-16


@jit(inline="always")
def _weights(ctl, wt, y):
    """``wt[i] = 1 / (atol_i + rtol |y_i|)``, the error-controlled part ``[:n_err]``."""
    atol = ctl.atol
    for i in range(atol.shape[0]):
        wt[i] = 1.0 / (atol[i] + ctl.rtol * abs(y[i]))


@jit(inline="always")
def _wnorm(wt, v, a):
    """Weighted RMS norm of ``a v[:n_err]`` with the weights of `_weights`."""
    n = wt.shape[0]
    acc = 0.0
    for i in range(n):
        r = v[i] * wt[i]
        acc += r * r
    return abs(a) * math.sqrt(acc / max(n, 1))


@jit(inline="always")
def _ru(R, U, order, factor):
    """``R = M(factor) M(1)`` for the difference array's rescaling, ``(order + 1)`` square:
    ``M(r)[i, j] = prod_{m=1..i} (m - 1 - r j) / m`` (rows i, columns j)."""
    for j in range(order + 1):
        R[0, j] = 1.0
        U[0, j] = 1.0
        for i in range(1, order + 1):
            R[i, j] = R[i - 1, j] * (i - 1 - factor * j) / i
            U[i, j] = U[i - 1, j] * (i - 1 - 1.0 * j) / i


@jit(inline="always")
def rescale(D, order, factor, R, U, T, B):
    """``D[:order + 1]`` rescaled to a step ``factor`` times the current one: ``D <-
    (R U)^T D`` (R from `_ru`); R, U, T (6, 6) and B (6, `_BLOCK`) scratch. The states go
    in blocks: a block's old rows copied to B, its new rows written back with unit
    stride."""
    _ru(R, U, order, factor)
    k1 = order + 1
    for i in range(k1):
        for j in range(k1):
            acc = 0.0
            for m in range(k1):
                acc += R[i, m] * U[m, j]
            T[i, j] = acc
    nz = D.shape[1]
    for m0 in range(0, nz, _BLOCK):
        nb = min(_BLOCK, nz - m0)
        for i in range(k1):
            for m in range(nb):
                B[i, m] = D[i, m0 + m]
        for j in range(k1):
            for m in range(nb):
                D[j, m0 + m] = 0.0
            for i in range(k1):
                tij = T[i, j]
                for m in range(nb):
                    D[j, m0 + m] += tij * B[i, m]


@jit(inline="always")
def bdf_interp(out, s, D, order):
    """The backward-difference interpolant at ``s = (t - t_n) / h`` (s in [-1, 0])."""
    for m in range(out.shape[0]):
        out[m] = D[0, m]
    w = 1.0
    for j in range(1, order + 1):
        w *= (s + (j - 1)) / j
        for m in range(out.shape[0]):
            out[m] += w * D[j, m]


@jit(inline="always")
def _restart(D, z, f, h):
    """Order 1 from state ``z`` with ``f`` its rate: ``D[0] = z, D[1] = h f``."""
    for m in range(z.shape[0]):
        D[0, m] = z[m]
        D[1, m] = h * f[m]
    for j in range(2, D.shape[0]):
        for m in range(z.shape[0]):
            D[j, m] = 0.0


@jit
def bdf_integrate(sys, tab, ctl, stops, z, rec):
    """Integrate ``sys`` from ``stops[0]`` to ``stops[-1]`` with the variable-order NDF/BDF.

    As `erk.erk_integrate` (stops, events, record, status); the steps before a stop are
    shortened to land on it (the last one, or the last two equally), the right-hand side
    of the step that lands taken one ulp before the stop (a switch in time at the stop,
    ``t >= t_stop`` in the model, acts after it), and the integration restarts at order 1
    after every stop inside the span (a dose, an infusion's start or end, a switch, an
    adjoint's jump: the history no longer describes the solution), the step size the stop
    cut short resumed where the starting step estimate allows.
    ``tab`` (`structs.BDFTableau`) holds kappa and the order bound. Stored steps hold
    ``D[0..order]`` (rows ``MAX_ORDER + 1``) with the order in ``d_have``.

    Returns
    -------
    (status, t)
    """
    sys, tab, ctl, stops, z, rec = borrow((sys, tab, ctl, stops, z, rec))  # see sciml._jit
    nz = z.shape[0]
    n_err = ctl.atol.shape[0]
    max_order = tab.max_order
    own = np.zeros((MAX_ORDER + 3 + 6, nz))
    buf = borrow(own)
    D = buf[:MAX_ORDER + 3]
    ypred, psi, d, y, f = (buf[MAX_ORDER + 3], buf[MAX_ORDER + 4], buf[MAX_ORDER + 5],
                           buf[MAX_ORDER + 6], buf[MAX_ORDER + 7])
    wt = buf[MAX_ORDER + 8, :n_err]  # the error weights of the step (`_weights`)
    ownm = np.zeros(3 * 6 * 6 + (MAX_ORDER + 1) * _BLOCK)
    mats = borrow(ownm)
    R, U, T = (mats[:36].reshape((6, 6)), mats[36:72].reshape((6, 6)),
               mats[72:108].reshape((6, 6)))
    B = mats[108:].reshape((MAX_ORDER + 1, _BLOCK))
    gamma = np.zeros(MAX_ORDER + 2)
    alpha = np.zeros(MAX_ORDER + 2)
    errc = np.zeros(MAX_ORDER + 2)
    for k_ in range(1, MAX_ORDER + 2):
        gamma[k_] = gamma[k_ - 1] + 1.0 / k_
    for k_ in range(MAX_ORDER + 2):
        kap = tab.kappa[k_] if k_ < tab.kappa.shape[0] else 0.0
        alpha[k_] = (1.0 - kap) * gamma[k_]
        errc[k_] = kap * gamma[k_] + 1.0 / (k_ + 1)
    save_t, save_z = rec.save_t, rec.save_z
    d_k, d_have, d_seg = rec.d_k, rec.d_have, rec.d_seg
    dense = rec.dense
    nseg = stops.shape[0] - 1
    tf = stops[nseg]
    t = stops[0]
    sys_event(sys, z, 0)
    sp, nsave = record_at(rec, t, z, 0, 0, 0)
    nfev = njac = nlu = nacc = nrej = 0
    status = SUCCESS
    mass = sys_mass(sys)  # M dz/dt = f: the history terms are M's
    unit = mass.shape[0] == 0
    newton_tol = max(10.0 * _EPS / ctl.rtol, min(0.03, math.sqrt(ctl.rtol)))
    # the first step: Hairer's estimate for order 1, or the given h0
    sys_f(sys, f, z, t, 0)
    nfev += 1
    k = 0
    if not all_finite(f):
        status = NONFINITE
        nseg = 0
    h = ctl.h0
    if not h > 0.0:
        h = hinit(sys, ctl, z, f, t, 0, 1, tf - t, y, psi)
        nfev += 1
    order = 1
    _restart(D, z, f, h)
    h_want = 0.0  # the step a stop cut short: the restart after it may take up to that
    n_equal = 0
    jac_current = False  # J evaluated at this step's start
    need_jac = True
    c_lu = 0.0  # the c of the factorisation (0: none valid)
    lu_fresh = False  # factored for this very attempt (a failure cannot be the LU's)
    rate = 1.0  # Newton's contraction rate, remembered across steps (1: unknown)
    c = 0.0
    while k < nseg:
        if nacc + nrej >= ctl.max_steps:
            status = MAX_STEPS
            break
        if storage_full(rec, nsave, nacc):
            status = NEED_STORAGE
            break
        t_stop = stops[k + 1]
        # Land on the stop: the last step cut to it, or, within two steps of it, two equal
        # steps (no sliver, so the history is never rescaled by a huge factor afterwards)
        if t + 2.0 * h > t_stop and t + h != t_stop:
            hn = t_stop - t if t + 1.01 * h >= t_stop else 0.5 * (t_stop - t)
            rescale(D, order, hn / h, R, U, T, B)
            h_want = max(h_want, h)
            h = hn
            n_equal = 0
        t_new = t + h
        lands = t_new >= t_stop
        t_f = t_new  # where f is taken: on landing inside the span, the stop's left limit
        if lands:
            t_new = t_stop
            if k + 1 < nseg:
                t_f = np.nextafter(t_stop, -np.inf)
        if not t_new > t or h < hmin(t):
            status = DT_UNDERFLOW
            break
        if need_jac:
            sys_jac(sys, z, t, k)
            njac += 1
            need_jac = False
            jac_current = True
            c_lu = 0.0
        c = h / alpha[order]
        lu_fresh = False
        if not (c_lu > 0.0 and abs(c / c_lu - 1.0) <= LU_RATIO):
            nlu += 1
            if not sys_factor(sys, 1.0 / c):
                # singular: a smaller step moves 1/c away from J's spectrum
                rescale(D, order, 0.5, R, U, T, B)
                h *= 0.5
                n_equal = 0
                nrej += 1
                c_lu = 0.0
                continue
            c_lu = c
            lu_fresh = True
            rate = 1.0
        # W = M/c_lu - J: the exact Newton matrix M/c - J for stiff modes, off by c/c_lu
        # for the others; the corrections are scaled by 2 rho / (1 + rho), rho = c / c_lu,
        # between the two (CVODE's scaling, in this form of the equations)
        rho = c / c_lu
        scale = 2.0 * rho / (1.0 + rho)
        ic = 1.0 / c
        # ---- predictor
        for m in range(nz):
            ypred[m] = D[0, m]
            psi[m] = 0.0
        for j in range(1, order + 1):
            gj = gamma[j] / alpha[order]
            for m in range(nz):
                ypred[m] += D[j, m]
                psi[m] += gj * D[j, m]
        for m in range(nz):
            d[m] = 0.0
            y[m] = ypred[m]
        _weights(ctl, wt, ypred)
        # ---- corrector: simplified Newton, convergence judged by its contraction rate
        # (the first iteration by the rate remembered from the steps before)
        converged = False
        old_norm = -1.0
        n_iter = NEWTON_MAXITER
        for it in range(NEWTON_MAXITER):
            sys_f(sys, f, y, t_f, k)
            nfev += 1
            if not all_finite(f):  # every component, the error-free ones included
                break
            if unit:
                for m in range(nz):
                    f[m] -= (psi[m] + d[m]) * ic  # W dy = f - M (psi + d) / c
            else:
                for m in range(nz):
                    f[m] -= (psi[m] + d[m]) * ic * mass[m]
            sys_solve(sys, f)
            dn = _wnorm(wt, f, scale)
            settled = False
            if old_norm > 0.0:
                r_it = dn / old_norm
                rate = max(RATE_DOWN * rate, r_it)
                if r_it >= 1.0 or r_it ** (NEWTON_MAXITER - it) / (1.0 - r_it) * dn \
                        > newton_tol:
                    # Not contracting to newton_tol; accepted all the same where the
                    # correction is below CVODE's bound. At tight rtol newton_tol (sqrt(rtol)
                    # of the tolerance) can lie under the rounding floor of components the
                    # weights magnify: a forward sensitivity near zero beside entries of
                    # 1e5 in its column, under an absolute tolerance sized for the states,
                    # moves by rounding alone more than that. No further iteration or
                    # fresh Jacobian gets below the floor: failing the step here only
                    # halved it, again and again (issue 27).
                    if errc[order] * min(1.0, rate) * dn > NLS_COEF:
                        break
                    settled = True
            for m in range(nz):
                y[m] += scale * f[m]
                d[m] += scale * f[m]
            if settled or dn == 0.0 or (rate < 1.0 and rate / (1.0 - rate) * dn < newton_tol):
                converged = True
                n_iter = it + 1
                break
            old_norm = dn
        if not converged:
            if not (jac_current and lu_fresh):
                # a Jacobian from an earlier step, or a factorisation for another c: the
                # same step again with the Jacobian afresh (if old) and a new factorisation
                need_jac = not jac_current
                c_lu = 0.0
                continue
            rescale(D, order, 0.5, R, U, T, B)
            h *= 0.5
            n_equal = 0
            nrej += 1
            continue
        # ---- error test (the scale of the new values)
        _weights(ctl, wt, y)
        en = _wnorm(wt, d, errc[order])
        # a step whose Newton iteration needed more work is grown less (Hairer's RADAU5)
        safety = 0.9 * (2 * NEWTON_MAXITER + 1) / (2 * NEWTON_MAXITER + n_iter)
        if not (en <= 1.0):
            nrej += 1
            fac = max(MIN_FACTOR, safety * en ** (-1.0 / (order + 1))) if en == en \
                else MIN_FACTOR
            rescale(D, order, fac, R, U, T, B)
            h *= fac
            n_equal = 0
            continue
        # ---- accepted
        nacc += 1
        jac_current = False
        n_equal += 1
        for m in range(nz):
            D[order + 2, m] = d[m] - D[order + 1, m]
            D[order + 1, m] = d[m]
        for j in range(order, -1, -1):
            for m in range(nz):
                D[j, m] += D[j + 1, m]
        if dense or saves_inside(rec, sp, t_new):
            if dense:
                row = d_k[nacc - 1]
                for j in range(order + 1):
                    for m in range(nz):
                        row[j, m] = D[j, m]
                d_have[nacc - 1] = order
                d_seg[nacc - 1] = k
            while saves_inside(rec, sp, t_new):
                bdf_interp(save_z[sp], (save_t[sp] - t_new) / h, D, order)
                sp += 1
        t = t_new
        for m in range(nz):
            z[m] = D[0, m]
        if lands:
            k += 1
            sys_event(sys, z, k)
            if k < nseg:
                # a dose, an adjoint's jump, an infusion's start or end, a switch: the
                # history no longer describes the solution; order 1 afresh
                order = 1
                sys_f(sys, f, z, t, k)
                nfev += 1
                if ctl.h0 > 0.0:
                    h = ctl.h0
                else:
                    h = min(hinit(sys, ctl, z, f, t, k, 1, tf - t, y, psi), max(h, h_want))
                    nfev += 1
                _restart(D, z, f, h)
                n_equal = 0
                need_jac = True
            h_want = 0.0
        # ---- the next step's size and order (after order + 1 steps of one size), the
        # error estimates in the new values' scale (wt)
        if k < nseg and n_equal >= order + 1:
            en_m = np.inf
            en_p = np.inf
            if order > 1:
                en_m = _wnorm(wt, D[order], errc[order - 1])
            if order < max_order:
                en_p = _wnorm(wt, D[order + 2], errc[order + 1])
            best = en ** (-1.0 / (order + 1)) if en > 0.0 else MAX_FACTOR
            delta = 0
            fm = en_m ** (-1.0 / order) if en_m > 0.0 else MAX_FACTOR
            fp = en_p ** (-1.0 / (order + 2)) if en_p > 0.0 else MAX_FACTOR
            if order > 1 and fm > best:
                best = fm
                delta = -1
            if order < max_order and fp > best:
                best = fp
                delta = 1
            order += delta
            fac = min(MAX_FACTOR, safety * best)
            rescale(D, order, fac, R, U, T, B)
            h *= fac
            n_equal = 0
        sp, nsave = record_at(rec, t, z, sp, nsave, nacc)
    keep_alive(own)
    keep_alive(ownm)
    record_counts(rec, nfev, nacc, nrej, sp, nsave, njac, nlu)
    return status, t


@jit
def bdf_store_at(rec, n_steps, out, tt, k, j):
    """``out`` = the stored BDF solution at ``tt`` in segment ``k`` (``k < 0``: any),
    searching from step ``j``; returns the step used."""
    j = find_step(rec, n_steps, tt, k, j)
    h = rec.d_t[j + 1] - rec.d_t[j]
    bdf_interp(out, (tt - rec.d_t[j + 1]) / h, rec.d_k[j], rec.d_have[j])
    return j


@jit
def bdf_store_eval(rec, n_steps, tq, out):
    """Dense output at sorted times ``tq`` (q,) into ``out`` (q, nz), right-continuous."""
    j = 0
    for q in range(tq.shape[0]):
        tt = tq[q]
        if n_steps == 0 or tt >= rec.d_t[n_steps]:
            copy_row(out, q, rec.d_z[n_steps])
            continue
        j = bdf_store_at(rec, n_steps, out[q], tt, -1, j)
