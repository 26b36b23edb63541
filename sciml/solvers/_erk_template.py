"""The explicit Runge-Kutta integration loop (template), one for every tableau.

The tableau is an argument (arrays of a `ButcherTableau`), so a single
compiled loop per model serves Tsit5, DP5, BS3, Vern7, RK4 and Euler. It
calls the generated module's `rhs_into` (through `com_rhs`, which adds the
segment's infusion rate) and allocates nothing: every buffer is the
caller's, so the Python side can size them once (and grow them and run again
when the loop reports NEED_STORAGE).

Output: requested times (``save_t``) are filled by the method's interpolant
from inside the step that contains them, never by shortening steps; a time
equal to a stop is filled after that stop's boluses (right-continuous). With
``save_all`` every accepted step is saved instead. With ``dense`` each
accepted step's start time, start state and stages are stored, for
`erk_dense_eval`. Interpolants with extra stages (Vern7) get those computed
only for steps that contain an output time; `erk_dense_eval` computes and
keeps them on demand for the rest.

The lines between the template markers are pasted into every generated model
module (see `sciml._codegen.template_source`); names carry the ``erk_`` prefix.
"""

import math

import numpy as np
from numba import prange

from sciml._jit import borrow, jit, keep_alive, pjit
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
from sciml.solvers._stubs import N_PARAMS, N_STATES, WS_SIZE

# --- template begin


@jit
def erk_stages(K, u, h, t, p, ws, rate, A, c, first, last, tmp):
    """Stages ``first..last-1``: ``K[i] = f(t + c_i h, u + h sum_{j<i} A_ij K[j]) + rate``.

    K : (s, n), rows below ``first`` already filled; tmp : (n,) scratch.
    """
    n = u.shape[0]
    for i in range(first, last):
        for m in range(n):
            tmp[m] = u[m]
        for j in range(i):
            a = h * A[i, j]
            if a != 0.0:
                for m in range(n):
                    tmp[m] += a * K[j, m]
        com_rhs(K[i], tmp, p, t + c[i] * h, ws, rate)


@jit(inline="always")
def erk_combine(out, u, h, w, K, s):
    """``out = u + h * sum_{i<s} w[i] K[i]``."""
    n = out.shape[0]
    for m in range(n):
        out[m] = u[m]
    for i in range(s):
        a = h * w[i]
        if a != 0.0:
            for m in range(n):
                out[m] += a * K[i, m]


@jit(inline="always")
def erk_error(err, h, e, K, s):
    """Local error estimate ``err = h * sum_{i<s} e[i] K[i]``."""
    n = err.shape[0]
    for m in range(n):
        err[m] = 0.0
    for i in range(s):
        a = h * e[i]
        if a != 0.0:
            for m in range(n):
                err[m] += a * K[i, m]


@jit
def erk_interp(out, theta, h, u, K, P):
    """Interpolant on one step: ``out = u + h * sum_i b_i(theta) K[i]``.

    ``b_i(theta) = sum_j P[i, j] theta**(j + 1)`` over all rows of ``P`` (s_all, d).
    """
    n = u.shape[0]
    s, d = P.shape
    for m in range(n):
        out[m] = u[m]
    for i in range(s):
        w = 0.0
        for j in range(d - 1, -1, -1):
            w = w * theta + P[i, j]
        w *= theta * h
        if w != 0.0:
            for m in range(n):
                out[m] += w * K[i, m]


