"""The JAX/diffrax path agrees with the numba path: solutions, observables, gradients.

Four models: the spiral neural ODE (../shared/BENCHMARKS.md item 2), the
Lotka-Volterra UDE, a two-compartment PK model with an observable, a
repeated bolus, a bolus at ``tf`` and an infusion, and a logistic model with
a net whose observables call the net and whose initial values are functions
of the parameters (``u0(p, nets)``). Solutions are compared
at rtol = atol = 1e-10 in both paths; gradients of `sciml.jax.loss_and_grad`
against central finite differences of losses computed from `sciml.solve`
at rtol = atol = 1e-12 (and against `sciml.loss_and_grad`).

JAX compiles slowly (seconds per function), so every compiled function is
shared through module-scoped fixtures and each test compiles at most one.
"""

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("diffrax")

import sciml  # noqa: E402
import sciml.jax as sj  # noqa: E402
from nets import Chain, Dense  # noqa: E402
from sciml.losses import SSE, GaussianNLL, ObservationLoss  # noqa: E402

from . import model_zoo as Z  # noqa: E402

pytestmark = pytest.mark.heavy  # see `heavy` in pyproject.toml

TIGHT = dict(rtol=1e-10, atol=1e-10)
REF = dict(rtol=1e-12, atol=1e-12)


def numba_loss(probs, datas, theta, loss, shared=True):
    """Sum of `loss` over problems, predictions from `sciml.solve` at rtol = atol = 1e-12."""
    total = 0.0
    for k, (p, d) in enumerate(zip(probs, datas)):
        th = theta if shared else theta[k]
        sol = sciml.solve(p.remake(params=th), sciml.Tsit5(), saveat=d.t, **REF)
        cols = d.columns(p.model)
        Y = sol.u if d.kind == "states" else np.column_stack(
            [sol.observables[n] for n in p.model.obs_names])
        total += loss(Y[:, cols], d, th, p.model)[0]
    return total


def fd_grad(f, theta, rel=1e-6):
    g = np.empty_like(theta)
    for j in range(theta.shape[0]):
        h = rel * max(1.0, abs(theta[j]))
        e = np.zeros_like(theta)
        e[j] = h
        g[j] = (f(theta + e) - f(theta - e)) / (2 * h)
    return g


