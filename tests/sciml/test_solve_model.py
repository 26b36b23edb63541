"""`sciml.solve` on models built by `sciml.Model`: mechanistic, UDE, neural ODE, dosed PK.

References are scipy's DOP853 at tight tolerances on the model's own
Python-callable right-hand side (`Model.rhs`), or closed forms.
"""

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from nets import Chain, Dense
from sciml.model import Model, NeuralODE
from sciml.problem import Bolus, Infusion, ODEProblem
from sciml.solve import solve
from sciml.solvers.erk import DP5, RK4, Tsit5, Vern7

from . import handmade as hm
from . import model_zoo as zoo
from .test_doses import KA, KE, V, bolus_depot, infusion


def reference(prob, t):
    m = prob.model
    r = solve_ivp(lambda t, u: m.rhs(u, prob.params, t), prob.tspan, prob.u0,
                  method="DOP853", rtol=1e-12, atol=1e-12, t_eval=t)
    return r.y.T


def lv(u, p, t, nets):
    x, y = u
    return [p.alpha * x - p.beta * x * y, p.delta * x * y - p.gamma * y]


@pytest.fixture(scope="module")
def lv_model():
    return Model(lv, states=["x", "y"], params=["alpha", "beta", "gamma", "delta"])


def test_lotka_volterra_model(lv_model):
    theta = lv_model.init_params(alpha=1.5, beta=1.0, gamma=3.0, delta=1.0)
    prob = ODEProblem(lv_model, [1.0, 1.0], (0.0, 10.0), theta)
    t = np.linspace(0, 10, 51)
    sol = solve(prob, Vern7(), rtol=1e-11, atol=1e-11, saveat=t)
    np.testing.assert_allclose(sol.u, reference(prob, t), rtol=1e-8, atol=1e-8)
    # the same equations written by hand take the very same steps
    hand = ODEProblem(hm.lotka_volterra(), [1.0, 1.0], (0.0, 10.0), theta)
    a, b = solve(prob, Tsit5()), solve(hand, Tsit5())
    assert a.stats == b.stats
    np.testing.assert_allclose(a.u, b.u, rtol=1e-12, atol=1e-12)
    assert a.observables == {}


def test_ude_and_neural_ode():
    U = Chain(2, Dense(5, "rbf"), Dense(5, "rbf"), Dense(2))
    model = Model(zoo.lv_ude, states=["x", "y"], params=["alpha", "delta"], nets={"U": U})
    theta = model.init_params(seed=1, alpha=1.3, delta=1.8)
    node = NeuralODE(Chain(2, Dense(16, "tanh"), Dense(2)))
    for m, th, u0 in ((model, theta, [0.44, 4.63]), (node, node.init_params(seed=2),
                                                     [2.0, 0.0])):
        prob = ODEProblem(m, u0, (0.0, 3.0), th)
        t = np.linspace(0, 3, 31)
        for solver in (Tsit5(), DP5(), Vern7()):
            # dense=True: the general loop (the lean entry per tableau: test_solve_lean.py)
            sol = solve(prob, solver, rtol=1e-10, atol=1e-10, saveat=t, dense=True)
            np.testing.assert_allclose(sol.u, reference(prob, t), rtol=1e-7, atol=1e-7)
        many = solve([prob, prob.remake(u0=np.array(u0) * 1.1)], Tsit5(), saveat=t)
        # the ensemble loop and the tableau-unrolled single loop are two compiled loops
        np.testing.assert_allclose(many[0].u, solve(prob, Tsit5(), saveat=t).u, rtol=1e-12)


def test_dosed_pk_model_with_observables():
    def rhs(u, p, t, nets):
        return [-p.ka * u.depot, p.ka * u.depot - p.CL / p.V * u.central]

    pk = Model(rhs, states=["depot", "central"], params=["ka", "CL", "V"],
               observables={"conc": lambda u, p: u.central / p.V})
    theta = pk.init_params(ka=KA, CL=KE * V, V=V)
    doses = [Bolus(0.0, 320.0, "depot", every=12.0, count=4),
             Infusion(30.0, 2.0, 50.0, "central")]
    prob = ODEProblem(pk, [0.0, 0.0], (0.0, 60.0), theta, doses=doses)
    t = np.linspace(0, 60, 241)
    exact = sum(bolus_depot(t, 12.0 * k, 320.0) for k in range(4)) + infusion(
        t, 30.0, 2.0, 50.0, "central")
    for solver, kw in ((Tsit5(), {}), (RK4(), {"dt": 0.01})):
        sol = solve(prob, solver, rtol=1e-10, atol=1e-10, saveat=t, **kw)
        np.testing.assert_allclose(sol.u, exact, rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(sol.observables["conc"], exact[:, 1] / V, rtol=1e-7,
                                   atol=1e-8)
