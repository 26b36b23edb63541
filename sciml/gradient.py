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

import numpy as np

import adjoints  # attributes read at call time: `adjoints` imports sciml's core

from ._jit import Threads
from ._validate import (
    atol_vector,
    check_atol,
    check_max_steps,
    check_rtol,
    float_vector,
)
from .chained import chained, observation_loss
from .data import Data
from .losses import SSE, ObservationLoss
from .problem import ODEProblem, problem_list
from .solution import SolveWarning
from .solvers import common
from .solvers.base import Solver
from .solvers.erk import ExplicitRK, Tsit5

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
    loss : sciml.losses.ObservationLoss, optional
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
    """The loss alone (no gradient): one forward solve per problem.

    As in `loss_and_grad`, a solve that stops early (its step limit, a step-size
    underflow, a non-finite state) issues a `SolveWarning` saying where and why, and the
    loss is infinite."""
    jobs, loss, _, _ = _prepare(prob, data, loss, solver, adjoints.GaussAdjoint(), rtol,
                                atol, params, 1, max_steps, dt, need_adaptive=False)
    total = 0.0
    for i, (job, d) in enumerate(jobs):
        if job.prob.events or job.prob.changes:
            v = chained(job, d, loss, adjoints.GaussAdjoint(), grad=False)[0]
        else:
            fw = adjoints.values(job)
            try:
                fw.check()
            except adjoints.SolveFailed as e:
                v = str(e)
            else:
                v = observation_loss(job, d, loss, fw.u, fw.sys.m.kern)[0]
        if isinstance(v, str):
            warnings.warn(f"loss_value: problem {i}: {v}; returning an infinite loss",
                          SolveWarning, stacklevel=2)
            return np.inf
        total += v
    return total


# ---------------------------------------------------------------- internals

_TSIT5 = Tsit5()
_F64 = np.dtype(np.float64)


def _lean(prob, data, loss, solver, sensealg, rtol, atol, params, threads, max_steps, dt):
    """The common case in one compiled call, or None when it does not apply.

    One plain problem (no doses, u0 an array), `SSE` on states, an ERK solver, and a
    method with such a call for them (`adjoints.SensitivityAlgorithm.lean`). Checks are
    cheap here; everything else falls back to the general path.
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
    if not isinstance(sensealg, adjoints.SensitivityAlgorithm):
        return None
    entry = sensealg.lean(solver, model)
    if entry is None:
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

    def backward_control(n_err):
        return _control(solver, rtol, atol_vector(float(np.min(atol_v)), n_err), None,
                        max_steps + 200 * (obs_t.shape[0] + 2))

    status, value = entry(kern, tab, ctl, backward_control, args)
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
    """Many plain problems of one model in one parallel compiled call, for a method that has
    one (`adjoints.SensitivityAlgorithm.lean_many`), or None when that does not apply (see
    `_lean`)."""
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
    method = sensealg if sensealg is not None else adjoints.default_sensealg(model, solver)
    entry = method.lean_many(solver, model) \
        if isinstance(method, adjoints.SensitivityAlgorithm) else None
    if entry is None:
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
        entry(kern, solver.engine_tableau(), ctl, np.stack([p.u0 for p in probs]), Pm,
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
    if not isinstance(loss, ObservationLoss):
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
    for p, d in zip(probs, datas):
        d.columns(p.model)  # a clear error for unknown names, before any solve
        if d.kind == "observables":
            p.model.kernel_table("obs", "obs_vjp")
        # replicates (rows sharing a time): each time solved once, every row in the loss
        # (`chained.observation_loss`)
        jobs.append((adjoints.Job(
            p, p.params if theta is None else theta, common.schedule(p), solver, rtol,
            check_atol(atol, p.model.n_states), None if dt is None else float(dt), max_steps,
            np.unique(d.t) if d.repeated else d.t), d))
    nt = Threads(threads).n
    return jobs, loss, sensealg, min(nt, len(jobs))


def _one(job, data, loss, sensealg):
    if job.prob.events or job.prob.changes:
        return chained(job, data, loss, sensealg)
    try:
        state = sensealg.forward(job)
        value, G, pdir = observation_loss(job, data, loss, state.u, state.sys.m.kern)
        grad, lam0 = sensealg.backward(job, state, G)
    except adjoints.SolveFailed as e:
        return str(e), None
    if pdir is not None:
        grad = grad + pdir
    if lam0 is not None and job.prob.u0_function is not None:
        grad = grad + job.prob.initial_vjp(job.p, lam0)  # through u0(p)
    return value, grad
