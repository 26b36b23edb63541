"""Compiled loops for sensitivities (template): augmented ERK solves and the discrete adjoint.

The algorithms live in the `adjoints` package (settings objects and their
Python orchestration); the loops they drive sit here, beside the solver
loops, because they must call the model's generated kernels (``vjp_into``,
``jac_into``, ``paramjac_into``, ``obs_vjp_into``) by name inside one
generated module for numba's disk cache to hold them.

`adj_solve` integrates one of several augmented systems with any explicit
Runge-Kutta tableau (PI control, FSAL, exact landing on breakpoints):

* ``ADJ_INTERP``: z = [lambda, mu] backward, u(t) from the forward solve's
  stored steps (InterpolatingAdjoint);
* ``ADJ_BACKSOLVE``: z = [u, lambda, mu] backward, u integrated backward too,
  optionally re-anchored to the forward states at observation times
  (BacksolveAdjoint);
* ``ADJ_GAUSS``: z = lambda backward; mu accumulated on each accepted step by
  Gauss-Legendre quadrature of lambda(t)^T df/dp on the step's interpolant
  (GaussAdjoint);
* ``ADJ_QUAD``: as ADJ_GAUSS, with adaptive Gauss-Kronrod (7-15) quadrature
  on each step instead (QuadratureAdjoint);
* ``ADJ_FSENS``: z = [u, S] forward, dS/dt = df/du S + df/dp (ForwardSensitivity).

Backward systems run in reversed time tau = -t, so that every system is
integrated "forward" with positive steps: d lambda/d tau = lambda^T df/du,
d mu/d tau = lambda^T df/dp, du/d tau = -f. The adjoint jumps by
``G[q] = dL/du(t_q)`` at observation times; doses pass through it (a bolus
adds a constant, an infusion a parameter-free rate), while BACKSOLVE's
backward u has each bolus taken back out when it crosses the dose.

`adj_discrete` runs reverse mode through the stored steps of a forward ERK
solve: the exact gradient of the discrete solution (step sizes held fixed).

The lines between the template markers are pasted into every generated model
module (see `sciml._codegen.template_source`); names carry the ``adj_`` prefix.
"""

import math

import numpy as np
from numba import prange

from sciml._jit import jit, pjit
from sciml.solvers._common_template import (
    COM_DT_UNDERFLOW,
    COM_LOG_ERR0,
    COM_MAX_STEPS,
    COM_NEED_STORAGE,
    COM_NONFINITE,
    COM_SUCCESS,
    com_hmin,
    com_next_step,
    com_reject_factor,
    com_rhs,
)
from sciml.solvers._erk_template import ERK_TAB_HEAD, erk_interp, erk_solve, erk_stages
from sciml.solvers._linalg_template import lu_factor_into, lu_solve_into
from sciml.solvers._ros_template import ros_dense_eval
from sciml.solvers._stubs import WS_SIZE, jac_into, obs_vjp_into, paramjac_into, vjp_into

# --- template begin

ADJ_INTERP, ADJ_BACKSOLVE, ADJ_GAUSS, ADJ_QUAD, ADJ_FSENS = 0, 1, 2, 3, 4

# QUADPACK's 15-point Kronrod rule and its embedded 7-point Gauss rule on [-1, 1]
# (Piessens et al., QUADPACK, Springer 1983, routine qk15): nodes +-ADJ_XK[i], ADJ_XK[7] = 0.
ADJ_XK = (0.991455371120812639206854697526329, 0.949107912342758524526189684047851,
          0.864864423359769072789712788640926, 0.741531185599394439863864773280788,
          0.586087235467691130294144845693013, 0.405845151377397166906606412076961,
          0.207784955007898467600689403773245, 0.0)
ADJ_WK = (0.022935322010529224963732008058970, 0.063092092629978553290700663189204,
          0.104790010322250183839876322541518, 0.140653259715525918745189590510238,
          0.169004726639267902826583426598550, 0.190350578064785409913256402421014,
          0.204432940075298892414161999234649, 0.209482141084727828012999174891714)
ADJ_WG = (0.0, 0.129484966168869693270611432679082, 0.0, 0.279705391489276667901467771423780,
          0.0, 0.381830050505118944950369775488975, 0.0, 0.417959183673469387755102040816327)


@jit
def adj_obs_jumps(G, pbar, Ybar, U, obs_t, p, ws, ub):
    """``G[q] += Ybar[q]^T dg/du`` and ``pbar += Ybar[q]^T dg/dp`` for the observables g.

    G (T, n) is added to (the adjoint's jumps); U (T, n) the forward states; ub (n,) scratch.
    """
    for q in range(obs_t.shape[0]):
        obs_vjp_into(ub, pbar, Ybar[q], U[q], p, obs_t[q], ws)
        for m in range(ub.shape[0]):
            G[q, m] += ub[m]


