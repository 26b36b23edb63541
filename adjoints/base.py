"""What every sensitivity algorithm is: settings, a forward pass and a backward pass.

A method is used in two halves so that the loss sits between them:
``state = method.forward(job)`` solves the problem and returns the states at
the observation times (``state.u``); the caller evaluates its loss there and
turns dL/du at each observation into the rows of ``G``; then
``method.backward(job, state, G)`` returns the gradient of the loss with
respect to the flat parameters (and, where the method gives it, to u0).
"""

import numpy as np

from sciml.solvers.erk import ExplicitRK

from ._forward import SolveFailed

__all__ = ["SensitivityAlgorithm", "SolveFailed"]


def _tol(cls, name, v):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < np.inf:
        raise ValueError(f"{cls}: `{name}` must be None or a number > 0, got {v!r}")
    return float(v)


class SensitivityAlgorithm:
    """Base of the methods. ``rtol``/``atol``: tolerances of the sensitivity solve
    (default: the forward solve's)."""

    #: solvers the method runs with (checked before any work)
    solvers = (ExplicitRK,)

    def __init__(self, rtol=None, atol=None):
        cls = type(self).__name__
        self.rtol = _tol(cls, "rtol", rtol)
        self.atol = _tol(cls, "atol", atol)

    def check_solver(self, solver):
        if not isinstance(solver, self.solvers):
            names = ", ".join(c.__name__ for c in self.solvers)
            raise ValueError(f"{type(self).__name__} does not run with {solver.name}: it needs "
                             f"one of {names} (explicit Runge-Kutta: Tsit5, DP5, BS3, Vern7, "
                             "RK4, Euler). For a stiff problem with Rodas5 use "
                             "adjoints.GaussAdjoint(), whose backward solve is stiff too")
        if not solver.adaptive and type(self).__name__ != "DiscreteAdjoint":
            raise ValueError(f"{type(self).__name__} needs an adaptive solver; with a "
                             f"fixed-step {solver.name} use DiscreteAdjoint()")

    def _tols(self, job):
        rtol = self.rtol if self.rtol is not None else job.rtol
        atol = self.atol if self.atol is not None else float(np.min(job.atol))
        return rtol, atol

    def forward(self, job):
        raise NotImplementedError

    def backward(self, job, state, G):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}()"
