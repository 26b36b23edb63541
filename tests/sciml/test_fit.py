"""`sciml.fit`: parameter recovery, stop rules, interrupts, history bookkeeping, errors, plot.

The model is Lotka-Volterra with alpha and delta known and beta, gamma to
find, observed without noise (so the fit must land on the truth). The
gradients come from the real `sciml.loss_and_grad`.
"""

import sys
import types
import warnings

import numpy as np
import pytest

import nets
import sciml

TRUE = {"beta": 0.9, "gamma": 0.8}
START = {"beta": 0.5, "gamma": 1.2}
T_OBS = np.linspace(0.0, 3.0, 16)


def lv2(u, p, t, nets):
    x, y = u
    return [1.3 * x - p.beta * x * y, p.gamma * x * y - 1.8 * y]


@pytest.fixture(scope="module")
def setup():
    model = sciml.Model(lv2, states=["x", "y"], params=["beta", "gamma"])
    truth = sciml.ODEProblem(model, [0.44249296, 4.6280594], (0.0, 3.0),
                             model.init_params(**TRUE))
    sol = sciml.solve(truth, sciml.Vern7(), rtol=1e-11, atol=1e-11, saveat=T_OBS)
    data = sciml.Data(t=T_OBS, y=sol.u)
    prob = truth.remake(params=model.init_params(**START))
    return model, prob, data


def quick(**kw):
    """A short fit without a progress bar."""
    kw.setdefault("optimizers", [nets.Adam(0.02, iters=20), sciml.LBFGS(iters=60)])
    kw.setdefault("progress", False)
    return kw


class Counting(sciml.SSE):
    """SSE that runs `hook(n)` on its n-th call (n from 1): raises, or spoils the value."""

    def __init__(self, hook):
        self.n, self.hook = 0, hook

    def __call__(self, yhat, data, theta, model):
        self.n += 1
        value, ybar, pbar = super().__call__(yhat, data, theta, model)
        return self.hook(self.n, value), ybar, pbar


# --------------------------------------------------------------------------- recovery


def test_recovers_parameters_and_leaves_problem_alone(setup):
    model, prob, data = setup
    before = prob.params.copy()
    res = sciml.fit(prob, data, **quick())
    np.testing.assert_allclose(res.params, model.init_params(**TRUE), rtol=1e-4)
    assert res.loss < 1e-8
    assert res.stopped == "done"
    np.testing.assert_array_equal(prob.params, before)  # the caller's problem is untouched
    assert res.params is not prob.params
    # the reported loss is the loss at the reported parameters
    value, _ = sciml.loss_and_grad(prob, data, params=res.params)
    assert value == pytest.approx(res.loss, rel=1e-9, abs=1e-14)


def test_list_of_problems_and_start_params(setup):
    model, prob, data = setup
    # two experiments from different initial states share one parameter vector
    other = prob.remake(u0=[1.0, 2.0], params=model.init_params(**TRUE))
    sol = sciml.solve(other, sciml.Vern7(), rtol=1e-11, atol=1e-11, saveat=T_OBS)
    data2 = sciml.Data(t=T_OBS, y=sol.u)
    start = model.init_params(beta=0.7, gamma=1.0)
    res = sciml.fit([prob, other], [data, data2], params=start, **quick())
    np.testing.assert_allclose(res.params, model.init_params(**TRUE), rtol=1e-4)
    np.testing.assert_array_equal(start, model.init_params(beta=0.7, gamma=1.0))
    # the first evaluation is at `params`, not at the problems' own parameters
    v0, _ = sciml.loss_and_grad([prob, other], [data, data2], params=start)
    assert res.history[0] == pytest.approx(v0, rel=1e-12)


# --------------------------------------------------------------------------- bookkeeping


def test_history_bookkeeping(setup):
    _, prob, data = setup
    seen = []
    res = sciml.fit(prob, data, callback=lambda i, p, v: seen.append((i, v)), **quick())
    assert res.n_iters == len(res.history) == len(res.history_stage) == len(seen)
    assert [i for i, _ in seen] == list(range(1, res.n_iters + 1))  # counts over stages
    np.testing.assert_array_equal([v for _, v in seen], res.history)
    # stages in order, each iteration tagged with its stage
    assert np.all(np.diff(res.history_stage) >= 0)
    assert [s["n_iters"] for s in res.stages] == [20, int(np.sum(res.history_stage == 1))]
    assert sum(s["n_iters"] for s in res.stages) == res.n_iters
    assert res.n_evals >= res.n_iters
    # L-BFGS accepts only descending iterates; the best loss never goes up stage to stage
    lb = res.history[res.history_stage == 1]
    assert np.all(np.diff(lb) <= 1e-12 * lb[:-1])
    assert res.stages[0]["loss"] >= res.stages[1]["loss"] == res.loss
    assert res.loss <= res.history.min()
    assert "FitResult(" in repr(res)


