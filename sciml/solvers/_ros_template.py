"""The compiled Rosenbrock integration loop (template pasted into every model module).

One call of `ros_solve` integrates a whole problem: the Jacobian (`jac_into`),
``f`` and, for a non-autonomous model, ``df/dt`` once per step; one LU of
``W = I/(h*gamma) - J`` per attempted step; the stages of the method in the
transformed form of Hairer & Wanner (1996, Sec. IV.7), which needs no
matrix-vector products with ``J``; the embedded error estimate; the shared PI
controller and starting step; landing on every stop of the dose schedule;
``save_t`` filled by the method's interpolant; optional per-step storage for
dense output. The coefficients arrive as arrays (the solver's tableau), so
the loop serves any Rosenbrock method written in this form.

``df/dt`` is a forward difference of `rhs_into` in ``t`` with step
``sqrt(eps) * max(1, |t|)``: one extra call per step, skipped when the model
declares ``AUTONOMOUS = True``. The infusion rate is constant on a segment
of the schedule and the loop never steps across a segment boundary, so the
rate cancels in that difference; a model whose own f jumps in t should give
the jump times as `tstops`.

The schedule (``stops``, ``seg_rate``, ``bolus_*``) and the ``com_`` helpers
come from `_common_template`; model kernels (`rhs_into`, `jac_into`) are the
generated module's globals. The imports below only make this file
importable and lintable on its own. Every buffer is the caller's: nothing
is allocated per step.
"""

import math

from sciml._jit import jit
from sciml.solvers._common_template import (
    COM_DT_UNDERFLOW,
    COM_LOG_ERR0,
    COM_MAX_STEPS,
    COM_NEED_STORAGE,
    COM_NONFINITE,
    COM_SUCCESS,
    com_all_finite,
    com_apply_boluses,
    com_err_norm,
    com_hinit,
    com_hmin,
    com_next_step,
    com_reject_factor,
    com_rhs,
    com_step_to,
)
from sciml.solvers._linalg_template import lu_factor_into, lu_solve_into
from sciml.solvers._stubs import jac_into

# --- template begin

# The carry: what `ros_solve` needs to resume after NEED_STORAGE. cf: floats;
# ci: ints, the first five being the statistics.
ROS_CF_T, ROS_CF_H, ROS_CF_LOGPREV, ROS_CF_SIZE = 0, 1, 2, 3
(ROS_CI_NFEV, ROS_CI_NJAC, ROS_CI_NLU, ROS_CI_NACC, ROS_CI_NREJ, ROS_CI_STARTED, ROS_CI_NSTEP,
 ROS_CI_SAVED, ROS_CI_BOLUS, ROS_CI_SEG, ROS_CI_SIZE) = range(11)

# Rows of the work array V.
ROS_F0, ROS_DT, ROS_U, ROS_R, ROS_UNEW, ROS_NV = range(6)


@jit
def ros_dense_eval(out, theta, y0, y1, D):
    """The interpolant on one step at ``theta`` in [0, 1]; out, y0, y1 (n,).

    ``out = (1-θ) y0 + θ (y1 + (1-θ) (K1 + θ (K2 + θ K3 ...)))`` with
    ``K_j = D[j]`` for ``j >= 1`` (``D[0]`` holds the step's pre-dose end
    state in the step storage and is not read here).
    """
    nd = D.shape[0]
    th1 = 1.0 - theta
    for i in range(out.shape[0]):
        acc = D[nd - 1, i]
        for j in range(nd - 2, 0, -1):
            acc = D[j, i] + theta * acc
        out[i] = th1 * y0[i] + theta * (y1[i] + th1 * acc)


@jit
def ros_stages(K, W, piv, u, h, t, p, ws, rate, f0, dT, nonauto, a, C, c, d, U, r):
    """All stages of one step: ``K[i] = W^-1 (f(t + c_i h, u + sum_j a_ij K[j]) + rate
    + h d_i dT + sum_j (C_ij / h) K[j])``, with ``W`` already LU-factored (``piv``).

    ``f0`` is the first stage's f (at ``t``, ``u``); returns the rhs calls made.
    """
    n = u.shape[0]
    s = a.shape[0]
    ih = 1.0 / h
    for st in range(s):
        if st == 0:
            for i in range(n):
                r[i] = f0[i]
        else:
            for i in range(n):
                acc = u[i]
                for j in range(st):
                    acc += a[st, j] * K[j, i]
                U[i] = acc
            com_rhs(r, U, p, t + c[st] * h, ws, rate)
            for i in range(n):
                acc = 0.0
                for j in range(st):
                    acc += C[st, j] * K[j, i]
                r[i] += acc * ih
        if nonauto:
            hd = h * d[st]
            for i in range(n):
                r[i] += hd * dT[i]
        lu_solve_into(r, W, piv)
        for i in range(n):
            K[st, i] = r[i]
    return s - 1


