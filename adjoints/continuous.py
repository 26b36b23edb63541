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
how the integral is taken; each is a system of `adjoints.kernels.systems`
integrated backward by the solver's own loop (explicit or Rosenbrock: with
`Rodas5` the backward solve is stiff too, with its exact Jacobian).

Error control of the backward solve. The loops control the error of the
leading ``n_err`` components of the state (`Control.atol` has that length):
lambda for `InterpolatingAdjoint` (z = [lambda, mu]), [u, lambda] for
`BacksolveAdjoint` (z = [u, lambda, mu]); mu, the running parameter integral,
is left out (``error_on_params=False``), as diffrax's ``adjoint_rms_seminorm``
does (Kidger, Chen & Lyons, "Hey, that's not an ODE: faster ODE adjoints via
seminorms", ICML 2021): it never feeds back, and held entry by entry to
``atol + rtol |mu_j|`` it can cost far more steps than lambda needs. Measured
on a FitzHugh-Nagumo UDE with a softplus network in place of the cubic term
(`fhn_ude` in tests/adjoints/test_matrix.py: 101 parameters, v runs away to
-1e8, rtol = atol = 1e-10, forward 447 steps), with mu in the norm:

- InterpolatingAdjoint took ~374,000 accepted and ~202,000 rejected backward
  steps (1.8 s; past the default step budget), all but ~2,100 of them for t
  in [2, 6], where the network's softplus units switch on as v enters their
  range: those entries of mu are exactly 0 before, then grow from ~1e-85 at a
  rate set by |v| (hundreds), so their own tolerances ask for steps of ~1e-5,
  while the gradient's entries are 6e13 to 5e17;
- BacksolveAdjoint failed before its first step ("step size underflow"): at
  tf mu = 0, so Hairer's starting-step estimate weighs mu's derivative (~1e15)
  by atol alone and proposes a step too small to move t = -20 (the
  interpolating adjoint starts from the forward's last step instead).

Without mu in the norm they take 482 and 480 steps (2-3 ms), as `GaussAdjoint` (482,
lambda only): not stiffness. mu is then integrated with lambda's steps by the
method's own weights, here within 1e-11 of `GaussAdjoint`'s quadrature.
"""

from dataclasses import replace

import numpy as np

from sciml._validate import optional_tolerance
from sciml.solvers.base import STATUS_TEXT
from sciml.solvers.common import Schedule
from sciml.solvers.kernels.structs import record

from .base import SensitivityAlgorithm
from .kernels import backward as _lean
from .kernels.backward import backward_schedule
from .kernels.systems import ROWS, Adjoint, Backsolve, Gauss, Interp, Quad
from .primal import SolveFailed, forward

__all__ = ["InterpolatingAdjoint", "BacksolveAdjoint", "GaussAdjoint", "QuadratureAdjoint"]

#: the backward step budget, beyond the forward's: steps per forward step and per stop
BUDGET_PER_STEP, BUDGET_PER_STOP = 50, 200

_NODES = {}  # Gauss-Legendre rules on [0, 1] by number of nodes


def _adjoint(job, state, G, stops=None, obs_t=None):
    """``(systems.Adjoint, backward stops)`` over the job's schedule (or ``stops``)."""
    stops_b, jump, fseg = backward_schedule(job.sched.stops if stops is None else stops,
                                            job.obs_t if obs_t is None else obs_t)
    n = job.n
    width = max(n, getattr(state.tab, "c", np.zeros(0)).shape[0]) + 1
    a = Adjoint(state.sys.m, state.sys, state.tab, state.rec, state.n_steps, fseg, jump,
                np.ascontiguousarray(G), np.zeros((ROWS, width)), np.zeros(job.n_params),
                np.zeros(1, dtype=np.int64), job.linear() if job.stiff else state.sys.lin,
                np.zeros(3))
    return a, stops_b


def _last_step(state):
    n = state.n_steps
    return float(state.rec.d_t[n] - state.rec.d_t[n - 1]) if n > 0 else 0.0


def integrate_backward(job, method, sys, stops_b, z, n_err, h0=0.0, n_forward=0):
    """Integrate a backward system with the job's solver; raises SolveFailed on failure."""
    rtol, atol = method._tols(job, n_err)
    budget = job.max_steps + BUDGET_PER_STEP * n_forward + BUDGET_PER_STOP * stops_b.shape[0]
    ctl = job.solver.control(rtol, atol, h0 or None, budget)
    rec = record(z.shape[0])
    status, _, _ = job.solver._loop()(sys, job.solver.engine_tableau(), ctl, stops_b, z, rec)
    if status != 0:
        raise SolveFailed(f"{type(method).__name__}: the backward solve failed: "
                          f"{STATUS_TEXT.get(int(status), status)}")
    return rec


class _Stored(SensitivityAlgorithm):
    """Shared forward pass: the solve at the observation times with its steps stored."""

    def needs(self, solver):
        return ("vjp",)  # a stiff solver's Jacobian is among its own kernels

    def forward(self, job):
        return forward(job, dense=True, needs=self.needs(job.solver)).check()


class InterpolatingAdjoint(_Stored):
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
        Include mu (the parameter integral) in the backward error control.
        Default False: the error norm covers lambda only (a seminorm, as
        diffrax's ``adjoint_rms_seminorm``; Kidger, Chen & Lyons, "Hey, that's
        not an ODE", ICML 2021). mu never feeds back into lambda, so its steps
        need not be controlled; controlled component by component, each
        entry of the gradient is held to its own ``atol + rtol |mu_j|``, and an
        entry that is tiny beside the others (a network unit switched off for
        part of the span, its integrand growing from 0) makes the steps tiny:
        see this module's notes. mu is then integrated with lambda's steps, as in
        `GaussAdjoint`.
    rtol, atol : float, optional
        Tolerances of the backward solve (default: the forward solve's).
    """

    def __init__(self, checkpointing=False, error_on_params=False, rtol=None, atol=None):
        super().__init__(rtol, atol)
        self.checkpointing = bool(checkpointing)
        self.error_on_params = bool(error_on_params)

    def __repr__(self):
        extra = ", error_on_params=True" if self.error_on_params else ""
        return f"InterpolatingAdjoint(checkpointing={self.checkpointing}{extra})"

    def lean(self, solver, model):
        if not solver.adaptive or self.rtol is not None or self.atol is not None:
            return None
        n_err = model.n_states + (model.n_params if self.error_on_params else 0)
        entry = (_lean.grad_interp_checkpointed if self.checkpointing else _lean.grad_interp)

        def run(kern, tab, ctl, backward_control, args):
            return entry(kern, tab, ctl, backward_control(n_err), *args)
        return run

    def forward(self, job):
        if not self.checkpointing:
            return super().forward(job)
        br = np.unique(np.concatenate([job.obs_t, job.sched.stops]))
        st = forward(replace(job, obs_t=br), dense=False, needs=self.needs(job.solver)).check()
        st.breaks, st.u_breaks = br, st.u
        st.u = st.u[np.searchsorted(br, job.obs_t)]
        return st

    def backward(self, job, state, G):
        n, npar = job.n, job.n_params
        z = np.zeros(n + npar)
        n_err = n + npar if self.error_on_params else n
        if not self.checkpointing:
            a, stops_b = _adjoint(job, state, G)
            integrate_backward(job, self, Interp(a), stops_b, z, n_err, _last_step(state),
                               state.n_steps)
            return z[n:].copy(), z[:n].copy()
        # one interval at a time, last first: re-solve it forward with its steps, then back
        br, ub = state.breaks, state.u_breaks
        s = job.sched
        for i in range(br.shape[0] - 2, -1, -1):
            lo, hi = br[i], br[i + 1]
            k = min(int(np.searchsorted(s.stops, lo, side="right")) - 1,
                    s.seg_rate.shape[0] - 1)
            sel = (job.obs_t > lo) & (job.obs_t <= hi) if i > 0 else \
                (job.obs_t >= lo) & (job.obs_t <= hi)
            sub = _interval(job, lo, hi, ub[i], s.seg_rate[k:k + 1], job.obs_t[sel])
            st = forward(sub, dense=True, needs=self.needs(job.solver)).check()
            a, stops_b = _adjoint(sub, st, G[sel])
            integrate_backward(sub, self, Interp(a), stops_b, z, n_err, _last_step(st),
                               st.n_steps)
        return z[n:].copy(), z[:n].copy()


class BacksolveAdjoint(SensitivityAlgorithm):
    """Backward [u, lambda, mu], u integrated backward from the final state.

    The original neural-ODE adjoint (Chen et al. 2018): memory O(1) in the
    number of steps, but u(t) solved in reverse time drifts from the forward
    trajectory, badly so when the dynamics are stable forward (unstable
    backward). Checkpointing re-anchors u to the forward states at the
    observation times, which fixes most of that. With `Rodas5` the backward
    solve uses the exact Jacobian of [u, lambda, mu], second derivatives
    included (the model's ``hvp`` kernel).

    Parameters
    ----------
    checkpointing : bool
        Reset the backward u to the forward solution at each observation time.
    error_on_params : bool
        Include mu in the backward error control (default False: the error norm
        covers [u, lambda], diffrax's ``adjoint_rms_seminorm``; see
        `InterpolatingAdjoint` and this module's notes).
    rtol, atol : float, optional
        Tolerances of the backward solve (default: the forward solve's).
    """

    def __init__(self, checkpointing=True, error_on_params=False, rtol=None, atol=None):
        super().__init__(rtol, atol)
        self.checkpointing = bool(checkpointing)
        self.error_on_params = bool(error_on_params)

    def __repr__(self):
        extra = ", error_on_params=True" if self.error_on_params else ""
        return f"BacksolveAdjoint(checkpointing={self.checkpointing}{extra})"

    def needs(self, solver):
        return ("vjp", "hvp") if solver.stiff else ("vjp",)

    def forward(self, job):
        return forward(job, dense=False, needs=self.needs(job.solver)).check()

    def backward(self, job, state, G):
        n, npar = job.n, job.n_params
        a, stops_b = _adjoint(job, state, G)
        # the boluses of each backward stop, to be taken back out of the backward u
        s = job.sched
        bt = s.stops[s.bolus_k] if s.bolus_k.size else np.zeros(0)
        kb = np.searchsorted(stops_b, -bt) if bt.size else np.zeros(0, dtype=np.int64)
        order = np.argsort(kb, kind="stable")
        counts = np.bincount(kb, minlength=stops_b.shape[0]) if bt.size else \
            np.zeros(stops_b.shape[0], dtype=np.int64)
        bol_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        sys = Backsolve(a, np.ascontiguousarray(state.u), self.checkpointing, bol_off,
                        s.bolus_i[order].astype(np.int64), s.bolus_a[order].astype(np.float64))
        z = np.zeros(2 * n + npar)
        z[:n] = state.z_end
        integrate_backward(job, self, sys, stops_b, z, 2 * n + (npar if self.error_on_params
                                                                 else 0))
        return z[2 * n:].copy(), z[n:2 * n].copy()


class GaussAdjoint(_Stored):
    """Backward lambda only; mu by Gauss-Legendre quadrature on each backward step.

    The parameter integral is never part of the ODE, so the backward solve
    controls the error of n numbers instead of n + n_params and its steps
    stay as large as lambda allows (SciMLSensitivity's GaussAdjoint). Each
    accepted step adds sum_k w_k h lambda(t_k)^T df/dp(u(t_k)) at
    Gauss-Legendre nodes, lambda from the step's interpolant and u from the
    forward dense output. Usually the fastest continuous adjoint with a
    network's many parameters, and the default with `Rodas5` for models with
    many parameters (the backward solve is then stiff too).

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

    def quadrature(self, solver):
        """Gauss-Legendre nodes and weights on [0, 1] for ``solver`` (computed once each)."""
        m = self.nodes or solver.order // 2 + 1
        if m not in _NODES:
            x, w = np.polynomial.legendre.leggauss(m)
            _NODES[m] = ((x + 1) / 2, w / 2)
        return _NODES[m]

    def lean(self, solver, model):
        if not solver.adaptive or self.rtol is not None or self.atol is not None:
            return None
        nodes, n = self.quadrature(solver), model.n_states

        def run(kern, tab, ctl, backward_control, args):
            return _lean.grad_gauss(kern, tab, ctl, backward_control(n), nodes, *args)
        return run

    def backward(self, job, state, G):
        qx, qw = self.quadrature(job.solver)
        a, stops_b = _adjoint(job, state, G)
        pbar = np.zeros(job.n_params)
        z = np.zeros(job.n)
        integrate_backward(job, self, Gauss(a, pbar, qx, qw), stops_b, z, job.n,
                           _last_step(state), state.n_steps)
        return pbar, z


class QuadratureAdjoint(_Stored):
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
        self.quad_rtol = optional_tolerance(quad_rtol, "quad_rtol", "QuadratureAdjoint")

    def backward(self, job, state, G):
        a, stops_b = _adjoint(job, state, G)
        pbar = np.zeros(job.n_params)
        rtol, atol = self._tols(job, 1)
        tol = self.quad_rtol if self.quad_rtol is not None else rtol
        sys = Quad(a, pbar, tol, float(atol[0]), np.zeros((3, job.n_params)), np.zeros((16, 3)))
        z = np.zeros(job.n)
        integrate_backward(job, self, sys, stops_b, z, job.n, _last_step(state), state.n_steps)
        return pbar, z


# ---------------------------------------------------------------- checkpoint intervals


def _interval(job, lo, hi, u0, rate, obs_t):
    """One checkpoint interval as a job of its own: from ``u0`` over ``[lo, hi]`` with one
    infusion rate and no boluses (the checkpoints hold the states after them)."""
    z = np.zeros(0, dtype=np.int64)
    sched = Schedule(np.array([lo, hi]), np.ascontiguousarray(rate), z, z, np.zeros(0))
    return replace(job, sched=sched, prob=_Fixed(job.prob, u0), obs_t=obs_t)


class _Fixed:
    """A problem seen with another initial state."""

    def __init__(self, prob, u0):
        self._prob, self._u0 = prob, np.asarray(u0, dtype=np.float64)

    def initial_state(self, p):
        return self._u0.copy()

    def __getattr__(self, name):
        return getattr(self._prob, name)
