"""`sciml.fit`: fit a model's flat parameter vector to data in stages (Adam, then L-BFGS).

Each stage is an optimizer: a first-order one (``nets.Adam(lr, iters=N)``,
anything with ``init(p)`` / ``update(p, g)`` / ``iters``) is driven by a
Python loop that calls the gradient once per iteration; a minimizer
(``sciml.LBFGS(iters=N)``, anything with ``minimize(fun_and_grad, p,
callback)``) runs itself. The gradient is `sciml.loss_and_grad` (compiled
CPU path) or `sciml.jax.loss_and_grad` (JAX/diffrax, e.g. on a GPU).

The fit keeps the best parameters seen: an early stop, a target, a
callback, a non-finite loss or a Ctrl-C all end it with them.

A penalty can be added to the loss: ``l2=`` (weight decay on every
network's parameters) or ``penalty=`` (any ``theta -> (value, gradient)``,
e.g. decay on some layers only, or a prior on a mechanistic parameter).
The optimizers then minimise loss + penalty; the result reports both.
"""

import math
import numbers
import time
import warnings

import numpy as np

from nets import LBFGS

from ._tier import compiled_only, one_blas_thread
from ._validate import float_vector, integer, positive_int, positive_number
from .data import Data
from .problem import ODEProblem, problem_list

__all__ = ["fit", "FitResult", "FitWarning", "LBFGS"]

class FitWarning(RuntimeWarning):
    """A fit stage stopped early on a non-finite loss or gradient."""


