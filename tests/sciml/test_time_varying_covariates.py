"""`read_events(time_varying=True)`: covariates that change within a subject.

A hand-made table (one subject whose weight changes from 70 to 90 kg at its 5 h
record, one constant) read with LOCF and NOCB: the step functions, the
`sciml.Change` segments a rule ``WT="WT"`` makes, the subject's solution
against the closed form of one-compartment elimination with allometric
clearance, the gradient of its loss (GaussAdjoint, the default) against
central finite differences, a fit recovering the parameters, and the errors
(callable rules and `params` that would freeze a time-varying value,
bad options); `sciml.nlme` following the covariate either way; replicate rows in
`loss_and_grad` counted each.
"""

import math
import warnings

import numpy as np
import pytest

import adjoints
import sciml
import sciml.nlme as nl
from sciml.data import read_events

try:
    import pandas as pd
except ImportError:  # the reader itself does not need pandas
    pd = None


def elim(u, p, t):
    # clearance scales allometrically with the weight, a parameter of the model
    return [-p.CL * (p.WT / 70.0) ** 0.75 / p.V * u.central]


MODEL = sciml.Model(elim, states=["central"], params=["CL", "V", "WT"],
                    observables={"conc": lambda u, p: u.central / p.V})
THETA = MODEL.init_params(CL=2.0, V=10.0, WT=70.0)
DOSE = 100.0


def frame(**cols):
    return pd.DataFrame(cols) if pd is not None else cols


def table(**over):
    """Subject 1: WT 70 until its 5 h record, then 90 (missing at 8 h: no record of it);
    subject 2: 55 throughout."""
    cols = dict(ID=[1] * 7 + [2] * 3,
                TIME=[0.0, 1.0, 2.0, 5.0, 6.0, 8.0, 10.0, 0.0, 2.0, 4.0],
                AMT=[DOSE, 0, 0, 0, 0, 0, 0, DOSE, 0, 0],
                DV=[".", 6.0, 4.0, 1.0, 0.7, 0.3, 0.1, ".", 5.0, 3.0],
                EVID=[1, 0, 0, 0, 0, 0, 0, 1, 0, 0],
                WT=[70.0, 70, 70, 90, 90, ".", 90, 55, 55, 55])
    cols.update(over)
    return frame(**cols)


def read(tab=None, **kw):
    kw.setdefault("params", THETA)
    return read_events(table() if tab is None else tab, MODEL, {1: "central"}, "conc", **kw)


def closed_form(t, t_change, w0=70.0, w1=90.0, CL=2.0, V=10.0):
    """Amount in central: first-order elimination whose rate steps at ``t_change``."""
    k0, k1 = (CL * (w / 70.0) ** 0.75 / V for w in (w0, w1))
    a_c = DOSE * math.exp(-k0 * t_change)
    t = np.asarray(t)
    return np.where(t < t_change, DOSE * np.exp(-k0 * t), a_c * np.exp(-k1 * (t - t_change)))


def test_locf_and_nocb_step_functions_and_changes():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # followed in time: no "first value" warning
        locf = read(time_varying=True, covariate_params={"WT": "WT"})
        nocb = read(time_varying=True, interpolation="nocb", covariate_params={"WT": "WT"})
    # LOCF: 90 from the 5 h record on; NOCB: the 5 h record's 90 from the 2 h record on
    for subs, t_change in ((locf, 5.0), (nocb, 2.0)):
        s, other = subs
        times, values = s.covariate_series["WT"]
        np.testing.assert_array_equal(times, [0.0, t_change])
        np.testing.assert_array_equal(values, [70.0, 90.0])
        assert s.covariates == {"WT": 70.0} and s.problem.params[2] == 70.0
        assert s.problem.changes == (sciml.Change(t_change, {"WT": 90.0}),)
        assert s.covariates_at(t_change - 1e-9)["WT"] == 70.0
        assert s.covariates_at(t_change)["WT"] == 90.0  # right-continuous
        assert s.covariates_at(50.0)["WT"] == 90.0
        # constant within subject 2: one value, no series, no changes
        assert other.covariate_series == {} and other.problem.changes == ()
        assert other.covariates == {"WT": 55.0} and other.problem.params[2] == 55.0
    # the default (and False) keep the first value, with a warning
    for tv in ("first", False):
        with pytest.warns(UserWarning, match=r"change within a subject.*WT \(subjects 1\)"):
            first = read(time_varying=tv, covariate_params={"WT": "WT"})
        assert first[0].problem.changes == () and first[0].covariate_series == {}


