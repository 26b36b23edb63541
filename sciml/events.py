"""State-dependent events: a root of ``condition(u, p, t)`` triggers ``affect``.

How a problem with events is run: the problem is integrated with its steps stored;
the first step over which a condition changes sign (in the event's direction) is
found from the condition at the step ends, the root is located on the step's dense
output (Brent's method to rounding), the affect applied there, and the integration
started afresh from the event. The pieces between events are ordinary problems
(`sciml.segments.Segment`), so every solver and sensitivity method runs on them
unchanged, and `loss_and_grad` chains them with the jump conditions below.

A condition already zero where a piece starts (at t0, or just after an event that
set it to zero) does not fire there: only a change of sign after the start counts.
Events whose roots coincide (to rounding) fire together, in the order given.

Sensitivities (affect ``u+ = A(u-, p, t)``, condition ``g``, ``f-`` and ``f+`` the
right-hand side before and after): ``dtau/dp = -(g_u S- + g_p) / (g_u f- + g_t)``,
forward ``S+ = A_u S- + A_p + (A_u f- + A_t - f+) dtau/dp``; backward, with ``w+``
the adjoint after the event, ``dL/dtau = w+ . (A_u f- + A_t - f+)``, the adjoint
before it ``w- = A_u^T w+ - g_u dL/dtau / (g_u f- + g_t)``, and the parameters gain
``A_p^T w+ - g_p dL/dtau / (g_u f- + g_t)``.

Today this runs around the compiled loops (each piece is solved to the end of the
span and cut at its first event); the design to move to keeps the root finding
inside the loops (ARCHITECTURE.md, "Events, steady states and large systems").
"""

import math
from dataclasses import dataclass, field

import numpy as np
import sympy

from .model.trace import T, trace_event
from .problem import Bolus
from .solvers.base import STATUS_TEXT

__all__ = ["Event", "EventPiece", "run_events"]


class Event:
    """A state-dependent event: ``Event(condition, affect=None, direction=0, terminal=False)``.

    condition : callable ``(u, p, t)`` -> one value; the event is at its roots.
    affect : callable ``(u, p, t)`` -> ``{state name: new value}``, or None (record only).
    direction : -1 (falling through zero), +1 (rising), 0 (either).
    terminal : True stops the solve at the event.
    """

    def __init__(self, condition, affect=None, direction=0, terminal=False):
        if direction not in (-1, 0, 1):
            raise ValueError(f"Event: `direction` must be -1, 0 or +1, got {direction!r}")
        self.condition, self.affect = condition, affect
        self.direction, self.terminal = int(direction), bool(terminal)
        self._bound = {}

    #: how `ODEProblem` recognises one
    is_event = True

    def bound(self, model):
        """The event's compiled functions for `model` (traced once per model)."""
        b = self._bound.get(id(model))
        if b is None or b.model is not model:
            b = self._bound[id(model)] = _Bound(self, model)
        return b

    def __repr__(self):
        return (f"Event(direction={self.direction}, terminal={self.terminal}, "
                f"affect={'yes' if self.affect is not None else 'none'})")