@jit
def adj_u_at(out, tt, k, j, d_t, d_u, d_k, d_have, d_seg, n_steps, A, c, P, n_step, p, ws,
             seg_rate, tmp):
    """Forward state at ``tt`` in dose segment ``k`` from stored steps; returns the step used.

    ``j`` is where to start looking (the previous answer). Steps are matched
    within the segment, so a time on a dose boundary gets the state on the
    segment's side of it. Missing extra interpolant stages are computed and kept.
    """
    while j > 0 and (d_seg[j] > k or (d_t[j] > tt and d_seg[j - 1] == k)):
        j -= 1
    while j < n_steps - 1 and (d_seg[j] < k or (d_seg[j + 1] == k and d_t[j + 1] < tt)):
        j += 1
    h = d_t[j + 1] - d_t[j]
    s_all = P.shape[0]
    if s_all > n_step and d_have[j] == 0:
        erk_stages(d_k[j], d_u[j], h, d_t[j], p, ws, seg_rate[d_seg[j]], A, c, n_step, s_all,
                   tmp)
        d_have[j] = 1
    erk_interp(out, (tt - d_t[j]) / h, h, d_u[j], d_k[j], P)
    return j


@jit
def adj_f(kind, out, z, tt, k, j, d_t, d_u, d_k, d_have, d_seg, n_steps, A, c, P, n_step,
          p, ws, seg_rate, ubuf, pscr, J, Jp, tmp):
    """The augmented right-hand side of ``kind`` at (z, tt): ``out = dz/dtau`` (dz/dt for FSENS).

    Returns the forward step index used (for the next lookup). ubuf, tmp (n,),
    pscr (n_params,), J (n, n), Jp (n, n_params) are scratch.
    """
    n = ubuf.shape[0]
    rate = seg_rate[k]
    if kind == ADJ_FSENS:
        u = z[:n]
        com_rhs(out[:n], u, p, tt, ws, rate)
        jac_into(J, u, p, tt, ws)
        paramjac_into(Jp, u, p, tt, ws)
        npar = Jp.shape[1]
        for i in range(n):
            o = n + i * npar
            for m in range(npar):
                out[o + m] = Jp[i, m]
            for l in range(n):
                a = J[i, l]
                if a != 0.0:
                    ol = n + l * npar
                    for m in range(npar):
                        out[o + m] += a * z[ol + m]
        return j
    # Only whole C-contiguous vectors reach the model's kernels (a slice such as z[n:2n] types
    # differently and would compile vjp_into, and the net kernels under it, once more).
    for m in range(pscr.shape[0]):
        pscr[m] = 0.0
    if kind == ADJ_BACKSOLVE:
        for m in range(n):
            ubuf[m] = z[m]
            tmp[m] = z[n + m]
        com_rhs(out[:n], ubuf, p, tt, ws, rate)
        for m in range(n):
            out[m] = -out[m]
        vjp_into(ubuf, pscr, tmp, z[:n], p, tt, ws)
        for m in range(n):
            out[n + m] = ubuf[m]
        lo = 2 * n
    else:
        j = adj_u_at(ubuf, tt, k, j, d_t, d_u, d_k, d_have, d_seg, n_steps, A, c, P, n_step, p,
                     ws, seg_rate, tmp)
        for m in range(n):
            tmp[m] = z[m]
        vjp_into(out[:n], pscr, tmp, ubuf, p, tt, ws)
        if kind != ADJ_INTERP:  # lambda only: the parameter part is not wanted here
            return j
        lo = n
    for m in range(pscr.shape[0]):
        out[lo + m] = pscr[m]
    return j


@jit
def adj_quad_point(pbar, wt, theta, tt, h, z, K, P, k, j, d_t, d_u, d_k, d_have, d_seg, n_steps,
                   A, c, n_step, p, ws, seg_rate, lam, ubuf, ubar, tmp):
    """``pbar += wt * lambda(theta)^T df/dp(u(tt))`` with lambda from the step's interpolant."""
    erk_interp(lam, theta, h, z[:lam.shape[0]], K[:, :lam.shape[0]], P)
    for m in range(lam.shape[0]):
        lam[m] *= wt
    j = adj_u_at(ubuf, tt, k, j, d_t, d_u, d_k, d_have, d_seg, n_steps, A, c, P, n_step, p, ws,
                 seg_rate, tmp)
    vjp_into(ubar, pbar, lam, ubuf, p, tt, ws)
    return j


