"""`sciml.jax`: the translation of traced models, argument checks, every-step output,
failed solves and the stiff solver. (Parity of solutions and gradients with the numba
path: test_jax_parity.py.)"""

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("diffrax")

import sciml  # noqa: E402
import sciml.jax as sj  # noqa: E402

from . import model_zoo as Z  # noqa: E402


def test_float64_enabled():
    assert jax.config.jax_enable_x64
    f = jax.jit(sj.vector_field(Z.case_lotka_volterra(np.random.default_rng(0)).model))
    assert f(0.0, np.ones(2), np.ones(4)).dtype == np.float64


# Every zoo model, and the UDE whose observables call its net.
TRANSLATED = Z.ZOO + [Z.case_ude_observed]


@pytest.mark.parametrize("make", TRANSLATED, ids=lambda f: f.__name__[5:])
def test_translation_is_the_model_function(make, rng):
    """The printed JAX function against the model function run on numbers (the zoo's
    reference: numpy and the chains' own forward), observables included."""
    case = make(rng)
    m = case.model
    # jitted: eager JAX dispatches (and compiles) every operation one by one, slower here
    du = np.asarray(jax.jit(sj.vector_field(m))(case.t, case.u, case.theta))
    np.testing.assert_allclose(du, Z.evaluate(case), rtol=1e-12, atol=1e-12)
    obs = np.asarray(jax.jit(sj.observables(m))(case.t, case.u, case.theta))
    assert obs.shape == (m.n_obs,)
    if m.n_obs:
        np.testing.assert_allclose(obs, Z.evaluate_observables(case), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", TRANSLATED, ids=lambda f: f.__name__[5:])
def test_translation_matches_generated_kernels(make, rng):
    """The printed JAX function is the model function: rhs and observables as the kernels."""
    case = make(rng)
    m = case.model
    du = np.asarray(jax.jit(sj.vector_field(m))(case.t, case.u, case.theta))
    np.testing.assert_allclose(du, m.rhs(case.u, case.theta, case.t), rtol=1e-13, atol=1e-13)
    obs = np.asarray(jax.jit(sj.observables(m))(case.t, case.u, case.theta))
    assert obs.shape == (m.n_obs,)
    if m.n_obs:
        np.testing.assert_allclose(obs, m.observe(case.u, case.theta, case.t), rtol=1e-13)


def test_translation_is_differentiable(rng):
    """JAX derivatives of the translation (nets included) against central differences."""
    case = Z.case_two_nets(rng)
    m = case.model
    f = sj.vector_field(m)
    J = np.asarray(jax.jit(jax.jacfwd(lambda u, th: f(case.t, u, th), argnums=(0, 1)))(
        case.u, case.theta)[0])
    Jp = np.asarray(jax.jit(jax.jacrev(lambda u, th: f(case.t, u, th), argnums=1))(
        case.u, case.theta))
    h = 1e-6
    for x, jac, call in ((case.u, J, lambda v: m.rhs(v, case.theta, case.t)),
                         (case.theta, Jp, lambda v: m.rhs(case.u, v, case.t))):
        fd = np.column_stack([(call(x + h * e) - call(x - h * e)) / (2 * h)
                              for e in np.eye(x.shape[0])])
        np.testing.assert_allclose(jac, fd, rtol=1e-6, atol=1e-8)


def test_term_takes_theta_as_args(rng):
    case = Z.case_ude(rng)
    du = jax.jit(sj.term(case.model).vf)(0.0, case.u, case.theta)
    np.testing.assert_allclose(np.asarray(du), case.model.rhs(case.u, case.theta), rtol=1e-13)


def test_model_from_kernels_is_refused():
    from .test_model_hatch import build

    model = build()
    with pytest.raises(TypeError, match="from_kernels"):
        sj.vector_field(model)
    prob = sciml.ODEProblem(model, np.full(model.n_states, 0.5), (0.0, 1.0), np.ones(2))
    with pytest.raises(TypeError, match="from_kernels"):
        sj.solve(prob, saveat=[0.5])


@pytest.fixture(scope="module")
def lv():
    case = Z.case_lotka_volterra(np.random.default_rng(3))
    prob = sciml.ODEProblem(case.model, [1.0, 1.0], (0.0, 4.0), case.theta,
                            doses=[sciml.Bolus(1.0, 0.5, "x"), sciml.Infusion(2.0, 1.0, 0.3, "y")])
    return prob


def test_argument_errors(lv):
    data = sciml.Data([1.0, 2.0], np.ones((2, 2)))
    with pytest.raises(ValueError, match="solver"):
        sj.solve(lv, "Heun", saveat=[1.0])
    with pytest.raises(ValueError, match="fixed-step"):
        sj.solve(lv, sciml.RK4(), saveat=[1.0])
    with pytest.raises(TypeError, match="solver"):
        sj.solve(lv, 3, saveat=[1.0])
    with pytest.raises(ValueError, match="adjoint"):
        sj.loss_and_grad(lv, data, adjoint="forward")
    with pytest.raises(ValueError, match="rtol"):
        sj.solve(lv, rtol=-1.0, saveat=[1.0])
    with pytest.raises(ValueError, match="atol"):
        sj.solve(lv, atol=[1e-6], saveat=[1.0])
    with pytest.raises(ValueError, match="max_steps"):
        sj.solve(lv, max_steps=0, saveat=[1.0])
    with pytest.raises(TypeError, match="ODEProblem"):
        sj.solve([lv, "x"], saveat=[1.0])
    with pytest.raises(ValueError, match="list of 2"):
        sj.loss_and_grad([lv, lv], [data])
    with pytest.raises(TypeError, match="Data"):
        sj.loss_and_grad(lv, np.ones((2, 2)))
    with pytest.raises(ValueError, match="tspan"):
        sj.loss_and_grad(lv, sciml.Data([1.0, 5.0], np.ones((2, 2))))
    with pytest.raises(ValueError, match="params"):
        sj.loss_and_grad(lv, data, params=np.ones(3))
    with pytest.raises(TypeError, match="loss"):
        sj.loss_and_grad(lv, data, loss=lambda *a: 0.0)
    with pytest.raises(ValueError, match="sigma"):  # GaussianNLL's own checks
        sj.loss_and_grad(lv, data, loss=sciml.GaussianNLL(sigma="noise"))


def test_every_step_output_and_failure(lv):
    """saveat=None: every step, dose stops included and post-dose; a blow-up: a warning."""
    js = sj.solve(lv, "Tsit5", rtol=1e-9, atol=1e-9)
    ref = sciml.solve(lv, sciml.Tsit5(), rtol=1e-11, atol=1e-11, saveat=js.t)
    assert js.success and js.t[0] == 0.0 and js.t[-1] == 4.0
    assert np.all(np.diff(js.t) > 0)
    for stop in (1.0, 2.0, 3.0):
        assert stop in js.t
    np.testing.assert_allclose(js.u, ref.u, rtol=1e-7, atol=1e-8)  # post-dose at 1.0 too
    # x' = x + xy, y' = xy + y blows up before t = 4 (same shapes: no new compile)
    blow = lv.remake(params=np.array([1.0, -1.0, 1.0, -1.0]), u0=[2.0, 2.0])
    with pytest.warns(sciml.SolveWarning, match="failed"):
        bad = sj.solve(blow, "Tsit5", rtol=1e-9, atol=1e-9)
    assert not bad.success


def test_stiff_solver_by_sciml_name(lv):
    """Rodas5 -> Kvaerno5 (what sciml.fit passes: the solver's name)."""
    ts = np.linspace(0.0, 4.0, 9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        js = sj.solve(lv, "Rodas5", rtol=1e-8, atol=1e-8, saveat=ts)
    ref = sciml.solve(lv, sciml.Tsit5(), rtol=1e-11, atol=1e-11, saveat=ts)
    np.testing.assert_allclose(js.u, ref.u, rtol=1e-6, atol=1e-7)


def test_events_and_changes_are_refused_clearly():
    def ball(u, p, t, nets):
        return [u[1], -p.g]

    m = sciml.Model(ball, states=["h", "v"], params=["g"])
    ev = sciml.Event(lambda u, p, t: u.h, direction=-1)
    for kw in ({"events": [ev]}, {"changes": [sciml.Change(0.5, {"g": 1.0})]}):
        prob = sciml.ODEProblem(m, [1.0, 0.0], (0.0, 1.0), np.array([9.81]), **kw)
        with pytest.raises(ValueError, match="not supported on the JAX backend"):
            sj.solve(prob, saveat=np.linspace(0, 1, 5))
