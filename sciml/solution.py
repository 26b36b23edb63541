"""`Solution`: what `sciml.solve` returns (saved trajectory, dense output, observables)."""

import numpy as np

from ._validate import check_atol
from .problem import ODEProblem
from .solvers.base import DT_UNDERFLOW, MAX_STEPS, NONFINITE, STATUS_TEXT, SUCCESS
from .solvers.kernels.lean import KEEP_TAIL
from .solvers.kernels.observe import observe_along

STATUS_NAMES = {SUCCESS: "success", MAX_STEPS: "max_steps", DT_UNDERFLOW: "dt_underflow",
                NONFINITE: "nonfinite"}


_new = object.__new__

# Attributes a lean solution (see `lean_solution`) makes on first use.
_LEAN_FIELDS = frozenset({"t", "t_end", "stats", "_params", "_redo"})


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

    Calling ``sol(t)`` (scalar or array) evaluates the dense output. It is
    stored during the solve when ``saveat`` is None or ``dense=True``; with
    ``saveat`` given and ``dense`` left at its default, the first ``sol(t)``
    re-runs the same solve (same steps, from the same inputs) once with
    per-step storage; with ``dense=False`` ``sol(t)`` is an error.
    ``sol.observables`` maps each observable's name to its values at ``t``,
    (T,), computed on first access.
    """

    _dense = None
    _observables = None
    #: the times of the events that fired and which event each was (`sciml.Event`)
    t_events = np.zeros(0)
    i_events = np.zeros(0, dtype=np.int64)

    def __init__(self, prob, solver, raw, redo=None):
        self._set(prob, solver, raw.t, raw.u, int(raw.status), float(raw.t_end),
                  dict(raw.stats), raw.dense, prob.params.copy(), redo)

    def __getattr__(self, name):
        # Only a lean solution lacks these until first use (see `lean_solution`).
        if name in _LEAN_FIELDS and "_keep" in self.__dict__:
            self._unpack()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _unpack(self):
        d = self.__dict__
        keep, u = d.pop("_keep"), d["u"]
        T, n = u.shape
        t_end, nfev, nacc, nrej, nsave = keep[keep.shape[0] - KEEP_TAIL:]
        nsave = int(nsave)
        t, u0, params = keep[:T], keep[T:T + n], keep[T + n:keep.shape[0] - KEEP_TAIL]
        args = d.pop("_redo_args")
        redo = None
        if args is not None:
            redo = _Redo((d["solver"], d["prob"], u0, t, *args))
        if nsave < T:
            t, d["u"] = t[:nsave].copy(), u[:nsave].copy()
        self._set(d["prob"], d["solver"], t, d["u"], d["status_code"], float(t_end),
                  {"nfev": int(nfev), "n_accepted": int(nacc), "n_rejected": int(nrej)}, None,
                  params, redo)

    def _set(self, prob, solver, t, u, status, t_end, stats, dense, params, redo):
        self.prob = prob
        self.solver = solver
        self.t = t
        self.u = u
        self.status_code = status
        self.t_end = t_end
        self.stats = stats
        if dense is not None:
            self._dense = dense
        self._params = params  # a copy: observables use the parameters of the solve
        self._redo = redo

    @property
    def status(self):
        return STATUS_NAMES.get(self.status_code, "unknown")

    @property
    def message(self):
        return STATUS_TEXT.get(self.status_code, "unknown status")

    def _dense_data(self):
        if self._dense is None and self._redo is not None:
            self._dense = self._redo(self._params)
            self._redo = None
        return self._dense

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
        dense = self._dense_data()
        if dense is None:
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
        self.solver.interpolate(dense, np.ascontiguousarray(flat[order]), vals)
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
                observe_along(model.kernel_table("obs"), self._params, model.workspace(), Y,
                              self.t, np.ascontiguousarray(self.u))
                self._observables = {k: Y[:, i].copy() for i, k in enumerate(names)}
        return dict(self._observables)


def lean_solution(prob, solver, u, keep, status, redo_args):
    """The `Solution` of `sciml.solve`'s lean path: ``u`` and ``keep`` as filled by the
    compiled ``erk_solve_saveat`` (copies of saveat, u0 and the parameters, then t_end
    and the counts); the other attributes are made from ``keep`` on first use.

    ``redo_args`` : ``(rtol, atol, dt, max_steps)`` for a lazy dense output, or None.
    """
    self = _new(Solution)
    self.prob = prob
    self.solver = solver
    self.u = u
    self.status_code = status
    self._keep = keep
    self._redo_args = redo_args
    if status != SUCCESS:  # stopped early: `u` holds only the times reached
        self._unpack()
    return self


class _Redo(tuple):
    """Re-runs a finished solve with per-step storage, for a lazy `Solution.__call__`.

    ``(solver, prob, u0, saveat, rtol, atol, dt, max_steps)``, with ``u0`` a copy;
    the solution passes its copy of the parameters, so later changes to the
    problem's arrays do not leak in.
    """

    __slots__ = ()

    def __call__(self, params):
        solver, prob, u0, saveat, rtol, atol, dt, max_steps = self
        q = ODEProblem.__new__(ODEProblem)
        q.__dict__.update(prob.__dict__)
        object.__setattr__(q, "_u0", u0)
        object.__setattr__(q, "_u0_fn", None)
        atol = check_atol(atol, u0.shape[0])
        return solver._run(q, saveat, rtol, atol, dt, max_steps, True, params=params).dense
