"""`sciml.data.read_events`: event tables on the real example files, and every refusal.

The real files are the project's copies in `examples/data/` (see its README).
Counts of subjects, doses and observations are checked against the raw rows;
a subject read from the table is solved against the closed form of the
one-compartment oral model (Bateman's function). Hand-made tables are
DataFrames when pandas is installed, else plain dicts of columns (the reader
takes both, and labels their rows alike: ``row <index>``).
"""

import csv
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

import sciml
from sciml.data import Subject, read_events

try:
    import pandas as pd
except ImportError:  # the reader itself does not need pandas
    pd = None

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
THEO_SD = DATA / "theo_sd_nlmixr2data.csv"
THEOPH = DATA / "Theoph.csv"
WARFARIN = DATA / "warfarin_nlmixr2data.csv"
needs_pandas = pytest.mark.skipif(pd is None, reason="pandas is not installed")


def one_cpt(u, p, t):
    return [-p.ka * u.depot, p.ka * u.depot - p.CL / p.V * u.central]


MODEL = sciml.Model(one_cpt, states=["depot", "central"], params=["ka", "CL", "V"],
                    observables={"conc": lambda u, p: u.central / p.V})
THETA = MODEL.init_params(ka=1.5, CL=2.8, V=32.0)
COMP = {1: "depot", 2: "central"}


def frame(**cols):
    return pd.DataFrame(cols) if pd is not None else cols


def table(**over):
    """A valid two-subject table; keyword arguments replace whole columns."""
    cols = dict(ID=[1, 1, 1, 1, 2, 2, 2],
                TIME=[0.0, 0.5, 1.0, 4.0, 0.0, 1.0, 2.0],
                AMT=[100.0, 0, 0, 0, 50.0, 0, 0],
                DV=[".", 1.2, 2.0, 1.1, 0, 0.9, 0.7],
                EVID=[1, 0, 0, 0, 1, 0, 0],
                CMT=[1, 2, 2, 2, 1, 2, 2],
                WT=[70.0, 70, 70, 70, 55, 55, 55])
    cols.update(over)
    return frame(**cols)


def read(tab, **kw):
    kw.setdefault("params", THETA)
    return read_events(tab, MODEL, COMP, "conc", **kw)


def raises(tab, *fragments, **kw):
    with pytest.raises(ValueError) as err:
        read(tab, **kw)
    msg = str(err.value)
    for f in fragments:
        assert f in msg, msg
    return msg


def raw_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def bateman(t, dose, ka, CL, V):
    ke = CL / V
    return dose * ka / (V * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))


# ------------------------------------------------------------ real tables


def test_theo_sd_counts_and_values_match_the_raw_file():
    rows = raw_rows(THEO_SD)
    subjects = read(str(THEO_SD))
    ids = list(dict.fromkeys(int(r["ID"]) for r in rows))
    assert [s.id for s in subjects] == ids and len(subjects) == 12
    doses = [r for r in rows if r["EVID"] != "0"]
    obs = [r for r in rows if r["EVID"] == "0"]
    assert sum(len(s.problem.doses) for s in subjects) == len(doses) == 12
    assert sum(int(s.data.mask.sum()) for s in subjects) == len(obs) == 132
    for s in subjects:
        mine = [r for r in rows if int(r["ID"]) == s.id]
        (d,) = s.problem.doses
        dose_row = next(r for r in mine if r["EVID"] == "101")
        assert isinstance(d, sciml.Bolus) and d.state == "depot" and d.time == 0.0
        assert d.amount == float(dose_row["AMT"])
        o = [r for r in mine if r["EVID"] == "0"]
        np.testing.assert_array_equal(s.data.t, [float(r["TIME"]) for r in o])
        np.testing.assert_array_equal(s.data.y[:, 0], [float(r["DV"]) for r in o])
        assert s.data.names == ("conc",) and s.data.kind == "observables"
        assert s.covariates == {"WT": float(mine[0]["WT"])}
        assert s.problem.tspan == (0.0, float(mine[-1]["TIME"]))
        np.testing.assert_array_equal(s.problem.params, THETA)
        np.testing.assert_array_equal(s.problem.u0, [0.0, 0.0])


