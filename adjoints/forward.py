"""Forward sensitivities: integrate S = du/dp alongside u.

dS/dt = df/du S + df/dp, S(t0) = du0/dp; the gradient is sum_q G_q^T S(t_q).
The cost grows with the number of parameters (n x n_params extra states)
but not with the number of observations, and nothing is stored or solved
backward: the right choice for mechanistic models with a handful of
parameters (a PK model), as in CVODES' forward mode (Hindmarsh et al.,
ACM TOMS 31, 2005) and SciMLSensitivity's ForwardSensitivity. S is saved
at the observations by the method's interpolant, like the states.
"""

import numpy as np

from sciml.solvers import common
from sciml.solvers.base import STATUS_TEXT
from sciml.solvers.kernels.structs import lin, record

from .base import SensitivityAlgorithm
from .kernels.systems import Sens
from .primal import Entry, SolveFailed, State

__all__ = ["ForwardSensitivity", "full_sensitivities"]


class ForwardSensitivity(SensitivityAlgorithm):
    """Forward sensitivity equations, integrated with the forward solve in one augmented ODE.

    With `Rodas5` the augmented system [u, S] is solved with its exact Jacobian
    (block lower triangular: one factorisation of ``I/(h gamma) - J`` serves u and
    every column of S; the coupling d(J S)/du comes from the model's ``hvp``
    kernel), the natural choice for a stiff PK/PD model with few parameters. With
    `BDF` the Newton matrix is block diagonal, as CVODES' simultaneous corrector's (no
    coupling, no ``hvp``: a Newton matrix needs no exact Jacobian).

    Parameters
    ----------
    error_on_sensitivities : bool
        Include S in the error control (default, as CVODES' ``errconS``):
        the gradient is then as accurate as the tolerances promise. False
        controls u only (faster, gradient accuracy follows u's steps).
    rtol, atol : float, optional
        Tolerances of the augmented solve (default: the forward solve's).
    params : sequence of int, optional
        The flat parameters whose sensitivities are integrated (default: all); the
        gradient is zero for the others. The cost follows their number: a PEtab
        simulation needs only those its estimated parameters reach.
    """

    forward_mode = True

    def __init__(self, error_on_sensitivities=True, rtol=None, atol=None, params=None):
        super().__init__(rtol, atol)
        self.error_on_sensitivities = bool(error_on_sensitivities)
        self.params = None if params is None else np.array(params, dtype=np.int64).ravel()

    def needs(self, solver):
        # hvp: S's coupling to u in the exact Jacobian a Rosenbrock step needs (`Sens`)
        return ("jac", "paramjac", "hvp") if solver.stiff and not solver.newton else \
            ("jac", "paramjac")

    def forward(self, job):
        return self.prepare(job, self.params)(job.p)

    def prepare(self, job, cols=None):
        """``run(p, u0=None, s0=None) -> State``: the augmented solve of ``job`` at
        parameters ``p``, with its system, control and tableau built once (for many solves
        of one problem, such as a subject's empirical Bayes iterations). ``cols``: the
        parameters (indices) whose sensitivities are integrated (default all): ``State.S``
        is then (T, n, len(cols)), and the cost follows len(cols), not the model's
        parameter count. A parameter may be listed more than once: each column is
        integrated from its own start.

        ``u0`` (n,) and ``s0`` (n, len(cols)) start the solve from a given state and given
        sensitivities instead of the problem's ``u0`` and ``du0/dp`` (one piece of a solve
        made of pieces: the columns then carry what the earlier pieces handed on; a column
        whose forcing ``df/dp`` belongs to no parameter of this piece is the difference of
        two columns of one parameter started apart, since S is linear in its start)."""
        n, n_all = job.n, job.n_params
        cols = np.arange(n_all, dtype=np.int64) if cols is None else \
            np.array(cols, dtype=np.int64).ravel()
        if cols.size and (cols.min() < 0 or cols.max() >= n_all):
            raise ValueError(f"ForwardSensitivity.prepare: `cols` must index the model's "
                             f"{n_all} parameters, got {cols.tolist()}")
        npar = cols.shape[0]
        p_buf = np.array(job.p, dtype=np.float64)  # the systems read it: updated in place
        fsys = common.forward_system(job.table(*self.needs(job.solver)), p_buf, job.sched, n,
                                     job.stiff)
        nz = n + n * npar
        width = max(n, n_all) + 1
        sys = Sens(fsys.m, fsys, np.zeros((n, n)), np.zeros((n, n_all)), np.zeros((n, npar)),
                   np.zeros((4, width)), np.zeros(n_all), lin(n) if job.stiff else fsys.lin,
                   np.zeros(3), cols, not job.solver.newton)
        rtol, atol = self._tols(job, nz if self.error_on_sensitivities else n)
        atol = atol.copy()
        atol[:n] = job.atol if self.atol is None else self.atol
        ctl = job.solver.control(rtol, atol, job.dt, job.max_steps)
        loop, tab = job.solver._loop(), job.solver.engine_tableau()
        T = job.obs_t.shape[0]
        fixed_u0 = job.prob.u0_function is None  # then S starts at zero
        call = Entry(loop)  # many calls (a population fit) skip the dispatcher's typing

        def run(p, u0=None, s0=None):
            p_buf[:] = p
            z = np.empty(nz)
            z[:n] = job.prob.initial_state(p_buf) if u0 is None else u0
            if s0 is not None:
                z[n:] = np.asarray(s0, dtype=np.float64).reshape(n * npar)
            elif fixed_u0:
                z[n:] = 0.0
            else:
                z[n:] = _initial_sensitivities(job, p_buf)[:, cols].ravel()
            rec = record(nz, job.obs_t)
            status, t_end, _ = call(sys, tab, ctl, job.sched.stops, z, rec)
            if status != 0:
                raise SolveFailed(f"ForwardSensitivity: the augmented solve failed: "
                                  f"{STATUS_TEXT.get(int(status), status)}")
            Z = rec.save_z
            st = State(np.ascontiguousarray(Z[:, :n]), 0, float(t_end), fsys, None, rec, 0,
                       z[:n])
            st.S = Z[:, n:].reshape(T, n, npar)
            st.cols = cols
            return st

        return run

    def backward(self, job, state, G):
        # S carries du0/dp already: no dL/du0 left to pass on
        g = np.zeros(job.n_params)
        g[state.cols] = np.einsum("qi,qij->j", G, state.S)
        return g, None


def full_sensitivities(state, n_params):
    """A forward `State`'s S over every parameter (zeros where not integrated)."""
    T, n, _ = state.S.shape
    S = np.zeros((T, n, n_params))
    S[:, :, state.cols] = state.S
    return S


def _initial_sensitivities(job, p):
    """du0/dp (n, n_params) at ``p``: zeros for a fixed u0, else one reverse pass per state
    (or the implicit function theorem for a steady state)."""
    return job.prob.initial_jacobian(p)
