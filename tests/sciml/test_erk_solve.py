"""The ERK loop through `sciml.solve`: accuracy, output times, counting, ensembles, allocation."""

from typing import NamedTuple

import numba
import numpy as np
import pytest
from scipy.integrate import solve_ivp

from sciml.problem import Bolus, Infusion, ODEProblem
from sciml.solve import solve
from sciml.solvers import common
from sciml.solvers.erk import BS3, DP5, RK4, Euler, Tsit5, Vern7
from sciml.solvers.kernels import calls, erk, system
from sciml.solvers.kernels.structs import S_NACC, S_NFEV, BoundModel

from ..alloc import allocations_in, allocs, needs_jit, own_allocations
from . import handmade as hm

ADAPTIVE = [Tsit5, DP5, BS3, Vern7]
LV_P = np.array([1.5, 1.0, 3.0, 1.0])


def lv_prob(u0=(1.0, 1.0), p=LV_P, tspan=(0.0, 10.0)):
    return ODEProblem(hm.lotka_volterra(), u0, tspan, p)


def scipy_ref(prob, t):
    m = prob.model
    r = solve_ivp(lambda t, u: m.f(t, u, prob.params), prob.tspan, prob.u0, method="DOP853",
                  rtol=1e-12, atol=1e-12, t_eval=t, dense_output=True)
    return r.y.T


@pytest.mark.parametrize("cls", ADAPTIVE, ids=lambda c: c.__name__)
def test_lotka_volterra_vs_scipy(cls):
    prob = lv_prob()
    t = np.linspace(0, 10, 101)
    # dense=True: the general loop (one compiled loop for every tableau); the lean path's
    # per-tableau entry points are checked against it in test_solve_lean.py
    sol = solve(prob, cls(), rtol=1e-10, atol=1e-10, saveat=t, dense=True)
    assert sol.success and sol.status == "success" and sol.status_code == 0
    np.testing.assert_array_equal(sol.t, t)
    assert sol.u.shape == (101, 2)
    tol = 1e-6 if cls is BS3 else 1e-7
    np.testing.assert_allclose(sol.u, scipy_ref(prob, t), rtol=tol, atol=tol)