def test_theo_sd_subject_solves_to_the_closed_form():
    s = read(str(THEO_SD))[0]
    sol = sciml.solve(s.problem, sciml.Tsit5(), rtol=1e-9, atol=1e-9, saveat=s.data.t)
    assert sol.success
    exact = bateman(s.data.t, s.problem.doses[0].amount, 1.5, 2.8, 32.0)
    np.testing.assert_allclose(sol.observables["conc"], exact, rtol=1e-6, atol=1e-8)


@needs_pandas
def test_theoph_long_format_converted_agrees_with_theo_sd():
    wide = pd.read_csv(THEOPH)
    with pytest.raises(ValueError, match=r"lacks required column\(s\) ID, AMT, DV, EVID, CMT"):
        read(wide)
    # The R dataset holds mg/kg doses and no dose rows: build the event table.
    wide = wide.rename(columns={"Subject": "ID", "Time": "TIME", "conc": "DV"})
    first = wide.groupby("ID", sort=False).head(1)
    dose = first.assign(TIME=0.0, DV=np.nan, AMT=first.Dose * first.Wt, EVID=1, CMT=1)
    obs = wide.assign(AMT=0.0, EVID=0, CMT=2)
    events = pd.concat([dose, obs]).sort_values(["ID", "EVID"], ascending=[True, False],
                                                kind="stable").sort_values("ID", kind="stable")
    mine = read(events[["ID", "TIME", "AMT", "DV", "EVID", "CMT", "Wt"]])
    theirs = {s.id: s for s in read(str(THEO_SD))}
    assert sorted(s.id for s in mine) == sorted(theirs)
    for s in mine:
        t = theirs[s.id]
        assert s.problem.doses[0].amount == pytest.approx(t.problem.doses[0].amount, rel=1e-12)
        np.testing.assert_array_equal(s.data.t, t.data.t)
        np.testing.assert_array_equal(s.data.y, t.data.y)
        assert s.covariates["Wt"] == t.covariates["WT"]


def _warfarin_model():
    def rhs(u, p, t):
        c = u.central / p.V
        return [-p.ka * u.depot, p.ka * u.depot - p.CL * c,
                p.kin * (1.0 - c / (p.EC50 + c)) - p.kout * u.pca]

    m = sciml.Model(rhs, states=["depot", "central", "pca"],
                    params=["ka", "CL", "V", "kin", "kout", "EC50"],
                    observables={"conc": lambda u, p: u.central / p.V,
                                 "effect": lambda u, p: u.pca})
    return m, m.init_params(ka=1.0, CL=0.13, V=8.0, kin=1.0, kout=0.01, EC50=1.0)


def test_warfarin_two_observables_covariates_and_replicates():
    rows = raw_rows(WARFARIN)
    m, theta = _warfarin_model()
    kw = dict(compartments={1: "depot"}, observable={"cp": "conc", "pca": "effect"},
              params=theta, u0=lambda cov: [0.0, 0.0, 100.0])
    msg = str(pytest.raises(ValueError, read_events, str(WARFARIN), m, duplicates="error",
                            **kw).value)
    assert "a second observation of 'conc' at time 3.0" in msg and "line 152" in msg
    subjects = read_events(str(WARFARIN), m, duplicates="mean", **kw)
    assert len(subjects) == len({r["id"] for r in rows}) == 32
    doses = [r for r in rows if r["evid"] == "1"]
    assert sum(len(s.problem.doses) for s in subjects) == len(doses) == 32
    assert all(s.problem.doses[0].state == "depot" for s in subjects)
    # Replicates become one weighted mean: the weights count every raw observation.
    for kind, j in (("cp", 0), ("pca", 1)):
        n_raw = sum(1 for r in rows if r["evid"] == "0" and r["dvid"] == kind)
        n_read = sum(int(np.sum(np.where(s.data.mask[:, j],
                                         1.0 if s.data.weights is None else s.data.weights[:, j],
                                         0.0))) for s in subjects)
        assert n_read == n_raw
    s9 = next(s for s in subjects if s.id == 9)
    i = int(np.flatnonzero(s9.data.t == 3.0)[0])
    assert s9.data.y[i, 0] == pytest.approx((12.7 + 8.0) / 2) and s9.data.weights[i, 0] == 2
    assert sum(s.data.weights is not None for s in subjects) == 1
    s1 = subjects[0]
    assert s1.covariates == {"wt": 66.7, "age": 50.0, "sex": "male"}
    assert s1.data.names == ("conc", "effect") and np.isnan(s1.data.y[0, 1])
    np.testing.assert_array_equal(s1.problem.u0, [0.0, 0.0, 100.0])


