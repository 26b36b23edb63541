"""The discrete adjoint: reverse mode through the forward solver's own steps.

Gives the exact gradient of the computed (discrete) solution with the step
sizes held fixed - what differentiating through the solver with automatic
differentiation gives (diffrax's RecursiveCheckpointAdjoint, torchdiffeq's
``odeint`` backpropagation) - but with the model's compiled vjp kernel per
stage and no tape: the stored steps (start state and stages) are the
checkpoints, and each stage's input is rebuilt from them in the reverse pass.
"""

import numpy as np

from sciml.solvers.erk import ExplicitRK

from ._forward import forward_problem
from .base import SensitivityAlgorithm

__all__ = ["DiscreteAdjoint"]


class DiscreteAdjoint(SensitivityAlgorithm):
    """Reverse mode through the stored Runge-Kutta steps (exact for the discrete solution).

    One vector-Jacobian product per stage of each forward step, no backward
    error control, memory of the forward steps. Consistent to rounding with
    finite differences of the solver output at fixed steps, so it is also
    the method for fixed-step solvers (RK4, Euler). With adaptive steps its
    gradient differs from the true one by the solver's error, like every
    other method's.
    """

    solvers = (ExplicitRK,)

    def forward(self, job):
        return forward_problem(job, job.obs_t, dense=True).check()

    def backward(self, job, state, G):
        n, npar = job.n, job.n_params
        A, b, e, c, P, n_step, end_stage = job.tableau()
        lam, pbar = np.zeros(n), np.zeros(npar)
        job.mod.adj_discrete(A, b, c, P, n_step, state.d_t, state.d_u, state.d_k, state.d_have,
                             state.d_seg, state.n_steps, job.sched.seg_rate, job.obs_t, G, job.p,
                             job.ws, lam, pbar, np.zeros((P.shape[0], n)), np.zeros(n),
                             np.zeros(n))
        return pbar, lam