@jit
def ros_solve(a, C, c, d, b, e, H, gamma, order, adaptive,
              u, p, ws, nonauto,
              stops, seg_rate, bolus_k, bolus_i, bolus_a,
              save_t, save_u,
              rtol, atol, h_init, max_steps, safety, qmin, qmax, beta1, beta2,
              store, ts, us, kd,
              K, V, kd1, Jm, Wm, piv, cf, ci):
    """Integrate one problem over its schedule with a Rosenbrock method.

    Parameters
    ----------
    a, C : (s, s)
        Transformed coefficients (strictly lower triangular).
    c, d, b, e : (s,)
        Stage times, df/dt weights, solution weights (``u_new = u + sum b_i K[i]``)
        and error weights.
    H : (n_dense, s)
        Interpolant: ``K_j = sum_i H[j, i] K[i]`` (see `ros_dense_eval`).
    gamma : float
    order : int
        Order of the embedded solution (sets Hairer's starting step).
    adaptive : bool
        Error control; otherwise fixed steps of ``h_init`` (shortened only to
        land on stops).
    u : (n,)
        The initial state on a fresh start; the state reached on return.
    p : (n_params,); ws : the model's scratch vector.
    nonauto : bool
        Whether f depends on t (adds the df/dt terms).
    stops, seg_rate, bolus_k, bolus_i, bolus_a : the schedule (see `_common_template`).
    save_t : (m,) sorted times in the span; save_u : (m, n), written at them.
    rtol : float; atol : (n,)
    h_init : float
        First step (<= 0: Hairer's estimate); the step when not `adaptive`.
    max_steps : int
        Accepted plus rejected steps allowed.
    safety, qmin, qmax, beta1, beta2 : float
        PI controller (see `com_next_step`).
    store : bool
        Keep every accepted step: ``ts`` (cap + 1,) step start times and the
        final time, ``us`` (cap + 1, n) post-dose start states and the final
        state, ``kd`` (cap, 1 + n_dense, n) pre-dose end state and ``K_j`` of
        each step. NEED_STORAGE when full (``cap = kd.shape[0]``).
    K : (s, n); V : (ROS_NV, n); kd1 : (1 + n_dense, n); Jm, Wm : (n, n); piv : int64 (n,)
        Scratch.
    cf : (ROS_CF_SIZE,) float64; ci : (ROS_CI_SIZE,) int64
        The carry: zeros for a fresh start. After NEED_STORAGE call again with
        the same carry, ``u`` and ``save_u``, and larger ``ts``, ``us``, ``kd``
        holding the stored steps, to continue where the loop stopped.
        ``ci[:5]``: nfev, njac, nlu, accepted steps, rejected steps.

    Returns
    -------
    int
        A status code of `sciml.solvers.base`.
    """
    n = u.shape[0]
    nh = H.shape[0]
    ns = save_t.shape[0]
    nseg = stops.shape[0] - 1
    tf = stops[nseg]
    cap = kd.shape[0]
    f0 = V[ROS_F0]
    dT = V[ROS_DT]
    U = V[ROS_U]
    r = V[ROS_R]
    unew = V[ROS_UNEW]
    eps = 2.220446049250313e-16

    if ci[ROS_CI_STARTED] == 0:
        ci[ROS_CI_STARTED] = 1
        t = stops[0]
        bp = com_apply_boluses(u, 0, bolus_k, bolus_i, bolus_a, 0)
        sp = 0
        while sp < ns and save_t[sp] <= t:
            save_u[sp, :] = u
            sp += 1
        if store:
            ts[0] = t
            us[0, :] = u
        ci[ROS_CI_BOLUS] = bp
        ci[ROS_CI_SAVED] = sp
        cf[ROS_CF_T] = t
        cf[ROS_CF_H] = h_init
        cf[ROS_CF_LOGPREV] = COM_LOG_ERR0
    t = cf[ROS_CF_T]
    h = cf[ROS_CF_H]
    log_prev = cf[ROS_CF_LOGPREV]
    nfev = ci[ROS_CI_NFEV]
    njac = ci[ROS_CI_NJAC]
    nlu = ci[ROS_CI_NLU]
    nacc = ci[ROS_CI_NACC]
    nrej = ci[ROS_CI_NREJ]
    nst = ci[ROS_CI_NSTEP]
    sp = ci[ROS_CI_SAVED]
    bp = ci[ROS_CI_BOLUS]
    k = ci[ROS_CI_SEG]

    status = COM_SUCCESS
    fresh = True  # J, f, df/dt to be evaluated at (t, u)
    rejected = False
    nonfinite = False
    while k < nseg:
        if nacc + nrej >= max_steps:
            status = COM_MAX_STEPS
            break
        if store and nst >= cap:
            status = COM_NEED_STORAGE
            break
        rate = seg_rate[k]
        if fresh:
            # Evaluated once per accepted state; every retry of the step reuses them.
            com_rhs(f0, u, p, t, ws, rate)
            nfev += 1
            if not com_all_finite(f0):
                status = COM_NONFINITE
                break
            jac_into(Jm, u, p, t, ws)
            njac += 1
            if nonauto:
                # Forward: at a stop it looks into the segment the step will cover.
                t_fd = t + math.sqrt(eps) * max(1.0, abs(t))
                dt_fd = t_fd - t  # the difference actually represented
                com_rhs(dT, u, p, t_fd, ws, rate)
                nfev += 1
                for i in range(n):
                    dT[i] = (dT[i] - f0[i]) / dt_fd
            if not h > 0.0:  # first step, or after a bolus (see below)
                h_est = com_hinit(u, f0, p, t, ws, rate, rtol, atol, order, tf - t, U, r)
                nfev += 1
                h = h_est if h == 0.0 else min(-h, h_est)
            fresh = False

        h_try, lands = com_step_to(t, h, stops[k + 1])
        t_new = stops[k + 1] if lands else t + h_try
        if not t_new > t:  # the step no longer moves t
            status = COM_NONFINITE if nonfinite else COM_DT_UNDERFLOW
            break

        # W = I/(h gamma) - J, factored in place; singular only if 1/(h gamma) is an
        # eigenvalue of J, which a smaller step avoids.
        ihg = 1.0 / (h_try * gamma)
        for i in range(n):
            for j in range(n):
                Wm[i, j] = -Jm[i, j]
            Wm[i, i] += ihg
        nlu += 1
        singular = lu_factor_into(Wm, piv) != 0
        en = math.inf
        finite = False
        if not singular:
            nfev += ros_stages(K, Wm, piv, u, h_try, t, p, ws, rate, f0, dT, nonauto,
                               a, C, c, d, U, r)
            for i in range(n):
                acc = u[i]
                ee = 0.0
                for j in range(K.shape[0]):
                    acc += b[j] * K[j, i]
                    ee += e[j] * K[j, i]
                unew[i] = acc
                r[i] = ee
            en = com_err_norm(r, u, unew, rtol, atol)
            finite = com_all_finite(unew) and en == en
        if not adaptive:
            if not finite:
                status = COM_NONFINITE
                break
            en = 0.0
        elif not (finite and en <= 1.0):
            nrej += 1
            rejected = True
            nonfinite = not finite and not singular
            h = h_try * com_reject_factor(en if finite else math.inf, safety, qmin, beta1)
            if h < com_hmin(t):
                status = COM_NONFINITE if nonfinite else COM_DT_UNDERFLOW
                break
            continue

        if adaptive:
            h_next, log_prev = com_next_step(en, log_prev, h_try, h, rejected, lands, safety,
                                                  qmin, qmax, beta1, beta2)
        else:
            h_next = h_init
        nacc += 1

        # ---- accepted: dense data of the step, and output times inside it
        if store or (sp < ns and save_t[sp] < t_new):
            D = kd[nst] if store else kd1
            for i in range(n):
                D[0, i] = unew[i]
            for jh in range(nh):
                for i in range(n):
                    acc = 0.0
                    for j in range(K.shape[0]):
                        acc += H[jh, j] * K[j, i]
                    D[1 + jh, i] = acc
            while sp < ns and save_t[sp] < t_new:
                ros_dense_eval(save_u[sp], (save_t[sp] - t) / h_try, u, unew, D)
                sp += 1
        t = t_new
        for i in range(n):
            u[i] = unew[i]
        if lands:
            k += 1
            bp_before = bp
            bp = com_apply_boluses(u, k, bolus_k, bolus_i, bolus_a, bp)
            if adaptive and bp > bp_before:
                # The state jumped: cap the next step by a fresh estimate (a
                # negative h asks the next evaluation of f for it).
                h_next = -h_next
                log_prev = COM_LOG_ERR0
        while sp < ns and save_t[sp] <= t:
            save_u[sp, :] = u
            sp += 1
        if store:
            nst += 1
            ts[nst] = t
            us[nst, :] = u
        h = h_next
        rejected = False
        nonfinite = False
        fresh = True

    cf[ROS_CF_T] = t
    cf[ROS_CF_H] = h
    cf[ROS_CF_LOGPREV] = log_prev
    ci[ROS_CI_NFEV] = nfev
    ci[ROS_CI_NJAC] = njac
    ci[ROS_CI_NLU] = nlu
    ci[ROS_CI_NACC] = nacc
    ci[ROS_CI_NREJ] = nrej
    ci[ROS_CI_NSTEP] = nst
    ci[ROS_CI_SAVED] = sp
    ci[ROS_CI_BOLUS] = bp
    ci[ROS_CI_SEG] = k
    return status


# --- template end
