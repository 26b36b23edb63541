"""`sciml.loss_and_grad`: a loss on observations and its gradient over the flat parameters.

One (problem, data) pair runs: the method's forward pass (states at the
observation times), the loss there (and through the observables), the
loss's gradient as jumps of the adjoint, the method's backward pass. A list
of pairs runs in parallel threads (the compiled loops release the GIL), each
with its own workspace, and the results are summed in list order, so the
answer does not depend on the thread count.
"""

import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

import adjoints  # attributes read at call time: `adjoints` imports sciml's core
from adjoints.forward import full_sensitivities
from adjoints.kernels import backward as _lean_kernels

from ._jit import Threads
from ._validate import (
    atol_vector,
    check_atol,
    check_max_steps,
    check_rtol,
    float_vector,
)
from .data import Data
from .losses import SSE, Loss
from .problem import ODEProblem, problem_list
from .segments import doses_in, piece_problem, segment_problem, segments
from .solution import SolveWarning
from .solvers import common
from .solvers.base import Solver
from .solvers.erk import ExplicitRK, Tsit5
from .solvers.kernels.observe import observe_along, observe_jumps

__all__ = ["loss_and_grad", "loss_value"]


def loss_and_grad(prob, data, loss=None, solver=None, sensealg=None, rtol=1e-6, atol=1e-6,
                  params=None, threads=None, max_steps=100_000, dt=None, per_problem=False):
    """The loss of the solution(s) against data and its gradient over the flat parameters.

    Parameters
    ----------
    prob : ODEProblem or list of ODEProblem
        A list (subjects, initial conditions) shares the parameter vector;
        the value and gradient are sums over it, computed in parallel threads.
    data : Data or list of Data
        Observations, one `Data` per problem; times inside the problem's tspan.
    loss : sciml.losses.Loss, optional
        `SSE()` (default) or `GaussianNLL(sigma=...)`.
    solver : ExplicitRK, optional
        Tsit5() by default.
    sensealg : adjoints.SensitivityAlgorithm, optional
        How the gradient is computed; default `adjoints.default_sensealg`
        (stiff solver: GaussAdjoint; <= 16 parameters: ForwardSensitivity;
        <= 64 states: DiscreteAdjoint; else GaussAdjoint).
    rtol, atol : float
        Tolerances of the forward solve (and, unless the method sets its
        own, of the sensitivity solve).
    params : array_like, optional
        Flat parameters to use instead of each problem's ``params``.
    threads : int, optional
        Threads for a list of problems (default: numba's thread count).
    max_steps : int
        Step limit of each solve.
    dt : float, optional
        The step of a fixed-step solver (RK4, Euler: with DiscreteAdjoint).
    per_problem : bool
        Return one value and one gradient per problem (arrays (m,) and
        (m, n_params)) instead of their sums: what population fits with
        per-subject parameters need.

    Returns
    -------
    value : float
    grad : ndarray (n_params,)
        If a forward or backward solve fails (parameters for which the ODE
        blows up, say), a `SolveWarning` is issued and ``(inf, nan...)`` is
        returned, which optimisers treat as a failed step.
    """
    if isinstance(prob, (list, tuple)):
        lean = _lean_many(prob, data, loss, solver, sensealg, rtol, atol, params, threads,
                          max_steps, dt, per_problem)
        if lean is not None:
            return lean
    elif not per_problem:
        lean = _lean(prob, data, loss, solver, sensealg, rtol, atol, params, threads, max_steps,
                     dt)
        if lean is not None:
            return lean
    jobs, loss, sensealg, nt = _prepare(prob, data, loss, solver, sensealg, rtol, atol, params,
                                        threads, max_steps, dt)
    if len(jobs) == 1 or nt == 1:
        results = [_one(job, d, loss, sensealg) for job, d in jobs]
    else:
        with Threads(1), ThreadPoolExecutor(nt) as ex:
            results = list(ex.map(lambda jd: _one(jd[0], jd[1], loss, sensealg), jobs))
    npar = jobs[0][0].n_params
    if per_problem:
        values, grads = np.zeros(len(results)), np.zeros((len(results), npar))
        for i, (v, g) in enumerate(results):
            if isinstance(v, str):
                warnings.warn(f"loss_and_grad: problem {i}: {v}; its loss is infinite",
                              SolveWarning, stacklevel=2)
                values[i], grads[i] = np.inf, np.nan
            else:
                values[i], grads[i] = v, g
        return values, grads
    value = 0.0
    grad = np.zeros(npar)
    for i, (v, g) in enumerate(results):  # fixed order: same sum for any thread count
        if isinstance(v, str):
            warnings.warn(f"loss_and_grad: problem {i}: {v}; returning an infinite loss",
                          SolveWarning, stacklevel=2)
            return np.inf, np.full_like(grad, np.nan)
        value += v
        grad += g
    return value, grad


