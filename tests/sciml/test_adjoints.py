"""Gradients from every sensitivity method against finite differences and against each other.

Three models: the spiral neural ODE, the Lotka-Volterra UDE, and a PK model
observed through an observable with a repeated bolus, a second bolus into
another state and an infusion. The reference is a central difference of the
loss with solves at rtol = atol = 1e-12; the methods run at 1e-10.
"""

from types import SimpleNamespace

import numpy as np
import pytest

import adjoints
import sciml

from ..alloc import needs_jit, own_allocations
from ..methods import METHODS
from . import model_zoo as mz


def _spiral():
    case = mz.case_spiral(np.random.default_rng(3))
    t = np.linspace(0.0, 1.5, 12)
    prob = sciml.ODEProblem(case.model, [2.0, 0.0], (0.0, 1.5), case.theta)
    y = sciml.solve(prob, rtol=1e-10, atol=1e-10, saveat=t).u
    return prob, sciml.Data(t, 0.9 * y + 0.05)


def _ude():
    case = mz.case_ude(np.random.default_rng(4))
    t = np.linspace(0.0, 3.0, 31)
    prob = sciml.ODEProblem(case.model, [0.44249296, 4.6280594], (0.0, 3.0), case.theta)
    y = sciml.solve(prob, rtol=1e-10, atol=1e-10, saveat=t).u
    y[::3, 1] = np.nan  # missing values: masked out
    return prob, sciml.Data(t, 1.1 * y)


def _pk(infusion=True):
    case = mz.case_pk(np.random.default_rng(5))
    doses = [sciml.Bolus(0.0, 200.0, "depot", every=6.0, count=3),
             sciml.Bolus(7.5, 50.0, "central")]
    if infusion:
        doses.insert(1, sciml.Infusion(start=3.0, duration=2.0, rate=40.0, state="central"))
    prob = sciml.ODEProblem(case.model, [0.0, 0.0, 0.0], (0.0, 16.0), case.theta, doses=doses)
    t = np.array([0.5, 1, 2, 3, 4, 5, 6, 7, 7.5, 9, 12, 15, 16.0])  # 6, 7.5: dose times
    conc = sciml.solve(prob, rtol=1e-10, atol=1e-10, saveat=t).observables["conc"]
    return prob, sciml.Data(t, 1.1 * conc + 0.1, observables=["conc"])


CASES = {"spiral": _spiral, "ude": _ude, "pk": _pk, "pk_bolus": lambda: _pk(infusion=False)}

# An infusion makes the forward system a type of its own (`Infused`), for which every loop
# is compiled again (20-40 s each, cold, and make test is at CI's limit). The infusion case
# runs the discrete adjoint (the forward steps themselves) and forward sensitivities (the
# default for PK models); the other methods, and the other PK tests below, see boluses only.
INFUSED = ("discrete", "forward")
PAIRS = [(c, m) for c in ("spiral", "ude") for m in METHODS] + [
    ("pk" if m in INFUSED else "pk_bolus", m) for m in METHODS]


def _methods(name):
    return {k: m for k, m in METHODS.items()
            if name not in ("pk", "pk_bolus") or (k in INFUSED) == (name == "pk")}


def _fd(prob, data, idx, loss=None):
    theta = prob.params
    out = []
    for i in idx:
        h = 1e-6 * max(abs(theta[i]), 1e-2)
        e = np.zeros_like(theta)
        e[i] = h
        f = [sciml.loss_value(prob, data, loss=loss, params=theta + s * e, rtol=1e-12,
                              atol=1e-12) for s in (1, -1)]
        out.append((f[0] - f[1]) / (2 * h))
    return np.array(out)


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    prob, data = CASES[request.param]()
    n = prob.model.n_params
    idx = np.unique(np.linspace(0, n - 1, min(n, 6)).astype(int))
    return request.param, prob, data, idx, _fd(prob, data, idx)


