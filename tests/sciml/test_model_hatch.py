"""`Model.from_kernels`: a model from hand-written numba kernels (the escape hatch).

The kernels below are module-level numba functions. The hatch wraps each into
a C-callable ``cfunc`` with the engine's signature (`sciml.model._hatch`),
builds `jac` and `paramjac` from `vjp` rows when they are not given, traces
the observables, and fills the kernel table the compiled loops read. There is
no ``hvp`` (no second derivatives): the methods that need it refuse the model
with a clear message, and the default sensitivity method avoids them.
"""

import numba
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import adjoints
import sciml
import sciml.model as sm
from sciml.model.assembly import call
from sciml.solvers.kernels import calls

from .test_model_kernels import ATOL, RTOL, central_diff, close

# A discretised 1-D reaction-diffusion (Fisher-KPP) equation, the kind of
# model tracing is not meant for: du_i = D (u_{i-1} - 2u_i + u_{i+1}) / h^2 + r u_i (1 - u_i),
# zero-flux boundaries. ws[:N] holds the Laplacian (scratch, to exercise `ws`).
N = 6


@numba.njit(cache=True)
def fisher_rhs(du, u, p, t, ws):
    D, r = p[0], p[1]
    n = u.shape[0]
    for i in range(n):
        left = u[i - 1] if i > 0 else u[i]
        right = u[i + 1] if i < n - 1 else u[i]
        ws[i] = left - 2.0 * u[i] + right
    for i in range(n):
        du[i] = D * ws[i] + r * u[i] * (1.0 - u[i])


@numba.njit(cache=True)
def fisher_vjp(ubar, pbar, lam, u, p, t, ws):
    D, r = p[0], p[1]
    n = u.shape[0]
    for i in range(n):
        ubar[i] = lam[i] * r * (1.0 - 2.0 * u[i])
    for i in range(n):
        # d(lap_i)/du: -2 at i, +1 at the neighbours (the mirrored boundary adds back one).
        li = lam[i] * D
        left = i - 1 if i > 0 else i
        right = i + 1 if i < n - 1 else i
        ubar[left] += li
        ubar[right] += li
        ubar[i] -= 2.0 * li
        lap = (u[left] - 2.0 * u[i] + u[right])
        pbar[0] += lam[i] * lap
        pbar[1] += lam[i] * u[i] * (1.0 - u[i])


@numba.njit(cache=True)
def fisher_jac(J, u, p, t, ws):
    D, r = p[0], p[1]
    n = u.shape[0]
    for i in range(n):
        for j in range(n):
            J[i, j] = 0.0
    for i in range(n):
        left = i - 1 if i > 0 else i
        right = i + 1 if i < n - 1 else i
        J[i, left] += D
        J[i, right] += D
        J[i, i] += -2.0 * D + r * (1.0 - 2.0 * u[i])


@numba.njit(cache=True)
def doubled_jac(J, u, p, t, ws):
    fisher_jac(J, u, p, t, ws)
    for i in range(J.shape[0]):
        for j in range(J.shape[1]):
            J[i, j] *= 2.0


@numba.njit(cache=True)
def fisher_paramjac(Jp, u, p, t, ws):
    n = u.shape[0]
    for i in range(n):
        left = u[i - 1] if i > 0 else u[i]
        right = u[i + 1] if i < n - 1 else u[i]
        Jp[i, 0] = left - 2.0 * u[i] + right
        Jp[i, 1] = u[i] * (1.0 - u[i])


@numba.njit(cache=True)
def ws_length_rhs(du, u, p, t, ws):
    du[0] = ws.shape[0]  # what the hatch hands the kernel: ws[:ws_size]
    for i in range(1, du.shape[0]):
        du[i] = 0.0


def build(**kw):
    """The Fisher-KPP model from the kernels above (also used by other tests)."""
    return sm.Model.from_kernels(fisher_rhs, fisher_vjp, [f"c{i}" for i in range(N)],
                                 ["D", "r"], ws_size=N,
                                 observables={"total": lambda u, p: np.sum(u)}, **kw)


@pytest.fixture(scope="module")
def model():
    return build()


THETA = np.array([0.3, 1.1])


def numpy_rhs(u, p):
    padded = np.concatenate([[u[0]], u, [u[-1]]])
    return p[0] * (padded[:-2] - 2 * u + padded[2:]) + p[1] * u * (1 - u)


