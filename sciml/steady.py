"""Steady states: ``u*`` with ``f(u*, p) = 0``, their exact gradients, and problems that
start from one (pre-equilibration).

The solve is Newton's method on the model's exact Jacobian, damped by backtracking
on the residual; where it does not converge, the problem is integrated over growing
spans until the right-hand side is below tolerance (the criterion AMICI uses: the
weighted RMS norm of ``f`` with ``atol + rtol |u|`` at most one), then polished by
Newton.

Conservation laws (mass-action networks conserve totals, so ``df/du`` is singular
and the steady state depends on where the system starts) are found as the left
null space ``C`` of the Jacobian at two points, and the system solved is
``f(u) = 0, C u = C u_start``: its Jacobian ``[J; C]`` has full column rank at a
regular steady state, and the same matrix gives the gradient.

Gradient (implicit function theorem): differentiating ``f(u*, p) = 0`` and
``C u* = C u_start`` gives ``[J; C] du* = [-f_p dp; C du_start]``, so for a
cotangent ``lam`` of ``u*``, with ``w = [J; C]^+T lam`` (one QR factorisation,
one triangular solve), ``lam^T du* / dp = -w_f^T f_p`` (one vector-Jacobian
product of the model) and ``lam^T du* / du_start = C^T w_C``.
"""

import warnings
from dataclasses import dataclass, field

import numpy as np

from ._validate import float_vector, positive_number
from .problem import ODEProblem
from .solution import SolveWarning

__all__ = ["SteadyState", "SteadyStateResult", "steady_state"]


class SteadyState:
    """The initial state of a problem as the steady state reached under other parameters
    (pre-equilibration): ``ODEProblem(model, u0=SteadyState(params=theta_pre), ...)``.

    Parameters
    ----------
    params : array_like, optional
        Flat parameters under which the system equilibrates. None (default): the
        problem's own parameters, and gradients flow through the steady state to them
        (implicit function theorem); an array is held fixed.
    u0 : array_like or callable, optional
        Where the equilibration starts (it fixes the conserved totals): an array, or
        initial values as a function of the parameters (``lambda p, nets: [...]``,
        traced as an ODEProblem's u0, and differentiated). Default: zeros.
    rtol, atol : float
        The steady-state criterion (see `steady_state`).
    """

    def __init__(self, params=None, u0=None, rtol=1e-8, atol=1e-10, max_iter=50):
        self.params = None if params is None else np.array(params, dtype=np.float64)
        self.start = u0
        self.rtol = positive_number("rtol", rtol, where="SteadyState")
        self.atol = positive_number("atol", atol, where="SteadyState")
        self.max_iter = int(max_iter)
        self._cache = None
        self._pre = None

    #: how `ODEProblem` recognises an initial state given this way (with `state` and
    #: `initial_vjp`; `initial_jacobian` optional)
    is_initial_state = True

    def state(self, prob, params):
        """The steady state for `prob` at the flat `params` (a new array)."""
        return self.result(prob, params).u.copy()

    def problem(self, prob):
        """The problem that equilibrates: `prob`'s model from this start (built once)."""
        pre = self._pre
        if pre is None or pre[0] is not prob.model or pre[1] != prob.tspan[0]:
            start = np.zeros(prob.model.n_states) if self.start is None else self.start
            q = ODEProblem(prob.model, start, (prob.tspan[0], prob.tspan[0] + 1.0),
                           prob.params if self.params is None else self.params)
            pre = self._pre = (prob.model, prob.tspan[0], q)
        return pre[2]

    def result(self, prob, params):
        """The `SteadyStateResult` for `prob` at the flat `params` (cached for the last)."""
        key = (id(prob), params.tobytes())
        c = self._cache
        if c is not None and c[0] == key:
            return c[1]
        pre = self.problem(prob)
        res = steady_state(pre, params=params if self.params is None else self.params,
                           rtol=self.rtol, atol=self.atol, max_iter=self.max_iter)
        if not res.converged:
            raise SteadyStateError(f"SteadyState: no steady state found ({res.message})")
        self._cache = (key, res)
        return res

    def initial_vjp(self, prob, params, ubar):
        """``ubar^T d u* / d params`` (zeros when `params` was given as an array)."""
        res = self.result(prob, params)
        if self.params is not None:
            return np.zeros(prob.model.n_params)
        gp, gs = res.vjp(ubar)
        return gp + res.problem.initial_vjp(res.params, gs)

    def __repr__(self):
        return f"SteadyState(params={'own' if self.params is None else 'fixed'})"


