"""Every sensitivity method with every solver, against finite differences, at tight tolerances.

The problem of the engine issue: a FitzHugh-Nagumo model whose recovery term
carries a 1-8-8-1 network, tspan (0, 20), 25 noisy observations of both
states. Each method runs at rtol = atol = 1e-10 with Tsit5, Vern7 and Rodas5
and must agree with a finite-difference reference to 1e-6 relative (with no
failed backward solve: a failure raises a SolveWarning, turned into an error
here). The reference is a Richardson-extrapolated central difference of the
loss along fixed random directions, each loss solved by Vern7 at 1e-13.
"""

import warnings

import numpy as np
import pytest

import sciml
from nets import Chain, Dense

from ..methods import METHODS

pytestmark = pytest.mark.heavy  # see `heavy` in pyproject.toml

SOLVERS = {"Tsit5": sciml.Tsit5(), "Vern7": sciml.Vern7(), "Rodas5": sciml.Rodas5()}
TOL = 1e-10


def fitzhugh_nagumo(u, p, t, nets):
    v, w = u
    return [v - v**3 / 3 - w + p.I, p.eps * (v + p.a - p.b * w) + nets.R([w])[0]]


@pytest.fixture(scope="module")
def problem():
    R = Chain(1, Dense(8, "tanh"), Dense(8, "tanh"), Dense(1))
    model = sciml.Model(fitzhugh_nagumo, ["v", "w"], ["I", "eps", "a", "b"], nets={"R": R})
    theta = model.init_params(seed=1, I=0.5, eps=0.08, a=0.7, b=0.8)
    theta[4:] *= 0.05  # a small network term: the dynamics stay FitzHugh-Nagumo's
    prob = sciml.ODEProblem(model, [1.0, 0.0], (0.0, 20.0), theta)
    t = np.linspace(0.8, 20.0, 25)
    y = sciml.solve(prob, sciml.Vern7(), rtol=1e-12, atol=1e-12, saveat=t).u
    noise = 0.05 * np.random.default_rng(0).standard_normal(y.shape)
    return prob, sciml.Data(t, y + noise)


def _loss(prob, data, theta):
    return sciml.loss_value(prob, data, solver=sciml.Vern7(), params=theta, rtol=1e-13,
                            atol=1e-13)


@pytest.fixture(scope="module")
def reference(problem):
    """Directions (k, n_params) and the loss's derivatives along them."""
    prob, data = problem
    theta = prob.params
    rng = np.random.default_rng(2)
    dirs = rng.standard_normal((3, theta.shape[0]))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    h = 2e-4  # (the loss bends sharply along these directions: 1e-3 is too coarse)
    out = []
    for d in dirs:
        def cd(s, d=d):
            return (_loss(prob, data, theta + s * d) - _loss(prob, data, theta - s * d)) / (2 * s)
        out.append((4 * cd(h / 2) - cd(h)) / 3)  # Richardson: error O(h^4)
    return dirs, np.array(out)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("solver", list(SOLVERS))
def test_gradient_matches_finite_differences(problem, reference, solver, method):
    prob, data = problem
    dirs, fd = reference
    with warnings.catch_warnings():
        warnings.simplefilter("error", sciml.SolveWarning)  # no failed backward solve
        value, grad = sciml.loss_and_grad(prob, data, solver=SOLVERS[solver],
                                          sensealg=METHODS[method], rtol=TOL, atol=TOL)
    assert np.isfinite(value)
    np.testing.assert_allclose(dirs @ grad, fd, rtol=1e-6, atol=1e-6 * np.abs(fd).max())


# ------------------------------------------------ a UDE whose gradient entries span 1e4

# The network in place of FitzHugh-Nagumo's cubic term: with the random initial network
# v runs away (to -1e8 at t = 20), the gradient's entries range over 6e13 .. 5e17, and
# the entries of softplus units that are off (exactly 0) until v enters their range late
# in the backward solve grow from 0 there. With mu in the backward error norm each of
# those entries was held to its own atol + rtol |mu_j|: ~374,000 backward steps for the
# interpolating adjoint (past the default budget) and, for backsolve, a first step too
# small to move t ("step size underflow"); with lambda (and u) only: 482 and 480, as
# GaussAdjoint's 482 (see adjoints.continuous).


def fhn_ude(u, p, t, nets):
    v, w = u
    return [v + nets.U([v])[0] - w + p.I, p.eps * (v + p.a - p.b * w)]


@pytest.fixture(scope="module")
def ude_problem():
    U = Chain(1, Dense(8, "softplus"), Dense(8, "tanh"), Dense(1))
    model = sciml.Model(fhn_ude, ["v", "w"], ["I", "eps", "a", "b"], nets={"U": U})
    theta = model.init_params(seed=3, I=0.5, eps=0.08, a=0.7, b=0.8)
    t = np.linspace(0.0, 20.0, 25)
    truth = theta * (1 + 0.2 * np.random.default_rng(2).standard_normal(theta.shape))
    prob = sciml.ODEProblem(model, [-1.0, 1.0], (0.0, 20.0), truth)
    y = sciml.solve(prob, rtol=1e-10, atol=1e-10, saveat=t).u
    prob.params = theta
    return prob, sciml.Data(t, y)


@pytest.fixture(scope="module")
def ude_reference(ude_problem):
    """The loss's central differences in every parameter (solves at 1e-12)."""
    prob, data = ude_problem
    theta = prob.params
    out = np.zeros(theta.shape[0])
    for i in range(theta.shape[0]):
        e = np.zeros_like(theta)
        e[i] = 1e-6 * max(abs(theta[i]), 1e-2)
        f = [sciml.loss_value(prob, data, params=theta + s * e, rtol=1e-12, atol=1e-12)
             for s in (1, -1)]
        out[i] = (f[0] - f[1]) / (2 * e[i])
    return out


@pytest.mark.parametrize("method", ["interp", "interp_ckpt", "backsolve"])
def test_continuous_adjoints_at_tight_tolerance_on_a_runaway_ude(ude_problem, ude_reference,
                                                                 method):
    prob, data = ude_problem
    fd = ude_reference
    scale = np.abs(fd).max()
    with warnings.catch_warnings():
        warnings.simplefilter("error", sciml.SolveWarning)  # default step budget, no failure
        grads = {k: sciml.loss_and_grad(prob, data, sensealg=METHODS[k], rtol=TOL,
                                        atol=TOL)[1] for k in ("gauss", method)}
    # (the differences themselves are good to ~2e-7 of the largest entry: the loss is ~1e15)
    np.testing.assert_allclose(grads[method], fd, rtol=0, atol=1e-6 * scale)
    np.testing.assert_allclose(grads[method], grads["gauss"], rtol=1e-7, atol=1e-9 * scale)