class _Bound:
    """An event's condition and affect, with their derivatives, as numpy functions."""

    def __init__(self, ev, model):
        self.model = model
        n, m = model.n_states, len(model.params)
        g, new, u_sym, p_sym = trace_event(ev.condition, ev.affect, model.states,
                                           model.params)
        args = [list(u_sym), list(p_sym), T]
        A = [new.get(i, u_sym[i]) for i in range(n)]
        Am = sympy.Matrix(A)
        self._g = sympy.lambdify(args, g, "numpy")
        self._dg = sympy.lambdify(args, [sympy.diff(g, s) for s in (*u_sym, *p_sym, T)],
                                  "numpy")
        self._A = sympy.lambdify(args, A, "numpy")
        self._dA = sympy.lambdify(args, [Am.jacobian(list(u_sym)), Am.jacobian(list(p_sym))
                                         if m else sympy.zeros(n, 0), Am.diff(T)], "numpy")
        self.n, self.m = n, m

    def g(self, u, p, t):
        return float(self._g(u, p[:self.m], t))

    def g_along(self, U, p, ts):
        """The condition at every row of ``U`` (T, n) and time of `ts`, in one numpy call
        (the lambdified expression is elementwise)."""
        return np.broadcast_to(np.asarray(self._g(U.T, p[:self.m], ts), dtype=np.float64),
                               ts.shape).copy()

    def dg(self, u, p, t):
        """``(g_u (n,), g_p (n_params,), g_t)``."""
        d = np.array(self._dg(u, p[:self.m], t), dtype=np.float64)
        gp = np.zeros(p.shape[0])
        gp[:self.m] = d[self.n:self.n + self.m]
        return d[:self.n], gp, float(d[-1])

    def apply(self, u, p, t):
        return np.array(self._A(u, p[:self.m], t), dtype=np.float64).reshape(self.n)

    def dA(self, u, p, t):
        """``(A_u (n, n), A_p (n, n_params), A_t (n,))``."""
        Au, Ap, At = self._dA(u, p[:self.m], t)
        full = np.zeros((self.n, p.shape[0]))
        full[:, :self.m] = np.array(Ap, dtype=np.float64).reshape(self.n, self.m)
        return (np.array(Au, dtype=np.float64).reshape(self.n, self.n), full,
                np.array(At, dtype=np.float64).reshape(self.n))


@dataclass
class EventPiece:
    """The stretch of a solve from ``t0`` (state ``u0``) to its end ``t1``: an event
    (``fired``: the indices of the events there, ``u_minus`` / ``u_plus`` the state
    before and after them), the end of the span, or the end of a look-ahead horizon
    (``fired`` empty; the state goes on unchanged)."""

    t0: float
    t1: float
    u0: np.ndarray
    fired: list = field(default_factory=list)
    u_minus: np.ndarray = None
    u_plus: np.ndarray = None
    raw: object = None
    final: bool = False  # the last piece (the span's end, or a terminal event)
    doses: tuple = ()  # the single doses given in it (a bolus at its end: only if no event)


def run_events(prob, solver, p, rtol, atol, dt, max_steps, max_events=10_000):
    """``(pieces, message)``: the pieces of `prob`'s solve at parameters `p` between its
    events, and "" on success, else why it stopped early (its last piece then ends where
    the solve stopped)."""
    from .segments import doses_in, piece_problem

    model = prob.model
    bound = [ev.bound(model) for ev in prob.events]
    t, tf = prob.tspan
    u = prob.initial_state(p)
    doses = doses_in(prob.doses, t, tf, True)
    pieces = []
    # How far each piece integrates before looking for a root: the whole span at first,
    # then twice the last stretch between events (grown while none comes), so a solve
    # with many events costs about one pass over the span, not one per event.
    horizon = tf - t
    while True:
        hi = min(tf, t + horizon)
        mine = tuple(d for d in _doses_from(doses, t, first=not pieces)
                     if not isinstance(d, Bolus) or d.time <= hi)
        q = piece_problem(prob, (t, hi), p, mine, u)
        raw = solver._run(q, None, rtol, atol, dt, max_steps, True, params=p)
        if raw.status != 0:  # the piece it reached, with the reason
            pieces.append(EventPiece(t, float(raw.t_end), u, raw=raw, final=True))
            return pieces, (f"the solve stopped at t = {raw.t_end:g}: "
                            f"{STATUS_TEXT.get(int(raw.status), raw.status)}")
        hit = _first_event(prob.events, bound, raw, solver, p)
        if hit is None:
            pieces.append(EventPiece(t, hi, u, raw=raw, final=hi >= tf, doses=mine))
            if hi >= tf:
                return pieces, ""
            t, u = hi, np.array(raw.u[-1])
            horizon *= 2.0
            continue
        tau, fired, u_minus = hit
        u_plus = u_minus.copy()
        for k in fired:
            u_plus = bound[k].apply(u_plus, p, tau)
        stop = any(prob.events[k].terminal for k in fired) or len(pieces) >= max_events
        given = tuple(d for d in mine if not isinstance(d, Bolus) or d.time < tau)
        pieces.append(EventPiece(t, tau, u, fired, u_minus, u_plus, raw, final=stop,
                                 doses=given))
        if stop:
            return pieces, ""
        horizon = max(2.0 * (tau - t), 1e-6 * (tf - prob.tspan[0]))
        t, u = tau, u_plus