class FitResult:
    """What `sciml.fit` returns.

    Attributes
    ----------
    params : ndarray, (n_params,)
        The best flat parameter vector found (lowest objective of every point
        the optimizers evaluated).
    loss : float
        The loss at `params`, without the penalty (what to compare with the
        noise in the data).
    penalty : float
        The penalty (``l2`` and ``penalty`` of `fit`) at `params`; 0.0 without one.
    objective : float
        What the optimizers minimised, at `params`: ``loss + penalty``.
    history : ndarray, (n_iters,)
        The objective (the loss, plus the penalty if any) at each iteration,
        all stages one after the other (for a first-order stage: at the
        iterate before its update; for L-BFGS: at each accepted iterate).
    history_stage : ndarray of int, (n_iters,)
        The stage (index into `stages`) of each entry of `history`.
    n_iters : int
        Iterations over all stages (``len(history)``).
    n_evals : int
        Loss-and-gradient evaluations (L-BFGS's line search evaluates more
        than once per iteration).
    stopped : str
        Why the fit ended: ``"done"`` (every stage ran to its iteration
        budget or converged), ``"early_stop"`` (the last stage made no
        progress for `patience` iterations), ``"target"`` (the loss reached
        `target`), ``"callback"`` (the callback returned True) or
        ``"interrupted"`` (KeyboardInterrupt).
    stages : list of dict
        One per stage that ran: ``optimizer`` (its repr), ``n_iters``,
        ``n_evals``, ``loss`` (best objective at the stage's end), ``stopped``
        (as above, plus ``"nonfinite"``) and ``time_s``.
    time_s : float
        Wall time of the whole fit.
    """

    def __init__(self, params, loss, history, history_stage, n_evals, stopped, stages, time_s,
                 setup, penalty=0.0):
        self.params = params
        self.loss = loss
        self.penalty = penalty
        self.objective = loss + penalty
        self.history = history
        self.history_stage = history_stage
        self.n_iters = int(history.shape[0])
        self.n_evals = int(n_evals)
        self.stopped = stopped
        self.stages = stages
        self.time_s = time_s
        self._setup = setup  # (probs, datas, solver, rtol, atol, max_steps, many) for plot()
        self._own_params = False  # plot each problem with its own params (population fits)

    def __repr__(self):
        pen = f", penalty={self.penalty:.6g}" if self.penalty else ""
        return (f"FitResult(loss={self.loss:.6g}{pen}, n_iters={self.n_iters}, "
                f"stopped={self.stopped!r}, stages={len(self.stages)}, "
                f"time_s={self.time_s:.3g})")

    def plot(self, prob=None, data=None, ax=None, path=None, n_points=400):
        """Plot the data (markers) against the fitted trajectory on a fine grid.

        Parameters
        ----------
        prob : ODEProblem or list of ODEProblem, optional
            The problem(s) to solve with the fitted `params` (their own
            parameters are not used); default: those given to the fit.
        data : Data or list of Data, optional
            Observations to draw, one per problem; default: those of the fit.
        ax : matplotlib Axes or sequence of Axes, optional
            Where to draw (one per problem); default: a new figure, a grid of
            panels for several problems.
        path : str or path-like, optional
            Also save the figure there (PNG, PDF, ... by its extension).
        n_points : int
            Points of the fine time grid of each trajectory.

        Returns
        -------
        matplotlib.figure.Figure
            Made without pyplot, so it works under any backend (Agg included)
            and leaves no open figures behind.
        """
        probs0, datas0, solver, rtol, atol, max_steps, _ = self._setup
        if prob is None:
            probs = list(probs0)
            datas = list(datas0) if data is None else _as_list(data, "data")
        else:
            probs = _as_list(prob, "prob")
            datas = _as_list(data, "data") if data is not None else [None] * len(probs)
        if len(datas) != len(probs):
            raise ValueError(f"plot: `data` has {len(datas)} entries for {len(probs)} "
                             "problem(s)")
        for i, p in enumerate(probs):
            if not isinstance(p, ODEProblem):
                raise TypeError(f"plot: `prob[{i}]` must be a sciml.ODEProblem, got "
                                f"{type(p).__name__}")
            if not self._own_params and p.model.n_params != self.params.shape[0]:
                raise ValueError(f"plot: `prob[{i}]` has {p.model.n_params} parameters, the "
                                 f"fit has {self.params.shape[0]}")
        for i, d in enumerate(datas):
            if d is not None and not isinstance(d, Data):
                raise TypeError(f"plot: `data[{i}]` must be a sciml.Data or None, got "
                                f"{type(d).__name__}")
        integer(n_points, "n_points", "plot", lo=2)
        from matplotlib.figure import Figure

        n = len(probs)
        if ax is None:
            ncols = min(n, math.ceil(math.sqrt(n)))
            nrows = math.ceil(n / ncols)
            fig = Figure(figsize=(4.5 * ncols, 3.2 * nrows), layout="constrained")
            axes = list(np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel())
            for extra in axes[n:]:
                extra.set_visible(False)
        else:
            axes = list(np.ravel(np.asarray(ax, dtype=object)))
            if len(axes) < n:
                raise ValueError(f"plot: `ax` has {len(axes)} axes for {n} problem(s)")
            fig = axes[0].figure
        from .solve import solve

        for i, (p, d, a) in enumerate(zip(probs, datas, axes)):
            _plot_one(a, p if self._own_params else p.remake(params=self.params), d, solve,
                      solver, rtol, atol, max_steps, n_points)
            if n > 1:
                a.set_title(f"problem {i}", fontsize=9)
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


def _as_list(x, name):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _plot_one(ax, prob, data, solve, solver, rtol, atol, max_steps, n_points):
    model = prob.model
    t0, tf = prob.tspan
    grid = np.linspace(t0, tf, n_points)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a partial solution is still worth drawing
        sol = solve(prob, solver, rtol=rtol, atol=atol, saveat=grid, max_steps=max_steps)
    if data is not None and data.kind == "observables":
        names = list(data.names)
        curves = [sol.observables[k] for k in names]
    else:
        cols = data.columns(model) if data is not None else range(model.n_states)
        names = [model.states[c] for c in cols]
        curves = [sol.u[:, c] for c in cols]
    colors = [f"C{j % 10}" for j in range(len(names))]
    for j, (name, y) in enumerate(zip(names, curves)):
        ax.plot(sol.t, y, color=colors[j], lw=1.5, label=f"{name} (fit)")
        if data is not None:
            m = data.mask[:, j]
            ax.plot(data.t[m], data.y[m, j], "o", color=colors[j], ms=3.5, alpha=0.8,
                    label=f"{name} (data)")
    ax.set_xlabel("t")
    ax.legend(fontsize=7, ncols=2 if len(names) > 2 else 1)


# ----------------------------------------------------------------------------- checks