@pytest.mark.parametrize("cls", ADAPTIVE, ids=lambda c: c.__name__)
def test_dense_output_agrees_with_saveat(cls, rng):
    # Both come from the same interpolant of the same steps (up to rounding:
    # fastmath may contract the sums differently in the two compiled loops).
    prob = lv_prob()
    t = np.sort(rng.uniform(0, 10, 50))
    a = solve(prob, cls(), saveat=t, dense=True)  # the general loop (one for every tableau)
    b = solve(prob, cls())
    np.testing.assert_allclose(a(t), a.u, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(b(t), a.u, rtol=1e-13, atol=1e-13)
    # sol(t) takes any shape and order
    tt = t[::-1].reshape(5, 10)
    assert b(tt).shape == (5, 10, 2)
    np.testing.assert_array_equal(b(tt)[0, 0], b(t[-1]))
    assert b(3.0).shape == (2,)


def test_saveat_kinds():
    prob = lv_prob(tspan=(0.0, 1.0))
    every = solve(prob, Tsit5())
    assert every.t[0] == 0.0 and every.t[-1] == 1.0 and np.all(np.diff(every.t) > 0)
    assert len(every.t) == every.stats["n_accepted"] + 1
    np.testing.assert_array_equal(every.u[0], prob.u0)
    np.testing.assert_allclose(every(every.t), every.u, rtol=0, atol=1e-15)
    spaced = solve(prob, Tsit5(), saveat=0.3)
    np.testing.assert_allclose(spaced.t, [0.0, 0.3, 0.6, 0.9, 1.0], rtol=0, atol=1e-15)
    exact_grid = solve(prob, Tsit5(), saveat=0.25)
    np.testing.assert_array_equal(exact_grid.t, [0.0, 0.25, 0.5, 0.75, 1.0])
    # endpoints are exact, not interpolated
    ends = solve(prob, Tsit5(), saveat=[0.0, 1.0])
    np.testing.assert_array_equal(ends.u[0], prob.u0)
    np.testing.assert_array_equal(ends.u[1], every.u[-1])
    assert len(solve(prob, Tsit5(), saveat=[]).t) == 0


def test_saveat_does_not_change_steps():
    prob = lv_prob()
    a = solve(prob, Tsit5(), saveat=np.linspace(0, 10, 1001))
    b = solve(prob, Tsit5(), saveat=[10.0])
    assert a.stats == b.stats
    np.testing.assert_array_equal(a.u[-1], b.u[-1])


def test_function_evaluation_counts():
    prob = lv_prob()
    # FSAL: 1 for f(t0) + 1 for the starting step + 6 per attempted step
    sol = solve(prob, Tsit5(), dense=False)
    s = sol.stats
    assert s["nfev"] == 2 + 6 * (s["n_accepted"] + s["n_rejected"])
    sol = solve(prob, BS3(), dense=False)
    s = sol.stats
    assert s["nfev"] == 2 + 3 * (s["n_accepted"] + s["n_rejected"])
    # Vern7 (not FSAL): 9 new stages per attempt plus f at every new step but
    # the end; no output inside steps, so no extra interpolant stages
    sol = solve(prob, Vern7())
    s = sol.stats
    assert s["nfev"] == 2 + 9 * (s["n_accepted"] + s["n_rejected"]) + s["n_accepted"] - 1
    # a given first step skips the estimate
    sol = solve(prob, Tsit5(), dt=0.01)
    s = sol.stats
    assert s["nfev"] == 1 + 6 * (s["n_accepted"] + s["n_rejected"])
    sol = solve(prob, RK4(), dt=0.1)
    assert sol.stats == {"nfev": 1 + 4 * 100, "n_accepted": 100, "n_rejected": 0}
    sol = solve(prob, Euler(), dt=0.1)
    assert sol.stats == {"nfev": 1 + 100, "n_accepted": 100, "n_rejected": 0}


def test_vern7_extra_stages_are_lazy():
    prob = lv_prob()
    plain = solve(prob, Vern7())
    t = np.linspace(0, 10, 2001)  # output inside every step
    inside = solve(prob, Vern7(), saveat=t)
    n = plain.stats["n_accepted"]
    assert inside.stats["n_accepted"] == n
    # 6 extra stages per step with output; one of them is f at the next step
    assert inside.stats["nfev"] == plain.stats["nfev"] + 6 * n - (n - 1)
    # computed on demand for sol(t): same values as inside the loop
    np.testing.assert_allclose(plain(t), inside.u, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(inside.u, scipy_ref(prob, t), rtol=2e-6, atol=2e-6)


def test_dense_false():
    sol = solve(lv_prob(), Tsit5(), dense=False, saveat=[1.0, 2.0])
    with pytest.raises(ValueError, match="no dense output: solve with `dense=True`"):
        sol(1.5)


def test_per_state_atol():
    prob = lv_prob()
    a = solve(prob, Tsit5(), atol=[1e-6, 1e-6])
    b = solve(prob, Tsit5(), atol=1e-6)
    c = solve(prob, Tsit5(), atol=np.array([1e-9, 1e-6]))
    assert a.stats == b.stats
    assert c.stats["n_accepted"] > b.stats["n_accepted"]


def test_storage_grows():
    # saveat=None over a long span needs many more steps than first reserved
    prob = lv_prob(tspan=(0.0, 300.0))
    sol = solve(prob, DP5(), rtol=1e-9, atol=1e-9)
    assert sol.success and sol.stats["n_accepted"] > 2000
    assert len(sol.t) == sol.stats["n_accepted"] + 1
    ref = solve(prob, DP5(), rtol=1e-9, atol=1e-9, saveat=sol.t, dense=True)
    np.testing.assert_allclose(ref.u, sol.u, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(sol(sol.t[1:] - 0.01), ref(sol.t[1:] - 0.01), rtol=1e-13)


# ---------------------------------------------------------------- ensembles


def ensemble(rng, k=7):
    probs = []
    for i in range(k):
        u0 = rng.uniform(0.5, 2.0, 2)
        p = LV_P * rng.uniform(0.8, 1.2, 4)
        probs.append(lv_prob(u0, p, (0.0, 5.0 + i)))
    return probs


@pytest.mark.parametrize("saveat", [None, 0.5, "array"])
@pytest.mark.parametrize("dense", [True, False])
def test_ensemble_matches_one_by_one(saveat, dense, rng):
    probs = ensemble(rng)
    sv = np.linspace(0, 5, 11) if saveat == "array" else saveat
    many = solve(probs, Vern7(), rtol=1e-8, atol=1e-8, saveat=sv, dense=dense)
    assert isinstance(many, list) and len(many) == len(probs)
    for p, m in zip(probs, many):
        one = solve(p, Vern7(), rtol=1e-8, atol=1e-8, saveat=sv, dense=dense)
        assert m.stats == one.stats and m.prob is p
        np.testing.assert_array_equal(m.t, one.t)
        np.testing.assert_allclose(m.u, one.u, rtol=1e-13, atol=1e-13)
        if dense:
            tq = np.linspace(0, p.tspan[1], 37)
            np.testing.assert_allclose(m(tq), one(tq), rtol=1e-13, atol=1e-13)


def test_ensemble_threads_and_mixed_models(rng):
    probs = ensemble(rng, 5)
    pk = hm.pk()
    dosed = [ODEProblem(pk, [0.0, 0.0], (0.0, 48.0), [1.0, 0.2, 10.0],
                        doses=[Bolus(0.0, 100.0 * (i + 1), "depot", every=12.0, count=4),
                               Infusion(6.0, 2.0, 10.0 * i + 1, "central")])
             for i in range(4)]
    mixed = [x for pair in zip(probs, dosed) for x in pair] + probs[4:]
    one = [solve(p, Tsit5(), saveat=1.0) for p in mixed]
    for threads in (1, 2):
        many = solve(mixed, Tsit5(), saveat=1.0, threads=threads)
        for a, b in zip(many, one):
            assert a.prob.model is b.prob.model
            np.testing.assert_allclose(a.u, b.u, rtol=1e-13, atol=1e-13)


def test_ensemble_storage_grows(rng):
    probs = [lv_prob(tspan=(0.0, 10.0)), lv_prob(tspan=(0.0, 300.0))]
    many = solve(probs, Tsit5(), rtol=1e-9, atol=1e-9)
    for p, m in zip(probs, many):
        one = solve(p, Tsit5(), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(m.u, one.u, rtol=1e-13, atol=1e-13)
        assert m.stats == one.stats


# ---------------------------------------------------------------- allocation
#
# The compiled loops are called from Python with named tuples of arrays; unboxing
# them allocates one NRT MemInfo per array (freed on return). So one call of a loop
# allocates (arrays in its arguments) + (its own scratch): a fixed number, whatever
# the number of steps, save times or doses. A per-step allocation would make the
# counts below grow with the span (see `test_measurement_sees_a_per_step_allocation`).




def captured_loop(solver, prob, **kw):
    """``sciml.solve(prob, solver, **kw)`` with the solver's compiled loop spied on:
    ``(loop, args of its last call with the initial state)`` -- the structures exactly as
    `Solver._run` builds them."""
    loop = solver._loop()
    seen = []

    def spy(sys, tab, ctl, stops, z, rec):
        seen.append((sys, tab, ctl, stops, z.copy(), rec))
        return loop(sys, tab, ctl, stops, z, rec)

    solver._loop = lambda: spy  # an instance attribute: this solver object only
    solve(prob, solver, **kw)
    return loop, seen[-1]


def loop_allocations(loop, args):
    """``(own allocations of one call of the loop, accepted steps)``, from a fresh state."""
    sys, tab, ctl, stops, z0, rec = args
    own, (status, _, _) = own_allocations(loop, (sys, tab, ctl, stops, z0.copy(), rec))
    assert status == 0
    return own, int(rec.stats[S_NACC])


class Leaky(NamedTuple):
    """A test system whose right-hand side allocates: a planted per-step allocation."""

    m: BoundModel


def _leaky_f(sys, out, z, t, k):
    calls.rhs(sys.m, out, z, t)
    extra = np.zeros(1)  # an NRT allocation on every evaluation
    out[0] += extra[0]


def _no_event(sys, z, k):
    return False


def uncached(dispatcher):
    """The same loop, compiled apart: a signature with a type from this test module must
    not reach the on-disk cache, where another process could not import its module."""
    options = {k: v for k, v in dispatcher.targetoptions.items() if k != "nopython"}
    return numba.njit(cache=False, **options)(dispatcher.py_func)


system.register(Leaky, f=_leaky_f, event=_no_event, accept=system.no_accept,
                interpolates=system.never)


@needs_jit
def test_measurement_sees_allocations(nrt_stats):
    @numba.njit
    def allocating(x):
        return np.empty(3).sum() + x[0]

    @numba.njit
    def reads(xs):
        return xs[0][0] + xs[1][0][0] + xs[1][1]

    assert allocations_in(allocating, (np.ones(2),)) == (1, 1)
    # from Python, arrays nested in tuples are unboxed one by one: `own_allocations`
    # discounts exactly those
    nested = ((np.ones(2), (np.ones(1), 1.0)),)
    reads(*nested), allocating(np.ones(2))  # compiled
    assert own_allocations(reads, nested)[0] == 0
    assert own_allocations(allocating, (np.ones(2),))[0] == 1


@needs_jit
@pytest.mark.heavy
def test_measurement_sees_a_per_step_allocation(nrt_stats):
    # The measurement below, on `erk_integrate` itself with a system that allocates in
    # its right-hand side: the count grows with the steps (one per evaluation).
    counts = []
    compiled = None  # one loop for both spans (a compile is ~12 s with an empty cache)
    for tf in (5.0, 20.0):
        prob = lv_prob(tspan=(0.0, tf))
        loop, (sys, tab, ctl, stops, z, rec) = captured_loop(Tsit5(), prob, saveat=[tf])
        args = (Leaky(sys.m), tab, ctl, stops, z, rec)
        loop = compiled = compiled or uncached(loop)
        loop(*args[:4], z.copy(), rec)  # compiled for this system first
        own, (status, _, _) = own_allocations(loop, (*args[:4], z.copy(), rec))
        assert status == 0
        counts.append((own, int(rec.stats[S_NFEV])))  # and the evaluations
    (short, nfev_short), (long, nfev_long) = counts
    assert nfev_long > 3 * nfev_short
    assert long - short == nfev_long - nfev_short


@needs_jit
@pytest.mark.parametrize("cls", [Tsit5, Vern7, RK4], ids=lambda c: c.__name__)
def test_loop_allocations_do_not_grow(cls, nrt_stats, monkeypatch):
    # `erk_integrate` as `sciml.solve` calls it (a dosed problem: the general path),
    # over 1x and 4x the span (4x the steps and doses), with 31 and 301 save times,
    # saving at given times and saving every step with dense storage (room for every
    # step from the start: the loops grow it otherwise, a few allocations a doubling)
    monkeypatch.setattr(common, "capacity", lambda *a, **k: 8192)
    pk = hm.pk()
    kw = dict(dt=0.05) if cls is RK4 else {}
    counts = {}
    for days in (2, 8):
        prob = ODEProblem(pk, [0.0, 0.0], (0.0, 24.0 * days), [1.0, 0.2, 10.0],
                          doses=[Bolus(0.0, 100.0, "depot", every=12.0, count=2 * days),
                                 Infusion(1.0, 2.0, 5.0, "central", every=24.0, count=days)])
        for ns in (31, 301):
            loop, args = captured_loop(cls(), prob, saveat=np.linspace(0, 24.0 * days, ns),
                                       **kw)
            assert loop is erk.erk_integrate
            counts[days, ns] = loop_allocations(loop, args)
        loop, args = captured_loop(cls(), prob, dense=True, **kw)  # saveat None, stored steps
        counts[days, "every"] = loop_allocations(loop, args)
    steps = {key: n for key, (_, n) in counts.items()}
    assert steps[8, 31] > 3 * steps[2, 31]
    own = {key: a for key, (a, _) in counts.items()}
    assert len(set(own.values())) == 1, counts
    assert own[2, 31] <= 2  # its scratch, allocated once a call


@needs_jit
@pytest.mark.parametrize("cls", [Tsit5, Vern7], ids=lambda c: c.__name__)
def test_dense_eval_allocations_do_not_grow(cls, nrt_stats):
    # `store_eval` (sol(t)): nothing allocated per query point, Vern7's extra interpolant
    # stages computed on demand included
    sol = solve(lv_prob(), cls())
    sys, tab, rec, n_steps = sol._dense
    assert n_steps > 20
    counts = []
    for q in (100, 1000):
        tq = np.linspace(0, 10, q)
        out = np.zeros((q, 2))
        tmp = np.zeros(max(2, cls.tableau.n_stages))
        rec.d_have[:] = 0  # Vern7: the extra stages to be computed again (the same values)
        own, _ = own_allocations(erk.store_eval, (sys, tab, rec, n_steps, tq, out, tmp))
        if cls is Vern7:
            assert rec.d_have[:n_steps].all()
        np.testing.assert_allclose(out, sol(tq), rtol=1e-13, atol=1e-13)
        counts.append(own)
    assert counts == [0, 0]


@needs_jit
def test_ensemble_allocations_do_not_grow_with_steps(nrt_stats):
    # A list of problems runs `Solver._run` per problem in threads: every NRT allocation of
    # the whole `sciml.solve` call is the loops' fixed ones, whatever the span
    counts = []
    for tf in (5.0, 40.0):
        probs = [lv_prob(tspan=(0.0, tf)) for _ in range(4)]
        solve(probs, Tsit5(), saveat=[tf], threads=2)  # compiled (or loaded) first
        a0 = allocs()
        sols = solve(probs, Tsit5(), saveat=[tf], threads=2)
        counts.append((allocs() - a0, sum(s.stats["n_accepted"] for s in sols)))
    (short, n_short), (long, n_long) = counts
    assert n_long > 4 * n_short
    assert short == long


@needs_jit
@pytest.mark.parametrize("cls", [Tsit5, Vern7], ids=lambda c: c.__name__)
def test_lean_loop_allocations_do_not_grow_with_steps(cls, nrt_stats):
    # `sciml.solve`'s lean path: one compiled call that allocates its scratch buffers once,
    # whatever the number of steps and save times
    counts = []
    steps = []
    for tf, ns in ((5.0, 10), (40.0, 200)):
        prob = lv_prob(tspan=(0.0, tf))
        model, entry, n, extra, _, _, (tab, settings) = cls()._lean(prob.model)
        assert model is prob.model
        kern = model.kernel_table("rhs")
        t = np.linspace(0.0, tf, ns)
        keep = np.empty(ns + extra)
        args = (kern, tab, settings, prob.u0, prob.params, t, np.empty((ns, n)), keep, 1e-6,
                0.0, tf, 1e-6, 0.0, 100_000)
        assert entry(*args) == 0
        steps.append(keep[-3])  # n_accepted (the tail: t_end, nfev, nacc, nrej, nsave)
        counts.append(allocations_in(entry, args))
    assert steps[1] > 4 * steps[0]
    # its scratch (floats, counters, an empty flag buffer) and the inlined loop's: once a call
    assert counts[0] == counts[1] and counts[0][0] <= 4
