"""Forward sensitivities: integrate S = du/dp alongside u.

dS/dt = df/du S + df/dp, S(t0) = 0; the gradient is sum_q G_q^T S(t_q).
The cost grows with the number of parameters (n x n_params extra states)
but not with the number of observations, and nothing is stored or solved
backward: the right choice for mechanistic models with a handful of
parameters (a PK model), as in CVODES' forward mode (Hindmarsh et al.,
ACM TOMS 31, 2005) and SciMLSensitivity's ForwardSensitivity.
"""

import numpy as np

from sciml.solvers.base import STATUS_TEXT

from ._forward import Forward, SolveFailed
from .base import SensitivityAlgorithm

FSENS = 4  # the kind of `adj_solve`

__all__ = ["ForwardSensitivity"]


class ForwardSensitivity(SensitivityAlgorithm):
    """Forward sensitivity equations, integrated with the forward solve in one augmented ODE.

    Parameters
    ----------
    error_on_sensitivities : bool
        Include S in the error control (default, as CVODES' ``errconS``):
        the gradient is then as accurate as the tolerances promise. False
        controls u only (faster, gradient accuracy follows u's steps).
    rtol, atol : float, optional
        Tolerances of the augmented solve (default: the forward solve's).
    """

    def __init__(self, error_on_sensitivities=True, rtol=None, atol=None):
        super().__init__(rtol, atol)
        self.error_on_sensitivities = bool(error_on_sensitivities)

    def forward(self, job):
        n, npar = job.n, job.n_params
        nz = n + n * npar
        A, b, e, c, P, n_step, end_stage = job.tableau()
        rtol, atol = self._tols(job)
        s, sch = job.solver, job.sched
        z = np.zeros(nz)
        z[:n] = job.u0
        T = job.obs_t.shape[0]
        Z = np.zeros((T, nz))
        stats = np.zeros(3, dtype=np.int64)
        d = np.zeros(1)
        status = job.mod.adj_solve(
            FSENS, A, b, e, c, P, n_step, end_stage,
            d, np.zeros((1, n)), np.zeros((0, P.shape[0], n)), np.zeros(0, dtype=np.int8),
            np.zeros(0, dtype=np.int64), 0,
            sch.stops, sch.seg_rate, sch.bolus_k, sch.bolus_i, sch.bolus_a,
            job.obs_t, np.zeros((0, n)), np.zeros((0, n)), False, Z,
            job.p, job.ws, z, np.zeros(npar),
            rtol, atol, 0.0, job.max_steps, s.safety, s.qmin, s.qmax, s.beta1, s.beta2,
            nz if self.error_on_sensitivities else n, np.zeros(0), np.zeros(0), rtol,
            np.zeros((P.shape[0], nz)), np.zeros((3, nz)), np.zeros((4, n)), np.zeros(npar),
            np.zeros((n, n)), np.zeros((n, npar)), np.zeros((3, npar)), np.zeros((16, 3)),
            stats)
        if status != 0:
            raise SolveFailed(f"ForwardSensitivity: the augmented solve failed: "
                              f"{STATUS_TEXT.get(int(status), status)}")
        fw = Forward(job.obs_t, np.ascontiguousarray(Z[:, :n]), 0, float(sch.stops[-1]),
                     None, None, None, None, None, 0, stats)
        fw.S = Z[:, n:].reshape(T, n, npar)
        return fw

    def backward(self, job, state, G):
        return np.einsum("qi,qij->j", G, state.S), None
