"""`sciml.nlme` SAEM against nlmixr2's published SAEM fit and against an exact likelihood.

- theo_sd (nlmixr2data, the one-compartment model of `test_nlme`): SAEM with nlmixr2's
  settings (200 + 300 iterations, 3 chains, kernels 2/2/2) must land within nlmixr2's
  SAEM spread, and the FOCE-I objective at its estimates near nlmixr2's.
- A model linear in its random effect with a combined residual error and a fixed effect
  without a random effect (the M-step's numeric paths: Levenberg-Marquardt for the
  theta, BFGS for the sds): its marginal likelihood is a one-dimensional integral,
  computed on a fine grid (trapezoids: spectrally accurate for the smooth peaked
  integrand) and maximised with scipy; SAEM must reach that maximum.
- The same seed gives the same estimates; bad settings get an error naming them.
"""

import numpy as np
import pytest
from scipy import optimize

import sciml.nlme as nl
from sciml.data import read_events
from tests.sciml.test_nlme import LINE, _theo_pop, _theo_subjects


def test_theo_sd_saem_lands_within_nlmixr2s_saem_spread():
    # nlmixr2 SAEM on theo_sd (published): tka 0.464, tcl 1.009, tv 3.456; omega variances
    # 0.403, 0.071, 0.019; add.sd 0.697; FOCE-I objective at the SAEM estimates 116.85
    fit = _theo_pop().fit(_theo_subjects(), method="saem", seed=0)
    assert fit.method == "saem" and fit.objective_method == "focei"
    for name, ref in (("tka", 0.464), ("tcl", 1.009), ("tv", 3.456)):
        assert fit.theta[name] == pytest.approx(ref, abs=0.02), name
    np.testing.assert_allclose(np.diag(fit.omega), [0.403, 0.071, 0.019], rtol=0.2)
    assert fit.sigma["cp.sd"] == pytest.approx(0.697, abs=0.02)
    assert fit.objective == pytest.approx(116.85, abs=0.2)
    # the result reads as the other methods': EBEs, covariance step, table
    assert fit.eta.shape == (12, 3) and all(np.isfinite(v) and v > 0 for v in fit.se.values())
    assert fit.se["tv"] == pytest.approx(0.05, rel=0.3)  # FOCE-I's covariance step: 0.046
    assert len(fit.table["CWRES"]) == 132
    tr = fit.saem
    assert tr.theta.shape == (500, 3) and tr.omega.shape == (500, 3)
    assert 0.2 < np.nanmean(tr.acceptance[-100:, 0]) < 0.7  # adapted toward 0.4
    assert tr.seconds["sampler_solves"] > 0 and tr.seconds["n_solves"] == 12 * 3 * (
        1 + 500 * (2 + 2 * 3 + 2))


T = np.linspace(0.5, 4.0, 5)


def _combined_table(n, seed):
    """``y = a + tb t``, ``a ~ N(1, 0.2)``, tb = 0.3, variance ``0.05**2 + (0.1 f)**2``."""
    rng = np.random.default_rng(seed)
    rows = {"ID": [], "TIME": [], "DV": [], "AMT": [], "EVID": []}
    for i in range(n):
        f = 1.0 + np.sqrt(0.2) * rng.normal() + 0.3 * T
        y = f + np.sqrt(0.05**2 + (0.1 * f) ** 2) * rng.normal(size=T.shape)
        for col, v in zip(rows, (i + 1, T, y, 0.0, 0)):
            rows[col] += list(np.broadcast_to(v, T.shape))
    return rows


def _exact_ml(Y):
    """The maximum of the exact marginal likelihood (eta integrated on a grid of 4001
    points over +-8 prior sds) in (ta, tb, omega, add, prop)."""
    u = np.linspace(-8.0, 8.0, 4001)

    def ofv(z):
        ta, tb, om, add, prop = z[0], z[1], *np.exp(z[2:])
        f = ta + np.sqrt(om) * u[None, :, None] + tb * T
        R = add**2 + (prop * f) ** 2
        ll = -0.5 * np.sum((Y[:, None, :] - f) ** 2 / R + np.log(R), axis=2) - 0.5 * u * u
        m = ll.max(axis=1, keepdims=True)
        return -2.0 * np.sum(m[:, 0] + np.log(np.sum(np.exp(ll - m), axis=1)))

    r = optimize.minimize(ofv, np.r_[1.0, 0.3, np.log([0.2, 0.05, 0.1])], method="BFGS",
                          options={"gtol": 1e-7})
    return np.r_[r.x[:2], np.exp(r.x[2:])]


