"""Rodas5 on stiff problems against tight references, its orders, doses, stats, allocations.

Models are traced `sciml.Model`s (the Jacobian the method needs is the model's
own kernel), plus Robertson written as hand-made numba kernels
(`sciml.Model.from_kernels`, with and without a hand-written Jacobian). The
stiff references were computed once with scipy
``solve_ivp(method="Radau", rtol=1e-12, atol=1e-14)`` (Robertson: atol
1e-16, 1e-20, 1e-16 per state) and the analytical Jacobian; they are
tabulated here so that the tests do not spend seconds recomputing them.
"""

import dataclasses
import functools
import warnings

import numba
import numpy as np
import pytest

import sciml
from sciml.problem import Bolus, Infusion, ODEProblem
from sciml.solution import SolveWarning
from sciml.solve import solve
from sciml.solvers import common, tableaus
from sciml.solvers.kernels import ros
from sciml.solvers.kernels.calls import K_AUTONOMOUS
from sciml.solvers.kernels.structs import S_NACC
from sciml.solvers.rosenbrock import Rodas5

from ..alloc import own_allocations
from . import handmade as hm

VDP_T = np.linspace(0.0, 3000.0, 13)
VDP_REF = np.array([
    [2.0000000000000000e+00, 0.0000000000000000e+00],
    [1.8195982936829387e+00, -7.8738490481343047e-04],
    [1.5967689510525458e+00, -1.0303911878387965e-03],
    [1.2472030698118133e+00, -2.2450939446593591e-03],
    [-1.8636462548078774e+00, 7.5354308654376962e-04],
    [-1.6534208555237007e+00, 9.5363892600388819e-04],
    [-1.3547459194864842e+00, 1.6217887275963450e-03],
    [1.9058864183286792e+00, -7.2400992768931519e-04],
    [1.7061677321704243e+00, -8.9280970102399661e-04],
    [1.4387884459752875e+00, -1.3445177540886530e-03],
    [-1.9465395177967686e+00, 6.9793038916235461e-04],
    [-1.7557685641350294e+00, 8.4301539823080274e-04],
    [-1.5106069367439976e+00, 1.1783800007311384e-03]])

ROB_T = np.array([0.0, 1e-4, 1e-2, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5])
ROB_REF = np.array([
    [1.0000000000000000e+00, 0.0000000000000000e+00, 0.0000000000000000e+00],
    [9.9999600000801248e-01, 3.9840684637924003e-06, 1.5923523498349033e-08],
    [9.9960068268829294e-01, 3.6450478878442453e-05, 3.6286683282835629e-04],
    [9.6645973733299939e-01, 3.0746265785785545e-05, 3.3509516401214239e-02],
    [8.4136992384146481e-01, 1.6233909379905036e-05, 1.5861384224915537e-01],
    [6.1723488239609847e-01, 6.1535912746389078e-06, 3.8275896401262893e-01],
    [3.3687453066069328e-01, 2.0137023182612343e-06, 6.6312345563699049e-01],
    [1.0730042853780455e-01, 4.8001669725716817e-07, 8.9269909144549908e-01],
    [1.7865921142099873e-02, 7.2747514684364817e-08, 9.8213400611038626e-01]])
ROB_ATOL = np.array([1e-10, 1e-13, 1e-10])


def assert_close(actual, desired, rtol, atol):
    """``|actual - desired| <= atol + rtol |desired|`` elementwise, `atol` per state."""
    bad = np.abs(actual - desired) > atol + rtol * np.abs(desired)
    assert not bad.any(), f"mismatch at {np.argwhere(bad).tolist()}:\n{actual}\nvs\n{desired}"


def autonomous(model):
    """The flag the Rosenbrock loop reads (1: f does not depend on t, df/dt skipped)."""
    return int(model.kernel_table("rhs")[K_AUTONOMOUS])


@functools.cache
def vdp():
    """Van der Pol: x' = y, y' = mu (1 - x^2) y - x (MATLAB's vdp1000 form)."""
    def van_der_pol(u, p, t):
        x, y = u
        return [y, p.mu * (1.0 - x * x) * y - x]

    return sciml.Model(van_der_pol, ["x", "y"], ["mu"])


def vdp_jac(u, mu):
    x, y = u
    return np.array([[0.0, 1.0], [-2.0 * mu * x * y - 1.0, mu * (1.0 - x * x)]])


