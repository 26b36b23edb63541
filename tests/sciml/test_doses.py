"""Doses: boluses and infusions against closed forms; stops landed on exactly; right-continuity.

The one-compartment oral model (depot -> central, rates ka, ke) is linear,
so a dosing regimen's solution is the superposition of single-dose
responses (Bateman's function for a bolus into the depot, integrated
responses for constant-rate inputs).
"""

import numpy as np
import pytest

from sciml.problem import Bolus, Infusion, ODEProblem
from sciml.solve import solve
from sciml.solvers.erk import BS3, DP5, RK4, Tsit5, Vern7

from . import handmade as hm

KA, KE, V = 1.0, 0.2, 10.0


def bolus_depot(t, tau, D, ka=KA, ke=KE):
    """(depot, central) after a bolus D into the depot at tau (zero before; right-continuous)."""
    s = np.maximum(t - tau, 0.0)
    on = t >= tau
    depot = D * np.exp(-ka * s)
    central = D * ka / (ka - ke) * (np.exp(-ke * s) - np.exp(-ka * s))
    return np.stack([depot * on, central * on], axis=-1)


def step_response(t, a, R, state, ka=KA, ke=KE):
    """(depot, central) for a constant input R into `state` switched on at time a."""
    s = np.maximum(t - a, 0.0)
    if state == "central":
        return np.stack([0 * s, R / ke * (1 - np.exp(-ke * s))], axis=-1)
    depot = R / ka * (1 - np.exp(-ka * s))
    central = R * ka / (ka - ke) * ((1 - np.exp(-ke * s)) / ke - (1 - np.exp(-ka * s)) / ka)
    return np.stack([depot, central], axis=-1)


def infusion(t, start, duration, R, state):
    return step_response(t, start, R, state) - step_response(t, start + duration, R, state)


def pk_prob(doses, tspan=(0.0, 130.0), params=(KA, KE, V), **kw):
    return ODEProblem(hm.pk(), [0.0, 0.0], tspan, np.array(params), doses=doses, **kw)


SOLVERS = {"Tsit5": (Tsit5(), {}, 1e-6), "DP5": (DP5(), {}, 1e-6), "Vern7": (Vern7(), {}, 1e-7),
           "BS3": (BS3(), {}, 1e-5), "RK4": (RK4(), {"dt": 0.02}, 1e-6)}


@pytest.mark.parametrize("name", SOLVERS)
def test_repeated_bolus_vs_bateman(name):
    solver, kw, tol = SOLVERS[name]
    prob = pk_prob([Bolus(0.0, 100.0, "depot", every=12.0, count=10)])
    t = np.arange(0.0, 130.0 + 1e-9, 0.25)  # includes every dose time
    sol = solve(prob, solver, rtol=1e-9, atol=1e-9, saveat=t, **kw)
    exact = sum(bolus_depot(t, 12.0 * k, 100.0) for k in range(10))
    assert sol.success
    np.testing.assert_allclose(sol.u, exact, rtol=tol, atol=tol * 100)
    # dense output between and at the doses
    tq = np.linspace(0, 130, 977)
    exact_q = sum(bolus_depot(tq, 12.0 * k, 100.0) for k in range(10))
    np.testing.assert_allclose(sol(tq), exact_q, rtol=tol, atol=tol * 100)
    # the observable
    np.testing.assert_allclose(sol.observables["conc"], sol.u[:, 1] / V, rtol=1e-15)
    assert list(sol.observables) == ["conc"]


def test_right_continuous_at_doses():
    prob = pk_prob([Bolus(12.0, 100.0, "depot", every=12.0, count=3)], tspan=(0.0, 48.0),
                   params=(KA, KE, V))
    dose_t = [12.0, 24.0, 36.0]
    sol = solve(prob, Tsit5(), rtol=1e-10, atol=1e-10, saveat=[0.0] + dose_t + [48.0])
    exact = sum(bolus_depot(sol.t, tau, 100.0) for tau in dose_t)
    np.testing.assert_allclose(sol.u, exact, rtol=1e-8, atol=1e-8)
    assert sol.u[1, 0] == 100.0  # exactly the dose, nothing before it
    for tau in dose_t:
        after, before = sol(tau), sol(np.nextafter(tau, 0.0))
        np.testing.assert_allclose(after[0] - before[0], 100.0, rtol=1e-12)
        np.testing.assert_array_equal(after, sol.u[sol.t == tau][0])


