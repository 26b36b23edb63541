"""Explicit Runge-Kutta solvers: a tableau as data, one shared compiled loop.

Every solver here is settings plus a `ButcherTableau` (see `tableaus`); the
integration itself is `kernels.erk.erk_integrate`, which takes the tableau's
arrays, so one compiled loop serves every explicit method (and `sciml.solve`'s
lean path a copy with the coefficients as constants, `kernels.lean`).
"""

import os
import threading
import warnings

import numba
import numpy as np

from . import tableaus
from .base import Solver, check_adaptive, pi_controller
from .kernels import erk as _erk
from .kernels import lean as _lean


def _fuse_after(default):
    """SCIML_FUSE_AFTER from the environment, else `default`."""
    text = os.environ.get("SCIML_FUSE_AFTER", "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"environment variable SCIML_FUSE_AFTER must be an integer >= 0 "
                         f"(0: never fuse); got {text!r}")
    return value


#: Lean solves of one (solver, model) pair after which `sciml.solve` compiles its fused
#: entry point (the model's right-hand side inlined, `kernels.linked`) in a background
#: thread, ~10 s once per model and machine (then cached on disk); 0: never. The
#: environment variable SCIML_FUSE_AFTER sets it (a test suite or a short-lived job on a
#: small machine has no use for a compile that pays off after minutes).
FUSE_AFTER = _fuse_after(2000)


class ExplicitRK(Solver):
    """Base of the explicit Runge-Kutta solvers (a subclass sets `tableau`).

    Any checked `ButcherTableau` runs in the same compiled loop, so a new
    method is a subclass with a ``tableau`` class attribute and a docstring
    with its reference.

    Parameters
    ----------
    adaptive : bool, optional
        Error-controlled steps (default, for tableaus with an embedded pair);
        False takes fixed steps of ``dt`` (``sciml.solve(..., dt=...)``).
    safety, qmin, qmax : float
        Step-size controller: safety factor on the predicted step, and the
        bounds of the factor by which one step may shrink or grow.
    beta2 : float
        Weight of the previous error in the PI controller (0: plain
        controller). The current error's exponent is
        ``beta1 = 1 / (embedded_order + 1) - 0.75 * beta2`` (Hairer & Wanner's
        DOPRI5 choice, 0.04 there).
    """

    tableau: tableaus.ButcherTableau = None
    #: The fused entry point (`_fuse`, for a model solved `FUSE_AFTER` times) has this
    #: method's coefficients as constants: faster per solve, for one more compile (the
    #: default solver has it). A first solve always runs the entry point every tableau
    #: shares, so it compiles only the loop the other forward solves run too.
    fold_constants = False

    def __init__(self, adaptive=None, safety=0.9, qmin=0.2, qmax=10.0, beta2=0.04):
        cls = type(self).__name__
        tab = self.tableau
        if not isinstance(tab, tableaus.ButcherTableau):
            raise TypeError(f"{cls}: an explicit RK solver needs a `tableau` (a ButcherTableau "
                            "class attribute); use Tsit5(), DP5(), ... or subclass with one")
        if adaptive is None:
            adaptive = tab.b_error is not None
        adaptive = check_adaptive(self, adaptive)
        if adaptive and tab.b_error is None:
            raise ValueError(f"{cls}: has no error estimate, so it cannot be adaptive; "
                             "use a fixed step (`dt=`) or an adaptive solver such as Tsit5()")
        self.adaptive = adaptive
        pi_controller(self, safety, qmin, qmax, beta2,
                      tab.embedded_order if tab.embedded_order is not None else tab.order)

    @property
    def name(self):
        return type(self).__name__

    @property
    def order(self):
        return self.tableau.order

    def __repr__(self):
        default = self.tableau.b_error is not None
        return f"{self.name}()" if self.adaptive == default else \
            f"{self.name}(adaptive={self.adaptive})"

    def __setattr__(self, name, value):
        # A changed setting invalidates the lean entry point (`_lean`).
        self.__dict__.pop("_lean_cache", None)
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------ compiled loops

    def _loop(self):
        return _erk.erk_integrate

    def _rows(self):
        return self.tableau.n_stages

    def _lean(self, model):
        """``(model, entry, n_states, extra, entries, left, head)`` for `sciml.solve`'s
        lean path (cached for the last model): ``entry`` is the `kernels.lean` entry point
        every tableau shares, ``extra`` the length of ``keep`` beyond the save times,
        ``entries`` its compiled functions by the type of atol, ``left`` (a one-item list)
        the lean solves before the fused entry is made (0: never), ``head`` the arguments
        before the problem's: the tableau and the controller's settings."""
        lean = self.__dict__.get("_lean_cache")
        if lean is not None and lean[0] is model:
            return lean
        entry = _lean.solve_entry()
        model.kernel_table("rhs")
        extra = model.n_states + model.n_params + _lean.KEEP_TAIL
        settings = np.array([self.safety, self.qmin, self.qmax, self.beta1, self.beta2,
                             float(self.adaptive)])
        lean = (model, entry, model.n_states, extra, {}, [max(FUSE_AFTER, 0)],
                (self.tableau.engine(), settings))
        self.__dict__["_lean_cache"] = lean
        return lean

    def _folded(self):
        return self.tableau.engine(constants=True) if self.fold_constants else None

    def _fuse(self, lean):
        """Compile the fused entry point of ``lean``'s model (`kernels.linked`) in a
        background thread, for the argument types seen so far; swapped in when ready.
        Nothing for a model whose code cannot be linked (`Model.linked_code`): its IR is
        printed here, not on the way to a first solve."""
        model, entry, n, extra, entries, _, head = lean
        code = model.linked_code()
        if code is None:
            return
        sigs = list(getattr(entry, "overloads", {}))
        fused = _lean.solve_entry(self._folded(), code)

        def work():
            try:
                done = {float if isinstance(sig[8], numba.types.Float) else np.ndarray:
                        fused.compile(sig) for sig in sigs}
            except Exception as e:  # never needed: the generic entry keeps running
                warnings.warn(f"{self.name}: no fused solve for {model!r}: {e}", RuntimeWarning,
                              stacklevel=2)
                return
            # `entry` stays the fallback for an argument type not seen yet
            if self.__dict__.get("_lean_cache") is lean:
                self.__dict__["_lean_cache"] = (model, entry, n, extra, {**entries, **done}, [0],
                                                head)

        thread = threading.Thread(target=work, name="sciml-fuse", daemon=True)
        self.__dict__["_fusing"] = thread
        thread.start()

    def interpolate(self, dense, t, out):
        """Dense output at sorted times `t` (inside the solved interval) into `out` (len(t), n)."""
        tmp = np.zeros(max(out.shape[1], self.tableau.n_stages))
        _erk.store_eval(dense.sys, dense.tab, dense.rec, dense.n_steps, t, out, tmp)


