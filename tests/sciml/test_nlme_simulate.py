"""`NLME.simulate`: a study simulated from its design at given parameters.

- A model linear in eta (``y = a + b t``, block omega): every time's mean, variance and
  the covariance between a subject's times are known in closed form; the simulated ones
  agree within 4 standard errors, and the simulated etas have covariance omega.
- One compartment with first-order absorption, log-normal etas and a combined error:
  the mean, the variance and the fraction below an LLOQ of DV at each time, by
  Gauss-Hermite quadrature of the closed-form concentration over the etas, against the
  simulated ones within 4 standard errors; each row's IPRED is the closed form at its
  row's etas; censored rows hold the limit.
- Seeds reproduce; `NLMEFit.simulate` gives `NLME.simulate`'s numbers at the fit's
  estimates; bad arguments are refused by name.
"""

import numpy as np
import pytest
from scipy.special import ndtr

import sciml.nlme as nl
from sciml.data import read_events
from tests.sciml.test_nlme import THEO, _line_pop, _line_subjects, _theo_individual

TIMES = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 24.0])
DOSE = 320.0
TRUTH = dict(theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
             omega={"ka": 0.4, "cl": 0.07, "v": 0.02}, sigma={"cp.add": 0.3, "cp.prop": 0.1})


def _design(n_subjects=1, times=TIMES):
    """A dose of 320 into the depot at 0, then observation records (DV placeholders)."""
    rows = {"ID": [], "TIME": [], "DV": [], "AMT": [], "EVID": [], "CMT": []}
    for i in range(n_subjects):
        for t, amt, evid, cmt in [(0.0, DOSE, 1, 1)] + [(t, 0.0, 0, 2) for t in times]:
            for col, v in zip(rows, (i + 1, t, 0.0, amt, evid, cmt)):
                rows[col].append(v)
    return read_events(rows, THEO, {1: "depot", 2: "central"}, "cp", params=[1.0, 1.0, 1.0])


def _theo_pop():
    return nl.NLME(THEO, _theo_individual, theta=TRUTH["theta"], omega=TRUTH["omega"],
                   error={"cp": nl.Combined(0.3, 0.1)})


def _concentration(t, ka, cl, v):
    k = cl / v
    return DOSE * ka / (v * (ka - k)) * (np.exp(-k * t) - np.exp(-ka * t))