@functools.cache
def robertson():
    """Robertson's chemical kinetics; params (k1, k2, k3) = (0.04, 3e7, 1e4)."""
    def rober(u, p, t):
        y1, y2, y3 = u
        r1 = p.k1 * y1
        r2 = p.k2 * y2 * y2
        r3 = p.k3 * y2 * y3
        return [-r1 + r3, r1 - r2 - r3, r2]

    return sciml.Model(rober, ["y1", "y2", "y3"], ["k1", "k2", "k3"])


def robertson_jac(u, p):
    y1, y2, y3 = u
    k1, k2, k3 = p
    return np.array([[-k1, k3 * y3, k3 * y2],
                     [k1, -2.0 * k2 * y2 - k3 * y3, -k3 * y2],
                     [0.0, 2.0 * k2 * y2, 0.0]])


# Robertson as hand-written kernels (`Model.from_kernels`: module-level numba functions).

@numba.njit
def rob_rhs(du, u, p, t, ws):
    r1 = p[0] * u[0]
    r2 = p[1] * u[1] * u[1]
    r3 = p[2] * u[1] * u[2]
    du[0] = -r1 + r3
    du[1] = r1 - r2 - r3
    du[2] = r2


@numba.njit
def rob_jac(J, u, p, t, ws):
    J[0, 0] = -p[0]
    J[0, 1] = p[2] * u[2]
    J[0, 2] = p[2] * u[1]
    J[1, 0] = p[0]
    J[1, 1] = -2.0 * p[1] * u[1] - p[2] * u[2]
    J[1, 2] = -p[2] * u[1]
    J[2, 0] = 0.0
    J[2, 1] = 2.0 * p[1] * u[1]
    J[2, 2] = 0.0


@numba.njit
def rob_vjp(ubar, pbar, lam, u, p, t, ws):
    # ubar = lam^T df/du (written), pbar += lam^T df/dp
    ubar[0] = p[0] * (lam[1] - lam[0])
    ubar[1] = (p[2] * u[2] * lam[0] - (2.0 * p[1] * u[1] + p[2] * u[2]) * lam[1]
               + 2.0 * p[1] * u[1] * lam[2])
    ubar[2] = p[2] * u[1] * (lam[0] - lam[1])
    pbar[0] += u[0] * (lam[1] - lam[0])
    pbar[1] += u[1] * u[1] * (lam[2] - lam[1])
    pbar[2] += u[1] * u[2] * (lam[0] - lam[1])


@functools.cache
def robertson_hand(with_jac=True):
    return sciml.Model.from_kernels(rob_rhs, rob_vjp, ["y1", "y2", "y3"], ["k1", "k2", "k3"],
                                    jac_into=rob_jac if with_jac else None, autonomous=True,
                                    name="robertson_hand")


@functools.cache
def prothero_robinson():
    """u' = -lam (u - cos t) - sin t: stiff and non-autonomous, u = cos t from u(0) = 1."""
    def pr(u, p, t):
        return [-p.lam * (u[0] - np.cos(t)) - np.sin(t)]

    return sciml.Model(pr, ["u"], ["lam"])


@functools.cache
def pk(explicit_t=False):
    """One-compartment oral PK: depot' = -ka depot, central' = ka depot - ke central.

    With ``explicit_t`` the same ODE written with a harmless dependence on t (a term
    that is 0 for every t >= 0, which tracing cannot fold away): the model is then not
    autonomous, and the Rosenbrock loop adds df/dt by a difference in t.
    """
    def oral(u, p, t):
        zero = np.where(t < -1.0, 1.0, 0.0) if explicit_t else 0.0
        return [-p.ka * u.depot + zero, p.ka * u.depot - p.ke * u.central]

    return sciml.Model(oral, ["depot", "central"], ["ka", "ke"])


exact = hm.exact  # u1' = -2 t u1^2, u2' = u1 u2 (non-autonomous): closed form below
exact_solution = hm.exact_solution
blowup = hm.blowup  # u' = u^2 from u(0) = 1: 1/(1 - t) blows up at t = 1


def vdp_prob(tf=3000.0):
    return ODEProblem(vdp(), [2.0, 0.0], (0.0, tf), np.array([1000.0]))