@jit
def adj_solve(kind, A, b, e, c, P, n_step, end_stage,
              d_t, d_u, d_k, d_have, d_seg, n_steps,
              stops, seg_rate, bolus_k, bolus_i, bolus_a,
              obs_t, G, U_anchor, anchor, Zout,
              p, ws, z, pbar,
              rtol, atol, h0, max_steps, safety, qmin, qmax, beta1, beta2,
              n_err, qx, qw, quad_tol,
              K, W, ubuf, pscr, J, Jp, Q, Sk, stats):
    """Integrate the augmented system ``kind`` over the schedule, through its breakpoints.

    Parameters
    ----------
    kind : int
        One of ``ADJ_*`` (see the module text). Backward kinds run from
        ``stops[-1]`` to ``stops[0]``; ADJ_FSENS runs forward.
    A, b, e, c, P, n_step, end_stage : the ERK tableau (as `erk_solve`).
    d_t, d_u, d_k, d_have, d_seg, n_steps : the forward solve's stored steps
        (read by INTERP, GAUSS and QUAD; extra stages may be added).
    stops, seg_rate, bolus_k, bolus_i, bolus_a : the dose schedule.
    obs_t : (T,) sorted observation times inside the span (breakpoints).
    G : (T, n) adjoint jumps dL/du(t_q) (backward kinds).
    U_anchor, anchor : (T, n) forward states; BACKSOLVE resets its u to them
        at observation times when ``anchor``.
    Zout : (T, nz) FSENS writes z at each observation time here.
    p, ws : parameters and the model's workspace.
    z : (nz,) in: the state at the starting end (zeros for backward kinds,
        [u0, 0] for FSENS); out: the state at the other end.
    pbar : (n_params,) GAUSS/QUAD add the parameter integral here.
    rtol, atol : float; error norm over ``z[:n_err]``.
    h0 : first step; qx, qw : quadrature nodes on [0, 1] and weights (GAUSS);
    quad_tol : relative tolerance of the adaptive quadrature (QUAD).
    K (s_all, nz), W (3, nz) : stages and work rows; ubuf (4, n), pscr (n_params,),
    J (n, n), Jp (n, n_params), Q (3, n_params), Sk (16, 3) : scratch.
    stats : (3,) int64 written: augmented evaluations, accepted, rejected steps.

    Returns
    -------
    status : int (a `sciml.solvers.base` code)
    """
    n = ubuf.shape[1]
    s = n_step
    s_all = P.shape[0]
    nz = z.shape[0]
    fwd = kind == ADJ_FSENS
    lo = n if kind == ADJ_BACKSOLVE else 0  # where lambda sits in z
    znew = W[0]
    zs = W[1]
    err = W[2]
    ub = ubuf[0]
    lam = ubuf[1]
    ubar = ubuf[2]
    tmp = ubuf[3]
    nseg = stops.shape[0] - 1
    T = obs_t.shape[0]
    nfev = 0
    nacc = 0
    nrej = 0
    jf = max(n_steps - 1, 0)
    status = COM_SUCCESS
    if fwd:
        t = stops[0]
        k = 0
        q = 0
        t_end = stops[nseg]
        bp = 0
        while bp < bolus_k.shape[0] and bolus_k[bp] == 0:
            z[bolus_i[bp]] += bolus_a[bp]
            bp += 1
        while q < T and obs_t[q] <= t:
            Zout[q, :] = z
            q += 1
    else:
        t = stops[nseg]
        k = nseg - 1
        q = T - 1
        t_end = stops[0]
        bp = bolus_k.shape[0] - 1
        while q >= 0 and obs_t[q] >= t:
            if anchor:
                for m in range(n):
                    z[m] = U_anchor[q, m]
            for m in range(n):
                z[lo + m] += G[q, m]
            q -= 1
        while bp >= 0 and bolus_k[bp] >= nseg:  # boluses at tf: u before them
            if kind == ADJ_BACKSOLVE:
                z[bolus_i[bp]] -= bolus_a[bp]
            bp -= 1
    h = h0
    span = abs(t_end - t)
    if not h > 0.0:
        h = 1e-3 * span
    k0_ok = False
    log_prev = COM_LOG_ERR0
    while (t < t_end) if fwd else (t > t_end):
        # the next breakpoint: a stop or an observation time
        if fwd:
            tb = stops[k + 1]
            if q < T and obs_t[q] < tb:
                tb = obs_t[q]
        else:
            tb = stops[k]
            if q >= 0 and obs_t[q] > tb:
                tb = obs_t[q]
        rejected = False
        while (t < tb) if fwd else (t > tb):
            if nacc + nrej >= max_steps:
                status = COM_MAX_STEPS
                break
            rest = abs(tb - t)
            lands = 1.01 * h >= rest
            h_try = rest if lands else h
            sg = h_try if fwd else -h_try  # the step in t
            if not k0_ok:
                jf = adj_f(kind, K[0], z, t, k, jf, d_t, d_u, d_k, d_have, d_seg, n_steps, A, c,
                           P, n_step, p, ws, seg_rate, ub, pscr, J, Jp, tmp)
                nfev += 1
                k0_ok = True
            for i in range(1, s):
                for m in range(nz):
                    zs[m] = z[m]
                for l in range(i):
                    a = h_try * A[i, l]
                    if a != 0.0:
                        for m in range(nz):
                            zs[m] += a * K[l, m]
                jf = adj_f(kind, K[i], zs, t + c[i] * sg, k, jf, d_t, d_u, d_k, d_have, d_seg,
                           n_steps, A, c, P, n_step, p, ws, seg_rate, ub, pscr, J, Jp, tmp)
            nfev += s - 1
            for m in range(nz):
                znew[m] = z[m]
                err[m] = 0.0
            for i in range(s):
                a = h_try * b[i]
                ae = h_try * e[i]
                for m in range(nz):
                    znew[m] += a * K[i, m]
                    err[m] += ae * K[i, m]
            acc = 0.0
            finite = True
            for m in range(nz):
                if not math.isfinite(znew[m]):
                    finite = False
            for m in range(n_err):
                sc = atol + rtol * max(abs(z[m]), abs(znew[m]))
                r = err[m] / sc
                acc += r * r
            en = math.sqrt(acc / max(n_err, 1))
            if not (finite and en <= 1.0):
                nrej += 1
                rejected = True
                h = h_try * com_reject_factor(en if finite else math.inf, safety, qmin, beta1)
                if h < com_hmin(t):
                    status = COM_NONFINITE if not finite else COM_DT_UNDERFLOW
                    break
                continue
            h_next, log_prev = com_next_step(en, log_prev, h_try, h, rejected, lands, safety,
                                                  qmin, qmax, beta1, beta2)
            nacc += 1
            rejected = False
            if kind == ADJ_GAUSS or kind == ADJ_QUAD:
                if s_all > s:  # the interpolant's extra stages
                    for i in range(s, s_all):
                        for m in range(nz):
                            zs[m] = z[m]
                        for l in range(i):
                            a = h_try * A[i, l]
                            if a != 0.0:
                                for m in range(nz):
                                    zs[m] += a * K[l, m]
                        jf = adj_f(kind, K[i], zs, t + c[i] * sg, k, jf, d_t, d_u, d_k, d_have,
                                   d_seg, n_steps, A, c, P, n_step, p, ws, seg_rate, ub, pscr,
                                   J, Jp, tmp)
                    nfev += s_all - s
                if kind == ADJ_GAUSS:
                    for g in range(qx.shape[0]):
                        jf = adj_quad_point(pbar, qw[g] * h_try, qx[g], t + qx[g] * sg, h_try, z,
                                            K, P, k, jf, d_t, d_u, d_k, d_have, d_seg, n_steps,
                                            A, c, n_step, p, ws, seg_rate, lam, ub, ubar, tmp)
                    nfev += qx.shape[0]
                else:
                    jf, ne = adj_gk_step(pbar, t, sg, h_try, z, K, P, k, jf, d_t, d_u, d_k,
                                         d_have, d_seg, n_steps, A, c, n_step, p, ws, seg_rate,
                                         lam, ub, ubar, tmp, Q, Sk, quad_tol, atol)
                    nfev += ne
            t = tb if lands else t + sg
            for m in range(nz):
                z[m] = znew[m]
            if end_stage >= 0 and (end_stage < s or kind == ADJ_GAUSS or kind == ADJ_QUAD):
                for m in range(nz):
                    K[0, m] = K[end_stage, m]
            else:
                k0_ok = False
            h = h_next
        if status != COM_SUCCESS:
            break
        # events at the breakpoint t == tb
        if fwd:
            if t >= stops[k + 1] and k + 1 < nseg:
                k += 1
                while bp < bolus_k.shape[0] and bolus_k[bp] < k:
                    bp += 1
                while bp < bolus_k.shape[0] and bolus_k[bp] == k:
                    z[bolus_i[bp]] += bolus_a[bp]
                    bp += 1
                    k0_ok = False
                k0_ok = False  # the infusion rate may change
            while q < T and obs_t[q] <= t:
                Zout[q, :] = z
                q += 1
        else:
            while q >= 0 and obs_t[q] >= t:
                if anchor:
                    for m in range(n):
                        z[m] = U_anchor[q, m]
                for m in range(n):
                    z[lo + m] += G[q, m]
                q -= 1
                k0_ok = False
            if t <= stops[k] and k > 0:
                if kind == ADJ_BACKSOLVE:  # take the boluses at this stop back out of u
                    while bp >= 0 and bolus_k[bp] > k:
                        bp -= 1
                    while bp >= 0 and bolus_k[bp] == k:
                        z[bolus_i[bp]] -= bolus_a[bp]
                        bp -= 1
                k -= 1
                k0_ok = False
    stats[0] = nfev
    stats[1] = nacc
    stats[2] = nrej
    return status


