"""Event-table data as `sciml.nlme` reads it: replicates, missing DVs, subjects without
observations, censored records in nlmixr2's convention (``CENS``, ``LIMIT``), and initial
states that are individual parameters.

- Replicates are kept by default (NONMEM), refused on request.
- An observation record with DV missing warns, naming subject and CSV line.
- A subject with doses and no observations adds nothing to the objective: the same
  number as without it, with a warning.
- ``CENS = 1`` records (DV the limit) give the same M3 objective as censoring the plain
  data with ``lloq=``; an ``lloq`` column censors without ``CENS``; a simulation
  censors at the table's limits; what is not supported is refused by row.
- ``x(0) = x0`` (``read_events(initial=)`` or ``NLME(initial=)``) gives the objective and
  gradients of the same model rewritten with ``x = x0 r``, ``r(0) = 1``.
"""

import numpy as np
import pytest

import sciml
import sciml.nlme as nl
from sciml.data import read_events
from tests.sciml.test_nlme import DATA, THEO, _theo_individual

COMP = {1: "depot", 2: "central"}
THETA0 = [1.0, 1.0, 1.0]


def _rows(n=3):
    """theo_sd's first ``n`` subjects as a dict of columns."""
    import csv

    with open(DATA / "theo_sd_nlmixr2data.csv") as f:
        rows = [r for r in csv.DictReader(f) if int(r["ID"]) <= n]
    return {k: [float(r[k]) for r in rows] for k in rows[0]}


def _read(cols, **kw):
    return read_events(cols, THEO, COMP, "cp", params=THETA0, **kw)


def _pop():
    return nl.NLME(THEO, _theo_individual, theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
                   omega={"ka": 0.6, "cl": 0.3, "v": 0.1}, error={"cp": nl.Combined(0.5, 0.1)})


def test_replicates_are_kept_by_default_and_refused_on_request():
    cols = _rows(1)
    i = cols["TIME"].index(2.02)
    for k in cols:  # a second sample at 2.02 h
        cols[k].insert(i + 1, cols[k][i] if k != "DV" else 9.9)
    (s,) = _read(cols)
    assert s.data.t.shape == (12,) and np.sum(s.data.t == 2.02) == 2
    np.testing.assert_array_equal(s.data.y[s.data.t == 2.02, 0], [9.66, 9.9])
    with pytest.raises(ValueError, match=r"row 6, column 'DV': a second observation of 'cp' "
                                         r"at time 2.02 \(also at row 5\)"):
        _read(cols, duplicates="error")


def test_a_missing_dv_on_an_observation_record_warns_with_subject_and_line(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("ID,TIME,AMT,DV,EVID,CMT\n1,0,100,.,1,1\n1,1,0,2.0,0,2\n1,2,0,.,0,2\n"
                 "1,3,0,1.5,0,2\n2,0,100,.,1,1\n2,1,0,NA,0,2\n2,2,0,1.0,0,2\n")
    with pytest.warns(UserWarning, match=r"2 observation record\(s\) \(EVID 0, MDV not 1\) "
                                         r"have no DV and are left out: subject 1 line 4, "
                                         r"subject 2 line 7; set MDV = 1"):
        s1, s2 = _read(str(p))
    np.testing.assert_array_equal(s1.data.t, [1.0, 3.0])
    np.testing.assert_array_equal(s2.data.t, [2.0])


def test_a_subject_without_observations_contributes_nothing():
    cols = _rows(2)
    dosed = {k: cols[k][:1] for k in cols}  # subject 1's dose record only, as subject 3
    dosed["ID"] = [3.0]
    both = {k: cols[k] + dosed[k] for k in cols}
    with pytest.warns(UserWarning, match=r"1 subject\(s\) have no observations"):
        subjects = _read(both, tspan=(0.0, 25.0))
    assert subjects[2].data is None
    pop = _pop()
    with pytest.warns(UserWarning, match=r"1 subject\(s\) have no observations and "
                                         r"contribute nothing: 3"):
        with_it = pop.objective(subjects)
    assert with_it == pop.objective(subjects[:2])
    with pytest.warns(UserWarning, match="contribute nothing"):
        fit = pop.fit(subjects, max_iter=0, covariance=False)
    assert fit.ids == [1, 2] and fit.eta.shape == (2, 3)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="no subject has"):
        pop.objective(subjects[2:])