@pytest.mark.parametrize("case, method", PAIRS, indirect=["case"])
def test_gradient_matches_finite_differences(case, method):
    name, prob, data, idx, fd = case
    value, grad = sciml.loss_and_grad(prob, data, sensealg=METHODS[method], rtol=1e-10,
                                      atol=1e-10)
    # (forward sensitivities take their own steps: the value agrees to the tolerance)
    assert value == pytest.approx(sciml.loss_value(prob, data, rtol=1e-10, atol=1e-10),
                                  rel=1e-12 if method != "forward" else 1e-8)
    assert grad.shape == (prob.model.n_params,)
    scale = np.max(np.abs(fd))
    np.testing.assert_allclose(grad[idx], fd, rtol=2e-5, atol=2e-5 * scale)


def test_methods_agree_on_every_parameter(case):
    name, prob, data, idx, fd = case
    grads = {k: sciml.loss_and_grad(prob, data, sensealg=m, rtol=1e-10, atol=1e-10)[1]
             for k, m in _methods(name).items()}
    ref = grads["interp" if "interp" in grads else "forward"]
    for k, g in grads.items():
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-6 * np.max(np.abs(ref)),
                                   err_msg=k)


def test_backsolve_without_checkpoints_drifts_but_converges():
    prob, data = _pk(infusion=False)
    ref = sciml.loss_and_grad(prob, data, sensealg=METHODS["interp"], rtol=1e-10,
                              atol=1e-10)[1]
    g = sciml.loss_and_grad(prob, data, sensealg=adjoints.BacksolveAdjoint(checkpointing=False),
                            rtol=1e-10, atol=1e-10)[1]
    np.testing.assert_allclose(g, ref, rtol=1e-3)


@pytest.mark.parametrize("cls", [adjoints.InterpolatingAdjoint, adjoints.BacksolveAdjoint])
def test_mu_in_the_backward_error_norm_on_request(cls):
    # The default norm leaves mu out (adjoints.continuous); error_on_params=True puts it
    # back, on the lean path and the general one alike.
    prob, data = _ude()
    ref = sciml.loss_and_grad(prob, data, sensealg=METHODS["gauss"], rtol=1e-10, atol=1e-10)[1]
    method = cls(error_on_params=True)
    assert "error_on_params=True" in repr(method)
    for kw in ({}, dict(threads=1)):
        g = sciml.loss_and_grad(prob, data, sensealg=method, rtol=1e-10, atol=1e-10, **kw)[1]
        np.testing.assert_allclose(g, ref, rtol=1e-6, atol=1e-8 * np.max(np.abs(ref)))


def test_discrete_adjoint_is_exact_for_the_fixed_step_solution():
    # RK4 at a fixed step: the discrete adjoint is the derivative of exactly what the solver
    # computes, so it matches finite differences of the same fixed-step solution to rounding.
    prob, data = _spiral()
    kw = dict(solver=sciml.RK4(adaptive=False), dt=0.05)
    _, g = sciml.loss_and_grad(prob, data, sensealg=adjoints.DiscreteAdjoint(), **kw)
    theta = prob.params
    for i in (0, 77, 250):
        e = np.zeros_like(theta)
        e[i] = 1e-6
        fd = (sciml.loss_value(prob, data, params=theta + e, **kw)
              - sciml.loss_value(prob, data, params=theta - e, **kw)) / 2e-6
        assert g[i] == pytest.approx(fd, rel=1e-7, abs=3e-9)  # (fd: 1e-15 noise / 2e-6)


def test_gaussian_nll_fits_sigma_too():
    model = mz.sm.Model(lambda u, p, t: [-p.k * u[0]], ["x"], ["k", "sigma"])
    prob = sciml.ODEProblem(model, [2.0], (0.0, 3.0), [0.7, 0.3])
    t = np.linspace(0.2, 3.0, 8)
    data = sciml.Data(t, 2.0 * np.exp(-0.6 * t) + 0.05 * np.sin(7 * t))
    for loss in (sciml.GaussianNLL("sigma"), sciml.GaussianNLL("sigma", log=True)):
        v, g = sciml.loss_and_grad(prob, data, loss=loss, rtol=1e-10, atol=1e-10)
        fd = _fd(prob, data, [0, 1], loss=loss)
        np.testing.assert_allclose(g, fd, rtol=1e-5)
    sig = 0.3
    r = sciml.solve(prob, rtol=1e-12, atol=1e-12, saveat=t).u[:, 0] - data.y[:, 0]
    expect = np.sum(0.5 * (r / sig) ** 2 + np.log(sig) + 0.5 * np.log(2 * np.pi))
    assert sciml.loss_value(prob, data, loss=sciml.GaussianNLL("sigma"), rtol=1e-12,
                            atol=1e-12) == pytest.approx(expect, rel=1e-9)