def rob_prob():
    return ODEProblem(robertson(), [1.0, 0.0, 0.0], (0.0, 1e5), np.array([0.04, 3e7, 1e4]))


# ------------------------------------------------------------------ stiff problems


def test_van_der_pol_mu_1000():
    sol = solve(vdp_prob(), Rodas5(), rtol=1e-8, atol=1e-10, saveat=VDP_T)
    assert sol.success
    # The state crosses 4 fast jumps; errors are relative to |x| ~ 2, |y| ~ 1e-3.
    err = np.abs(sol.u - VDP_REF) / np.array([2.0, 2e-3])
    assert err.max() < 1e-5
    assert sol.stats["n_accepted"] < 3000  # stiff: no explicit-method step limit


def test_van_der_pol_dense_output():
    sol = solve(vdp_prob(), Rodas5(), rtol=1e-8, atol=1e-10, dense=True)
    assert sol.success
    err = np.abs(sol(VDP_T) - VDP_REF) / np.array([2.0, 2e-3])
    assert err.max() < 1e-5


def test_robertson():
    sol = solve(rob_prob(), Rodas5(), rtol=1e-7, atol=[1e-10, 1e-14, 1e-10], saveat=ROB_T)
    assert sol.success
    assert_close(sol.u, ROB_REF, rtol=1e-6, atol=ROB_ATOL)
    np.testing.assert_allclose(sol.u.sum(axis=1), 1.0, atol=1e-12)  # mass is conserved


def test_jacobians_are_the_analytical_ones(rng):
    # the Jacobian Rodas5 uses is the model's kernel, generated from the traced f
    for _ in range(3):
        u, mu = rng.normal(size=2), rng.uniform(1, 1e3)
        np.testing.assert_allclose(vdp().jac(u, [mu]), vdp_jac(u, mu), rtol=1e-14)
        u, k = rng.uniform(0, 1, 3), np.array([0.04, 3e7, 1e4]) * rng.uniform(0.5, 2, 3)
        np.testing.assert_allclose(robertson().jac(u, k), robertson_jac(u, k), rtol=1e-14)
        np.testing.assert_allclose(robertson_hand().jac(u, k), robertson_jac(u, k), rtol=1e-14)
        np.testing.assert_allclose(robertson_hand(False).jac(u, k), robertson_jac(u, k),
                                   rtol=1e-14)
        t = rng.uniform(0, 5)
        np.testing.assert_allclose(exact().jac(u[:2], np.zeros(0), t),
                                   [[-4 * t * u[0], 0.0], [u[1], u[0]]], rtol=1e-14)
        np.testing.assert_array_equal(prothero_robinson().jac(u[:1], [mu], t), [[-mu]])
        ka, ke = rng.uniform(0.1, 2, 2)
        for m in (pk(), pk(True)):
            np.testing.assert_array_equal(m.jac(u[:2], [ka, ke], t), [[-ka, 0.0], [ka, -ke]])
    # what the loop reads to skip df/dt
    assert [autonomous(m) for m in (vdp(), robertson(), robertson_hand(), pk(), blowup())] \
        == [1, 1, 1, 1, 1]
    assert [autonomous(m) for m in (exact(), prothero_robinson(), pk(True))] == [0, 0, 0]


def test_traced_model_matches_handwritten():
    kw = dict(rtol=1e-7, atol=[1e-10, 1e-14, 1e-10], saveat=ROB_T)
    traced = solve(rob_prob(), Rodas5(), **kw)
    hand = solve(ODEProblem(robertson_hand(), [1.0, 0.0, 0.0], (0.0, 1e5),
                            np.array([0.04, 3e7, 1e4])), Rodas5(), **kw)
    assert traced.success and hand.success
    np.testing.assert_allclose(traced.u, hand.u, rtol=1e-9, atol=1e-15)
    assert_close(traced.u, ROB_REF, rtol=1e-6, atol=ROB_ATOL)


