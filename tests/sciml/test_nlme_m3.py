"""`sciml.nlme` with observations below a limit of quantification (Beal's M3).

- The M3 objective's exact gradients (FOCE-I and Laplace, additive and combined errors)
  against central differences of the objective.
- A simulated population with known truth, a quarter of its observations below the LLOQ:
  fitted with M3, the thetas are within 3 SE of the truth; fitted with the censored rows
  dropped, on the same data, they are further from it.
- The table marks the censored rows; FO, FOCE and SAEM refuse them by name.
"""

import numpy as np
import pytest

import sciml
import sciml.nlme as nl
from sciml.data import read_events
from tests.sciml.test_nlme import THEO, _check_gradient, _theo_individual, _theo_subjects


@pytest.mark.parametrize("error", [nl.Additive(0.7), nl.Combined(0.5, 0.1)])
@pytest.mark.parametrize("method", ["focei", "laplace"])
def test_the_m3_gradient_agrees_with_central_differences(method, error):
    kw = dict(theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
              omega={"ka": 0.6, ("cl", "v"): [[0.3, 0.05], [0.05, 0.1]]},
              error={"cp": error}, ebe_tol=1e-26)
    pop = nl.NLME(THEO, _theo_individual, **kw)
    subjects = _theo_subjects()[:3]
    fits = pop.prepare(subjects, lloq=4.0)
    n_cens = sum(int(sf.cens.sum()) for sf in fits if sf.cens is not None)
    assert 6 <= n_cens <= 20  # early and late samples of each subject
    x = pop.pack(pop.theta0, [m for _, m in pop.blocks], np.array(error.sd)) + 0.01
    _check_gradient(pop, subjects, x, method, lloq=4.0)


TIMES = [0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0]
TRUTH = {"tka": 0.45, "tcl": 1.0, "tv": 3.45}


def _simulated(n, seed, sd=0.4):
    """theo_sd's design (320 mg, 10 samples) from known thetas, omega 0.4 / 0.07 / 0.02."""
    rng = np.random.default_rng(seed)
    th, om = np.array(list(TRUTH.values())), np.sqrt([0.4, 0.07, 0.02])
    cols = {"ID": [], "TIME": [], "DV": [], "AMT": [], "EVID": [], "CMT": []}
    for i in range(n):
        ka, cl, v = np.exp(th + om * rng.normal(size=3))
        prob = sciml.ODEProblem(THEO, [320.0, 0.0], (0.0, 24.0), [ka, cl, v])
        cp = sciml.solve(prob, rtol=1e-10, atol=1e-10, saveat=np.array(TIMES)).u[:, 1] / v
        dv = cp + sd * rng.normal(size=len(TIMES))
        for col, v0 in zip(cols, (i + 1, 0.0, 0.0, 320.0, 101, 1)):
            cols[col].append(v0)
        for col, vals in zip(cols, (i + 1, TIMES, dv, 0.0, 0, 2)):
            cols[col] += list(np.broadcast_to(vals, len(TIMES)))
    return cols


def _pop():
    return nl.NLME(THEO, _theo_individual, theta={"tka": 0.3, "tcl": 0.8, "tv": 3.2},
                   omega={"ka": 0.3, "cl": 0.1, "v": 0.05}, error={"cp": nl.Additive(0.5)})


def test_m3_recovers_the_truth_where_dropping_the_censored_rows_is_biased():
    lloq = 4.0
    rows = _simulated(40, seed=1)
    dv, obs = np.array(rows["DV"]), np.array(rows["EVID"]) == 0
    assert 0.2 < np.mean(dv[obs] < lloq) < 0.3  # 26% below the LLOQ
    comp = {1: "depot", 2: "central"}
    subjects = read_events(rows, THEO, comp, "cp", params=[1.0, 1.0, 1.0])
    kept = {k: [v for v, d, o in zip(rows[k], dv, obs) if not o or d >= lloq] for k in rows}
    m3 = _pop().fit(subjects, method="focei", lloq=lloq)
    dropped = _pop().fit(read_events(kept, THEO, comp, "cp", params=[1.0, 1.0, 1.0]),
                         method="focei")
    z_m3 = np.array([(m3.theta[k] - v) / m3.se[k] for k, v in TRUTH.items()])
    z_drop = np.array([(dropped.theta[k] - v) / dropped.se[k] for k, v in TRUTH.items()])
    assert np.all(np.abs(z_m3) < 3.0), z_m3
    assert np.sum(np.abs(z_m3)) < 0.6 * np.sum(np.abs(z_drop)), (z_m3, z_drop)
    # dropping the low late concentrations makes clearance look smaller
    assert dropped.theta["tcl"] < m3.theta["tcl"]
    table = m3.table
    assert int(table["CENS"].sum()) == int(np.sum(dv[obs] < lloq))
    assert np.all(table["DV"][table["CENS"] == 1] == lloq)


def test_censored_observations_are_refused_where_the_likelihood_is_gaussian():
    subjects = _theo_subjects()[:2]
    pop = nl.NLME(THEO, _theo_individual, theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
                  omega={"ka": 0.6, "cl": 0.3, "v": 0.1}, error={"cp": nl.Additive(0.7)})
    for method in ("fo", "foce"):
        with pytest.raises(ValueError, match=rf"below the LLOQ.*method='{method}'"):
            pop.objective(subjects, method=method, lloq=4.0)
    with pytest.raises(ValueError, match=r"method='saem' does not take observations below"):
        pop.fit(subjects, method="saem", lloq=4.0)
    with pytest.raises(ValueError, match=r"`lloq` names 'conc', not an observed quantity"):
        pop.objective(subjects, lloq={"conc": 1.0})
    with pytest.raises(TypeError, match=r"`lloq\['cp'\]` must be a number"):
        pop.objective(subjects, lloq="low")
    # no observation below the limit: the objective is the uncensored one
    assert pop.objective(subjects, lloq=-1.0) == pop.objective(subjects)
