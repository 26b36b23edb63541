"""`sciml.solve`'s lean path (one plain problem, saveat as an array) and lazy dense output."""

import copy as copy_module
import math
import warnings

import numpy as np
import pytest

from sciml.problem import ODEProblem
from sciml.solution import SolveWarning
from sciml.solve import solve
from sciml.solvers.erk import DP5, RK4, Tsit5, Vern7

from . import handmade as hm

LV_P = np.array([1.5, 1.0, 3.0, 1.0])


def lv_prob(tspan=(0.0, 10.0)):
    return ODEProblem(hm.lotka_volterra(), [1.0, 1.0], tspan, LV_P.copy())


# Every tableau shares one lean entry point, which reads the coefficients and calls the
# general loop; Vern7 (extra interpolant stages) checks it beside the default.
@pytest.mark.parametrize("cls", [Tsit5, Vern7], ids=lambda c: c.__name__)
def test_lean_path_agrees_with_the_general_loop(cls):
    prob = lv_prob()
    t = np.linspace(0, 10, 41)
    lean = solve(prob, cls(), rtol=1e-8, atol=1e-8, saveat=t)  # ndarray: lean path
    full = solve(prob, cls(), rtol=1e-8, atol=1e-8, saveat=list(t), dense=True)  # general
    assert lean.stats == full.stats
    np.testing.assert_array_equal(lean.t, t)
    np.testing.assert_allclose(lean.u, full.u, rtol=1e-12, atol=1e-12)
    assert lean.t is not t  # a copy


@pytest.mark.parametrize("cls", [RK4], ids=lambda c: c.__name__)
def test_lean_path_fixed_step(cls):
    prob = lv_prob(tspan=(0.0, 1.0))
    t = np.linspace(0, 1, 11)
    lean = solve(prob, cls(), dt=0.01, saveat=t)
    full = solve(prob, cls(), dt=0.01, saveat=list(t))
    assert lean.stats == full.stats
    np.testing.assert_allclose(lean.u, full.u, rtol=1e-12, atol=1e-12)


def test_dense_default_follows_saveat():
    prob = lv_prob()
    t = np.linspace(0, 10, 21)
    sol = solve(prob, Tsit5(), saveat=t)
    assert sol._dense is None  # nothing stored per step during the solve
    ref = solve(prob, Tsit5(), saveat=t, dense=True)
    assert ref._dense is not None
    tq = np.linspace(0, 10, 137)
    np.testing.assert_array_equal(sol(tq), ref(tq))  # the same steps, re-run once
    assert sol._dense is not None
    assert solve(prob, Tsit5())._dense is not None  # saveat None: stored
    with pytest.raises(ValueError, match="no dense output"):
        solve(prob, Tsit5(), saveat=t, dense=False)(1.0)


def test_lazy_dense_uses_the_inputs_of_the_solve():
    prob = lv_prob()
    t = np.linspace(0, 10, 21)
    sol = solve(prob, Tsit5(), saveat=t)
    ref = solve(prob, Tsit5(), saveat=t, dense=True)(np.linspace(0, 10, 7))
    prob.params[:] = 2.0  # changed after the solve: must not leak into sol(t)
    prob.u0[:] = 3.0
    np.testing.assert_array_equal(sol(np.linspace(0, 10, 7)), ref)


def test_lazy_dense_of_a_general_path_solve():
    # saveat as a list (general path), Vern7 (extra interpolant stages)
    prob = lv_prob()
    sol = solve(prob, Vern7(), rtol=1e-9, atol=1e-9, saveat=[1.0, 5.0])
    ref = solve(prob, Vern7(), rtol=1e-9, atol=1e-9, saveat=[1.0, 5.0], dense=True)
    tq = np.linspace(0, 10, 51)
    np.testing.assert_array_equal(sol(tq), ref(tq))


@pytest.mark.parametrize("saveat, message", [
    (np.array([0.0, 12.0]), "`saveat` times must lie in tspan"),
    (np.array([0.0, 2.0, 1.0]), "`saveat` must be sorted"),
    (np.array([0.0, np.nan]), "`saveat` contains NaN or Inf"),
])
def test_lean_path_saveat_errors(saveat, message):
    with pytest.raises(ValueError, match=message):
        solve(lv_prob(), Tsit5(), saveat=saveat)


def test_lean_path_partial_solution_warns():
    prob = lv_prob()
    t = np.linspace(0, 10, 11)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        sol = solve(prob, Tsit5(), saveat=t, max_steps=5)
    assert any(issubclass(x.category, SolveWarning) for x in w)
    assert sol.status == "max_steps" and 0 < len(sol) < 11
    assert sol.u.shape == (len(sol), 2) and np.all(sol.t <= sol.t_end)
    sol(sol.t_end)  # lazy dense output of the partial solve