class SteadyStateError(RuntimeError):
    """No steady state was found where a problem needs one."""


@dataclass
class SteadyStateResult:
    """A steady state ``u`` (``f(u, p) = 0``).

    converged : bool; method : "newton" or "integrate" (integrated to near rest, then
    Newton); iterations : Newton iterations; residual : the weighted RMS norm of
    ``f(u)`` (at most 1 when converged); message : why not, when not; conserved : the
    conservation laws used (rows of C). ``vjp(lam)`` gives ``(lam^T du/dp,
    lam^T du/du_start)``.
    """

    u: np.ndarray
    converged: bool
    method: str
    iterations: int
    residual: float
    message: str = ""
    conserved: np.ndarray = field(default=None, repr=False)
    problem: ODEProblem = field(default=None, repr=False)
    params: np.ndarray = field(default=None, repr=False)
    t: float = field(default=0.0, repr=False)
    _qr: tuple = field(default=None, repr=False)

    def vjp(self, lam):
        """``(lam^T du*/dp (n_params,), lam^T du*/du_start (n_states,))`` by the implicit
        function theorem (see the module docstring)."""
        model = self.problem.model
        lam = np.asarray(lam, dtype=np.float64)
        if self._qr is None:
            J = model.jac(self.u, self.params, self.t)
            self._qr = np.linalg.qr(np.vstack([J, self.conserved]))
        Q, R = self._qr
        d = np.abs(np.diag(R))
        if d.size and d.min() > 1e-12 * d.max():
            from scipy.linalg import solve_triangular

            w = Q @ solve_triangular(R.T, lam, lower=True)
        else:
            # [J; C] is rank deficient: a state no rate depends on and no conservation law
            # fixes (its value at rest is where Newton left it, at its start); the least-
            # squares cotangent treats it so
            w = np.linalg.lstsq(np.vstack([model.jac(self.u, self.params, self.t),
                                           self.conserved]).T, lam, rcond=None)[0]
        n = model.n_states
        _, pbar = model.vjp(w[:n], self.u, self.params, self.t)
        return -pbar, self.conserved.T @ w[n:]


def steady_state(prob, params=None, solver=None, rtol=1e-8, atol=1e-10, max_iter=50,
                 max_time=1e8):
    """The steady state of `prob` (its model, parameters and initial state, which fixes
    any conserved totals): Newton on the exact Jacobian, else integration to rest.

    Parameters
    ----------
    prob : ODEProblem
    params : array_like, optional
        Flat parameters instead of the problem's.
    solver : sciml solver, optional
        For the integration fallback (default `Rodas5`).
    rtol, atol : float
        Converged when ``sqrt(mean((f_i / (atol + rtol |u_i|))^2)) <= 1``.
    max_iter : int
        Newton iterations per attempt.
    max_time : float
        How far the fallback integrates before giving up.

    Returns
    -------
    SteadyStateResult
    """
    if not isinstance(prob, ODEProblem):
        raise TypeError(f"steady_state: `prob` must be an ODEProblem, got {type(prob).__name__}")
    model = prob.model
    p = prob.params if params is None else float_vector(
        params, model.n_params, "steady_state", "params", f"shape ({model.n_params},) "
        "(model.n_params)")
    t = prob.tspan[0]
    rtol = positive_number("rtol", rtol, where="steady_state")
    atol = positive_number("atol", atol, where="steady_state")
    u_start = prob.initial_state(p)
    C = _conservation(model, u_start, p, t)
    c0 = C @ u_start

    def norm(u):
        return _wrms(model.rhs(u, p, t), u, rtol, atol)

    u, it, ok = _newton(model, u_start, p, t, C, c0, norm, max_iter)
    method = "newton"
    if not ok:
        method = "integrate"
        u, ok2, msg = _integrate(prob, p, solver, norm, rtol, atol, max_time)
        if ok2:
            u2, it2, ok = _newton(model, u, p, t, C, c0, norm, max_iter)
            it += it2
            if ok:
                u = u2
            else:
                ok = norm(u) <= 1.0
        else:
            res = SteadyStateResult(u, False, method, it, norm(u), msg, C, prob, p, t)
            return res
    r = norm(u)
    msg = "" if ok else f"the residual norm {r:.3g} stays above 1"
    return SteadyStateResult(u, bool(ok), method, it, r, msg, C, prob, p, t)


