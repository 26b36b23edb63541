"""Model-like objects from hand-written kernel text, for testing the solvers on their own.

`HandModel` builds a generated module exactly as `sciml.Model` does (header,
kernels, then the text of every template in `sciml.solvers.TEMPLATES`, via
`build_module`), from kernels written out by hand; it has the attributes the
solvers use (`states`, `n_states`, `n_params`, `obs_names`, `module`,
`ws_size`, `workspace()`). Each model below also has a plain-numpy `f` for
references.
"""

import functools
import textwrap

import numpy as np

from sciml._codegen import build_module, template_source
from sciml._kernelgen import HEADER  # the imports every generated module starts with
from sciml.solvers import TEMPLATES


class HandModel:
    def __init__(self, states, params, kernels, obs_names=(), ws_size=0, f=None):
        self.states = tuple(states)
        self.params = tuple(params)
        self.obs_names = tuple(obs_names)
        self.ws_size = ws_size
        self.f = f
        consts = (f"N_STATES = {len(self.states)}\nN_PARAMS = {len(self.params)}\n"
                  f"N_OBS = {len(self.obs_names)}\nWS_SIZE = {ws_size}\n")
        source = "\n".join([HEADER, consts, textwrap.dedent(kernels)]
                           + [template_source(m) for m in TEMPLATES])
        self.module = build_module(source)

    n_states = property(lambda self: len(self.states))
    n_params = property(lambda self: len(self.params))
    n_obs = property(lambda self: len(self.obs_names))

    def workspace(self):
        return np.zeros(self.ws_size)

    def __repr__(self):
        return f"HandModel({self.states})"


@functools.cache
def exact():
    """u1' = -2 t u1^2, u2' = u1 u2: u = (1/(1+t^2), exp(arctan t)) from (1, 1). Nonlinear."""
    return HandModel(["a", "b"], [], """
        @jit
        def rhs_into(du, u, p, t, ws):
            du[0] = -2.0 * t * u[0] * u[0]
            du[1] = u[0] * u[1]
        """, f=lambda t, u: [-2 * t * u[0] ** 2, u[0] * u[1]])


def exact_solution(t):
    t = np.asarray(t, dtype=float)
    return np.stack([1 / (1 + t ** 2), np.exp(np.arctan(t))], axis=-1)


@functools.cache
def lotka_volterra():
    """x' = alpha x - beta x y, y' = delta x y - gamma y; params (alpha, beta, gamma, delta)."""
    return HandModel(["x", "y"], ["alpha", "beta", "gamma", "delta"], """
        @jit
        def rhs_into(du, u, p, t, ws):
            du[0] = p[0] * u[0] - p[1] * u[0] * u[1]
            du[1] = p[3] * u[0] * u[1] - p[2] * u[1]

        @jit
        def jac_into(J, u, p, t, ws):
            J[0, 0] = p[0] - p[1] * u[1]
            J[0, 1] = -p[1] * u[0]
            J[1, 0] = p[3] * u[1]
            J[1, 1] = p[3] * u[0] - p[2]
        """, f=lambda t, u, p: [p[0] * u[0] - p[1] * u[0] * u[1],
                                p[3] * u[0] * u[1] - p[2] * u[1]])


@functools.cache
def pk():
    """One-compartment oral PK: depot' = -ka depot, central' = ka depot - ke central.

    params (ka, ke, V); observable conc = central / V.
    """
    return HandModel(["depot", "central"], ["ka", "ke", "V"], """
        @jit
        def rhs_into(du, u, p, t, ws):
            du[0] = -p[0] * u[0]
            du[1] = p[0] * u[0] - p[1] * u[1]

        @jit
        def jac_into(J, u, p, t, ws):
            J[0, 0] = -p[0]
            J[0, 1] = 0.0
            J[1, 0] = p[0]
            J[1, 1] = -p[1]

        @jit
        def obs_into(y, u, p, t, ws):
            y[0] = u[1] / p[2]
        """, obs_names=["conc"])


@functools.cache
def blowup():
    """u' = u^2: from u(0) = 1 the solution 1/(1 - t) blows up at t = 1."""
    return HandModel(["u"], [], """
        @jit
        def rhs_into(du, u, p, t, ws):
            du[0] = u[0] * u[0]
        """)


@functools.cache
def sqrt_drain():
    """u' = -1 - sqrt(u): u reaches 0 with slope -1, and f is NaN past it."""
    return HandModel(["u"], [], """
        @jit
        def rhs_into(du, u, p, t, ws):
            du[0] = -1.0 - math.sqrt(u[0]) if u[0] >= 0.0 else math.nan
        """)


@functools.cache
def kepler():
    """The two-body problem q'' = -q / |q|^3 as 4 first-order states (q1, q2, p1, p2)."""
    return HandModel(["q1", "q2", "p1", "p2"], [], """
        @jit
        def rhs_into(du, u, p, t, ws):
            r2 = u[0] * u[0] + u[1] * u[1]
            r3 = r2 * math.sqrt(r2)
            du[0] = u[2]
            du[1] = u[3]
            du[2] = -u[0] / r3
            du[3] = -u[1] / r3
        """)


def kepler_solution(t, e=0.5):
    """Exact orbit of eccentricity `e`, period 2 pi, from periapsis at t = 0 (Kepler's equation)."""
    t = np.asarray(t, dtype=float)
    E = t.copy()
    for _ in range(60):  # Newton on E - e sin E = t
        E = E - (E - e * np.sin(E) - t) / (1 - e * np.cos(E))
    d = 1 - e * np.cos(E)
    s = np.sqrt(1 - e * e)
    return np.stack([np.cos(E) - e, s * np.sin(E), -np.sin(E) / d, s * np.cos(E) / d], axis=-1)