def test_default_optimizers(setup, monkeypatch):
    _, prob, data = setup
    res = sciml.fit(prob, data, progress=False, target=1e-3)
    assert res.stages[0]["optimizer"] == "Adam(lr=0.01)"
    assert res.stopped == "target"


def test_progress_bar(setup, capsys):
    _, prob, data = setup
    sciml.fit(prob, data, **quick(optimizers=[nets.Adam(0.02, iters=3)], progress=True))
    assert "fit 1/1 Adam" in capsys.readouterr().err


# --------------------------------------------------------------------------- stop rules


def test_early_stop(setup):
    _, prob, data = setup
    # a step too small to improve by min_delta: a stage gives up after `patience` iterations
    # without lowering the best loss so far (the first stage's first loss sets it)
    opts = [nets.Adam(1e-9, iters=100), nets.Adam(1e-9, iters=100)]
    res = sciml.fit(prob, data, **quick(optimizers=opts, patience=4, min_delta=1e-3))
    assert [s["stopped"] for s in res.stages] == ["early_stop", "early_stop"]
    assert [s["n_iters"] for s in res.stages] == [5, 4]
    assert res.stopped == "early_stop"
    # without min_delta the same tiny steps do improve: no early stop
    res = sciml.fit(prob, data, **quick(optimizers=[nets.Adam(1e-9, iters=10)], patience=4))
    assert res.stopped == "done" and res.n_iters == 10


def test_target(setup):
    _, prob, data = setup
    res = sciml.fit(prob, data, **quick(target=1e-2))
    assert res.stopped == "target"
    assert res.history[-1] <= 1e-2 < res.history[:-1].min()
    assert len(res.stages) == res.history_stage[-1] + 1  # later stages did not run


def test_callback_stop(setup):
    _, prob, data = setup
    res = sciml.fit(prob, data, callback=lambda i, p, v: i == 25, **quick())
    assert res.stopped == "callback" and res.n_iters == 25
    assert [s["n_iters"] for s in res.stages] == [20, 5]


def test_callback_cannot_corrupt_the_fit(setup):
    _, prob, data = setup

    def vandal(i, p, v):
        p[:] = np.nan  # a copy: the optimizer's iterate is not touched

    res = sciml.fit(prob, data, callback=vandal, **quick())
    assert res.stopped == "done" and res.loss < 1e-8


@pytest.mark.parametrize("stage", [0, 1])
def test_interrupt_from_callback_returns_best(setup, stage):
    _, prob, data = setup
    stop_at = 10 if stage == 0 else 26

    def cb(i, p, v):
        if i == stop_at:
            raise KeyboardInterrupt

    res = sciml.fit(prob, data, callback=cb, **quick())
    assert res.stopped == "interrupted"
    assert res.n_iters == stop_at
    assert res.stages[-1]["stopped"] == "interrupted" and len(res.stages) == stage + 1
    assert res.loss <= res.history.min()
    value, _ = sciml.loss_and_grad(prob, data, params=res.params)
    assert value == pytest.approx(res.loss, rel=1e-9)


def test_interrupt_from_objective_returns_best(setup):
    _, prob, data = setup

    def hook(n, value):
        if n == 30:  # in the L-BFGS stage (evaluations 22-35)
            raise KeyboardInterrupt
        return value

    loss = Counting(hook)
    res = sciml.fit(prob, data, loss=loss, **quick())
    assert res.stopped == "interrupted"
    assert res.n_evals == 29
    value, _ = sciml.loss_and_grad(prob, data, params=res.params)
    assert value == pytest.approx(res.loss, rel=1e-9)
    assert res.loss < res.history[0]


def test_nonfinite_loss_ends_stage_keeps_best(setup):
    _, prob, data = setup
    loss = Counting(lambda n, value: np.nan if n == 8 else value)
    with pytest.warns(sciml.FitWarning, match="not finite"):
        res = sciml.fit(prob, data, loss=loss, **quick())
    assert res.stages[0]["stopped"] == "nonfinite" and res.stages[0]["n_iters"] == 7
    assert res.stages[1]["stopped"] == "done"  # the next stage went on from the best point
    assert res.stopped == "done" and res.loss < 1e-8


