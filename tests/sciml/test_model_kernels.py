"""Every generated kernel against a plain numpy evaluation and central finite differences.

For each model of the zoo (mechanistic, UDE, spiral neural ODE, piecewise
terms, PK with observables, two nets / one net called twice / nested, a
`NeuralODE`) at random parameters: `rhs_into` against the model function
run on numbers; `jac_into`, `paramjac_into` and both halves of `vjp_into`
against central differences of `rhs_into`; the observables likewise.
"""

import numpy as np
import pytest

from . import model_zoo as zoo

RTOL, ATOL = 1e-6, 1e-8


def central_diff(fun, x, h=1e-6):
    """d fun / d x, shape fun(x).shape + x.shape, by central differences."""
    x = np.asarray(x, dtype=np.float64)
    cols = []
    for k in range(x.size):
        step = h * max(1.0, abs(x[k]))
        xp, xm = x.copy(), x.copy()
        xp[k] += step
        xm[k] -= step
        cols.append((fun(xp) - fun(xm)) / (2 * step))
    return np.stack(cols, axis=-1)


@pytest.fixture(params=zoo.ZOO, ids=lambda c: c.__name__[5:])
def case(request, rng):
    return request.param(rng)


def test_rhs_matches_numpy_evaluation(case):
    m = case.model
    du = m.rhs(case.u, case.theta, case.t)
    np.testing.assert_allclose(du, zoo.evaluate(case), rtol=1e-12, atol=1e-12)
    # And through the kernel with caller-owned buffers.
    out, ws = np.full(m.n_states, np.nan), m.workspace()
    m.module.rhs_into(out, case.u, case.theta, case.t, ws)
    np.testing.assert_array_equal(out, du)


def test_jac_matches_finite_differences(case):
    m = case.model
    J = m.jac(case.u, case.theta, case.t)
    ref = central_diff(lambda u: m.rhs(u, case.theta, case.t), case.u)
    np.testing.assert_allclose(J, ref, rtol=RTOL, atol=ATOL * np.abs(ref).max())


def test_paramjac_matches_finite_differences(case):
    m = case.model
    Jp = m.paramjac(case.u, case.theta, case.t)
    assert Jp.shape == (m.n_states, m.n_params)
    ref = central_diff(lambda th: m.rhs(case.u, th, case.t), case.theta)
    np.testing.assert_allclose(Jp, ref, rtol=RTOL, atol=ATOL * np.abs(ref).max())


def test_vjp_matches_finite_differences(case, rng):
    m = case.model
    lam = rng.standard_normal(m.n_states)
    ubar, pbar = m.vjp(lam, case.u, case.theta, case.t)
    ref_u = lam @ central_diff(lambda u: m.rhs(u, case.theta, case.t), case.u)
    ref_p = lam @ central_diff(lambda th: m.rhs(case.u, th, case.t), case.theta)
    np.testing.assert_allclose(ubar, ref_u, rtol=RTOL, atol=ATOL * np.abs(ref_u).max())
    np.testing.assert_allclose(pbar, ref_p, rtol=RTOL, atol=ATOL * np.abs(ref_p).max())


def test_vjp_writes_ubar_and_adds_into_pbar(case, rng):
    m = case.model
    lam = rng.standard_normal(m.n_states)
    ubar_ref, pbar_ref = m.vjp(lam, case.u, case.theta, case.t)
    ubar = np.full(m.n_states, 123.0)
    pbar = np.arange(m.n_params, dtype=np.float64)
    ws = m.workspace()
    ws[:] = 7.0  # kernels must not depend on the workspace's previous content
    m.module.vjp_into(ubar, pbar, lam, case.u, case.theta, case.t, ws)
    np.testing.assert_allclose(ubar, ubar_ref, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(pbar, np.arange(m.n_params) + pbar_ref, rtol=1e-13,
                               atol=1e-13)


def test_jac_and_paramjac_are_the_vjp_rows(case):
    # Exact consistency between the forward- and reverse-mode kernels.
    m = case.model
    J = m.jac(case.u, case.theta, case.t)
    Jp = m.paramjac(case.u, case.theta, case.t)
    for i in range(m.n_states):
        ubar, pbar = m.vjp(np.eye(m.n_states)[i], case.u, case.theta, case.t)
        np.testing.assert_allclose(J[i], ubar, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(Jp[i], pbar, rtol=1e-12, atol=1e-14)


def test_observables_and_their_vjp(rng):
    case = zoo.case_pk(rng)
    m = case.model
    assert m.n_obs == 2 and m.obs_names == ("conc", "log_periph")
    y = m.observe(case.u, case.theta, case.t)
    u, p = zoo.named(case.u, m.states), zoo.named(case.theta, m.params)
    ref = [zoo.PK_OBSERVABLES["conc"](u, p), zoo.PK_OBSERVABLES["log_periph"](u, p, case.t)]
    np.testing.assert_allclose(y, ref, rtol=1e-13)

    ybar = rng.standard_normal(2)
    ubar, pbar = np.full(3, np.nan), np.ones(m.n_params)
    m.module.obs_vjp_into(ubar, pbar, ybar, case.u, case.theta, case.t, m.workspace())
    ref_u = ybar @ central_diff(lambda v: m.observe(v, case.theta, case.t), case.u)
    ref_p = ybar @ central_diff(lambda th: m.observe(case.u, th, case.t), case.theta)
    np.testing.assert_allclose(ubar, ref_u, rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(pbar, 1.0 + ref_p, rtol=RTOL, atol=1e-12)


def test_model_without_observables_has_empty_observable_kernels(rng):
    m = zoo.case_ude(rng).model
    assert m.n_obs == 0 and m.module.N_OBS == 0
    ubar, pbar = np.full(2, np.nan), np.ones(m.n_params)
    m.module.obs_vjp_into(ubar, pbar, np.empty(0), np.ones(2), np.ones(m.n_params), 0.0,
                          m.workspace())
    np.testing.assert_array_equal(ubar, 0.0)
    np.testing.assert_array_equal(pbar, 1.0)


def test_module_constants(case):
    mod = case.model.module
    assert (mod.N_STATES, mod.N_PARAMS, mod.N_OBS, mod.WS_SIZE) == (
        case.model.n_states, case.model.n_params, case.model.n_obs, case.model.ws_size)
    # t enters the piecewise model directly and the two-net model through a net input.
    assert mod.AUTONOMOUS == (case.name not in ("piecewise", "two_nets"))


def test_float32_arrays(rng):
    case = zoo.case_ude(rng)
    m, f32 = case.model, np.float32
    du = np.empty(2, f32)
    m.module.rhs_into(du, case.u.astype(f32), case.theta.astype(f32), f32(case.t),
                      m.workspace(f32))
    np.testing.assert_allclose(du, m.rhs(case.u, case.theta, case.t), rtol=1e-5, atol=1e-5)
