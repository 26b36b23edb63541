"""A loss and its gradient over a solve made of pieces: the segments between parameter
changes (`sciml.segments`) or between events (`sciml.events`).

One mechanism for both. Each piece is an ordinary problem for the compiled loops and
the sensitivity methods; what joins two pieces is a `Boundary`, which says how the state,
its forward sensitivities and the adjoint cross it:

- `Continue`: nothing happens (a look-ahead horizon's end);
- `ChangeAt`: parameters change; the state goes on, and a change whose time is a
  parameter adds ``(f_before - f_after)`` to that parameter's sensitivity;
- `EventAt`: an event's jump conditions (`sciml.events`).

The pieces are solved in turn (each from the state its boundary hands on), the loss is
taken once on all observations, and the backward passes run in reverse, each piece's
adjoint at its start crossing the boundary before it into the previous piece as a jump
at its end. Forward sensitivities instead carry S forward across each boundary.
"""

from dataclasses import replace

import numpy as np

import adjoints
from adjoints.forward import full_sensitivities

from .events import Carried, jump, run_events
from .segments import Segment, in_span, piece_problem, segments
from .solvers import common
from .solvers.kernels.observe import observe_along, observe_jumps

__all__ = ["observation_loss", "plan", "chained", "Continue", "ChangeAt", "EventAt"]


def observation_loss(job, data, loss, U, kern, pieces=None, rows=None):
    """Loss value, its gradient as adjoint jumps G (T, n), and direct parameter gradient.

    With `pieces` (and the observation `rows` of each), each observation's observables
    are computed under its piece's parameters (their gradient mapped back through it).
    For data whose rows share times (replicates) ``U`` holds each distinct time once
    (``job.obs_t``, `gradient._prepare`).
    """
    cols = data.columns(job.model)
    T, n = U.shape
    # rows sharing a time (replicates, `Data(repeated_times=True)`): the solve saved each
    # time once (``job.obs_t``); the loss sees every row, and the rows' dL/du at one time
    # add into that time's jump
    inv = np.searchsorted(job.obs_t, data.t) if data.repeated else None
    if data.kind == "states":
        value, ybar, pdir = loss((U if inv is None else U[inv])[:, cols], data, job.p,
                                 job.model)
        G = np.zeros((T, n))
        if inv is None:
            G[:, cols] = ybar
        else:
            np.add.at(G, (inv[:, None], cols[None, :]), ybar)
        return value, G, pdir
    if pieces is None:
        pieces, rows = [None], [np.arange(T)]
    model = job.model
    ws = model.workspace()
    Y = np.zeros((T, model.n_obs))
    for pc, idx in zip(pieces, rows):
        if idx.size:
            Yk = np.zeros((idx.shape[0], model.n_obs))
            observe_along(kern, job.p if pc is None else pc.p, ws, Yk, job.obs_t[idx],
                          np.ascontiguousarray(U[idx]))
            Y[idx] = Yk
    value, ybar, pdir = loss((Y if inv is None else Y[inv])[:, cols], data, job.p, model)
    Ybar = np.zeros_like(Y)
    if inv is None:
        Ybar[:, cols] = ybar
    else:
        np.add.at(Ybar, (inv[:, None], cols[None, :]), ybar)
    G = np.zeros((T, n))
    pobs = np.zeros(job.n_params)
    for pc, idx in zip(pieces, rows):
        if idx.size:
            Gk, pk = np.zeros((idx.shape[0], n)), np.zeros(job.n_params)
            observe_jumps(kern, job.p if pc is None else pc.p, ws, Gk, pk,
                          np.ascontiguousarray(Ybar[idx]), np.ascontiguousarray(U[idx]),
                          job.obs_t[idx], np.zeros(n))
            G[idx] = Gk
            if pc is None:
                pobs += pk
            else:
                pc.pull_back(pk, pobs)
    return value, G, pobs if pdir is None else pobs + pdir


# ------------------------------------------------------------------ boundaries


class Continue:
    """A boundary where nothing happens."""

    def state(self, u):
        return u

    def sensitivities(self, u, S):
        return S

    def adjoint(self, u, w, g):
        return w


class ChangeAt(Continue):
    """Parameters change from segment `before` to segment `after`, at the latter's start
    (whose ``time_param`` is the parameter that is the change's time, -1 for a fixed one)."""

    def __init__(self, model, before, after):
        self.model, self.before, self.after = model, before, after
        self.t, self.time_param = after.tspan[0], after.time_param

    def _df(self, u):
        return self.model.rhs(u, self.before.p, self.t) - self.model.rhs(u, self.after.p, self.t)

    def sensitivities(self, u, S):
        if self.time_param >= 0:
            S = S.copy()
            S[:, self.time_param] += self._df(u)
        return S

    def adjoint(self, u, w, g):
        if self.time_param >= 0:
            g[self.time_param] += w @ self._df(u)
        return w


class EventAt(Continue):
    """The events `fired` at time `t` (`sciml.events.jump` gives their derivatives);
    `u_plus`: the state after them, as the events' location found it."""

    def __init__(self, model, bound, fired, t, p, u_plus):
        self.model, self.bound, self.fired, self.t, self.p = model, bound, fired, t, p
        self.u_plus = u_plus
        self._J = None

    def _jump(self, u):
        if self._J is None:
            self._J = jump(self.model, self.bound, self.fired, u, self.p, self.t)
        return self._J

    def state(self, u):
        return self.u_plus

    def sensitivities(self, u, S):
        Au, Ap, At, g_u, g_p, den, fm, fp = self._jump(u)
        dtau = -(g_u @ S + g_p) / den
        return Au @ S + Ap + np.outer(Au @ fm + At - fp, dtau)

    def adjoint(self, u, w, g):
        Au, Ap, At, g_u, g_p, den, fm, fp = self._jump(u)
        dtau = w @ (Au @ fm + At - fp)
        g += Ap.T @ w - g_p * dtau / den
        return Au.T @ w - g_u * dtau / den


