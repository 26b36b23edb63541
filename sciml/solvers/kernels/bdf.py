"""The variable-order BDF step (numerical differentiation formulas of orders 1 to 5), and
`bdf_integrate`: the integration loop with it.

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

The steps before a stop are shortened to land on it (the last one, or the
last two equally: no sliver), the right-hand side of the step that lands
taken one ulp before the stop (a switch in time at the stop, ``t >= t_stop``
in the model, acts after it); after every stop inside the span (a dose, an
infusion's start or end, a switch, an adjoint's jump: the history no longer
describes the solution) the integration restarts at order 1, resuming the
step size the stop cut short where the starting step estimate allows. Dense
output is the Newton backward-difference interpolant of the step's
differences: ``y(t_n + s h) = D[0] + sum_j D[j] prod_{m<j} (s + m) / (m + 1)``
(s in [-1, 0]); a stored step keeps ``D[0..k]`` and its order.
"""

import math

import numpy as np

from sciml._jit import borrow, jit

from .control import (
    DT_UNDERFLOW,
    NONFINITE,
    SUCCESS,
    all_finite,
    hinit,
    hmin,
)
from .erk import find_step
from .loop import ACCEPTED, AGAIN, REJECTED, Family, family_loop
from .record import copy_row
from .system import sys_f, sys_factor, sys_jac, sys_mass, sys_solve

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
        # the block's rows as views from 0: D[j, m0 + m] in the loops would keep numba's
        # wraparound of a negative index in them, which LLVM does not vectorise
        for i in range(k1):
            src, old = D[i, m0:m0 + nb], B[i]
            for m in range(nb):
                old[m] = src[m]
        for j in range(k1):
            new = D[j, m0:m0 + nb]
            for m in range(nb):
                new[m] = 0.0
            for i in range(k1):
                tij = T[i, j]
                old = B[i]
                for m in range(nb):
                    new[m] += tij * old[m]


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


# The scratch, one allocation: ``rows`` (state-sized: the differences D, then ypred, psi,
# d, y, f and the error weights) and ``mats`` (R, U, T, B of `rescale`, then gamma, alpha
# and error_k). `_work` hands the step's functions ``rows`` and the four `rescale`
# matrices as borrowed 2-D views (see `sciml._jit` on reshapes), the rest as ``mats``.
YPRED, PSI, DCOR, Y, F, WT = range(MAX_ORDER + 3, MAX_ORDER + 9)
_G0 = 108 + (MAX_ORDER + 1) * _BLOCK
_A0 = _G0 + MAX_ORDER + 2
_E0 = _A0 + MAX_ORDER + 2


@jit(inline="always")
def _work(sys, tab, ctl, z):
    nz = z.shape[0]
    own = np.zeros((WT + 1) * nz + _E0 + MAX_ORDER + 2)
    buf = borrow(own)
    # a reshape's result is opaque to LLVM (made through a call): borrowed again, so that
    # its reference counts fold away
    rows = borrow(buf[:(WT + 1) * nz].reshape((WT + 1, nz)))
    mats = buf[(WT + 1) * nz:]
    rutb = (borrow(mats[:36].reshape((6, 6))), borrow(mats[36:72].reshape((6, 6))),
            borrow(mats[72:108].reshape((6, 6))),
            borrow(mats[108:_G0].reshape((MAX_ORDER + 1, _BLOCK))))
    for k_ in range(1, MAX_ORDER + 2):
        mats[_G0 + k_] = mats[_G0 + k_ - 1] + 1.0 / k_
    for k_ in range(MAX_ORDER + 2):
        kap = tab.kappa[k_] if k_ < tab.kappa.shape[0] else 0.0
        mats[_A0 + k_] = (1.0 - kap) * mats[_G0 + k_]
        mats[_E0 + k_] = kap * mats[_G0 + k_] + 1.0 / (k_ + 1)
    newton_tol = max(10.0 * _EPS / ctl.rtol, min(0.03, math.sqrt(ctl.rtol)))
    return own, (rows, mats, newton_tol, sys_mass(sys).shape[0] == 0, rutb)


@jit(inline="always")
def _rescale(work, order, factor):
    """`rescale` of the differences in ``work``'s rows with its scratch."""
    R, U, T, B = work[4]
    rescale(work[0][:MAX_ORDER + 3], order, factor, R, U, T, B)


# The state carried between steps: (h, order, the step a stop cut short (the restart
# after it may take up to that), steps of this size and order, J evaluated at this step's
# start, J to be evaluated, the c of the factorisation (0: none valid), factored for this
# very try (a failure cannot be the LU's), Newton's contraction rate remembered across
# steps (1: unknown), the accepted step's error, its safety factor).