def _doses_from(doses, t, first):
    """The single doses from `t` on: boluses after it (at it, for the first piece) and
    infusions not over by then."""
    return tuple(d for d in doses
                 if ((d.time > t or (first and d.time == t)) if isinstance(d, Bolus)
                     else d.start + d.duration > t))


def _first_event(events, bound, raw, solver, p):
    """``(tau, [event indices], u(tau-))`` of the earliest sign change over the stored
    steps of `raw`, or None."""
    ts, us = raw.t, raw.u
    best = None
    for k, (ev, b) in enumerate(zip(events, bound)):
        s = b.g_along(us, p, ts)
        if s.shape[0] > 1 and s[0] == 0.0:
            s[0] = s[1]  # zero at the start: not an event (only a change after it)
        for i in range(1, s.shape[0]):
            if best is not None and ts[i - 1] >= best[0]:
                break
            a, c = s[i - 1], s[i]
            up, down = a < 0.0 <= c, a > 0.0 >= c
            if (up and ev.direction >= 0) or (down and ev.direction <= 0):
                tau = _root(lambda tt, b=b: b.g(_at(solver, raw, tt), p, tt), ts[i - 1],
                            ts[i], a, c)
                if best is None or tau < best[0] - _eps(tau):
                    best = [tau, [k]]
                elif abs(tau - best[0]) <= _eps(tau):
                    best[1].append(k)
                break
    if best is None:
        return None
    return best[0], sorted(best[1]), _at(solver, raw, best[0])


def _eps(t):
    return 64 * np.finfo(float).eps * max(1.0, abs(t))


def _at(solver, raw, t):
    out = np.empty((1, raw.u.shape[1]))
    solver.interpolate(raw.dense, np.array([float(t)]), out)
    return out[0]


def _root(fn, a, b, fa, fb):
    """Brent's method on ``[a, b]`` to rounding (``fb`` may be exactly zero)."""
    from scipy.optimize import brentq

    if fb == 0.0:
        return float(b)
    fa2, fb2 = fn(a), fn(b)  # the interpolant at the ends (the same up to rounding)
    if fa2 * fb2 > 0 or math.isnan(fa2 * fb2):
        return float(b) if abs(fb2) < abs(fa2) else float(a)
    return float(brentq(fn, a, b, xtol=4 * np.finfo(float).eps * max(1.0, abs(b)),
                        rtol=4 * np.finfo(float).eps))


def jump(model, bound, fired, u_minus, p, tau):
    """The derivatives of the events `fired` at ``tau`` (their affects composed in order):
    ``(A_u, A_p, A_t, g_u, g_p, denominator, f-, f+)``, the first event's condition giving
    the time (see the module docstring)."""
    n = u_minus.shape[0]
    Au, Ap, At = np.eye(n), np.zeros((n, p.shape[0])), np.zeros(n)
    v = u_minus
    for k in fired:
        a_u, a_p, a_t = bound[k].dA(v, p, tau)
        Au, Ap, At = a_u @ Au, a_u @ Ap + a_p, a_u @ At + a_t
        v = bound[k].apply(v, p, tau)
    g_u, g_p, g_t = bound[fired[0]].dg(u_minus, p, tau)
    f_minus, f_plus = model.rhs(u_minus, p, tau), model.rhs(v, p, tau)
    den = float(g_u @ f_minus + g_t)
    if den == 0.0:
        raise ValueError(f"an event at t = {tau:g} is tangent to its condition (dg/dt = 0 "
                         "there): its time has no derivative")
    return Au, Ap, At, g_u, g_p, den, f_minus, f_plus


class Carried:
    """An initial state handed on from an earlier piece with its parameter sensitivities
    ``S = du/dp`` (forward sensitivities across an event)."""

    is_initial_state = True

    def __init__(self, u, S):
        self.u, self.S = u, S

    def state(self, prob, params):
        return self.u.copy()

    def initial_vjp(self, prob, params, ubar):
        return self.S.T @ ubar

    def initial_jacobian(self, prob, params):
        return self.S