def test_nonfinite_at_start_is_an_error(setup):
    _, prob, data = setup
    loss = Counting(lambda n, value: np.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sciml.FitWarning)
        with pytest.raises(FloatingPointError, match="starting parameters"):
            sciml.fit(prob, data, loss=loss, **quick())


# --------------------------------------------------------------------------- penalties


def test_penalty_on_an_objective_lands_on_the_analytic_minimum(setup):
    """sum (x - 1)^2 + lam sum x^2 is least at x = 1 / (1 + lam); the parts are reported."""
    _, prob, data = setup  # with `objective`, they serve for plotting only
    lam = 0.5

    def objective(x):
        return float(np.sum((x - 1.0) ** 2)), 2.0 * (x - 1.0)

    def ridge(x):
        return lam * float(x @ x), 2.0 * lam * x

    x0 = np.array([3.0, -2.0, 0.5])
    res = sciml.fit(prob, data, objective=objective, params=x0, penalty=ridge,
                    optimizers=[nets.Adam(0.01, iters=2), sciml.LBFGS(iters=50)],
                    progress=False)
    np.testing.assert_allclose(res.params, 1.0 / (1.0 + lam), rtol=1e-8)
    assert res.loss == pytest.approx(objective(res.params)[0], rel=1e-12)
    assert res.penalty == pytest.approx(ridge(res.params)[0], rel=1e-12)
    assert res.objective == pytest.approx(res.loss + res.penalty, rel=1e-15)
    # the history and the stages carry the objective the optimizer saw
    assert res.history[0] == pytest.approx(objective(x0)[0] + ridge(x0)[0], rel=1e-12)
    assert res.history.min() == pytest.approx(res.objective, rel=1e-12)
    assert res.stages[-1]["loss"] == pytest.approx(res.objective, rel=1e-12)
    assert "penalty=" in repr(res)


def test_penalty_pulls_a_mechanistic_parameter(setup):
    model, prob, data = setup
    lam, centre = 10.0, 0.5  # a prior pulling beta towards 0.5
    ib = model.param_slices["beta"]

    def prior(theta):
        g = np.zeros_like(theta)
        g[ib] = 2.0 * lam * (theta[ib] - centre)
        return lam * float(np.sum((theta[ib] - centre) ** 2)), g

    res = sciml.fit(prob, data, penalty=prior, rtol=1e-10, atol=1e-10,
                    **quick(optimizers=[sciml.LBFGS(iters=200)]))
    beta = res.params[ib][0]
    assert centre < beta < TRUE["beta"] - 1e-3  # between the prior and the truth
    # the reported loss is the data loss alone, the penalty its own part
    value, grad = sciml.loss_and_grad(prob, data, params=res.params, rtol=1e-10, atol=1e-10)
    assert res.loss == pytest.approx(value, rel=1e-9)
    assert res.penalty == pytest.approx(lam * (beta - centre) ** 2, rel=1e-12)
    # stationary for loss + penalty, not for the loss alone
    total = grad + prior(res.params)[1]
    assert np.abs(total).max() < 1e-5 * np.abs(grad).max()


def lv_ude(u, p, t, nets):
    x, y = u
    z = nets.U(u)
    return [p.alpha * x + z[0], -1.8 * y + z[1]]


@pytest.fixture(scope="module")
def ude_setup(setup):
    _, truth, data = setup
    chain = nets.Chain(2, nets.Dense(3, "tanh"), nets.Dense(2))
    model = sciml.Model(lv_ude, states=["x", "y"], params=["alpha"], nets={"U": chain})
    prob = sciml.ODEProblem(model, truth.u0, truth.tspan, model.init_params(seed=1, alpha=1.3))
    return model, prob, data