@jit
def adj_gk_step(pbar, t, sg, h, z, K, P, k, jf, d_t, d_u, d_k, d_have, d_seg, n_steps, A, c,
                n_step, p, ws, seg_rate, lam, ub, ubar, tmp, Q, Sk, tol, atol):
    """Adaptive Gauss-Kronrod (7-15) quadrature of lambda^T df/dp over one step, into pbar.

    Bisects an interval (of theta in [0, 1]) until the Kronrod and Gauss
    sums agree to ``tol`` relative (``atol`` absolute), at most 6 levels deep.
    Q (3, n_params): Kronrod sum, Gauss sum, one point; Sk (16, 3): the interval stack.
    Returns (jf, evaluations).
    """
    npar = pbar.shape[0]
    nev = 0
    top = 1  # Sk: a stack of intervals (a, b, depth) still to integrate
    Sk[0, 0] = 0.0
    Sk[0, 1] = 1.0
    Sk[0, 2] = 0.0
    while top > 0:
        top -= 1
        a0 = Sk[top, 0]
        b0 = Sk[top, 1]
        dep = int(Sk[top, 2])
        half = 0.5 * (b0 - a0)
        mid = 0.5 * (a0 + b0)
        for m in range(npar):
            Q[0, m] = 0.0
            Q[1, m] = 0.0
        for i in range(15):
            if i < 7:
                x = mid - half * ADJ_XK[i]
                wk = ADJ_WK[i]
                wg = ADJ_WG[i]
            elif i == 7:
                x = mid
                wk = ADJ_WK[7]
                wg = ADJ_WG[7]
            else:
                x = mid + half * ADJ_XK[14 - i]
                wk = ADJ_WK[14 - i]
                wg = ADJ_WG[14 - i]
            # Q[2] = lambda(x)^T df/dp, scaled by the step's length in t
            for m in range(npar):
                Q[2, m] = 0.0
            jf = adj_quad_point(Q[2], half * h, x, t + x * sg, h, z, K, P, k, jf, d_t, d_u,
                                d_k, d_have, d_seg, n_steps, A, c, n_step, p, ws, seg_rate, lam,
                                ub, ubar, tmp)
            nev += 1
            for m in range(npar):
                Q[0, m] += wk * Q[2, m]
                Q[1, m] += wg * Q[2, m]
        worst = 0.0
        for m in range(npar):
            d = abs(Q[0, m] - Q[1, m]) / (atol + tol * abs(Q[0, m]))
            if d > worst:
                worst = d
        if worst <= 1.0 or dep >= 6 or top + 2 > Sk.shape[0]:
            for m in range(npar):
                pbar[m] += Q[0, m]
        else:
            Sk[top, 0] = a0
            Sk[top, 1] = mid
            Sk[top, 2] = dep + 1
            Sk[top + 1, 0] = mid
            Sk[top + 1, 1] = b0
            Sk[top + 1, 2] = dep + 1
            top += 2
    return jf, nev


