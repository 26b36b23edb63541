"""Networks in the individual-parameter function of `sciml.nlme`.

The chain written out as expressions must be the chain: its values, its weight
gradient (the chain's own reverse pass, `vjp_into`) and its input Jacobian
(`jacobian_into`) at random inputs and weights, for each builtin activation.
"""

import numpy as np
import pytest

import sciml
import sciml.nlme as nl
from nets import Chain, Dense
from sciml.data import read_events
from sciml.nlme.individual import Individual

LINE = sciml.Model(lambda u, p, t: [p.b], ["x"], ["a", "b"],
                   observables={"y": lambda u, p: p.a + u.x})


@pytest.mark.parametrize("act", ["tanh", "softplus", "sigmoid", "relu", "gelu", "elu"])
def test_a_network_in_individual_is_the_chain(act):
    chain = Chain(2, Dense(3, act), Dense(1))
    ind = Individual(lambda th, eta, cov, nets: {
        "a": th.ta + eta.a, "b": nets.F([cov.wt / 70.0, eta.b])[0]},
        LINE, ("ta",), ("a", "b"), nets={"F": chain})
    assert ind.n_theta == 1 + chain.n_params
    rng = np.random.default_rng(0)
    w = rng.normal(size=chain.n_params)
    theta, eta, cov = np.concatenate([[0.5], w]), np.array([0.1, -0.4]), np.array([83.0])
    x = np.array([83.0 / 70.0, -0.4])
    phi, pe, pt = ind.derivatives(theta, eta, cov)
    assert phi[0] == pytest.approx(0.6)
    assert phi[1] == pytest.approx(chain(x, w)[0], rel=1e-12)
    ws = chain.workspace()
    pbar, xbar = np.zeros(chain.n_params), np.empty(2)
    chain.vjp_into(xbar, pbar, np.ones(1), x, w, ws)
    np.testing.assert_allclose(pt[1, 1:], pbar, rtol=1e-10, atol=1e-13)
    J = np.empty((1, 2))
    chain.jacobian_into(J, x, w, ws)
    np.testing.assert_allclose(pe[1], [0.0, J[0, 1]], rtol=1e-10, atol=1e-13)
    ee, et = ind.second_derivatives(theta, eta, cov)
    assert np.all(np.isfinite(ee)) and np.all(np.isfinite(et))


def test_individual_network_errors_name_the_network():
    chain = Chain(2, Dense(3, "tanh"), Dense(1))
    with pytest.raises(ValueError, match="network 'G', which is not in `nets`"):
        Individual(lambda th, eta, cov, nets: {"b": nets.G([1.0, eta.b])[0]},
                   LINE, (), ("b",), nets={"F": chain})
    with pytest.raises(ValueError, match="network 'F' takes 2 inputs, `individual` gave 1"):
        Individual(lambda th, eta, cov, nets: {"b": nets.F([eta.b])[0]},
                   LINE, (), ("b",), nets={"F": chain})