def test_missing_values_are_masked():
    prob, data = _ude()
    keep = np.isfinite(data.y[:, 1])
    t2 = sciml.Data(data.t[keep], data.y[keep])
    v1, g1 = sciml.loss_and_grad(prob, data, rtol=1e-10, atol=1e-10)
    v2, g2 = sciml.loss_and_grad(prob, t2, rtol=1e-10, atol=1e-10)
    v3, g3 = sciml.loss_and_grad(prob, sciml.Data(data.t, data.y[:, 0], states=["x"]),
                                 rtol=1e-10, atol=1e-10)
    assert v1 > max(v2, v3) > 0  # fewer observed values, smaller loss
    fd = _fd(prob, data, [0, 1])
    np.testing.assert_allclose(g1[:2], fd, rtol=1e-5)


def test_many_problems_sum_in_a_fixed_order():
    prob, data = _pk(infusion=False)
    probs = [prob.remake(u0=[0.0, 10.0 * i, 0.0]) for i in range(5)]
    datas = [data] * 5
    v, g = sciml.loss_and_grad(probs, datas, sensealg=adjoints.GaussAdjoint(), threads=2)
    v1, g1 = sciml.loss_and_grad(probs, datas, sensealg=adjoints.GaussAdjoint(), threads=1)
    assert v == v1
    np.testing.assert_array_equal(g, g1)
    each = [sciml.loss_and_grad(p, data, sensealg=adjoints.GaussAdjoint()) for p in probs]
    assert v == pytest.approx(sum(e[0] for e in each), rel=1e-14)
    np.testing.assert_allclose(g, sum(e[1] for e in each), rtol=1e-13)
    vs, gs = sciml.loss_and_grad(probs, datas, sensealg=adjoints.GaussAdjoint(),
                                 per_problem=True)
    assert vs.shape == (5,) and gs.shape == (5, prob.model.n_params)
    np.testing.assert_array_equal(vs, [e[0] for e in each])
    np.testing.assert_array_equal(gs, np.stack([e[1] for e in each]))


def test_shared_params_override():
    prob, data = _spiral()
    theta = prob.params * 0.9
    v, g = sciml.loss_and_grad(prob, data, params=theta)
    v2, g2 = sciml.loss_and_grad(prob.remake(params=theta), data)
    assert v == v2
    np.testing.assert_array_equal(g, g2)


def test_default_method_follows_the_rule():
    prob, data = _pk()
    assert isinstance(adjoints.default_sensealg(prob.model), adjoints.ForwardSensitivity)
    # a small stiff model: Rodas5's own steps reversed, whatever its parameters
    assert isinstance(adjoints.default_sensealg(prob.model, sciml.Rodas5()),
                      adjoints.DiscreteAdjoint)
    sp, _ = _spiral()
    assert isinstance(adjoints.default_sensealg(sp.model), adjoints.DiscreteAdjoint)
    assert isinstance(adjoints.default_sensealg(sp.model, sciml.Rodas5()),
                      adjoints.DiscreteAdjoint)
    # BDF's steps are not reversed: forward sensitivities, or an adjoint past 16 parameters
    assert isinstance(adjoints.default_sensealg(prob.model, sciml.BDF()),
                      adjoints.ForwardSensitivity)
    assert isinstance(adjoints.default_sensealg(sp.model, sciml.BDF()),
                      adjoints.InterpolatingAdjoint)
    big = SimpleNamespace(n_states=80, n_params=1000)  # the rule reads only the sizes
    assert isinstance(adjoints.default_sensealg(big), adjoints.GaussAdjoint)
    # a large stiff system with few parameters: an adjoint, not n x n_params sensitivities
    large = SimpleNamespace(n_states=300, n_params=3, has_kernel=lambda k: True)
    assert isinstance(adjoints.default_sensealg(large, sciml.Rodas5()), adjoints.GaussAdjoint)
    assert isinstance(adjoints.default_sensealg(large, sciml.BDF()),
                      adjoints.InterpolatingAdjoint)
    small = SimpleNamespace(n_states=3, n_params=3, has_kernel=lambda k: True)
    assert isinstance(adjoints.default_sensealg(small, sciml.BDF()), adjoints.ForwardSensitivity)


