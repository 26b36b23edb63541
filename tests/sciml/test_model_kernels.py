"""Every compiled kernel against a plain numpy evaluation and central finite differences.

For each model of the zoo (mechanistic, UDE, spiral neural ODE, piecewise
terms, PK with observables, two nets / one net called twice / nested, a
`NeuralODE`, a UDE whose observables call its net) at random parameters:
``rhs`` against the model function run on numbers; ``jac``, ``paramjac`` and
both halves of ``vjp`` against central differences of ``rhs``; ``hvp`` against
central differences of lam^T J v; the observables against their functions run
on numbers and their vjp against central differences. Kernels are also called
directly (`sciml.model.assembly.call`, as the engine calls them through the
kernel table) with stale scratch and prefilled outputs: ``ubar`` is written,
``pbar`` added to, and nothing depends on what ``ws`` held before. Last, the
Python rendering of the same syntax trees (`Model.source`), compiled by numba,
agrees with the LLVM machine code.
"""

import importlib.util

import numpy as np
import pytest

import sciml.model as sm
from sciml.model.assembly import call
from sciml.solvers.kernels import calls

from . import model_zoo as zoo

RTOL, ATOL = 1e-6, 1e-8

CASES = zoo.ZOO + [zoo.case_ude_observed]


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


def close(actual, expected, rtol=RTOL, atol=ATOL, err_msg=""):
    """assert_allclose with the absolute tolerance relative to the reference's scale."""
    scale = max(np.abs(expected).max(initial=0.0), 1e-300)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol * scale, err_msg=err_msg)


def _ids(c):
    return c.__name__[5:]


@pytest.fixture(params=CASES, ids=_ids)
def case(request, rng):
    return request.param(rng)


def kernel_args(name, m, u, theta, t, rng):
    """Arguments before ``t`` of kernel `name`: outputs prefilled with garbage (NaN for
    what is written, a ramp for pbar, which is added to), inputs random."""
    n, npar = m.n_states, m.n_params
    lam, v = rng.standard_normal(n), rng.standard_normal(n)
    ramp = np.arange(npar, dtype=np.float64)
    return {
        "rhs": (np.full(n, np.nan), u, theta),
        "jac": (np.full((n, n), np.nan), u, theta),
        "paramjac": (np.full((n, npar), np.nan), u, theta),
        "vjp": (np.full(n, np.nan), ramp, lam, u, theta),
        "hvp": (np.full(n, np.nan), ramp, lam, v, u, theta),
        "obs": (np.full(m.n_obs, np.nan), u, theta),
        "obs_vjp": (np.full(n, np.nan), ramp, rng.standard_normal(m.n_obs), u, theta),
    }[name]


def kernel_names(m):
    return [k for k in ("rhs", "jac", "paramjac", "vjp", "hvp", "obs", "obs_vjp")
            if m.has_kernel(k)]


def run_kernel(m, name, args, t, ws):
    """Call kernel `name` as the engine does; returns copies of the output arrays."""
    args = tuple(np.array(a, dtype=np.float64) for a in args)
    call(m.kernel_table(name), name, args, t, ws)
    return args[:2] if name in ("vjp", "hvp", "obs_vjp") else args[:1]


# ---------------------------------------------------------------- f and its derivatives


def test_rhs_matches_numpy_evaluation(case):
    m = case.model
    du = m.rhs(case.u, case.theta, case.t)
    np.testing.assert_allclose(du, zoo.evaluate(case), rtol=1e-12, atol=1e-12)


def test_jac_matches_finite_differences(case):
    m = case.model
    J = m.jac(case.u, case.theta, case.t)
    assert J.shape == (m.n_states, m.n_states)
    close(J, central_diff(lambda u: m.rhs(u, case.theta, case.t), case.u))


def test_paramjac_matches_finite_differences(case):
    m = case.model
    Jp = m.paramjac(case.u, case.theta, case.t)
    assert Jp.shape == (m.n_states, m.n_params)
    close(Jp, central_diff(lambda th: m.rhs(case.u, th, case.t), case.theta))


def test_vjp_matches_finite_differences(case, rng):
    m = case.model
    lam = rng.standard_normal(m.n_states)
    ubar, pbar = m.vjp(lam, case.u, case.theta, case.t)
    close(ubar, lam @ central_diff(lambda u: m.rhs(u, case.theta, case.t), case.u))
    close(pbar, lam @ central_diff(lambda th: m.rhs(case.u, th, case.t), case.theta))


def test_hvp_matches_finite_differences_of_the_jacobian(case, rng):
    # hvp = the gradient of lam^T (df/du) v over u and over p; J itself is checked above.
    m = case.model
    lam, v = rng.standard_normal(m.n_states), rng.standard_normal(m.n_states)
    ubar, pbar = m.hvp(lam, v, case.u, case.theta, case.t)
    assert ubar.shape == (m.n_states,) and pbar.shape == (m.n_params,)
    close(ubar, central_diff(lambda u: lam @ m.jac(u, case.theta, case.t) @ v, case.u))
    close(pbar, central_diff(lambda th: lam @ m.jac(case.u, th, case.t) @ v, case.theta))