def test_hand_kernels_without_jacobian():
    # `from_kernels` without `jac_into`: the Jacobian is built from the vjp, one reverse
    # pass per state, and is the same matrix, so the solve takes the same steps
    kw = dict(rtol=1e-7, atol=[1e-10, 1e-14, 1e-10], saveat=ROB_T)
    p = np.array([0.04, 3e7, 1e4])
    with_jac = solve(ODEProblem(robertson_hand(), [1.0, 0.0, 0.0], (0.0, 1e5), p), Rodas5(),
                     **kw)
    from_vjp = solve(ODEProblem(robertson_hand(False), [1.0, 0.0, 0.0], (0.0, 1e5), p),
                     Rodas5(), **kw)
    assert from_vjp.success and from_vjp.stats == with_jac.stats
    np.testing.assert_allclose(from_vjp.u, with_jac.u, rtol=1e-12, atol=1e-18)
    assert_close(from_vjp.u, ROB_REF, rtol=1e-6, atol=ROB_ATOL)


@pytest.mark.parametrize("lam", [1e2, 1e6])
def test_stiff_non_autonomous(lam):
    # Prothero-Robinson: the df/dt terms matter (without them the error is O(h)).
    prob = ODEProblem(prothero_robinson(), [1.0], (0.0, 10.0), np.array([lam]))
    sol = solve(prob, Rodas5(), rtol=1e-8, atol=1e-10)
    assert sol.success
    np.testing.assert_allclose(sol.u[:, 0], np.cos(sol.t), rtol=0, atol=1e-8)
    # The order-4 interpolant is not stiffly accurate: between the (long)
    # steps of the stiff case it is only as good as interpolating cos t.
    tq = np.linspace(0.0, 10.0, 201)
    np.testing.assert_allclose(sol(tq)[:, 0], np.cos(tq), rtol=0, atol=1e-4)


def reference_solve(f, jac, ft, u0, t0, tf, h, method):
    """Fixed-step Rosenbrock in the original form (Hairer & Wanner II, (7.4')), plain numpy.

    ``(I - h gamma J) K_i = h f(t + alpha_i h, u + sum_j alpha_ij K_j) + gamma_i h^2 f_t
    + h J sum_j gamma_ij K_j``, ``u_new = u + sum_i b_i K_i``, with (alpha, Gamma, b)
    recovered from the method's transformed coefficients (a `RosenbrockTableau`).
    """
    g = method.gamma
    s = method.n_stages

    def lower(rows):
        M = np.zeros((s, s))
        for i, r in enumerate(rows):
            M[i, :i] = r
        return M

    Gam = np.linalg.inv(np.eye(s) / g - lower(method.C))
    alpha = lower(method.a) @ Gam
    b = np.asarray(method.b) @ Gam
    u, t = np.array(u0, dtype=float), t0
    for _ in range(round((tf - t0) / h)):
        J, fT = jac(t, u), ft(t, u)
        M = np.eye(len(u)) - h * g * J
        K = np.zeros((s, len(u)))
        for i in range(s):
            rhs = h * f(t + alpha[i].sum() * h, u + alpha[i, :i] @ K[:i])
            rhs += Gam[i].sum() * h * h * fT + h * J @ (Gam[i, :i] @ K[:i])
            K[i] = np.linalg.solve(M, rhs)
        u, t = u + b @ K, t + h
    return u


def test_loop_matches_numpy_reference():
    def f(t, u):
        return np.array([-2 * t * u[0] ** 2, u[0] * u[1]])

    def jac(t, u):
        return np.array([[-4 * t * u[0], 0.0], [u[1], u[0]]])

    def ft(t, u):
        return np.array([-2 * u[0] ** 2, 0.0])

    solver = Rodas5(adaptive=False)
    prob = ODEProblem(exact(), [1.0, 1.0], (0.0, 1.5), np.zeros(0))
    for h in (0.5, 0.1):
        sol = solve(prob, solver, dt=h, saveat=[1.5], dense=False)
        ref = reference_solve(f, jac, ft, [1.0, 1.0], 0.0, 1.5, h, solver.tableau)
        # Agreement to the forward difference for df/dt, far below the method's error.
        np.testing.assert_allclose(sol.u[-1], ref, rtol=1e-9)
        assert np.abs(ref - exact_solution(1.5)).max() > 1e3 * np.abs(sol.u[-1] - ref).max()


# ------------------------------------------------------------------ orders


def slope(hs, errs):
    return np.polyfit(np.log(hs), np.log(errs), 1)[0]


