"""Mass matrices, ``M du/dt = f``: semi-explicit index-1 DAEs with Rodas5 and BDF.

Robertson's kinetics with its conservation law as the algebraic equation
against its ODE form, a non-unit diagonal against its closed form, consistent
initial values, and the refusals.
"""

import numpy as np
import pytest

import adjoints
import sciml

P = [0.04, 3e7, 1e4]
TS = np.concatenate([[0.0], np.geomspace(1e-4, 1e5, 10)])


def _robertson(dae):
    def f(u, p, t):
        a, b, c = u
        third = a + b + c - 1.0 if dae else p.k2 * b * b
        return [-p.k1 * a + p.k3 * b * c, p.k1 * a - p.k2 * b * b - p.k3 * b * c, third]
    return sciml.Model(f, ["a", "b", "c"], ["k1", "k2", "k3"],
                       mass_matrix=[1.0, 1.0, 0.0] if dae else None)


@pytest.mark.parametrize("solver", [sciml.Rodas5(), sciml.BDF(), sciml.Rodas5(linsolve="sparse"),
                                    sciml.BDF(linsolve="sparse")],
                         ids=["rodas5", "bdf", "rodas5-sparse", "bdf-sparse"])
def test_robertson_dae_agrees_with_its_ode_form(solver):
    kw = dict(rtol=1e-8, atol=1e-12, saveat=TS)
    # c(0) = 0.3 is inconsistent with a + b + c = 1: the solve starts from c = 0
    dae = sciml.solve(sciml.ODEProblem(_robertson(True), u0=[1.0, 0.0, 0.3], tspan=(0, 1e5),
                                       params=P), solver, **kw)
    ode = sciml.solve(sciml.ODEProblem(_robertson(False), u0=[1.0, 0.0, 0.0], tspan=(0, 1e5),
                                       params=P), solver, **kw)
    assert dae.success and ode.success
    u, v = np.asarray(dae.u), np.asarray(ode.u)
    np.testing.assert_allclose(u[0], [1.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(u, v, rtol=2e-6, atol=1e-11)
    np.testing.assert_allclose(u.sum(axis=1), 1.0, atol=1e-12)  # the algebraic equation held


@pytest.mark.parametrize("solver", [sciml.Rodas5(), sciml.BDF()], ids=["rodas5", "bdf"])
def test_a_non_unit_diagonal(solver):
    m = sciml.Model(lambda u, p, t: [-u[0], -p.k * u[1]], ["x", "y"], ["k"],
                    mass_matrix=np.diag([2.0, 1.0]))
    ts = np.linspace(0.5, 4.0, 8)
    sol = sciml.solve(sciml.ODEProblem(m, u0=[1.0, 1.0], tspan=(0, 4.0), params=[3.0]), solver,
                      rtol=1e-9, atol=1e-12, saveat=ts)
    np.testing.assert_allclose(np.asarray(sol.u), np.c_[np.exp(-ts / 2), np.exp(-3 * ts)],
                               rtol=1e-6, atol=1e-10)


def test_refusals():
    m = _robertson(True)
    prob = sciml.ODEProblem(m, u0=[1.0, 0.0, 0.0], tspan=(0, 1.0), params=P)
    with pytest.raises(ValueError, match="Tsit5 cannot solve a model with a mass matrix"):
        sciml.solve(prob, sciml.Tsit5(), saveat=np.array([0.5, 1.0]))
    data = sciml.Data(np.array([0.5, 1.0]), np.ones((2, 3)))
    with pytest.raises(ValueError, match="mass matrix .* not available yet"):
        sciml.loss_and_grad(prob, data, solver=sciml.Rodas5(), sensealg=adjoints.GaussAdjoint())
    with pytest.raises(ValueError, match="must be diagonal"):
        sciml.Model(lambda u, p, t: [u[1], -u[0]], ["x", "y"], [], mass_matrix=[[1, 1], [0, 1]])
    with pytest.raises(ValueError, match=r"must be \(2, 2\) or its diagonal \(2,\)"):
        sciml.Model(lambda u, p, t: [u[1], -u[0]], ["x", "y"], [], mass_matrix=[1, 1, 0])
    assert sciml.Model(lambda u, p, t: [u[1], -u[0]], ["x", "y"], [],
                       mass_matrix=[1, 1]).mass_matrix is None  # the identity: an ODE
