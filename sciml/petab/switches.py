"""Switches in time: SBML ``piecewise`` conditions such as ``time < tau`` or
``time >= t_dose`` as parameter changes at the switching times.

A right-hand side that jumps at a time the integrator does not know is integrated
across the kink with the step it happens to take (slow at tight tolerance, and
never exactly). As AMICI does with its Heaviside variables, each such condition
becomes a flag parameter (1 while the condition holds) and each switching time a
parameter of its own, whose value is the condition's root in time (an expression
of the model's parameters, so it may be estimated). A simulation then runs as
`sciml.Change` segments between the switching times inside its span, each with
its flags fixed; the gradient includes how the loss moves with a switching time
(`sciml.segments`).

Only conditions linear in time and free of states are switches; others (state
thresholds: events) stay in the right-hand side as they are.
"""

import numpy as np
import sympy

from ..problem import Change
from .errors import PetabError
from .sbml import TIME, symbol

__all__ = ["Switches"]


class Switches:
    """The time switches of a model's expressions.

    Attributes
    ----------
    flags : list of str
        One model parameter per condition (1.0 while it holds, else 0.0).
    times : list of str
        One model parameter per distinct switching time.
    synthetic : dict str -> sympy.Expr
        The value of each new parameter in the model's symbols (a flag's is a
        placeholder: simulations set it).
    """

    def __init__(self, exprs, states, taken, events=(), path="", state_names=()):
        rels = set()
        for e in exprs:
            rels |= {r for r in e.atoms(sympy.core.relational.Relational)
                     if TIME in r.free_symbols and not (r.free_symbols & states)
                     and not isinstance(r, (sympy.Eq, sympy.Ne))}
        self.subs, self.flags, self.times, self.synthetic = {}, [], [], {}
        self._conds, self._of_flag = [], []
        tau_name = {}
        for r in sorted(rels, key=str):
            g = sympy.expand(r.lhs - r.rhs)
            a = g.diff(TIME)
            if not a.is_number or a == 0:
                continue  # not linear in time with a constant slope
            tau = self._time(sympy.simplify(-(g - a * TIME) / a), tau_name, taken)
            flag = _fresh(f"switch_flag_{len(self.flags)}", taken)
            self.flags.append(flag)
            self.synthetic[flag] = sympy.Float(0.0)
            self.subs[r] = sympy.StrictGreaterThan(symbol(flag), sympy.Float(0.5))
            # the condition as the sign of a (t - tau), tested by its own relation
            self._conds.append((float(a), type(r)))
            self._of_flag.append(tau)
        self.events = []  # (time parameter, {variable: number or parameter name})
        self.state_events = []  # (id, condition expression, direction, {state: expression})
        for ev in events:
            self._event(ev, states, set(state_names), taken, tau_name, path)

    def _time(self, tau, tau_name, taken):
        """The parameter holding the switching time `tau` (one per distinct expression)."""
        if tau not in tau_name:
            name = tau_name[tau] = _fresh(f"switch_time_{len(tau_name)}", taken)
            self.times.append(name)
            self.synthetic[name] = tau
        return tau_name[tau]

    def _event(self, ev, states, state_names, taken, tau_name, path):
        """An SBML event triggered at a time: a change of the parameters it assigns."""
        where = f"{path}: SBML event {ev.id!r}"
        r = ev.trigger
        rising = (sympy.StrictGreaterThan, sympy.GreaterThan)
        falling = (sympy.StrictLessThan, sympy.LessThan)
        if not isinstance(r, rising + falling):
            raise PetabError(f"{where}: its trigger ({r}) is not one comparison (x < c, "
                             "time >= t), which is not supported")
        if r.free_symbols & states:  # a root of the state: a sciml.Event
            for var in ev.assign:
                if var not in state_names:
                    raise PetabError(f"{where} is triggered by the state and assigns the "
                                     f"parameter {var!r}, which is not supported (only "
                                     "states)")
            # the trigger becomes true as lhs - rhs rises through zero (>, >=) or falls
            self.state_events.append((ev.id, sympy.expand(r.lhs - r.rhs),
                                      +1 if isinstance(r, rising) else -1, dict(ev.assign)))
            return
        if TIME not in r.free_symbols:
            raise PetabError(f"{where}: its trigger ({r}) depends on neither time nor the "
                             "state")
        g = sympy.expand(r.lhs - r.rhs)
        a = g.diff(TIME)
        if not a.is_number or a == 0 or (float(a) > 0) != isinstance(r, rising):
            raise PetabError(f"{where}: its trigger ({r}) never becomes true as time passes")
        tau = self._time(sympy.simplify(-(g - a * TIME) / a), tau_name, taken)
        values = {}
        for var, e in ev.assign.items():
            if var in state_names:
                raise PetabError(f"{where} assigns the state {var!r}, which is not supported "
                                 "yet (only parameters and constant species)")
            if e.free_symbols & states:
                raise PetabError(f"{where}: the value of {var!r} depends on the state")
            if e.is_number:
                values[var] = float(e)
            else:
                name = _fresh(f"event_value_{len(self.synthetic)}", taken)
                self.synthetic[name] = e
                values[var] = name
        self.events.append((tau, values))

    def __bool__(self):
        return bool(self.flags or self.events)

    def symbols(self):
        """The symbols the state events read (they must be model parameters or states)."""
        out = set()
        for _, g, _, assign in self.state_events:
            out |= g.free_symbols
            for e in assign.values():
                out |= e.free_symbols
        return out

    @property
    def parameters(self):
        """The new parameters the model needs beside its own symbols."""
        return list(self.times) + [v for _, vals in self.events for v in vals.values()
                                   if isinstance(v, str)]

    def replace(self, e):
        """`e` with each switching condition replaced by its flag."""
        return e.xreplace(self.subs) if self.subs else e

    def bind(self, mech):
        """Where the new parameters sit among the model's mechanistic ones (`mech`)."""
        self._mech = {m: i for i, m in enumerate(mech)}

    def _flags_at(self, theta, t):
        out = []
        for (a, rel), tau in zip(self._conds, self._of_flag):
            out.append(1.0 if _OPS[rel](a * (t - float(theta[self._mech[tau]])), 0.0) else 0.0)
        return out

    def schedule(self, theta, t0, tf):
        """``(theta with the flags of the first segment, [Change, ...])`` for a simulation
        over ``(t0, tf)`` at the model parameters `theta`."""
        mech = self._mech
        taus = {name: float(theta[mech[name]]) for name in self.times}
        inner = sorted({t for t in taus.values() if t0 < t < tf})
        bounds = [t0, *inner, tf]

        def flags_at(t):
            return self._flags_at(theta, t)

        theta = theta.copy()
        now = flags_at(0.5 * (bounds[0] + bounds[1]))
        for f, v in zip(self.flags, now):
            theta[mech[f]] = v
        changes = []
        for k in range(1, len(bounds) - 1):
            new = flags_at(0.5 * (bounds[k] + bounds[k + 1]))
            upd = {f: v for f, v, old in zip(self.flags, new, now) if v != old}
            now = new
            if upd:
                name = next(n for n, t in taus.items() if t == bounds[k])
                changes.append(Change(name, upd))
        for name, values in self.events:
            mine = {v: x for v, x in values.items() if v in mech}  # (unused ones: no-ops)
            if t0 < taus[name] < tf and mine:
                changes.append(Change(name, mine))
        return theta, changes

    def at(self, theta, t):
        """`theta` with the flags as they are at time `t` (a steady state's)."""
        theta = theta.copy()
        for name, v in zip(self.flags, self._flags_at(theta, t)):
            theta[self._mech[name]] = v
        return theta


_OPS = {sympy.StrictLessThan: np.less, sympy.LessThan: np.less_equal,
        sympy.StrictGreaterThan: np.greater, sympy.GreaterThan: np.greater_equal}


def _fresh(name, taken):
    while name in taken:
        name += "_"
    taken.add(name)
    return name
