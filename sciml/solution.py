"""`Solution`: what `sciml.solve` returns (saved trajectory, dense output, observables)."""

import numpy as np

from .solvers.base import DT_UNDERFLOW, MAX_STEPS, NONFINITE, STATUS_TEXT, SUCCESS

STATUS_NAMES = {SUCCESS: "success", MAX_STEPS: "max_steps", DT_UNDERFLOW: "dt_underflow",
                NONFINITE: "nonfinite"}


class SolveWarning(RuntimeWarning):
    """A solve stopped early (max steps, step size underflow, non-finite state)."""


class Solution:
    """The result of `sciml.solve` for one problem.

    Attributes
    ----------
    t : ndarray, (T,)
        Saved times: the requested ``saveat`` times, or every accepted step.
        When the solve stopped early, only those reached.
    u : ndarray, (T, n_states)
        States at ``t`` (right-continuous: post-dose at a bolus time).
    status : str
        ``"success"``, ``"max_steps"``, ``"dt_underflow"`` or ``"nonfinite"``.
    status_code : int
        The code of `sciml.solvers.base` (0 is success).
    message : str
        A sentence for the status.
    success : bool
    t_end : float
        Time reached (``tspan[1]`` on success).
    stats : dict
        ``nfev``, ``n_accepted``, ``n_rejected`` (+ solver-specific counts).
    prob, solver : the problem and the solver used.

    Calling ``sol(t)`` (scalar or array) evaluates the dense output (with
    ``dense=True``, the default); ``sol.observables`` maps each observable's
    name to its values at ``t``, (T,).
    """

    def __init__(self, prob, solver, raw):
        self.prob = prob
        self.solver = solver
        self.t = raw.t
        self.u = raw.u
        self.status_code = int(raw.status)
        self.status = STATUS_NAMES.get(self.status_code, "unknown")
        self.message = STATUS_TEXT.get(self.status_code, "unknown status")
        self.t_end = float(raw.t_end)
        self.stats = dict(raw.stats)
        self._dense = raw.dense
        self._params = prob.params.copy()  # observables use the parameters of the solve
        self._observables = None

    @property
    def success(self):
        return self.status_code == SUCCESS

    def __len__(self):
        return self.t.shape[0]

    def __repr__(self):
        return (f"Solution({self.solver!r}, status={self.status!r}, {len(self)} times in "
                f"[{self.prob.tspan[0]:g}, {self.t_end:g}], nfev={self.stats.get('nfev')})")

    def __call__(self, t):
        """Dense output: states at time(s) `t`.

        Parameters
        ----------
        t : float or array_like, any shape, inside ``[tspan[0], t_end]``

        Returns
        -------
        ndarray, (n_states,) for a scalar, else ``t.shape + (n_states,)``
        """
        if self._dense is None:
            raise ValueError("this solution has no dense output: solve with `dense=True` to "
                             "evaluate `sol(t)` (or pass the times as `saveat`)")
        tq = np.asarray(t, dtype=np.float64)
        flat = tq.reshape(-1)
        lo, hi = self.prob.tspan[0], self.t_end
        bad = ~((flat >= lo) & (flat <= hi))  # also catches NaN
        if np.any(bad):
            first = float(flat[np.argmax(bad)])
            where = "" if self.success else f" (the solve stopped early: {self.status})"
            raise ValueError(f"`t` must lie in the solved interval [{lo:g}, {hi:g}]{where}; "
                             f"got {first!r}")
        order = np.argsort(flat, kind="stable")
        vals = np.empty((flat.shape[0], self.u.shape[1]))
        self.solver.interpolate(self._dense, np.ascontiguousarray(flat[order]), vals)
        out = np.empty_like(vals)
        out[order] = vals
        return out[0] if tq.ndim == 0 else out.reshape(tq.shape + (self.u.shape[1],))

    @property
    def observables(self):
        """dict of observable name -> (T,) values at `t` (empty for a model without them)."""
        if self._observables is None:
            model = self.prob.model
            names = tuple(getattr(model, "obs_names", ()))
            self._observables = {}
            if names:
                Y = np.empty((self.t.shape[0], len(names)))
                model.module.com_observe(Y, self.t, self.u, self._params, model.workspace())
                self._observables = {k: Y[:, i].copy() for i, k in enumerate(names)}
        return dict(self._observables)