def test_a_failed_solve_gives_an_infinite_loss_and_a_warning():
    prob, data = _spiral()
    with pytest.warns(sciml.SolveWarning, match="problem 0"):
        v, g = sciml.loss_and_grad(prob, data, max_steps=3)
    assert v == np.inf and np.all(np.isnan(g))
    # the loss alone says why too (a PEtab llh of -inf at tight tolerances was silent)
    with pytest.warns(sciml.SolveWarning, match=r"loss_value: problem 0: the forward solve "
                      r"stopped at t = .*maximum number of steps"):
        assert sciml.loss_value(prob, data, max_steps=3) == np.inf


# ---------------------------------------------------------------- bad input


def test_bad_input_gets_clear_errors():
    prob, data = _spiral()
    with pytest.raises(ValueError, match="outside the problem's tspan"):
        sciml.loss_and_grad(prob, sciml.Data([0.5, 2.0], np.ones((2, 2))))
    with pytest.raises(ValueError, match="strictly increasing.*duplicated"):
        sciml.Data([0.5, 0.5], np.ones((2, 2)))
    with pytest.raises(ValueError, match="strictly increasing.*not increasing"):
        sciml.Data([0.5, 0.2], np.ones((2, 2)))
    with pytest.raises(ValueError, match="every value of `y` is NaN"):
        sciml.Data([0.5], [[np.nan, np.nan]])
    with pytest.raises(ValueError, match="`params` must have length 252"):
        sciml.loss_and_grad(prob, data, params=np.zeros(3))
    with pytest.raises(ValueError, match="GaussAdjoint needs an adaptive solver"):
        sciml.loss_and_grad(prob, data, solver=sciml.RK4(), dt=0.1,
                            sensealg=adjoints.GaussAdjoint())
    with pytest.raises(ValueError, match="needs `dt`"):
        sciml.loss_and_grad(prob, data, solver=sciml.RK4(), sensealg=adjoints.DiscreteAdjoint())
    with pytest.raises(TypeError, match="`sensealg` must be an adjoints method"):
        sciml.loss_and_grad(prob, data, sensealg="gauss")
    with pytest.raises(ValueError, match="2 problem\\(s\\) but 1 Data"):
        sciml.loss_and_grad([prob, prob], [data])
    with pytest.raises(ValueError, match="unknown states"):
        sciml.loss_and_grad(prob, sciml.Data(data.t, data.y[:, 0], states=["zz"]))
    with pytest.raises(ValueError, match="not a mechanistic parameter"):
        sciml.loss_and_grad(prob, data, loss=sciml.GaussianNLL("sigma"))


# ---------------------------------------------------------------- allocation


class _Capture:
    """Wraps a compiled function for one test: keeps the arguments of its last call."""

    def __init__(self, fn):
        self.fn, self.args = fn, None

    def __call__(self, *args):
        self.args = args
        return self.fn(*args)


def _loop_allocations(fn, args):
    """NRT allocations of one call of the compiled loop ``fn`` (after a first, compiling one),
    beyond the one per array argument that calling from Python costs (unboxing)."""
    fn(*_fresh(args))
    return own_allocations(fn, _fresh(args))[0]


def _fresh(args):
    # the loops write their state and accumulators in place: run each time from copies
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)


@needs_jit
@pytest.mark.parametrize("solver", ["Tsit5", "Rodas5"])
@pytest.mark.parametrize("method", ["discrete", "interp", "backsolve", "gauss", "quad",
                                    "forward"])