def test_l2_decays_the_network_only(ude_setup):
    model, prob, data = ude_setup
    net = model.param_slices["U"]
    l2 = 0.05
    opts = dict(progress=False)
    res = sciml.fit(prob, data, l2=l2, optimizers=[nets.Adam(0.01, iters=5),
                                                   sciml.LBFGS(iters=30)], **opts)
    assert res.penalty == pytest.approx(l2 * np.sum(res.params[net] ** 2), rel=1e-12)
    value, _ = sciml.loss_and_grad(prob, data, params=res.params)
    assert res.loss == pytest.approx(value, rel=1e-9)

    # the same fit with the decay written out as `penalty=`: the same path. Not bit for
    # bit: fit's l2 sums w @ w, `decay` np.sum(w ** 2); their last-bit differences in the
    # loss (from about the 13th iteration) reach 1e-12 relative in L-BFGS's line searches.
    def decay(theta):
        g = np.zeros_like(theta)
        g[net] = 2.0 * l2 * theta[net]
        return l2 * float(np.sum(theta[net] ** 2)), g

    res2 = sciml.fit(prob, data, penalty=decay, optimizers=[nets.Adam(0.01, iters=5),
                                                            sciml.LBFGS(iters=30)], **opts)
    np.testing.assert_allclose(res2.history, res.history, rtol=1e-9)
    np.testing.assert_allclose(res2.params, res.params, rtol=1e-8, atol=1e-10)
    # both together add up; the weight decay shrinks the network's weights
    res3 = sciml.fit(prob, data, l2=l2, penalty=decay, optimizers=[sciml.LBFGS(iters=30)],
                     **opts)
    res0 = sciml.fit(prob, data, optimizers=[sciml.LBFGS(iters=30)], **opts)
    assert res3.penalty == pytest.approx(2 * l2 * np.sum(res3.params[net] ** 2), rel=1e-12)
    assert np.sum(res3.params[net] ** 2) < np.sum(res0.params[net] ** 2)
    assert res0.penalty == 0.0 and res0.objective == res0.loss


def test_nonfinite_penalty_ends_the_stage(setup):
    _, prob, data = setup
    calls = []

    def bad(theta):
        calls.append(1)
        return (np.inf if len(calls) == 8 else 0.0), np.zeros_like(theta)

    with pytest.warns(sciml.FitWarning, match="not finite"):
        res = sciml.fit(prob, data, penalty=bad, **quick())
    assert res.stages[0]["stopped"] == "nonfinite" and res.stages[0]["n_iters"] == 7
    assert res.stopped == "done" and res.loss < 1e-8 and res.penalty == 0.0


@pytest.mark.parametrize("kw,exc,match", [
    (dict(l2=-1.0), ValueError, "l2"),
    (dict(l2=np.nan), ValueError, "l2"),
    (dict(l2=0.1), ValueError, "no network"),  # beta and gamma only: nothing to decay
    (dict(penalty="ridge"), TypeError, "penalty"),
    (dict(penalty=lambda th: 1.0), TypeError, r"penalty\(theta\)"),
    (dict(penalty=lambda th: (1.0, np.zeros(5))), ValueError, r"shape \(2,\)"),
])
def test_bad_penalties(setup, kw, exc, match):
    _, prob, data = setup
    with pytest.raises(exc, match=match):
        sciml.fit(prob, data, **quick(**kw))


def test_l2_needs_the_model_layout(setup):
    _, prob, data = setup
    with pytest.raises(ValueError, match="`l2` needs the model"):
        sciml.fit(prob, data, objective=lambda x: (0.0, 0 * x), params=np.ones(2), l2=0.1,
                  progress=False)


# --------------------------------------------------------------------------- backends


def test_jax_backend_wiring(setup, monkeypatch):
    """backend="jax" calls sciml.jax.loss_and_grad with the solver's name (a stand-in here)."""
    _, prob, data = setup
    calls = []

    def fake(p, d, loss=None, solver=None, rtol=None, atol=None, params=None):
        calls.append((p, d, solver, rtol, atol))
        return sciml.loss_and_grad(p, d, loss=loss, rtol=rtol, atol=atol, params=params)

    fake_mod = types.ModuleType("sciml.jax")
    fake_mod.loss_and_grad = fake
    monkeypatch.setitem(sys.modules, "sciml.jax", fake_mod)
    monkeypatch.setattr(sciml, "jax", fake_mod, raising=False)
    res = sciml.fit(prob, data, backend="jax", solver=sciml.DP5(), rtol=1e-7,
                    **quick(optimizers=[nets.Adam(0.02, iters=3)]))
    assert res.n_iters == 3 and len(calls) == 4  # 3 iterations + the last update's point
    assert calls[0] == (prob, data, "DP5", 1e-7, 1e-6)
    with pytest.raises(ValueError, match="sensealg"):
        sciml.fit(prob, data, backend="jax", sensealg=object(), **quick())


def test_jax_backend_fits_too(setup):
    """The real sciml.jax path: the same fit, the same answer (where JAX is installed)."""
    pytest.importorskip("diffrax")
    model, prob, data = setup
    res = sciml.fit(prob, data, backend="jax", **quick(optimizers=[sciml.LBFGS(iters=60)]))
    np.testing.assert_allclose(res.params, model.init_params(**TRUE), rtol=1e-4)
    assert res.stopped == "done" and res.loss < 1e-8