# ------------------------------------------------------------------ the chain


def plan(job):
    """``(pieces, boundaries)`` of a problem with parameter changes or events at ``job.p``
    (`segments.Segment`: span, parameters, the map back to the problem's, doses; one
    boundary fewer), or ``(message, None)`` if locating the events failed."""
    prob, model = job.prob, job.model
    if not prob.events:
        segs = segments(prob, job.p)
        return segs, [ChangeAt(model, a, b) for a, b in zip(segs, segs[1:])]
    found, msg = run_events(prob, job.solver, job.p, job.rtol, job.atol, job.dt,
                            job.max_steps)
    if msg:
        return msg, None
    if found[-1].t1 < prob.tspan[1] and job.obs_t[-1] > found[-1].t1:
        raise ValueError(f"loss_and_grad: observations after the terminal event at t = "
                         f"{found[-1].t1:g} (the last at {job.obs_t[-1]:g})")
    bound = [ev.bound(model) for ev in prob.events]
    every = np.arange(job.n_params)
    pieces = [Segment((pc.t0, pc.t1), job.p, every, pc.doses, -1) for pc in found]
    return pieces, [EventAt(model, bound, pc.fired, pc.t1, job.p, pc.u_plus) if pc.fired
                    else Continue() for pc in found[:-1]]


def chained(job, data, loss, sensealg, grad=True):
    """``(value, gradient)`` of `loss` over the solve of a problem with parameter changes
    or events, made of the pieces of `plan`; ``(message, None)`` if a solve fails."""
    pieces, boundaries = plan(job)
    if boundaries is None:
        return pieces, None
    prob, n = job.prob, job.n
    obs = job.obs_t
    forward = grad and sensealg.forward_mode
    jobs, states, rows, ends = [], [], [], []
    u0 = u_start = None
    try:
        for k, pc in enumerate(pieces):
            q = piece_problem(prob, pc.tspan, pc.p, pc.doses, u0)
            lo, hi = pc.tspan
            last = k == len(pieces) - 1
            idx = np.flatnonzero(in_span(obs, lo, hi, last))
            t_k = obs[idx] if last else np.append(obs[idx], hi)  # its end carries on
            jk = replace(job, prob=q, p=pc.p, sched=common.schedule(q), obs_t=t_k)
            st = sensealg.forward(jk) if grad else adjoints.values(jk)
            if st.status != 0:
                raise adjoints.SolveFailed(f"the forward solve of piece {k} stopped at t = "
                                           f"{st.t_end:g}")
            if forward:
                _to_problem_columns(sensealg, jk, st, pc, u_start)
            jobs.append(jk), states.append(st), rows.append(idx)
            if last:
                break
            u_end = np.array(st.u[-1])
            ends.append(u_end)
            b = boundaries[k]
            u0 = u_start = b.state(u_end)
            if forward:
                u0 = Carried(u_start, b.sensitivities(
                    u_end, full_sensitivities(st, job.n_params)[-1]))
    except adjoints.SolveFailed as e:
        return str(e), None
    U = np.empty((obs.shape[0], n))
    for st, idx in zip(states, rows):
        U[idx] = st.u[:idx.shape[0]]
    value, G, pdir = observation_loss(job, data, loss, U, states[0].sys.m.kern, pieces, rows)
    if not grad:
        return value, None
    g = np.zeros(job.n_params)
    w = None
    try:
        for k in range(len(pieces) - 1, -1, -1):
            jk, idx = jobs[k], rows[k]
            Gk = np.zeros((jk.obs_t.shape[0], n))
            Gk[:idx.shape[0]] = G[idx]
            if w is not None:
                Gk[-1] += w
            gk, w = sensealg.backward(jk, states[k], Gk)
            if forward:  # S is over the problem's parameters already, nothing to hand back
                g += gk
                w = None
                continue
            pieces[k].pull_back(gk, g)
            if k > 0:
                w = boundaries[k - 1].adjoint(ends[k - 1], w, g)
    except adjoints.SolveFailed as e:
        return str(e), None
    if pdir is not None:
        g = g + pdir
    if w is not None and prob.u0_function is not None:
        g = g + prob.initial_vjp(job.p, w)
    return value, g


def _to_problem_columns(sensealg, jk, st, seg, u_start):
    """Forward sensitivities of a piece over the problem's parameters instead of its own:
    where a change set entry i (to a number, or to parameter j), the piece's column i
    carries the forcing df/dp_i that belongs to no parameter (or to j). That forcing's
    response from zero, P_i (one more forward solve, for those columns only), is moved:
    S_i -= P_i (and S_j += P_i)."""
    over = np.flatnonzero(seg.source != np.arange(seg.source.shape[0]))
    wanted = np.zeros(seg.source.shape[0], dtype=bool)
    wanted[st.cols] = True  # only columns that are integrated, or feed one, need it
    src = seg.source[over]
    over = over[wanted[over] | ((src >= 0) & wanted[np.maximum(src, 0)])]
    if over.size == 0:
        return
    q = piece_problem(jk.prob, seg.tspan, seg.p, seg.doses, u_start)  # S0 = 0
    P = sensealg.prepare(replace(jk, prob=q), cols=over)(seg.p).S
    S = full_sensitivities(st, jk.n_params)
    for c, i in enumerate(over):
        S[:, :, i] -= P[:, :, c]
        if seg.source[i] >= 0:
            S[:, :, seg.source[i]] += P[:, :, c]
    st.S = S[:, :, st.cols]