# ------------------------------------------------------------------ internals


def _wrms(f, u, rtol, atol):
    if f.size == 0:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        v = float(np.sqrt(np.mean((f / (atol + rtol * np.abs(u))) ** 2)))
    return v if np.isfinite(v) else np.inf


def _conservation(model, u, p, t):
    """Rows spanning the left null space of df/du at `u` and at a perturbed point: the
    conservation laws (a direction null at one point only is not one)."""
    n = model.n_states
    if n == 0:
        return np.zeros((0, 0))
    rng = np.random.default_rng(0)
    u2 = u + (0.1 + np.abs(u)) * rng.uniform(0.05, 0.15, n)
    J = np.hstack([model.jac(u, p, t), model.jac(u2, p, t)])
    if not np.all(np.isfinite(J)):
        return np.zeros((0, n))
    U, s, _ = np.linalg.svd(J)
    tol = max(J.shape) * np.finfo(float).eps * (s[0] if s.size and s[0] > 0 else 1.0) * 1e3
    rank = int(np.sum(s > tol))
    C = U[:, rank:].T
    if C.shape[0]:
        # a conservation law also annihilates f itself (J = 0 where f is a constant
        # source has a null space, but nothing is conserved)
        f = model.rhs(u, p, t)
        scale = np.max(np.abs(f)) if f.size else 0.0
        keep = np.abs(C @ f) <= 1e-8 * max(scale, 1e-300) + 1e-300
        C = C[keep] if np.all(keep) or scale > 0 else C
    return C


def _newton(model, u, p, t, C, c0, norm, max_iter):
    """Damped Gauss-Newton on ``[f(u); C u - c0] = 0``; returns ``(u, iterations, ok)``.

    Once the residual is within tolerance, steps go on while they shrink it (Newton's
    convergence is quadratic there: a step or two take it to rounding), so that the
    gradient, which assumes f(u*) = 0, is as exact as the solve.
    """
    u = u.copy()
    r = norm(u)
    done = 0
    for it in range(1, max_iter + 1):
        f = model.rhs(u, p, t)
        J = model.jac(u, p, t)
        A = np.vstack([J, C])
        F = np.concatenate([f, C @ u - c0])
        if not (np.all(np.isfinite(A)) and np.all(np.isfinite(F))):
            return u, it, False
        step = np.linalg.lstsq(A, -F, rcond=None)[0]
        lam = 1.0
        while lam > 1e-4:  # backtracking on the residual norm
            trial = u + lam * step
            rt = norm(trial)
            if rt < r:
                break
            lam *= 0.5
        else:
            return u, it, r <= 1.0
        u, r = trial, rt
        if r <= 1.0:
            done += 1
            if done >= 2 or r <= 1e-6:
                return u, it, True
    return u, max_iter, r <= 1.0


def _integrate(prob, p, solver, norm, rtol, atol, max_time):
    """Integrate from the initial state over spans 1, 10, 100, ... until at rest."""
    from .solve import solve
    from .solvers.rosenbrock import Rodas5

    solver = Rodas5() if solver is None else solver
    t0 = prob.tspan[0]
    u = prob.initial_state(p)
    span = 1.0
    t = t0
    while t - t0 < max_time:
        q = prob.remake(u0=u, tspan=(t, t + span), params=p)
        with warnings.catch_warnings():  # a failure is reported in the result instead
            warnings.simplefilter("ignore", SolveWarning)
            sol = solve(q, solver, rtol=rtol, atol=atol, saveat=np.array([t + span]),
                        max_steps=100_000)
        if sol.status_code != 0:
            return u, False, f"the integration to rest failed at t = {t:g}: {sol.status}"
        u = np.array(sol.u[-1])
        t += span
        if norm(u) <= 1.0:
            return u, True, ""
        span *= 10.0
    return u, False, f"not at rest by t = {max_time:g}"