def test_convergence_order_5():
    hs = np.array([0.25, 0.125, 0.0625, 0.03125])
    tf = 2.0
    errs = []
    for h in hs:
        prob = ODEProblem(exact(), [1.0, 1.0], (0.0, tf), np.zeros(0))
        sol = solve(prob, Rodas5(adaptive=False), dt=h, saveat=[tf], dense=False)
        assert sol.stats["n_accepted"] == round(tf / h)
        errs.append(np.abs(sol.u[-1] - exact_solution(tf)).max())
    assert 4.6 < slope(hs, errs) < 5.6, errs


def test_dense_output_order_4():
    hs = np.array([0.25, 0.125, 0.0625])
    tq = np.linspace(0.0, 2.0, 97)[1:-1]
    errs = []
    for h in hs:
        prob = ODEProblem(exact(), [1.0, 1.0], (0.0, 2.0), np.zeros(0))
        sol = solve(prob, Rodas5(adaptive=False), dt=h)
        errs.append(np.abs(sol(tq) - exact_solution(tq)).max())
    assert slope(hs, errs) > 3.8, errs


def test_dense_output_accuracy_adaptive():
    prob = ODEProblem(exact(), [1.0, 1.0], (0.0, 5.0), np.zeros(0))
    sol = solve(prob, Rodas5(), rtol=1e-8, atol=1e-8)
    tq = np.linspace(0.0, 5.0, 1001)
    assert np.abs(sol(tq) - exact_solution(tq)).max() < 1e-6
    # The interpolant reproduces the stored states at the step boundaries.
    np.testing.assert_allclose(sol(sol.t), sol.u, rtol=1e-13, atol=1e-15)


def test_saveat_by_interpolation_does_not_change_steps():
    prob = ODEProblem(exact(), [1.0, 1.0], (0.0, 5.0), np.zeros(0))
    few = solve(prob, Rodas5(), rtol=1e-6, atol=1e-6, saveat=[5.0], dense=False)
    many = solve(prob, Rodas5(), rtol=1e-6, atol=1e-6, saveat=np.linspace(0, 5, 501),
                 dense=False)
    assert few.stats == many.stats
    np.testing.assert_array_equal(few.u[-1], many.u[-1])


# ------------------------------------------------------------------ doses


KA, KE = 1.0, 0.2


def bateman(t, tau, D):
    s = np.maximum(t - tau, 0.0)
    on = t >= tau
    central = D * KA / (KA - KE) * (np.exp(-KE * s) - np.exp(-KA * s))
    return np.stack([D * np.exp(-KA * s) * on, central * on], axis=-1)


def central_infusion(t, start, duration, R):
    def step(a):
        s = np.maximum(t - a, 0.0)
        return R / KE * (1 - np.exp(-KE * s))
    return step(start) - step(start + duration)


@pytest.mark.parametrize("explicit_t", [False, True], ids=["autonomous", "explicit_t"])
def test_pk_repeated_bolus_and_infusion(explicit_t):
    # Written with a t-dependence, the model is not autonomous and the loop adds df/dt
    # by a difference in t: the infusion rates (constant between stops) must not leak
    # into it.
    model = pk(explicit_t)
    assert autonomous(model) == (not explicit_t)
    doses = [Bolus(0.0, 100.0, "depot", every=12.0, count=6),
             Infusion(30.0, 2.0, 25.0, "central"),
             Infusion(50.0, 1.5, 10.0, "central", every=24.0, count=2)]
    prob = ODEProblem(model, [0.0, 0.0], (0.0, 100.0), np.array([KA, KE]), doses=doses)
    t = np.arange(0.0, 100.0 + 1e-9, 0.5)  # includes every dose time
    sol = solve(prob, Rodas5(), rtol=1e-9, atol=1e-9, saveat=t)
    assert sol.success
    exact_u = sum(bateman(t, 12.0 * k, 100.0) for k in range(6))
    exact_u[:, 1] += central_infusion(t, 30.0, 2.0, 25.0)
    exact_u[:, 1] += central_infusion(t, 50.0, 1.5, 10.0) + central_infusion(t, 74.0, 1.5, 10.0)
    np.testing.assert_allclose(sol.u, exact_u, rtol=1e-6, atol=1e-6)
    per_step = 2 if explicit_t else 1  # f (and f at t + dt) at each accepted state
    st = sol.stats
    assert st["nfev"] - 7 * st["nlu"] - per_step * st["njac"] in range(1, 20)  # + h0 estimates
    if explicit_t:
        # The same ODE, so the difference quotient for df/dt is 0 (infusions included):
        # the same steps as the autonomous model's, one more f a step, and the same states
        # up to rounding (the two compiled right-hand sides differ by an ulp at times).
        ref = solve(ODEProblem(pk(), [0.0, 0.0], (0.0, 100.0), np.array([KA, KE]),
                               doses=doses), Rodas5(), rtol=1e-9, atol=1e-9, saveat=t)
        for key in ("n_accepted", "n_rejected", "njac", "nlu"):
            assert st[key] == ref.stats[key]
        assert st["nfev"] == ref.stats["nfev"] + st["njac"]
        np.testing.assert_allclose(sol.u, ref.u, rtol=1e-11, atol=1e-11)


