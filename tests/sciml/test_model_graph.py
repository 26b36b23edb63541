"""The graph path (`sciml.model.graph`, `sciml.model.irtext`).

Models of 256 states and more without networks are traced into an expression
graph and their kernels built from it: derivatives by `Graph.diff`, common
subexpressions by `Graph.emit`, LLVM IR printed as text in chunks; smaller ones
without networks are traced by sympy and take the same path for their
derivatives. Checked here: the graph's derivatives of every function it knows
against sympy's own;
`emit` against the expressions it lays out; a model using every supported
numpy function, traced into a graph (thresholds lowered to 0, chunks of a few
statements so that temporaries cross chunks, LLVM's fast code generator), whose
kernels must agree with the same model on the sympy path and with central
differences, and whose Python rendering (numba) agrees with the machine code; the
same model traced by sympy, derived on the graph;
Robertson copies at the real threshold (the pattern, the values, code growing
linearly); pickling; networks staying on the sympy path. No engine loop is
compiled here.
"""

import importlib.util
import math
import pickle

import numpy as np
import pytest
import sympy
from sympy.codegen.cfunctions import expm1, log1p, log2, log10

import sciml
import sciml.model as sm
from nets import Chain, Dense
from sciml.model import derivatives, graph, irtext, llvm, trace
from sciml.model.code import sigmoid

from .stiff_models import robertson_groups
from .test_model_kernels import central_diff, close

x, y, z = sympy.symbols("x y z", real=True)

EXPRESSIONS = [
    x * y + sympy.exp(x * z) - sympy.log(y), x**2.5 * y**-3, sympy.sqrt(x * y), x**y, 2**x,
    sympy.Piecewise((x * y, x > y), (y**2, True)), sympy.Abs(x - y) * z, sympy.sign(x) * y,
    sympy.sin(x) * sympy.cos(y) + sympy.tan(z), sympy.atan2(x, y), sympy.tanh(x * y),
    sigmoid(x - z), expm1(x) + log1p(y) + log2(z) + log10(x), sympy.erfc(x * z),
    sympy.asinh(x) + sympy.acosh(y + 2) + sympy.atanh(z / 3) + sympy.asin(x / 3)
    + sympy.acos(y / 4) + sympy.atan(z), sympy.sinh(x) + sympy.cosh(y * z),
    sympy.Max(x, y) * z, sympy.Min(x, y, z), x / (y + z), (x + y) ** 3 / (1 + z**2),
    sympy.Piecewise((sympy.exp(x), sympy.And(x > 0, y < 2)), (x, sympy.Or(z > 1, y < 0)),
                    (0, True)),
]


def _value(e, point):
    return float(e.subs(point).evalf(30))


@pytest.mark.parametrize("e", EXPRESSIONS, ids=range(len(EXPRESSIONS)))
def test_derivatives_agree_with_sympy(e, rng):
    g = graph.Graph()
    node = g.from_sympy(e)
    for _ in range(2):
        point = dict(zip((x, y, z), rng.uniform(0.3, 0.9, size=3)))
        assert math.isclose(_value(graph.to_sympy(node), point), _value(e, point),
                            rel_tol=1e-13, abs_tol=1e-14)
        for s in (x, y, z):
            d = graph.to_sympy(g.diff(node, g.sym(s)))
            ref = sympy.diff(e, s).replace(sympy.DiracDelta, lambda *a: 0)
            assert math.isclose(_value(d, point), _value(ref, point), rel_tol=1e-12,
                                abs_tol=1e-13), (e, s, d, ref)


def test_derivatives_read_only_what_they_need():
    g = graph.Graph()
    f = g.from_sympy(x * y + sympy.exp(z))
    assert g.diff(f, g.sym(x)) is g.sym(y)
    assert g.diff(f, g.sym(sympy.Symbol("w", real=True))) is g.ZERO
    assert g.symbols(f) == {x, y, z}
    # numbers fold, sums and products flatten, a scaled product shares its product
    assert g.add(g.num(1), g.num(2)) is g.num(3)
    assert g.mul(g.num(0), g.sym(x)) is g.ZERO
    assert g.neg(g.mul(g.sym(x), g.sym(y))).args[1] is g.mul(g.sym(y), g.sym(x))