def rel_err(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def has_lead_gradient():
    return hasattr(sciml, "loss_and_grad")


# ------------------------------------------------------------------- spiral


A_TRUE = np.array([[-0.1, 2.0], [-2.0, -0.1]])


def spiral_truth(u0, ts):
    """The true spiral du/dt = (u^3) A, solved tightly."""
    def f(u, p, t):
        a, b = u[0] ** 3, u[1] ** 3
        return [a * A_TRUE[0, 0] + b * A_TRUE[1, 0], a * A_TRUE[0, 1] + b * A_TRUE[1, 1]]

    m = sciml.Model(f, ["a", "b"], [])
    prob = sciml.ODEProblem(m, u0, (0.0, 1.5), np.zeros(0))
    return sciml.solve(prob, saveat=ts, **REF).u


@pytest.fixture(scope="module")
def spiral():
    rng = np.random.default_rng(11)
    case = Z.case_spiral(rng)
    ts = np.linspace(0.0, 1.5, 30)
    u0s = [np.array([2.0, 0.0])] + [rng.uniform(-1.5, 1.5, 2) for _ in range(2)]
    # Each problem has its own parameters: the batch takes one theta row per problem.
    thetas = [case.theta * (1 + 0.1 * k) for k in range(3)]
    probs = [sciml.ODEProblem(case.model, u0, (0.0, 1.5), th) for u0, th in zip(u0s, thetas)]
    datas = [sciml.Data(ts, spiral_truth(u0, ts)) for u0 in u0s]
    return case.model, probs, datas, np.stack(thetas), ts


def test_spiral_solution(spiral):
    model, probs, _, _, ts = spiral
    jsols = sj.solve(probs, "Tsit5", saveat=ts, **TIGHT)  # one vmap batch
    for p, js in zip(probs, jsols):
        ref = sciml.solve(p, sciml.Tsit5(), saveat=ts, **TIGHT)
        assert js.success
        np.testing.assert_array_equal(js.t, ts)
        np.testing.assert_allclose(js.u, ref.u, rtol=1e-8, atol=1e-8)


def test_spiral_gradient_batch(spiral):
    """A vmap batch whose problems have their own parameters, one value and gradient each."""
    model, probs, datas, thetas, _ = spiral
    values, grads = sj.loss_and_grad(probs, datas, adjoint="recursive_checkpoint",
                                     per_problem=True, **TIGHT)
    assert values.shape == (3,) and grads.shape == (3, model.n_params)
    assert grads.dtype == np.float64
    for k in range(3):
        ref = numba_loss(probs[k:k + 1], datas[k:k + 1], thetas[k], SSE())
        assert values[k] == pytest.approx(ref, rel=1e-8)
    f = lambda th: numba_loss(probs[1:2], datas[1:2], th, SSE())  # noqa: E731
    assert rel_err(grads[1], fd_grad(f, thetas[1])) < 1e-6

    def shifted(th):  # the same shift of every problem's parameters: the summed gradient
        return numba_loss(probs, datas, thetas + (th - thetas[0]), SSE(), shared=False)

    assert rel_err(grads.sum(axis=0), fd_grad(shifted, thetas[0])) < 1e-6


def test_spiral_gradient_backsolve(spiral):
    """diffrax's continuous adjoint on one problem; also against sciml.loss_and_grad."""
    model, probs, datas, thetas, _ = spiral
    value, grad = sj.loss_and_grad(probs[0], datas[0], adjoint="backsolve", **TIGHT)
    f = lambda th: numba_loss(probs[:1], datas[:1], th, SSE())  # noqa: E731
    assert value == pytest.approx(f(thetas[0]), rel=1e-8)
    assert rel_err(grad, fd_grad(f, thetas[0])) < 1e-6
    if has_lead_gradient():
        v2, g2 = sciml.loss_and_grad(probs[0], datas[0], **TIGHT)
        assert v2 == pytest.approx(value, rel=1e-7)
        assert rel_err(grad, g2) < 1e-6


# ---------------------------------------------------------------------- UDE


class HalfSSE(ObservationLoss):
    """A loss sciml.jax has no JAX formula for: evaluated in numpy, pulled back by vjp."""

    def __call__(self, yhat, data, theta, model):
        v, ybar, _ = SSE()(yhat, data, theta, model)
        return 0.5 * v, 0.5 * ybar, None


@pytest.fixture(scope="module")
def ude():
    rng = np.random.default_rng(12)
    case = Z.case_ude(rng)
    case.theta[case.model.param_slices["U"]] *= 0.5
    prob = sciml.ODEProblem(case.model, [0.44249296, 4.6280594], (0.0, 3.0), case.theta)
    ts = np.linspace(0.0, 3.0, 31)
    y = sciml.solve(prob, saveat=ts, **REF).u * (1 + 0.05 * rng.standard_normal((31, 2)))
    y[3, 0] = y[17, 1] = np.nan  # missing values are masked out
    w = rng.uniform(0.5, 2.0, y.shape)
    return case.model, prob, sciml.Data(ts, y, weights=w), case.theta


def test_ude_solution(ude):
    model, prob, data, _ = ude
    js = sj.solve(prob, sciml.Tsit5(), saveat=data.t, **TIGHT)
    ref = sciml.solve(prob, sciml.Tsit5(), saveat=data.t, **TIGHT)
    np.testing.assert_allclose(js.u, ref.u, rtol=1e-8, atol=1e-8)


def test_ude_gradient_numpy_loss(ude):
    """A custom ObservationLoss (numpy), weights and NaN mask; `params` replaces the problem's."""
    model, prob, data, theta = ude
    theta = theta.copy()
    theta[0] *= 1.1
    value, grad = sj.loss_and_grad(prob, data, loss=HalfSSE(), params=theta, **TIGHT)
    f = lambda th: numba_loss([prob], [data], th, HalfSSE())  # noqa: E731
    assert value == pytest.approx(f(theta), rel=1e-8)
    assert rel_err(grad, fd_grad(f, theta)) < 1e-6
    if has_lead_gradient():  # the numba adjoints, same loss
        v2, g2 = sciml.loss_and_grad(prob, data, loss=HalfSSE(), params=theta, **TIGHT)
        assert v2 == pytest.approx(value, rel=1e-7)
        assert rel_err(grad, g2) < 1e-6


# ----------------------------------------------------------------------- PK


PK_NAMES = ["ka", "V", "Vmax", "Km", "Q", "Vp", "sigma"]


@pytest.fixture(scope="module")
def pk():
    # A noise parameter (log sigma) beside the zoo's PK parameters: GaussianNLL fits it.
    model = sciml.Model(Z.pk_two_compartment, ["depot", "central", "periph"], PK_NAMES,
                        observables=Z.PK_OBSERVABLES)
    theta = model.init_params(ka=1.2, V=30.0, Vmax=12.0, Km=2.5, Q=4.0, Vp=50.0,
                              sigma=np.log(0.3))
    doses = [sciml.Bolus(0.0, 100.0, "depot", every=6.0, count=3),
             sciml.Infusion(3.0, 2.0, 20.0, "central"),
             sciml.Bolus(12.0, 5.0, "periph")]
    prob = sciml.ODEProblem(model, [0.0, 1.0, 0.5], (0.0, 12.0), theta, doses=doses)
    # Save times on dose times (0, 3, 5, 6, 12: right-continuity) and between them.
    ts = np.array([0.0, 0.5, 1.0, 2.5, 3.0, 4.0, 5.0, 5.5, 6.0, 7.0, 9.0, 11.0, 12.0])
    rng = np.random.default_rng(13)
    conc = sciml.solve(prob, saveat=ts, **REF).observables["conc"]
    y = conc + 0.3 * rng.standard_normal(conc.shape)
    y[[2, 7]] = np.nan
    return model, prob, sciml.Data(ts, y, observables=["conc"]), theta


def test_pk_solution_with_doses(pk):
    model, prob, data, _ = pk
    js = sj.solve(prob, "Tsit5", saveat=data.t, **TIGHT)
    ref = sciml.solve(prob, sciml.Tsit5(), saveat=data.t, **TIGHT)
    np.testing.assert_allclose(js.u, ref.u, rtol=1e-8, atol=1e-8)
    # post-dose at a bolus time, including one at t0 and one at tf
    assert js.u[0, 0] == pytest.approx(100.0)
    assert js.u[-1, 2] == pytest.approx(ref.u[-1, 2], rel=1e-9)
    for name in model.obs_names:
        np.testing.assert_allclose(js.observables[name], ref.observables[name], rtol=1e-8,
                                   atol=1e-10)


def test_pk_gradient_gaussian_nll(pk):
    model, prob, data, theta = pk
    loss = GaussianNLL(sigma="sigma", log=True)
    value, grad = sj.loss_and_grad(prob, data, loss=loss, params=theta, **TIGHT)
    f = lambda th: numba_loss([prob], [data], th, loss)  # noqa: E731
    assert value == pytest.approx(f(theta), rel=1e-8)
    fd = fd_grad(f, theta)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6 * np.abs(fd).max())
    if has_lead_gradient():
        v2, g2 = sciml.loss_and_grad(prob, data, loss=loss, params=theta, **TIGHT)
        assert v2 == pytest.approx(value, rel=1e-7)
        np.testing.assert_allclose(grad, g2, rtol=1e-5, atol=1e-6 * np.abs(fd).max())


