"""Every ERK solver converges at its order: fitted log-log slopes on problems with known solutions.

Fixed steps (the embedded pairs run with ``adaptive=False``): the slope of
log(error at the end) against log(dt) is the method's order; the error of
the dense output at interior points converges at min(order, dense order + 1).
Adaptive steps: the error is proportional to the tolerance (slope 1) and
falls at least as fast as nfev^-order. The step ranges sit past the
pre-asymptotic regime and above rounding (measured on these problems).
"""

import numpy as np
import pytest

from sciml.problem import ODEProblem
from sciml.solve import solve
from sciml.solvers.erk import BS3, DP5, RK4, Euler, Tsit5, Vern7

from . import handmade as hm

T = 2 * np.pi

# solver class -> steps per period of the Kepler orbit used for the fit
FIXED = {Tsit5: [128, 181, 256, 362, 512], DP5: [128, 181, 256, 362, 512],
         BS3: [64, 128, 256, 512], Vern7: [90, 128, 181, 256, 362],
         RK4: [256, 362, 512, 724, 1024]}


def slope(x, y):
    return np.polyfit(np.log(x), np.log(y), 1)[0]


@pytest.fixture(scope="module")
def kepler_prob():
    return ODEProblem(hm.kepler(), hm.kepler_solution(0.0), (0.0, T), np.zeros(0))


def fixed(cls):
    return cls() if cls in (RK4, Euler) else cls(adaptive=False)


@pytest.mark.parametrize("cls", list(FIXED), ids=lambda c: c.__name__)
def test_fixed_step_order(cls, kepler_prob):
    Ns = np.array(FIXED[cls])
    end_err, dense_err = [], []
    for N in Ns:
        dt = T / N
        sol = solve(kepler_prob, fixed(cls), dt=dt, saveat=[T])
        assert sol.stats["n_accepted"] == N
        end_err.append(np.abs(sol.u[-1] - hm.kepler_solution(T)).max())
        tq = (np.arange(N) + 0.37) * dt  # one point inside every step
        dense_err.append(np.abs(sol(tq) - hm.kepler_solution(tq)).max())
    tab = cls.tableau
    assert abs(-slope(Ns, end_err) - tab.order) < 0.4, end_err
    assert abs(-slope(Ns, dense_err) - min(tab.order, tab.dense_order + 1)) < 0.4, dense_err


def test_euler_order():
    prob = ODEProblem(hm.exact(), [1.0, 1.0], (0.0, 2.0), np.zeros(0))
    Ns = np.array([64, 128, 256, 512, 1024])
    err, derr = [], []
    for N in Ns:
        sol = solve(prob, Euler(), dt=2.0 / N, saveat=[2.0])
        err.append(np.abs(sol.u[-1] - hm.exact_solution(2.0)).max())
        tq = (np.arange(N) + 0.5) * (2.0 / N)
        derr.append(np.abs(sol(tq) - hm.exact_solution(tq)).max())
    assert abs(-slope(Ns, err) - 1) < 0.05
    assert abs(-slope(Ns, derr) - 1) < 0.05


@pytest.mark.parametrize("cls, tols", [
    (Tsit5, 10.0 ** -np.arange(4, 11)), (DP5, 10.0 ** -np.arange(4, 11)),
    (BS3, 10.0 ** -np.arange(3, 9)), (Vern7, 10.0 ** -np.arange(5, 12)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_adaptive_convergence(cls, tols, kepler_prob):
    err, nfev = [], []
    for tol in tols:
        sol = solve(kepler_prob, cls(), rtol=tol, atol=tol, saveat=[T])
        err.append(np.abs(sol.u[-1] - hm.kepler_solution(T)).max())
        nfev.append(sol.stats["nfev"])
    err = np.array(err)
    # tolerance proportionality, and no worse than the method's order in work
    assert 0.85 < slope(tols, err) < 1.15, err
    assert slope(nfev, err) < -(cls.tableau.order - 0.5), (err, nfev)
    assert np.all(err < 1e3 * tols)


@pytest.mark.parametrize("cls", [Tsit5, DP5, BS3, Vern7], ids=lambda c: c.__name__)
def test_adaptive_dense_output(cls, kepler_prob, rng):
    tol = 1e-6 if cls is BS3 else 1e-9
    sol = solve(kepler_prob, cls(), rtol=tol, atol=tol)
    tq = np.sort(rng.uniform(0, T, 500))
    err = np.abs(sol(tq) - hm.kepler_solution(tq)).max()
    end = np.abs(sol.u[-1] - hm.kepler_solution(T)).max()
    # between steps as accurate as at the steps
    assert err < 3 * max(end, 1e3 * tol * 1e-2) and err < 1e3 * tol