def test_bolus_right_continuous_in_saveat_and_dense():
    prob = ODEProblem(pk(), [0.0, 0.0], (0.0, 30.0), np.array([KA, KE]),
                      doses=[Bolus(0.0, 100.0, "depot"), Bolus(10.0, 50.0, "depot")])
    sol = solve(prob, Rodas5(), rtol=1e-9, atol=1e-9, saveat=[10.0], dense=True)
    post = bateman(10.0, 0.0, 100.0) + bateman(10.0, 10.0, 50.0)
    np.testing.assert_allclose(sol.u[0], post, rtol=1e-7)
    np.testing.assert_allclose(sol(10.0), post, rtol=1e-7)
    np.testing.assert_allclose(sol(10.0 - 1e-9), bateman(10.0, 0.0, 100.0), rtol=1e-7)
    # The first bolus is applied before the first step and saved at t0.
    np.testing.assert_allclose(sol(0.0), [100.0, 0.0])


# ------------------------------------------------------------------ stats, storage, allocations


def test_stats_account_for_every_call():
    sol = solve(vdp_prob(300.0), Rodas5(), rtol=1e-6, atol=1e-6, saveat=[300.0], dense=False)
    st = sol.stats
    assert st["n_accepted"] > 10 and st["n_rejected"] >= 0
    assert st["nlu"] == st["n_accepted"] + st["n_rejected"]  # one LU per attempt
    assert st["njac"] == st["n_accepted"]  # J once per accepted state, reused on retries
    # Autonomous: f at each accepted state, 7 more stages per attempt, 1 for h0.
    assert st["nfev"] == st["njac"] + 7 * st["nlu"] + 1

    prob = ODEProblem(exact(), [1.0, 1.0], (0.0, 5.0), np.zeros(0))
    st = solve(prob, Rodas5(), rtol=1e-6, atol=1e-6, saveat=[5.0], dense=False).stats
    assert st["nfev"] == 2 * st["njac"] + 7 * st["nlu"] + 1  # + df/dt difference per state


@pytest.mark.parametrize("saveat", [None, np.linspace(0.0, 3000.0, 7)])
def test_storage_grows_inside_the_one_solve(monkeypatch, saveat):
    kw = dict(rtol=1e-6, atol=1e-6, dense=True, saveat=saveat)
    ref = solve(vdp_prob(), Rodas5(), **kw)
    assert ref.stats["n_accepted"] > 100
    monkeypatch.setattr(common, "capacity", lambda *a, **k: 3)
    solver = Rodas5()
    loop, runs = solver._loop(), []
    solver._loop = lambda: lambda *args: runs.append(args[-1]) or loop(*args)
    small = solve(vdp_prob(), solver, **kw)
    # room for 3 steps, grown six times or more as the loop went on: one run of the loop
    assert len(runs) == 1 and runs[0].d_k.shape[0] == 3
    assert small._dense.rec.d_k.shape[0] >= small.stats["n_accepted"]
    np.testing.assert_array_equal(small.t, ref.t)
    np.testing.assert_array_equal(small.u, ref.u)
    assert small.stats == ref.stats
    tq = np.linspace(0.0, 3000.0, 301)
    np.testing.assert_array_equal(small(tq), ref(tq))