def test_changed_solver_settings_repack():
    s = Tsit5()
    t = np.linspace(0, 10, 11)
    a = solve(lv_prob(), s, saveat=t)
    entry = s._lean_cache[1]
    compiled = len(entry.overloads)
    s.safety = 0.5  # a setting changed after a solve: the settings are repacked
    b = solve(lv_prob(), s, saveat=t)
    c = solve(lv_prob(), Tsit5(safety=0.5), saveat=t)
    assert a.stats != b.stats and b.stats == c.stats
    # ...and nothing compiled: the settings are arguments of the one entry point
    assert s._lean_cache[1] is entry and len(entry.overloads) == compiled
    model = lv_prob().model
    # one entry point for every tableau (folded constants only in a fused entry)
    assert DP5()._lean(model)[1] is Vern7()._lean(model)[1] is entry


@pytest.mark.heavy
def test_lean_path_per_state_atol():
    prob = lv_prob()
    t = np.linspace(0, 10, 21)
    atol = np.array([1e-9, 1e-5])
    lean = solve(prob, Tsit5(), rtol=1e-7, atol=atol, saveat=t)  # ndarray atol: lean path
    full = solve(prob, Tsit5(), rtol=1e-7, atol=list(atol), saveat=list(t))
    assert lean.stats == full.stats  # the same steps...
    np.testing.assert_array_equal(lean.u, full.u)  # ...and the same loop


@pytest.mark.parametrize("kwargs, message", [
    (dict(rtol=0.0), "`rtol` must be a finite number > 0"),
    (dict(rtol=1e-16), "below what float64 can resolve"),
    (dict(atol=-1.0), "`atol` must be finite and > 0"),
    (dict(atol=np.array([1e-6, 0.0])), "`atol` must be finite and > 0"),
    (dict(atol=np.array([1e-6, np.inf])), "`atol` must be finite and > 0"),
    (dict(dt=math.inf), "`dt` must be a finite number > 0"),
    (dict(dt=0.0), "`dt` must be a finite number > 0"),
    (dict(max_steps=0), "`max_steps` must be a positive int"),
])
def test_lean_path_bad_values_get_the_full_paths_errors(kwargs, message):
    # the lean path checks values in the compiled loop and hands anything odd to the
    # full path, whose checks name the argument
    with pytest.raises(ValueError, match=message):
        solve(lv_prob(), Tsit5(), saveat=np.linspace(0, 10, 5), **kwargs)


def test_lean_solution_attributes():
    prob = lv_prob()
    t = np.linspace(0, 10, 11)
    lean = solve(prob, Tsit5(), saveat=t)
    full = solve(prob, Tsit5(), saveat=list(t))
    assert lean.success and lean.status == "success" and lean.t_end == 10.0
    assert lean.stats == full.stats and set(lean.stats) == {"nfev", "n_accepted", "n_rejected"}
    assert len(lean) == 11 and "Tsit5" in repr(lean)
    assert lean.observables == full.observables == {}
    copy = copy_module.copy(solve(prob, Tsit5(), saveat=t))  # before first use
    np.testing.assert_array_equal(copy.t, t)
    np.testing.assert_array_equal(copy(t), lean(t))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = lean.nope


def test_lean_path_warning_points_at_the_caller():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        solve(lv_prob(), Tsit5(), saveat=np.linspace(0, 10, 11), max_steps=5)
    assert [x.filename for x in w if issubclass(x.category, SolveWarning)] == [__file__]


def test_fuse_after_from_the_environment(monkeypatch):
    from sciml.solvers import erk

    monkeypatch.delenv("SCIML_FUSE_AFTER", raising=False)
    assert erk._fuse_after(2000) == 2000
    monkeypatch.setenv("SCIML_FUSE_AFTER", " 0 ")
    assert erk._fuse_after(2000) == 0
    for bad in ("-1", "many", "1.5"):
        monkeypatch.setenv("SCIML_FUSE_AFTER", bad)
        with pytest.raises(ValueError, match=f"SCIML_FUSE_AFTER must be an integer >= 0.*{bad}"):
            erk._fuse_after(2000)


@pytest.mark.heavy
def test_fused_entry_after_many_solves(monkeypatch):
    # After FUSE_AFTER lean solves of one (solver, model) pair, `solve` switches to the
    # entry point with the model's right-hand side linked in and Tsit5's coefficients
    # folded (compiled in a background thread): the same steps and the same values up to
    # rounding; an atol type it was not compiled for
    # falls back to the generic entry point.
    from sciml.solvers import erk

    monkeypatch.setattr(erk, "FUSE_AFTER", 3)
    prob = lv_prob()
    t = np.linspace(0, 10, 41)
    solver = Tsit5()
    ref = solve(prob, solver, rtol=1e-8, atol=1e-8, saveat=t)
    generic = solver._lean_cache[4][float]
    for _ in range(2):
        solve(prob, solver, rtol=1e-8, atol=1e-8, saveat=t)
    solver._fusing.join()
    fused = solver._lean_cache[4][float]
    assert fused is not generic and solver._lean_cache[5] == [0]
    sol = solve(prob, solver, rtol=1e-8, atol=1e-8, saveat=t)
    assert sol.stats == ref.stats
    np.testing.assert_allclose(sol.u, ref.u, rtol=1e-13, atol=1e-13)
    per_state = solve(prob, solver, rtol=1e-8, atol=np.array([1e-8, 1e-8]), saveat=t)
    np.testing.assert_allclose(per_state.u, ref.u, rtol=1e-13, atol=1e-13)