def _covariate_subjects(n=16, seed=4):
    """``y = a + b t``, ``b = 0.3 + 0.4 tanh(2 (wt / 70 - 1))`` plus a random effect: a
    covariate effect no power law has."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.5, 4.0, 5)
    rows = {"ID": [], "TIME": [], "DV": [], "AMT": [], "EVID": [], "WT": []}
    for i in range(n):
        wt = rng.uniform(45.0, 110.0)
        a = 1.0 + 0.3 * rng.normal()
        b = 0.3 + 0.4 * np.tanh(2.0 * (wt / 70.0 - 1.0)) + 0.05 * rng.normal()
        for tj in t:
            for col, v in zip(rows, (i + 1, tj, a + b * tj + 0.05 * rng.normal(), 0.0, 0, wt)):
                rows[col].append(v)
    return read_events(rows, LINE, {1: "x"}, "y", params=[0.0, 0.0], tspan=(0.0, 4.0),
                       covariates=["WT"])


def _covariate_pop(**nets_):
    def individual(th, eta, cov, nets):
        return {"a": th.ta + eta.a, "b": th.tb + nets.F([cov.WT / 70.0 - 1.0])[0] + eta.b}

    chain = Chain(1, Dense(3, "tanh"), Dense(1, bias=False))  # tb is the output's offset
    w0 = 0.1 * np.random.default_rng(1).normal(size=chain.n_params)
    return nl.NLME(LINE, individual, theta={"ta": 0.8, "tb": 0.2},
                   omega={"a": 0.1, "b": 0.01}, error={"y": nl.Additive(0.1)},
                   nets={"F": (chain, w0)}, **nets_), chain


def test_a_network_of_a_covariate_is_estimated_with_exact_gradients():
    from tests.sciml.test_nlme import _check_gradient

    subjects = _covariate_subjects()
    pop, chain = _covariate_pop(ebe_tol=1e-26)
    assert pop.theta_labels[:2] == ("ta", "tb") and len(pop.theta_labels) == 2 + chain.n_params
    x = pop.pack(pop.theta0, [m for _, m in pop.blocks], [0.1]) + 0.01
    _check_gradient(pop, subjects[:4], x, "focei")
    fit = pop.fit(subjects, covariance=False, max_iter=150)
    # against the same random effects with no covariate effect
    plain = nl.NLME(LINE, lambda th, eta, cov: {"a": th.ta + eta.a, "b": th.tb + eta.b},
                    theta={"ta": 0.8, "tb": 0.2}, omega={"a": 0.1, "b": 0.01},
                    error={"y": nl.Additive(0.1)}).fit(subjects, covariance=False)
    assert fit.objective < plain.objective - 20
    wt = np.linspace(50.0, 105.0, 12)
    learned = fit.theta["tb"] + chain((wt / 70.0 - 1.0)[:, None], fit.nets["F"])[:, 0]
    np.testing.assert_allclose(learned, 0.3 + 0.4 * np.tanh(2.0 * (wt / 70.0 - 1.0)),
                               atol=0.06)
    assert fit.sigma["y.sd"] == pytest.approx(0.05, rel=0.3)
    # by name: the objective at the fit's weights, and the network kept fixed
    assert pop.objective(subjects, theta=fit.theta, omega=fit.omega, sigma=fit.sigma,
                         nets=fit.nets) == pytest.approx(fit.objective, abs=1e-6)
    held = pop.fit(subjects, fixed=("F",), covariance=False, max_iter=5)
    np.testing.assert_array_equal(held.nets["F"], pop.theta0[2:])


def test_first_order_stages_run_before_bfgs_on_the_exact_gradient():
    from nets import Adam

    subjects = _covariate_subjects(n=8)
    pop, _ = _covariate_pop()
    start = pop.objective(subjects)
    adam = pop.fit(subjects, stages=[Adam(0.05, iters=25)], max_iter=0, covariance=False)
    assert adam.objective < start - 50
    assert not np.array_equal(adam.nets["F"], pop.theta0[2:])
    with pytest.raises(TypeError, match=r"`stages\[0\]` must be a nets optimizer"):
        pop.fit(subjects, stages=[Adam(0.05)], covariance=False)


def test_a_network_in_an_observable_has_exact_gradients():
    from tests.sciml.test_nlme import _check_gradient

    H = Chain(1, Dense(3, "tanh"), Dense(1))
    model = sciml.Model(lambda u, p, t, nets: [-p.k * u.x], ["x"], ["k"], nets={"H": H},
                        observables={"y": lambda u, p, t, nets: u.x + nets.H([u.x])[0]})
    rng = np.random.default_rng(2)
    rows = {"ID": [], "TIME": [], "DV": [], "AMT": [], "EVID": []}
    for i in range(3):
        k = 0.5 * np.exp(0.3 * rng.normal())
        rows["ID"].append(i + 1)
        rows["TIME"].append(0.0)
        rows["DV"].append(0.0)
        rows["AMT"].append(2.0)
        rows["EVID"].append(1)
        for tj in np.linspace(0.5, 4.0, 6):
            x = 2.0 * np.exp(-k * tj)
            for col, v in zip(rows, (i + 1, tj, x + 0.1 * np.tanh(x) + 0.02 * rng.normal(),
                                     0.0, 0)):
                rows[col].append(v)
    subjects = read_events(rows, model, {1: "x"}, "y",
                           params=model.init_params(seed=0, k=1.0))
    w0 = 0.3 * rng.normal(size=H.n_params)
    pop = nl.NLME(model, lambda th, eta, cov: {"k": np.exp(th.tk + eta.k)},
                  theta={"tk": np.log(0.5)}, omega={"k": 0.1}, error={"y": nl.Additive(0.05)},
                  nets={"H": w0}, ebe_tol=1e-26)
    x = pop.pack(pop.theta0, [m for _, m in pop.blocks], [0.05]) + 0.01
    n = x.shape[0]
    weights_only = np.r_[np.zeros(n - H.n_params), rng.normal(size=H.n_params)]
    _check_gradient(pop, subjects, x, "focei", np.vstack([np.eye(n)[:3], weights_only]))
