"""The variable-order BDF (`sciml.BDF`, `kernels.bdf`).

Against closed forms (convergence with the order bound), a tight Radau
reference (Robertson), Rodas5 (doses, dense output), itself with the sparse
LU, numba's allocation counters, and central differences for the gradient
methods that step through it.
"""

import warnings

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import adjoints
import sciml
from adjoints import GaussAdjoint

from ..alloc import own_allocations
from . import stiff_models
from .stiff_models import robertson_groups

K = 50.0
TS = np.linspace(1.0, 10.0, 46)


def _forced():
    def f(u, p, t):
        return [-p.k * (u[0] - np.cos(t)) - np.sin(t), -p.k * u[1]]
    m = sciml.Model(f, ["a", "b"], ["k"])
    return sciml.ODEProblem(m, u0=[2.0, 1.0], tspan=(0.0, 10.0), params=[K])


@pytest.mark.parametrize("order,tols", [(1, (1e-3, 1e-6)), (2, (1e-4, 1e-8)),
                                        (3, (1e-5, 1e-9)), (5, (1e-5, 1e-11))])
def test_error_falls_with_the_order(order, tols):
    """u' = -k (u - cos t) - sin t, u = cos t + e^(-k t): the global error against the
    steps taken. With error-per-step control, steps grow as tol^(-1/(k+1)) and the
    error as tol, so the slope against steps tends to -(k + 1); it is at least k."""
    prob = _forced()
    exact = np.cos(TS) + np.exp(-K * TS)
    rows = []
    for rtol in np.geomspace(*tols, 6):
        sol = sciml.solve(prob, sciml.BDF(max_order=order), rtol=rtol, atol=rtol, saveat=TS,
                          max_steps=10**6)
        assert sol.success
        rows.append((sol.stats["n_accepted"], np.abs(np.asarray(sol.u)[:, 0] - exact).max()))
    n, err = np.array(rows).T
    slope = -np.polyfit(np.log(n), np.log(err), 1)[0]
    assert order <= slope + 0.3 and slope <= order + 1.7, (slope, rows)


def test_robertson_against_radau():
    m = robertson_groups(1)
    p = np.array([0.04, 3e7, 1e4])
    ts = np.array([1e-3, 1.0, 10.0, 1e3, 1e5])
    ref = solve_ivp(lambda t, u: m.rhs(u, p), (0, 1e5), [1.0, 0, 0], method="Radau",
                    rtol=1e-12, atol=1e-16, t_eval=ts).y.T
    prob = sciml.ODEProblem(m, u0=[1.0, 0, 0], tspan=(0.0, 1e5), params=p)
    for rtol, bound in ((1e-6, 3e-4), (1e-8, 5e-6)):
        sol = sciml.solve(prob, sciml.BDF(), rtol=rtol, atol=rtol * 1e-4, saveat=ts)
        rel = np.abs((np.asarray(sol.u) - ref) / (np.abs(ref) + 1e-10)).max()
        assert rel < bound
        # a Jacobian now and then, not every step: the point of the family
        assert sol.stats["njac"] < 0.2 * sol.stats["n_accepted"]


def _pk(solver, **kw):
    def f(u, p, t):
        return [-p.ka * u[0], p.ka * u[0] - p.ke * u[1]]
    m = sciml.Model(f, ["depot", "central"], ["ka", "ke"])
    doses = [sciml.Bolus(0.0, 100.0, "depot"),
             sciml.Bolus(12.0, 50.0, "depot"),
             sciml.Infusion(20.0, 2.0, 10.0, "central")]
    prob = sciml.ODEProblem(m, u0=[0.0, 0.0], tspan=(0.0, 48.0), params=[1.2, 0.15],
                            doses=doses)
    return sciml.solve(prob, solver, rtol=1e-9, atol=1e-11, **kw)


