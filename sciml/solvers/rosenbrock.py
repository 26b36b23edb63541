"""Rosenbrock methods for stiff problems: `Rodas5`.

The method is data (`tableaus.RosenbrockTableau`, checked on construction);
the step math is `kernels.ros`, shared with every stiff sensitivity loop.
"""

import numpy as np

from sciml._validate import one_of

from . import tableaus
from .base import Solver, check_adaptive, pi_controller
from .common import LINSOLVES
from .kernels import ros as _ros


class Rodas5(Solver):
    """Rosenbrock method of order 5 with an embedded order-4 error estimate (stiff problems).

    Eight stages, one Jacobian (the model's Jacobian kernel) and one LU of
    ``W = I/(h*gamma) - J`` per step; L-stable and stiffly accurate, so it
    suits stiff kinetics (Robertson), relaxation oscillators (Van der Pol
    with large mu) and PK/PD systems with fast and slow compartments. The
    dense output is the method's own interpolant of order 4. For a
    non-autonomous model the df/dt terms use a forward difference of the
    right-hand side in t (one extra call per step); see `kernels.ros`.
    Every sensitivity method runs with it.

    Parameters
    ----------
    adaptive : bool
        Error-controlled steps (default); False takes fixed steps of ``dt``
        (``sciml.solve(..., dt=...)``), e.g. for convergence studies.
    safety, qmin, qmax : float
        Step-size controller: safety factor on the predicted step, and the
        bounds of the factor by which one step may shrink or grow.
    beta2 : float
        Weight of the previous error in the PI controller (0: plain
        controller); the current error's exponent is
        ``beta1 = 1/5 - 0.75 * beta2``, as for the explicit solvers.
    linsolve : {"auto", "dense", "sparse", "banded"}
        How W is factored: a dense LU, or a sparse LU on the Jacobian's pattern
        from the trace (`Model.jac_sparsity`: one fill-reducing analysis per
        model, then numeric refactorisation each step); ``"banded"`` is that LU
        after a bandwidth-reducing ordering (reverse Cuthill-McKee), its fill
        confined to the band (for 1-D grids and chains). ``"auto"`` is dense below
        `common.AUTO_SPARSE_MIN` states and sparse above while the factors stay
        sparse (`common.AUTO_SPARSE_FILL`). Sensitivity methods factor densely
        for now.

    References
    ----------
    G. Di Marzo, "RODAS5(4) -- Méthodes de Rosenbrock d'ordre 5(4) adaptées aux
    problèmes différentiels-algébriques", Master's thesis, Université de Genève, 1993.
    E. Hairer, G. Wanner, "Solving Ordinary Differential Equations II", 2nd ed.,
    Springer 1996, Section IV.7 (Rosenbrock methods, transformed form) and IV.8.
    """

    name = "Rodas5"
    tableau = tableaus.RODAS5
    needs = ("rhs", "jac")
    stiff = True

    def __init__(self, adaptive=True, safety=0.9, qmin=0.2, qmax=6.0, beta2=0.04,
                 linsolve="auto"):
        name = type(self).__name__
        self.linsolve = one_of("linsolve", linsolve, LINSOLVES, name)
        self.adaptive = check_adaptive(self, adaptive)
        pi_controller(self, safety, qmin, qmax, beta2, self.tableau.embedded_order)

    @property
    def order(self):
        return self.tableau.order

    def __repr__(self):
        return f"{type(self).__name__}()" if self.adaptive else \
            f"{type(self).__name__}(adaptive=False)"

    def _loop(self):
        return _ros.ros_integrate

    def _rows(self):
        return 1 + self.tableau.n_dense

    def interpolate(self, dense, t, out):
        """Write the dense-output state at sorted times `t` (in the solved interval) into
        `out` (len(t), n); a time on a step boundary gives the state after any dose there."""
        _ros.ros_store_eval(dense.rec, dense.n_steps, np.ascontiguousarray(t, dtype=np.float64),
                            out, self.tableau.n_dense)
        return out