def test_rhs_and_the_derivatives_built_from_vjp(model, rng):
    u = rng.uniform(0, 1, N)
    np.testing.assert_allclose(model.rhs(u, THETA), numpy_rhs(u, THETA), rtol=1e-14)
    J = model.jac(u, THETA)  # from vjp rows
    np.testing.assert_allclose(J, central_diff(lambda v: numpy_rhs(v, THETA), u), rtol=RTOL,
                               atol=ATOL)
    Jp = model.paramjac(u, THETA)  # from vjp rows
    np.testing.assert_allclose(Jp, central_diff(lambda th: numpy_rhs(u, th), THETA),
                               rtol=RTOL, atol=ATOL)
    lam = rng.standard_normal(N)
    ubar, pbar = model.vjp(lam, u, THETA)
    np.testing.assert_allclose(ubar, lam @ J, rtol=1e-12)
    np.testing.assert_allclose(pbar, lam @ Jp, rtol=1e-12)


def test_built_jacobians_ignore_stale_outputs_and_workspace(model, rng):
    u = rng.uniform(0, 1, N)
    J_ref, Jp_ref = model.jac(u, THETA), model.paramjac(u, THETA)
    ws = np.full(model.workspace().shape, 1e3)
    J, Jp = np.full((N, N), np.nan), np.full((N, 2), np.nan)
    call(model.kernel_table("jac"), "jac", (J, u, THETA), 0.0, ws)
    call(model.kernel_table("paramjac"), "paramjac", (Jp, u, THETA), 0.0, ws)
    np.testing.assert_array_equal(J, J_ref)
    np.testing.assert_array_equal(Jp, Jp_ref)
    # vjp through the wrapper: ubar written, pbar added to
    lam = rng.standard_normal(N)
    ubar, pbar = np.full(N, np.nan), np.array([1.0, 2.0])
    call(model.kernel_table("vjp"), "vjp", (ubar, pbar, lam, u, THETA), 0.0, ws)
    np.testing.assert_allclose(ubar, lam @ J_ref, rtol=1e-12)
    np.testing.assert_allclose(pbar, [1.0, 2.0] + lam @ Jp_ref, rtol=1e-12)


def test_observables_are_traced(model, rng):
    u = rng.uniform(0, 1, N)
    assert model.obs_names == ("total",) and model.has_kernel("obs_vjp")
    np.testing.assert_allclose(model.observe(u, THETA), [u.sum()], rtol=1e-14)
    ubar, pbar = np.full(N, np.nan), np.zeros(2)
    call(model.kernel_table("obs_vjp"), "obs_vjp", (ubar, pbar, np.array([2.0]), u, THETA), 0.0,
         model.workspace())
    np.testing.assert_array_equal(ubar, 2.0)
    np.testing.assert_array_equal(pbar, 0.0)


def test_properties_and_kernels(model):
    assert model.states == tuple(f"c{i}" for i in range(N)) and model.params == ("D", "r")
    assert model.n_params == 2 and model.n_obs == 1
    # the user's N, then the rows the built Jacobians use (lam, ubar, pbar)
    assert model.ws_size == N + 2 * N + 2
    table = model.kernel_table()
    assert table[calls.K_WS] == model.ws_size and table[calls.K_AUTONOMOUS] == 0
    for k in ("rhs", "jac", "paramjac", "vjp"):
        assert model.has_kernel(k) and table[calls.KERNEL_SLOTS[k]] != 0, k
    assert build(autonomous=True).kernel_table()[calls.K_AUTONOMOUS] == 1
    assert "fisher_rhs" in repr(model)
    # the rendering shows the traced observables; the user's kernels are not generated
    assert "def obs(" in model.source and "def rhs(" not in model.source


def test_the_kernels_get_ws_up_to_ws_size():
    m = sm.Model.from_kernels(ws_length_rhs, fisher_vjp, ["a", "b"], ["D", "r"], ws_size=3)
    assert m.rhs(np.zeros(2), THETA)[0] == 3
    assert m.ws_size > 3  # the built Jacobians' rows come after the user's scratch
    m0 = sm.Model.from_kernels(ws_length_rhs, fisher_vjp, ["a", "b"], ["D", "r"])
    assert m0.rhs(np.zeros(2), THETA)[0] == 0


