"""PEtab formulas read without the `petab` library (`sciml.petab.arithmetic`), against
the library's own grammar, and a simulation's expressions shared across conditions
(`sciml.petab.experiment.lambdified`), against sympy evaluated directly."""

import os
import subprocess
import sys

import numpy as np
import pytest
import sympy

pytest.importorskip("libsbml")
pytest.importorskip("petab.v1.math")

from petab.v1.math import sympify_petab  # noqa: E402

from sciml.petab.arithmetic import arithmetic  # noqa: E402
from sciml.petab.experiment import _lambdified, lambdified  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
BOEHM = os.path.join(ROOT, "..", "data", "benchmark_models", "Boehm_JProteomeRes2014",
                     "Boehm_JProteomeRes2014.yaml")

ARITHMETIC = ["scale_pSTAT5A_rel * pApB / (pApA + pApB)", "-a^2", "a^b^c", "2*a^b", "a^-b",
              "-2^2", "a^2^-1", "x ^ 2 / 3", "log(0)", "log10(0)", "log2(8)", "log(x, 2)",
              "ln(x)", "exp(-k*t) - 1", "sqrt(2) + sqrt(x)", "1e-3*x", "2.5E+3 - -x",
              "+x - (y - z)", "a / b * c", "1", "0.0", "pi", "time * k", "_under_score"]
#: outside the subset: the grammar reads these (or refuses them with its own message)
OTHER = ["a < b", "true", "false * x", "Inf * x", "NaN", "piecewise(1, a > b, 0)",
         "abs(x)", "sin(x)", "max(a, b)", "a**2", ".5*x", "2.*x", "a && b", "!a",
         "log(1, 2, 3)", "exp(x=1)", "\u03bd + 1", "0x10", "1_000", "1j", "a if b else c"]


@pytest.mark.parametrize("text", ARITHMETIC)
def test_arithmetic_builds_what_the_grammar_builds(text):
    ours = arithmetic(text)
    assert ours is not None
    assert sympy.srepr(ours) == sympy.srepr(sympy.sympify(sympify_petab(text)))


@pytest.mark.parametrize("text", OTHER)
def test_everything_else_is_left_to_the_grammar(text):
    assert arithmetic(text) is None


def test_loading_a_problem_imports_no_petab():
    """A v1 problem whose formulas are all arithmetic loads (and computes its llh)
    without importing `petab` (1.2-1.5 s of a cold start)."""
    code = ("import sys, sciml.petab; pp = sciml.petab.load(sys.argv[1]); "
            "print(pp.llh(pp.nominal)); print(sorted(m for m in sys.modules "
            "if m == 'petab' or m.startswith('petab.')))")
    # (the engine interpreted: this test compiles nothing)
    out = subprocess.run([sys.executable, "-c", code, BOEHM], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore",
                                           "SCIML_INTERPRET": "always"})
    assert out.returncode == 0, out.stderr
    llh, modules = out.stdout.strip().splitlines()[-2:]
    assert float(llh) == pytest.approx(-138.22199693517703, abs=1e-3)  # AMICI's
    assert modules == "[]"


def test_expressions_differing_in_numbers_share_their_code():
    k, x = sympy.symbols("k x", real=True)
    big = sum((k * x + i) ** 3 for i in range(4))

    def exprs(a, b):
        return [big * sympy.Float(a) + x, sympy.Float(b), sympy.Float(b) * k - 1]

    first = lambdified([k, x], exprs(2.0, 2.0))  # equal numbers in different expressions
    second = lambdified([k, x], exprs(5.0, 0.25))
    assert first.shared is second.shared
    for (a, b), f in (((2.0, 2.0), first), ((5.0, 0.25), second)):
        at = np.array([0.7, -1.3])
        subs = {k: at[0], x: at[1]}
        es = exprs(a, b)
        np.testing.assert_allclose(f.value(at), [float(e.subs(subs)) for e in es], rtol=1e-13)
        J = [[float(sympy.diff(e, s).subs(subs)) for s in (k, x)] for e in es]
        np.testing.assert_allclose(f.jacobian(at), J, rtol=1e-13, atol=1e-14)
    assert _lambdified.cache_info().currsize >= 1