def test_sensitivity_loops_do_not_allocate_per_step(method, solver, nrt_stats, monkeypatch):
    # The backward (or forward-sensitivity) loop of each method, captured from a gradient
    # call, allocates its scratch once per call: as much for 4x the steps, doses and
    # observations as for 1x. (Boluses only: the loops the gradient tests compile.)
    import adjoints.continuous as ac
    import adjoints.discrete as ad
    import adjoints.forward as af

    prob, data = _pk()
    slv = {"Tsit5": sciml.Tsit5(), "Rodas5": sciml.Rodas5()}[solver]
    counts = []
    for days in (1, 4):
        p = prob.remake(tspan=(0.0, 16.0 * days),
                        doses=[sciml.Bolus(0.0, 200.0, "depot", every=6.0, count=3 * days),
                               sciml.Bolus(7.5, 50.0, "central", every=16.0, count=days)])
        t = np.linspace(0.5, 16.0 * days, 10 * days)
        d = sciml.Data(t, np.ones(t.shape[0]), observables=["conc"])
        loop = _Capture(slv._loop())
        monkeypatch.setattr(type(slv), "_loop", lambda self, loop=loop: loop)
        if method == "discrete":
            rev = "ros_reverse" if slv.stiff else "erk_reverse"
            loop = _Capture(getattr(ad, rev))
            monkeypatch.setattr(ad, rev, loop)
        sciml.loss_and_grad(p, d, solver=slv, sensealg=METHODS[method], rtol=1e-8, atol=1e-8)
        monkeypatch.undo()
        counts.append(_loop_allocations(loop.fn, loop.args))
    assert counts[0] == counts[1] <= 3, counts
    del ac, af


@pytest.mark.parametrize("method", ["discrete", "interp", "interp_ckpt", "gauss"])
def test_lean_path_agrees_with_the_general_one(method):
    # One plain problem with SSE on states takes one compiled call (`adjoints.kernels.
    # backward`); threads=1 forces the general path, which must give the same numbers.
    prob, data = _spiral()
    sensealg = METHODS[method]
    for kw in ({}, dict(solver=sciml.RK4(), dt=0.05)) if method == "discrete" else ({},):
        lean = sciml.loss_and_grad(prob, data, sensealg=sensealg, **kw)
        general = sciml.loss_and_grad(prob, data, sensealg=sensealg, threads=1, **kw)
        assert lean[0] == pytest.approx(general[0], rel=1e-13)
        np.testing.assert_array_equal(lean[1], general[1])


def test_the_method_object_chooses_its_one_call_entry():
    # loss_and_grad asks the method (`lean`) and knows none by name: a method of one's own
    # that wraps another's entry is called; one without an entry runs the general path.
    prob, data = _spiral()
    calls = []

    class Counted(adjoints.GaussAdjoint):
        def lean(self, solver, model):
            entry = super().lean(solver, model)

            def run(*args):
                calls.append(1)
                return entry(*args)
            return run

    class General(adjoints.GaussAdjoint):
        def lean(self, solver, model):
            return None

    a = sciml.loss_and_grad(prob, data, sensealg=Counted())
    assert calls == [1]
    b = sciml.loss_and_grad(prob, data, sensealg=General())
    assert calls == [1]
    assert a[0] == pytest.approx(b[0], rel=1e-13)
    np.testing.assert_array_equal(a[1], b[1])
    for name in ("backsolve", "quad", "forward"):  # no one-call entry (yet)
        assert METHODS[name].lean(sciml.Tsit5(), prob.model) is None


# ---------------------------------------------------------------- model features


def _growth(u, p, t, nets):
    return [p.k * u[0] * (1.0 - u[0] / p.K) + 0.1 * nets.G([u[0]])[0]]


def test_initial_values_that_depend_on_parameters_get_their_gradient():
    # u0 = [A0 + G(A0)], a parameter and a network: every method carries d u0 / dp.
    G = mz.Chain(1, mz.Dense(4, "tanh"), mz.Dense(1))
    model = mz.sm.Model(_growth, ["x"], ["k", "K", "A0"], nets={"G": G})
    theta = model.init_params(seed=0, k=0.8, K=3.0, A0=0.4)
    prob = sciml.ODEProblem(model, lambda p, nets: [p.A0 + nets.G([p.A0])[0]], (0.0, 5.0),
                            theta)
    assert prob.u0[0] == pytest.approx(0.4 + G([0.4], theta[3:])[0])
    t = np.linspace(0.5, 5.0, 10)
    data = sciml.Data(t, 2.5 - np.exp(-t))
    fd = _fd(prob, data, range(theta.shape[0]))
    for name, m in METHODS.items():
        for solver in (sciml.Tsit5(), sciml.Rodas5()):
            _, g = sciml.loss_and_grad(prob, data, solver=solver, sensealg=m, rtol=1e-10,
                                       atol=1e-10)
            np.testing.assert_allclose(g, fd, rtol=2e-5, atol=2e-6, err_msg=f"{name} {solver}")
    # the same problem with u0 given as numbers has no gradient through A0's initial value
    fixed = prob.remake(u0=prob.u0)
    _, g = sciml.loss_and_grad(fixed, data, rtol=1e-10, atol=1e-10)
    assert abs(g[2]) < 1e-12