def loss_value(prob, data, loss=None, solver=None, rtol=1e-6, atol=1e-6, params=None,
               max_steps=100_000, dt=None):
    """The loss alone (no gradient): one forward solve per problem."""
    jobs, loss, _, _ = _prepare(prob, data, loss, solver, adjoints.GaussAdjoint(), rtol,
                                atol, params, 1, max_steps, dt, need_adaptive=False)
    total = 0.0
    for job, d in jobs:
        if job.prob.events:
            v = _with_events(job, d, loss, adjoints.GaussAdjoint(), grad=False)[0]
            if isinstance(v, str):
                return np.inf
            total += v
            continue
        if job.prob.changes:
            v = _segmented(job, d, loss, adjoints.GaussAdjoint(), grad=False)[0]
            if isinstance(v, str):
                return np.inf
            total += v
            continue
        fw = adjoints._forward.values(job)
        if fw.status != 0:
            return np.inf
        total += _loss(job, d, loss, fw.u, fw.sys.m.kern)[0]
    return total


# ---------------------------------------------------------------- internals

_TSIT5 = Tsit5()
_F64 = np.dtype(np.float64)


def _lean(prob, data, loss, solver, sensealg, rtol, atol, params, threads, max_steps, dt):
    """The common case in one compiled call (`adjoints.kernels.backward`), or None when it
    does not apply.

    One plain problem (no doses, u0 an array), `SSE` on states, an ERK solver, the
    discrete, interpolating or Gauss adjoint with default
    settings. Checks are cheap here; everything else falls back to the general path.
    """
    if not (type(prob) is ODEProblem and prob._plain and type(data) is Data
            and data.kind == "states" and threads is None and not data.repeated):
        return None
    solver = _lean_solver(loss, solver, rtol, atol, max_steps, dt)
    if solver is None:
        return None
    model = prob.model
    if sensealg is None:
        sensealg = adjoints.default_sensealg(model, solver)
    t = type(sensealg)
    if t is adjoints.DiscreteAdjoint:
        method = 0
    elif not isinstance(sensealg, adjoints.SensitivityAlgorithm) or not solver.adaptive \
            or sensealg.rtol is not None or sensealg.atol is not None:
        return None
    elif t is adjoints.InterpolatingAdjoint:
        method = 3 if sensealg.checkpointing else 1
    elif t is adjoints.GaussAdjoint:
        method = 2
    else:
        return None
    theta = prob.params
    if params is not None:
        theta = params
        if type(theta) is not np.ndarray or theta.dtype is not _F64 \
                or theta.shape != (model.n_params,) or not theta.flags.c_contiguous \
                or not np.all(np.isfinite(theta)):
            return None
    t0, tf = prob.tspan
    obs_t = data.t
    if obs_t[0] < t0 or obs_t[-1] > tf:
        return None  # the general path says what is wrong
    kern = model.kernel_table("rhs", "vjp")
    tab = solver.engine_tableau()
    atol_v = atol_vector(atol, prob.u0.shape[0])
    ctl = _control(solver, rtol, atol_v, dt, max_steps)
    grad = np.empty(model.n_params)
    stats = np.zeros(3, dtype=np.int64)
    args = (prob.u0, theta, (t0, tf), (obs_t, data.y_filled, data.w_masked, data.columns(model)),
            grad, stats)
    if method == 0:
        status, value = _lean_kernels.grad_discrete(kern, tab, ctl, *args)
    else:
        n_err = model.n_states  # mu in the backward error norm only when asked
        if method != 2 and sensealg.error_on_params:
            n_err += model.n_params
        ctl_b = _control(solver, rtol, atol_vector(float(np.min(atol_v)), n_err), None,
                         max_steps + 200 * (obs_t.shape[0] + 2))
        if method == 1:
            status, value = _lean_kernels.grad_interp(kern, tab, ctl, ctl_b, *args)
        elif method == 3:
            status, value = _lean_kernels.grad_interp_checkpointed(kern, tab, ctl, ctl_b, *args)
        else:
            status, value = _lean_kernels.grad_gauss(kern, tab, ctl, ctl_b,
                                                     sensealg.quadrature(solver), *args)
    if status != 0:
        return None  # the general path reruns it and reports the failure
    return value, grad


