"""`sciml.nlme` with covariates that change in time and with occasions (IOV).

- A model linear in the random effects whose slope follows a time-varying covariate
  and whose intercept has an effect per occasion has an exact Gaussian likelihood
  (the covariate integrated piece by piece; a compound-symmetric covariance within an
  occasion); every method must reproduce it, reading the covariate LOCF or NOCB.
- The exact gradients of FO, FOCE, FOCE-I and Laplace with both, against central
  differences of the objective.
- Populations simulated with the engine's own parameter changes (`sciml.Change`, not
  the population code) are recovered within 3 SE (omegas within 50%); reading the
  weight as its first value instead is biased.
"""

import csv
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import sciml
import sciml.nlme as nl
from sciml.data import read_events

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"


def _line(u, p, t):
    return [p.b]


LINE = sciml.Model(_line, ["x"], ["a", "b"], observables={"y": lambda u, p: p.a + u.x})
T_OBS = np.array([0.5, 1.0, 2.0, 2.5, 3.0, 4.0])
W_AT = np.array([0.0, 1.5, 3.0])  # the covariate's records (EVID 2), OCC 2 from t = 2.2


def _line_table(n=5, seed=3):
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("ID", "TIME", "DV", "AMT", "EVID", "W", "OCC")}
    for i in range(n):
        w = [1.0, 1.5 + 0.1 * i, 0.7]
        rows = [(t, np.nan, 2) for t in (0.0, 1.5, 2.2, 3.0)]
        rows += [(t, 1.0 + 0.3 * t + 0.2 * rng.normal(), 0) for t in T_OBS]
        rows.sort(key=lambda r: (r[0], r[2] == 0))
        for t, dv, evid in rows:
            for k, v in zip(cols, (i + 1, t, dv, 0.0, evid,
                                   w[int(np.searchsorted(W_AT, t, side="right")) - 1],
                                   1 if t < 2.2 else 2)):
                cols[k].append(v)
    return cols


def _line_exact(subjects, om, sd, pi):
    """-2 log-likelihood (no n log 2 pi) of y = (ta + eta_a + kappa_occ) + (tb + eta_b) C(t),
    C(t) the integral of the covariate's step function, ta = 0.8, tb = 0.2."""
    total = 0.0
    for s in subjects:
        t, y = s.data.t, s.data.y[:, 0]
        times, vals = s.covariate_series["W"]
        edges = np.append(times, np.inf)
        C = np.array([sum(v * max(0.0, min(tt, hi) - lo)
                          for lo, hi, v in zip(edges[:-1], edges[1:], vals)) for tt in t])
        Z = np.column_stack([np.ones_like(t), C])
        occ = (t >= 2.2).astype(int)
        cov = Z @ om @ Z.T + sd**2 * np.eye(len(t)) + pi * (occ[:, None] == occ[None, :])
        total += -2 * stats.multivariate_normal(0.8 + 0.2 * C, cov).logpdf(y) \
            - len(t) * np.log(2 * np.pi)
    return total


def _line_individual(theta, eta, cov):
    return {"a": theta.ta + eta.a, "b": (theta.tb + eta.b) * cov.W}


@pytest.mark.parametrize("method", ["fo", "foce", "focei", "laplace"])
def test_time_varying_covariates_and_occasions_are_exact_for_a_linear_model(method):
    om = np.array([[0.3, 0.02], [0.02, 0.05]])
    kw = dict(theta={"ta": 0.8, "tb": 0.2}, omega={("a", "b"): om},
              error={"y": nl.Additive(0.15)})
    for interpolation in ("locf", "nocb"):
        subjects = read_events(_line_table(), LINE, {1: "x"}, "y", params=[0.0, 0.0],
                               tspan=(0.0, 4.0), time_varying=True,
                               interpolation=interpolation)
        assert subjects[0].covariate_series["OCC"][0].tolist() == [0.0, 2.2]  # always LOCF
        plain = nl.NLME(LINE, _line_individual, **kw)
        assert plain.objective(subjects, method=method) == pytest.approx(
            _line_exact(subjects, om, 0.15, 0.0), rel=1e-9)
        iov = nl.NLME(LINE, _line_individual, iov={"a": 0.04}, occasion="OCC", **kw)
        assert iov.objective(subjects, method=method) == pytest.approx(
            _line_exact(subjects, om, 0.15, 0.04), rel=1e-9)
        assert iov.objective(subjects, method=method, iov={"a": 0.1}) == pytest.approx(
            _line_exact(subjects, om, 0.15, 0.1), rel=1e-9)