@jit
def adj_discrete(A, b, c, P, n_step, d_t, d_u, d_k, d_have, d_seg, n_steps, seg_rate,
                 obs_t, G, p, ws, lam, pbar, Kbar, X, xbar):
    """Reverse mode through the stored steps of an ERK solve (step sizes held fixed).

    The forward solve saved at ``obs_t`` (so steps holding an interpolated
    observation have their extra stages). ``G`` (T, n): dL/du at the
    observations. ``lam`` (n,) out: dL/du0; ``pbar`` (n_params,) added to.
    Kbar (s_all, n), X, xbar (n,): scratch. Boluses and infusion rates do
    not depend on u or p, so they leave the reverse pass unchanged.
    """
    n = lam.shape[0]
    s_all = P.shape[0]
    d = P.shape[1]
    T = obs_t.shape[0]
    for m in range(n):
        lam[m] = 0.0
    q = T - 1
    while q >= 0 and obs_t[q] >= d_t[n_steps]:
        for m in range(n):
            lam[m] += G[q, m]
        q -= 1
    for j in range(n_steps - 1, -1, -1):
        t0 = d_t[j]
        h = d_t[j + 1] - t0
        rows = s_all if d_have[j] != 0 else n_step
        K = d_k[j]
        u = d_u[j]
        for i in range(rows):
            w = h * b[i] if i < n_step else 0.0
            for m in range(n):
                Kbar[i, m] = w * lam[m]
        while q >= 0 and obs_t[q] > t0:  # interpolated inside the step
            theta = (obs_t[q] - t0) / h
            for i in range(rows):
                w = 0.0
                for jj in range(d - 1, -1, -1):
                    w = w * theta + P[i, jj]
                w *= theta * h
                if w != 0.0:
                    for m in range(n):
                        Kbar[i, m] += w * G[q, m]
            for m in range(n):
                lam[m] += G[q, m]
            q -= 1
        for i in range(rows - 1, -1, -1):
            nz = False
            for m in range(n):
                if Kbar[i, m] != 0.0:
                    nz = True
                    break
            if not nz:
                continue
            for m in range(n):
                X[m] = u[m]
            for l in range(i):
                a = h * A[i, l]
                if a != 0.0:
                    for m in range(n):
                        X[m] += a * K[l, m]
            vjp_into(xbar, pbar, Kbar[i], X, p, t0 + c[i] * h, ws)
            for m in range(n):
                lam[m] += xbar[m]
            for l in range(i):
                a = h * A[i, l]
                if a != 0.0:
                    for m in range(n):
                        Kbar[l, m] += a * xbar[m]
        while q >= 0 and obs_t[q] >= t0:  # saved as the state at the step's start
            for m in range(n):
                lam[m] += G[q, m]
            q -= 1


