"""`sciml.nlme`: the objectives against closed forms and the published theo_sd FOCE-I fit.

- A model linear in the random effects (``y = a + b t`` with random ``a``, ``b`` and
  additive error) has an exact Gaussian marginal likelihood, which every method must
  reproduce (scipy's multivariate normal; FO, FOCE, FOCE-I and Laplace are exact there).
- theo_sd (nlmixr2data; all 132 observations, time-0 ones included) by FOCE-I
  from nlmixr2's start values must reach nlmixr2's published estimates.
- Bad input gets an error naming what is wrong.
"""

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import sciml
import sciml.nlme as nl
from sciml.data import read_events

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"


# ---------------------------------------------------------------- linear in eta


def _line(u, p, t):
    return [p.b]  # x = b t from x(0) = 0


LINE = sciml.Model(_line, ["x"], ["a", "b"], observables={"y": lambda u, p: p.a + u.x})


def _line_subjects(n=6, seed=1):
    rng = np.random.default_rng(seed)
    t = np.linspace(0.5, 4.0, 5)
    table = {"ID": [], "TIME": [], "DV": [], "AMT": [], "EVID": []}
    for i in range(n):
        a, b = 1.0 + 0.5 * rng.normal(), 0.3 + 0.2 * rng.normal()
        y = a + b * t + 0.1 * rng.normal(size=t.shape)
        table["ID"] += [i + 1] * len(t)
        table["TIME"] += t.tolist()
        table["DV"] += y.tolist()
        table["AMT"] += [0.0] * len(t)
        table["EVID"] += [0] * len(t)
    return read_events(table, LINE, {1: "x"}, "y", params=[0.0, 0.0], tspan=(0.0, 4.0))


def _line_pop(**kw):
    return nl.NLME(LINE, lambda th, eta, cov: {"a": th.ta + eta.a, "b": th.tb + eta.b},
                   theta={"ta": 0.8, "tb": 0.2}, omega={("a", "b"): [[0.3, 0.02], [0.02, 0.05]]},
                   error={"y": nl.Additive(0.15)}, **kw)


def _exact(subjects, ta, tb, omega, sd):
    """-2 log-likelihood without the n log 2 pi constant, in closed form."""
    total = 0.0
    for s in subjects:
        t, y = s.data.t, s.data.y[:, 0]
        Z = np.column_stack([np.ones_like(t), t])
        C = Z @ omega @ Z.T + sd**2 * np.eye(len(t))
        logpdf = stats.multivariate_normal(ta + tb * t, C).logpdf(y)
        total += -2 * logpdf - len(t) * np.log(2 * np.pi)
    return total


@pytest.mark.parametrize("method", ["fo", "foce", "focei", "laplace"])
def test_every_method_is_exact_for_a_model_linear_in_eta(method):
    subjects = _line_subjects()
    pop = _line_pop()
    om = np.array([[0.3, 0.02], [0.02, 0.05]])
    got = pop.objective(subjects, theta={"ta": 0.8, "tb": 0.2}, sigma={"y.sd": 0.15},
                        method=method)
    assert got == pytest.approx(_exact(subjects, 0.8, 0.2, om, 0.15), rel=1e-7)
    other = {("a", "b"): [[0.5, -0.05], [-0.05, 0.1]]}
    got = pop.objective(subjects, theta=[1.1, 0.25], omega=other, sigma=[0.2], method=method)
    assert got == pytest.approx(_exact(subjects, 1.1, 0.25, np.array(other[("a", "b")]), 0.2),
                                rel=1e-7)