# --------------------------------------------------------- what is built


def test_columns_are_case_insensitive_and_rows_become_bolus_infusion_and_addl():
    tab = frame(id=[7, 7, 7, 7, 7], Time=[0.0, 1.0, 2.0, 3.0, 30.0],
                amt=[100.0, 60.0, 0, 40.0, 0], dv=[0, 0, 2.0, 0, 1.0], Evid=[1, 1, 0, 1, 0],
                cmt=[1, 2, 2, 2, 2], rate=[0, 20.0, 0, 0, 0], DUR=[0, 0, 0, 2.0, 0],
                ii=[12.0, 0, 0, 0, 0], ADDL=[2, 0, 0, 0, 0], MDV=[1, 1, 0, 1, 0])
    (s,) = read(tab)
    assert s.id == 7 and s.problem.tspan == (0.0, 30.0) and s.covariates == {}
    b, inf_rate, inf_dur = s.problem.doses
    assert b == sciml.Bolus(0.0, 100.0, "depot", every=12.0, count=3)
    assert inf_rate == sciml.Infusion(1.0, 3.0, 20.0, "central")
    assert inf_dur == sciml.Infusion(3.0, 2.0, 20.0, "central")
    np.testing.assert_array_equal(s.data.t, [2.0, 30.0])
    np.testing.assert_array_equal(s.problem.dose_arrays.bolus_t, [0.0, 12.0, 24.0])


def test_addl_boluses_solve_to_superposed_closed_form():
    tab = frame(ID=[1] * 4, TIME=[0.0, 5.0, 13.0, 30.0], AMT=[100.0, 0, 0, 0],
                DV=[0, 1.0, 2.0, 3.0], EVID=[1, 0, 0, 0], CMT=[1, 2, 2, 2], II=[12.0, 0, 0, 0],
                ADDL=[1, 0, 0, 0])
    (s,) = read(tab)
    sol = sciml.solve(s.problem, sciml.Tsit5(), rtol=1e-9, atol=1e-9, saveat=s.data.t)
    t = s.data.t
    exact = bateman(t, 100.0, 1.5, 2.8, 32.0) + np.where(
        t >= 12.0, bateman(np.maximum(t - 12.0, 0.0), 100.0, 1.5, 2.8, 32.0), 0.0)
    np.testing.assert_allclose(sol.observables["conc"], exact, rtol=1e-6)