@jit(inline="always")
def _begin(sys, tab, ctl, stops, z, work, t):
    rows = work[0]
    f = rows[F]
    # the first step: Hairer's estimate for order 1, or the given h0
    sys_f(sys, f, z, t, 0)
    nfev = 1
    status = SUCCESS if all_finite(f) else NONFINITE
    h = ctl.h0
    if not h > 0.0:
        h = hinit(sys, ctl, z, f, t, 0, 1, stops[stops.shape[0] - 1] - t, rows[Y], rows[PSI])
        nfev += 1
    _restart(rows[:MAX_ORDER + 3], z, f, h)
    return (h, 1, 0.0, 0, False, True, 0.0, False, 1.0, 0.0, 0.0), status, nfev


@jit(inline="always")
def _attempt(sys, tab, ctl, stops, z, work, st, t, k):
    rows, mats = work[0], work[1]
    h, order, h_want, n_equal, jac_current, need_jac, c_lu, lu_fresh, rate, en, safety = st
    nfev = njac = nlu = 0
    t_stop = stops[k + 1]
    # Land on the stop: the last step cut to it, or, within two steps of it, two equal
    # steps (no sliver, so the history is never rescaled by a huge factor afterwards)
    if t + 2.0 * h > t_stop and t + h != t_stop:
        hn = t_stop - t if t + 1.01 * h >= t_stop else 0.5 * (t_stop - t)
        _rescale(work, order, hn / h)
        h_want = max(h_want, h)
        h = hn
        n_equal = 0
    t_new = t + h
    lands = t_new >= t_stop
    t_f = t_new  # where f is taken: on landing inside the span, the stop's left limit
    if lands:
        t_new = t_stop
        if k + 1 < stops.shape[0] - 1:
            t_f = np.nextafter(t_stop, -np.inf)
    if not t_new > t or h < hmin(t):
        return (AGAIN, DT_UNDERFLOW, t_new, lands,
                (h, order, h_want, n_equal, jac_current, need_jac, c_lu, lu_fresh, rate, en,
                 safety), nfev, njac, nlu)
    if need_jac:
        sys_jac(sys, z, t, k)
        njac += 1
        need_jac = False
        jac_current = True
        c_lu = 0.0
    c = h / mats[_A0 + order]
    lu_fresh = False
    fac = 0.0  # on rejection: the factor of the step to try next (one rescale of D for all)
    if not (c_lu > 0.0 and abs(c / c_lu - 1.0) <= LU_RATIO):
        nlu += 1
        if sys_factor(sys, 1.0 / c):
            c_lu = c
            lu_fresh = True
            rate = 1.0
        else:
            # singular: a smaller step moves 1/c away from J's spectrum
            fac = 0.5
            c_lu = 0.0
    if fac == 0.0:  # predictor, corrector and error test
        newton_tol, unit = work[2], work[3]
        ypred, psi, d, y, f, wt = (rows[YPRED], rows[PSI], rows[DCOR], rows[Y], rows[F],
                                   rows[WT, :ctl.atol.shape[0]])
        nz = z.shape[0]
        # W = M/c_lu - J: the exact Newton matrix M/c - J for stiff modes, off by c/c_lu
        # for the others; the corrections are scaled by 2 rho / (1 + rho), rho = c / c_lu,
        # between the two (CVODE's scaling, in this form of the equations)
        rho = c / c_lu
        scale = 2.0 * rho / (1.0 + rho)
        ic = 1.0 / c
        # ---- predictor
        for m in range(nz):
            ypred[m] = rows[0, m]
            psi[m] = 0.0
        for j in range(1, order + 1):
            gj = mats[_G0 + j] / mats[_A0 + order]
            for m in range(nz):
                ypred[m] += rows[j, m]
                psi[m] += gj * rows[j, m]
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
                mass = sys_mass(sys)  # M dz/dt = f: the history terms are M's
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
                    if mats[_E0 + order] * min(1.0, rate) * dn > NLS_COEF:
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
            fac = -1.0
        else:
            # ---- error test (the scale of the new values)
            _weights(ctl, wt, y)
            en = _wnorm(wt, d, mats[_E0 + order])
            # a step whose Newton iteration needed more work is grown less (Hairer's RADAU5)
            safety = 0.9 * (2 * NEWTON_MAXITER + 1) / (2 * NEWTON_MAXITER + n_iter)
            if not (en <= 1.0):
                fac = max(MIN_FACTOR, safety * en ** (-1.0 / (order + 1))) if en == en \
                    else MIN_FACTOR
    if fac < 0.0:  # Newton failed
        if not (jac_current and lu_fresh):
            # a Jacobian from an earlier step, or a factorisation for another c: the same
            # step again with the Jacobian afresh (if old) and a new factorisation
            return (AGAIN, SUCCESS, t_new, lands,
                    (h, order, h_want, n_equal, jac_current, not jac_current, 0.0, lu_fresh,
                     rate, en, safety), nfev, njac, nlu)
        fac = 0.5
    if fac > 0.0:
        _rescale(work, order, fac)
        return (REJECTED, SUCCESS, t_new, lands,
                (h * fac, order, h_want, 0, jac_current, need_jac, c_lu, lu_fresh, rate, en,
                 safety), nfev, njac, nlu)
    return (ACCEPTED, SUCCESS, t_new, lands,
            (h, order, h_want, n_equal + 1, False, need_jac, c_lu, lu_fresh, rate, en, safety),
            nfev, njac, nlu)


