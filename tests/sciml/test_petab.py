"""sciml.petab against the PEtab SciML conformance cases, and its errors on bad files.

Every case in tests/data/petab_sciml/sciml_problem_import and .../initialization is loaded
from its problem.yaml; llh, gradient and simulations must agree with the case's reference
values within its tolerances (solutions.yaml). One solver / sensitivity method (Tsit5 with
ForwardSensitivity, the importer's default) runs in every case.
"""

import math
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("libsbml")
pytest.importorskip("petab")
h5py = pytest.importorskip("h5py")
pd = pytest.importorskip("pandas")
yaml = pytest.importorskip("yaml")

import sciml.petab  # noqa: E402
from sciml.petab import PetabError  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "data", "petab_sciml")
CASES = sorted(os.listdir(os.path.join(ROOT, "sciml_problem_import")))
INIT = sorted(d for d in os.listdir(os.path.join(ROOT, "initialization"))
              if os.path.isdir(os.path.join(ROOT, "initialization", d)))


def _case(kind, case):
    d = os.path.join(ROOT, kind, case)
    with open(os.path.join(d, "solutions.yaml")) as f:
        return d, yaml.safe_load(f)


def _close(got, ref, tol):
    return np.allclose(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", CASES)
def test_problem_case(case):
    d, sol = _case("sciml_problem_import", case)
    problem = sciml.petab.load(os.path.join(d, "petab", "problem.yaml"))
    x = problem.nominal
    llh, g = problem.llh_and_grad(x)
    # cases with priors give the log posterior (llh plus the log priors) instead of the llh
    key = "log_posterior" if "log_posterior" in sol else "llh"
    tol_llh = sol["tol_" + key] * max(1.0, abs(sol[key]))
    assert abs(llh - sol[key]) <= tol_llh
    # the value alone: the states are integrated without their sensitivities, whose error
    # control also shortens the steps at a ReLU kink in the right-hand side; where the kinks
    # matter (036, 038: relu on a constant array input) the two differ by up to 4e-6
    # relative at rtol 1e-8, both well within the case's tolerance
    value = problem.llh(x)
    assert abs(value - sol[key]) <= tol_llh
    assert value == pytest.approx(llh, rel=1e-5)
    tol = sol["tol_grad"]
    grads = problem.unflatten(g)
    for name, path in sol["grad_files"].items():
        if name == "mech":
            ref = pd.read_csv(os.path.join(d, path), sep="\t")
            for pid, value in zip(ref.parameterId, ref.value):
                assert _close(grads[pid], value, tol), (pid, grads[pid], value)
            continue
        with h5py.File(os.path.join(d, path), "r") as h:
            for layer, group in h["parameters"][name].items():
                for array, data in group.items():
                    want = np.asarray(data)
                    if want.size == 0:  # a frozen array: not estimated, not in the vector
                        assert array not in grads[name].get(layer, {})
                    else:
                        assert _close(grads[name][layer][array], want, tol), (layer, array)
    sim = problem.simulate(x)
    ref = pd.read_csv(os.path.join(d, sol["simulation_files"][0]), sep="\t")
    keys = ["observableId", "experimentId", "time"]
    merged = ref.merge(sim, on=keys, suffixes=("_ref", ""))
    assert len(merged) == len(ref) == len(sim)
    assert _close(merged.simulation.values, merged.simulation_ref.values,
                  sol["tol_simulations"])


@pytest.mark.parametrize("case", INIT)
def test_initialization_case(case):
    d, sol = _case("initialization", case)
    problem = sciml.petab.load(os.path.join(d, "petab", "problem.yaml"))
    values = problem.unflatten(problem.nominal)
    for name, path in sol["parameter_files"].items():
        with h5py.File(os.path.join(d, path), "r") as h:
            for layer, group in h["parameters"][name].items():
                for array, data in group.items():
                    assert _close(values[name][layer][array], np.asarray(data), sol["tol"])


def test_gradient_matches_finite_differences_on_log_scale(tmp_path):
    """Parameter scales and a prior: the gradient against central differences."""
    src = os.path.join(ROOT, "sciml_problem_import", "002", "petab")
    dst = tmp_path / "petab"
    shutil.copytree(src, dst)
    par = pd.read_csv(dst / "parameters.tsv", sep="\t", dtype=str, keep_default_na=False)
    par.loc[par.parameterId == "alpha", "parameterScale"] = "log10"
    par.loc[par.parameterId == "delta", "parameterScale"] = "log"
    par["priorDistribution"] = ""
    par["priorParameters"] = ""
    par.loc[par.parameterId == "beta", ["priorDistribution", "priorParameters"]] = \
        ["normal", "1.0;0.5"]
    par.to_csv(dst / "parameters.tsv", sep="\t", index=False)
    problem = sciml.petab.load(str(dst / "problem.yaml"))
    assert problem.nominal[problem.parameter_names.index("alpha")] == pytest.approx(
        math.log10(1.3))
    x = problem.nominal
    llh, g = problem.llh_and_grad(x)
    ref = sciml.petab.load(os.path.join(src, "problem.yaml"))
    prior = -0.5 * math.log(2 * math.pi * 0.25) - 0.5 * ((0.9 - 1.0) / 0.5) ** 2
    assert llh == pytest.approx(ref.llh(ref.nominal) + prior, rel=1e-6)
    for i in range(3):
        h = 1e-5
        e = np.zeros_like(x)
        e[i] = h
        fd = (problem.llh(x + e) - problem.llh(x - e)) / (2 * h)
        assert g[i] == pytest.approx(fd, rel=1e-4, abs=1e-3), problem.parameter_names[i]


def _copy_case(tmp_path, case):
    dst = tmp_path / "petab"
    shutil.copytree(os.path.join(ROOT, "sciml_problem_import", case, "petab"), dst)
    return dst


def _normal_log_prior(x, sd):
    return np.sum(-0.5 * np.log(2 * math.pi * sd * sd) - 0.5 * (x / sd) ** 2), -x / sd**2


@pytest.mark.parametrize("drop", [False, True])
def test_network_priors_cover_their_rows_entries(tmp_path, drop):
    """Case 034: N(0, 1) on all of net1 (row net1_ps), N(0, 2) on layer1.weight (a more
    specific row, which overrides); with ``drop`` that row has no prior, so its entries
    have none. Value and gradient of the log prior against the closed form."""
    dst = _copy_case(tmp_path, "034")
    if drop:
        _edit(dst / "parameters.tsv", "array\ttrue\tnormal\t0.0;2.0", "array\ttrue\t\t")
    problem = sciml.petab.load(str(dst / "problem.yaml"))
    x = problem.nominal
    names = problem.parameter_names
    v1, g1 = problem.llh_and_grad(x)
    v0, g0 = problem.llh_and_grad(x, prior=False)
    net = np.array([n.startswith("net1.") for n in names])
    w1 = np.array([n.startswith("net1.parameters[layer1].weight") for n in names])
    want_v, want_g = 3 * -math.log(15.0), np.zeros(len(x))  # alpha, delta, beta: U(0, 15)
    v, g = _normal_log_prior(x[net & ~w1], 1.0)
    want_v += v
    want_g[net & ~w1] = g
    if not drop:
        v, g = _normal_log_prior(x[w1], 2.0)
        want_v += v
        want_g[w1] = g
    assert w1.sum() == 10
    assert v1 - v0 == pytest.approx(want_v, rel=1e-12)
    np.testing.assert_allclose(g1 - g0, want_g, rtol=1e-9, atol=1e-9)


def test_noise_densities_match_petab():
    """normal / laplace on lin, log and log10 scales against petab's own formula."""
    from petab.v1.calculate import calculate_single_llh

    from sciml.petab.likelihood import nllh

    sim, sigma, m = np.array([1.3]), np.array([0.4]), np.array([1.1])
    for kind, dist in ((0, "normal"), (1, "laplace")):
        for tr, scale in ((0, "lin"), (1, "log"), (2, "log10")):
            v, ds, dsig = nllh(sim, sigma, m, np.array([kind]), np.array([tr]))
            assert -v == pytest.approx(calculate_single_llh(
                m[0], sim[0], scale, dist, sigma[0]), rel=1e-12), (dist, scale)
            h = 1e-6
            vp = nllh(sim + h, sigma, m, np.array([kind]), np.array([tr]))[0]
            vm = nllh(sim - h, sigma, m, np.array([kind]), np.array([tr]))[0]
            assert ds[0] == pytest.approx((vp - vm) / (2 * h), rel=1e-6)
            vp = nllh(sim, sigma + h, m, np.array([kind]), np.array([tr]))[0]
            vm = nllh(sim, sigma - h, m, np.array([kind]), np.array([tr]))[0]
            assert dsig[0] == pytest.approx((vp - vm) / (2 * h), rel=1e-6)


# ------------------------------------------------------------------------------ errors


@pytest.fixture
def case001(tmp_path):
    dst = tmp_path / "petab"
    shutil.copytree(os.path.join(ROOT, "sciml_problem_import", "001", "petab"), dst)
    return dst


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_missing_table_is_named(case001):
    os.remove(case001 / "observables.tsv")
    with pytest.raises(PetabError, match=r"observable table .*observables.tsv does not exist"):
        sciml.petab.load(str(case001 / "problem.yaml"))


def test_unknown_parameter_in_formula_names_row_and_column(case001):
    _edit(case001 / "observables.tsv", "prey\t0.05", "prey * kappa\t0.05")
    with pytest.raises(PetabError, match=r"observables.tsv, line 2, column "
                                         r"'observableFormula'.*'kappa'"):
        sciml.petab.load(str(case001 / "problem.yaml"))


def test_bad_number_names_row_and_column(case001):
    _edit(case001 / "parameters.tsv", "delta\tlin\t0.0", "delta\tlin\tzero")
    with pytest.raises(PetabError, match=r"parameters.tsv, line 3, column 'lowerBound'.*"
                                         r"'zero'"):
        sciml.petab.load(str(case001 / "problem.yaml"))


def test_network_input_that_names_nothing(case001):
    _edit(case001 / "hybridization.tsv", "net1_input2\tpredator\n", "")
    with pytest.raises(PetabError, match=r"input 'net1_input2' of network 'net1'.*names "
                                         r"nothing"):
        sciml.petab.load(str(case001 / "problem.yaml"))


def test_array_of_the_wrong_shape(case001):
    with h5py.File(case001 / "net1_ps.hdf5", "r+") as h:
        del h["parameters/net1/layer2/weight"]
        h["parameters/net1/layer2/weight"] = np.zeros((5, 4))
    with pytest.raises(PetabError, match=r"net1_ps.hdf5: parameters/net1/layer2/weight has "
                                         r"shape \(5, 4\); .* expects \(5, 5\)"):
        sciml.petab.load(str(case001 / "problem.yaml"))


def test_network_parameters_on_a_log_scale_are_refused(case001):
    _edit(case001 / "parameters.tsv", "net1_ps\tlin", "net1_ps\tlog")
    with pytest.raises(PetabError, match=r"parameters.tsv, line \d+, column 'parameterScale'"
                                         r".*'log' for the network parameters 'net1_ps'"):
        sciml.petab.load(str(case001 / "problem.yaml"))


def test_array_input_of_the_wrong_length_for_a_network_in_the_model(tmp_path):
    dst = _copy_case(tmp_path, "038")
    with h5py.File(dst / "net6_input2.hdf5", "r+") as h:
        del h["inputs/net6_input2/cond2"]
        h["inputs/net6_input2/cond2"] = np.ones(4)
    with pytest.raises(PetabError, match=r"inputs/net6_input2/<condition> of network 'net6' "
                                         r"differ in shape"):
        sciml.petab.load(str(dst / "problem.yaml"))
    with h5py.File(dst / "net6_input2.hdf5", "r+") as h:
        for c in ("cond1", "cond2"):
            del h[f"inputs/net6_input2/{c}"]
            h[f"inputs/net6_input2/{c}"] = np.ones(4)
    with pytest.raises(PetabError, match=r"network 'net6' takes 4 input values, but .* give "
                                         r"it 5"):
        sciml.petab.load(str(dst / "problem.yaml"))


def test_array_input_for_a_condition_without_one(tmp_path):
    # 038 has no condition table: cond1 and cond2 exist as the arrays' condition ids only
    dst = _copy_case(tmp_path, "038")
    with h5py.File(dst / "net6_input2.hdf5", "r+") as h:
        del h["inputs/net6_input2/cond2"]
    with pytest.raises(PetabError, match=r"experiments.tsv, line 3, column 'conditionId': "
                                         r"unknown condition 'cond2'"):
        sciml.petab.load(str(dst / "problem.yaml"))


def test_unsupported_sbml_names_the_element(case001):
    event = ('<listOfEvents><event id="kick"><trigger><math xmlns='
             '"http://www.w3.org/1998/Math/MathML"><apply><gt/><csymbol encoding="text" '
             'definitionURL="http://www.sbml.org/sbml/symbols/time"> t </csymbol><cn> 1 </cn>'
             '</apply></math></trigger><listOfEventAssignments><eventAssignment '
             'variable="prey"><math xmlns="http://www.w3.org/1998/Math/MathML"><cn> 1 </cn>'
             '</math></eventAssignment></listOfEventAssignments></event></listOfEvents>')
    _edit(case001 / "lv.xml", "</listOfReactions>", "</listOfReactions>" + event)
    with pytest.raises(PetabError, match=r"lv.xml: SBML event 'kick' assigns the state 'prey'"):
        sciml.petab.load(str(case001 / "problem.yaml"))


def test_algebraic_rule_is_refused(case001):
    rule = ('<listOfRules><algebraicRule><math xmlns="http://www.w3.org/1998/Math/MathML">'
            '<apply><minus/><ci> alpha </ci><ci> beta </ci></apply></math></algebraicRule>'
            '</listOfRules>')
    _edit(case001 / "lv.xml", "<listOfReactions>", rule + "<listOfReactions>")
    with pytest.raises(PetabError, match=r"algebraic rule \(alpha - beta\)"):
        sciml.petab.load(str(case001 / "problem.yaml"))
