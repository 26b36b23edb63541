"""Models: a user's plain-Python right-hand side traced once and compiled into kernels.

`Model` (and `NeuralODE`) trace ``f(u, p, t, nets)`` with sympy (`trace`), build
the kernels' syntax trees (`derivatives`, `netcode`, `code`) and compile them
to machine code (`llvm`), assembled in one place (`assembly`).
"""

from .model import CacheWarning, Model, NeuralODE, ParamViews
from .trace import ModelError

__all__ = ["Model", "NeuralODE", "ParamViews", "ModelError", "CacheWarning"]