_CONTROLS = {}


def _control(solver, rtol, atol_v, dt, max_steps):
    """``solver.control(...)``, kept for the last few settings (built once, not per call)."""
    key = (id(solver), rtol, id(atol_v), dt, max_steps)
    ctl = _CONTROLS.get(key)
    if ctl is None or ctl[0] is not solver or ctl[1] is not atol_v:
        if len(_CONTROLS) > 64:
            _CONTROLS.clear()
        ctl = _CONTROLS[key] = (solver, atol_v, solver.control(rtol, atol_v, dt, max_steps))
    return ctl[2]


def _lean_many(probs, datas, loss, solver, sensealg, rtol, atol, params, threads, max_steps,
               dt, per_problem):
    """Many plain problems of one model with the discrete adjoint in one parallel compiled
    call (`grad_discrete_many`), or None when that does not apply (see `_lean`)."""
    if not (probs and isinstance(datas, (list, tuple)) and len(datas) == len(probs)):
        return None
    solver = _lean_solver(loss, solver, rtol, atol, max_steps, dt)
    if solver is None:
        return None
    model = getattr(probs[0], "model", None)
    cols = None
    for p, d in zip(probs, datas):
        if type(p) is not ODEProblem or not p._plain or p.model is not model \
                or type(d) is not Data or d.kind != "states" or d.repeated \
                or d.t[0] < p.tspan[0] or d.t[-1] > p.tspan[1]:
            return None
        c = d.columns(model)
        if cols is None:
            cols = c
        elif not np.array_equal(c, cols):
            return None
    if type(sensealg if sensealg is not None else adjoints.default_sensealg(model, solver)) \
            is not adjoints.DiscreteAdjoint:
        return None
    m, npar = len(probs), model.n_params
    if params is not None:
        theta = np.asarray(params, dtype=np.float64)
        if theta.shape != (npar,) or not np.all(np.isfinite(theta)):
            return None  # the general path says what is wrong
        Pm = np.repeat(theta[None, :], m, axis=0)
    else:
        Pm = np.stack([p.params for p in probs])
    if m == 1 and not per_problem:  # no thread start-up for one problem
        return _lean(probs[0], datas[0], loss, solver, sensealg, rtol, atol, params, None,
                     max_steps, dt)
    nt = Threads(min(Threads(threads).n, m))
    off = np.zeros(m + 1, dtype=np.int64)
    off[1:] = np.cumsum([len(d) for d in datas])
    grads, losses = np.zeros((m, npar)), np.zeros(m)
    status = np.zeros(m, dtype=np.int64)
    kern = model.kernel_table("rhs", "vjp")
    ctl = _control(solver, rtol, atol_vector(atol, model.n_states), dt, max_steps)
    data = (np.concatenate([d.t for d in datas]), np.concatenate([d.y_filled for d in datas]),
            np.concatenate([d.w_masked for d in datas]), cols)
    with nt:
        _lean_kernels.grad_discrete_many(
            kern, solver.engine_tableau(), ctl, np.stack([p.u0 for p in probs]), Pm,
            np.array([p.tspan for p in probs]), data, off, grads, losses, status)
    if np.any(status != 0):
        return None  # the general path reruns them and reports the failures
    if per_problem:
        return losses, grads
    value = 0.0
    for v in losses:  # in list order, as the general path
        value += v
    return value, grads.sum(axis=0)


