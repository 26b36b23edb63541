"""A problem with parameter changes (`sciml.Change`) as the segments between them.

Each segment is an ordinary `ODEProblem` (its own parameter vector, the doses that
fall in it, the state reached as its start), so the compiled loops and every
sensitivity method run on it unchanged; `solve` and `loss_and_grad` chain them.
A bolus at a change time belongs to the later segment (given at its start), as at
any stop; the state is continuous across a change.

How the gradient maps back: segment k runs with ``p_k = p`` except where a change
has set a parameter, to a number (that entry of ``p_k`` does not depend on ``p``)
or to another parameter ``j`` (``p_k[i] = p[j]``). A change whose time is a
parameter moves with it: ``dL/dtau = w . (f(u, p_before, tau) - f(u, p_after, tau))``
with ``w = dL/du(tau)``, the adjoint there.
"""

from dataclasses import dataclass

import numpy as np

from .problem import Bolus, Infusion, ODEProblem

__all__ = ["Segment", "segments", "piece_problem", "doses_in", "in_span"]


def in_span(t, lo, hi, closed):
    """Which of the times `t` a piece ``[lo, hi)`` holds (``[lo, hi]`` when `closed`: the
    last piece; a time on a boundary belongs to the later piece, after what happens there)."""
    return (t >= lo) & ((t < hi) | (closed & (t <= hi)))


@dataclass
class Segment:
    """One stretch of a problem between parameter changes.

    tspan : (start, end); p : its flat parameters; source : (n_params,) int, the entry of
    the problem's parameters each entry of ``p`` equals (-1: a number set by a change);
    doses : the doses given in it; time_param : index of the parameter that is the
    segment's start time (-1: a fixed time or the problem's start).
    """

    tspan: tuple
    p: np.ndarray
    source: np.ndarray
    doses: tuple
    time_param: int

    def pull_back(self, g, out):
        """Adds the segment's parameter gradient `g` into `out` (over the problem's)."""
        keep = self.source >= 0
        np.add.at(out, self.source[keep], g[keep])


def segments(prob, params):
    """The segments of `prob` at the flat `params` (one when it has no changes)."""
    t0, tf = prob.tspan
    n = prob.model.n_params
    index = {name: i for i, name in enumerate(prob.model.params)}
    at = {}
    for c in prob.changes:
        t = float(params[index[c.time]]) if isinstance(c.time, str) else float(c.time)
        if not t0 < t < tf:
            raise ValueError(f"ODEProblem: a change at t = {t:g} (parameter {c.time!r}) lies "
                             f"outside the open interval tspan = {prob.tspan}")
        tp = index[c.time] if isinstance(c.time, str) else -1
        prev = at.setdefault(t, [tp, {}])
        if tp >= 0:
            prev[0] = tp
        prev[1].update(c.params)
    times = sorted(at)
    source = np.arange(n)
    value = np.array(params, dtype=np.float64)
    bounds = [t0, *times, tf]
    out = []
    for k in range(len(bounds) - 1):
        tp = -1
        if k > 0:
            tp, upd = at[bounds[k]]
            for name, v in upd.items():
                i = index[name]
                if isinstance(v, str):
                    source[i] = source[index[v]]
                    value[i] = value[index[v]]
                else:
                    source[i], value[i] = -1, float(v)
        lo, hi = bounds[k], bounds[k + 1]
        last = k == len(bounds) - 2
        out.append(Segment((lo, hi), value.copy(), source.copy(),
                           doses_in(prob.doses, lo, hi, last), tp))
    return out


def doses_in(doses, lo, hi, last):
    """The single doses of `doses` given in ``[lo, hi)`` (``[lo, hi]`` for the last
    segment); infusions that overlap it, cut to it."""
    out = []
    for d in doses:
        for t in d.times():
            if isinstance(d, Bolus):
                if lo <= t < hi or (last and t == hi):
                    out.append(Bolus(float(t), d.amount, d.state))
            elif isinstance(d, Infusion):
                a, b = max(t, lo), min(t + d.duration, hi)
                if a < b:
                    out.append(Infusion(float(a), float(b - a), d.rate, d.state))
    return tuple(out)


def piece_problem(prob, tspan, p, doses, u0):
    """`prob` as a plain problem over `tspan` (no changes, no events) with parameters `p`,
    the single doses `doses` (inside the span) and, unless None, the initial state `u0`."""
    q = ODEProblem.__new__(ODEProblem)
    q.__dict__.update(prob.__dict__)  # traced initial values shared
    object.__setattr__(q, "changes", ())
    object.__setattr__(q, "events", ())
    q.doses = doses  # (inside the span: valid for the new span set next)
    q.tstops = [t for t in prob.tstops if tspan[0] < t < tspan[1]]
    q.tspan = tspan
    q.params = p
    if u0 is not None:
        q.u0 = u0
    return q