# ---------------------------------------------------------------- a nonlinear model


def _one_cpt(u, p, t):
    return [-p.ka * u.depot, p.ka * u.depot - p.cl / p.v * u.central]


THEO = sciml.Model(_one_cpt, ["depot", "central"], ["ka", "cl", "v"],
                   observables={"cp": lambda u, p: u.central / p.v})
COMP = {1: "depot", 2: "central"}


def _individual(theta, eta, cov):
    return {"ka": np.exp(theta.tka + eta.ka),
            "cl": np.exp(theta.tcl + eta.cl) * (cov.WT / 70) ** 0.75,
            "v": np.exp(theta.tv + eta.v)}


def _theo_changing(n):
    """theo_sd's first ``n`` subjects, their weight 15% lower from t = 4 and a second
    occasion from t = 8."""
    with open(DATA / "theo_sd_nlmixr2data.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if int(r["ID"]) <= n]
    cols = {k: [] for k in ("ID", "TIME", "DV", "AMT", "EVID", "CMT", "WT", "OCC")}
    for r in rows:
        t = float(r["TIME"])
        for k in ("ID", "TIME", "DV", "AMT", "EVID", "CMT"):
            cols[k].append(float(r[k]))
        cols["WT"].append(float(r["WT"]) * (0.85 if t >= 4.0 else 1.0))
        cols["OCC"].append(1 if t < 8.0 else 2)
    return read_events(cols, THEO, COMP, "cp", params=[1.0, 1.0, 1.0], time_varying=True,
                       covariates=["WT"])


@pytest.mark.parametrize("method", ["fo", "foce", "focei", "laplace"])
def test_gradients_with_time_varying_covariates_and_occasions(method):
    err = nl.Combined(0.5, 0.1)
    pop = nl.NLME(THEO, _individual, theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
                  omega={"ka": 0.6, ("cl", "v"): [[0.3, 0.05], [0.05, 0.1]]},
                  error={"cp": err}, ebe_tol=1e-26, iov={"cl": 0.05, "v": 0.02})
    subjects = _theo_changing(2)
    fits = pop.prepare(subjects, rtol=1e-11, atol=1e-12)
    assert [len(f.pieces) for f in fits] == [3, 3] and [f.n_occ for f in fits] == [2, 2]
    x = pop.pack(pop.theta0, [m for _, m in pop.packed_blocks], np.array(err.sd)) + 0.01
    value, etas, parts = pop._objective_and_gradient(fits, x, pop._zero_etas(fits), method)
    g = pop.gradient_x(x, parts)
    h = 1e-4 if method == "laplace" else 1e-5
    fd = np.empty(x.shape[0])
    for i in range(x.shape[0]):
        d = np.zeros_like(x)
        d[i] = h
        fd[i] = (pop._objective(fits, x + d, method, etas)[0]
                 - pop._objective(fits, x - d, method, etas)[0]) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-5 * np.max(np.abs(fd)))


# ---------------------------------------------------------------- simulated truth

TIMES = np.array([0.5, 1.0, 2.0, 4.0, 6.0, 9.0, 12.0])
TRUTH = {"tka": 0.3, "tcl": 1.0, "tv": 3.4}
OMEGA = np.array([0.3, 0.09, 0.03])


def _simulated(n, seed, occasions):
    """A population simulated by `sciml.solve` with `sciml.Change` (independent of the
    population code): weight halved at t = 6 (``occasions`` False), or a second dose at
    t = 24 in a second occasion with its own clearance effect (variance 0.04)."""
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("ID", "TIME", "DV", "AMT", "EVID", "CMT", "WT", "OCC")}
    for i in range(n):
        wt0 = rng.uniform(50.0, 100.0)
        ka, cl, v = np.exp(np.array(list(TRUTH.values())) + rng.normal(size=3) * np.sqrt(OMEGA))
        if occasions:
            k1, k2 = 0.2 * rng.normal(size=2)
            c1, c2 = cl * np.exp(k1) * (wt0 / 70) ** 0.75, cl * np.exp(k2) * (wt0 / 70) ** 0.75
            doses, t_end, switch = [sciml.Bolus(0.0, 320.0, "depot"),
                                    sciml.Bolus(24.0, 320.0, "depot")], 36.0, 24.0
            times = np.concatenate([TIMES, 24.0 + TIMES])
            wt = np.full(times.shape, wt0)
        else:
            c1, c2 = cl * (wt0 / 70) ** 0.75, cl * (wt0 / 2 / 70) ** 0.75
            doses, t_end, switch = [sciml.Bolus(0.0, 320.0, "depot")], 12.0, 6.0
            times, wt = TIMES, np.where(TIMES < 6.0, wt0, wt0 / 2)
        prob = sciml.ODEProblem(THEO, [0.0, 0.0], (0.0, t_end), [ka, c1, v], doses=doses,
                                changes=[sciml.Change(time=switch, params={"cl": c2})])
        cp = sciml.solve(prob, rtol=1e-10, atol=1e-10, saveat=times).u[:, 1] / v
        dv = cp + 0.4 * rng.normal(size=cp.shape)
        recs = [(d.time, np.nan, d.amount, 1, 1, wt0, 1 + (d.time >= 24.0)) for d in doses]
        recs += [(t, y, 0.0, 0, 2, w, 1 + (t >= 24.0)) for t, y, w in zip(times, dv, wt)]
        recs.sort(key=lambda r: (r[0], r[3] == 0))
        for rec in recs:
            for k, v_ in zip(cols, (i + 1,) + rec):
                cols[k].append(v_)
    return cols