class Tsit5(ExplicitRK):
    """Tsitouras' 5(4) pair with its own 4th-order interpolant: the default solver.

    7 stages (FSAL: 6 evaluations per step). Reference: Ch. Tsitouras,
    "Runge-Kutta pairs of order 5(4) satisfying only the first column
    simplifying assumption", Comput. Math. Appl. 62 (2011) 770-775.
    """

    tableau = tableaus.TSIT5
    fold_constants = True


class DP5(ExplicitRK):
    """Dormand-Prince 5(4) pair with Shampine's 4th-order interpolant (as in scipy's RK45).

    References: J. R. Dormand, P. J. Prince, "A family of embedded Runge-Kutta
    formulae", J. Comput. Appl. Math. 6 (1980) 19-26; L. F. Shampine, "Some
    practical Runge-Kutta formulas", Math. Comp. 46 (1986) 135-150.
    """

    tableau = tableaus.DP5


class BS3(ExplicitRK):
    """Bogacki-Shampine 3(2) pair with a cubic Hermite interpolant; good at loose tolerances.

    4 stages (FSAL: 3 evaluations per step). Reference: P. Bogacki,
    L. F. Shampine, "A 3(2) pair of Runge-Kutta formulas", Appl. Math. Lett.
    2 (1989) 321-325.
    """

    tableau = tableaus.BS3


class Vern7(ExplicitRK):
    """Verner's "most efficient" 7(6) pair with a 7th-order interpolant; for tight tolerances.

    10 stages per step; the interpolant needs 6 more, computed only for steps
    that contain output times (or when `Solution` is evaluated there).
    Reference: J. H. Verner, "Numerically optimal Runge-Kutta pairs with
    interpolants", Numer. Algorithms 53 (2010) 383-396.
    """

    tableau = tableaus.VERN7


class RK4(ExplicitRK):
    """The classical 4th-order Runge-Kutta method with fixed steps (``dt=``), Hermite output.

    Reference: W. Kutta, "Beitrag zur naeherungsweisen Integration totaler
    Differentialgleichungen", Z. Math. Phys. 46 (1901) 435-453.
    """

    tableau = tableaus.RK4


class Euler(ExplicitRK):
    """The explicit Euler method with fixed steps (``dt=``), Hermite output.

    Reference: E. Hairer, S. P. Norsett, G. Wanner, Solving Ordinary
    Differential Equations I, 2nd ed., Springer 1993, Sec. I.7.
    """

    tableau = tableaus.EULER
