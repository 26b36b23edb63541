"""Steady states: closed forms, conservation laws, the integration fallback, and exact
gradients through pre-equilibration for every sensitivity method (finite differences)."""

import numpy as np
import pytest

import adjoints
import sciml

from .central import loss_gradient


def _production(u, p, t, nets):
    x, y = u
    return [p.s - p.k1 * x + p.k2 * y - p.d * x, p.k1 * x - p.k2 * y]


def _exchange(u, p, t, nets):  # x <-> y: x + y is conserved
    x, y = u
    return [-p.k1 * x * x + p.k2 * y, p.k1 * x * x - p.k2 * y]


PROD = sciml.Model(_production, states=["x", "y"], params=["s", "k1", "k2", "d"])
EXCH = sciml.Model(_exchange, states=["x", "y"], params=["k1", "k2"])
TH = np.array([2.0, 0.7, 0.3, 0.5])


def test_closed_form_without_conservation():
    ss = sciml.steady_state(sciml.ODEProblem(PROD, [0.0, 0.0], (0.0, 1.0), TH))
    s, k1, k2, d = TH
    assert ss.converged and ss.method == "newton"
    np.testing.assert_allclose(ss.u, [s / d, k1 * s / (k2 * d)], rtol=1e-12)
    assert ss.conserved.shape == (0, 2)


def test_conserved_total_fixed_by_the_start():
    k1, k2 = 0.7, 0.3
    prob = sciml.ODEProblem(EXCH, [1.0, 3.0], (0.0, 1.0), np.array([k1, k2]))
    ss = sciml.steady_state(prob)
    # k1 x^2 = k2 (T - x), T = 4
    x = (-k2 + np.sqrt(k2 ** 2 + 4 * k1 * k2 * 4.0)) / (2 * k1)
    assert ss.converged
    np.testing.assert_allclose(ss.u, [x, 4.0 - x], rtol=1e-10)
    assert ss.conserved.shape == (1, 2)


def test_integration_fallback_when_newton_stops_short():
    prob = sciml.ODEProblem(EXCH, [1.0, 3.0], (0.0, 1.0), np.array([0.7, 0.3]))
    ss = sciml.steady_state(prob, max_iter=1)
    assert ss.converged and ss.method == "integrate"
    np.testing.assert_allclose(ss.u, sciml.steady_state(prob).u, rtol=1e-8)


def test_vjp_against_finite_differences():
    prob = sciml.ODEProblem(EXCH, lambda p, nets: [p.k2, 3.0], (0.0, 1.0), np.array([0.7, 0.3]))
    lam = np.array([0.3, -1.1])
    ss = sciml.steady_state(prob)
    gp, gs = ss.vjp(lam)
    g = gp + prob.initial_vjp(prob.params, gs)   # through the start's total too

    def val(p):
        return lam @ sciml.steady_state(prob, params=p, rtol=1e-12, atol=1e-14).u

    fd = [(val(prob.params + e) - val(prob.params - e)) / 2e-6 for e in np.eye(2) * 1e-6]
    np.testing.assert_allclose(g, fd, rtol=1e-6)


METHODS = [adjoints.ForwardSensitivity, adjoints.GaussAdjoint, adjoints.DiscreteAdjoint,
           adjoints.InterpolatingAdjoint, adjoints.BacksolveAdjoint,
           adjoints.QuadratureAdjoint]


@pytest.fixture(scope="module")
def preequilibrated():
    """Pre-equilibrated under its own parameters, then a bolus at t = 0."""
    t_obs = np.linspace(0.5, 5.0, 10)
    prob = sciml.ODEProblem(PROD, sciml.SteadyState(), (0.0, 5.0), TH,
                            doses=[sciml.Bolus(0.0, 3.0, "x")])
    sol = sciml.solve(prob, sciml.Tsit5(), rtol=1e-10, atol=1e-10, saveat=t_obs)
    data = sciml.Data(t=t_obs, y=sol.u * 1.1)

    return prob, data, loss_gradient(prob, data, TH, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("solver", [sciml.Tsit5(), sciml.Rodas5()], ids=lambda s: s.name)
def test_gradient_through_preequilibration(preequilibrated, method, solver):
    prob, data, fd = preequilibrated
    _, g = sciml.loss_and_grad(prob, data, solver=solver, sensealg=method(), rtol=1e-10,
                               atol=1e-10)
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_starts_at_rest_and_stays():
    prob = sciml.ODEProblem(PROD, sciml.SteadyState(), (0.0, 5.0), TH)
    sol = sciml.solve(prob, sciml.Rodas5(), rtol=1e-10, atol=1e-10, saveat=[0.0, 5.0])
    s, k1, k2, d = TH
    np.testing.assert_allclose(sol.u, [[s / d, k1 * s / (k2 * d)]] * 2, rtol=1e-8)


def test_fixed_parameters_are_not_differentiated():
    other = TH * np.array([2.0, 1.0, 1.0, 1.0])
    prob = sciml.ODEProblem(PROD, sciml.SteadyState(params=other), (0.0, 5.0), TH)
    np.testing.assert_allclose(prob.u0, [other[0] / TH[3], TH[1] * other[0] / (TH[2] * TH[3])])
    np.testing.assert_array_equal(prob.initial_vjp(TH, np.ones(2)), 0.0)


def test_no_steady_state_is_a_clear_error():
    def blowup(u, p, t, nets):  # no real root; the integration escapes by t = pi / 2
        return [p.r + u[0] * u[0]]

    m = sciml.Model(blowup, states=["x"], params=["r"])
    prob = sciml.ODEProblem(m, sciml.SteadyState(), (0.0, 1.0), np.array([1.0]))
    with pytest.raises(RuntimeError, match="no steady state"):
        _ = prob.u0
    with pytest.raises(ValueError, match="`rtol`"):
        sciml.steady_state(prob, rtol=-1.0)