def _lean_solver(loss, solver, rtol, atol, max_steps, dt):
    """The ERK solver of a lean path when the settings allow one (cheap checks), else None:
    `SSE`, float tolerances in range, an int step limit, a float ``dt`` for a fixed step."""
    if not ((loss is None or type(loss) is SSE) and type(rtol) is float
            and 1e-14 <= rtol < 1.0 and type(atol) is float and 0.0 < atol < np.inf
            and type(max_steps) is int and max_steps >= 1):
        return None
    solver = _TSIT5 if solver is None else solver
    if not isinstance(solver, ExplicitRK) or (not solver.adaptive and not (
            type(dt) is float and dt > 0.0)):
        return None
    return solver


def _prepare(prob, data, loss, solver, sensealg, rtol, atol, params, threads, max_steps, dt,
             need_adaptive=True):
    probs, many = problem_list(prob, "loss_and_grad: ")
    datas = list(data) if isinstance(data, (list, tuple)) else [data]
    if len(datas) != len(probs):
        raise ValueError(f"loss_and_grad: {len(probs)} problem(s) but {len(datas)} Data: give "
                         "one Data per problem")
    for i, (p, d) in enumerate(zip(probs, datas)):
        where = f"[{i}]" if many else ""
        if not isinstance(d, Data):
            raise TypeError(f"loss_and_grad: `data{where}` must be a sciml.Data, got "
                            f"{type(d).__name__}")
        d.check_span(p.tspan, where=f"loss_and_grad: data{where}")
    model = probs[0].model
    for i, p in enumerate(probs):
        if p.model.n_params != model.n_params:
            raise ValueError(f"loss_and_grad: problems must share one parameter vector; prob[{i}]"
                             f" has {p.model.n_params} parameters, prob[0] {model.n_params}")
    loss = SSE() if loss is None else loss
    if not isinstance(loss, Loss):
        raise TypeError(f"loss_and_grad: `loss` must be a sciml loss (SSE(), GaussianNLL(...)), "
                        f"got {type(loss).__name__}")
    solver = _TSIT5 if solver is None else solver
    if not isinstance(solver, Solver):
        raise TypeError(f"loss_and_grad: `solver` must be a sciml solver such as sciml.Tsit5() "
                        f"or sciml.Rodas5(), got {solver!r}")
    for i, p in enumerate(probs):
        if p.changes and p.events:
            raise ValueError(f"loss_and_grad: prob[{i}] has both events and parameter changes, "
                             "which is not supported yet")
    if sensealg is None:
        sensealg = adjoints.default_sensealg(model, solver)
    if not isinstance(sensealg, adjoints.SensitivityAlgorithm):
        raise TypeError(f"loss_and_grad: `sensealg` must be an adjoints method (e.g. "
                        f"adjoints.GaussAdjoint()), got {sensealg!r}")
    if need_adaptive:
        sensealg.check_solver(solver)
    sensealg.check_model(model, solver)
    if not solver.adaptive:
        if dt is None or isinstance(dt, bool) or not isinstance(dt, (int, float)) or dt <= 0:
            raise ValueError(f"loss_and_grad: the fixed-step {solver.name} needs `dt` > 0, got "
                             f"{dt!r}")
    rtol = check_rtol(rtol)
    max_steps = check_max_steps(max_steps)
    theta = None
    if params is not None:
        theta = float_vector(params, model.n_params, "loss_and_grad", "params",
                             f"length {model.n_params} (model.n_params)")
    jobs = []
    for i, (p, d) in enumerate(zip(probs, datas)):
        d.columns(p.model)  # a clear error for unknown names, before any solve
        if d.repeated:
            raise ValueError(f"loss_and_grad: `data`{f' [{i}]' if len(datas) > 1 else ''} has "
                             "rows sharing a time (replicates); merge them into their mean "
                             "(read_events(..., duplicates='mean')) or fit with sciml.nlme")
        if d.kind == "observables":
            p.model.kernel_table("obs", "obs_vjp")
        jobs.append((adjoints._forward.Job(
            p, p.params if theta is None else theta, common.schedule(p), solver, rtol,
            check_atol(atol, p.model.n_states), None if dt is None else float(dt), max_steps,
            d.t), d))
    nt = Threads(threads).n
    return jobs, loss, sensealg, min(nt, len(jobs))