@pytest.mark.heavy
def test_doses_and_dense_output_agree_with_rodas5():
    ts = np.linspace(0.0, 48.0, 97)
    a, b = _pk(sciml.BDF(), saveat=ts, dense=True), _pk(sciml.Rodas5(), saveat=ts)
    np.testing.assert_allclose(np.asarray(a.u), np.asarray(b.u), rtol=2e-6, atol=1e-7)
    tq = np.array([0.3, 11.999, 12.0, 12.5, 21.0, 47.0])
    np.testing.assert_allclose(np.asarray(a(tq)), np.asarray(_pk(sciml.Rodas5(), saveat=tq).u),
                               rtol=2e-5, atol=1e-6)


@pytest.mark.heavy
def test_sparse_and_dense_linear_algebra_agree():
    m = robertson_groups(30)
    prob = sciml.ODEProblem(m, u0=np.tile([1.0, 0.0, 0.0], 30), tspan=(0.0, 1e5),
                            params=[0.04, 3e7, 1e4])
    kw = dict(rtol=1e-6, atol=1e-10, saveat=np.geomspace(1e-2, 1e5, 8))
    d = sciml.solve(prob, sciml.BDF(linsolve="dense"), **kw)
    s = sciml.solve(prob, sciml.BDF(linsolve="sparse"), **kw)
    assert d.stats["n_accepted"] == s.stats["n_accepted"]
    np.testing.assert_allclose(np.asarray(s.u), np.asarray(d.u), rtol=1e-8, atol=1e-14)


def test_the_loop_allocates_per_call_not_per_step(nrt_stats):
    prob = _forced()
    solver = sciml.BDF()
    from sciml.solvers import common
    from sciml.solvers.kernels.structs import record

    def args(tf, rtol):
        sched = common.schedule(prob.remake(tspan=(0.0, tf)))
        sys = common.forward_system(prob.kernel_table("rhs", "jac"), prob.params, sched, 2, True)
        ctl = solver.control(rtol, np.full(2, rtol), None, 10**6)
        return (sys, solver.engine_tableau(), ctl, sched.stops, np.array([2.0, 1.0]),
                record(2, np.linspace(0.5, tf, 5)))

    solver._loop()(*args(1.0, 1e-3))  # compile
    few, out = own_allocations(solver._loop(), args(1.0, 1e-3))
    many, out2 = own_allocations(solver._loop(), args(10.0, 1e-9))
    assert few == many


def test_gradients_ask_for_another_solver():
    m = sciml.Model(lambda u, p, t: [-p.k * u[0]], ["x"], ["k"])
    prob = sciml.ODEProblem(m, u0=[1.0], tspan=(0.0, 1.0), params=[0.5])
    data = sciml.Data(np.array([0.5, 1.0]), np.array([[0.7], [0.6]]))
    for method in (GaussAdjoint(), adjoints.QuadratureAdjoint(), adjoints.DiscreteAdjoint()):
        with pytest.raises(ValueError, match="sensitivities through BDF are not available"):
            sciml.loss_and_grad(prob, data, solver=sciml.BDF(), sensealg=method)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max_order"):
        sciml.BDF(max_order=6)
    with pytest.raises(ValueError, match="BDF: `linsolve`"):
        sciml.BDF(linsolve="krylov2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert repr(sciml.BDF()) == "BDF()"


@pytest.fixture(scope="module")
def bruss50():
    return stiff_models.bruss50()


@pytest.mark.heavy
@pytest.mark.parametrize("method", [adjoints.InterpolatingAdjoint(), adjoints.BacksolveAdjoint(),
                                    adjoints.ForwardSensitivity()], ids=lambda m: type(m).__name__)
def test_gradients_through_bdf(bruss50, method):
    """The methods whose system the BDF loop integrates, on the sparse LU, against central
    differences on the 50-state Brusselator."""
    prob, data, theta, fd = bruss50
    _, g = sciml.loss_and_grad(prob, data, solver=sciml.BDF(linsolve="sparse"),
                               sensealg=method, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, fd, rtol=1e-6)