def test_infusions_vs_closed_form():
    doses = [Bolus(0.0, 50.0, "depot"),
             Infusion(2.0, 3.0, 40.0, "central"),
             Infusion(10.0, 4.0, 20.0, "depot", every=24.0, count=3)]
    prob = pk_prob(doses, tspan=(0.0, 72.0))
    t = np.linspace(0, 72, 289)
    for solver in (Tsit5(), Vern7()):
        sol = solve(prob, solver, rtol=1e-10, atol=1e-10, saveat=t)
        exact = (bolus_depot(t, 0.0, 50.0) + infusion(t, 2.0, 3.0, 40.0, "central")
                 + sum(infusion(t, 10.0 + 24.0 * k, 4.0, 20.0, "depot") for k in range(3)))
        np.testing.assert_allclose(sol.u, exact, rtol=1e-8, atol=1e-8)


def test_back_to_back_infusions_never_double_count():
    # ke = 0 and an empty depot: central integrates the rate exactly (piecewise
    # constant), so any overlap at the shared boundary would show at once.
    doses = [Infusion(0.0, 1.0, 10.0, "central"), Infusion(1.0, 1.0, 20.0, "central"),
             Infusion(2.0, 0.5, 5.0, "central", every=0.5, count=2)]
    prob = pk_prob(doses, tspan=(0.0, 4.0), params=(1.0, 0.0, 1.0))
    t = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0]
    for solver, kw in ((Tsit5(), {}), (BS3(), {}), (RK4(), {"dt": 0.3})):
        sol = solve(prob, solver, saveat=t, **kw)
        np.testing.assert_allclose(sol.u[:, 1], [0, 5, 10, 20, 30, 32.5, 35, 35],
                                   rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(sol([0.75, 1.25, 2.25]), [[0, 7.5], [0, 15], [0, 31.25]],
                                   rtol=1e-13, atol=1e-13)


def test_steps_land_on_every_stop():
    doses = [Bolus(1.1, 10.0, "depot", every=2.3, count=4),
             Infusion(0.7, 1.3, 3.0, "central")]
    prob = pk_prob(doses, tspan=(0.0, 12.0), tstops=[5.55, 20.0])
    stops = prob.dose_arrays.tstops
    stops = stops[stops < 12.0]
    assert len(stops) == 7  # 4 boluses, 2 infusion edges, 1 tstop (20 is outside)
    for solver, kw in ((Tsit5(), {}), (Vern7(), {}), (RK4(), {"dt": 0.25})):
        sol = solve(prob, solver, **kw)  # saves every step: each stop is a step end
        assert np.isin(stops, sol.t).all(), solver
        assert len(np.unique(sol.t)) == len(sol.t)
    # a fixed step resumes its grid after a stop: no step longer than dt
    sol = solve(prob, RK4(), dt=0.25)
    assert np.max(np.diff(sol.t)) <= 0.25 * (1 + 1e-12)


def test_doses_at_the_ends_and_outside():
    doses = [Bolus(0.0, 5.0, "depot"), Bolus(10.0, 7.0, "central"), Bolus(11.0, 100.0, "depot"),
             Infusion(-2.0, 3.0, 4.0, "central"), Infusion(9.0, 5.0, 2.0, "central")]
    prob = pk_prob(doses, tspan=(0.0, 10.0))
    sol = solve(prob, Tsit5(), rtol=1e-10, atol=1e-10, saveat=[0.0, 10.0])
    t = np.array([0.0, 10.0])
    # an infusion started before t0 runs on into the span (from u0 at t0: its
    # earlier part is not in u0); the end bolus is in u(tf)
    exact = (bolus_depot(t, 0.0, 5.0) + infusion(t, 0.0, 1.0, 4.0, "central")
             + infusion(t, 9.0, 5.0, 2.0, "central"))
    exact[1, 1] += 7.0
    np.testing.assert_allclose(sol.u, exact, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(sol.u[0], [5.0, 0.0])
    np.testing.assert_array_equal(sol(10.0), sol.u[1])
    assert sol.t_end == 10.0


def test_a_dose_before_t0_is_refused():
    # the loops start at t0: a dose before it would silently never be given
    def refused(doses, *fragments, tspan=(0.0, 10.0)):
        with pytest.raises(ValueError) as err:
            pk_prob(doses, tspan=tspan)
        for f in fragments:
            assert f in str(err.value), str(err.value)

    refused([Bolus(0.0, 5.0, "depot"), Bolus(5.0, 1.0, "central"), Bolus(-1.0, 100.0, "depot")],
            "ODEProblem: doses[2] (Bolus at t=-1.0 into 'depot') is before tspan[0] = 0.0; "
            "it would never be given")
    # a repeated bolus: its first time decides, even when later repeats fall in the span
    refused([Bolus(-12.0, 100.0, "depot", every=12.0, count=3)],
            "doses[0] (Bolus at t=-12.0, every 12.0 x 3 into 'depot') starts before tspan[0] "
            "= 0.0; the doses before it would never be given")
    refused([Bolus(1.0, 100.0, "depot")], "is before tspan[0] = 2.0", tspan=(2.0, 10.0))
    # an infusion over before t0 (one still running at t0 runs on: see above)
    refused([Infusion(-3.0, 3.0, 4.0, "central")],
            "doses[0] (Infusion from t=-3.0 for 3.0 into 'central') ends before tspan[0] = 0.0")
    # a dose at t0 is given (right-continuous), and moving t0 past a dose is refused too
    prob = pk_prob([Bolus(2.0, 100.0, "depot"), Infusion(-1.0, 5.0, 4.0, "central")],
                   tspan=(2.0, 10.0))
    with pytest.raises(ValueError, match=r"doses\[0\] \(Bolus at t=2.0 into 'depot'\) is before"):
        prob.tspan = (3.0, 10.0)
    assert prob.tspan == (2.0, 10.0)
    with pytest.raises(ValueError, match="is before tspan"):
        prob.remake(tspan=(2.5, 10.0))


def test_adaptive_restart_after_bolus_is_cheap():
    prob = pk_prob([Bolus(0.0, 100.0, "depot", every=24.0, count=20)], tspan=(0.0, 480.0))
    sol = solve(prob, Tsit5(), rtol=1e-8, atol=1e-8)
    # the step size after each dose is re-estimated, not shrunk by rejections
    assert sol.stats["n_rejected"] <= 20


def test_dosed_ensemble_matches_one_by_one():
    probs = [pk_prob([Bolus(0.0, 10.0 * (i + 1), "depot", every=6.0 + i, count=5),
                      Infusion(1.0 + i, 2.0, 3.0, "central")], tspan=(0.0, 40.0),
                     params=(KA * (1 + 0.1 * i), KE, V)) for i in range(6)]
    many = solve(probs, Vern7(), saveat=0.5)
    for p, m in zip(probs, many):
        one = solve(p, Vern7(), saveat=0.5)
        np.testing.assert_allclose(m.u, one.u, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(m(13.3), one(13.3), rtol=1e-13)
        np.testing.assert_allclose(m.observables["conc"], one.observables["conc"], rtol=1e-13)


def test_remake_keeps_doses_and_tstops():
    pk = hm.pk()
    prob = ODEProblem(pk, [0.0, 0.0], (0.0, 24.0), [1.0, 0.2, 10.0],
                      doses=[Bolus(0.0, 100.0, "depot")], tstops=[3.5, 7.25])
    again = prob.remake(params=[1.1, 0.2, 10.0])
    assert again.tstops == (3.5, 7.25) and again.doses == prob.doses
    np.testing.assert_array_equal(again.dose_arrays.tstops, prob.dose_arrays.tstops)
    assert prob.remake(tstops=[]).tstops == ()


def test_fields_set_after_construction_are_checked_and_followed():
    prob = pk_prob([])
    t = np.linspace(0, 24, 13)
    assert prob._plain
    prob.doses = [Bolus(0.0, 100.0, "depot")]  # the flat dose arrays follow
    assert not prob._plain
    dosed = solve(prob, Tsit5(), rtol=1e-10, atol=1e-10, saveat=t)
    np.testing.assert_allclose(dosed.u, bolus_depot(t, 0.0, 100.0), rtol=1e-7, atol=1e-7)
    prob.params = [KA, KE, V]  # a list: stored as a float64 array
    assert prob.params.dtype == np.float64 and prob.params.flags.c_contiguous
    strided = np.array([KA, 0, KE, 0, V, 0])[::2]
    prob.params = strided  # a strided view: made contiguous (the compiled loops need it)
    assert prob.params.flags.c_contiguous
    with pytest.raises(ValueError, match="`params` must have length 3"):
        prob.params = [1.0, 2.0]
    with pytest.raises(ValueError, match="`u0` contains NaN"):
        prob.u0 = [np.nan, 0.0]
    with pytest.raises(ValueError, match="`tspan` must satisfy t0 < tf"):
        prob.tspan = (5.0, 1.0)
    own = np.array([KA, KE, V])
    shared = ODEProblem(hm.pk(), [0.0, 0.0], (0.0, 24.0), own)
    assert shared.params is own  # a float64 array is used as it is, not copied