def _loss(job, data, loss, U, kern):
    """Loss value, its gradient as adjoint jumps G (T, n), and direct parameter gradient."""
    cols = data.columns(job.model)
    T, n = U.shape
    if data.kind == "states":
        value, ybar, pdir = loss(U[:, cols], data, job.p, job.model)
        G = np.zeros((T, n))
        G[:, cols] = ybar
        return value, G, pdir
    model = job.model
    ws = model.workspace()
    U = np.ascontiguousarray(U)
    Y = np.zeros((T, model.n_obs))
    observe_along(kern, job.p, ws, Y, job.obs_t, U)
    value, ybar, pdir = loss(Y[:, cols], data, job.p, model)
    Ybar = np.zeros_like(Y)
    Ybar[:, cols] = ybar
    G = np.zeros((T, n))
    pobs = np.zeros(job.n_params)
    observe_jumps(kern, job.p, ws, G, pobs, Ybar, U, job.obs_t, np.zeros(n))
    return value, G, pobs if pdir is None else pobs + pdir


def _one(job, data, loss, sensealg):
    if job.prob.events:
        return _with_events(job, data, loss, sensealg)
    if job.prob.changes:
        return _segmented(job, data, loss, sensealg)
    try:
        state = sensealg.forward(job)
        value, G, pdir = _loss(job, data, loss, state.u, state.sys.m.kern)
        grad, lam0 = sensealg.backward(job, state, G)
    except adjoints.SolveFailed as e:
        return str(e), None
    if pdir is not None:
        grad = grad + pdir
    if lam0 is not None and job.prob.u0_function is not None:
        grad = grad + job.prob.initial_vjp(job.p, lam0)  # through u0(p)
    return value, grad