def test_the_fit_of_a_linear_model_is_the_maximum_likelihood_estimate():
    subjects = _line_subjects(n=10, seed=3)
    fit = _line_pop().fit(subjects, method="focei")

    def exact(z):
        L = np.array([[np.exp(z[2]), 0.0], [z[3], np.exp(z[4])]])
        return _exact(subjects, z[0], z[1], L @ L.T, np.exp(z[5]))

    from scipy.optimize import minimize

    ref = minimize(exact, [0.8, 0.2, 0.5 * np.log(0.3), 0.0, 0.5 * np.log(0.05),
                           np.log(0.15)], method="Nelder-Mead",
                   options={"maxiter": 20000, "xatol": 1e-9, "fatol": 1e-11})
    assert fit.objective == pytest.approx(ref.fun, abs=1e-5)
    assert fit.theta["ta"] == pytest.approx(ref.x[0], abs=1e-3)
    assert fit.theta["tb"] == pytest.approx(ref.x[1], abs=1e-3)
    assert fit.sigma["y.sd"] == pytest.approx(np.exp(ref.x[5]), rel=1e-3)
    # the empirical Bayes estimates are the posterior means of the Gaussian model
    om, sd = fit.omega, fit.sigma["y.sd"]
    for s, eta in zip(subjects, fit.eta):
        t, y = s.data.t, s.data.y[:, 0]
        Z = np.column_stack([np.ones_like(t), t])
        r = y - fit.theta["ta"] - fit.theta["tb"] * t
        post = np.linalg.solve(Z.T @ Z / sd**2 + np.linalg.inv(om), Z.T @ r / sd**2)
        np.testing.assert_allclose(eta, post, atol=1e-6)
    table = fit.table
    np.testing.assert_allclose(np.asarray(table["RES"]), np.asarray(table["DV"])
                               - np.asarray(table["PRED"]))
    assert set(fit.se) >= {"ta", "tb", "omega.a", "omega.b,a", "omega.b", "y.sd"}
    assert all(np.isfinite(v) and v > 0 for v in fit.se.values())


def test_vpc_simulations_have_the_marginal_quantiles_of_a_linear_model():
    # y = a + b t with Gaussian a, b and residual: each time's quantiles are known exactly
    subjects = _line_subjects(n=10, seed=3)
    fit = _line_pop().fit(subjects, method="focei", covariance=False)
    d = fit.vpc_data(n_sim=400, seed=1)
    t = d["time"]
    assert t.shape == (5,) and d["observed"].shape == (5, 3)
    Z = np.column_stack([np.ones_like(t), t])
    mean = fit.theta["ta"] + fit.theta["tb"] * t
    sd = np.sqrt(np.einsum("ij,jk,ik->i", Z, fit.omega, Z) + fit.sigma["y.sd"] ** 2)
    # the same statistics drawn from the exact marginal N(mean, sd**2): 10 subjects a bin
    rng = np.random.default_rng(7)
    draws = mean + sd * rng.standard_normal((4000, 10, 5))
    ref = np.median(np.quantile(draws, [0.05, 0.5, 0.95], axis=1), axis=1).T  # (5, 3)
    np.testing.assert_allclose(d["sim_median"], ref, atol=0.15 * sd.max())
    assert np.all(d["sim_lo"] <= ref) and np.all(ref <= d["sim_hi"])
    pc = fit.vpc_data(n_sim=50, pred_corrected=True)
    assert pc["sim_median"].shape == (5, 3)
    import matplotlib

    matplotlib.use("Agg")
    fit.vpc(n_sim=20)
    fit.gof()


# ---------------------------------------------------------------- theo_sd, the anchor


def _one_cpt(u, p, t):
    return [-p.ka * u.depot, p.ka * u.depot - p.cl / p.v * u.central]


THEO = sciml.Model(_one_cpt, ["depot", "central"], ["ka", "cl", "v"],
                   observables={"cp": lambda u, p: u.central / p.v})


def _theo_individual(theta, eta, cov):
    return {"ka": np.exp(theta.tka + eta.ka), "cl": np.exp(theta.tcl + eta.cl),
            "v": np.exp(theta.tv + eta.v)}


def _theo_pop():
    return nl.NLME(THEO, _theo_individual, theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
                   omega={"ka": 0.6, "cl": 0.3, "v": 0.1}, error={"cp": nl.Additive(0.7)})


def _theo_subjects():
    return read_events(str(DATA / "theo_sd_nlmixr2data.csv"), THEO, {1: "depot", 2: "central"},
                       "cp", params=[1.0, 1.0, 1.0])


def test_theo_sd_focei_reproduces_nlmixr2():
    # nlmixr2 FOCE-I on theo_sd (published): OBJF 116.80; tka 0.464, tcl 1.012, tv 3.460;
    # omega variances 0.400, 0.069, 0.019; add.sd 0.694.
    fit = _theo_pop().fit(_theo_subjects(), method="focei", covariance=False)
    assert fit.n_obs == 132
    assert fit.objective == pytest.approx(116.80, abs=0.1)
    for name, ref in (("tka", 0.464), ("tcl", 1.012), ("tv", 3.460)):
        assert fit.theta[name] == pytest.approx(ref, abs=0.02)
    np.testing.assert_allclose(np.diag(fit.omega), [0.400, 0.069, 0.019], rtol=0.15)
    assert fit.sigma["cp.sd"] == pytest.approx(0.694, abs=0.01)


