"""Small models with known solutions, for testing the solvers on their own.

Each is an ordinary traced `sciml.Model` (tracing and kernel generation are
tested elsewhere, against numpy and finite differences); each has a plain
numpy ``f`` attached for references where a test needs one.
"""

import functools

import numpy as np

import sciml


def _model(f, states, params, observables=None, ref=None):
    model = sciml.Model(f, states, params, observables=observables)
    model.f = ref
    return model


@functools.cache
def exact():
    """u1' = -2 t u1^2, u2' = u1 u2: u = (1/(1+t^2), exp(arctan t)) from (1, 1). Nonlinear."""
    return _model(lambda u, p, t: [-2.0 * t * u[0] * u[0], u[0] * u[1]], ["a", "b"], [],
                  ref=lambda t, u: [-2 * t * u[0] ** 2, u[0] * u[1]])


def exact_solution(t):
    t = np.asarray(t, dtype=float)
    return np.stack([1 / (1 + t ** 2), np.exp(np.arctan(t))], axis=-1)


@functools.cache
def lotka_volterra():
    """x' = alpha x - beta x y, y' = delta x y - gamma y; params (alpha, beta, gamma, delta)."""
    def f(u, p, t):
        x, y = u
        return [p.alpha * x - p.beta * x * y, p.delta * x * y - p.gamma * y]

    return _model(f, ["x", "y"], ["alpha", "beta", "gamma", "delta"],
                  ref=lambda t, u, p: [p[0] * u[0] - p[1] * u[0] * u[1],
                                       p[3] * u[0] * u[1] - p[2] * u[1]])


@functools.cache
def pk():
    """One-compartment oral PK: depot' = -ka depot, central' = ka depot - ke central.

    params (ka, ke, V); observable conc = central / V.
    """
    def f(u, p, t):
        return [-p.ka * u.depot, p.ka * u.depot - p.ke * u.central]

    return _model(f, ["depot", "central"], ["ka", "ke", "V"],
                  observables={"conc": lambda u, p: u.central / p.V})


@functools.cache
def blowup():
    """u' = u^2: from u(0) = 1 the solution 1/(1 - t) blows up at t = 1."""
    return _model(lambda u, p, t: [u[0] * u[0]], ["u"], [])


@functools.cache
def sqrt_drain():
    """u' = -1 - sqrt(u): u reaches 0 with slope -1, and f is NaN past it."""
    return _model(lambda u, p, t: [np.where(u[0] >= 0.0, -1.0 - np.sqrt(u[0]), np.nan)], ["u"],
                  [])


@functools.cache
def kepler():
    """The two-body problem q'' = -q / |q|^3 as 4 first-order states (q1, q2, p1, p2)."""
    def f(u, p, t):
        r2 = u[0] * u[0] + u[1] * u[1]
        r3 = r2 * np.sqrt(r2)
        return [u[2], u[3], -u[0] / r3, -u[1] / r3]

    return _model(f, ["q1", "q2", "p1", "p2"], [])


def kepler_solution(t, e=0.5):
    """Exact orbit of eccentricity `e`, period 2 pi, from periapsis at t = 0 (Kepler's equation)."""
    t = np.asarray(t, dtype=float)
    E = t.copy()
    for _ in range(60):  # Newton on E - e sin E = t
        E = E - (E - e * np.sin(E) - t) / (1 - e * np.cos(E))
    d = 1 - e * np.cos(E)
    s = np.sqrt(1 - e * e)
    return np.stack([np.cos(E) - e, s * np.sin(E), -np.sin(E) / d, s * np.cos(E) / d], axis=-1)
