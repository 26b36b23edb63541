"""Parameter changes within a solve (`sciml.Change`): the solution against its closed form,
gradients against central finite differences for every adjoint method with Tsit5 and
Rodas5, forward sensitivities included (a change whose time is a parameter, one that sets
a number, doses across the
segments, observables under the changed parameters), and the errors."""

import numpy as np
import pytest

import adjoints
import sciml

from .central import loss_gradient


def _relax(u, p, t, nets):
    return [p.a - p.k * u[0]]


MODEL = sciml.Model(_relax, states=["x"], params=["a", "k", "tau", "k2"],
                    observables={"y": lambda u, p: p.a * u.x})
TH = np.array([1.0, 0.5, 2.0, 1.5])
TS = np.linspace(0.3, 5.0, 20)   # no observation on a change time


def _problem(**kw):
    return sciml.ODEProblem(MODEL, [0.0], (0.0, 5.0), TH,
                            changes=[sciml.Change("tau", {"k": "k2"}),
                                     sciml.Change(3.5, {"a": 0.2})], **kw)


def _closed_form(ts):
    a, k, tau, k2 = TH
    x_tau = a / k * (1 - np.exp(-k * tau))
    x_35 = a / k2 + (x_tau - a / k2) * np.exp(-k2 * (3.5 - tau))
    return np.where(ts < tau, a / k * (1 - np.exp(-k * ts)),
                    np.where(ts < 3.5, a / k2 + (x_tau - a / k2) * np.exp(-k2 * (ts - tau)),
                             0.2 / k2 + (x_35 - 0.2 / k2) * np.exp(-k2 * (ts - 3.5))))


def test_solution_against_its_closed_form():
    sol = sciml.solve(_problem(), sciml.Tsit5(), rtol=1e-10, atol=1e-12, saveat=TS)
    np.testing.assert_allclose(sol.u[:, 0], _closed_form(TS), atol=1e-9)
    every = sciml.solve(_problem(), sciml.Rodas5(), rtol=1e-8, atol=1e-10)
    assert np.all(np.diff(every.t) > 0) and every.t[-1] == 5.0
    np.testing.assert_allclose(every.u[:, 0], _closed_form(every.t), atol=1e-6)


METHODS = [adjoints.ForwardSensitivity, adjoints.GaussAdjoint, adjoints.DiscreteAdjoint,
           adjoints.InterpolatingAdjoint, adjoints.BacksolveAdjoint, adjoints.QuadratureAdjoint]


@pytest.fixture(scope="module", params=["states", "observables"])
def case(request):
    prob = _problem(doses=[sciml.Bolus(1.0, 0.5, "x"), sciml.Bolus(3.0, 0.25, "x")])
    y = 1.2 * _closed_form(TS)[:, None]
    data = sciml.Data(t=TS, y=y) if request.param == "states" else \
        sciml.Data(t=TS, y=y, observables=["y"])

    return prob, data, loss_gradient(prob, data, TH)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("solver", [sciml.Tsit5(), sciml.Rodas5()], ids=lambda s: s.name)
def test_gradient_across_changes(case, method, solver):
    prob, data, fd = case
    _, g = sciml.loss_and_grad(prob, data, solver=solver, sensealg=method(), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-9 * np.max(np.abs(fd)))


def test_default_method():
    prob = _problem()
    data = sciml.Data(t=TS, y=_closed_form(TS)[:, None])
    v, g = sciml.loss_and_grad(prob, data, rtol=1e-10, atol=1e-12)
    assert np.isfinite(v) and np.all(np.isfinite(g))


def test_errors_name_the_change():
    with pytest.raises(ValueError, match=r"changes\[0\]` names 'nope'"):
        sciml.ODEProblem(MODEL, [0.0], (0.0, 5.0), TH, changes=[sciml.Change(1.0, {"nope": 1})])
    with pytest.raises(ValueError, match="outside the open interval"):
        sciml.ODEProblem(MODEL, [0.0], (0.0, 5.0), TH, changes=[sciml.Change(5.0, {"k": 1.0})])
    with pytest.raises(ValueError, match="non-empty dict"):
        sciml.Change(1.0, {})
    with pytest.raises(ValueError, match="dense output"):
        sciml.solve(_problem(), dense=True)


def test_forward_sensitivities_of_some_parameters(case):
    prob, data, fd = case
    _, g = sciml.loss_and_grad(prob, data, sensealg=adjoints.ForwardSensitivity(params=[0, 3]),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g[[0, 3]], fd[[0, 3]], rtol=1e-6)
    np.testing.assert_array_equal(g[[1, 2]], 0.0)