@jit
def erk_solve(A, b, e, c, P, n_step, end_stage, adaptive, order,
              u0, p, ws,
              stops, seg_rate, bolus_k, bolus_i, bolus_a,
              save_all, save_t, out_t, out_u,
              rtol, atol, dt, max_steps, safety, qmin, qmax, beta1, beta2,
              dense, d_t, d_u, d_k, d_have, d_seg,
              K, W, stats):
    """Integrate one problem over its schedule with an explicit Runge-Kutta tableau.

    Parameters
    ----------
    A, b, e, c, P : tableau: (s_all, s_all), (s_all,), (s_all,), (s_all,), (s_all, d)
        Stages, weights, error weights ``b - b_hat``, nodes, interpolant weights.
    n_step : int
        Stages per step (the rest are the interpolant's extra stages).
    end_stage : int
        Index of a stage equal to ``f(t + h, u_new)`` (the FSAL stage, or an
        extra stage), reused as the next step's first stage; -1 if none.
    adaptive : bool
        Error control (needs ``e``); otherwise fixed steps ``dt``.
    order : int
        Order of the method, for the starting step size.
    u0 : (n,); p : (n_params,); ws : the model's scratch vector.
    stops, seg_rate, bolus_k, bolus_i, bolus_a : the schedule (see `_common_template`).
    save_all : bool
        Save every accepted step into ``out_t``/``out_u`` (capacity = their
        length; NEED_STORAGE when full); otherwise fill ``out_u[i]`` at
        ``save_t[i]`` (sorted, inside the span).
    rtol : float; atol : (n,)
    dt : float
        Fixed step, or the first step of an adaptive solve (<= 0: Hairer's estimate).
    max_steps : int
        Accepted plus rejected steps allowed.
    safety, qmin, qmax, beta1, beta2 : float
        PI controller (see `com_next_step`).
    dense : bool
        Store each accepted step: ``d_t`` (cap + 1,) step start times and
        the final time, ``d_u`` (cap + 1, n) post-dose start states and final
        state, ``d_k`` (cap, s_all, n) stages, ``d_have`` (cap,) int8 (extra
        stages present), ``d_seg`` (cap,) int64 segment of the step.
    K : (s_all, n) stage buffer; W : (4, n) work rows.
    stats : (4,) int64, written: nfev, accepted steps, rejected steps, saved rows.

    Returns
    -------
    (status, t) : int, float
        A status code of `sciml.solvers.base` and the time reached.
    """
    n = u0.shape[0]
    s = n_step
    s_all = P.shape[0]
    u = W[0]
    unew = W[1]
    tmp = W[2]
    err = W[3]
    nseg = stops.shape[0] - 1
    tf = stops[nseg]
    t = stops[0]
    for m in range(n):
        u[m] = u0[m]
    bp = com_apply_boluses(u, 0, bolus_k, bolus_i, bolus_a, 0)
    k = 0
    rate = seg_rate[0]
    nfev = 0
    nacc = 0
    nrej = 0
    nsave = 0
    sp = 0
    ns = save_t.shape[0]
    if save_all:
        out_t[0] = t
        out_u[0, :] = u
        nsave = 1
    else:
        while sp < ns and save_t[sp] <= t:
            out_u[sp, :] = u
            sp += 1
    if dense:
        d_t[0] = t
        d_u[0, :] = u
    com_rhs(K[0], u, p, t, ws, rate)
    nfev += 1
    status = COM_SUCCESS
    if not com_all_finite(K[0]):
        status = COM_NONFINITE
        nseg = 0  # skip the loop
    h = dt
    if adaptive and not dt > 0.0:
        h = com_hinit(u, K[0], p, t, ws, rate, rtol, atol, order, tf - t, tmp, err)
        nfev += 1
    log_prev = COM_LOG_ERR0
    rejected = False
    nonfinite = False
    while k < nseg:
        if nacc + nrej >= max_steps:
            status = COM_MAX_STEPS
            break
        if (save_all and nsave >= out_t.shape[0]) or (dense and nacc >= d_k.shape[0]):
            status = COM_NEED_STORAGE
            break
        h_try, lands = com_step_to(t, h, stops[k + 1])
        t_new = stops[k + 1] if lands else t + h_try
        if not t_new > t:  # the step no longer moves t
            status = COM_NONFINITE if nonfinite else COM_DT_UNDERFLOW
            break
        erk_stages(K, u, h_try, t, p, ws, rate, A, c, 1, s, tmp)
        nfev += s - 1
        erk_combine(unew, u, h_try, b, K, s)
        if adaptive:
            erk_error(err, h_try, e, K, s)
            en = com_err_norm(err, u, unew, rtol, atol)
            finite = com_all_finite(unew) and en == en
            if not (finite and en <= 1.0):
                nrej += 1
                rejected = True
                nonfinite = not finite
                h = h_try * com_reject_factor(en if finite else math.inf, safety, qmin, beta1)
                if h < com_hmin(t):
                    status = COM_NONFINITE if nonfinite else COM_DT_UNDERFLOW
                    break
                continue
            h_next, log_prev = com_next_step(en, log_prev, h_try, h, rejected, lands, safety,
                                                  qmin, qmax, beta1, beta2)
        else:
            if not com_all_finite(unew):
                status = COM_NONFINITE
                break
            h_next = dt
        nacc += 1
        # ---- accepted: output inside the step, from the step's stages
        have_extra = False
        if not save_all and sp < ns and save_t[sp] < t_new:
            if s_all > s:
                erk_stages(K, u, h_try, t, p, ws, rate, A, c, s, s_all, tmp)
                nfev += s_all - s
                have_extra = True
            while sp < ns and save_t[sp] < t_new:
                erk_interp(out_u[sp], (save_t[sp] - t) / h_try, h_try, u, K, P)
                sp += 1
        if dense:
            j = nacc - 1
            rows = s_all if have_extra else s
            for i in range(rows):
                for m in range(n):
                    d_k[j, i, m] = K[i, m]
            d_have[j] = 1 if have_extra else 0
            d_seg[j] = k
        t = t_new
        for m in range(n):
            u[m] = unew[m]
        if lands:
            k += 1
            bp_before = bp
            bp = com_apply_boluses(u, k, bolus_k, bolus_i, bolus_a, bp)
            if k < nseg:
                # a dose boundary: rate and state may jump, so f afresh
                rate = seg_rate[k]
                com_rhs(K[0], u, p, t, ws, rate)
                nfev += 1
                if adaptive and bp > bp_before:
                    h_next = min(h_next, com_hinit(u, K[0], p, t, ws, rate, rtol, atol, order,
                                                   tf - t, tmp, err))
                    nfev += 1
                    log_prev = COM_LOG_ERR0
        elif end_stage >= 0 and (end_stage < s or have_extra):
            for m in range(n):
                K[0, m] = K[end_stage, m]
        else:
            com_rhs(K[0], u, p, t, ws, rate)
            nfev += 1
        h = h_next
        rejected = False
        nonfinite = False
        if save_all:
            out_t[nsave] = t
            out_u[nsave, :] = u
            nsave += 1
        else:
            while sp < ns and save_t[sp] <= t:
                out_u[sp, :] = u
                sp += 1
        if dense:
            d_t[nacc] = t
            d_u[nacc, :] = u
    stats[0] = nfev
    stats[1] = nacc
    stats[2] = nrej
    stats[3] = nsave if save_all else sp
    return status, t


