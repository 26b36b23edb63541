"""`NLMEFit` diagnostics: NPDE against their N(0, 1) law, and models with two observables.

NPDE of data simulated from the fitted model's own structure must look standard normal;
those of a model whose residual error is fixed far too small must not (the test can fail).
"""

import numpy as np
import pytest
from scipy import stats

import sciml
import sciml.nlme as nl
from sciml.data import read_events
from tests.sciml.test_nlme import LINE, _line_pop


def _table(n, seed, with_z=False):
    """Subjects of ``y = a + b t`` (and ``z = 2 a - b t``) with random a, b, sd 0.1."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.5, 4.0, 5)
    rows = {"ID": [], "TIME": [], "DV": [], "AMT": [], "EVID": [], "DVID": []}
    for i in range(n):
        a, b = 1.0 + 0.5 * rng.normal(), 0.3 + 0.2 * rng.normal()
        for tj in t:
            for name, mean in [("y", a + b * tj)] + ([("z", 2 * a - b * tj)] if with_z else []):
                for col, v in zip(rows, (i + 1, tj, mean + 0.1 * rng.normal(), 0.0, 0, name)):
                    rows[col].append(v)
    return rows


def test_npde_are_standard_normal_under_the_model_and_not_under_a_wrong_one():
    rows = _table(24, seed=11)
    del rows["DVID"]
    subjects = read_events(rows, LINE, {1: "x"}, "y", params=[0.0, 0.0], tspan=(0.0, 4.0))
    fit = _line_pop().fit(subjects, method="focei", covariance=False)
    z = fit.npde(n_sim=250, seed=2)
    assert z.shape == (120,) and np.all(np.isfinite(z))
    assert abs(np.mean(z)) < 0.25 and 0.8 < np.std(z) < 1.2
    assert stats.kstest(z, "norm").pvalue > 0.01
    # residual sd fixed at a third of the truth: the observations are too spread for it
    wrong = nl.NLME(
        LINE, lambda th, eta, cov: {"a": th.ta + eta.a, "b": th.tb + eta.b},
        theta={"ta": 0.8, "tb": 0.2}, omega={("a", "b"): [[0.3, 0.02], [0.02, 0.05]]},
        error={"y": nl.Additive(0.03)}).fit(subjects, fixed=("y.sd",), covariance=False)
    zw = wrong.npde(n_sim=250, seed=2)
    assert np.std(zw) > 1.5 and stats.kstest(zw, "norm").pvalue < 0.01
    with pytest.raises(ValueError, match="`n_sim` must exceed"):
        fit.npde(n_sim=5)


def _line2(u, p, t):
    return [p.b]


LINE2 = sciml.Model(_line2, ["x"], ["a", "b"],
                    observables={"y": lambda u, p: p.a + u.x, "z": lambda u, p: 2 * p.a - u.x})


def test_two_observables_have_their_own_rows_error_models_and_plots():
    subjects = read_events(_table(8, seed=5, with_z=True), LINE2, {1: "x"},
                           {"y": "y", "z": "z"}, params=[0.0, 0.0], tspan=(0.0, 4.0))
    pop = nl.NLME(LINE2, lambda th, eta, cov: {"a": th.ta + eta.a, "b": th.tb + eta.b},
                  theta={"ta": 0.8, "tb": 0.2}, omega={"a": 0.3, "b": 0.05},
                  error={"y": nl.Additive(0.15), "z": nl.Additive(0.15)})
    fit = pop.fit(subjects, method="focei", covariance=False)
    assert fit.sigma["y.sd"] == pytest.approx(0.1, rel=0.3)
    assert fit.sigma["z.sd"] == pytest.approx(0.1, rel=0.3)
    t = fit.table
    obs = np.asarray(t["OBS"])
    assert (obs == "y").sum() == 40 and (obs == "z").sum() == 40
    # z = 2 a - b t: its population prediction is the typical values'
    sel = obs == "z"
    np.testing.assert_allclose(np.asarray(t["PRED"])[sel],
                               2 * fit.theta["ta"] - fit.theta["tb"] * np.asarray(t["TIME"])[sel],
                               rtol=1e-6)
    d = fit.vpc_data(n_sim=20, observable="z")
    assert d["observed"].shape == (5, 3)
    with pytest.raises(ValueError, match="several observed quantities"):
        fit.vpc_data(n_sim=20)
    with pytest.raises(ValueError, match="`observable` 'w' is not observed"):
        fit.gof(observable="w")
    import matplotlib

    matplotlib.use("Agg")
    fit.gof(observable="y")
    fit.vpc(n_sim=10, observable="z")
