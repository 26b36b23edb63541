"""Continuous adjoints: integrate the adjoint ODE backward, with four ways to get u and mu.

For a loss L = sum_q l_q(u(t_q)) and du/dt = f(u, p, t), the adjoint
lambda(t) = dL/du(t) obeys d lambda/dt = -lambda^T df/du between
observations and jumps by dl_q/du at each t_q; the gradient is
dL/dp = integral over [t0, tf] of lambda^T df/dp dt, and dL/du0 = lambda(t0).
(Pontryagin; for the modern use with neural ODEs: Chen, Rubanova, Bettencourt
& Duvenaud, NeurIPS 2018; the method family and its trade-offs: Ma, Dixit,
Gowda, Rackauckas et al., "A comparison of automatic differentiation and
continuous sensitivity analysis for derivatives of differential equation
solutions", IEEE HPEC 2021.) The methods differ in where u(t) comes from and
how the integral is taken; all run in `adj_solve` of the model's module.
"""

import numpy as np

from sciml.solvers.base import STATUS_TEXT
from sciml.solvers.erk import ExplicitRK
from sciml.solvers.rosenbrock import Rodas5

from ._forward import SolveFailed, forward, forward_problem, rodas_forward
from .base import SensitivityAlgorithm, _tol

# kinds of `adj_solve` (see sciml/solvers/_adj_template.py)
INTERP, BACKSOLVE, GAUSS, QUAD = 0, 1, 2, 3

__all__ = ["InterpolatingAdjoint", "BacksolveAdjoint", "GaussAdjoint", "QuadratureAdjoint"]


def _breaks(job):
    """Observation times and dose stops, sorted and unique (checkpoints)."""
    return np.unique(np.concatenate([job.obs_t, job.sched.stops]))


def _run(job, kind, method, d, stops, seg_rate, bolus_k, bolus_i, bolus_a, obs_t, G, z, pbar,
         n_err, anchor=None, h0=0.0, qx=None, qw=None, quad_tol=None):
    """Call `adj_solve` with buffers sized for ``kind``; raises SolveFailed on a bad status."""
    n, npar = job.n, job.n_params
    A, b, e, c, P, n_step, end_stage = job.tableau()
    rtol, atol = method._tols(job)
    s = job.solver
    nz = z.shape[0]
    stats = np.zeros(3, dtype=np.int64)
    no2 = np.zeros((0, n))
    qx = np.zeros(0) if qx is None else qx
    qw = np.zeros(0) if qw is None else qw
    status = job.mod.adj_solve(
        kind, A, b, e, c, P, n_step, end_stage,
        d.d_t, d.d_u, d.d_k, d.d_have, d.d_seg, d.n_steps,
        stops, seg_rate, bolus_k, bolus_i, bolus_a,
        obs_t, G, no2 if anchor is None else anchor, anchor is not None, np.zeros((0, nz)),
        job.p, job.ws, z, pbar,
        rtol, atol, h0, job.max_steps, s.safety, s.qmin, s.qmax, s.beta1, s.beta2,
        n_err, qx, qw, rtol if quad_tol is None else quad_tol,
        np.zeros((P.shape[0], nz)), np.zeros((3, nz)), np.zeros((4, n)), np.zeros(npar),
        np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((3, npar)), np.zeros((16, 3)), stats)
    if status != 0:
        raise SolveFailed(f"{type(method).__name__}: the backward solve failed: "
                          f"{STATUS_TEXT.get(int(status), status)}")
    return stats


def _last_step(d):
    return float(d.d_t[d.n_steps] - d.d_t[d.n_steps - 1]) if d.n_steps > 0 else 0.0


class _DenseForward(SensitivityAlgorithm):
    """Shared forward pass: the solve at the observation times with its steps stored."""

    def forward(self, job):
        return forward_problem(job, job.obs_t, dense=True).check()