def _segmented(job, data, loss, sensealg, grad=True):
    """`_one` for a problem with parameter changes: its segments (`sciml.segments`) solved
    in turn, the loss on all their observations, then the backward passes in reverse, each
    segment's adjoint at its start handed to the one before as a jump at its end."""
    from .events import Carried

    prob, model, n = job.prob, job.model, job.n
    segs = segments(prob, job.p)
    obs = job.obs_t
    forward = grad and isinstance(sensealg, adjoints.ForwardSensitivity)
    jobs, states, rows = [], [], []
    u = u0 = None
    try:
        for k, seg in enumerate(segs):
            q = segment_problem(prob, seg, u0)
            lo, hi = seg.tspan
            last = k == len(segs) - 1
            idx = np.flatnonzero((obs >= lo) & ((obs < hi) | (last & (obs <= hi))))
            t_k = obs[idx] if last else np.append(obs[idx], hi)  # its end state carries on
            jk = replace(job, prob=q, p=seg.p, sched=common.schedule(q), obs_t=t_k)
            st = sensealg.forward(jk) if grad else adjoints._forward.values(jk)
            if st.status != 0:
                raise adjoints.SolveFailed(f"the forward solve of segment {k} stopped at t = "
                                           f"{st.t_end:g}")
            if forward:
                _to_problem_columns(sensealg, jk, st, seg, u)
            jobs.append(jk), states.append(st), rows.append(idx)
            u = np.array(st.u[-1])
            u0 = u
            if forward and not last:
                S = full_sensitivities(st, job.n_params)[-1]
                nxt = segs[k + 1]
                if nxt.time_param >= 0:  # the change moves with a parameter
                    S[:, nxt.time_param] += model.rhs(u, seg.p, hi) - model.rhs(u, nxt.p, hi)
                u0 = Carried(u, S)
    except adjoints.SolveFailed as e:
        return str(e), None
    U = np.empty((obs.shape[0], n))
    for st, idx in zip(states, rows):
        U[idx] = st.u[:idx.shape[0]]
    value, G, pdir = _segment_loss(job, data, loss, U, segs, rows, states)
    if not grad:
        return value, None
    g = np.zeros(job.n_params)
    w = None
    try:
        for k in range(len(segs) - 1, -1, -1):
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
            segs[k].pull_back(gk, g)
            if k > 0 and segs[k].time_param >= 0:  # the change moves with a parameter
                tau, ub = segs[k].tspan[0], states[k - 1].u[-1]
                g[segs[k].time_param] += w @ (model.rhs(ub, segs[k - 1].p, tau)
                                              - model.rhs(ub, segs[k].p, tau))
    except adjoints.SolveFailed as e:
        return str(e), None
    if pdir is not None:
        g = g + pdir
    if w is not None and prob.u0_function is not None:
        g = g + prob.initial_vjp(job.p, w)
    return value, g


def _to_problem_columns(sensealg, jk, st, seg, u_start):
    """Forward sensitivities of a segment over the problem's parameters instead of the
    segment's own: where a change set entry i (to a number, or to parameter j), the
    segment's column i carries the forcing df/dp_i that belongs to no parameter (or to j).
    That forcing's response from zero, P_i (one more forward solve, for those columns
    only), is moved: S_i -= P_i (and S_j += P_i)."""
    over = np.flatnonzero(seg.source != np.arange(seg.source.shape[0]))
    wanted = np.zeros(seg.source.shape[0], dtype=bool)
    wanted[st.cols] = True  # only columns that are integrated, or feed one, need it
    over = over[wanted[over] | ((seg.source[over] >= 0) & wanted[np.maximum(seg.source[over],
                                                                            0)])]
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


def _segment_loss(job, data, loss, U, segs, rows, states):
    """`_loss` with each observation's observables computed under its segment's parameters
    (their parameter gradient mapped back through the segment)."""
    if data.kind == "states" or len(segs) == 1:
        return _loss(job, data, loss, U, states[0].sys.m.kern)
    model = job.model
    cols = data.columns(model)
    ws = model.workspace()
    kern = states[0].sys.m.kern
    T, n = U.shape
    Y = np.zeros((T, model.n_obs))
    for seg, idx in zip(segs, rows):
        if idx.size:
            Yk = np.zeros((idx.shape[0], model.n_obs))
            observe_along(kern, seg.p, ws, Yk, job.obs_t[idx], np.ascontiguousarray(U[idx]))
            Y[idx] = Yk
    value, ybar, pdir = loss(Y[:, cols], data, job.p, model)
    Ybar = np.zeros_like(Y)
    Ybar[:, cols] = ybar
    G = np.zeros((T, n))
    pobs = np.zeros(job.n_params)
    for seg, idx in zip(segs, rows):
        if idx.size:
            Gk, pk = np.zeros((idx.shape[0], n)), np.zeros(job.n_params)
            observe_jumps(kern, seg.p, ws, Gk, pk, np.ascontiguousarray(Ybar[idx]),
                          np.ascontiguousarray(U[idx]), job.obs_t[idx], np.zeros(n))
            G[idx] = Gk
            seg.pull_back(pk, pobs)
    return value, G, pobs if pdir is None else pobs + pdir


