"""The default method: chosen from the sizes of the problem."""

from sciml.solvers.erk import ExplicitRK

from .continuous import GaussAdjoint
from .forward import ForwardSensitivity

#: at most this many parameters -> forward sensitivities
FORWARD_MAX_PARAMS = 16


def default_sensealg(model, solver=None):
    """The method `sciml.loss_and_grad` uses when none is given.

    Rule: with a stiff (Rosenbrock) solver, `GaussAdjoint` (the one method
    with a stiff backward solve); otherwise forward sensitivities when the model has at most
    ``FORWARD_MAX_PARAMS`` (16) parameters - the n x n_params extra states
    then cost less than a backward solve with its interpolation (mechanistic
    PK/PD models); otherwise `GaussAdjoint`, whose backward error control
    covers only the n adjoint states however many network weights there are.
    """
    if solver is not None and not isinstance(solver, ExplicitRK):
        return GaussAdjoint()
    if model.n_params <= FORWARD_MAX_PARAMS:
        return ForwardSensitivity()
    return GaussAdjoint()