# ---------------------------------------------------------------- the exact gradients


def _check_gradient(pop, subjects, x, method, directions=None, rel=1e-5, **prepare):
    """The exact gradient of ``method`` against central differences of its objective, along
    each coordinate (default) or along the rows of ``directions``. Laplace's objective holds
    a Hessian from central differences of the sensitivities: differencing it again takes a
    larger step (1e-4) to stay above the nested differences' rounding (about 1e-9 of the
    objective)."""
    fits = pop.prepare(subjects, rtol=1e-11, atol=1e-12, **prepare)
    etas = [np.zeros(len(pop.eta_names))] * len(fits)
    value, etas, parts = pop._objective_and_gradient(fits, x, etas, method)
    g = pop.gradient_x(x, parts)
    D = np.eye(x.shape[0]) if directions is None else directions
    h = 1e-4 if method == "laplace" else 1e-5
    fd = np.empty(D.shape[0])
    for i, d in enumerate(D * h):
        hi = pop._objective(fits, x + d, method, etas)[0]
        lo = pop._objective(fits, x - d, method, etas)[0]
        fd[i] = (hi - lo) / (2 * h)
    np.testing.assert_allclose(D @ g, fd, rtol=rel, atol=rel * np.max(np.abs(fd)))


def _ude(u, p, t, nets):
    absorption = p.ka * np.exp(np.tanh(nets.U([u.depot / 320.0])[0])) * u.depot
    return [-absorption, absorption - p.cl / p.v * u.central]


@pytest.mark.parametrize("error", [nl.Additive(0.7), nl.Combined(0.5, 0.1)])
@pytest.mark.parametrize("method", ["fo", "foce", "focei", "laplace"])
def test_the_gradient_agrees_with_central_differences(method, error):
    # eta enters nonlinearly, a block omega, interaction through the combined error (and
    # FOCE's variances at the population prediction moving with theta)
    kw = dict(theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
              omega={"ka": 0.6, ("cl", "v"): [[0.3, 0.05], [0.05, 0.1]]},
              error={"cp": error}, ebe_tol=1e-26)
    sd = np.array(error.sd)
    pop = nl.NLME(THEO, _theo_individual, **kw)
    x = pop.pack(pop.theta0, [m for _, m in pop.blocks], sd) + 0.01
    _check_gradient(pop, _theo_subjects()[:4], x, method)


@pytest.mark.parametrize("method", ["fo", "foce", "focei", "laplace"])
def test_the_gradient_with_a_network_agrees_with_central_differences(method):
    # a network in the dynamics, its weights population parameters
    from nets import Chain, Dense

    kw = dict(theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
              omega={"ka": 0.6, ("cl", "v"): [[0.3, 0.05], [0.05, 0.1]]},
              error={"cp": nl.Additive(0.7)}, ebe_tol=1e-26)
    sd = np.array([0.7])

    chain = Chain(1, Dense(4, "tanh"), Dense(1))
    model = sciml.Model(_ude, ["depot", "central"], ["ka", "cl", "v"], nets={"U": chain},
                        observables={"cp": lambda u, p: u.central / p.v})
    theta = model.init_params(seed=0, ka=1.0, cl=1.0, v=1.0)
    subjects = read_events(str(DATA / "theo_sd_nlmixr2data.csv"), model,
                           {1: "depot", 2: "central"}, "cp", params=theta)[:3]
    pop = nl.NLME(model, _theo_individual, nets={"U": chain.init_params(seed=1)}, **kw)
    x = pop.pack(pop.theta0, [m for _, m in pop.blocks], sd) + 0.01
    n = x.shape[0]
    assert n == 3 + 4 + len(sd) + chain.n_params  # theta, omega, sigma, weights
    rng = np.random.default_rng(0)
    weights_only = np.r_[np.zeros(n - chain.n_params), rng.normal(size=chain.n_params)]
    _check_gradient(pop, subjects[:2], x, method,
                    np.vstack([rng.normal(size=(2, n)), weights_only]))