def test_records_at_one_time_leading_missing_and_nocb_after_the_last():
    # two records at 5 h (85 then 90); no weight before the 2 h record
    tab = table(TIME=[0.0, 1.0, 2.0, 5.0, 5.0, 8.0, 10.0, 0.0, 2.0, 4.0],
                EVID=[1, 0, 0, 2, 0, 0, 0, 1, 0, 0],
                DV=[".", 6.0, 4.0, ".", 1.0, 0.3, 0.1, ".", 5.0, 3.0],
                WT=[".", ".", 70, 85, 90, 90, 100, 55, 55, 55])
    s = read(tab, time_varying=True)[0]
    # LOCF: the last record at 5 h counts; before the first value, the first value
    times, values = s.covariate_series["WT"]
    np.testing.assert_array_equal(times, [2.0, 5.0, 10.0])
    np.testing.assert_array_equal(values, [70.0, 90.0, 100.0])
    assert s.covariates["WT"] == 70.0
    # NOCB: the first record at 5 h applies while advancing to 5 h (from 2 h), the 8 h
    # record's 90 from 5 h, the last (100) from 8 h and after
    s = read(tab, time_varying=True, interpolation="nocb")[0]
    times, values = s.covariate_series["WT"]
    np.testing.assert_array_equal(times, [2.0, 5.0, 8.0])
    np.testing.assert_array_equal(values, [85.0, 90.0, 100.0])
    assert s.covariates["WT"] == 85.0
    # a change at the end of the span cannot act: not a Change (the open interval)
    last = read(tab, time_varying=True, covariate_params={"WT": "WT"})[0]
    assert last.problem.changes == (sciml.Change(5.0, {"WT": 90.0}),)


def test_occasions_take_the_value_at_their_start_and_a_given_tspan():
    tab = table(EVID=[1, 0, 0, 0, 4, 0, 0, 1, 0, 0], AMT=[DOSE, 0, 0, 0, DOSE, 0, 0, DOSE, 0, 0],
                DV=[".", 6.0, 4.0, 1.0, ".", 0.3, 0.1, ".", 5.0, 3.0])
    a, b = read(tab, time_varying=True, reset="split", covariate_params={"WT": "WT"})[:2]
    assert a.problem.tspan == (0.0, 5.0) and a.problem.changes == ()  # 5 h is its end
    assert b.problem.tspan == (6.0, 10.0) and b.covariates["WT"] == 90.0
    assert b.problem.params[2] == 90.0 and b.problem.changes == ()
    longer = read(time_varying=True, tspan=(0.0, 12.0), covariate_params={"WT": "WT"})[0]
    assert longer.problem.changes == (sciml.Change(5.0, {"WT": 90.0}),)


@pytest.mark.parametrize("interpolation, t_change", [("locf", 5.0), ("nocb", 2.0)])
def test_subject_solves_to_the_closed_form(interpolation, t_change):
    s = read(time_varying=True, interpolation=interpolation, covariate_params={"WT": "WT"})[0]
    ts = np.linspace(0.0, 10.0, 41)  # a point on the change time too
    sol = sciml.solve(s.problem, sciml.Tsit5(), saveat=ts, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sol.u[:, 0], closed_form(ts, t_change), rtol=1e-8, atol=1e-10)
    # the same subject read without the rule, then given it: the same problem
    bare = read(time_varying=True, interpolation=interpolation)[0]
    assert bare.problem.changes == ()
    ruled = bare.with_params(THETA, WT="WT")
    assert ruled.problem.changes == s.problem.changes
    np.testing.assert_array_equal(ruled.problem.params, s.problem.params)
    assert ruled.covariate_series is bare.covariate_series


def _subject_and_data():
    s = read(time_varying=True, covariate_params={"WT": "WT"})[0]
    y = closed_form(s.data.t, 5.0) / 10.0 * (1 + 0.05 * np.cos(np.arange(s.data.t.size)))
    return s, sciml.Data(t=s.data.t, y=y[:, None], observables=["conc"])


def test_loss_gradient_against_central_differences():
    s, data = _subject_and_data()
    th = np.array([2.3, 9.0, 72.0])  # WT: its value before the change (the later is data)

    def value(p):
        return sciml.loss_value(s.problem, data, params=p, rtol=1e-12, atol=1e-12)

    h = 1e-5 * np.abs(th)
    fd = np.array([(value(th + e) - value(th - e)) / (2 * e[k]) for k, e in
                   enumerate(np.diag(h))])
    for sensealg in (adjoints.GaussAdjoint(), None):  # None: the default picks an adjoint
        v, g = sciml.loss_and_grad(s.problem.remake(params=th), data, sensealg=sensealg,
                                   rtol=1e-12, atol=1e-12)
        assert v == pytest.approx(value(th), rel=1e-10)
        np.testing.assert_allclose(g, fd, rtol=1e-6)
    assert abs(fd[2]) > 1e-6  # the weight before the change matters


def test_fit_recovers_the_parameters():
    s, _ = _subject_and_data()
    truth = s.problem.params.copy()
    sol = sciml.solve(s.problem, sciml.Tsit5(), saveat=s.data.t, rtol=1e-10, atol=1e-12)
    data = sciml.Data(t=s.data.t, y=sol.u / 10.0, observables=["conc"])
    res = sciml.fit(s.problem, data, optimizers=[sciml.LBFGS(iters=200)],
                    params=np.array([2.5, 8.0, 60.0]), rtol=1e-10, atol=1e-10,
                    progress=False)
    np.testing.assert_allclose(res.params, truth, rtol=1e-4)


