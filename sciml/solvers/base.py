"""What every solver is: settings plus a `_run` that drives its compiled loop."""

from dataclasses import dataclass, field

import numpy as np

# Status codes returned by every compiled loop.
SUCCESS, MAX_STEPS, DT_UNDERFLOW, NONFINITE, NEED_STORAGE = 0, 1, 2, 3, 4
STATUS_TEXT = {
    SUCCESS: "success",
    MAX_STEPS: "maximum number of steps reached (raise `max_steps`)",
    DT_UNDERFLOW: "step size underflow (the problem may be stiff: try Rodas5, "
                  "or loosen `rtol`/`atol`)",
    NONFINITE: "the state became NaN or Inf",
    NEED_STORAGE: "internal: step storage full",
}


@dataclass
class RawSolution:
    """What a solver's `_run` returns; `sciml.Solution` wraps it.

    t, u : saved times (n_save,) and states (n_save, n_states)
    status : one of the codes above; t_end: time reached
    stats : nfev, n_accepted, n_rejected (+ njac, nlu for implicit methods)
    dense : None, or the solver's per-step data for dense output
        (ts (n_steps+1,), us (n_steps+1, n), ks (n_steps, n_k, n)), evaluated
        by ``solver.interpolate(dense, t_query, out)``.
    """

    t: np.ndarray
    u: np.ndarray
    status: int
    t_end: float
    stats: dict = field(default_factory=dict)
    dense: tuple | None = None


class Solver:
    """Base of all solvers. Subclasses are settings (tableau as class data) plus `_run`.

    Attributes
    ----------
    name : str
    order : int
        Order of the propagated solution.
    adaptive : bool
        Fixed-step methods need ``dt=`` in `sciml.solve`.
    """

    name = "Solver"
    order = 0
    adaptive = True

    def _run(self, prob, saveat, rtol, atol, dt, max_steps, dense):
        """Integrate `prob` and return a `RawSolution` (see the subclasses)."""
        raise NotImplementedError

    def interpolate(self, dense, t, out):
        """Write the dense-output state at times `t` (sorted) into `out` (len(t), n)."""
        raise NotImplementedError

    def __repr__(self):
        return f"{self.name}()"