def test_jax_backend_missing(setup, monkeypatch):
    _, prob, data = setup
    monkeypatch.setitem(sys.modules, "sciml.jax", None)  # import fails as if JAX were absent
    monkeypatch.delattr(sciml, "jax", raising=False)
    with pytest.raises(ImportError, match="backend='jax' needs JAX"):
        sciml.fit(prob, data, backend="jax", **quick())


def test_jax_backend_broken_import_is_not_disguised(setup, monkeypatch):
    """An ImportError inside sciml.jax with JAX installed (here: a module it imports is
    unimportable) is raised as it is, not reported as a missing JAX install."""
    pytest.importorskip("diffrax")
    _, prob, data = setup
    import sciml.jax  # noqa: F401  (restored by monkeypatch below)

    monkeypatch.delitem(sys.modules, "sciml.jax")  # imported afresh by fit
    monkeypatch.delattr(sciml, "jax")
    monkeypatch.setitem(sys.modules, "sciml.solution", None)
    with pytest.raises(ImportError, match="sciml.solution") as info:
        sciml.fit(prob, data, backend="jax", **quick())
    assert "needs JAX" not in str(info.value)


# --------------------------------------------------------------------------- arguments


BAD = [
    (dict(prob_or_list="prob"), TypeError, "prob_or_list"),
    (dict(prob_or_list=[]), ValueError, "prob_or_list"),
    (dict(data_or_list="data"), TypeError, "data_or_list"),
    (dict(data_or_list=[]), ValueError, "data_or_list"),
    (dict(optimizers=[]), ValueError, "optimizers"),
    (dict(optimizers=["adam"]), TypeError, r"optimizers\[0\]"),
    (dict(optimizers=[nets.Adam(0.1)]), ValueError, "iters"),
    (dict(rtol=0.0), ValueError, "rtol"),
    (dict(atol=-1.0), ValueError, "atol"),
    (dict(params=np.zeros(3)), ValueError, "params"),
    (dict(params=[np.nan, 1.0]), ValueError, "params"),
    (dict(callback=3), TypeError, "callback"),
    (dict(progress="yes"), TypeError, "progress"),
    (dict(backend="torch"), ValueError, "backend"),
    (dict(patience=0), ValueError, "patience"),
    (dict(min_delta=-1.0), ValueError, "min_delta"),
    (dict(target="low"), ValueError, "target"),
    (dict(max_steps=0), ValueError, "max_steps"),
    (dict(threads=1.5), ValueError, "threads"),
    (dict(loss="sse"), TypeError, "loss"),
]


@pytest.mark.parametrize("kw,exc,match", BAD, ids=[m for _, _, m in BAD])
def test_bad_arguments(setup, kw, exc, match):
    _, prob, data = setup
    args = dict(prob_or_list=prob, data_or_list=data, progress=False)
    args.update(kw)
    with pytest.raises(exc, match=match):
        sciml.fit(args.pop("prob_or_list"), args.pop("data_or_list"), **args)


def test_list_needs_matching_data(setup):
    model, prob, data = setup
    with pytest.raises(ValueError, match="2 entries for 1"):
        sciml.fit(prob, [data, data], progress=False)
    with pytest.raises(TypeError, match="list of as many"):
        sciml.fit([prob, prob], data, progress=False)
    other = sciml.ODEProblem(sciml.Model(lambda u, p, t: [-p.k * u[0]], ["x"], ["k", "j"]),
                             [1.0], (0.0, 1.0), np.ones(2) * 0 + [1.0, 2.0])
    other3 = sciml.ODEProblem(sciml.Model(lambda u, p, t: [-p.k * u[0]], ["x"],
                                          ["k", "j", "m"]), [1.0], (0.0, 1.0), np.ones(3))
    with pytest.raises(ValueError, match="shares one parameter vector"):
        sciml.fit([other, other3], [data, data], progress=False)


# --------------------------------------------------------------------------- plot


def test_plot(setup, tmp_path):
    pytest.importorskip("matplotlib")
    model, prob, data = setup
    res = sciml.fit(prob, data, **quick(optimizers=[sciml.LBFGS(iters=30)]))
    path = tmp_path / "fit.png"
    fig = res.plot(prob, data, path=path)
    assert path.stat().st_size > 1000
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 4  # 2 states x (fit, data)
    fig = res.plot([prob, prob, prob], [data, None, data])
    assert sum(a.get_visible() for a in fig.axes) == 3
    fig = res.plot()  # defaults: the fit's own problems and data
    assert len(fig.axes) == 1
    with pytest.raises(ValueError, match="entries for"):
        res.plot([prob, prob], [data])