def test_errors():
    with pytest.raises(ValueError, match=r"read_events: `interpolation` must be one of "
                                         r"\('locf', 'nocb'\), got 'linear'"):
        read(time_varying=True, interpolation="linear")
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="read_events: `time_varying` must be True, False, "
                                             f"'first' or 'error', got {bad!r}"):
            read(time_varying=bad)
    with pytest.raises(ValueError, match=r"row 3, column 'WT': covariate changes within "
                                         r"subject .*True to follow it in time"):
        read(time_varying="error")
    # a callable rule would freeze its value into a number at each change
    with pytest.raises(ValueError, match=r"covariate rule for 'V': its value changes at t = 5 "
                                         r"for subject 1 .*V='COV'"):
        read(time_varying=True, covariate_params={"V": lambda V, c: V * c["WT"] / 70})
    ok = read(time_varying=True, covariate_params={"V": lambda V, c: 2 * V})  # no WT: fine
    assert ok[0].problem.changes == () and ok[0].problem.params[1] == 20.0
    bare = read(time_varying=True)[0]
    with pytest.raises(ValueError, match="covariate rule for 'CL': its value changes"):
        bare.with_params(THETA, CL=lambda CL, c: CL * c["WT"] / 70)
    with pytest.raises(ValueError, match=r"read_events: `params` \(a function of the "
                                         r"covariates\) changes at t = 5 for subject 1"):
        read(time_varying=True, params=lambda c: MODEL.init_params(CL=2.0, V=10.0, WT=c["WT"]))


def test_nlme_follows_time_varying_covariates_either_way():
    # individual() reading cov.WT in time, or the problem's own changes from the rule
    # WT="WT" (individual() leaving WT alone): the same pieces, the same objective
    def reads(theta, eta, cov):
        return {"CL": np.exp(theta.tcl + eta.cl), "WT": cov.WT}

    def leaves(theta, eta, cov):
        return {"CL": np.exp(theta.tcl + eta.cl)}

    kw = dict(theta={"tcl": math.log(2.0)}, omega={"cl": 0.1}, error={"conc": nl.Additive(0.1)})
    bare, ruled = read(time_varying=True), read(time_varying=True, covariate_params={"WT": "WT"})
    a = nl.NLME(MODEL, reads, **kw).objective(bare)
    assert nl.NLME(MODEL, leaves, **kw).objective(ruled) == pytest.approx(a, rel=1e-7)
    with pytest.warns(UserWarning, match="their first value is used"):
        first = nl.NLME(MODEL, reads, **kw).objective(read())
    assert abs(first - a) > 1.0  # the weight's change matters
    with pytest.raises(ValueError, match=r"NLME: subject 1 has a sciml.Change of 'WT' at "
                                         r"t = 5, a parameter `individual` sets"):
        nl.NLME(MODEL, reads, **kw).prepare(ruled)


def test_replicates_count_each_row_in_loss_and_grad():
    # rows sharing a time are each an observation: the loss and gradient of the data split
    # in two (one row of each time in each), through changes and without them
    s, data = _subject_and_data()
    t, y = data.t, data.y[:, 0]
    both = sciml.Data(t=np.repeat(t, 2), y=np.stack([y, 1.1 * y], axis=1).reshape(-1, 1),
                      observables=["conc"], repeated_times=True)
    halves = [sciml.Data(t=t, y=(c * y)[:, None], observables=["conc"]) for c in (1.0, 1.1)]
    th = np.array([2.3, 9.0, 72.0])
    for prob in (s.problem.remake(params=th), s.problem.remake(params=th, changes=())):
        v, g = sciml.loss_and_grad(prob, both, rtol=1e-10, atol=1e-12)
        parts = [sciml.loss_and_grad(prob, d, rtol=1e-10, atol=1e-12) for d in halves]
        assert v == pytest.approx(sum(p[0] for p in parts), rel=1e-12)
        np.testing.assert_allclose(g, sum(p[1] for p in parts), rtol=1e-10)
        assert sciml.loss_value(prob, both, rtol=1e-10, atol=1e-12) == pytest.approx(v)
    # states observed directly
    states = sciml.Data(t=np.repeat(t, 2), y=10 * both.y, repeated_times=True)
    v, g = sciml.loss_and_grad(s.problem, states, rtol=1e-10, atol=1e-12)
    parts = [sciml.loss_and_grad(s.problem, sciml.Data(t=t, y=10 * d.y), rtol=1e-10,
                                 atol=1e-12) for d in halves]
    assert v == pytest.approx(sum(p[0] for p in parts), rel=1e-12)
    np.testing.assert_allclose(g, sum(p[1] for p in parts), rtol=1e-10)