# Layout of the packed tableau-and-controller vector of `erk_solve_saveat`
# (built once per solver object by `sciml.solvers.erk.ExplicitRK._packed`).
ERK_TAB_HEAD = 11  # s_all, d, n_step, end_stage, adaptive, order, safety, qmin, qmax, beta1, beta2
# The tail of `erk_solve_saveat`'s ``keep`` vector: t_end, nfev, n_accepted, n_rejected, n_saved.
ERK_KEEP_TAIL = 5


@jit(inline="always")
def erk_keep(keep, status, t_end, stats, save_t, u0, p, own_f, own_i):
    """Fill `erk_solve_saveat`'s ``keep`` (see there) and return ``status``.

    ``own_f, own_i``: the scratch buffers the loop borrowed from, alive until here.
    """
    keep_alive(own_f)
    keep_alive(own_i)
    ns = save_t.shape[0]
    n = u0.shape[0]
    for i in range(ns):
        keep[i] = save_t[i]
    for i in range(n):
        keep[ns + i] = u0[i]
    o = ns + n
    for i in range(p.shape[0]):
        keep[o + i] = p[i]
    o += p.shape[0]
    keep[o] = t_end
    for i in range(4):
        keep[o + 1 + i] = stats[i]
    return status


@jit
def erk_solve_saveat(tab, u0, p, save_t, out_u, keep, atol, t0, tf, rtol, dt, max_steps):
    """`erk_solve` for the common case (no doses, output at ``save_t``, no dense output).

    ``tab`` packs the tableau and the controller (``ERK_TAB_HEAD`` numbers, then A, b, e, c, P
    row-major); ``atol`` is a number or an (n,) array; every scratch buffer is allocated
    here. The values of the arguments are checked here (``save_t`` sorted inside
    ``[t0, tf]``, tolerances, ``dt``, ``max_steps``, shapes): status -1 when one is not as
    expected, with nothing solved, for the caller's full checks to name it.

    ``keep`` (T + n + n_params + ERK_KEEP_TAIL,) receives what a solution keeps besides
    ``out_u`` (T, n): copies of ``save_t``, ``u0`` and ``p``, then t_end, nfev, n_accepted,
    n_rejected and n_saved, so that the caller allocates two arrays and copies nothing.

    Returns
    -------
    status : int
    """
    ns = save_t.shape[0]
    n = N_STATES  # a constant: the small loops over states unroll
    if (u0.shape[0] != n or p.shape[0] != N_PARAMS or out_u.shape[0] != ns
            or out_u.shape[1] != n or keep.shape[0] != ns + n + N_PARAMS + ERK_KEEP_TAIL
            or not (rtol >= 1e-14 and rtol < math.inf) or not (dt >= 0.0 and dt < math.inf)
            or max_steps < 1 or not (t0 < tf and tf - t0 < math.inf)):
        return -1
    for i in range(ns):
        if not (save_t[i] >= t0 and save_t[i] <= tf) or (i > 0 and save_t[i] < save_t[i - 1]):
            return -1
    # Views below are not reference-counted (see `sciml._jit.borrow`): the caller holds
    # the arguments, and `erk_keep` keeps the two scratch buffers alive to the end.
    tab, u0, p, save_t, out_u, keep = (borrow(tab), borrow(u0), borrow(p), borrow(save_t),
                                       borrow(out_u), borrow(keep))
    s_all = int(tab[0])
    d = int(tab[1])
    o = ERK_TAB_HEAD
    A = tab[o:o + s_all * s_all].reshape((s_all, s_all))
    o += s_all * s_all
    b = tab[o:o + s_all]
    e = tab[o + s_all:o + 2 * s_all]
    c = tab[o + 2 * s_all:o + 3 * s_all]
    o += 3 * s_all
    P = tab[o:o + s_all * d].reshape((s_all, d))
    own_f = np.zeros(max(WS_SIZE, 1) + (s_all + 7) * n + 4)
    fbuf = borrow(own_f)
    ws = fbuf[:max(WS_SIZE, 1)]
    o = ws.shape[0]
    K = fbuf[o:o + s_all * n].reshape((s_all, n))
    o += s_all * n
    W = fbuf[o:o + 4 * n].reshape((4, n))
    o += 4 * n
    seg_rate = fbuf[o:o + n].reshape((1, n))
    o += n
    d_u = fbuf[o:o + n].reshape((1, n))
    o += n
    atol_v = fbuf[o:o + n]
    atol_v[:] = atol  # a number or one per state
    o += n
    for i in range(n):
        if not (atol_v[i] > 0.0 and atol_v[i] < math.inf):
            return -1
    stops = fbuf[o:o + 2]
    stops[0] = t0
    stops[1] = tf
    d_t = fbuf[o + 2:o + 3]
    none_f = fbuf[o + 3:o + 3]
    own_i = np.zeros(4, dtype=np.int64)
    ibuf = borrow(own_i)
    none_i = ibuf[:0]
    stats = ibuf[:4]
    d_k = K[:0].reshape((0, s_all, n))
    d_have = np.zeros(0, dtype=np.int8)  # empty: no step is stored
    status, t_end = erk_solve(A, b, e, c, P, int(tab[2]), int(tab[3]), tab[4] != 0.0,
                              int(tab[5]), u0, p, ws, stops, seg_rate, none_i, none_i, none_f,
                              False, save_t, none_f, out_u, rtol, atol_v, dt, max_steps,
                              tab[6], tab[7], tab[8], tab[9], tab[10],
                              False, d_t, d_u, d_k, d_have, none_i, K, W, stats)
    return erk_keep(keep, status, t_end, stats, save_t, u0, p, own_f, own_i)