def _with_events(job, data, loss, sensealg, grad=True):
    """`_one` for a problem with events (`sciml.events`): the pieces between them located
    at ``job.p``, solved in turn, the loss on all observations, then the backward passes in
    reverse with the adjoint's jump at each event (forward sensitivities jump forward)."""
    from .events import Carried, jump, run_events

    prob, model, n = job.prob, job.model, job.n
    pieces, msg = run_events(prob, job.solver, job.p, job.rtol, job.atol, job.dt,
                             job.max_steps)
    if msg:
        return msg, None
    bound = [ev.bound(model) for ev in prob.events]
    forward = isinstance(sensealg, adjoints.ForwardSensitivity)
    obs = job.obs_t
    end = pieces[-1]
    if end.t1 < prob.tspan[1] and obs[-1] > end.t1:
        raise ValueError(f"loss_and_grad: observations after the terminal event at t = "
                         f"{end.t1:g} (the last at {obs[-1]:g})")
    jobs, states, rows, jumps = [], [], [], []
    u0 = None
    try:
        for k, pc in enumerate(pieces):
            q = piece_problem(prob, (pc.t0, pc.t1), job.p, _piece_doses(prob, pc, k), u0)
            last = k == len(pieces) - 1
            idx = np.flatnonzero((obs >= pc.t0) & ((obs < pc.t1) | (last & (obs <= pc.t1))))
            t_k = obs[idx] if last else np.append(obs[idx], pc.t1)  # its end carries on
            jk = replace(job, prob=q, sched=common.schedule(q), obs_t=t_k)
            st = sensealg.forward(jk) if grad else adjoints._forward.values(jk)
            if st.status != 0:
                raise adjoints.SolveFailed(f"the forward solve of piece {k} stopped at t = "
                                           f"{st.t_end:g}")
            jobs.append(jk), states.append(st), rows.append(idx)
            if last:
                continue
            J = None  # a look-ahead boundary: the state goes on unchanged
            u_end = np.array(st.u[-1])
            if pc.fired:
                J = jump(model, bound, pc.fired, u_end, job.p, pc.t1)
                u_end = pc.u_plus
            jumps.append(J)
            u0 = u_end
            if forward and grad:
                S = full_sensitivities(st, job.n_params)[-1]
                if J is not None:
                    Au, Ap, At, g_u, g_p, den, fm, fp = J
                    dtau = -(g_u @ S + g_p) / den
                    S = Au @ S + Ap + np.outer(Au @ fm + At - fp, dtau)
                u0 = Carried(u_end, S)
    except adjoints.SolveFailed as e:
        return str(e), None
    U = np.empty((obs.shape[0], n))
    for st, idx in zip(states, rows):
        U[idx] = st.u[:idx.shape[0]]
    value, G, pdir = _loss(job, data, loss, U, states[0].sys.m.kern)
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
            g += gk
            if k > 0 and not forward and jumps[k - 1] is not None:  # across the event
                Au, Ap, At, g_u, g_p, den, fm, fp = jumps[k - 1]
                dtau = w @ (Au @ fm + At - fp)
                g += Ap.T @ w - g_p * dtau / den
                w = Au.T @ w - g_u * dtau / den
    except adjoints.SolveFailed as e:
        return str(e), None
    if pdir is not None:
        g = g + pdir
    if w is not None and prob.u0_function is not None:
        g = g + prob.initial_vjp(job.p, w)
    return value, g


def _piece_doses(prob, pc, k):
    """The single doses of a piece: boluses at its start only for the first."""
    from .problem import Bolus

    # (as `sciml.events.run_events` gives them: a bolus on a look-ahead boundary in the
    # piece that ends there)
    return tuple(d for d in doses_in(prob.doses, pc.t0, pc.t1, not pc.fired)
                 if not isinstance(d, Bolus) or d.time > pc.t0 or k == 0)
