"""sciml: models traced once into compiled kernels, and compiled ODE solvers.

`Model` turns an ordinary Python function ``f(u, p, t, nets)`` into compiled
right-hand-side, Jacobian and vector-Jacobian kernels; `ODEProblem` adds the
initial state, time span, parameters and doses; `solve` integrates it with
one of the solvers (`Tsit5` by default) in one compiled loop.
"""

from ._tier import compiled_only
from .data import Data
from .events import Event
from .fit import LBFGS, FitResult, FitWarning, fit
from .gradient import loss_and_grad, loss_value
from .losses import SSE, GaussianNLL
from .model import Model, ModelError, NeuralODE
from .multistart import MultistartResult, StartFit, fit_multistart
from .population import Population
from .problem import Bolus, Change, Infusion, ODEProblem
from .solution import Solution, SolveWarning
from .solve import solve
from .solvers import Solver
from .solvers.bdf import BDF
from .solvers.erk import BS3, DP5, RK4, Euler, ExplicitRK, Tsit5, Vern7
from .solvers.rosenbrock import Rodas5
from .solvers.tableaus import ButcherTableau
from .steady import SteadyState, SteadyStateResult, steady_state

__all__ = [
    "Model", "NeuralODE", "ODEProblem", "Bolus", "Infusion", "Change", "Event", "solve", "Solution",
    "SolveWarning", "Solver", "Tsit5", "DP5", "BS3", "Vern7", "RK4", "Euler", "Rodas5", "BDF",
    "ModelError", "ExplicitRK", "ButcherTableau", "Data", "SSE", "GaussianNLL",
    "loss_and_grad", "loss_value", "Population",
    "fit", "FitResult", "FitWarning", "LBFGS",
    "fit_multistart", "MultistartResult", "StartFit",
    "steady_state", "SteadyState", "SteadyStateResult", "compiled_only",
]