def test_the_covariance_step_agrees_with_second_differences():
    # the Hessian from FOCE-I's gradient and from FOCE's (the same objective for additive
    # errors, another derivation), against second differences of the objective
    subjects = _line_subjects(n=8, seed=5)
    pop = nl.NLME(LINE, lambda th, eta, cov: {"a": np.exp(th.ta + eta.a), "b": th.tb + eta.b},
                  theta={"ta": 0.0, "tb": 0.2}, omega={"a": 0.2, "b": 0.05},
                  error={"y": nl.Additive(0.15)})
    a = pop.fit(subjects, method="focei")
    b = pop.fit(subjects, method="foce")
    assert a.objective == pytest.approx(b.objective, abs=1e-6)
    names, v0, to_x = b._natural()
    fits = pop.prepare(subjects)

    def f(v):  # EBEs converged further: second differences amplify their error
        return pop._objective(fits, to_x(v), "foce", list(b.eta), 1e-20)[0]

    h = 1e-3 * np.maximum(np.abs(v0), 0.1)
    E = np.diag(h)
    H = np.array([[f(v0 + p + q) - f(v0 + p - q) - f(v0 - p + q) + f(v0 - p - q) for q in E]
                  for p in E]) / (4 * np.outer(h, h))
    se = np.sqrt(np.diag(2.0 * np.linalg.inv(H)))
    for name, ref in zip(names, se):
        assert a.se[name] == pytest.approx(ref, rel=2e-3), name
        assert b.se[name] == pytest.approx(ref, rel=2e-3), name


# ---------------------------------------------------------------- bad input


def test_bad_input_names_the_argument():
    subjects = _theo_subjects()
    kw = dict(theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45}, error={"cp": nl.Additive(0.7)})
    with pytest.raises(ValueError, match=r"uses eta 'v', which has no entry in `omega`"):
        nl.NLME(THEO, _theo_individual, omega={"ka": 0.6, "cl": 0.3}, **kw)
    with pytest.raises(ValueError, match=r"`omega\[\('ka', 'cl'\)\]` is not positive definite"):
        nl.NLME(THEO, _theo_individual, omega={("ka", "cl"): [[0.6, 0.7], [0.7, 0.3]], "v": 0.1},
                **kw)
    with pytest.raises(ValueError, match=r"sets 'Q', not parameters of the model"):
        nl.NLME(THEO, lambda th, eta, cov: {"ka": np.exp(th.tka + eta.ka), "Q": th.tcl},
                omega={"ka": 0.6}, **kw)
    with pytest.raises(ValueError, match=r"uses theta 'tq', which is not in `theta`"):
        nl.NLME(THEO, lambda th, eta, cov: {"ka": np.exp(th.tq + eta.ka)}, omega={"ka": 0.6},
                **kw)
    pop = nl.NLME(THEO, lambda th, eta, cov: {"ka": np.exp(th.tka + eta.ka),
                                              "v": np.exp(th.tv) * cov.AGE / 40},
                  omega={"ka": 0.6}, **kw)
    with pytest.raises(ValueError, match=r"subject 1 has no covariate 'AGE'.*its covariates: WT"):
        pop.objective(subjects)
    with pytest.raises(ValueError, match=r"`method` must be one of"):
        _theo_pop().objective(subjects, method="saem")
    with pytest.raises(ValueError, match=r"`error` names 'conc', not an observable"):
        nl.NLME(THEO, _theo_individual, theta=kw["theta"], omega={"ka": 0.6, "cl": 0.3, "v": 0.1},
                error={"conc": nl.Additive(0.7)})
    with pytest.raises(ValueError, match=r"Additive: `sd` must be a standard deviation > 0"):
        nl.Additive(-1.0)


