"""Models used across the sciml tests, each with random parameters and states.

Every entry of `ZOO` is a function returning a `Case`: the model, a
parameter vector and a state at which finite differences are safe (away
from the switching surfaces of piecewise terms). `evaluate` runs a model
function on plain numbers (numpy arrays and the chains' own forward): the
independent reference for the compiled ``rhs`` kernel; `evaluate_observables`
does the same for the observables (`OBSERVED`: the cases that have some,
one of them calling a net).
"""

import inspect
from dataclasses import dataclass

import numpy as np

import sciml.model as sm
from nets import Chain, Dense

# ----------------------------------------------------------------- models


def lotka_volterra(u, p, t):
    x, y = u
    return [p.alpha * x - p.beta * x * y, p.gamma * x * y - p.delta * y]


def lv_ude(u, p, t, nets):
    x, y = u
    z = nets.U(u)
    return [p.alpha * x + z[0], -p.delta * y + z[1]]


def spiral(u, p, t, nets):
    return nets.NN(u**3)


def piecewise(u, p, t):
    a, b, c = u[0], u[1], u[2]
    switch = np.where(a > b, np.sqrt(a * b), np.log(1.0 + a**2))
    gated = np.where((c > 0.5) & (t < 2.0), p.k2 * c, -p.k2 * np.abs(c - 1.0))
    return [-p.k1 * a * np.exp(-p.E / (b + 1.0)) + switch,
            np.maximum(a, c) * p.k1 - np.minimum(b, 2.0) + np.tanh(t * c),
            gated + np.clip(a - c, -0.3, 0.3) + np.sin(b) * np.cos(c) / np.sqrt(1.0 + b**2)]


def pk_two_compartment(u, p, t):
    conc = u.central / p.V
    elim = p.Vmax * conc / (p.Km + conc)  # saturable (Michaelis-Menten) clearance
    dist = p.Q * (conc - u.periph / p.Vp)
    return [-p.ka * u.depot, p.ka * u.depot - elim - dist, dist]


PK_OBSERVABLES = {"conc": lambda u, p: u.central / p.V,
                  "log_periph": lambda u, p, t: np.log(u.periph / p.Vp + 1e-3) + 0.0 * t}

# Observables of the UDE that call its net (g(u, p, t, nets)): the learned interaction
# itself, and a time-dependent mix of it with the states.
UDE_OBSERVABLES = {"x": lambda u, p: u.x,
                   "learned": lambda u, p, t, nets: nets.U(u)[1],
                   "mixed": lambda u, p, t, nets: (p.alpha * nets.U([u.y, u.x])[0] * u.x
                                                   + np.exp(-t) * u.y)}


def two_nets(u, p, t, nets):
    x, y, w = u
    za = nets.A([x, y])                  # net A
    zb1 = nets.B([w * p.k])              # net B, input through a parameter
    zb2 = nets.B([za[0]])                # net B again, fed by net A (nested)
    za2 = nets.A([np.sin(t), x * y])     # net A again, time-dependent input
    zt = nets.B([t])                     # a net of time only: no state dependence
    return [za[0] * zb1[1] - p.k * x,
            zb2[0] + zb2[1] * y + za2[0],
            zb1[0] * np.exp(-w) + p.c * za2[0] * x + zt[1] * w]


# ------------------------------------------------------------------ cases


@dataclass
class Case:
    name: str
    model: sm.Model
    theta: np.ndarray
    u: np.ndarray
    t: float
    f: object
    observables: dict = None  # name -> g, the reference for `evaluate_observables`


def _net_params(model, theta, rng, scale=0.7):
    for name, chain in model.nets.items():
        theta[model.param_slices[name]] = scale * rng.standard_normal(chain.n_params)
    return theta


def case_lotka_volterra(rng):
    m = sm.Model(lotka_volterra, ["x", "y"], ["alpha", "beta", "gamma", "delta"])
    theta = m.init_params(alpha=1.3, beta=0.9, gamma=0.8, delta=1.8) * rng.uniform(0.5, 1.5, 4)
    return Case("lotka_volterra", m, theta, rng.uniform(0.5, 3.0, 2), 0.3, lotka_volterra)


def ude_chain():
    return Chain(2, Dense(5, "rbf"), Dense(5, "rbf"), Dense(5, "rbf"), Dense(2))


def case_ude(rng):
    m = sm.Model(lv_ude, ["x", "y"], ["alpha", "delta"], nets={"U": ude_chain()})
    theta = _net_params(m, m.init_params(alpha=1.3, delta=1.8), rng)
    return Case("ude", m, theta, rng.uniform(0.2, 2.0, 2), 0.0, lv_ude)