@jit
def adj_lean_forward(tab, u0, p, t0, tf, obs_t, Yd, Wd, cols, rtol, atol, dt, max_steps, stats):
    """The forward half of `adj_lean`: solve with steps stored, loss, adjoint jumps G.

    Returns (status, loss, G, tableau arrays, step storage, n_steps, ws, stops,
    seg_rate, U, atol) for the reverse halves.
    """
    n = u0.shape[0]
    T = obs_t.shape[0]
    s_all = int(tab[0])
    d = int(tab[1])
    n_step = int(tab[2])
    end_stage = int(tab[3])
    adaptive = tab[4] != 0.0
    order = int(tab[5])
    # Fresh C-contiguous copies: the loops below are then called with the argument types the
    # general (Python) path uses, so their compiled versions are shared, not compiled twice.
    o = ERK_TAB_HEAD
    A = np.ascontiguousarray(tab[o:o + s_all * s_all]).reshape((s_all, s_all))
    o += s_all * s_all
    b = np.ascontiguousarray(tab[o:o + s_all])
    e = np.ascontiguousarray(tab[o + s_all:o + 2 * s_all])
    c = np.ascontiguousarray(tab[o + 2 * s_all:o + 3 * s_all])
    o += 3 * s_all
    P = np.ascontiguousarray(tab[o:o + s_all * d]).reshape((s_all, d))
    ws = np.zeros(max(WS_SIZE, 1))
    K = np.zeros((s_all, n))
    W = np.zeros((4, n))
    fst = np.zeros(4, dtype=np.int64)
    stops = np.zeros(2)
    stops[0] = t0
    stops[1] = tf
    seg_rate = np.zeros((1, n))
    no_i = np.zeros(0, dtype=np.int64)
    no_f = np.zeros(0)
    U = np.zeros((T, n))
    # run-time booleans: a literal True/False would type differently from the Python path's
    yes = T >= 0
    no = not yes
    atol = atol.copy()  # writable, as the Python path's (a read-only array types differently)
    if adaptive:
        cap = 64
    else:
        cap = int(math.ceil((tf - t0) / dt * (1.0 + 1e-12))) + 3
    while True:
        d_t = np.zeros(cap + 1)
        d_u = np.zeros((cap + 1, n))
        d_k = np.zeros((cap, s_all, n))
        d_have = np.zeros(cap, dtype=np.int8)
        d_seg = np.zeros(cap, dtype=np.int64)
        status, t_end = erk_solve(A, b, e, c, P, n_step, end_stage, adaptive, order, u0, p, ws,
                                  stops, seg_rate, no_i, no_i, no_f, no, obs_t, no_f, U,
                                  rtol, atol, dt, max_steps, tab[6], tab[7], tab[8], tab[9],
                                  tab[10], yes, d_t, d_u, d_k, d_have, d_seg, K, W, fst)
        if status != COM_NEED_STORAGE:
            break
        cap = 4 * cap
    stats[0] = fst[1]
    G = np.zeros((T, n))
    loss = 0.0
    if status == COM_SUCCESS:
        for q in range(T):
            for j in range(cols.shape[0]):
                r = U[q, cols[j]] - Yd[q, j]
                wr = Wd[q, j] * r
                loss += wr * r
                G[q, cols[j]] += 2.0 * wr
    else:
        loss = math.inf
    return (status, loss, G, A, b, e, c, P, n_step, end_stage, d_t, d_u, d_k, d_have, d_seg,
            fst[1], ws, stops, seg_rate, U, atol)


@jit
def adj_lean(tab, u0, p, t0, tf, obs_t, Yd, Wd, cols, rtol, atol, dt, max_steps, grad, stats):
    """Loss (weighted squared errors on states) and its discrete-adjoint gradient in one call.

    The lean path of `sciml.loss_and_grad` (no doses, `SSE` on states, one
    problem): the forward `erk_solve` over ``[t0, tf]`` saving at ``obs_t``
    with its steps stored, the loss ``sum Wd * (u[:, cols] - Yd)**2``, then
    `adj_discrete`. ``tab``: the solver's packed tableau and controller (as
    `erk_solve_saveat`); ``atol`` (n,). Buffers are allocated here, once per
    call (grown when the steps outrun them), never per step.

    Returns
    -------
    (status, loss) : 0 or the failing solve's status; ``grad`` (n_params,) is written.
    stats (3,) int64: forward accepted steps, backward evaluations, backward steps.
    """
    (status, loss, G, A, b, e, c, P, n_step, end_stage, d_t, d_u, d_k, d_have, d_seg, n_steps,
     ws, stops, seg_rate, U, atol) = adj_lean_forward(tab, u0, p, t0, tf, obs_t, Yd, Wd, cols,
                                                      rtol, atol, dt, max_steps, stats)
    if status != COM_SUCCESS:
        return status, loss
    n = u0.shape[0]
    for m in range(p.shape[0]):
        grad[m] = 0.0
    lam = np.zeros(n)
    adj_discrete(A, b, c, P, n_step, d_t, d_u, d_k, d_have, d_seg, n_steps, seg_rate, obs_t,
                 G, p, ws, lam, grad, np.zeros((P.shape[0], n)), np.zeros(n), np.zeros(n))
    stats[1] = 0
    stats[2] = 0
    return COM_SUCCESS, loss


@jit
def adj_lean_continuous(kind, tab, u0, p, t0, tf, obs_t, Yd, Wd, cols, rtol, atol, dt,
                        max_steps, qx, qw, grad, stats):
    """`adj_lean` with a continuous adjoint: ``kind`` ADJ_INTERP or ADJ_GAUSS (nodes ``qx``,
    weights ``qw`` on [0, 1]); a separate function so the discrete path never compiles
    `adj_solve`."""
    (status, loss, G, A, b, e, c, P, n_step, end_stage, d_t, d_u, d_k, d_have, d_seg, n_steps,
     ws, stops, seg_rate, U, atol) = adj_lean_forward(tab, u0, p, t0, tf, obs_t, Yd, Wd, cols,
                                                      rtol, atol, dt, max_steps, stats)
    if status != COM_SUCCESS:
        return status, loss
    n = u0.shape[0]
    npar = p.shape[0]
    for m in range(npar):
        grad[m] = 0.0
    no_i = np.zeros(0, dtype=np.int64)
    no_f = np.zeros(0)
    no = obs_t.shape[0] < 0
    nz = n + npar if kind == ADJ_INTERP else n
    z = np.zeros(nz)
    ast = np.zeros(3, dtype=np.int64)
    h0 = d_t[n_steps] - d_t[n_steps - 1] if n_steps > 0 else 0.0
    amin = atol[0]
    for m in range(n):
        amin = min(amin, atol[m])
    s_all = P.shape[0]
    status = adj_solve(kind, A, b, e, c, P, n_step, end_stage, d_t, d_u, d_k, d_have, d_seg,
                       n_steps, stops, seg_rate, no_i, no_i, no_f, obs_t, G, U, no, U,
                       p, ws, z, grad, rtol, amin, h0, max_steps, tab[6], tab[7], tab[8],
                       tab[9], tab[10], nz, qx, qw, rtol,
                       np.zeros((s_all, nz)), np.zeros((3, nz)), np.zeros((4, n)),
                       np.zeros(npar), np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((3, npar)),
                       np.zeros((16, 3)), ast)
    stats[1] = ast[0]
    stats[2] = ast[1]
    if kind == ADJ_INTERP:
        for m in range(npar):
            grad[m] += z[n + m]
    return status, loss