def test_hvp_is_symmetric_in_its_state_part(case, rng):
    # d/du (lam^T J v) . w = lam^T f''[v, w]: symmetric in v and w (exact second derivatives).
    m = case.model
    lam, v, w = (rng.standard_normal(m.n_states) for _ in range(3))
    a = m.hvp(lam, v, case.u, case.theta, case.t)[0] @ w
    b = m.hvp(lam, w, case.u, case.theta, case.t)[0] @ v
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * (abs(a) + abs(b) + 1))


def test_jac_and_paramjac_are_the_vjp_rows(case):
    # Consistency between the forward- and reverse-mode kernels, to rounding.
    m = case.model
    J = m.jac(case.u, case.theta, case.t)
    Jp = m.paramjac(case.u, case.theta, case.t)
    for i in range(m.n_states):
        ubar, pbar = m.vjp(np.eye(m.n_states)[i], case.u, case.theta, case.t)
        np.testing.assert_allclose(J[i], ubar, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(Jp[i], pbar, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------- calling conventions, scratch


def test_vjp_and_hvp_write_ubar_and_add_into_pbar(case, rng):
    m = case.model
    lam, v = rng.standard_normal(m.n_states), rng.standard_normal(m.n_states)
    ramp = np.arange(m.n_params, dtype=np.float64)
    for name, helper, inputs in (("vjp", m.vjp, (lam,)), ("hvp", m.hvp, (lam, v))):
        ubar_ref, pbar_ref = helper(*inputs, case.u, case.theta, case.t)
        ubar, pbar = np.full(m.n_states, 123.0), ramp.copy()
        ws = np.full(m.workspace().shape, 7.0)
        call(m.kernel_table(name), name, (ubar, pbar, *inputs, case.u, case.theta), case.t, ws)
        np.testing.assert_array_equal(ubar, ubar_ref, err_msg=name)
        np.testing.assert_allclose(pbar, ramp + pbar_ref, rtol=1e-13, atol=1e-13, err_msg=name)


def test_kernels_do_not_depend_on_the_previous_content_of_ws(case, rng):
    m = case.model
    for name in kernel_names(m):
        args = kernel_args(name, m, case.u, case.theta, case.t, rng)
        clean = run_kernel(m, name, args, case.t, m.workspace())
        for fill in (np.nan, 1e300, -3.0):
            ws = np.full(m.workspace().shape, fill)
            got = run_kernel(m, name, args, case.t, ws)
            for a, b in zip(got, clean):
                np.testing.assert_array_equal(a, b, err_msg=f"{name}, ws filled with {fill}")
        # ...nor on what another kernel left there
        ws = m.workspace()
        for other in kernel_names(m):
            run_kernel(m, other, kernel_args(other, m, case.u, case.theta, case.t, rng),
                       case.t, ws)
        for a, b in zip(run_kernel(m, name, args, case.t, ws), clean):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} after the other kernels")
        assert not np.isnan(clean[0]).any(), name  # every entry of the output written


def test_kernel_table_constants(case):
    m = case.model
    table = m.kernel_table()
    assert table.dtype == np.int64 and table.shape == (calls.K_SIZE,)
    assert table[calls.K_WS] == m.ws_size
    assert m.workspace().shape == (max(m.ws_size, 1),) and not m.workspace().any()
    # t enters the piecewise model directly and the two-net model through a net input.
    assert table[calls.K_AUTONOMOUS] == (case.name not in ("piecewise", "two_nets"))
    m.rhs(case.u, case.theta, case.t)
    assert m.kernel_table()[calls.K_RHS] != 0  # compiled on first need, then kept
    assert m.kernel_table("jac")[calls.K_JAC] != 0


def test_helpers_convert_their_inputs_to_float64(rng):
    case = zoo.case_ude(rng)
    m = case.model
    du = m.rhs(list(case.u), case.theta.astype(np.float32), np.float32(case.t))
    ref = m.rhs(case.u, case.theta.astype(np.float32).astype(np.float64), case.t)
    assert du.dtype == np.float64
    np.testing.assert_array_equal(du, ref)


# ----------------------------------------------------------------------- observables


@pytest.mark.parametrize("make", zoo.OBSERVED, ids=_ids)
def test_observables_and_their_vjp(make, rng):
    case = make(rng)
    m = case.model
    assert m.obs_names == tuple(case.observables) and m.n_obs == len(case.observables)
    assert m.has_kernel("obs") and m.has_kernel("obs_vjp")
    y = m.observe(case.u, case.theta, case.t)
    np.testing.assert_allclose(y, zoo.evaluate_observables(case), rtol=1e-13, atol=1e-14)

    ybar = rng.standard_normal(m.n_obs)
    ubar, pbar = np.full(m.n_states, np.nan), np.ones(m.n_params)
    ws = np.full(m.workspace().shape, np.nan)
    call(m.kernel_table("obs_vjp"), "obs_vjp", (ubar, pbar, ybar, case.u, case.theta),
         case.t, ws)
    close(ubar, ybar @ central_diff(lambda v: m.observe(v, case.theta, case.t), case.u))
    close(pbar - 1.0, ybar @ central_diff(lambda th: m.observe(case.u, th, case.t),
                                          case.theta))


def test_an_unseeded_observable_that_is_nan_adds_nothing():
    # frac = x / (x + y) is 0/0 at the origin (Laske_PLOSComputBiol2019's F_rnp_nuc at
    # t = 0); with its cotangent zero, the vjp is that of the other observable alone
    # (a strong zero: 0 * NaN would make every forward sensitivity's gradient NaN)
    m = sm.Model(lambda u, p, t: [-p.k * u.x, p.k * u.x], ["x", "y"], ["k", "a"],
                 observables={"obs": lambda u, p: p.a * u.x,
                              "frac": lambda u, p: p.a * u.x / (u.x + u.y)})
    u, th = np.zeros(2), np.array([0.5, 2.0])
    assert np.isnan(m.observe(u, th)[1])
    ubar, pbar = np.full(2, np.nan), np.zeros(2)
    call(m.kernel_table("obs_vjp"), "obs_vjp", (ubar, pbar, np.array([1.0, 0.0]), u, th),
         0.0, m.workspace())
    np.testing.assert_array_equal(ubar, [2.0, 0.0])
    np.testing.assert_array_equal(pbar, [0.0, 0.0])
    u = np.array([1.0, 3.0])  # away from 0/0 the seeded derivatives are unchanged
    ybar = np.array([0.3, -0.7])
    call(m.kernel_table("obs_vjp"), "obs_vjp", (ubar, pbar, ybar, u, th), 0.0, m.workspace())
    close(ubar, ybar @ central_diff(lambda v: m.observe(v, th), u))
    close(pbar, ybar @ central_diff(lambda q: m.observe(u, q), th))


def test_observables_calling_a_net_do_not_change_f(rng):
    # The observables' net calls are their own: f's kernels and scratch are the UDE's.
    a, b = zoo.case_ude_observed(rng), zoo.case_ude(np.random.default_rng(0))
    np.testing.assert_array_equal(a.model.rhs(a.u, a.theta, a.t),
                                  b.model.rhs(a.u, a.theta, a.t))
    assert "def obs(" in a.model.source and "def obs(" not in b.model.source
    assert "call 0: forward" in a.model.source.split("def obs(")[1]


def test_model_without_observables_has_no_observable_kernels(rng):
    m = zoo.case_ude(rng).model
    assert m.n_obs == 0 and m.obs_names == ()
    assert not m.has_kernel("obs") and not m.has_kernel("obs_vjp")
    for name in ("obs", "obs_vjp"):
        with pytest.raises(ValueError, match="has no observables"):
            m.kernel_table(name)
    with pytest.raises(ValueError, match="has no observables"):
        m.observe(np.ones(2), np.ones(m.n_params))


# ------------------------------------------------------------------ piecewise terms


def _clip(u, p, t):
    return [np.clip(u.x, -0.3, 0.3), u.y]


def _where(u, p, t):
    return [np.where(u.x > u.y, np.sqrt(u.x * u.y), np.log(1.0 + u.x**2)), u.y]


@pytest.mark.parametrize("f, kernel", [(_clip, "rhs"), (_where, "jac")])
def test_minimal_piecewise_models_compile(f, kernel):
    # np.clip's nested Piecewise gives a repeated condition (a cse temporary) and an ITE
    # condition; np.where's condition recurs in df/du: both lower to LLVM.
    m = sm.Model(f, ["x", "y"], [])
    m.kernel_table(kernel)


# ------------------------------------------------- the Python rendering, as a reference


def _import_source(m, path):
    path.write_text(m.source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.heavy
@pytest.mark.parametrize("make", [zoo.case_two_nets], ids=_ids)
def test_python_source_agrees_with_the_machine_code(make, rng, tmp_path):
    # The two printers of the same syntax trees: numba's compile of the Python text and
    # the LLVM IR. Fast-math on both sides: equal to rounding, not bitwise.
    case = make(rng)
    m = case.model
    mod = _import_source(m, tmp_path / f"source_{case.name}.py")
    assert mod.WS_SIZE == m.ws_size
    for name in kernel_names(m):
        args = kernel_args(name, m, case.u, case.theta, case.t, rng)
        machine = run_kernel(m, name, args, case.t, m.workspace())
        # the kernels index their arrays flat (row-major): pass 1-D views
        args = tuple(np.array(a, dtype=np.float64).reshape(-1) for a in args)
        getattr(mod, name)(*args, case.t, m.workspace())
        for a, b in zip(args, machine):
            b = b.reshape(-1)
            close(a, b, rtol=1e-11, atol=1e-13, err_msg=name)