# ------------------------------------------- observables calling a net; u0 from parameters


def logistic_g(u, p, t, nets):
    x, y = u
    g = nets.G([x])[0]
    return [p.r * x * (1.0 - x / 3.0) - g * y, g * x - p.d * y]


NET_OBSERVABLES = {"g": lambda u, p, t, nets: nets.G([u.x])[0], "y": lambda u, p: u.y}


@pytest.fixture(scope="module")
def net_observed():
    """A model whose observable calls its net, with data on both observables."""
    rng = np.random.default_rng(14)
    chain = Chain(1, Dense(4, "tanh"), Dense(1))
    model = sciml.Model(logistic_g, ["x", "y"], ["r", "d", "A0"], nets={"G": chain},
                        observables=NET_OBSERVABLES)
    theta = model.init_params(r=1.1, d=0.6, A0=1.4)
    theta[model.param_slices["G"]] = 0.6 * rng.standard_normal(chain.n_params)
    prob = sciml.ODEProblem(model, [1.0, 0.5], (0.0, 3.0), theta)
    ts = np.linspace(0.0, 3.0, 16)
    sol = sciml.solve(prob, saveat=ts, **REF)
    y = np.column_stack([sol.observables[n] for n in model.obs_names])
    y = y * (1 + 0.05 * rng.standard_normal(y.shape))
    return model, prob, sciml.Data(ts, y, observables=list(model.obs_names)), theta