def test_saem_reaches_the_exact_maximum_likelihood_through_its_numeric_m_step():
    n = 24
    rows = _combined_table(n, seed=3)
    ml = _exact_ml(np.array(rows["DV"]).reshape(n, T.shape[0]))
    subjects = read_events(rows, LINE, {1: "x"}, "y", params=[0.0, 0.0], tspan=(0.0, 4.0))
    pop = nl.NLME(LINE, lambda th, eta, cov: {"a": th.ta + eta.a, "b": th.tb},
                  theta={"ta": 0.8, "tb": 0.2}, omega={"a": 0.3},
                  error={"y": nl.Combined(0.1, 0.2)})
    assert pop.individual.mu_references() == {0: 0}  # tb has no random effect: numeric
    fit = pop.fit(subjects, method=nl.SAEM(burn=60, em=200, chains=2, seed=1))
    got = np.r_[fit.theta["ta"], fit.theta["tb"], fit.omega[0, 0], fit.sigma["y.add"],
                fit.sigma["y.prop"]]
    se = np.array([fit.se[k] for k in ("ta", "tb", "omega.a", "y.add", "y.prop")])
    assert np.all(np.abs(got - ml) < 0.25 * se), (got, ml, se)


def test_the_same_seed_gives_the_same_fit():
    subjects = _theo_subjects()[:4]
    settings = dict(burn=4, em=4, chains=2)
    a = _theo_pop().fit(subjects, method=nl.SAEM(**settings, seed=5), covariance=False)
    b = _theo_pop().fit(subjects, method=nl.SAEM(**settings), seed=5, covariance=False)
    c = _theo_pop().fit(subjects, method=nl.SAEM(**settings, seed=6), covariance=False)
    np.testing.assert_array_equal(a._x, b._x)
    assert not np.array_equal(a._x, c._x)
    np.testing.assert_array_equal(a.saem.theta, b.saem.theta)


def test_a_fixed_theta_stays_and_max_iter_zero_evaluates_the_start():
    subjects = _theo_subjects()[:4]
    pop = _theo_pop()
    fit = pop.fit(subjects, method=nl.SAEM(burn=3, em=3), fixed=("tv",), covariance=False)
    assert fit.theta["tv"] == 3.45 and fit.theta["tka"] != 0.45
    start = pop.fit(subjects, method="saem", max_iter=0, covariance=False)
    assert start.theta == {"tka": 0.45, "tcl": 1.0, "tv": 3.45} and start.saem is None
    assert start.objective == pytest.approx(pop.objective(subjects, method="focei"))


def test_bad_saem_settings_name_the_argument():
    with pytest.raises(ValueError, match=r"SAEM: `burn` must be an int >= 0, got -1"):
        nl.SAEM(burn=-1)
    with pytest.raises(ValueError, match=r"SAEM: `chains` must be an int >= 1"):
        nl.SAEM(chains=0)
    with pytest.raises(ValueError, match=r"SAEM: `kernels` must be three counts"):
        nl.SAEM(kernels=(2, 2))
    with pytest.raises(ValueError, match=r"SAEM: `target` must be in \(0, 1\)"):
        nl.SAEM(target=1.5)
    with pytest.raises(ValueError, match=r"`burn` \+ `em` must be at least 1"):
        nl.SAEM(burn=0, em=0)
    subjects = _theo_subjects()[:2]
    with pytest.raises(ValueError, match=r"`seed` is the sampler's seed of method='saem'"):
        _theo_pop().fit(subjects, method="focei", seed=1)
    with pytest.raises(ValueError, match=r"method='saem' takes none"):
        import nets

        _theo_pop().fit(subjects, method="saem", stages=[nets.Adam(0.01, iters=5)])
    with pytest.raises(ValueError, match=r"`method` must be one of"):
        _theo_pop().objective(subjects, method="saem")  # SAEM has no objective of its own