def test_a_gradient_through_grown_storage_is_the_one_with_room(monkeypatch):
    # the discrete adjoint's forward pass stores every step (stages too) and saves at the
    # observations: the grown record must hold all of it, the arrays it keeps included
    # (a record that kept its first arrays borrowed gave garbage once they were freed)
    import gc

    import adjoints

    t = np.linspace(10.0, 3000.0, 40)
    data = sciml.Data(t, np.ones((t.size, 2)))
    kw = dict(solver=Rodas5(), sensealg=adjoints.DiscreteAdjoint(), rtol=1e-6, atol=1e-6)
    ref = sciml.loss_and_grad(vdp_prob(), data, **kw)
    monkeypatch.setattr(common, "capacity", lambda *a, **k: 3)
    small = sciml.loss_and_grad(vdp_prob(), data, **kw)
    gc.collect()
    junk = [np.full(64, 7.0) for _ in range(1000)]  # memory freed too early is reused
    np.testing.assert_array_equal(small[1], ref[1])
    assert small[0] == ref[0] and len(junk) == 1000


# One call of the compiled loop from Python allocates one NRT MemInfo per array in its
# arguments (unboxing, freed on return) plus its own scratch: a fixed number, whatever
# the steps, doses and save times (Python-side numpy buffers are not NRT allocations).
# tests/sciml/test_erk_solve.py checks that this measurement sees a planted per-step
# allocation inside a loop.




