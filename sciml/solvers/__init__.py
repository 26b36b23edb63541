"""ODE solvers: each a settings object whose method data (tableau) is checked on construction.

`TEMPLATES` lists the template modules whose compiled loops are pasted into
every generated model module (see `sciml._codegen`).
"""

from . import _adj_template, _common_template, _erk_template, _linalg_template, _ros_template
from .base import RawSolution, Solver

TEMPLATES = ()
TEMPLATES += (_common_template, _erk_template)  # shared dose/step helpers, then the ERK loop
TEMPLATES += (_linalg_template, _ros_template)  # Rodas5: LU kernels, then the loop
TEMPLATES += (_adj_template,)  # sensitivities: augmented ERK solves, discrete adjoint

__all__ = ["Solver", "RawSolution", "TEMPLATES"]