@jit
def erk_dense_eval(out, tq, d_t, d_u, d_k, d_have, d_seg, n_steps, A, c, P, n_step,
                   p, ws, seg_rate, tmp):
    """Dense output at sorted times ``tq`` (q,) into ``out`` (q, n), from `erk_solve`'s storage.

    Right-continuous: a time equal to a step boundary uses the later step
    (post-dose state). Extra interpolant stages missing for a step are
    computed here (``p``, ``ws``, ``seg_rate`` as in the solve) and kept.
    ``tq`` must lie in ``[d_t[0], d_t[n_steps]]``.
    """
    s_all = P.shape[0]
    j = 0
    for q in range(tq.shape[0]):
        tt = tq[q]
        while j < n_steps and d_t[j + 1] <= tt:
            j += 1
        if j >= n_steps:
            out[q, :] = d_u[n_steps]
            continue
        h = d_t[j + 1] - d_t[j]
        if s_all > n_step and d_have[j] == 0:
            erk_stages(d_k[j], d_u[j], h, d_t[j], p, ws, seg_rate[d_seg[j]], A, c, n_step,
                       s_all, tmp)
            d_have[j] = 1
        erk_interp(out[q], (tt - d_t[j]) / h, h, d_u[j], d_k[j], P)


@pjit
def erk_solve_many(A, b, e, c, P, n_step, end_stage, adaptive, order,
                   U0, Pm, WS,
                   stops, st_off, seg_rate, bolus_k, bolus_i, bolus_a, b_off,
                   save_all, save_t, sv_off, out_t, out_u, o_off,
                   rtol, atol, dts, max_steps, safety, qmin, qmax, beta1, beta2,
                   dense, d_t, d_u, d_k, d_have, d_seg, d_off,
                   K, W, stats, status, t_end):
    """`erk_solve` for many problems of one model, in parallel (one workspace each).

    Per-problem arrays are stacked on a leading axis (``U0``, ``Pm``, ``WS``,
    ``dts``, ``K``, ``W``, ``stats``, ``status``, ``t_end``); ragged ones are
    concatenated with offsets: problem ``i`` owns ``stops[st_off[i]:st_off[i+1]]``
    and seg_rate rows ``st_off[i] - i .. st_off[i+1] - i - 1``, boluses
    ``b_off[i]:b_off[i+1]``, ``save_t[sv_off[i]:...]``, output rows
    ``o_off[i]:o_off[i+1]``, dense steps ``d_off[i]:d_off[i+1]`` (and
    ``d_off[i] + i : d_off[i+1] + i + 1`` for ``d_t``/``d_u``).
    """
    for i in prange(U0.shape[0]):
        st, te = erk_solve(
            A, b, e, c, P, n_step, end_stage, adaptive, order,
            U0[i], Pm[i], WS[i],
            stops[st_off[i]:st_off[i + 1]], seg_rate[st_off[i] - i:st_off[i + 1] - i - 1],
            bolus_k[b_off[i]:b_off[i + 1]], bolus_i[b_off[i]:b_off[i + 1]],
            bolus_a[b_off[i]:b_off[i + 1]],
            save_all, save_t[sv_off[i]:sv_off[i + 1]], out_t[o_off[i]:o_off[i + 1]],
            out_u[o_off[i]:o_off[i + 1]],
            rtol, atol, dts[i], max_steps, safety, qmin, qmax, beta1, beta2,
            dense, d_t[d_off[i] + i:d_off[i + 1] + i + 1], d_u[d_off[i] + i:d_off[i + 1] + i + 1],
            d_k[d_off[i]:d_off[i + 1]], d_have[d_off[i]:d_off[i + 1]],
            d_seg[d_off[i]:d_off[i + 1]],
            K[i], W[i], stats[i])
        status[i] = st
        t_end[i] = te


# --- template end