def test_no_hvp_and_a_clear_error_where_it_is_needed(model, rng):
    assert not model.has_kernel("hvp")
    u, lam = rng.uniform(0, 1, N), rng.standard_normal(N)
    msg = r"has no `hvp` kernel \(a model from hand-written kernels has no second derivatives\)"
    with pytest.raises(ValueError, match=msg):
        model.hvp(lam, lam, u, THETA)
    with pytest.raises(ValueError, match=msg):
        model.kernel_table("rhs", "hvp")
    prob = sciml.ODEProblem(model, np.linspace(0.1, 0.9, N), (0.0, 0.5), THETA)
    data = sciml.Data([0.25, 0.5], np.full((2, N), 0.5))
    for method in (adjoints.ForwardSensitivity(), adjoints.DiscreteAdjoint()):
        name = type(method).__name__
        with pytest.raises(ValueError, match=rf"{name} with Rodas5 needs the model's `hvp` "
                           r"kernel, which .* does not have \(a model from hand-written kernels"
                           r" has no second derivatives: use adjoints.GaussAdjoint\(\)"):
            sciml.loss_and_grad(prob, data, solver=sciml.Rodas5(), sensealg=method)
    # the default method avoids what the model lacks
    assert isinstance(adjoints.default_sensealg(model, sciml.Rodas5()), adjoints.GaussAdjoint)
    assert isinstance(adjoints.default_sensealg(model, sciml.Tsit5()),
                      adjoints.ForwardSensitivity)


def test_solves_and_gradients_through_the_wrappers(model):
    u0 = np.linspace(0.1, 0.9, N)
    t = np.linspace(0.1, 1.0, 4)
    ref = solve_ivp(lambda s, u: numpy_rhs(u, THETA), (0.0, 1.0), u0, method="DOP853",
                    rtol=1e-12, atol=1e-12, t_eval=t).y.T
    prob = sciml.ODEProblem(model, u0, (0.0, 1.0), THETA)
    for solver in (sciml.Tsit5(), sciml.Rodas5()):  # Rodas5: the Jacobian built from vjp
        sol = sciml.solve(prob, solver, rtol=1e-9, atol=1e-9, saveat=t)
        np.testing.assert_allclose(sol.u, ref, rtol=1e-6, atol=1e-7, err_msg=solver.name)
    data = sciml.Data(t, ref + 0.05)
    value, grad = sciml.loss_and_grad(prob, data, solver=sciml.Rodas5(), rtol=1e-9, atol=1e-9)
    fd = central_diff(lambda th: np.array(sciml.loss_value(prob, data, solver=sciml.Rodas5(),
                                                            rtol=1e-10, atol=1e-10, params=th)),
                      THETA, h=1e-5)
    close(grad, fd, rtol=1e-4, atol=1e-6)


def test_user_jacobians_are_used_when_given(model, rng):
    u = rng.uniform(0, 1, N)
    m = build(jac_into=fisher_jac, paramjac_into=fisher_paramjac)
    np.testing.assert_allclose(m.jac(u, THETA), model.jac(u, THETA), rtol=1e-14)
    np.testing.assert_allclose(m.paramjac(u, THETA), model.paramjac(u, THETA), rtol=1e-14)
    # the given kernel is the one called (not the one built from vjp)
    np.testing.assert_allclose(build(jac_into=doubled_jac).jac(u, THETA), 2 * model.jac(u, THETA),
                               rtol=1e-14)


def test_rejects_what_it_cannot_wrap():
    with pytest.raises(TypeError, match="`rhs_into` must be a numba.njit function"):
        sm.Model.from_kernels(numpy_rhs, fisher_vjp, ["a"], [])
    with pytest.raises(TypeError, match="`vjp_into` must be a numba.njit function"):
        sm.Model.from_kernels(fisher_rhs, lambda *a: None, ["a"], [])
    with pytest.raises(TypeError, match="`jac_into` must be a numba.njit function"):
        sm.Model.from_kernels(fisher_rhs, fisher_vjp, ["a"], [], jac_into=numpy_rhs)
    lost = numba.njit(lambda du, u, p, t, ws: None)
    lost.__module__ = "no_such_module_for_sciml_tests"
    with pytest.raises(ValueError, match=r"`rhs_into`: cannot import its module "
                       r"'no_such_module_for_sciml_tests'"):
        sm.Model.from_kernels(lost, fisher_vjp, ["a"], [])
    for bad in (-1, True, 2.0, "3"):
        with pytest.raises(ValueError, match="`ws_size` must be an int >= 0"):
            sm.Model.from_kernels(fisher_rhs, fisher_vjp, ["a"], [], ws_size=bad)
    with pytest.raises(ValueError, match="`states` must name at least one state"):
        sm.Model.from_kernels(fisher_rhs, fisher_vjp, [], [])