def case_ude_observed(rng):
    m = sm.Model(lv_ude, ["x", "y"], ["alpha", "delta"], nets={"U": ude_chain()},
                 observables=UDE_OBSERVABLES)
    theta = _net_params(m, m.init_params(alpha=1.3, delta=1.8), rng)
    return Case("ude_observed", m, theta, rng.uniform(0.2, 2.0, 2), 0.6, lv_ude,
                UDE_OBSERVABLES)


def spiral_chain():
    return Chain(2, Dense(50, "tanh"), Dense(2))


def case_spiral(rng):
    m = sm.Model(spiral, ["u1", "u2"], [], nets={"NN": spiral_chain()})
    theta = _net_params(m, m.init_params(), rng, scale=0.3)
    return Case("spiral", m, theta, rng.uniform(-1.5, 1.5, 2), 0.0, spiral)


def case_piecewise(rng):
    m = sm.Model(piecewise, ["a", "b", "c"], ["k1", "k2", "E"])
    theta = m.init_params(k1=0.7, k2=1.1, E=0.4) * rng.uniform(0.8, 1.2, 3)
    # Away from every switch: a - b, c - 0.5, c - 1, a - c +- 0.3, b - 2, t - 2.
    u = np.array([1.7, 0.9, 1.4]) + rng.uniform(-0.05, 0.05, 3)
    return Case("piecewise", m, theta, u, 1.2, piecewise)


def case_pk(rng):
    names = ["ka", "V", "Vmax", "Km", "Q", "Vp"]
    m = sm.Model(pk_two_compartment, ["depot", "central", "periph"], names,
                 observables=PK_OBSERVABLES)
    values = dict(zip(names, [1.2, 30.0, 12.0, 2.5, 4.0, 50.0]))
    theta = m.init_params(**values) * rng.uniform(0.8, 1.2, len(names))
    return Case("pk", m, theta, rng.uniform([50, 20, 5], [200, 80, 40]), 2.0,
                pk_two_compartment, PK_OBSERVABLES)


def case_two_nets(rng):
    nets = {"A": Chain(2, Dense(4, "tanh"), Dense(1)),
            "B": Chain(1, Dense(3, "softplus"), Dense(2, "sigmoid"))}
    m = sm.Model(two_nets, ["x", "y", "w"], ["k", "c"], nets=nets)
    theta = _net_params(m, m.init_params(k=0.6, c=-0.4), rng)
    return Case("two_nets", m, theta, rng.uniform(-1, 1, 3), 0.7, two_nets)


def case_neural_ode(rng):
    m = sm.NeuralODE(Chain(3, Dense(8, "gelu"), Dense(3)))
    theta = _net_params(m, m.init_params(), rng)
    return Case("neural_ode", m, theta, rng.uniform(-1, 1, 3), 0.0, None)


ZOO = [case_lotka_volterra, case_ude, case_spiral, case_piecewise, case_pk, case_two_nets,
       case_neural_ode]
# The cases with observables (not all in ZOO, which other tests run whole).
OBSERVED = [case_pk, case_ude_observed]


# -------------------------------------------------------------- reference


class NamedArray(np.ndarray):
    """A float vector whose entries can also be read by name (``u.x``)."""

    def __getattr__(self, name):
        names = self.__dict__.get("names", ())
        if name in names:
            return float(np.asarray(self)[names.index(name)])
        raise AttributeError(name)


def named(values, names):
    a = np.array(values, dtype=np.float64).view(NamedArray)
    a.names = list(names)
    return a


class _NumericNets:
    def __init__(self, model, theta):
        self._model, self._theta = model, theta

    def __getattr__(self, name):
        chain = self._model.nets[name]
        p = self._theta[self._model.param_slices[name]]
        return lambda x: chain(np.array([float(v) for v in x]), p)


def _arguments(case, u, theta, t):
    m = case.model
    u = case.u if u is None else u
    theta = case.theta if theta is None else theta
    t = case.t if t is None else t
    return [named(u, m.states), named(theta[:len(m.params)], m.params), t,
            _NumericNets(m, theta)]


def evaluate(case, u=None, theta=None, t=None):
    """The model function of `case` on numbers: du/dt as a float array."""
    m = case.model
    u = case.u if u is None else u
    theta = case.theta if theta is None else theta
    t = case.t if t is None else t
    if case.f is None:  # NeuralODE
        chain = m.nets["net"]
        return chain(np.asarray(u, float), theta[m.param_slices["net"]])
    args = [named(u, m.states), named(theta[:len(m.params)], m.params), t]
    if m.nets:
        args.append(_NumericNets(m, theta))
    return np.array([float(v) for v in case.f(*args)])


def evaluate_observables(case, u=None, theta=None, t=None):
    """The observables of `case` on numbers, in the model's order, as a float array."""
    args = _arguments(case, u, theta, t)
    out = []
    for name in case.model.obs_names:
        g = case.observables[name]
        n = len(inspect.signature(g).parameters)
        out.append(float(g(*args[:n])))
    return np.array(out)