@pjit
def adj_lean_many(tab, U0, Pm, t0s, tfs, obs_t, o_off, Yd, Wd, cols, rtol, atol, dt, max_steps,
                  grads, losses, status):
    """`adj_lean` for many problems of one model in parallel threads (a row each).

    U0 (m, n), Pm (m, n_params), t0s, tfs (m,): each problem's start, parameters
    and span; problem ``i`` owns observation rows ``o_off[i]:o_off[i+1]`` of
    ``obs_t``, ``Yd`` and ``Wd``. Writes ``grads`` (m, n_params), ``losses``
    and ``status`` (m,); the caller sums them in a fixed order.
    """
    for i in prange(U0.shape[0]):
        st = np.zeros(3, dtype=np.int64)
        a = o_off[i]
        b = o_off[i + 1]
        # contiguous copies: the same argument types as a single `adj_lean` call
        status[i], losses[i] = adj_lean(tab, U0[i], Pm[i], t0s[i], tfs[i],
                                        np.ascontiguousarray(obs_t[a:b]),
                                        np.ascontiguousarray(Yd[a:b]),
                                        np.ascontiguousarray(Wd[a:b]), cols, rtol, atol, dt,
                                        max_steps, grads[i], st)


# ---------------------------------------------------------------- stiff: Rosenbrock backward


@jit
def adj_ros_u_at(out, tt, lo, hi, j, ts, us, kd, n_steps):
    """Forward state at ``tt`` in the dose segment ``[lo, hi]`` from `ros_solve`'s stored steps.

    Returns the step used. Steps never cross a stop, so restricting the
    search to steps inside the segment picks the segment's side of a dose.
    """
    while j > 0 and ts[j] >= hi:
        j -= 1
    while j < n_steps - 1 and ts[j + 1] <= lo:
        j += 1
    while j > 0 and ts[j] > tt and ts[j - 1] >= lo:
        j -= 1
    while j < n_steps - 1 and ts[j + 1] < tt and ts[j + 1] < hi:
        j += 1
    h = ts[j + 1] - ts[j]
    ros_dense_eval(out, (tt - ts[j]) / h, us[j], kd[j, 0], kd[j])
    return j


@jit
def adj_ros_g(out, lam, tt, lo, hi, j, ts, us, kd, n_steps, p, ws, ub, pscr):
    """The backward adjoint right-hand side ``out = J(u(tt))^T lam`` (u from the forward steps)."""
    j = adj_ros_u_at(ub, tt, lo, hi, j, ts, us, kd, n_steps)
    for m in range(pscr.shape[0]):
        pscr[m] = 0.0
    vjp_into(out, pscr, lam, ub, p, tt, ws)
    return j


