"""ODE solvers: each a settings object whose method data (tableau) is checked on construction.

`TEMPLATES` lists the template modules whose compiled loops are pasted into
every generated model module (see `sciml._codegen`).
"""

from .base import RawSolution, Solver

TEMPLATES = ()

__all__ = ["Solver", "RawSolution", "TEMPLATES"]