def _quadrature(fn, n=24):
    """E[fn(ka, cl, v)] over the log-normal individual parameters, Gauss-Hermite in each
    eta (probabilists' weights)."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    th = np.array(list(TRUTH["theta"].values()))
    sd = np.sqrt(list(TRUTH["omega"].values()))
    g = [a.ravel() for a in np.meshgrid(x, x, x, indexing="ij")]
    W = np.einsum("i,j,k->ijk", w, w, w).ravel()
    ka, cl, v = (np.exp(th[a] + sd[a] * g[a])[:, None] for a in range(3))
    return np.einsum("n,qnt->qt", W, fn(ka, cl, v))


def test_a_linear_model_has_its_closed_form_moments():
    subjects = _line_subjects(n=2)
    pop = _line_pop()
    om = np.array([[0.3, 0.02], [0.02, 0.05]])
    sim = pop.simulate(subjects, theta={"ta": 0.8, "tb": 0.2}, sigma={"y.sd": 0.15},
                       n=4000, seed=3)
    assert list(sim.columns) == ["SIM", "ID", "TIME", "OBS", "DV", "CENS", "IPRED", "PRED",
                                 "eta.a", "eta.b"]
    assert len(sim) == 4000 * 10 and sim["SIM"].min() == 1 and sim["SIM"].max() == 4000
    t = subjects[0].data.t
    Z = np.column_stack([np.ones_like(t), t])
    C = Z @ om @ Z.T + 0.15 ** 2 * np.eye(t.shape[0])
    N = 4000 * 2  # two subjects of the same design: independent draws of the same law
    y = np.concatenate([sim[sim["ID"] == i]["DV"].to_numpy().reshape(4000, -1)
                        for i in (1, 2)])
    se_mean = np.sqrt(np.diag(C) / N)
    assert np.all(np.abs(y.mean(axis=0) - (0.8 + 0.2 * t)) < 4 * se_mean)
    # a Gaussian sample covariance: Var(S_jk) = (C_jk**2 + C_jj C_kk) / N
    S = np.cov(y, rowvar=False)
    se_cov = np.sqrt((C ** 2 + np.outer(np.diag(C), np.diag(C))) / N)
    assert np.all(np.abs(S - C) < 4 * se_cov), (S - C) / se_cov
    eta = sim.groupby(["SIM", "ID"])[["eta.a", "eta.b"]].first().to_numpy()
    se_om = np.sqrt((om ** 2 + np.outer(np.diag(om), np.diag(om))) / N)
    assert np.all(np.abs(np.cov(eta, rowvar=False) - om) < 4 * se_om)
    np.testing.assert_allclose(sim["PRED"], 0.8 + 0.2 * sim["TIME"], rtol=1e-8)
    np.testing.assert_allclose(sim["IPRED"], 0.8 + sim["eta.a"]
                               + (0.2 + sim["eta.b"]) * sim["TIME"], rtol=1e-7, atol=1e-9)


def test_one_compartment_moments_and_censoring_match_quadrature():
    n, lloq = 3000, 2.0
    sim = _theo_pop().simulate(_design(), n=n, seed=5, lloq=lloq)
    ka, cl, v = (np.exp(TRUTH["theta"][k] + sim[f"eta.{e}"])
                 for k, e in (("tka", "ka"), ("tcl", "cl"), ("tv", "v")))
    np.testing.assert_allclose(sim["IPRED"], _concentration(sim["TIME"], ka, cl, v),
                               rtol=1e-6)
    cens = sim["CENS"].to_numpy() == 1
    assert np.all(sim["DV"][cens] == lloq) and np.all(sim["DV"][~cens] >= lloq)
    a, p = TRUTH["sigma"]["cp.add"], TRUTH["sigma"]["cp.prop"]

    def moments(ka, cl, v):
        c = _concentration(TIMES, ka, cl, v)
        R = a * a + (p * c) ** 2
        return np.stack([c, c * c, R, R * R, c ** 3, c ** 4, c * c * R, c * R,
                         ndtr((lloq - c) / np.sqrt(R))])

    Ec, Ec2, ER, ER2, Ec3, Ec4, Ec2R, EcR, below = _quadrature(moments)
    mu = Ec
    var = Ec2 - mu ** 2 + ER
    # 4th central moment of DV = c + sqrt(R) eps: E(c - mu)^4 + 6 E[(c - mu)^2 R] + 3 E R^2
    m4 = (Ec4 - 4 * mu * Ec3 + 6 * mu ** 2 * Ec2 - 3 * mu ** 4
          + 6 * (Ec2R - 2 * mu * EcR + mu ** 2 * ER) + 3 * ER2)
    raw = np.where(cens.reshape(n, -1), np.nan, sim["DV"].to_numpy().reshape(n, -1))
    frac = np.mean(cens.reshape(n, -1), axis=0)
    assert np.all(np.abs(frac - below) < 4 * np.sqrt(below * (1 - below) / n) + 1e-3), \
        (frac, below)
    # the moments themselves on an uncensored simulation of the same design and seed
    full = _theo_pop().simulate(_design(), n=n, seed=5)
    np.testing.assert_array_equal(full["IPRED"], sim["IPRED"])  # censoring draws nothing
    np.testing.assert_array_equal(full["DV"].to_numpy()[~cens], raw[~np.isnan(raw)])
    y = full["DV"].to_numpy().reshape(n, -1)
    assert np.all(np.abs(y.mean(axis=0) - mu) < 4 * np.sqrt(var / n)), \
        (y.mean(axis=0) - mu) / np.sqrt(var / n)
    s2 = y.var(axis=0, ddof=1)
    assert np.all(np.abs(s2 - var) < 4 * np.sqrt((m4 - var ** 2) / n)), \
        (s2 - var) / np.sqrt((m4 - var ** 2) / n)


def test_seeds_reproduce_and_a_fit_simulates_through_the_same_code():
    subjects = _line_subjects(n=3)
    pop = _line_pop()
    a = pop.simulate(subjects, n=20, seed=7)
    b = pop.simulate(subjects, n=20, seed=7)
    assert a.equals(b)
    assert not np.array_equal(a["DV"], pop.simulate(subjects, n=20, seed=8)["DV"])
    fit = pop.fit(subjects, method="focei", max_iter=0, covariance=False)
    at_fit = pop.simulate(subjects, theta=fit.theta, omega=fit.omega, sigma=fit.sigma, n=20,
                          seed=7)
    np.testing.assert_array_equal(fit.simulate(20, seed=7),
                                  at_fit["DV"].to_numpy().reshape(20, -1))
    assert fit.simulate(20, seed=7, table=True).equals(at_fit)


def test_a_subject_without_observations_is_left_out_with_a_warning():
    subjects = _design(2)
    rows = {"ID": [3], "TIME": [0.0], "DV": [0.0], "AMT": [DOSE], "EVID": [1], "CMT": [1]}
    with pytest.warns(UserWarning, match="have no observations"):
        (dosed,) = read_events(rows, THEO, {1: "depot", 2: "central"}, "cp",
                               params=[1.0, 1.0, 1.0], tspan=(0.0, 24.0))
    with pytest.warns(UserWarning, match=r"1 subject\(s\) have no observations and "
                                         r"contribute nothing: 3"):
        sim = _theo_pop().simulate(subjects + [dosed], n=2, seed=0)
    assert sorted(set(sim["ID"])) == [1, 2]


def test_bad_arguments_are_refused_by_name():
    subjects = _design()
    pop = _theo_pop()
    for bad, match in (
            (dict(omega=np.eye(2)), r"`omega` as a matrix must be \(3, 3\)"),
            (dict(omega={"ka": 0.4, "cl": 0.07}), r"`omega` must have the model's blocks"),
            (dict(omega={"ka": -0.4, "cl": 0.07, "v": 0.02}),
             r"`omega\['ka'\]` is not positive definite"),
            (dict(n=-1), r"`n` \(replicates\) must be an int >= 1, got -1"),
            (dict(n=2.5), r"`n` \(replicates\) must be an int >= 1"),
            (dict(seed=-3), r"`seed` must be an int >= 0"),
            (dict(theta=[0.45, 1.0]), r"`theta` must have 3 values \(tka, tcl, tv\)"),
            (dict(theta={"tq": 1.0}), r"unknown theta \['tq'\]"),
            (dict(sigma={"cp.add": -0.3}), r"`sigma\['cp.add'\]` must be a standard deviation"),
            (dict(lloq={"conc": 1.0}), r"`lloq` names 'conc'")):
        with pytest.raises(ValueError, match=match):
            pop.simulate(subjects, **{"n": 2, **bad})