@jit(inline="always")
def _accept(sys, tab, z, work, st, t, t_new, k, want, d_k, j):
    D = work[0]
    d = D[DCOR]
    order = st[1]
    nz = z.shape[0]
    for m in range(nz):
        D[order + 2, m] = d[m] - D[order + 1, m]
        D[order + 1, m] = d[m]
    for i in range(order, -1, -1):
        for m in range(nz):
            D[i, m] += D[i + 1, m]
    if j >= 0:
        row = d_k[j]
        for i in range(order + 1):
            for m in range(nz):
                row[i, m] = D[i, m]
    return D, order, 0, st


@jit(inline="always")
def _interp(tab, work, st, D, out, ts, t, t_new, z):
    bdf_interp(out, (ts - t_new) / st[0], D, st[1])


@jit(inline="always")
def _advance(tab, z, work, st, lands):
    D = work[0]
    for m in range(z.shape[0]):
        z[m] = D[0, m]


@jit(inline="always")
def _after(sys, tab, ctl, stops, z, work, st, t, k, nseg, lands, jumped):
    rows, mats = work[0], work[1]
    h, order, h_want, n_equal, jac_current, need_jac, c_lu, lu_fresh, rate, en, safety = st
    nfev = 0
    if lands:
        if k < nseg:
            # a dose, an adjoint's jump, an infusion's start or end, a switch: the
            # history no longer describes the solution; order 1 afresh
            order = 1
            f = rows[F]
            sys_f(sys, f, z, t, k)
            nfev += 1
            if ctl.h0 > 0.0:
                h = ctl.h0
            else:
                h = min(hinit(sys, ctl, z, f, t, k, 1, stops[nseg] - t, rows[Y], rows[PSI]),
                        max(h, h_want))
                nfev += 1
            _restart(rows[:MAX_ORDER + 3], z, f, h)
            n_equal = 0
            need_jac = True
        h_want = 0.0
    # ---- the next step's size and order (after order + 1 steps of one size), the
    # error estimates in the new values' scale (wt)
    if k < nseg and n_equal >= order + 1:
        en_m = np.inf
        en_p = np.inf
        wt = rows[WT, :ctl.atol.shape[0]]
        if order > 1:
            en_m = _wnorm(wt, rows[order], mats[_E0 + order - 1])
        if order < tab.max_order:
            en_p = _wnorm(wt, rows[order + 2], mats[_E0 + order + 1])
        best = en ** (-1.0 / (order + 1)) if en > 0.0 else MAX_FACTOR
        delta = 0
        fm = en_m ** (-1.0 / order) if en_m > 0.0 else MAX_FACTOR
        fp = en_p ** (-1.0 / (order + 2)) if en_p > 0.0 else MAX_FACTOR
        if order > 1 and fm > best:
            best = fm
            delta = -1
        if order < tab.max_order and fp > best:
            best = fp
            delta = 1
        order += delta
        fac = min(MAX_FACTOR, safety * best)
        _rescale(work, order, fac)
        h *= fac
        n_equal = 0
    return (h, order, h_want, n_equal, jac_current, need_jac, c_lu, lu_fresh, rate, en,
            safety), nfev


bdf_integrate = family_loop(
    "bdf_integrate",
    "Integrate ``sys`` from ``stops[0]`` to ``stops[-1]`` with the variable-order NDF/BDF "
    "(`loop.integrate`; the module text says how it lands on stops and restarts after "
    "them); stored steps hold ``D[0..order]`` (rows ``MAX_ORDER + 1``) with the order in "
    "``d_have``. Returns ``(status, t)``.",
    _work, _begin, _attempt, _accept, _interp, _advance, _after)


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


def _stored_state(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
    return bdf_store_at(rec, n_steps, out, t, k, j)


def _store_rows(tab):
    return MAX_ORDER + 1


FAMILY = Family(bdf_integrate, _stored_state, _store_rows, None)  # no stages: no step_interp