def _check_problems(prob_or_list, data_or_list):
    probs, many = problem_list(prob_or_list, "fit: ", "prob_or_list", ": nothing to fit")
    n = probs[0].model.n_params
    for i, p in enumerate(probs[1:], 1):
        if p.model.n_params != n:
            raise ValueError(f"fit: every problem shares one parameter vector, but "
                             f"`prob_or_list[{i}]` has {p.model.n_params} parameters and "
                             f"`prob_or_list[0]` has {n}")
    dmany = isinstance(data_or_list, (list, tuple))
    datas = list(data_or_list) if dmany else [data_or_list]
    if many and not dmany:
        raise TypeError(f"fit: {len(probs)} problems need a list of as many sciml.Data in "
                        f"`data_or_list`, got {type(data_or_list).__name__}")
    if len(datas) != len(probs):
        raise ValueError(f"fit: `data_or_list` has {len(datas)} entries for {len(probs)} "
                         "problem(s); give one sciml.Data per problem")
    for i, d in enumerate(datas):
        if not isinstance(d, Data):
            where = f"`data_or_list[{i}]`" if dmany else "`data_or_list`"
            raise TypeError(f"fit: {where} must be a sciml.Data, got {type(d).__name__}")
    return probs, datas, many


def _check_optimizers(optimizers):
    if optimizers is None:
        from nets import Adam

        return [Adam(0.01, iters=300), LBFGS(iters=500)]
    if not isinstance(optimizers, (list, tuple)):
        optimizers = [optimizers]
    if not optimizers:
        raise ValueError("fit: `optimizers` is empty; give at least one, e.g. "
                         "[nets.Adam(0.01, iters=300), sciml.LBFGS(iters=500)]")
    for i, opt in enumerate(optimizers):
        first_order = callable(getattr(opt, "init", None)) and \
            callable(getattr(opt, "update", None))
        if not (first_order or callable(getattr(opt, "minimize", None))):
            raise TypeError(f"fit: `optimizers[{i}]` must be a nets optimizer (init/update, "
                            f"e.g. nets.Adam(0.01, iters=300)) or a minimizer "
                            f"(minimize, e.g. sciml.LBFGS(iters=500)); got {opt!r}")
        iters = getattr(opt, "iters", None)
        if first_order and not callable(getattr(opt, "minimize", None)) and iters is None:
            raise ValueError(f"fit: `optimizers[{i}]` ({opt!r}) has no iteration budget; "
                             f"give it one, e.g. nets.{type(opt).__name__}(..., iters=300)")
        integer(iters, f"optimizers[{i}].iters", "fit", optional=True)
    return list(optimizers)


def _check_params(params, probs):
    n = probs[0].model.n_params
    if params is None:
        return np.array(probs[0].params, dtype=np.float64)  # a copy: prob.params stays as is
    try:
        theta = np.array(params, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"fit: `params` must be a flat array of numbers, got "
                        f"{type(params).__name__}") from None
    return float_vector(theta, n, "fit", "params", f"shape ({n},) (model.n_params)")


# ----------------------------------------------------------------------------- objective


def _objective(backend, probs, datas, many, loss, solver, sensealg, rtol, atol, max_steps,
               threads):
    """theta -> (loss, gradient) on the chosen backend."""
    p_arg = probs if many else probs[0]
    d_arg = datas if many else datas[0]
    if backend == "numba":
        from .gradient import loss_and_grad

        def fun(theta):
            return loss_and_grad(p_arg, d_arg, loss=loss, solver=solver, sensealg=sensealg,
                                 rtol=rtol, atol=atol, params=theta, threads=threads,
                                 max_steps=max_steps)

        return fun
    if sensealg is not None:
        raise ValueError("fit: `sensealg` applies to backend='numba' only; the JAX backend "
                         "differentiates through diffrax itself")
    if threads is not None:
        raise ValueError("fit: `threads` applies to backend='numba' only (JAX places the "
                         "work itself)")
    try:
        from . import jax as sjax
    except ImportError as e:
        if not _jax_missing(e):
            raise  # a fault in sciml.jax or what it imports, not a missing install: as it is
        raise ImportError(f"fit: backend='jax' needs JAX and diffrax (pip install "
                          f"'sciml-nets[jax]'); importing sciml.jax failed: {e}") from e
    name = solver.name if solver is not None else "Tsit5"

    def fun(theta):
        val, g = sjax.loss_and_grad(p_arg, d_arg, loss=loss, solver=name, rtol=rtol, atol=atol,
                                    params=theta)
        return float(val), np.asarray(g, dtype=np.float64)

    return fun