def _start():
    return dict(theta={"tka": 0.0, "tcl": 0.5, "tv": 3.0},
                omega={"ka": 0.5, "cl": 0.2, "v": 0.1}, error={"cp": nl.Additive(1.0)})


def test_a_time_varying_weight_is_recovered_and_its_first_value_is_biased():
    table = _simulated(30, 2, occasions=False)
    subjects = read_events(table, THEO, COMP, "cp", params=[1.0] * 3, time_varying=True,
                           covariates=["WT"])
    fit = nl.NLME(THEO, _individual, **_start()).fit(subjects, method="focei")
    for name, truth in TRUTH.items():
        assert abs(fit.theta[name] - truth) < 3 * fit.se[name], name
    np.testing.assert_allclose(np.diag(fit.omega), OMEGA, rtol=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first value used: read_events says so
        first = read_events(table, THEO, COMP, "cp", params=[1.0] * 3, covariates=["WT"])
    biased = nl.NLME(THEO, _individual, **_start()).fit(first, method="focei",
                                                        covariance=False)
    assert abs(biased.theta["tcl"] - TRUTH["tcl"]) > 3 * fit.se["tcl"]


def test_occasions_recover_the_simulated_truth():
    subjects = read_events(_simulated(30, 5, occasions=True), THEO, COMP, "cp",
                           params=[1.0] * 3, covariates=["WT"])
    assert all(s.covariate_series["OCC"][0].tolist() == [0.0, 24.0] for s in subjects)
    pop = nl.NLME(THEO, _individual, iov={"cl": 0.1}, **_start())
    fit = pop.fit(subjects, method="focei")
    for name, truth in TRUTH.items():
        assert abs(fit.theta[name] - truth) < 3 * fit.se[name], name
    np.testing.assert_allclose(np.diag(fit.omega), OMEGA, rtol=0.5)
    assert fit.iov[0, 0] == pytest.approx(0.04, rel=0.5)
    assert np.isfinite(fit.se["iov.cl"]) and len(fit.eta_occasion) == 30
    assert fit.eta_occasion[0].shape == (2, 1)
    sim = pop.simulate(subjects[:3], theta=fit.theta, omega=fit.omega, sigma=fit.sigma,
                       iov=fit.iov, n=2, seed=0)
    assert set(sim["OCC"]) == {1, 2} and "iov.cl" in sim


def test_occasion_input_is_checked():
    kw = _start()
    with pytest.raises(ValueError, match="`occasion` names the occasion column of `iov`"):
        nl.NLME(THEO, _individual, occasion="OCC", **kw)
    with pytest.raises(TypeError, match="`iov` must be a non-empty dict"):
        nl.NLME(THEO, _individual, iov=[0.1], **kw)
    subjects = _theo_changing(1)
    pop = nl.NLME(THEO, _individual, iov={"cl": 0.1}, occasion="VISIT", **kw)
    with pytest.raises(ValueError, match="no occasion column 'VISIT'"):
        pop.prepare(subjects)
    with pytest.raises(ValueError, match="method='saem' does not take occasions"):
        nl.NLME(THEO, _individual, iov={"cl": 0.1}, **kw).fit(subjects, method="saem")
    with pytest.raises(ValueError, match="`iov` given, but the model has no occasions"):
        nl.NLME(THEO, _individual, **kw).objective(subjects, iov={"cl": 0.1})
