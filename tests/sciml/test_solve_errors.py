"""`sciml.solve`: every argument error, and the status paths (warned, partial solution kept)."""

import re
import warnings

import numpy as np
import pytest

import adjoints
from sciml.problem import Bolus, Infusion, ODEProblem
from sciml.solution import SolveWarning
from sciml.solve import solve
from sciml.solvers import base
from sciml.solvers.erk import BS3, DP5, RK4, Euler, Tsit5, Vern7
from sciml.solvers.kernels import control as ctl
from sciml.solvers.rosenbrock import Rodas5

from . import handmade as hm


@pytest.fixture(scope="module")
def prob():
    return ODEProblem(hm.lotka_volterra(), [1.0, 1.0], (0.0, 2.0), [1.5, 1.0, 3.0, 1.0])


def test_status_codes_agree():
    # the compiled loops' codes (kernels.control) are the ones the Python side reports
    assert (ctl.SUCCESS, ctl.MAX_STEPS, ctl.DT_UNDERFLOW, ctl.NONFINITE) == (
        base.SUCCESS, base.MAX_STEPS, base.DT_UNDERFLOW, base.NONFINITE)
    codes = (ctl.SUCCESS, ctl.MAX_STEPS, ctl.DT_UNDERFLOW, ctl.NONFINITE)
    assert len(set(codes)) == 4
    # every code a solve can end with has a text
    assert set(base.STATUS_TEXT) == set(codes)
    assert base.STATUS_TEXT[base.SUCCESS] == "success"


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(rtol=0.0), ValueError, "`rtol` must be a finite number > 0, got 0.0"),
    (dict(rtol=-1e-3), ValueError, "`rtol` must be a finite number > 0"),
    (dict(rtol=float("nan")), ValueError, "`rtol` must be a finite number > 0"),
    (dict(rtol="1e-6"), ValueError, "`rtol` must be a finite number > 0, got '1e-6'"),
    (dict(rtol=1e-16), ValueError, "below what float64 can resolve; use rtol >= 1e-14"),
    (dict(atol=0.0), ValueError, "`atol` must be finite and > 0"),
    (dict(atol=[1e-6, -1.0]), ValueError, "`atol` must be finite and > 0"),
    (dict(atol=[1e-6, 1e-6, 1e-6]), ValueError,
     "`atol` must be a number or an array of shape (2,) (one per state)"),
    (dict(atol=None), ValueError, "`atol` must be a number or an array of shape (2,)"),
    (dict(dt=0.0), ValueError, "`dt` must be a finite number > 0, got 0.0"),
    (dict(dt=-0.1), ValueError, "`dt` must be a finite number > 0"),
    (dict(max_steps=0), ValueError, "`max_steps` must be a positive int, got 0"),
    (dict(max_steps=10.0), ValueError, "`max_steps` must be a positive int, got 10.0"),
    (dict(max_steps=True), ValueError, "`max_steps` must be a positive int"),
    (dict(dense="yes"), TypeError, "`dense` must be None, True or False, got 'yes'"),
    (dict(saveat=-1.0), ValueError, "`saveat` as a number is the spacing of saved times and "
                                    "must be > 0, got -1.0"),
    (dict(saveat=[0.0, 2.5]), ValueError,
     "`saveat` times must lie in tspan [0, 2]; saveat[1] = 2.5"),
    (dict(saveat=[-0.1, 1.0]), ValueError, "saveat[0] = -0.1"),
    (dict(saveat=[0.0, 1.0, 0.5]), ValueError,
     "`saveat` must be sorted (increasing): saveat[2] = 0.5 < saveat[1] = 1.0"),
    (dict(saveat=[[0.0, 1.0]]), ValueError, "`saveat` must be a 1-D array of times, got shape "
                                            "(1, 2)"),
    (dict(saveat=[0.0, np.nan]), ValueError, "`saveat` contains NaN or Inf"),
    (dict(saveat="often"), ValueError, "`saveat` must be None, a number (spacing) or a 1-D "
                                       "array of times, got 'often'"),
    (dict(threads=0), ValueError, "`threads` must be a positive int or None, got 0"),
])
def test_argument_errors(prob, kwargs, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        solve(prob, Tsit5(), **kwargs)


def test_solver_and_problem_errors(prob):
    with pytest.raises(TypeError, match=re.escape("write Tsit5() (with parentheses)")):
        solve(prob, Tsit5)
    with pytest.raises(TypeError, match="`solver` must be a sciml solver such as "
                                        r"sciml.Tsit5\(\), got 'RK45'"):
        solve(prob, "RK45")
    with pytest.raises(TypeError, match="`prob` must be a sciml.ODEProblem, got dict"):
        solve({}, Tsit5())
    with pytest.raises(TypeError, match=re.escape("`prob[1]` must be a sciml.ODEProblem, got "
                                                  "NoneType")):
        solve([prob, None], Tsit5())
    with pytest.raises(ValueError, match="`prob` is an empty list: nothing to solve"):
        solve([], Tsit5())
    with pytest.raises(TypeError, match="unexpected keyword argument 'reltol'"):
        solve(prob, Tsit5(), reltol=1e-3)


@pytest.mark.parametrize("solver", [RK4(), Euler(), Tsit5(adaptive=False)], ids=repr)
def test_fixed_step_needs_dt(prob, solver):
    message = f"`dt` is required: {solver!r} takes fixed steps; pass e.g. dt=0.01"
    with pytest.raises(ValueError, match=re.escape(message)):
        solve(prob, solver)


def test_solver_settings_errors():
    with pytest.raises(ValueError, match="RK4: has no error estimate, so it cannot be "
                                         "adaptive; use a fixed step"):
        RK4(adaptive=True)
    with pytest.raises(TypeError, match="Tsit5: `adaptive` must be True or False, got 1"):
        Tsit5(adaptive=1)
    with pytest.raises(ValueError, match=re.escape("DP5: `safety` must be a number in (0, 1], "
                                                   "got 1.5")):
        DP5(safety=1.5)
    with pytest.raises(ValueError, match=re.escape("BS3: `qmin` must be a number in (0, 1], "
                                                   "got 0")):
        BS3(qmin=0)
    with pytest.raises(ValueError, match="Vern7: `qmax` must be a finite number > 1, got 0.5"):
        Vern7(qmax=0.5)
    with pytest.raises(ValueError, match=re.escape("`beta2` must be a number in [0, 0.2)")):
        Tsit5(beta2=0.5)
    assert repr(Tsit5()) == "Tsit5()" and repr(Tsit5(adaptive=False)) == "Tsit5(adaptive=False)"
    assert repr(RK4()) == "RK4()"


def test_dt_is_the_first_step_of_adaptive_solvers(prob):
    a = solve(prob, Tsit5(), dt=1e-4)
    b = solve(prob, Tsit5())
    assert a.t[1] == pytest.approx(1e-4) and b.t[1] != a.t[1]
    np.testing.assert_allclose(a.u[-1], b.u[-1], rtol=1e-5)


def test_dense_output_errors(prob):
    sol = solve(prob, Tsit5())
    with pytest.raises(ValueError, match=re.escape("`t` must lie in the solved interval "
                                                   "[0, 2]; got 2.5")):
        sol([1.0, 2.5])
    with pytest.raises(ValueError, match="got -1.0"):
        sol(-1.0)
    with pytest.raises(ValueError, match="got nan"):
        sol(np.nan)


def warns_here(status):
    """pytest.warns for a SolveWarning that points at this test file (stacklevel)."""
    return pytest.warns(SolveWarning, match=re.escape(base.STATUS_TEXT[status]))


def check_points_at_caller(record):
    ours = [w for w in record if issubclass(w.category, SolveWarning)]
    assert ours and all(w.filename == __file__ for w in ours), [w.filename for w in ours]


def test_max_steps(prob):
    with warns_here(base.MAX_STEPS) as record:
        sol = solve(prob, Tsit5(), max_steps=5, saveat=[0.0, 0.01, 1.0, 2.0])
    check_points_at_caller(record)
    assert "stopped at t = " in str(record[0].message)
    assert sol.status == "max_steps" and not sol.success and sol.status_code == base.MAX_STEPS
    assert sol.stats["n_accepted"] + sol.stats["n_rejected"] == 5
    assert 0 < sol.t_end < 2.0
    assert np.all(sol.t <= sol.t_end) and len(sol.t) == 2  # only the times reached
    sol(sol.t_end)  # dense output up to where it stopped
    with pytest.raises(ValueError, match=r"the solve stopped early: max_steps"):
        sol(1.5)


def test_underflow_at_a_singularity():
    prob = ODEProblem(hm.blowup(), [1.0], (0.0, 2.0), np.zeros(0))
    for solver in (Tsit5(), Vern7()):
        with warns_here(base.DT_UNDERFLOW) as record:
            sol = solve(prob, solver)
        check_points_at_caller(record)
        assert sol.status == "dt_underflow"
        assert sol.t_end == pytest.approx(1.0, abs=1e-4)  # u = 1/(1 - t)
        before = sol.t < 0.99  # closer in, the problem itself amplifies every error
        np.testing.assert_allclose(sol.u[before, 0], 1 / (1 - sol.t[before]), rtol=1e-3)


def test_nonfinite():
    # adaptive: NaN in every trial step past the root of u shrinks h to nothing
    prob = ODEProblem(hm.sqrt_drain(), [1.0], (0.0, 2.0), np.zeros(0))
    with warns_here(base.NONFINITE):
        sol = solve(prob, Tsit5())
    assert sol.status == "nonfinite" and np.all(np.isfinite(sol.u))
    # fixed steps: the blow-up overflows
    prob = ODEProblem(hm.blowup(), [1.0], (0.0, 2.0), np.zeros(0))
    with warns_here(base.NONFINITE) as record:
        sol = solve(prob, RK4(), dt=0.1)
    check_points_at_caller(record)
    # RK4 from 1 with dt = 0.1: u(1.1) ~ 1e12, u(1.2) ~ 5e172 (finite), f(u(1.2)) = inf
    assert sol.status == "nonfinite" and 1.05 < sol.t_end < 1.25
    assert np.all(np.isfinite(sol.u))


def test_nonfinite_fixed_step_keeps_the_last_finite_state():
    # The RK4 step from 1.1 to 1.2 gives a finite state (~4.8e172); only f there overflows.
    # So the solve should reach t = 1.2 and stop at the next step, as it used to.
    prob = ODEProblem(hm.blowup(), [1.0], (0.0, 2.0), np.zeros(0))
    with pytest.warns(SolveWarning):
        sol = solve(prob, RK4(), dt=0.1)
    assert sol.status == "nonfinite" and sol.t_end == pytest.approx(1.2)
    assert sol.u[-1, 0] > 1e170


def test_ensemble_warns_per_problem(prob):
    bad = ODEProblem(hm.blowup(), [1.0], (0.0, 2.0), np.zeros(0))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        sols = solve([prob, bad, prob], Tsit5())
    assert [s.status for s in sols] == ["success", "dt_underflow", "success"]
    record = [w for w in record if issubclass(w.category, SolveWarning)]
    assert len(record) == 1 and "(problem 1)" in str(record[0].message)
    check_points_at_caller(record)


def test_custom_tableau_and_base_class(prob):
    from sciml.solvers import tableaus
    from sciml.solvers.erk import ExplicitRK

    with pytest.raises(TypeError, match="ExplicitRK: an explicit RK solver needs a `tableau`"):
        ExplicitRK()

    class Heun(ExplicitRK):
        """Heun's method (explicit trapezoid) with Euler embedded, Hermite output."""

        tableau = tableaus.ButcherTableau(
            c=[0.0, 1.0], A=[[0.0, 0.0], [1.0, 0.0]], b=[0.5, 0.5], b_error=[-0.5, 0.5],
            embedded_order=1, b_dense=[[1.0, -0.5], [0.0, 0.5]], order=2, dense_order=1)

    sol = solve(prob, Heun(), rtol=1e-7, atol=1e-7)
    ref = solve(prob, Vern7(), rtol=1e-10, atol=1e-10, saveat=sol.t)
    np.testing.assert_allclose(sol.u, ref.u, rtol=1e-4)
    assert repr(Heun()) == "Heun()"


@pytest.mark.parametrize("make, message", [
    (lambda: Bolus(float("nan"), 1.0, "a"), "Bolus: `time` must be a finite number, got nan"),
    (lambda: Bolus(0.0, "1", "a"), "Bolus: `amount` must be a finite number, got '1'"),
    (lambda: Bolus(0.0, 1.0, "a", count=0), "Bolus: `count` must be a positive int, got 0"),
    (lambda: Bolus(0.0, 1.0, "a", count=3), "Bolus: `count=3` needs `every`"),
    (lambda: Bolus(0.0, 1.0, "a", every=-2.0, count=3),
     "Bolus: `every` must be a finite number > 0, got -2.0"),
    (lambda: Infusion(0.0, 0.0, 1.0, "a"),
     "Infusion: `duration` must be a finite number > 0, got 0.0"),
    (lambda: Rodas5(qmax=0.5), "Rodas5: `qmax` must be a finite number > 1, got 0.5"),
    (lambda: Rodas5(beta2=True), "Rodas5: `beta2` must be a number in [0, 0.2), got True"),
    (lambda: adjoints.GaussAdjoint(rtol=0.0),
     "GaussAdjoint: `rtol` must be None or a finite number > 0, got 0.0"),
    (lambda: adjoints.QuadratureAdjoint(quad_rtol=float("inf")),
     "QuadratureAdjoint: `quad_rtol` must be None or a finite number > 0, got inf"),
])
def test_settings_objects_name_the_bad_argument(make, message):
    # every settings object checks through sciml._validate: one wording everywhere
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


@pytest.mark.parametrize("atol", [[1e-8, 1e-9], (1e-8, 1e-9), np.array([1e-8, 1e-9]),
                                  np.broadcast_to(np.array([1e-8]), (2,)), np.float64(1e-8)])
def test_a_checked_atol_is_a_writeable_contiguous_copy(atol):
    # A read-only atol (a broadcast view) is a numba type of its own: every loop it reaches
    # would be compiled a second time (the lazy dense output of a solve passed one).
    from sciml._validate import check_atol

    a = check_atol(atol, 2)
    assert a.dtype == np.float64 and a.shape == (2,)
    assert a.flags.writeable and a.flags.c_contiguous
    assert a is not atol