def test_observable_mapping_by_cmt_merges_times_and_state_observables():
    tab = frame(ID=[1] * 5, TIME=[0.0, 1.0, 1.0, 2.0, 3.0], AMT=[10.0, 0, 0, 0, 0],
                DV=[".", 4.0, 0.3, 3.0, 0.2], EVID=[1, 0, 0, 0, 0], CMT=[1, 1, 2, 1, 2])
    (s,) = read_events(tab, MODEL, COMP, {1: "depot", 2: "central"}, params=THETA)
    assert s.data.kind == "states" and s.data.names == ("depot", "central")
    np.testing.assert_array_equal(s.data.t, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(s.data.y, [[4.0, 0.3], [3.0, np.nan], [np.nan, 0.2]])
    np.testing.assert_array_equal(s.data.columns(MODEL), [0, 1])
    with pytest.raises(ValueError, match="row 2, column 'CMT': observation of 2, which"):
        read_events(tab, MODEL, COMP, {1: "depot"}, params=THETA)
    with pytest.raises(ValueError, match="mixes states and observables"):
        read_events(tab, MODEL, COMP, {1: "depot", 2: "conc"}, params=THETA)


def test_covariates_params_and_covariate_rules():
    subs = read(table(), covariate_params={"V": lambda V, c: V * c["WT"] / 70.0})
    assert [s.covariates for s in subs] == [{"WT": 70.0}, {"WT": 55.0}]
    np.testing.assert_allclose([s.problem.params[2] for s in subs], [32.0, 32.0 * 55 / 70])
    s = read(table())[1]
    assert s.params_with(THETA, V="WT")[2] == 55.0
    assert s.params_with(ka=0.5)[0] == 0.5 and s.problem.params[0] == 1.5  # a copy
    assert s.with_params(V=lambda V, c: 2 * V).problem.params[2] == 64.0
    with pytest.raises(ValueError, match="'WT' is not|not a mechanistic parameter"):
        s.params_with(WT="WT")
    with pytest.raises(ValueError, match="has no covariate 'AGE'"):
        s.params_with(V="AGE")
    per = read(table(), params=lambda c: MODEL.init_params(ka=1.0, CL=2.0, V=c["WT"] / 2))
    assert [p.problem.params[2] for p in per] == [35.0, 27.5]
    only = read(table(SEX=["m"] * 4 + ["f"] * 3), covariates=["sex"])
    assert [p.covariates for p in only] == [{"SEX": "m"}, {"SEX": "f"}]
    raises(table(), "covariate column 'AGE' is not in the", covariates=["AGE"])


def test_time_varying_covariate_first_value_with_warning_or_refused():
    tab = table(WT=[70.0, 70, 71, 72, 55, 55, 55])
    with pytest.warns(UserWarning, match=r"change within a subject.*WT \(subjects 1\)"):
        subs = read(tab)
    assert subs[0].covariates == {"WT": 70.0}
    raises(tab, "row 2, column 'WT': covariate changes within subject (from 70.0 at row 0 "
           "to 71.0)", time_varying="error")
    # Missing values are not changes: covariates often sit on dose rows only.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read(table(WT=[70.0, ".", None, math.nan, 55, "", "."]))[1].covariates["WT"] == 55


def test_evid_2_and_resets():
    tab = table(ID=[1] * 7, EVID=[3, 0, 0, 2, 4, 0, 0], TIME=[0.0, 0.5, 1.0, 4.0, 5.0, 6.0, 7.0],
                AMT=[0, 0, 0, 0, 50.0, 0, 0], DV=[".", 1.2, 2.0, ".", 0, 0.9, 0.7], WT=[70] * 7)
    raises(tab, "row 4, column 'EVID': EVID 4 (reset) inside a subject's record is not "
           "supported; pass reset='split'")
    a, b = read(tab, reset="split")
    assert (a.id, a.occasion, b.id, b.occasion) == (1, 0, 1, 1)
    assert a.problem.tspan == (0.0, 4.0) and b.problem.tspan == (5.0, 7.0)  # EVID 2 at 4 h
    assert a.problem.doses == () and b.problem.doses == (sciml.Bolus(5.0, 50.0, "depot"),)
    np.testing.assert_array_equal(a.data.t, [0.5, 1.0])
    assert a.rows == ("row 0", "row 1", "row 2", "row 3")
    raises(table(EVID=[1, 0, 5, 0, 1, 0, 0]), "row 2, column 'EVID': EVID 5 is not supported")
    raises(table(EVID=[10101, 0, 0, 0, 1, 0, 0]), "classic rxode2 EVID 10101 is not supported")
    raises(table(EVID=[201, 0, 0, 0, 1, 0, 0]), "row 0, column 'CMT': CMT 1 disagrees with "
           "EVID 201")


def test_mdv_missing_dv_and_subjects_without_observations():
    # row 3 is an observation record without DV: left out, said by subject and row
    with pytest.warns(UserWarning, match=r"1 observation record\(s\) \(EVID 0, MDV not 1\) "
                                         r"have no DV and are left out: subject 1 row 3;"):
        subs = read(table(MDV=[0, 1, 0, 0, 0, 0, 0], DV=[".", 1.2, 2.0, ".", 0, 0.9, 0.7]))
    np.testing.assert_array_equal(subs[0].data.t, [1.0])
    tab = table(EVID=[1, 0, 0, 0, 1, 2, 2], DV=[".", 1.2, 2.0, 1.1, 0, ".", "."])
    with pytest.warns(UserWarning, match=r"1 subject\(s\) have no observations.*subject 2"):
        subs = read(tab)
    assert subs[1].data is None and subs[1].problem.tspan == (0.0, 2.0)


def test_pre_dose_sample_warns_about_right_continuity():
    tab = table(ID=[1] * 4, TIME=[0.0, 0.0, 1.0, 2.0], EVID=[0, 1, 0, 0], AMT=[0, 100.0, 0, 0],
                DV=[0.5, 0, 2.0, 1.5], CMT=[2, 1, 2, 2], WT=[70.0] * 4)
    with pytest.warns(UserWarning, match="1 observation.*before a bolus at the same time"):
        read(tab)


def test_csv_errors_name_the_file_line(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("# a comment line\nID,TIME,AMT,DV,EVID,CMT\n1,0,100,.,1,1\n1,1,0,2.0,0,2\n"
                 "1,0.5,0,1.0,0,2\n")
    with pytest.raises(ValueError, match=r"bad.csv, line 5, column 'TIME': time 0.5 is before "
                                         r"the previous record's 1.0 \(line 4\)"):
        read(str(p))
    p.write_text("ID,TIME,AMT,DV,EVID,CMT\n1,0,100,.,1,1\n1,1,0,2.0,0\n")
    with pytest.raises(ValueError, match="line 3: 5 fields, the header has 6"):
        read(p)


# -------------------------------------------------------------- refusals


def test_missing_required_columns():
    tab = table()
    cols = {k: v for k, v in (tab.items() if pd is None else tab.to_dict("list").items())}
    del cols["EVID"], cols["CMT"]
    raises(frame(**cols), "lacks required column(s) EVID, CMT (CMT is needed because "
           "`compartments` has 2 entries)")
    # With one compartment CMT may be absent: every dose goes there.
    subs = read_events(frame(**cols, evid=[1, 0, 0, 0, 1, 0, 0]), MODEL, {1: "depot"}, "conc",
                       params=THETA)
    assert [s.problem.doses[0].state for s in subs] == ["depot", "depot"]
    raises(table(), "lacks required column(s) SUBJ", id_col="SUBJ")
    raises(table(dv=[0] * 7), "columns 'DV' and 'dv' differ only in case")


def test_bad_times():
    raises(table(TIME=[0.0, 0.5, -1.0, 4.0, 0.0, 1.0, 2.0]),
           "row 2, column 'TIME': negative time -1.0")
    raises(table(TIME=[0.0, 0.5, 1.0, 0.7, 0.0, 1.0, 2.0]),
           "row 3, column 'TIME': time 0.7 is before the previous record's 1.0 (row 2) of "
           "subject 1")
    raises(table(TIME=[0.0, 0.5, 1.0, 4.0, 0.0, ".", 2.0]), "row 5, column 'TIME': missing time")
    raises(table(ID=[1, 1, 2, 2, 1, 1, 1]), "row 4, column 'ID': subject 1 appears again after "
           "other subjects (first block at row 0)")
    raises(table(TIME=[0.0] * 4 + [0.0, 1.0, 2.0], EVID=[1, 2, 2, 2, 1, 0, 0],
                 DV=[".", ".", ".", ".", 0, 0.9, 0.7]),
           "subject 1 has all its records at time 0.0; give `tspan`")
    raises(table(), "observation times [4.0] lie outside", tspan=(0.0, 3.0))
    raises(table(), "read_events: subject 1, `tspan` (0.5, 4.0): doses[0] (Bolus at t=0.0 into "
           "'depot') is before tspan[0] = 0.5", tspan=(0.5, 4.0))


def test_bad_doses():
    raises(table(CMT=[3, 2, 2, 2, 1, 2, 2]),
           "row 0, column 'CMT': dose into compartment 3, which `compartments` does not map; "
           "known: 1, 2")
    raises(table(CMT=[1, 2, 2, -2, 1, 2, 2]), "row 3, column 'CMT': compartment -2; "
           "compartments are numbered from 1")
    raises(table(AMT=[100.0, 0, 0, 0, 0, 0, 0]), "row 4, column 'AMT': a dose row (EVID 1) "
           "needs AMT > 0, got 0.0")
    raises(table(AMT=[-5.0, 0, 0, 0, 50, 0, 0]), "row 0, column 'AMT': a dose row")
    raises(table(DV=[3.0, 1.2, 2.0, 1.1, 0, 0.9, 0.7]),
           "row 0, column 'DV': DV 3.0 on a dose row")
    raises(table(AMT=[100.0, 0, 5.0, 0, 50, 0, 0]), "row 2, column 'AMT': AMT 5.0 on a row with "
           "EVID 0 (not a dose)")
    raises(table(SS=[0, 0, 0, 0, 1, 0, 0]), "row 4, column 'SS': SS=1 (steady-state dosing) is "
           "not supported")
    raises(table(RATE=[-2, 0, 0, 0, 0, 0, 0]), "row 0, column 'RATE': RATE -2 (modelled")
    raises(table(RATE=[10.0, 0, 0, 0, 0, 0, 0], DUR=[3.0, 0, 0, 0, 0, 0, 0]),
           "row 0, column 'DUR': DUR 3.0 disagrees with AMT/RATE = 10.0")
    raises(table(ADDL=[3, 0, 0, 0, 0, 0, 0]), "row 0, column 'ADDL': ADDL 3 additional doses "
           "need an interdose interval II > 0")
    raises(table(RATE=[10.0, 0, 0, 0, 0, 0, 0], II=[5.0, 0, 0, 0, 0, 0, 0],
                 ADDL=[1, 0, 0, 0, 0, 0, 0]), "row 0: Infusion: `every` (5.0) is shorter")


def test_non_numeric_values():
    raises(table(DV=[".", 1.2, "high", 1.1, 0, 0.9, 0.7]),
           "row 2, column 'DV': expected a number, got 'high'")
    raises(table(EVID=[1, 0, 0.5, 0, 1, 0, 0]), "row 2, column 'EVID': expected an integer")
    raises(table(AMT=[100.0, 0, 0, 0, "50mg", 0, 0]), "row 4, column 'AMT': expected a number")
    raises(table(TIME=[0.0, 0.5, 1.0, "inf", 0.0, 1.0, 2.0]), "expected a finite number")


def test_bad_arguments():
    with pytest.raises(ValueError, match="`compartments\\[1\\]` = 'gut' is not a state"):
        read_events(table(), MODEL, {1: "gut"}, "conc", params=THETA)
    with pytest.raises(TypeError, match="`compartments` must be a non-empty mapping"):
        read_events(table(), MODEL, ["depot"], "conc", params=THETA)
    with pytest.raises(ValueError, match="'auc' is neither an observable"):
        read_events(table(), MODEL, COMP, "auc", params=THETA)
    with pytest.raises(ValueError, match="give `params`"):
        read_events(table(), MODEL, COMP)
    with pytest.raises(ValueError, match="`params` must have length 3"):
        read_events(table(), MODEL, COMP, params=THETA[:2])
    with pytest.raises(ValueError, match="`duplicates` must be one of"):
        read(table(), duplicates="first")
    with pytest.raises(TypeError, match="`table` must be a pandas DataFrame, a CSV path"):
        read(42)
    dup = table(TIME=[0.0, 0.5, 1.0, 1.0, 0.0, 1.0, 2.0])
    raises(dup, "row 3, column 'DV': a second observation of 'conc' at time 1.0 (also at row 2)",
           duplicates="error")
    (s,) = read(dup, duplicates="mean")[:1]
    assert isinstance(s, Subject) and s.data.y[1, 0] == pytest.approx(1.55)