def test_observables_that_call_networks_get_their_gradient():
    H = mz.Chain(1, mz.Dense(3, "tanh"), mz.Dense(1))
    model = mz.sm.Model(lambda u, p, t, nets: [-p.k * u[0]], ["x"], ["k"], nets={"H": H},
                        observables={"y": lambda u, p, t, nets: u.x + nets.H([u.x])[0]})
    theta = model.init_params(seed=1, k=0.5)
    prob = sciml.ODEProblem(model, [2.0], (0.0, 4.0), theta)
    t = np.linspace(0.4, 4.0, 9)
    sol = sciml.solve(prob, rtol=1e-12, atol=1e-12, saveat=t)
    x = sol.u[:, 0]
    expect = x + np.array([H([xi], theta[1:])[0] for xi in x])
    np.testing.assert_allclose(sol.observables["y"], expect, rtol=1e-12)
    data = sciml.Data(t, 0.9 * expect, observables=["y"])
    fd = _fd(prob, data, range(theta.shape[0]))
    for m in METHODS.values():
        _, g = sciml.loss_and_grad(prob, data, sensealg=m, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(g, fd, rtol=2e-5, atol=1e-7)


def test_hand_written_kernels_refuse_second_order_methods_clearly():
    from . import hatch_kernels as hk

    model = mz.sm.Model.from_kernels(hk.decay_rhs, hk.decay_vjp, ["x"], ["k"])
    prob = sciml.ODEProblem(model, [1.0], (0.0, 1.0), [0.5])
    data = sciml.Data([0.5, 1.0], [[0.6], [0.4]])
    for m in (adjoints.DiscreteAdjoint(), adjoints.BacksolveAdjoint(),
              adjoints.ForwardSensitivity()):
        with pytest.raises(ValueError, match="needs the model's `hvp` kernel"):
            sciml.loss_and_grad(prob, data, solver=sciml.Rodas5(), sensealg=m)
    # the default with Rodas5 avoids them, and the explicit methods still work
    v, g = sciml.loss_and_grad(prob, data, solver=sciml.Rodas5(), rtol=1e-10, atol=1e-10)
    v2, g2 = sciml.loss_and_grad(prob, data, sensealg=adjoints.DiscreteAdjoint(), rtol=1e-10,
                                 atol=1e-10)
    np.testing.assert_allclose(g, g2, rtol=1e-6)


# ---------------------------------------------------------------- stiff


def _vdp(u, p, t):
    x, y = u
    return [y, p.mu * ((1 - x**2) * y - x)]


def test_stiff_gauss_adjoint_with_rodas5():
    # Van der Pol, mu = 1000, across its fast transition: the backward adjoint is as stiff.
    model = mz.sm.Model(_vdp, ["x", "y"], ["mu"])
    prob = sciml.ODEProblem(model, [2.0, 0.0], (0.0, 1.0), [1000.0])
    t = np.linspace(0.1, 1.0, 10)
    rodas = sciml.Rodas5()
    data = sciml.Data(t, 1.01 * sciml.solve(prob, rodas, rtol=1e-10, atol=1e-10, saveat=t).u)
    mu = prob.params[0]
    fd = (sciml.loss_value(prob, data, solver=rodas, params=[mu * (1 + 1e-6)], rtol=1e-12,
                           atol=1e-12)
          - sciml.loss_value(prob, data, solver=rodas, params=[mu * (1 - 1e-6)], rtol=1e-12,
                             atol=1e-12)) / (2e-6 * mu)
    _, g = sciml.loss_and_grad(prob, data, solver=rodas, rtol=1e-10, atol=1e-10)  # default: Gauss
    assert g[0] == pytest.approx(fd, rel=2e-5)


def test_stiff_path_handles_doses_and_observables():
    # The PK model is not stiff, but Rodas5 must still give the same gradient as Tsit5.
    prob, data = _pk(infusion=False)
    g_erk = sciml.loss_and_grad(prob, data, sensealg=adjoints.GaussAdjoint(), rtol=1e-10,
                                atol=1e-10)[1]
    g_ros = sciml.loss_and_grad(prob, data, solver=sciml.Rodas5(),
                                sensealg=adjoints.GaussAdjoint(), rtol=1e-10, atol=1e-10)[1]
    np.testing.assert_allclose(g_ros, g_erk, rtol=1e-5)


def test_lean_many_path_agrees_with_the_general_one():
    # A list of plain problems with the discrete adjoint runs in one parallel compiled call.
    prob, data = _spiral()
    rng = np.random.default_rng(7)
    probs = [prob.remake(u0=prob.u0 + 0.1 * rng.standard_normal(2)) for _ in range(5)]
    datas = [data] * 5
    alg = adjoints.DiscreteAdjoint()
    v, g = sciml.loss_and_grad(probs, datas, sensealg=alg, threads=2)
    vs, gs = sciml.loss_and_grad(probs, datas, sensealg=alg, per_problem=True)
    gen = [sciml.loss_and_grad(p, data, sensealg=alg, threads=1) for p in probs]  # general
    np.testing.assert_allclose(vs, [e[0] for e in gen], rtol=1e-13)
    np.testing.assert_array_equal(gs, np.stack([e[1] for e in gen]))
    assert v == pytest.approx(sum(e[0] for e in gen), rel=1e-13)
    np.testing.assert_allclose(g, gs.sum(axis=0), rtol=1e-15)
    v1, g1 = sciml.loss_and_grad(probs, datas, sensealg=alg, threads=1)
    assert v1 == v
    np.testing.assert_array_equal(g1, g)


@pytest.mark.parametrize("solver", [sciml.Tsit5(), sciml.Rodas5()], ids=["tsit5", "rodas5"])
def test_forward_sensitivities_to_chosen_parameters_are_those_columns(solver):
    # ForwardSensitivity.prepare(job, cols): S to a few parameters (what an NLME subject's
    # empirical Bayes iterations need) equals those columns of S to all of them; u0 depends
    # on a parameter and a network, so S(t0) is chosen too
    from dataclasses import replace

    from adjoints.primal import Job
    from sciml.solvers import common

    G = mz.Chain(1, mz.Dense(4, "tanh"), mz.Dense(1))
    model = mz.sm.Model(_growth, ["x"], ["k", "K", "A0"], nets={"G": G})
    theta = model.init_params(seed=0, k=0.8, K=3.0, A0=0.4)
    prob = sciml.ODEProblem(model, lambda p, nets: [p.A0 + nets.G([p.A0])[0]], (0.0, 5.0),
                            theta)
    t = np.linspace(0.5, 5.0, 10)
    job = Job(prob, theta.copy(), common.schedule(prob), solver, 1e-10, np.full(1, 1e-10),
              None, 100_000, t)
    fs = adjoints.ForwardSensitivity()
    full = fs.prepare(job)(theta)
    cols = np.array([2, 5, 0])
    sub = fs.prepare(replace(job), cols)(theta)
    assert sub.S.shape == (10, 1, 3)
    np.testing.assert_allclose(sub.u, full.u, rtol=1e-8)
    np.testing.assert_allclose(sub.S, full.S[:, :, cols], rtol=1e-7, atol=1e-10)
    with pytest.raises(ValueError, match="`cols` must index the model's"):
        fs.prepare(job, [model.n_params])
    # adjoints.prepare_values: the values solve with its system built once, at any p and
    # from any u0, equals adjoints.values (its second call runs the loop's compiled entry)
    run = adjoints.prepare_values(job)
    theta2 = theta * 1.1
    for q, u0 in ((theta, None), (theta2, None), (theta2, np.array([0.7])), (theta, None)):
        want = adjoints.values(replace(job, p=q), u0=u0).check().u
        np.testing.assert_array_equal(run(q, u0).check().u, want)