def test_replicate_observations_count_each_as_nonmem_does():
    # warfarin-style replicates: two concentrations at one time are two observations
    table = {"ID": [1] * 5, "TIME": [0.0, 1.0, 1.0, 2.0, 4.0], "AMT": [100.0, 0, 0, 0, 0],
             "DV": [0.0, 2.0, 2.4, 3.0, 2.5], "EVID": [101, 0, 0, 0, 0]}
    with pytest.raises(ValueError, match="a second observation of 'cp' at time 1.0"):
        read_events(table, THEO, {1: "depot"}, "cp", params=[1.0, 1.0, 1.0],
                    duplicates="error")
    (s,) = read_events(table, THEO, {1: "depot"}, "cp", params=[1.0, 1.0, 1.0])  # kept
    np.testing.assert_array_equal(s.data.t, [1.0, 1.0, 2.0, 4.0])
    np.testing.assert_array_equal(s.data.y[:, 0], [2.0, 2.4, 3.0, 2.5])
    # the objective counts both: at eta fixed to zero (tiny omega), the sum over rows
    pop = nl.NLME(THEO, _theo_individual, theta={"tka": 0.0, "tcl": 0.0, "tv": 3.0},
                  omega={"ka": 1e-8, "cl": 1e-8, "v": 1e-8}, error={"cp": nl.Additive(0.5)},
                  ebe_tol=1e-20)
    prob = s.problem.remake(params=[1.0, 1.0, np.exp(3.0)])
    f = sciml.solve(prob, rtol=1e-10, atol=1e-10,
                    saveat=np.array([1.0, 2.0, 4.0])).observables["cp"]
    f = f[[0, 0, 1, 2]]
    y = s.data.y[:, 0]
    expect = np.sum((y - f) ** 2 / 0.25 + np.log(0.25))
    # and so does an ordinary fit's loss
    v, _ = sciml.loss_and_grad(prob, s.data, rtol=1e-10, atol=1e-10)
    assert v == pytest.approx(np.sum((y - f) ** 2), rel=1e-7)
    assert pop.objective([s], method="focei") == pytest.approx(expect, abs=1e-4)


@pytest.mark.parametrize("method", ["focei", "fo"])
def test_subjects_on_threads_give_the_serial_result_bit_for_bit(method):
    subjects = _theo_subjects()
    kw = dict(theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
              omega={"ka": 0.6, "cl": 0.3, "v": 0.1}, error={"cp": nl.Combined(0.5, 0.1)})
    out = []
    for threads in (1, 3):
        pop = nl.NLME(THEO, _theo_individual, threads=threads, **kw)
        fits = pop.prepare(subjects)
        x = pop.pack(pop.theta0, [m for _, m in pop.blocks], pop.sigma0)
        value, starts, parts = pop._objective_and_gradient(fits, x, [np.zeros(3)] * 12, method)
        out.append((value, np.array([s.eta for s in starts]), pop.gradient_x(x, parts)))
    assert out[0][0] == out[1][0]
    np.testing.assert_array_equal(out[0][1], out[1][1])
    np.testing.assert_array_equal(out[0][2], out[1][2])
    with pytest.raises(ValueError, match="`threads` must be a positive int"):
        nl.NLME(THEO, _theo_individual, threads=0, **kw)


def _parallel_equals_serial(**kw):
    """A FOCE-I gradient evaluation and a short fit (with the covariance step) with
    `NLME(**kw)` against the serial ones, bit for bit."""
    subjects = _theo_subjects()
    opts = dict(theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
                omega={"ka": 0.6, ("cl", "v"): [[0.3, 0.05], [0.05, 0.1]]},
                error={"cp": nl.Combined(0.5, 0.1)})
    serial = nl.NLME(THEO, _theo_individual, threads=1, **opts)
    other = nl.NLME(THEO, _theo_individual, **kw, **opts)
    out = []
    for pop in (serial, other):
        fits = pop.prepare(subjects)
        x = pop._start(None) + 0.02
        with pop._parallel(fits, {}):
            assert (pop._runner is None) == (pop is serial)
            value, starts, parts = pop._objective_and_gradient(fits, x, pop._zero_etas(fits),
                                                               "focei")
        fit = pop.fit(subjects, max_iter=3)
        out.append((value, np.array([s.eta for s in starts]), pop.gradient_x(x, parts),
                    fit.objective, fit.eta, fit.se))
        assert pop._runner is None  # stopped with the call
    for a, b in zip(*out):
        np.testing.assert_array_equal(a if not isinstance(a, dict) else list(a.values()),
                                      b if not isinstance(b, dict) else list(b.values()))


# JAX, loaded in this process by other tests, warns at any fork; the workers never use it
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_worker_processes_give_the_serial_result_bit_for_bit():
    _parallel_equals_serial(workers=2)
    with pytest.raises(ValueError, match="`workers` must be a positive int or None"):
        nl.NLME(THEO, _theo_individual, workers=0, theta={"tka": 0.45},
                omega={"ka": 0.6}, error={"cp": nl.Additive(0.7)})