@jit
def adj_ros_gauss(a, C, c, d, b, e, H, gamma, ts, us, kd, n_steps,
                  stops, obs_t, G, p, ws, lam, pbar,
                  rtol, atol, h0, max_steps, safety, qmin, qmax, beta1, beta2, qx, qw,
                  K, V, Jm, Wm, piv, D, pscr, stats):
    """Gauss adjoint for stiff problems: lambda backward by a Rosenbrock method, mu by quadrature.

    The adjoint ODE d lambda/d tau = J(u(t))^T lambda (tau = -t) is as stiff
    as the forward problem, so it is integrated with the forward solver's
    Rosenbrock tableau (``a, C, c, d, b, e, H, gamma`` as `ros_solve`) and the
    adjoint Jacobian J^T from `jac_into` at each step's start; its time
    derivative (u(t) moves) is a forward difference, as in `ros_solve`. On
    each accepted step, mu += sum_k w_k h lambda(t_k)^T df/dp(u(t_k)) at the
    Gauss nodes ``qx`` (weights ``qw``, on [0, 1]), lambda from the step's
    Rosenbrock interpolant and u from the forward steps (``ts, us, kd`` of
    `ros_solve`). Jumps ``G`` at ``obs_t`` as in `adj_solve`.

    lam (n,): in zeros, out dL/du0; pbar (n_params,) added to. K (s, n),
    V (6, n), Jm, Wm (n, n), piv (n,) int64, D (1 + n_dense, n), pscr
    (n_params,): scratch. stats (3,): vjp calls, accepted, rejected steps.
    Returns a status code.
    """
    n = lam.shape[0]
    s = a.shape[0]
    nh = H.shape[0]
    f0 = V[0]
    dT = V[1]
    Y = V[2]
    r = V[3]
    lnew = V[4]
    ub = V[5]
    eps = 2.220446049250313e-16
    nseg = stops.shape[0] - 1
    T = obs_t.shape[0]
    t = stops[nseg]
    k = nseg - 1
    q = T - 1
    t_end = stops[0]
    while q >= 0 and obs_t[q] >= t:
        for m in range(n):
            lam[m] += G[q, m]
        q -= 1
    h = h0 if h0 > 0.0 else 1e-3 * (t - t_end)
    nfev = 0
    nacc = 0
    nrej = 0
    jf = max(n_steps - 1, 0)
    log_prev = COM_LOG_ERR0
    status = COM_SUCCESS
    while t > t_end:
        lo = stops[k]
        hi = stops[k + 1]
        tb = lo
        if q >= 0 and obs_t[q] > tb:
            tb = obs_t[q]
        fresh = True
        rejected = False
        while t > tb:
            if nacc + nrej >= max_steps:
                status = COM_MAX_STEPS
                break
            if fresh:
                jf = adj_ros_g(f0, lam, t, lo, hi, jf, ts, us, kd, n_steps, p, ws, ub, pscr)
                jac_into(Jm, ub, p, t, ws)
                dtau = math.sqrt(eps) * max(1.0, abs(t))
                jf = adj_ros_g(dT, lam, t - dtau, lo, hi, jf, ts, us, kd, n_steps, p, ws, ub,
                               pscr)
                for m in range(n):
                    dT[m] = (dT[m] - f0[m]) / dtau
                nfev += 2
                fresh = False
            rest = t - tb
            lands = 1.01 * h >= rest
            h_try = rest if lands else h
            ihg = 1.0 / (h_try * gamma)
            for i in range(n):
                for jj in range(n):
                    Wm[i, jj] = -Jm[jj, i]  # the adjoint Jacobian J^T
                Wm[i, i] += ihg
            singular = lu_factor_into(Wm, piv) != 0
            en = math.inf
            finite = False
            if not singular:
                ih = 1.0 / h_try
                for st in range(s):
                    if st == 0:
                        for m in range(n):
                            r[m] = f0[m]
                    else:
                        for m in range(n):
                            acc = lam[m]
                            for jj in range(st):
                                acc += a[st, jj] * K[jj, m]
                            Y[m] = acc
                        jf = adj_ros_g(r, Y, t - c[st] * h_try, lo, hi, jf, ts, us, kd, n_steps,
                                       p, ws, ub, pscr)
                        nfev += 1
                        for m in range(n):
                            acc = 0.0
                            for jj in range(st):
                                acc += C[st, jj] * K[jj, m]
                            r[m] += acc * ih
                    hd = h_try * d[st]
                    for m in range(n):
                        r[m] += hd * dT[m]
                    lu_solve_into(r, Wm, piv)
                    for m in range(n):
                        K[st, m] = r[m]
                for m in range(n):
                    acc = lam[m]
                    ee = 0.0
                    for jj in range(s):
                        acc += b[jj] * K[jj, m]
                        ee += e[jj] * K[jj, m]
                    lnew[m] = acc
                    r[m] = ee
                acc = 0.0
                finite = True
                for m in range(n):
                    if not math.isfinite(lnew[m]):
                        finite = False
                    sc = atol + rtol * max(abs(lam[m]), abs(lnew[m]))
                    acc += (r[m] / sc) ** 2
                en = math.sqrt(acc / n)
                finite = finite and en == en
            if not (finite and en <= 1.0):
                nrej += 1
                rejected = True
                h = h_try * com_reject_factor(en if finite else math.inf, safety, qmin, beta1)
                if h < com_hmin(t):
                    status = COM_NONFINITE if not finite and not singular else COM_DT_UNDERFLOW
                    break
                continue
            h_next, log_prev = com_next_step(en, log_prev, h_try, h, rejected, lands, safety,
                                                  qmin, qmax, beta1, beta2)
            nacc += 1
            rejected = False
            # the step's interpolant, then mu by Gauss-Legendre quadrature over it
            for jh in range(nh):
                for m in range(n):
                    acc = 0.0
                    for jj in range(s):
                        acc += H[jh, jj] * K[jj, m]
                    D[1 + jh, m] = acc
            for g in range(qx.shape[0]):
                tt = t - qx[g] * h_try
                ros_dense_eval(Y, qx[g], lam, lnew, D)
                wt = qw[g] * h_try
                for m in range(n):
                    Y[m] *= wt
                jf = adj_ros_u_at(ub, tt, lo, hi, jf, ts, us, kd, n_steps)
                vjp_into(r, pbar, Y, ub, p, tt, ws)
            nfev += qx.shape[0]
            t = tb if lands else t - h_try
            for m in range(n):
                lam[m] = lnew[m]
            h = h_next
            fresh = True
        if status != COM_SUCCESS:
            break
        while q >= 0 and obs_t[q] >= t:
            for m in range(n):
                lam[m] += G[q, m]
            q -= 1
        if t <= stops[k] and k > 0:
            k -= 1
    stats[0] = nfev
    stats[1] = nacc
    stats[2] = nrej
    return status


# --- template end