def _flagged(lloq, n=3):
    """theo_sd with nlmixr2's CENS: values below ``lloq`` replaced by it, CENS = 1."""
    cols = _rows(n)
    obs = np.array(cols["EVID"]) == 0
    below = obs & (np.array(cols["DV"]) < lloq)
    cols["CENS"] = below.astype(float).tolist()
    cols["DV"] = np.where(below, lloq, cols["DV"]).tolist()
    return cols, below


@pytest.mark.parametrize("method", ["focei", "laplace"])
def test_cens_records_give_the_m3_objective_of_lloq(method):
    cols, below = _flagged(4.0)
    assert 6 <= below.sum() <= 20
    subjects = _read(cols)
    assert sum(int(s.censored.sum()) for s in subjects) == below.sum()
    assert all(np.all(s.data.y[s.censored] == 4.0) for s in subjects)
    plain = _read(_rows(3))
    pop = _pop()
    ref = pop.objective(plain, method=method, lloq=4.0)
    assert pop.objective(subjects, method=method) == pytest.approx(ref, rel=1e-12)
    assert ref != pytest.approx(pop.objective(plain, method=method), rel=1e-3)
    cols["LIMIT"] = ["-Inf" if c else "." for c in cols["CENS"]]  # nlmixr2's default bound
    assert pop.objective(_read(cols), method=method) == pytest.approx(ref, rel=1e-12)
    # an lloq column (no CENS) censors what is below it, as lloq= in the fit does
    cols = _rows(3)
    cols["LLOQ"] = [4.0] * len(cols["ID"])
    assert pop.objective(_read(cols, lloq="LLOQ"), method=method) == \
        pytest.approx(ref, rel=1e-12)


def test_a_simulation_censors_at_the_tables_limits():
    # subject 1 flagged at 4 (CENS, DV the limit), subject 2 with an LLOQ column of 1
    cols, _ = _flagged(4.0, n=1)
    two = {k: v for k, v in _rows(2).items()}
    two = {k: [x for x, i in zip(v, two["ID"]) if i == 2] for k, v in two.items()}
    two["CENS"] = [0.0] * len(two["ID"])
    cols = {k: cols[k] + two[k] for k in cols}
    cols["LLOQ"] = [4.0 if i == 1 else 1.0 for i in cols["ID"]]
    subjects = _read(cols, lloq="LLOQ")
    sim = _pop().simulate(subjects, n=200, seed=1)
    for sid, limit in ((1, 4.0), (2, 1.0)):
        s = sim[sim["ID"] == sid]
        assert np.all(s["DV"] >= limit)
        c = s["CENS"] == 1
        assert np.all(s["DV"][c] == limit) and c.any()


def test_censoring_columns_refuse_what_is_not_supported_by_row():
    cols, below = _flagged(4.0, n=1)
    k = int(np.argmax(below))
    bad = {key: list(v) for key, v in cols.items()}
    bad["CENS"][k] = -1.0
    with pytest.raises(ValueError, match=rf"row {k}, column 'CENS': CENS = -1 \(above an "
                                         r"upper limit"):
        _read(bad)
    bad["CENS"][k] = 2.0
    with pytest.raises(ValueError, match=rf"row {k}, column 'CENS': CENS must be 0, 1"):
        _read(bad)
    bad = {key: list(v) for key, v in cols.items()}
    bad["LIMIT"] = [0.0] * len(bad["ID"])
    with pytest.raises(ValueError, match=rf"row {k}, column 'LIMIT': LIMIT 0.0 \(a finite "
                                         r"lower end"):
        _read(bad)
    bad = {key: list(v) for key, v in cols.items()}
    bad["DV"][k] = float("nan")
    with pytest.raises(ValueError, match=rf"row {k}, column 'DV': a censored record "
                                         r"\(CENS = 1\) needs its limit"):
        _read(bad)
    bad["LLOQ"] = [4.0] * len(bad["ID"])  # the limit from the lloq column instead
    (s,) = _read(bad, lloq="LLOQ")
    assert s.data.y[s.censored].tolist() == [4.0] * int(below.sum())
    bad = {key: list(v) for key, v in cols.items()}
    for key in bad:  # a censored replicate
        bad[key].insert(k + 1, bad[key][k])
    with pytest.raises(ValueError, match=r"a censored replicate of 'cp'.*duplicates='keep'"):
        _read(bad, duplicates="mean")
    with pytest.raises(ValueError, match=r"`censored` column 'BLQ' is not in the table"):
        _read(cols, censored="BLQ")
    with pytest.raises(TypeError, match=r"`lloq` must be a column name or a number"):
        _read(cols, lloq=[1.0])
    with pytest.warns(UserWarning, match="covariates change within a subject.*CENS"):
        (s,) = _read(cols, censored=False)  # CENS read as a covariate, nothing censored
    assert s.censored is None and "CENS" in s.covariates


