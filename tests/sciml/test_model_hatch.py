"""`Model.from_kernels`: a model from hand-written numba kernels (the escape hatch).

The kernels below are module-level and cached, as the hatch requires; the
generated module imports them by name, adds `jac_into` / `paramjac_into`
from `vjp_into` rows and traced observables, and the solver templates.
"""

import numba
import numpy as np
import pytest

import sciml.model as sm

from .test_model_kernels import ATOL, RTOL, central_diff

# A discretised 1-D reaction-diffusion (Fisher-KPP) equation, the kind of
# model tracing is not meant for: du_i = D (u_{i-1} - 2u_i + u_{i+1}) / h^2 + r u_i (1 - u_i),
# zero-flux boundaries. ws[:N] holds the Laplacian (scratch, to exercise `ws`).
N = 6


@numba.njit(cache=True)
def fisher_rhs(du, u, p, t, ws):
    D, r = p[0], p[1]
    n = u.shape[0]
    for i in range(n):
        left = u[i - 1] if i > 0 else u[i]
        right = u[i + 1] if i < n - 1 else u[i]
        ws[i] = left - 2.0 * u[i] + right
    for i in range(n):
        du[i] = D * ws[i] + r * u[i] * (1.0 - u[i])


@numba.njit(cache=True)
def fisher_vjp(ubar, pbar, lam, u, p, t, ws):
    D, r = p[0], p[1]
    n = u.shape[0]
    for i in range(n):
        ubar[i] = lam[i] * r * (1.0 - 2.0 * u[i])
    for i in range(n):
        # d(lap_i)/du: -2 at i, +1 at the neighbours (the mirrored boundary adds back one).
        li = lam[i] * D
        left = i - 1 if i > 0 else i
        right = i + 1 if i < n - 1 else i
        ubar[left] += li
        ubar[right] += li
        ubar[i] -= 2.0 * li
        lap = (u[left] - 2.0 * u[i] + u[right])
        pbar[0] += lam[i] * lap
        pbar[1] += lam[i] * u[i] * (1.0 - u[i])


def build(**kw):
    """The Fisher-KPP model from the kernels above (also used by the cache test)."""
    return sm.Model.from_kernels(fisher_rhs, fisher_vjp, [f"c{i}" for i in range(N)],
                                 ["D", "r"], ws_size=N,
                                 observables={"total": lambda u, p: np.sum(u)}, **kw)


@pytest.fixture(scope="module")
def model():
    return build()


def numpy_rhs(u, p):
    padded = np.concatenate([[u[0]], u, [u[-1]]])
    return p[0] * (padded[:-2] - 2 * u + padded[2:]) + p[1] * u * (1 - u)


def test_rhs_and_generated_derivatives(model, rng):
    u, theta = rng.uniform(0, 1, N), np.array([0.3, 1.1])
    np.testing.assert_allclose(model.rhs(u, theta), numpy_rhs(u, theta), rtol=1e-14)
    J = model.jac(u, theta)
    np.testing.assert_allclose(J, central_diff(lambda v: numpy_rhs(v, theta), u), rtol=RTOL,
                               atol=ATOL)
    Jp = model.paramjac(u, theta)
    np.testing.assert_allclose(Jp, central_diff(lambda th: numpy_rhs(u, th), theta), rtol=RTOL,
                               atol=ATOL)
    lam = rng.standard_normal(N)
    ubar, pbar = model.vjp(lam, u, theta)
    np.testing.assert_allclose(ubar, lam @ J, rtol=1e-12)
    np.testing.assert_allclose(pbar, lam @ Jp, rtol=1e-12)


def test_observables_are_traced(model, rng):
    u = rng.uniform(0, 1, N)
    assert model.obs_names == ("total",)
    np.testing.assert_allclose(model.observe(u, np.ones(2)), [u.sum()])


def test_properties_and_imports(model):
    assert model.states == tuple(f"c{i}" for i in range(N)) and model.params == ("D", "r")
    assert model.n_params == 2 and model.ws_size >= N
    assert f"from {__name__} import fisher_rhs as rhs_into" in model.source
    assert model.module.rhs_into is fisher_rhs


def test_user_jacobian_is_used_when_given(model):
    m = build(jac_into=fisher_jac)
    assert m.module.jac_into is fisher_jac
    u, theta = np.linspace(0.1, 0.9, N), np.array([0.3, 1.1])
    np.testing.assert_allclose(m.jac(u, theta), model.jac(u, theta), rtol=1e-14)


@numba.njit(cache=True)
def fisher_jac(J, u, p, t, ws):
    D, r = p[0], p[1]
    n = u.shape[0]
    for i in range(n):
        for j in range(n):
            J[i, j] = 0.0
    for i in range(n):
        left = i - 1 if i > 0 else i
        right = i + 1 if i < n - 1 else i
        J[i, left] += D
        J[i, right] += D
        J[i, i] += -2.0 * D + r * (1.0 - 2.0 * u[i])


def test_rejects_kernels_it_cannot_import():
    with pytest.raises(TypeError, match="`rhs_into` must be a numba.njit function"):
        sm.Model.from_kernels(numpy_rhs, fisher_vjp, ["a"], [])

    @numba.njit
    def local_rhs(du, u, p, t, ws):
        du[0] = 0.0

    with pytest.raises(ValueError, match="must be a module-level function of an importable"):
        sm.Model.from_kernels(local_rhs, fisher_vjp, ["a"], [])
    main_rhs = numba.njit(lambda du, u, p, t, ws: None)
    main_rhs.__module__ = "__main__"
    with pytest.raises(ValueError, match="is defined in __main__; define it in a module file"):
        sm.Model.from_kernels(main_rhs, fisher_vjp, ["a"], [])
    with pytest.raises(ValueError, match="`ws_size` must be an int >= 0"):
        sm.Model.from_kernels(fisher_rhs, fisher_vjp, ["a"], [], ws_size=-1)