class InterpolatingAdjoint(_DenseForward):
    """Backward [lambda, mu] with u(t) from the forward solve's dense output.

    The robust default of SciMLSensitivity (InterpolatingAdjoint): u is never
    integrated backward, so it is right even for dynamics that are unstable in
    reverse time. Costs one vector-Jacobian product per stage of the backward
    solve plus the memory of the forward steps.

    Parameters
    ----------
    checkpointing : bool
        False: keep every forward step. True: keep only the states at
        checkpoints (the observation times and dose times) and re-solve each
        interval forward, with its steps, just before integrating back over
        it: memory bounded by the steps of one interval, for one extra forward solve.
    error_on_params : bool
        Include mu (the parameter integral) in the backward error control
        (default, as SciMLSensitivity does); False controls lambda only
        (fewer steps, mu then as accurate as lambda's steps make it).
    rtol, atol : float, optional
        Tolerances of the backward solve (default: the forward solve's).
    """

    def __init__(self, checkpointing=False, error_on_params=True, rtol=None, atol=None):
        super().__init__(rtol, atol)
        self.checkpointing = bool(checkpointing)
        self.error_on_params = bool(error_on_params)

    def __repr__(self):
        return f"InterpolatingAdjoint(checkpointing={self.checkpointing})"

    def forward(self, job):
        if not self.checkpointing:
            return super().forward(job)
        br = _breaks(job)
        fw = forward_problem(job, br, dense=False).check()
        fw.breaks = br
        fw.u_breaks = fw.u
        fw.u = fw.u[np.searchsorted(br, job.obs_t)]
        return fw

    def backward(self, job, state, G):
        n, npar = job.n, job.n_params
        z = np.zeros(n + npar)
        pbar = np.zeros(npar)
        n_err = n + npar if self.error_on_params else n
        s = job.sched
        if not self.checkpointing:
            _run(job, INTERP, self, state, s.stops, s.seg_rate, s.bolus_k, s.bolus_i, s.bolus_a,
                 job.obs_t, G, z, pbar, n_err, h0=_last_step(state))
        else:
            br, ub = state.breaks, state.u_breaks
            no_i, no_f = np.zeros(0, dtype=np.int64), np.zeros(0)
            h0 = 0.0
            for i in range(br.shape[0] - 2, -1, -1):
                lo, hi = br[i], br[i + 1]
                stops = np.array([lo, hi])
                k = min(int(np.searchsorted(s.stops, lo, side="right")) - 1,
                        s.seg_rate.shape[0] - 1)
                rate = s.seg_rate[k:k + 1]
                d = forward(job, ub[i], stops, rate, no_i, no_i, no_f, no_f, dense=True).check()
                sel = (job.obs_t > lo) & (job.obs_t <= hi) if i > 0 else \
                    (job.obs_t >= lo) & (job.obs_t <= hi)
                _run(job, INTERP, self, d, stops, rate, no_i, no_i, no_f, job.obs_t[sel],
                     np.ascontiguousarray(G[sel]), z, pbar, n_err, h0=h0 or _last_step(d))
        pbar += z[n:]
        return pbar, z[:n].copy()


class BacksolveAdjoint(SensitivityAlgorithm):
    """Backward [u, lambda, mu], u integrated backward from the final state.

    The original neural-ODE adjoint (Chen et al. 2018): memory O(1) in the
    number of steps, but u(t) solved in reverse time drifts from the forward
    trajectory, badly so when the dynamics are stable forward (unstable
    backward). Checkpointing re-anchors u to the forward states at the
    observation times, which fixes most of that.

    Parameters
    ----------
    checkpointing : bool
        Reset the backward u to the forward solution at each observation time.
    rtol, atol : float, optional
        Tolerances of the backward solve (default: the forward solve's).
    """

    def __init__(self, checkpointing=True, rtol=None, atol=None):
        super().__init__(rtol, atol)
        self.checkpointing = bool(checkpointing)

    def __repr__(self):
        return f"BacksolveAdjoint(checkpointing={self.checkpointing})"

    def forward(self, job):
        tf = job.sched.stops[-1]
        save = job.obs_t if job.obs_t[-1] == tf else np.append(job.obs_t, tf)
        fw = forward_problem(job, save, dense=False).check()
        fw.u_end = fw.u[-1].copy()
        fw.u = fw.u[:job.obs_t.shape[0]]
        return fw

    def backward(self, job, state, G):
        n, npar = job.n, job.n_params
        z = np.zeros(2 * n + npar)
        z[:n] = state.u_end
        pbar = np.zeros(npar)
        s = job.sched
        _run(job, BACKSOLVE, self, state, s.stops, s.seg_rate, s.bolus_k,  # (no stored steps)
             s.bolus_i, s.bolus_a, job.obs_t, G, z, pbar, 2 * n + npar,
             anchor=np.ascontiguousarray(state.u) if self.checkpointing else None)
        pbar += z[2 * n:]
        return pbar, z[n:2 * n].copy()


