"""The discrete adjoint: reverse mode through the forward solver's own steps.

Gives the exact gradient of the computed (discrete) solution with the step
sizes held fixed - what differentiating through the solver with automatic
differentiation gives (diffrax's RecursiveCheckpointAdjoint, torchdiffeq's
``odeint`` backpropagation) - but with the model's compiled kernels per
stage and no tape: the stored steps are the checkpoints. The reverse sweeps
are `adjoints.kernels.discrete`.
"""

import numpy as np

from .base import SensitivityAlgorithm
from .kernels.backward import grad_discrete, grad_discrete_many
from .kernels.discrete import erk_reverse, ros_reverse

__all__ = ["DiscreteAdjoint"]


class DiscreteAdjoint(SensitivityAlgorithm):
    """Reverse mode through the stored steps (exact for the discrete solution).

    With an explicit Runge-Kutta method: one vector-Jacobian product per stage
    of each forward step, no backward error control, memory of the forward
    steps. Consistent to rounding with finite differences of the solver output
    at fixed steps, so it is also the method for fixed-step solvers (RK4, Euler).
    With `Rodas5`: each step is recomputed from its stored start and reversed
    exactly, the Jacobian's own dependence on u and p included (second-order
    ``hvp`` kernel), one transposed solve per stage. With adaptive steps the
    gradient differs from the true one by the solver's error, like every other
    method's.
    """

    def needs(self, solver):
        return ("vjp", "hvp") if solver.stiff else ("vjp",)

    def lean(self, solver, model):
        def run(kern, tab, ctl, backward_control, args):
            return grad_discrete(kern, tab, ctl, *args)
        return run

    def lean_many(self, solver, model):
        return grad_discrete_many

    def forward(self, job):
        from .primal import forward

        return forward(job, dense=True, needs=self.needs(job.solver)).check()

    def backward(self, job, state, G):
        lam, pbar = np.zeros(job.n), np.zeros(job.n_params)
        if job.stiff:
            ros_reverse(state.sys, state.tab, state.rec, state.n_steps, job.obs_t, G, lam, pbar)
        else:
            erk_reverse(state.sys.m, state.tab, state.rec, state.n_steps, job.obs_t, G, lam,
                        pbar)
        return pbar, lam
