"""The BDF family for large stiff systems: `BDF`.

Variable order 1-5 and variable step in backward-difference form; the loop is
`kernels.bdf`, the linear solves those of every implicit method
(`kernels.linsolve`: dense, or sparse on the trace's pattern).
"""

import numpy as np

from sciml._validate import one_of

from .base import Solver
from .common import LINSOLVES
from .kernels import bdf as _bdf
from .kernels.structs import BDFTableau

# Shampine & Reichelt's NDF coefficients (orders 1-5); order 0 unused.
_NDF_KAPPA = (0.0, -0.1850, -1.0 / 9.0, -0.0823, -0.0415, 0.0)


class BDF(Solver):
    """Variable-order (1-5) BDF for large stiff systems.

    The numerical differentiation formulas of Shampine & Reichelt (the
    quasi-constant-step family of MATLAB's ode15s and scipy's ``BDF``): a few
    right-hand side calls a step (Newton iterations on a Jacobian kept across
    steps), so it needs far fewer evaluations and factorisations than
    `Rodas5` on large problems at moderate tolerances; `Rodas5` stays the
    choice for small stiff models and tight tolerances.

    Parameters
    ----------
    max_order : int
        Highest order (1-5).
    ndf : bool
        The NDFs (default; more accurate at the same cost); False: the classical
        BDFs.
    linsolve : {"auto", "dense", "sparse", "banded"}
        How ``I - c J`` is factored (see `Rodas5`).

    Notes
    -----
    Gradients through it: `adjoints.InterpolatingAdjoint` and `BacksolveAdjoint`
    (the backward system integrated by BDF too, on the same linear solves) and
    `ForwardSensitivity` (simultaneous corrector on the augmented system, its Newton
    matrix block diagonal as CVODES'); the
    quadrature adjoints and the discrete adjoint ask for `Rodas5`.

    References
    ----------
    L. F. Shampine, M. W. Reichelt, "The MATLAB ODE Suite", SIAM J. Sci. Comput. 18
    (1997) 1-22. E. Hairer, G. Wanner, "Solving Ordinary Differential Equations II",
    2nd ed., Springer 1996, Section III.5 (BDF) and IV.8 (Newton iterations).
    A. C. Hindmarsh et al., "SUNDIALS: Suite of Nonlinear and Differential/Algebraic
    Equation Solvers", ACM Trans. Math. Softw. 31 (2005) 363-396 (CVODE's reuse of the
    factorisation across steps).
    """

    name = "BDF"
    needs = ("rhs", "jac")
    stiff = True
    newton = True
    adaptive = True
    safety = 0.9
    # Those whose backward or augmented system is an ODE the BDF loop integrates; the
    # quadrature adjoints read their own backward steps' stages, which BDF has not, and
    # the discrete adjoint would differentiate the multistep recursion.
    sensitivities = ("InterpolatingAdjoint", "BacksolveAdjoint", "ForwardSensitivity")

    def __init__(self, max_order=5, ndf=True, linsolve="auto"):
        if isinstance(max_order, bool) or not isinstance(max_order, (int, np.integer)) \
                or not 1 <= max_order <= 5:
            raise ValueError(f"BDF: `max_order` must be an integer in 1..5, got {max_order!r}")
        if not isinstance(ndf, (bool, np.bool_)):
            raise TypeError(f"BDF: `ndf` must be True or False, got {ndf!r}")
        self.max_order = int(max_order)
        self.ndf = bool(ndf)
        self.linsolve = one_of("linsolve", linsolve, LINSOLVES, "BDF")

    @property
    def order(self):
        return self.max_order

    def __repr__(self):
        return "BDF()" if (self.max_order, self.ndf) == (5, True) else \
            f"BDF(max_order={self.max_order}, ndf={self.ndf})"

    def engine_tableau(self):
        kappa = np.array(_NDF_KAPPA if self.ndf else np.zeros(6), dtype=np.float64)
        return BDFTableau(kappa, self.max_order)

    def _loop(self):
        return _bdf.bdf_integrate

    def _rows(self):
        return _bdf.MAX_ORDER + 1

    def interpolate(self, dense, t, out):
        """Write the dense-output state at sorted times `t` (in the solved interval) into
        `out` (len(t), n); a time on a step boundary gives the state after any dose there."""
        _bdf.bdf_store_eval(dense.rec, dense.n_steps, np.ascontiguousarray(t, dtype=np.float64),
                            out)
        return out