_JAX_PACKAGES = ("jax", "jaxlib", "diffrax", "equinox")


def _jax_missing(e):
    """Whether an ImportError of ``import sciml.jax`` means that JAX or diffrax is absent
    (or sciml.jax itself), by the module it names or the one its cause names."""
    while isinstance(e, ImportError):
        name = e.name or ""
        if name == "sciml.jax" or name.split(".")[0] in _JAX_PACKAGES:
            return True
        e = e.__cause__
    return False


def _net_mask(model):
    """Boolean mask (n_params,) of every network parameter of `model` (weights and biases)."""
    mask = np.zeros(model.n_params, dtype=bool)
    slices = model.param_slices
    for name in model.nets:
        mask[slices[name]] = True
    return mask


def _penalty(l2, penalty, n, model):
    """``theta -> (value, gradient)`` of ``l2`` plus `penalty`, or None without either."""
    if penalty is not None and not callable(penalty):
        raise TypeError(f"fit: `penalty` must be callable(theta) -> (value, gradient) or None, "
                        f"got {type(penalty).__name__}")
    mask = None
    if l2 > 0:
        if model is None:
            raise ValueError("fit: `l2` needs the model's parameter layout; with `objective`, "
                             "put the decay in the objective or pass `penalty=`")
        mask = _net_mask(model)
        if not mask.any():
            raise ValueError(f"fit: `l2` = {l2:g} decays network parameters, but the model has "
                             "no network (use `penalty=` for mechanistic parameters)")
    if mask is None and penalty is None:
        return None

    def pen(theta):
        value, grad = 0.0, np.zeros(n)
        if mask is not None:
            w = theta[mask]
            value += l2 * float(w @ w)
            grad[mask] += 2.0 * l2 * w
        if penalty is not None:
            out = penalty(theta.copy())  # a copy: the callable cannot move the iterate
            try:
                pv, pg = out
                pv = float(pv)
                pg = np.asarray(pg, dtype=np.float64)
            except (TypeError, ValueError):
                raise TypeError(f"fit: `penalty(theta)` must return (value, gradient), a number "
                                f"and an array, got {type(out).__name__}") from None
            if pg.shape != (n,):
                raise ValueError(f"fit: the gradient `penalty(theta)` returned must have shape "
                                 f"({n},), like theta, got {pg.shape}")
            value += pv
            grad += pg
        return value, grad

    return pen


def _penalized(fun, pen):
    """`fun` plus the penalty; the third item, (loss, penalty), lets the result split them."""

    def total(theta):
        v, g = fun(theta)
        pv, pg = pen(theta)
        v = float(v)
        return v + pv, np.asarray(g, dtype=np.float64) + pg, (v, pv)

    return total


class _NonFinite(Exception):
    """Raised inside a stage to end it on a non-finite loss or gradient."""


class _State:
    """Bookkeeping shared by the stages: best point, history, stop rules, progress bar."""

    def __init__(self, theta, fun, callback, patience, min_delta, target, bar):
        self.fun = fun
        self.best = theta.copy()
        self.best_loss = math.inf
        self.best_parts = (math.inf, 0.0)  # (loss, penalty) at `best`
        self.history, self.stage_of = [], []
        self.n_evals = 0
        self.callback, self.patience, self.min_delta, self.target = (
            callback, patience, min_delta, target)
        self.bar = bar
        self.stage = 0
        self.reason = None  # why the current stage stops (set by `iteration`)

    def evaluate(self, theta):
        """Loss and gradient at `theta`; tracks the best point; non-finite -> _NonFinite."""
        out = self.fun(theta)
        self.n_evals += 1
        val = float(out[0])
        g = np.asarray(out[1], dtype=np.float64)
        if not (math.isfinite(val) and np.all(np.isfinite(g))):
            raise _NonFinite(val)
        if val < self.best_loss:
            self.best_loss = val
            self.best_parts = out[2] if len(out) > 2 else (val, 0.0)
            self.best[:] = theta
        return val, g

    def start_stage(self, k):
        self.stage = k
        self.reason = None
        self.ref = self.best_loss  # patience counts from the best loss at the stage's start
        self.stale = 0

    def iteration(self, theta, val):
        """Record one iteration; returns True when the fit or the stage must stop."""
        self.history.append(val)
        self.stage_of.append(self.stage)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{val:.4g}", best=f"{self.best_loss:.4g}",
                                 refresh=False)
        if self.target is not None and val <= self.target:
            self.reason = "target"
            return True
        if self.callback is not None and self.callback(len(self.history), theta.copy(),
                                                       val) is True:
            self.reason = "callback"
            return True
        if self.patience is not None:
            if val < self.ref - self.min_delta:
                self.ref, self.stale = val, 0
            else:
                self.stale += 1
                if self.stale >= self.patience:
                    self.reason = "early_stop"
                    return True
        return False


