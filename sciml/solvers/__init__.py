"""ODE solvers: each a settings object whose method data (tableau) is checked on construction.

The compiled loops they drive are `sciml.solvers.kernels`: generic over the
model (its kernels are called through their addresses), compiled once.
"""

from .base import RawSolution, Solver

__all__ = ["Solver", "RawSolution"]