# ---------------------------------------------------------------- initial states


def _decay(u, p, t):
    return [-p.k * u.x]


DECAY = sciml.Model(_decay, ["x"], ["k", "x0"], observables={"y": lambda u, p: u.x})
# the same predictions written the way the issue describes: x = x0 r with r(0) = 1
SCALED = sciml.Model(lambda u, p, t: [-p.k * u.r], ["r"], ["k", "x0"],
                     observables={"y": lambda u, p: p.x0 * u.r})


def _decay_table():
    rng = np.random.default_rng(4)
    cols = {k: [] for k in ("ID", "TIME", "DV", "AMT", "EVID")}
    for i in range(3):
        for t in (0.5, 1.0, 2.0, 4.0):
            for k, v in zip(cols, (i + 1, t, 10 * np.exp(-0.3 * t) * np.exp(
                    0.2 * rng.normal()), 0.0, 0)):
                cols[k].append(v)
    return cols


def test_initial_states_that_are_individual_parameters():
    # x(0) = x0 with x0 = exp(tx0 + eta.x0): read_events(initial=) and NLME(initial=) give
    # the objective and exact gradient of the rewritten model (x0 as a scale of r(0) = 1)
    def ind(theta, eta, cov):
        return {"k": np.exp(theta.tk + eta.k), "x0": np.exp(theta.tx0 + eta.x0)}

    kw = dict(theta={"tk": -1.0, "tx0": 2.2}, omega={"k": 0.1, "x0": 0.05},
              error={"y": nl.Proportional(0.2)})
    table = _decay_table()
    read = read_events(table, DECAY, {1: "x"}, "y", params=[0.3, 1.0], tspan=(0.0, 4.0),
                       initial={"x": "x0"})
    assert read[0].problem.u0_function is not None
    plain = read_events(table, DECAY, {1: "x"}, "y", params=[0.3, 1.0], tspan=(0.0, 4.0))
    scaled = read_events(table, SCALED, {1: "r"}, "y", params=[0.3, 1.0], tspan=(0.0, 4.0),
                         u0=[1.0])
    ref = nl.NLME(SCALED, ind, **kw)
    ref_fits = ref.prepare(scaled)
    x = ref._start(None) + 0.05
    for pop, subjects in ((nl.NLME(DECAY, ind, **kw), read),
                          (nl.NLME(DECAY, ind, initial={"x": lambda p: p.x0}, **kw), plain)):
        fits = pop.prepare(subjects)
        for method in ("focei", "laplace"):
            v, _, parts = pop._objective_and_gradient(fits, x, pop._zero_etas(fits), method)
            v_ref, _, parts_ref = ref._objective_and_gradient(ref_fits, x,
                                                              ref._zero_etas(ref_fits), method)
            assert v == pytest.approx(v_ref, abs=1e-6)
            np.testing.assert_allclose(pop.gradient_x(x, parts), ref.gradient_x(x, parts_ref),
                                       rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="`initial` names 'y', not a state of the model"):
        nl.NLME(DECAY, ind, initial={"y": "x0"}, **kw)
    with pytest.raises(ValueError, match=r"`initial\['x'\]` is 'v', not a parameter"):
        read_events(table, DECAY, {1: "x"}, "y", params=[0.3, 1.0], initial={"x": "v"})
    with pytest.raises(ValueError, match="has initial values as a function already"):
        nl.NLME(DECAY, ind, initial={"x": "x0"}, **kw).prepare(read)