def _run_first_order(st, opt, theta):
    opt.init(theta)
    for _ in range(opt.iters):
        val, g = st.evaluate(theta)
        if st.iteration(theta, val):
            return
        opt.update(theta, g)
    st.evaluate(theta)  # the last update's point: it may be the best one


def _run_minimizer(st, opt, theta):
    def fun_and_grad(p):
        return st.evaluate(p)

    def cb(it, p, val):
        return st.iteration(p, float(val))

    with one_blas_thread():  # its products, of n_params, are too small to share
        opt.minimize(fun_and_grad, theta, cb)


def _bar(progress, optimizers):
    if not progress:
        return None
    from tqdm.auto import tqdm

    totals = [getattr(o, "iters", None) for o in optimizers]
    total = None if any(t is None for t in totals) else sum(totals)
    return tqdm(total=total, desc="fit", unit="it", dynamic_ncols=True)


# ----------------------------------------------------------------------------- fit


@compiled_only()  # reproducible: no interpreted first calls (see sciml._tier)
def fit(prob_or_list, data_or_list, optimizers=None, loss=None, solver=None, sensealg=None,
        rtol=1e-6, atol=1e-6, params=None, callback=None, progress=True, backend="numba",
        patience=None, min_delta=0.0, target=None, max_steps=100_000, threads=None,
        objective=None, l2=0.0, penalty=None):
    """Fit the flat parameter vector of one or several problems to observations.

    The stages in `optimizers` run one after the other, each starting from
    the best parameters found so far. The problems' own ``params`` are never
    modified; the result carries the fitted vector (``prob.remake(params=
    result.params)`` gives the fitted problem).

    Parameters
    ----------
    prob_or_list : ODEProblem or list of ODEProblem
        Several problems (subjects, experiments, initial conditions) share
        one parameter vector; their losses are summed.
    data_or_list : Data or list of Data
        One `sciml.Data` per problem.
    optimizers : optimizer or list of them, optional
        The stages. A first-order nets optimizer with an iteration budget
        (``nets.Adam(lr, iters=N)``, ``nets.AdamW``, ``nets.SGD``: anything
        with ``init(p)``, ``update(p, g)`` and ``iters``) runs in a Python
        loop, one gradient per iteration; a minimizer (``sciml.LBFGS(iters=N)``,
        scipy's L-BFGS-B: anything with ``minimize(fun_and_grad, p,
        callback)``) runs to its own convergence or budget. Default:
        ``[nets.Adam(0.01, iters=300), sciml.LBFGS(iters=500)]``.
    loss : sciml loss, optional
        ``sciml.SSE()`` (default) or ``sciml.GaussianNLL(...)``.
    solver : Solver, optional
        Default ``sciml.Tsit5()``. With ``backend="jax"`` the solver of the
        same name in diffrax is used.
    sensealg : adjoints method, optional
        How the gradient is computed (``adjoints.InterpolatingAdjoint()``,
        ``GaussAdjoint()``, ...); default: chosen by `sciml.loss_and_grad`.
    rtol, atol : float
        Solver tolerances for the forward and adjoint solves.
    params : array_like, (n_params,), optional
        Starting parameters (default: the first problem's ``params``).
    callback : callable, optional
        ``callback(iteration, params, loss)`` after every iteration
        (``iteration`` counts from 1 over all stages; ``params`` is a copy
        of the iterate); returning True stops the fit.
    progress : bool
        Show a progress bar with the current and best loss (tqdm).
    backend : {"numba", "jax"}
        Where the loss and gradient are computed. ``"numba"`` (default):
        `sciml.loss_and_grad`, the compiled CPU solvers and adjoints, best
        for small models. ``"jax"``: `sciml.jax.loss_and_grad`, the same
        model and parameter layout as a diffrax problem (needs
        ``pip install 'sciml-nets[jax]'``); it runs on JAX's default device,
        so on a machine with a GPU and a CUDA build of jaxlib changing this
        one argument moves the fit to the GPU. The optimizers stay on the
        host either way. `sensealg` and `threads` apply to "numba" only.
    patience : int, optional
        End a stage after this many iterations in a row without lowering
        the best loss so far by more than `min_delta` (the first iteration of
        the fit sets it); the next stage then starts from the best
        parameters. None (default): no early stop.
    min_delta : float
        The improvement `patience` asks for (>= 0).
    target : float, optional
        Stop the whole fit as soon as an iteration's loss is <= target.
    max_steps : int
        Solver steps allowed per solve.
    threads : int, optional
        Threads for a list of problems (default: all of numba's).
    objective : callable, optional
        ``objective(x) -> (loss, gradient)`` minimised instead of the loss of
        the problems (which then serve for plotting only), from ``params``
        (required, any length). `sciml.Population.fit` uses it.
    l2 : float
        Weight decay (>= 0): adds ``l2 * sum(w**2)`` over every network
        parameter of the model (weights and biases of each net; mechanistic
        parameters are left alone), the Gaussian prior of ridge
        regression. Default 0: none. Not with `objective` (use `penalty`).
    penalty : callable, optional
        ``penalty(theta) -> (value, gradient)`` added to the loss (with
        `l2`, both are): anything beyond plain weight decay, e.g. decay on
        some layers only, or a prior on a mechanistic parameter. It gets a
        copy of the iterate.

    Returns
    -------
    FitResult
        ``params`` (best found), ``loss``, ``history`` (loss per iteration,
        with ``history_stage``), ``n_iters``, ``stopped`` (``"done"``,
        ``"early_stop"``, ``"target"``, ``"callback"``, ``"interrupted"``),
        ``stages``, and ``plot()``.

    Notes
    -----
    With a penalty, the optimizers, the best-point tracking, ``history``,
    `patience` and `target` all see the objective, loss + penalty;
    ``result.loss`` is the loss alone at ``result.params``, ``result.penalty``
    the penalty there and ``result.objective`` their sum.

    A KeyboardInterrupt (Ctrl-C) during the fit returns the best parameters
    found so far with ``stopped == "interrupted"`` instead of losing them.
    A non-finite loss or gradient ends the current stage with a
    `FitWarning`; the next stage starts from the best parameters.

    Examples
    --------
    >>> result = sciml.fit(prob, data, optimizers=[nets.Adam(0.05, iters=300),
    ...                                            sciml.LBFGS(iters=500)])
    >>> result = sciml.fit(prob, data, backend="jax")     # the same fit through JAX/diffrax
    >>> fitted = prob.remake(params=result.params)
    """
    probs, datas, many = _check_problems(prob_or_list, data_or_list)
    optimizers = _check_optimizers(optimizers)
    rtol = positive_number("rtol", rtol)
    if not (isinstance(atol, numbers.Real) and not isinstance(atol, bool)):
        a = np.asarray(atol, dtype=np.float64) if not isinstance(atol, str) else None
        if a is None or a.ndim != 1 or not np.all(np.isfinite(a)) or not np.all(a > 0):
            raise ValueError(f"fit: `atol` must be a number > 0 or one per state, got {atol!r}")
    else:
        atol = positive_number("atol", atol)
    if objective is None:
        theta = _check_params(params, probs)
    else:
        if not callable(objective):
            raise TypeError(f"fit: `objective` must be callable(x) -> (loss, gradient), got "
                            f"{type(objective).__name__}")
        theta = np.array(params, dtype=np.float64) if params is not None else None
        if theta is None or theta.ndim != 1 or not np.all(np.isfinite(theta)):
            raise ValueError("fit: with `objective`, `params` must be the finite 1-D starting "
                             "point")
    if callback is not None and not callable(callback):
        raise TypeError(f"fit: `callback` must be callable(iteration, params, loss) or None, "
                        f"got {type(callback).__name__}")
    if not isinstance(progress, (bool, np.bool_)):
        raise TypeError(f"fit: `progress` must be True or False, got {progress!r}")
    if backend not in ("numba", "jax"):
        raise ValueError(f"fit: `backend` must be 'numba' or 'jax', got {backend!r}")
    patience = positive_int("patience", patience)
    min_delta = positive_number("min_delta", min_delta, allow_zero=True)
    if target is not None:
        if isinstance(target, bool) or not isinstance(target, numbers.Real) \
                or math.isnan(target):
            raise ValueError(f"fit: `target` must be a number or None, got {target!r}")
        target = float(target)
    max_steps = positive_int("max_steps", max_steps, optional=False)
    threads = positive_int("threads", threads)
    if loss is not None and not callable(loss):
        raise TypeError(f"fit: `loss` must be a sciml loss (e.g. sciml.SSE()), got {loss!r}")
    l2 = positive_number("l2", l2, allow_zero=True)
    fun = objective or _objective(backend, probs, datas, many, loss, solver, sensealg, rtol,
                                  atol, max_steps, threads)
    pen = _penalty(l2, penalty, theta.shape[0], None if objective else probs[0].model)
    if pen is not None:
        fun = _penalized(fun, pen)

    t_start = time.perf_counter()
    bar = _bar(progress, optimizers)
    st = _State(theta, fun, callback, patience, min_delta, target, bar)
    stages, stopped = [], "done"
    try:
        for k, opt in enumerate(optimizers):
            st.start_stage(k)
            n0, e0, t0 = len(st.history), st.n_evals, time.perf_counter()
            if bar is not None:
                bar.set_description(f"fit {k + 1}/{len(optimizers)} {type(opt).__name__}",
                                    refresh=False)
            work = st.best.copy()  # each stage starts from the best point so far
            reason = "done"
            try:
                try:
                    if callable(getattr(opt, "minimize", None)):
                        _run_minimizer(st, opt, work)
                    else:
                        _run_first_order(st, opt, work)
                    reason = st.reason or "done"
                except _NonFinite as e:
                    reason = "nonfinite"
                    warnings.warn(f"fit: stage {k} ({opt!r}) stopped at iteration "
                                  f"{len(st.history) - n0 + 1}: the loss or its gradient is "
                                  f"not finite (loss {e.args[0]!r}); keeping the best "
                                  f"parameters (loss {st.best_loss:.6g})", FitWarning,
                                  stacklevel=2)
            except KeyboardInterrupt:
                reason = "interrupted"
            stages.append({"optimizer": repr(opt), "n_iters": len(st.history) - n0,
                           "n_evals": st.n_evals - e0, "loss": st.best_loss,
                           "stopped": reason, "time_s": time.perf_counter() - t0})
            if reason in ("target", "callback", "interrupted"):
                stopped = reason
                break
            stopped = "early_stop" if reason == "early_stop" else "done"
    finally:
        if bar is not None:
            bar.close()
    if not math.isfinite(st.best_loss):
        if stopped == "interrupted":
            warnings.warn("fit: interrupted before any loss was computed; returning the "
                          "starting parameters", FitWarning, stacklevel=2)
        else:
            raise FloatingPointError("fit: the loss or its gradient is not finite at the "
                                     "starting parameters; nothing to optimise (check "
                                     "`params`, the tolerances and the data)")
    setup = (probs, datas, solver, rtol, atol, max_steps, many)
    loss_best, pen_best = st.best_parts
    if not math.isfinite(loss_best):  # interrupted before the first evaluation
        loss_best, pen_best = st.best_loss, 0.0
    return FitResult(st.best.copy(), float(loss_best), np.array(st.history, dtype=np.float64),
                     np.array(st.stage_of, dtype=np.int64), st.n_evals, stopped, stages,
                     time.perf_counter() - t_start, setup, penalty=float(pen_best))
