"""sciml.petab on PEtab v1 problems (the Benchmark-Models collection's format): two models
of the collection against AMICI's published log-likelihoods, gradients against central
finite differences (through a pre-equilibration's steady state too), SBML ids that are not
Python names, placeholders of observables a simulation does not measure, and the errors.
"""

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("libsbml")
petab = pytest.importorskip("petab")
pd = pytest.importorskip("pandas")

import adjoints  # noqa: E402
import sciml.petab  # noqa: E402
from sciml.petab import PetabError  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "data", "benchmark_models")
BOEHM = os.path.join(ROOT, "Boehm_JProteomeRes2014", "Boehm_JProteomeRes2014.yaml")
ZHENG = os.path.join(ROOT, "Zheng_PNAS2012", "Zheng_PNAS2012.yaml")
#: AMICI-dev/AMICI tests/benchmark_models/benchmark_models.yaml (BSD-3-Clause)
AMICI_LLH = {BOEHM: -138.22199693517703, ZHENG: 278.33353271001477}


def _fd_check(yaml, x, g, n_dirs=2):
    tight = sciml.petab.load(yaml, rtol=1e-11, atol=1e-13)
    rng = np.random.default_rng(0)
    for _ in range(n_dirs):
        v = rng.standard_normal(len(x))
        v /= np.linalg.norm(v)
        h = 1e-4
        fd = (tight.llh(x + h * v) - tight.llh(x - h * v)) / (2 * h)
        assert g @ v == pytest.approx(fd, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("yaml", [BOEHM, ZHENG], ids=["Boehm", "Zheng_preequilibration"])
def test_reproduces_amici_and_its_gradient(yaml):
    pp = sciml.petab.load(yaml)
    assert pp.version == 1 and pp.solver.name == "Rodas5"  # stiff by default for SBML
    assert pp.llh(pp.nominal) == pytest.approx(AMICI_LLH[yaml], abs=1e-4)
    x = pp.nominal + 0.05 * np.random.default_rng(1).standard_normal(len(pp.nominal))
    _, g = pp.llh_and_grad(x)
    _fd_check(yaml, x, g)


def test_forward_sensitivities_only_for_what_the_states_depend_on():
    # Boehm's noise parameters sd_* are estimated but reach only the noise formulas: their
    # derivatives come from the observables directly, without sensitivity columns
    pp = sciml.petab.load(BOEHM, sensealg=adjoints.ForwardSensitivity())
    cols = {pp.model.params[i] for i in pp._method(pp.sims[0]).params}
    assert {"k_phos", "k_exp_homo", "Epo_degradation_BaF3"} <= cols
    assert not any(c.startswith("sd_") for c in cols)
    x = pp.nominal + 0.05 * np.random.default_rng(1).standard_normal(len(pp.nominal))
    _, g = pp.llh_and_grad(x)
    pp.sensealg = adjoints.GaussAdjoint()
    _, ga = pp.llh_and_grad(x)
    np.testing.assert_allclose(g, ga, rtol=1e-5, atol=1e-6 * np.max(np.abs(ga)))


def _copy(tmp_path, src=BOEHM):
    d = tmp_path / "p"
    shutil.copytree(os.path.dirname(src), d)
    return d, str(d / os.path.basename(src))


def _edit(path, old, new):
    with open(path) as f:
        text = f.read()
    assert old in text
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def test_sbml_ids_that_are_not_python_names(tmp_path):
    d, yaml = _copy(tmp_path)
    for f in os.listdir(d):  # a species and a parameter with leading underscores
        if f.endswith((".xml", ".tsv")):
            text = (d / f).read_text()
            (d / f).write_text(text.replace("STAT5A", "_STAT5A").replace(
                "k_phos", "_k_phos"))
    pp = sciml.petab.load(yaml)
    assert "_k_phos" in pp.parameter_names
    assert pp.llh(pp.nominal) == pytest.approx(AMICI_LLH[BOEHM], abs=1e-4)


def test_placeholders_of_an_unmeasured_observable(tmp_path):
    d, yaml = _copy(tmp_path)
    meas = next(f for f in os.listdir(d) if f.startswith("measurementData"))
    df = pd.read_csv(d / meas, sep="\t")
    df[df.observableId != "pSTAT5B_rel"].to_csv(d / meas, sep="\t", index=False)
    pp = sciml.petab.load(yaml)
    llh = pp.llh(pp.nominal)
    # the petab library's likelihood of our simulations, for the rows that remain
    problem = petab.v1.Problem.from_yaml(yaml)
    sim = pp.simulate(pp.nominal)
    m = problem.measurement_df.reset_index(drop=True)
    s = m.rename(columns={"measurement": "simulation"})
    s["simulation"] = sim["simulation"].to_numpy()
    ref = petab.v1.calculate_llh(m, s, problem.observable_df, problem.parameter_df)
    assert np.isfinite(llh) and llh == pytest.approx(ref, rel=1e-10)


def test_version_and_missing_files_are_named(tmp_path):
    d, yaml = _copy(tmp_path)
    _edit(yaml, "format_version: 1", "format_version: 3")
    with pytest.raises(PetabError, match="format_version 3"):
        sciml.petab.load(yaml)
    _edit(yaml, "format_version: 3", "format_version: 1")
    os.remove(d / "model_Boehm_JProteomeRes2014.xml")
    with pytest.raises(PetabError, match="does not exist"):
        sciml.petab.load(yaml)


def test_a_condition_row_error_names_its_line(tmp_path):
    d, yaml = _copy(tmp_path, ZHENG)
    cond = next(f for f in os.listdir(d) if f.startswith("experimentalCondition"))
    df = pd.read_csv(d / cond, sep="\t", dtype=str, keep_default_na=False)
    df.insert(2, "no_such_entity", ["1.0"] * len(df))
    df.to_csv(d / cond, sep="\t", index=False)
    with pytest.raises(PetabError, match=r"line 2.*unknown target 'no_such_entity'"):
        sciml.petab.load(yaml)


_SBML = """<?xml version="1.0" encoding="UTF-8"?>
<sbml xmlns="http://www.sbml.org/sbml/level3/version1/core" level="3" version="1">
  <model id="switch">
    <listOfCompartments><compartment id="c" size="1" constant="true"/></listOfCompartments>
    <listOfSpecies>
      <species id="x" compartment="c" initialConcentration="0" hasOnlySubstanceUnits="false"
               boundaryCondition="false" constant="false"/>
    </listOfSpecies>
    <listOfParameters>
      <parameter id="a" value="1" constant="true"/>
      <parameter id="k" value="0.5" constant="true"/>
      <parameter id="tau" value="2" constant="true"/>
    </listOfParameters>
    <listOfRules>
      <rateRule variable="x"><math xmlns="http://www.w3.org/1998/Math/MathML"><apply><minus/>
        <apply><times/><ci>a</ci><piecewise><piece><cn>1</cn><apply><lt/>
          <csymbol encoding="text" definitionURL="http://www.sbml.org/sbml/symbols/time">t</csymbol>
          <ci>tau</ci></apply></piece><otherwise><cn>0</cn></otherwise></piecewise></apply>
        <apply><times/><ci>k</ci><ci>x</ci></apply></apply></math></rateRule>
    </listOfRules>
    EVENTS
  </model>
</sbml>
"""

_EVENT = """<listOfEvents><event id="boost" useValuesFromTriggerTime="true">
      <trigger initialValue="true" persistent="true"><math xmlns="http://www.w3.org/1998/Math/MathML">
        <apply><geq/><csymbol encoding="text"
          definitionURL="http://www.sbml.org/sbml/symbols/time">t</csymbol><cn>3.2</cn></apply>
      </math></trigger>
      <listOfEventAssignments><eventAssignment variable="k"><math
        xmlns="http://www.w3.org/1998/Math/MathML"><apply><times/><cn>2</cn><ci>a</ci></apply>
      </math></eventAssignment></listOfEventAssignments></event></listOfEvents>"""


def _switch_problem(tmp_path, events=""):
    d = tmp_path / "switch"
    d.mkdir()
    (d / "model.xml").write_text(_SBML.replace("EVENTS", events))
    (d / "conditions.tsv").write_text("conditionId\nc0\n")
    (d / "observables.tsv").write_text(
        "observableId\tobservableFormula\tnoiseFormula\nobs_x\tx\t0.1\n")
    times = [0.5, 1.0, 1.5, 2.5, 3.0, 4.0]
    (d / "measurements.tsv").write_text(
        "observableId\tsimulationConditionId\ttime\tmeasurement\n" +
        "".join(f"obs_x\tc0\t{t}\t{0.5 + 0.1 * t}\n" for t in times))
    (d / "parameters.tsv").write_text(
        "parameterId\tparameterScale\tlowerBound\tupperBound\tnominalValue\testimate\n"
        "a\tlog10\t0.01\t100\t1\t1\nk\tlog10\t0.01\t100\t0.5\t1\n"
        "tau\tlin\t0.1\t4\t2\t1\n")
    (d / "problem.yaml").write_text(
        "format_version: 1\nparameter_file: parameters.tsv\nproblems:\n"
        "- condition_files: [conditions.tsv]\n  measurement_files: [measurements.tsv]\n"
        "  observable_files: [observables.tsv]\n  sbml_files: [model.xml]\n")
    return str(d / "problem.yaml"), np.array(times)


def _check_against(pp, yaml, t, x):
    """The llh at the nominal values against that of the closed-form states `x` at `t`
    (the measurements 0.5 + 0.1 t, sigma 0.1), the gradient against central differences."""
    r = ((0.5 + 0.1 * t) - x) / 0.1
    ref = -np.sum(0.5 * np.log(2 * np.pi * 0.01) + 0.5 * r ** 2)
    assert pp.llh(pp.nominal) == pytest.approx(ref, rel=1e-7)
    _, g = pp.llh_and_grad(pp.nominal)
    tight = sciml.petab.load(yaml, rtol=1e-11, atol=1e-13)
    fd = [(tight.llh(pp.nominal + e) - tight.llh(pp.nominal - e)) / 2e-6
          for e in np.eye(3) * 1e-6]
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_time_switch_with_an_estimated_switching_time(tmp_path):
    yaml, t = _switch_problem(tmp_path)
    pp = sciml.petab.load(yaml)
    assert pp._switches.times  # the piecewise became a switch
    a, k, tau = 1.0, 0.5, 2.0
    x = np.where(t < tau, a / k * (1 - np.exp(-k * t)),
                 a / k * (1 - np.exp(-k * tau)) * np.exp(-k * (t - tau)))
    _check_against(pp, yaml, t, x)


def test_sbml_event_at_a_time(tmp_path):
    yaml, t = _switch_problem(tmp_path, _EVENT)   # k := 2 a at t = 3.2
    pp = sciml.petab.load(yaml)
    a, k, tau = 1.0, 0.5, 2.0
    x_tau = a / k * (1 - np.exp(-k * tau))
    x_ev = x_tau * np.exp(-k * (3.2 - tau))
    x = np.where(t < tau, a / k * (1 - np.exp(-k * t)),
                 np.where(t < 3.2, x_tau * np.exp(-k * (t - tau)),
                          x_ev * np.exp(-2 * a * (t - 3.2))))
    _check_against(pp, yaml, t, x)


def test_a_parameter_named_like_a_placeholder(tmp_path):
    # noiseParameter1_sd is a parameter of the table (sd is no observable), as
    # Lang_PLOSComputBiol2024's noiseParameter2_cycA_nuc: its value is the table's, not
    # the 1.0 an unmeasured observable's placeholder gets
    yaml, t = _switch_problem(tmp_path)
    d = tmp_path / "switch"
    _edit(d / "observables.tsv", "x\t0.1", "x\tnoiseParameter1_sd")
    with open(d / "parameters.tsv", "a") as f:
        f.write("noiseParameter1_sd\tlin\t0.01\t1\t0.1\t0\n")
    pp = sciml.petab.load(yaml)
    a, k, tau = 1.0, 0.5, 2.0
    x = np.where(t < tau, a / k * (1 - np.exp(-k * t)),
                 a / k * (1 - np.exp(-k * tau)) * np.exp(-k * (t - tau)))
    _check_against(pp, yaml, t, x)


def test_rows_assigning_placeholders_differently_are_one_simulation(tmp_path):
    # each row its own noise value and, alternately, a number or a parameter for the
    # observable's scale: one solve of the experiment, each row reading its own assignment
    yaml, t = _switch_problem(tmp_path)
    d = tmp_path / "switch"
    (d / "observables.tsv").write_text(
        "observableId\tobservableFormula\tnoiseFormula\n"
        "obs_x\tobservableParameter1_obs_x * x\tnoiseParameter1_obs_x\n")
    sig = 0.1 + 0.02 * np.arange(len(t))
    scale = ["2", "sc"] * (len(t) // 2)
    (d / "measurements.tsv").write_text(
        "observableId\tsimulationConditionId\ttime\tmeasurement\tobservableParameters\t"
        "noiseParameters\n" + "".join(f"obs_x\tc0\t{ti}\t{0.5 + 0.1 * ti}\t{c}\t{s}\n"
                                     for ti, c, s in zip(t, scale, sig)))
    with open(d / "parameters.tsv", "a") as f:
        f.write("sc\tlin\t0.1\t10\t3\t0\n")
    pp = sciml.petab.load(yaml)
    assert len(pp.sims) == 1
    a, k, tau = 1.0, 0.5, 2.0
    x = np.where(t < tau, a / k * (1 - np.exp(-k * t)),
                 a / k * (1 - np.exp(-k * tau)) * np.exp(-k * (t - tau)))
    r = ((0.5 + 0.1 * t) - np.where(np.array(scale) == "2", 2.0, 3.0) * x) / sig
    assert pp.llh(pp.nominal) == pytest.approx(
        -np.sum(0.5 * np.log(2 * np.pi * sig ** 2) + 0.5 * r ** 2), rel=1e-7)
    np.testing.assert_allclose(pp.simulate(pp.nominal)["simulation"],
                               np.where(np.array(scale) == "2", 2.0, 3.0) * x, rtol=1e-7)


def test_a_placeholder_without_a_value_is_named(tmp_path):
    yaml, t = _switch_problem(tmp_path)
    d = tmp_path / "switch"
    _edit(d / "observables.tsv", "x\t0.1", "x\tnoiseParameter1_obs_x")
    with pytest.raises(PetabError, match=r"measurements.tsv, line 2, column 'noiseParameters'"
                                         r": no value for the placeholder"):
        sciml.petab.load(yaml)


def test_state_triggered_event_assigning_a_parameter_is_refused(tmp_path):
    ev = _EVENT.replace('<csymbol encoding="text"\n          definitionURL='
                        '"http://www.sbml.org/sbml/symbols/time">t</csymbol>', "<ci>x</ci>")
    assert ev != _EVENT
    yaml, _ = _switch_problem(tmp_path, ev)
    with pytest.raises(PetabError, match="event 'boost' is triggered by the state and "
                                         "assigns the parameter 'k'"):
        sciml.petab.load(yaml)


def test_state_triggered_event(tmp_path):
    # dx/dt = a - k x; when x rises through 1.5 it is reset to 0.5
    rule = _SBML[_SBML.index("<listOfRules>"):_SBML.index("</listOfRules>")]
    plain = ('<listOfRules><rateRule variable="x"><math xmlns="http://www.w3.org/1998/Math/'
             'MathML"><apply><minus/><ci>a</ci><apply><times/><ci>k</ci><ci>x</ci></apply>'
             '</apply></math></rateRule>')
    ev = ('<listOfEvents><event id="reset" useValuesFromTriggerTime="true">'
          '<trigger initialValue="true" persistent="true">'
          '<math xmlns="http://www.w3.org/1998/Math/MathML"><apply><geq/><ci>x</ci>'
          '<cn>1.5</cn></apply></math></trigger><listOfEventAssignments><eventAssignment '
          'variable="x"><math xmlns="http://www.w3.org/1998/Math/MathML"><cn>0.5</cn></math>'
          '</eventAssignment></listOfEventAssignments></event></listOfEvents>')
    yaml, t = _switch_problem(tmp_path, ev)
    model = tmp_path / "switch" / "model.xml"
    model.write_text(model.read_text().replace(rule, plain))
    pp = sciml.petab.load(yaml)
    a, k = 1.0, 0.5
    t1 = -np.log(1 - 1.5 * k / a) / k
    x = np.where(t < t1, a / k * (1 - np.exp(-k * t)),
                 a / k - (a / k - 0.5) * np.exp(-k * (t - t1)))
    _check_against(pp, yaml, t, x)


def test_a_condition_overrides_a_parameter_with_an_initial_assignment(tmp_path):
    # As Liu_IFACPapersOnLine2025's u_2 (virus dose: initial assignment 1e9, set to 0 by
    # its ctrl condition, its V(0) = u_2): PEtab's condition table overrides the model's
    # value, initial assignment included. x(0) = x0p, x0p := 5 in the SBML model, 0.3 in
    # condition c0; AMICI 1.0.1 keeps the initial assignment (Liu's ctrl then has the
    # virus: llh -918.74 where ours and libroadrunner's are -723.36)
    yaml, t = _switch_problem(tmp_path)
    d = tmp_path / "switch"
    _edit(d / "model.xml", '<parameter id="tau" value="2" constant="true"/>',
          '<parameter id="tau" value="2" constant="true"/>'
          '<parameter id="x0p" value="1" constant="true"/>')
    _edit(d / "model.xml", "<listOfRules>",
          '<listOfInitialAssignments><initialAssignment symbol="x0p"><math '
          'xmlns="http://www.w3.org/1998/Math/MathML"><cn>5</cn></math></initialAssignment>'
          '<initialAssignment symbol="x"><math xmlns="http://www.w3.org/1998/Math/MathML">'
          '<ci>x0p</ci></math></initialAssignment></listOfInitialAssignments><listOfRules>')
    (d / "conditions.tsv").write_text("conditionId\tx0p\nc0\t0.3\n")
    pp = sciml.petab.load(yaml)
    a, k, tau, x0 = 1.0, 0.5, 2.0, 0.3
    x_tau = a / k + (x0 - a / k) * np.exp(-k * tau)
    x = np.where(t < tau, a / k + (x0 - a / k) * np.exp(-k * t),
                 x_tau * np.exp(-k * (t - tau)))
    _check_against(pp, yaml, t, x)


def _two_conditions(tmp_path, ratio_2):
    """Boehm with its measurements spread over two conditions (the pSTAT5B rows under the
    second), which set its fixed parameter ``ratio`` to 0.693 (its nominal value) and to
    ``ratio_2``."""
    d, yaml = _copy(tmp_path)
    cond = next(f for f in os.listdir(d) if f.startswith("experimentalCondition"))
    (d / cond).write_text("conditionId\tratio\nmodel1_data1\t0.693\n"
                          f"model1_data2\t{ratio_2}\n")
    meas = next(f for f in os.listdir(d) if f.startswith("measurementData"))
    df = pd.read_csv(d / meas, sep="\t")
    df.loc[df.observableId == "pSTAT5B_rel", "simulationConditionId"] = "model1_data2"
    df.to_csv(d / meas, sep="\t", index=False)
    return yaml


def test_experiments_the_model_sees_alike_share_one_solve(tmp_path):
    yaml = _two_conditions(tmp_path, 0.693)
    pp = sciml.petab.load(yaml)
    assert len(pp.sims) == 1 and pp.sims[0]["experiments"] == ["model1_data1", "model1_data2"]
    assert pp.llh(pp.nominal) == pytest.approx(AMICI_LLH[BOEHM], abs=1e-4)
    each = sciml.petab.load(yaml, share_solves=False)
    assert len(each.sims) == 2
    x = pp.nominal + 0.05 * np.random.default_rng(1).standard_normal(len(pp.nominal))
    v, g = pp.llh_and_grad(x)
    v_each, g_each = each.llh_and_grad(x)
    assert v == pytest.approx(v_each, rel=1e-8)
    np.testing.assert_allclose(g, g_each, rtol=1e-5, atol=1e-6 * np.max(np.abs(g_each)))
    np.testing.assert_allclose(pp.simulate(x)["simulation"], each.simulate(x)["simulation"],
                               rtol=1e-6)
    # a condition that sets a parameter differently is a solve of its own
    other = sciml.petab.load(_two_conditions(tmp_path / "other", 0.5))
    assert len(other.sims) == 2
    assert other.llh(pp.nominal) != pytest.approx(AMICI_LLH[BOEHM], abs=1e-2)
