"""The default method: chosen from the solver and the sizes of the problem."""

from .continuous import GaussAdjoint
from .discrete import DiscreteAdjoint
from .forward import ForwardSensitivity

#: at most this many parameters -> forward sensitivities
FORWARD_MAX_PARAMS = 16
#: at most this many states -> the discrete adjoint (its memory: steps x stages x states)
DISCRETE_MAX_STATES = 64


def default_sensealg(model, solver=None):
    """The method `sciml.loss_and_grad` uses when none is given.

    Rule, first match:

    1. at most ``FORWARD_MAX_PARAMS`` (16) parameters -> `ForwardSensitivity`:
       n x n_params extra states cost less than a backward pass
       (mechanistic PK/PD models, stiff ones with `Rodas5` included);
    2. a stiff (Rosenbrock) solver -> `GaussAdjoint`, whose backward solve is
       stiff too and controls the error of lambda alone;
    3. at most ``DISCRETE_MAX_STATES`` (64) states -> `DiscreteAdjoint`: one
       vector-Jacobian product per forward stage and no backward error
       control, the fastest here on small UDEs and neural ODEs (4x faster
       than the interpolating adjoint on the spiral benchmark), and its
       gradient is exactly that of the loss being minimised, which line
       searches like; the stored steps are small at these sizes;
    4. otherwise `GaussAdjoint`: memory of the forward steps only, backward
       error control on the n adjoint states however many weights there are.
    """
    stiff = solver is not None and solver.stiff
    if model.n_params <= FORWARD_MAX_PARAMS and (not stiff or model.has_kernel("hvp")):
        return ForwardSensitivity()
    if solver is not None and solver.stiff:
        return GaussAdjoint()
    if model.n_states <= DISCRETE_MAX_STATES:
        return DiscreteAdjoint()
    return GaussAdjoint()