def captured_loop(solver, prob, **kw):
    """``sciml.solve`` with the solver's loop spied on: ``(loop, args of its last call
    with the initial state)``, the structures exactly as `Solver._run` builds them."""
    loop = solver._loop()
    seen = []

    def spy(sys, tab, ctl, stops, z, rec):
        seen.append((sys, tab, ctl, stops, z.copy(), rec))
        return loop(sys, tab, ctl, stops, z, rec)

    solver._loop = lambda: spy
    solve(prob, solver, **kw)
    return loop, seen[-1]


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_loop_allocations_do_not_grow(nrt_stats, monkeypatch):
    # `ros_integrate` as `sciml.solve` calls it, on a dosed problem (boluses and
    # infusions), over 1x and 4x the span (4x the steps and doses), with 31 and 301
    # save times, and saving every step with dense storage (room for every step from the
    # start: storage grown on the way is `test_storage_grows_inside_the_one_solve`'s)
    monkeypatch.setattr(common, "capacity", lambda *a, **k: 4096)
    counts = {}
    for tf in (50.0, 200.0):
        doses = [Bolus(1.0, 5.0, "depot", every=10.0, count=int(tf) // 10),
                 Infusion(3.0, 2.0, 1.0, "central", every=10.0, count=int(tf) // 10)]
        prob = ODEProblem(pk(), [0.0, 0.0], (0.0, tf), np.array([KA, KE]), doses=doses)
        runs = [("saveat", ns, dict(saveat=np.linspace(0, tf, ns), dense=False))
                for ns in (31, 301)] + [("every", 0, dict(dense=True))]
        for kind, ns, kw in runs:
            loop, (sys, tab, ctl, stops, z0, rec) = captured_loop(Rodas5(), prob, rtol=1e-8,
                                                                  atol=1e-8, **kw)
            assert loop is ros.ros_integrate
            own, (status, _, _) = own_allocations(loop, (sys, tab, ctl, stops, z0.copy(), rec))
            assert status == 0
            counts[tf, kind, ns] = (own, int(rec.stats[S_NACC]))
    assert counts[200.0, "saveat", 31][1] > 3 * counts[50.0, "saveat", 31][1]
    own = {key: a for key, (a, _) in counts.items()}
    assert len(set(own.values())) == 1, counts
    assert own[50.0, "saveat", 31] <= 2  # its scratch, allocated once a call


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_dense_eval_allocations_do_not_grow(nrt_stats):
    sol = solve(vdp_prob(), Rodas5(), rtol=1e-6, atol=1e-6, dense=True)
    rec, n_steps = sol._dense.rec, sol._dense.n_steps
    assert n_steps > 100
    counts = []
    for q in (100, 1000):
        tq = np.linspace(0.0, 3000.0, q)
        out = np.zeros((q, 2))
        own, _ = own_allocations(ros.ros_store_eval, (rec, n_steps, tq, out, rec.d_k.shape[1] - 1))
        np.testing.assert_array_equal(out, sol(tq))
        counts.append(own)
    assert counts == [0, 0]


# ------------------------------------------------------------------ failures and errors


def test_max_steps_warns_and_returns_partial():
    with pytest.warns(SolveWarning, match="max"):
        sol = solve(vdp_prob(), Rodas5(), rtol=1e-6, atol=1e-6, saveat=VDP_T, max_steps=50)
    assert sol.status == "max_steps" and sol.stats["n_accepted"] + sol.stats["n_rejected"] == 50
    assert 0.0 < sol.t_end < 3000.0 and len(sol.t) == np.sum(VDP_T <= sol.t_end)


def test_blowup_stops_with_a_status():
    prob = ODEProblem(blowup(), [1.0], (0.0, 2.0), np.zeros(0))
    with pytest.warns(SolveWarning):
        sol = solve(prob, Rodas5(), rtol=1e-6, atol=1e-6)
    assert sol.status in ("dt_underflow", "nonfinite")
    assert 0.99 < sol.t_end <= 1.0


def test_fixed_step_needs_dt():
    prob = ODEProblem(exact(), [1.0, 1.0], (0.0, 1.0), np.zeros(0))
    with pytest.raises(ValueError, match="`dt` is required"):
        solve(prob, Rodas5(adaptive=False))


@pytest.mark.parametrize("kw, err, match", [
    ({"adaptive": "yes"}, TypeError, "adaptive"),
    ({"safety": 0.0}, ValueError, "safety"),
    ({"safety": 1.5}, ValueError, "safety"),
    ({"qmin": 2.0}, ValueError, "qmin"),
    ({"qmax": 1.0}, ValueError, "qmax"),
    ({"beta2": 0.5}, ValueError, "beta2"),
])
def test_bad_settings(kw, err, match):
    with pytest.raises(err, match=match):
        Rodas5(**kw)


def test_tableau_is_checked():
    R = tableaus.RODAS5
    assert Rodas5.tableau is R and Rodas5().engine_tableau() is R.engine()
    assert (R.order, R.embedded_order, R.dense_order, R.n_stages, R.n_dense) == (5, 4, 4, 8, 3)

    C = list(R.C)
    C[4] = (R.C[4][0] * (1 + 1e-6), *R.C[4][1:])
    with pytest.raises(ValueError, match="RosenbrockTableau: inconsistent method coefficients"):
        dataclasses.replace(R, C=tuple(C))
    b = list(R.b)
    b[0] += 1e-6
    with pytest.raises(ValueError, match="solution fails an order-1 condition"):
        dataclasses.replace(R, b=tuple(b))
    with pytest.raises(ValueError, match="embedded fails an order-5 condition"):
        dataclasses.replace(R, embedded_order=5)  # the embedded solution is of order 4
    with pytest.raises(ValueError, match="dense output fails an order-4 condition"):
        dataclasses.replace(R, H=R.H[:2])  # the 2-vector interpolant is only of order 3
    with pytest.raises(ValueError, match="rows of length"):
        dataclasses.replace(R, a=R.a[:-1])
    with pytest.raises(ValueError, match="`d`, `b`, `b_embedded` need 8 entries"):
        dataclasses.replace(R, d=R.d[:-1])
    # the coefficients as given pass (a rebuilt copy is accepted)
    assert dataclasses.replace(R).engine().gamma == R.gamma


def test_interpolate_rejects_times_outside():
    sol = solve(vdp_prob(10.0), Rodas5(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="solved interval"):
        sol(11.0)
    with pytest.raises(ValueError, match="solved interval"):
        sol(-1.0)


def test_solution_repr_and_warning_free_success():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = solve(vdp_prob(10.0), Rodas5(), rtol=1e-6, atol=1e-6)
    assert sol.success and "Rodas5()" in repr(sol)
    assert repr(Rodas5(adaptive=False)) == "Rodas5(adaptive=False)"


def test_list_of_problems_in_threads():
    probs = [ODEProblem(vdp(), [2.0, 0.0], (0.0, 300.0), np.array([mu]))
             for mu in (10.0, 100.0, 1000.0)]
    kw = dict(rtol=1e-6, atol=1e-6, saveat=np.linspace(0.0, 300.0, 7))
    many = solve(probs, Rodas5(), threads=2, **kw)
    for p, sol in zip(probs, many):
        one = solve(p, Rodas5(), **kw)
        np.testing.assert_array_equal(sol.u, one.u)
        assert sol.stats == one.stats