def test_emit_computes_repeated_subexpressions_once():
    g = graph.Graph()
    a, b = g.from_sympy(sympy.exp(x * y) + z), g.from_sympy(sympy.exp(x * y) * z)
    out, leaves = g.emit([("y0", a, False), ("y1", b, False), ("y2", a, True)],
                         sympy.numbered_symbols("s", real=True))
    assert leaves == {x, y, z}
    temps = [t for t, _, _ in out if isinstance(t, sympy.Symbol)]
    assert len(temps) == 2  # exp(x*y), and a (read twice)
    env, point = {}, {x: 0.3, y: 0.7, z: 1.1}
    for t, v, _ in out:
        val = graph.to_sympy(v).subs(env).subs(point)
        if isinstance(t, sympy.Symbol):
            env[t] = val
        else:
            env[t] = float(val)
    assert math.isclose(env["y0"], _value(sympy.exp(x * y) + z, point))
    assert math.isclose(env["y1"], _value(sympy.exp(x * y) * z, point))


def test_unsupported_expressions_are_refused():
    with pytest.raises(graph.Unsupported):
        graph.Graph().from_sympy(sympy.Derivative(sympy.Function("q")(x), x))


# ------------------------------------------------- a model with every numpy function


def every(u, p, t):
    x, y, z, w = u
    return [
        np.exp(-p.a * x) * np.log(1 + y**2) + x**2.5 / (1 + z**2) + np.sqrt(1 + w**2)
        + y**p.b,
        np.where(x > y, np.sin(x) * np.cos(z), np.tanh(y * w)) + np.maximum(x, z)
        - np.minimum(y, w) + np.abs(x - w) + np.clip(z, -0.5, 0.5) + np.fmax(x, 0.5),
        np.arctan2(x, 1 + y**2) + np.expm1(0.1 * z) + np.log1p(w**2) + np.log2(2 + x**2)
        + np.log10(3 + y**2) + np.arctan(z) + np.sinh(0.2 * w) + np.cosh(0.1 * x)
        + np.arcsinh(y) + np.hypot(x, w) + np.sign(z) * w + np.fabs(y) * x,
        np.where(((x > 0) & ~(y > 2)) | (z < -1), p.a * t * w, -w) + np.tan(0.1 * x)
        + np.arcsin(0.1 * y) + np.arccos(0.1 * z) + np.arccosh(2 + w**2)
        + np.arctanh(0.1 * x) + np.exp2(0.3 * y) + np.reciprocal(2 + z**2) + np.square(w)
        + np.sum([x, y]) + np.prod([z, w]) + np.dot([x, y], [z, w]) + (x - x) * y,
    ]


STATES, PARAMS = ["x", "y", "z", "w"], ["a", "b"]


@pytest.fixture
def graph_mode(monkeypatch):
    """Every network-free model on the graph path, its kernels in chunks of 4
    statements, compiled by LLVM's fast code generator from 30 statements."""
    monkeypatch.setattr(trace, "GRAPH_FROM", 0)
    monkeypatch.setattr(derivatives, "GRAPH_FROM", 0)
    monkeypatch.setattr(irtext, "CHUNK", 4)
    monkeypatch.setattr(llvm, "BIG", 30)


