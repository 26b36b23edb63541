"""Population objective: shared parameters, per-subject deviations, L2 penalty."""

import numpy as np
import pytest

import sciml


def _oral(u, p, t):
    return [-np.exp(p.log_ka) * u.depot,
            np.exp(p.log_ka) * u.depot - np.exp(p.log_CL - p.log_V) * u.central]


@pytest.fixture(scope="module")
def population():
    model = sciml.Model(_oral, ["depot", "central"], ["log_ka", "log_CL", "log_V"],
                        observables={"conc": lambda u, p: u.central / np.exp(p.log_V)})
    rng = np.random.default_rng(0)
    probs, datas = [], []
    t = np.array([0.5, 1, 2, 4, 8, 12, 24.0])
    for _ in range(4):
        theta = np.log([1.5, 2.8 * np.exp(0.3 * rng.standard_normal()), 32.0])
        prob = sciml.ODEProblem(model, [0.0, 0.0], (0.0, 24.0), theta,
                                doses=[sciml.Bolus(0.0, 320.0, "depot")])
        conc = sciml.solve(prob, rtol=1e-10, atol=1e-10, saveat=t).observables["conc"]
        probs.append(prob.remake(params=np.log([1.0, 2.0, 30.0])))
        datas.append(sciml.Data(t, conc * (1 + 0.02 * rng.standard_normal(t.size)),
                                observables=["conc"]))
    return sciml.Population(probs, datas, individual=["log_CL"], penalty=0.5,
                            rtol=1e-10, atol=1e-10)


def test_layout_and_subject_params(population):
    x = population.initial()
    assert x.shape == (3 + 4,)
    theta, eta = population.split(x)
    th = population.subject_params(x)
    np.testing.assert_allclose(th[:, 1], theta[1] + eta[:, 0])
    np.testing.assert_array_equal(th[:, [0, 2]], np.repeat(theta[None, [0, 2]], 4, axis=0))


def test_gradient_matches_finite_differences(population):
    rng = np.random.default_rng(1)
    x = population.initial() + 0.1 * rng.standard_normal(population.size)
    v, g = population.loss_and_grad(x)
    for i in range(population.size):
        e = np.zeros_like(x)
        e[i] = 1e-6
        fd = (population.loss_and_grad(x + e)[0] - population.loss_and_grad(x - e)[0]) / 2e-6
        assert g[i] == pytest.approx(fd, rel=1e-5, abs=1e-7)


def test_penalty_term(population):
    x = population.initial()
    theta, eta = population.split(x)
    eta[:] = [[0.1], [-0.2], [0.3], [0.0]]
    v, _ = population.loss_and_grad(x)
    free = sciml.Population(population.problems, population.data, ["log_CL"], penalty=0.0,
                            rtol=1e-10, atol=1e-10)
    v0, _ = free.loss_and_grad(x)
    assert v - v0 == pytest.approx(0.5 * (0.01 + 0.04 + 0.09), rel=1e-12)


def test_bad_input(population):
    p, d = population.problems, population.data
    with pytest.raises(ValueError, match="distinct mechanistic parameters"):
        sciml.Population(p, d, ["nope"])
    with pytest.raises(ValueError, match="one Data per problem"):
        sciml.Population(p, d[:2], ["log_CL"])
    with pytest.raises(ValueError, match="Population: `penalty` must be a finite number >= 0"):
        sciml.Population(p, d, ["log_CL"], penalty=-1)
    with pytest.raises(ValueError, match="`x` must have length 7"):
        population.loss_and_grad(np.zeros(3))


def test_population_fit_recovers_individual_clearance(population):
    import nets

    res = population.fit(optimizers=[nets.Adam(0.05, iters=60), sciml.LBFGS(iters=200)],
                         progress=False)
    assert res.loss < population.loss_and_grad(population.initial())[0]
    assert res.subject_params.shape == (4, 3)
    assert len(res.problems) == 4
    for p, d, th in zip(res.problems, population.data, res.subject_params):
        np.testing.assert_array_equal(p.params, th)
        fitted = sciml.solve(p, saveat=d.t).observables["conc"]
        assert np.max(np.abs(fitted / d.y[:, 0] - 1)) < 0.1  # 2 % noise, one free CL each
    fig = res.plot()
    assert len([a for a in fig.axes if a.get_visible()]) == 4