# JAX, loaded in this process by other tests, warns at any fork; the workers never use it
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_default_forks_workers_only_where_safe_and_worth_it(monkeypatch):
    import threading

    from sciml.nlme import parallel

    # the rule: `threads` workers, at least SUBJECTS_PER_WORKER subjects each, two or more
    monkeypatch.setattr(parallel, "can_fork", lambda: True)
    per = parallel.SUBJECTS_PER_WORKER
    assert parallel.auto_workers(500, 2) == 2
    assert parallel.auto_workers(3 * per, 8) == 3
    assert parallel.auto_workers(2 * per - 1, 2) is None
    assert parallel.auto_workers(500, 1) is None  # threads=1: serial, no processes
    # by default (no `workers`) subjects go to worker processes, bit for bit the serial
    # result (theo_sd's 12 subjects, the threshold lowered to 4 a worker); workers=1 keeps
    # them on this process's threads
    monkeypatch.setattr(parallel, "SUBJECTS_PER_WORKER", 4)
    _parallel_equals_serial(threads=2)
    pop = nl.NLME(THEO, _theo_individual, threads=2, workers=1,
                  theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
                  omega={"ka": 0.6, "cl": 0.3, "v": 0.1}, error={"cp": nl.Additive(0.7)})
    fits = pop.prepare(_theo_subjects())
    with pop._parallel(fits, {}):
        assert pop._runner is None
    monkeypatch.undo()
    # never with another thread running (a forked child would inherit its locks held)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not parallel.can_fork()
        assert parallel.auto_workers(500, 2) is None
    finally:
        stop.set()
        t.join()


@pytest.mark.cluster
def test_dask_blocks_give_the_serial_result_bit_for_bit():
    pytest.importorskip("distributed")
    _parallel_equals_serial(client="local", workers=2)


def test_multistart_reaches_the_anchor_from_every_start_and_resumes(tmp_path):
    import cloudpickle

    from sciml.nlme.starts import _StartTask

    subjects = _theo_subjects()
    pop = _theo_pop()
    kw = dict(starts=3, seed=0, spread=0.2, progress=False, covariance=False)
    res = pop.fit_multistart(subjects, results=tmp_path / "ms", **kw)
    assert len(res) == 3 and [f.status for f in res] == ["ok"] * 3
    assert np.all(np.diff(res.losses) >= 0)
    assert len({tuple(f.x0) for f in res}) == 3  # three different starts
    np.testing.assert_allclose(res.losses, 116.8034, atol=2e-3)  # all reach nlmixr2's fit
    assert res.best_fit.objective == pytest.approx(res.best.objective, abs=1e-6)
    assert res.best_fit.theta["tcl"] == pytest.approx(1.012, abs=0.01)
    again = pop.fit_multistart(subjects, results=tmp_path / "ms", **kw)  # all resumed
    assert again.n_resumed == 3
    np.testing.assert_array_equal(again.best.params, res.best.params)
    # the task shipped as Dask ships it, on one thread: the same fit as on the pool's threads
    task = cloudpickle.loads(cloudpickle.dumps(_StartTask(pop, subjects, "focei", {})))
    np.testing.assert_array_equal(task(0, res[2].x0).params, res[2].params)
    with pytest.raises(ValueError, match="`starts` as an array must be"):
        pop.fit_multistart(subjects, starts=np.zeros((2, 3)), progress=False)


def test_theo_sd_fo_reproduces_nlmixr2s_reported_objective():
    # nlmixr2 reports, for est="fo", the FOCE-I objective at the FO estimates (its fit prints
    # "FO estimation with FOCEi posthoc"): published 128.01. Ours: FO fit, then FOCE-I there.
    subjects, pop = _theo_subjects(), _theo_pop()
    fo = pop.fit(subjects, method="fo", covariance=False)
    assert fo.objective == pytest.approx(103.87, abs=0.05)  # FO's own objective
    posthoc = pop.objective(subjects, theta=fo.theta, omega=fo.omega, sigma=fo.sigma,
                            method="focei")
    assert posthoc == pytest.approx(128.01, abs=0.05)