@pytest.fixture(scope="module")
def reference():
    """The same model on the sympy path, every kernel compiled there."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(derivatives, "GRAPH_FROM", 10**9)
        m = sm.Model(every, STATES, PARAMS)
        m.kernel_table("rhs", "jac", "spjac", "paramjac", "vjp", "hvp")
    assert m._asm.sets["f"].gen.graph is None
    return m


def _point(rng):
    return rng.uniform(0.55, 1.45, size=4), np.array([0.7, 1.3]), 0.4


def test_every_function_through_the_graph(graph_mode, reference, rng):
    m = sm.Model(every, STATES, PARAMS)
    assert m._trace.graph is not None and m._asm.sets["f"].gen.graph is not None
    assert reference._trace.graph is None
    u, p, t = _point(rng)
    close(m.rhs(u, p, t), reference.rhs(u, p, t), rtol=1e-13, atol=1e-14)
    J = m.jac(u, p, t)
    close(J, reference.jac(u, p, t), rtol=1e-12, atol=1e-13)
    close(J, central_diff(lambda v: m.rhs(v, p, t), u))
    np.testing.assert_array_equal(m.jac_sparsity.toarray(), reference.jac_sparsity.toarray())
    close(m.spjac(u, p, t).toarray(), J, rtol=1e-14, atol=1e-15)
    Jp = m.paramjac(u, p, t)
    close(Jp, reference.paramjac(u, p, t), rtol=1e-12, atol=1e-13)
    close(Jp, central_diff(lambda q: m.rhs(u, q, t), p))
    lam, v = rng.standard_normal(4), rng.standard_normal(4)
    for got, ref in zip(m.vjp(lam, u, p, t), reference.vjp(lam, u, p, t)):
        close(got, ref, rtol=1e-12, atol=1e-13)
    for got, ref in zip(m.hvp(lam, v, u, p, t), reference.hvp(lam, v, u, p, t)):
        close(got, ref, rtol=1e-11, atol=1e-12)
    # the state part of the hvp against differences of lam^T J v
    close(m.hvp(lam, v, u, p, t)[0], central_diff(lambda q: lam @ m.jac(q, p, t) @ v, u))
    assert not m._asm.sets["f"].gen.autonomous


def test_small_functions_take_the_graph_path(reference, rng):
    # at the real thresholds: traced by sympy (4 states), derived on the graph, the same
    # kernels as sympy's (sympy's second derivatives of Laske_PLOSComputBiol2019's 34
    # states took 24 s, the graph's 0.4 s)
    m = sm.Model(every, STATES, PARAMS)
    assert m._trace.graph is None and m._asm.sets["f"].gen.graph is not None
    u, p, t = _point(rng)
    close(m.jac(u, p, t), reference.jac(u, p, t), rtol=1e-12, atol=1e-13)
    close(m.paramjac(u, p, t), reference.paramjac(u, p, t), rtol=1e-12, atol=1e-13)
    lam, v = rng.standard_normal(4), rng.standard_normal(4)
    for got, ref in zip(m.hvp(lam, v, u, p, t), reference.hvp(lam, v, u, p, t)):
        close(got, ref, rtol=1e-11, atol=1e-12)


def test_python_rendering_of_graph_kernels(graph_mode, rng, tmp_path):
    # Model.source prints the same trees; numba's compile of it agrees with the IR text.
    m = sm.Model(every, STATES, PARAMS)
    path = tmp_path / "every_graph.py"
    path.write_text(m.source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    u, p, t = _point(rng)
    ws = m.workspace()
    for name, out in (("rhs", np.empty(4)), ("spjac", np.empty(m.jac_sparsity.nnz)),
                      ("paramjac", np.empty(8))):
        getattr(mod, name)(out, u, p, t, ws)
        if name == "spjac":
            ref = m.spjac(u, p, t).data
        else:
            ref = getattr(m, name)(u, p, t).reshape(-1)
        close(out, ref, rtol=1e-12, atol=1e-14, err_msg=name)


def test_graph_mode_keeps_the_tracing_errors(graph_mode):
    def branches(u, p, t):
        return [1.0 if u.x > 0 else 0.0]

    with pytest.raises(sm.ModelError, match="branches on a traced value"):
        sm.Model(branches, ["x"], [])

    def constant_condition(u, p, t):
        return [np.where(np.array(1.0) > 0, u.x, -u.x), u.x - u.x]

    m = sm.Model(constant_condition, ["x", "y"], [])
    np.testing.assert_array_equal(m.rhs([2.0, 1.0], []), [2.0, 0.0])
    np.testing.assert_array_equal(m.jac_sparsity.toarray(), [[1, 0], [1, 0]])


def test_networks_stay_on_the_sympy_path(graph_mode, rng):
    net = Chain(2, Dense(3, "tanh"), Dense(1))

    def f(u, p, t, nets):
        return [-p.k * u[0] + nets.U(u)[0], u[0] - u[1]]

    m = sm.Model(f, ["a", "b"], ["k"], nets={"U": net})
    assert m._trace.graph is None and m._asm.sets["f"].gen.graph is None
    theta = m.init_params(k=0.5)
    u = rng.standard_normal(2)
    close(m.jac(u, theta), central_diff(lambda v: m.rhs(v, theta), u))


# ------------------------------------------------------- at the real threshold


def test_robertson_copies_take_the_graph_path(rng):
    small, big = robertson_groups(2), robertson_groups(100)  # 6 and 300 states
    assert small._trace.graph is None and big._trace.graph is not None
    p = rng.uniform(0.5, 2.0, size=3)
    u = rng.uniform(0.1, 1.0, size=300)
    S = big.spjac(u, p)
    ref = sciml.Model(_robertson_sympy, ["a", "b", "c"], ["k1", "k2", "k3"])
    for i in (0, 57, 99):
        s = slice(3 * i, 3 * i + 3)
        scale = 1 + 0.001 * i
        close(big.rhs(u, p)[s], ref.rhs(u[s], p * scale), rtol=1e-13, atol=1e-15)
        close(S.toarray()[s, s], ref.jac(u[s], p * scale), rtol=1e-13, atol=1e-15)
    assert S.nnz == 700


def _robertson_sympy(u, p, t):
    a, b, c = u
    return [-p.k1 * a + p.k3 * b * c, p.k1 * a - p.k2 * b * b - p.k3 * b * c, p.k2 * b * b]


def test_generated_code_grows_linearly(monkeypatch):
    # straight-line (rolled into loops, the code does not grow: test_model_roll)
    monkeypatch.setattr(derivatives, "ROLL", False)
    sizes = {}
    for ng in (100, 300):
        fs = robertson_groups(ng)._asm.sets["f"]
        trees = [fs.tree("rhs", "values"), fs.tree("spjac", "spjac")]
        sizes[ng] = (sum(1 for k in trees for _ in k.statements()), len(llvm.ir_text(trees)))
    for a, b in zip(sizes[100], sizes[300]):
        assert 2.9 < b / a < 3.1


def test_a_graph_traced_model_pickles(graph_mode, rng):
    # as its sympy expressions (unevaluated), from which the copy's kernels take the
    # graph path again
    m = sm.Model(every, STATES, PARAMS)
    m2 = pickle.loads(pickle.dumps(m))
    assert m2._trace.graph is None and m2._asm.sets["f"].gen.graph is not None
    u, p, t = _point(rng)
    close(m2.rhs(u, p, t), m.rhs(u, p, t), rtol=1e-14, atol=1e-15)
    close(m2.spjac(u, p, t).toarray(), m.spjac(u, p, t).toarray(), rtol=1e-13, atol=1e-14)


def test_graph_kernels_call_only_math_functions(monkeypatch):
    # as test_model_alloc checks the sympy path's: after LLVM's O3, nothing but arithmetic,
    # intrinsics and libm (one chunk a kernel here: no spill array on the stack)
    from .test_model_alloc import optimised, violations

    monkeypatch.setattr(trace, "GRAPH_FROM", 0)
    monkeypatch.setattr(derivatives, "GRAPH_FROM", 0)
    fs = sm.Model(every, STATES, PARAMS)._asm.sets["f"]
    trees = [fs.tree(k, m) for k, m in (("rhs", "values"), ("jac", "jac"), ("spjac", "spjac"),
                                         ("paramjac", "paramjac"), ("vjp", "vjp"),
                                         ("hvp", "hvp"))]
    assert all(irtext.graph_kernel(k) for k in trees)
    assert violations(optimised(llvm.ir_text(trees))) == []


def test_a_large_right_hand_side_is_not_linked_into_loops(monkeypatch):
    monkeypatch.setattr(derivatives, "ROLL", False)
    m = robertson_groups(100)
    assert m.linked_code() is not None
    monkeypatch.setattr(llvm, "BIG", 100)
    assert robertson_groups(100).linked_code() is None


def _horner(u, p, t):
    acc = u.x
    for k in range(400):  # a chain of ~1,200 nodes: deeper than the recursion goes
        acc = acc * 0.999 + np.sin(u.y + 0.001 * k)
    return [acc, -p.a * u.y]


def test_deep_expression_chains(graph_mode, rng):
    m = sm.Model(_horner, ["x", "y"], ["a"])
    assert m._trace.graph is not None
    u, p = rng.uniform(0.2, 0.8, size=2), np.array([0.3])

    class V:
        x, y, a = u[0], u[1], p[0]

    close(m.rhs(u, p), np.array(_horner(V, V, 0.0), dtype=float), rtol=1e-12, atol=1e-14)
    close(m.jac(u, p), central_diff(lambda v: m.rhs(v, p), u))
    close(m.spjac(u, p).toarray(), m.jac(u, p), rtol=1e-14, atol=1e-15)
    lam = rng.standard_normal(2)
    close(m.vjp(lam, u, p)[0], lam @ m.jac(u, p), rtol=1e-12, atol=1e-14)


def test_observables_on_the_graph_path_keep_the_strong_zero(graph_mode):
    # test_model_kernels' 0/0 observable, its kernels from the graph (from sympy: the
    # observables are traced with sympy)
    from sciml.model.assembly import call

    m = sm.Model(lambda u, p, t: [-p.k * u.x, p.k * u.x], ["x", "y"], ["k", "a"],
                 observables={"obs": lambda u, p: p.a * u.x,
                              "frac": lambda u, p: p.a * u.x / (u.x + u.y)})
    assert m._asm.sets["g"].gen.graph is not None
    u, th = np.zeros(2), np.array([0.5, 2.0])
    assert np.isnan(m.observe(u, th)[1])
    ubar, pbar = np.full(2, np.nan), np.zeros(2)
    call(m.kernel_table("obs_vjp"), "obs_vjp", (ubar, pbar, np.array([1.0, 0.0]), u, th),
         0.0, m.workspace())
    np.testing.assert_array_equal(ubar, [2.0, 0.0])
    np.testing.assert_array_equal(pbar, [0.0, 0.0])
    u, ybar = np.array([1.0, 3.0]), np.array([0.3, -0.7])
    call(m.kernel_table("obs_vjp"), "obs_vjp", (ubar, pbar, ybar, u, th), 0.0, m.workspace())
    close(ubar, ybar @ central_diff(lambda v: m.observe(v, th), u))
    close(pbar, ybar @ central_diff(lambda q: m.observe(u, q), th))