class GaussAdjoint(_DenseForward):
    """Backward lambda only; mu by Gauss-Legendre quadrature on each backward step.

    The parameter integral is never part of the ODE, so the backward solve
    controls the error of n numbers instead of n + n_params and its steps
    stay as large as lambda allows (SciMLSensitivity's GaussAdjoint). Each
    accepted step adds sum_k w_k h lambda(t_k)^T df/dp(u(t_k)) at
    Gauss-Legendre nodes, lambda from the step's interpolant and u from the
    forward dense output. Usually the fastest continuous adjoint with a
    network's many parameters.

    The one method for stiff problems: with ``solver=sciml.Rodas5()`` the
    backward lambda solve uses Rodas5 too, with the adjoint Jacobian
    J(u(t))^T, and u(t) comes from Rodas5's dense output.

    Parameters
    ----------
    nodes : int, optional
        Gauss-Legendre nodes per step (default: order // 2 + 1 of the solver,
        e.g. 3 for Tsit5, exact for polynomials of degree 5).
    rtol, atol : float, optional
        Tolerances of the backward solve (default: the forward solve's).
    """

    def __init__(self, nodes=None, rtol=None, atol=None):
        super().__init__(rtol, atol)
        if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int)
                                  or not 1 <= nodes <= 20):
            raise ValueError(f"GaussAdjoint: `nodes` must be None or an int in [1, 20], got "
                             f"{nodes!r}")
        self.nodes = nodes

    solvers = (ExplicitRK, Rodas5)

    def forward(self, job):
        if isinstance(job.solver, ExplicitRK):
            return super().forward(job)
        return rodas_forward(job, dense=True)

    def backward(self, job, state, G):
        n, npar = job.n, job.n_params
        m = self.nodes or job.solver.order // 2 + 1
        x, w = np.polynomial.legendre.leggauss(m)
        qx, qw = (x + 1) / 2, w / 2
        z = np.zeros(n)
        pbar = np.zeros(npar)
        s = job.sched
        if isinstance(job.solver, ExplicitRK):
            _run(job, GAUSS, self, state, s.stops, s.seg_rate, s.bolus_k, s.bolus_i, s.bolus_a,
                 job.obs_t, G, z, pbar, n, h0=_last_step(state), qx=qx, qw=qw)
            return pbar, z.copy()
        sv, tab = job.solver, job.solver._tab
        ts, us, kd = state.ros
        rtol, atol = self._tols(job)
        stp, nh = tab["a"].shape[0], tab["H"].shape[0]
        h0 = float(ts[-1] - ts[-2]) if ts.shape[0] > 1 else 0.0
        stats = np.zeros(3, dtype=np.int64)
        status = job.mod.adj_ros_gauss(
            tab["a"], tab["C"], tab["c"], tab["d"], tab["b"], tab["e"], tab["H"], tab["gamma"],
            ts, us, kd, ts.shape[0] - 1, s.stops, job.obs_t, G, job.p, job.ws, z, pbar,
            rtol, atol, h0, job.max_steps, sv.safety, sv.qmin, sv.qmax, sv.beta1, sv.beta2,
            qx, qw, np.zeros((stp, n)), np.zeros((6, n)), np.zeros((n, n)), np.zeros((n, n)),
            np.zeros(n, dtype=np.int64), np.zeros((1 + nh, n)), np.zeros(npar), stats)
        if status != 0:
            raise SolveFailed(f"GaussAdjoint: the stiff backward solve failed: "
                              f"{STATUS_TEXT.get(int(status), status)}")
        return pbar, z.copy()


class QuadratureAdjoint(_DenseForward):
    """Backward lambda only; mu by adaptive Gauss-Kronrod quadrature on each backward step.

    Like `GaussAdjoint`, but the integral of lambda^T df/dp over each step is
    taken by QUADPACK's 7-15 point Gauss-Kronrod pair, bisected until the two
    agree to ``quad_rtol``: the parameter integral gets its own error control
    (15 vector-Jacobian products per step at least, so slower; the choice when
    df/dp varies faster than lambda, or to check the other methods).

    Parameters
    ----------
    quad_rtol : float, optional
        Relative tolerance of the quadrature (default: the backward rtol).
    rtol, atol : float, optional
        Tolerances of the backward solve (default: the forward solve's).
    """

    def __init__(self, quad_rtol=None, rtol=None, atol=None):
        super().__init__(rtol, atol)
        self.quad_rtol = _tol("QuadratureAdjoint", "quad_rtol", quad_rtol)

    def backward(self, job, state, G):
        n, npar = job.n, job.n_params
        z = np.zeros(n)
        pbar = np.zeros(npar)
        s = job.sched
        _run(job, QUAD, self, state, s.stops, s.seg_rate, s.bolus_k, s.bolus_i, s.bolus_a,
             job.obs_t, G, z, pbar, n, h0=_last_step(state), quad_tol=self.quad_rtol)
        return pbar, z.copy()