def test_net_observable_solution(net_observed):
    model, prob, data, _ = net_observed
    js = sj.solve(prob, "Tsit5", saveat=data.t, **TIGHT)
    ref = sciml.solve(prob, sciml.Tsit5(), saveat=data.t, **TIGHT)
    np.testing.assert_allclose(js.u, ref.u, rtol=1e-8, atol=1e-8)
    for name in model.obs_names:
        np.testing.assert_allclose(js.observables[name], ref.observables[name], rtol=1e-8,
                                   atol=1e-10)


def test_net_observable_gradient(net_observed):
    """The loss on an observable that calls the net: its gradient reaches the net's weights."""
    model, prob, data, theta = net_observed
    value, grad = sj.loss_and_grad(prob, data, **TIGHT)
    f = lambda th: numba_loss([prob], [data], th, SSE())  # noqa: E731
    assert value == pytest.approx(f(theta), rel=1e-8)
    assert rel_err(grad, fd_grad(f, theta)) < 1e-6
    assert np.all(grad[model.param_slices["G"]] != 0.0)
    v2, g2 = sciml.loss_and_grad(prob, data, **TIGHT)
    assert v2 == pytest.approx(value, rel=1e-7)
    assert rel_err(grad, g2) < 1e-6


def test_initial_values_from_parameters_gradient(net_observed):
    """u0 = (A0, 0): the initial state is a JAX function of theta; gradients flow through."""
    model, prob, data, theta = net_observed
    p0 = prob.remake(u0=lambda p, nets: [p.A0, 0.0])
    js = sj.solve(p0, "Tsit5", saveat=data.t, **TIGHT)
    ref = sciml.solve(p0, sciml.Tsit5(), saveat=data.t, **TIGHT)
    np.testing.assert_allclose(js.u[0], [theta[2], 0.0], rtol=1e-15)
    np.testing.assert_allclose(js.u, ref.u, rtol=1e-8, atol=1e-8)
    value, grad = sj.loss_and_grad(p0, data, params=theta, **TIGHT)
    v2, g2 = sciml.loss_and_grad(p0, data, params=theta, **TIGHT)
    assert value == pytest.approx(v2, rel=1e-7)
    assert rel_err(grad, g2) < 1e-6
    f = lambda th: numba_loss([p0], [data], th, SSE())  # noqa: E731
    assert rel_err(grad, fd_grad(f, theta)) < 1e-6
    # A0 enters through u0 only: its derivative is the initial values' pullback
    assert abs(grad[2]) > 1e-3 * np.abs(grad).max()


def test_initial_values_through_the_net_with_a_bolus_at_t0(net_observed):
    """u0 that calls the net, a bolus at t0 on top of it, and every-step output."""
    model, prob, data, theta = net_observed
    p0 = prob.remake(u0=lambda p, nets: [p.A0, nets.G([p.A0])[0] ** 2],
                     doses=[sciml.Bolus(0.0, 0.3, "y"), sciml.Bolus(1.5, 0.2, "x")])
    u_start = p0.u0 + [0.0, 0.3]  # right-continuous: the bolus at t0 is in the state
    every = sj.solve(p0, "Tsit5", **TIGHT)  # saveat=None: every step, from the initial state
    assert every.success and every.t[0] == 0.0 and 1.5 in every.t
    np.testing.assert_allclose(every.u[0], u_start, rtol=1e-13)
    ref = sciml.solve(p0, sciml.Tsit5(), saveat=every.t, **TIGHT)
    np.testing.assert_allclose(every.u, ref.u, rtol=1e-8, atol=1e-8)
    v2, g2 = sciml.loss_and_grad(p0, data, **TIGHT)
    value, grad = sj.loss_and_grad(p0, data, **TIGHT)
    assert value == pytest.approx(v2, rel=1e-7)
    assert rel_err(grad, g2) < 1e-6
