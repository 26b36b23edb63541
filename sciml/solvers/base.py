"""What every solver is: settings, a method family's compiled loop, and one `_run`.

A solver object holds settings (controller, adaptivity) and its method's
tableau; `Solver._run` builds the structures the compiled loop takes (the
problem's `kernels.system.Forward`, the tableau, a `kernels.structs.Control`
and `Record`), calls the family's loop (`erk_integrate`, `ros_integrate` or `bdf_integrate`, each
`kernels.loop.integrate` with the family's step) and wraps what comes back.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from sciml._validate import number

from . import common
from .kernels import control as _ctl
from .kernels.structs import S_NACC, S_NFEV, S_NJAC, S_NLU, S_NREJ, S_NSAVE, Control, record

# Status codes returned by every compiled loop.
SUCCESS, MAX_STEPS, DT_UNDERFLOW, NONFINITE = (_ctl.SUCCESS, _ctl.MAX_STEPS, _ctl.DT_UNDERFLOW,
                                               _ctl.NONFINITE)
STATUS_TEXT = {
    SUCCESS: "success",
    MAX_STEPS: "maximum number of steps reached (raise `max_steps`)",
    DT_UNDERFLOW: "step size underflow (the problem may be stiff: try Rodas5, "
                  "or loosen `rtol`/`atol`)",
    NONFINITE: "the state became NaN or Inf",
}


class StoredSteps(NamedTuple):
    """A solve's stored steps, for `Solver.interpolate`: the system and tableau that made
    them, the `Record` and the number of steps."""

    sys: object
    tab: object
    rec: object
    n_steps: int


@dataclass
class RawSolution:
    """What a solver's `_run` returns; `sciml.Solution` wraps it.

    t, u : saved times (n_save,) and states (n_save, n_states)
    status : one of the codes above; t_end: time reached
    stats : nfev, n_accepted, n_rejected (+ njac, nlu for implicit methods)
    dense : None, or the solve's stored steps (`StoredSteps`), evaluated by
        ``solver.interpolate(dense, t_query, out)``.
    """

    t: np.ndarray
    u: np.ndarray
    status: int
    t_end: float
    stats: dict = field(default_factory=dict)
    dense: StoredSteps | None = None


def pi_controller(solver, safety, qmin, qmax, beta2, order):
    """Check and set the PI step-size controller's settings on ``solver`` (`kernels.control`:
    ``safety`` and ``qmin`` in (0, 1], ``qmax`` > 1, ``beta2`` in [0, 0.2); ``beta1`` from
    the ``order`` of the error estimate, Hairer's choice ``1/(q + 1) - 0.75 beta2``)."""
    where = type(solver).__name__
    solver.safety = number(safety, "safety", where, lo=0.0, hi=1.0)
    solver.qmin = number(qmin, "qmin", where, lo=0.0, hi=1.0)
    solver.qmax = number(qmax, "qmax", where, lo=1.0)
    solver.beta2 = number(beta2, "beta2", where, lo=0.0, hi=0.2, lo_open=False, hi_open=True)
    solver.beta1 = 1.0 / (order + 1) - 0.75 * solver.beta2


def check_adaptive(solver, adaptive):
    if not isinstance(adaptive, (bool, np.bool_)):
        raise TypeError(f"{type(solver).__name__}: `adaptive` must be True or False, got "
                        f"{adaptive!r}")
    return bool(adaptive)


class Solver:
    """Base of all solvers. Subclasses are settings (tableau as class data) plus their
    family's compiled loop.

    Attributes
    ----------
    name : str
    order : int
        Order of the propagated solution.
    adaptive : bool
        Fixed-step methods need ``dt=`` in `sciml.solve`.
    needs : tuple of str
        The model kernels the loop calls.
    stiff : bool
        An implicit (Rosenbrock) method: it factors ``I/(h gamma) - J``.
    newton : bool
        The Jacobian serves only the matrix of a Newton iteration (BDF): an approximate
        one slows the iteration's convergence but leaves the method's order alone (a
        Rosenbrock method's order needs the exact Jacobian).
    """

    name = "Solver"
    order = 0
    adaptive = True
    needs = ("rhs",)
    stiff = False
    newton = False
    linsolve = "dense"
    # the sensitivity methods that step through the family: True for all, else their names
    sensitivities = True
    safety = qmin = qmax = beta1 = beta2 = 0.0

    def _loop(self):
        """The family's compiled loop, ``(sys, tab, ctl, stops, z, rec) -> (status, t, rec)``."""
        raise NotImplementedError

    def _rows(self):
        """Rows of per-step storage."""
        raise NotImplementedError

    def kernels(self, model):
        """The model kernels a forward solve of ``model`` calls: `needs`, with the
        Jacobian's values on its pattern instead of the dense one for a sparse solve."""
        if self.stiff and common.linsolve_kind(model, self.linsolve) != "dense":
            return tuple("spjac" if k == "jac" else k for k in self.needs)
        return self.needs

    def engine_tableau(self):
        """The tableau as the compiled loops take it."""
        return self.tableau.engine()

    def control(self, rtol, atol, dt, max_steps, n_err=None):
        """The `Control` of a solve: ``atol`` (n,) (its first ``n_err`` entries when given),
        ``dt`` the fixed step or the first one (None: estimated)."""
        atol = np.ascontiguousarray(atol if n_err is None else atol[:n_err], dtype=np.float64)
        return Control(float(rtol), atol, self.safety, self.qmin, self.qmax, self.beta1,
                       self.beta2, int(max_steps), float(dt or 0.0), bool(self.adaptive))

    def _run(self, prob, saveat, rtol, atol, dt, max_steps, dense, params=None):
        """Integrate one problem; see `sciml.solve` (arguments already validated).

        saveat : None (every accepted step) or sorted float64 times in tspan.
        atol : (n_states,) float64. dt : None, or the fixed / initial step.
        params : flat parameters instead of the problem's.
        """
        n = prob.model.n_states
        p = prob.params if params is None else params
        if prob.model.mass_matrix is not None and not self.stiff:
            raise ValueError(f"{self.name} cannot solve a model with a mass matrix (M du/dt = "
                             "f); use sciml.Rodas5() or sciml.BDF()")
        sched = common.schedule(prob)
        linear = common.linear_algebra(prob.model, self.linsolve) if self.stiff else None
        sys = common.forward_system(prob.kernel_table(*self.kernels(prob.model)), p, sched, n,
                                    self.stiff, linear)
        every = saveat is None
        cap = common.capacity(sched, max_steps, None if self.adaptive else dt)
        tab = self.engine_tableau()
        ctl = self.control(rtol, atol, dt, max_steps)
        # storage for every step: a guess, which the loop grows where it is short
        rec = record(n, np.zeros(0) if every else saveat, every, bool(dense), self._rows(), cap)
        z = common.consistent(prob.model, prob.initial_state(p), p, sched.stops[0])
        status, t_end, rec = self._loop()(sys, tab, ctl, sched.stops, z, rec)
        st = rec.stats
        k = int(st[S_NSAVE])
        t = rec.all_t[:k].copy() if every else saveat[:k].copy()
        stats = {"nfev": int(st[S_NFEV]), "n_accepted": int(st[S_NACC]),
                 "n_rejected": int(st[S_NREJ])}
        if self.stiff:
            stats.update(njac=int(st[S_NJAC]), nlu=int(st[S_NLU]))
        dense_data = StoredSteps(sys, tab, rec, int(st[S_NACC])) if dense else None
        return RawSolution(t, rec.save_z[:k].copy(), int(status), float(t_end), stats,
                           dense_data)

    def interpolate(self, dense, t, out):
        """Write the dense-output state at sorted times `t` (inside the solved interval)
        into `out` (len(t), n)."""
        raise NotImplementedError

    def __repr__(self):
        return f"{self.name}()"
