"""Repeated groups rolled back into loops (`sciml.model.roll`).

A model traced on the graph path whose outputs repeat a group of expressions
(Robertson copied, a 1-D reaction-diffusion grid) gets kernels with loops over
the groups: each kernel must agree with the same model's straight-line kernels
(`derivatives.ROLL` off) to rounding, keep its size as the groups grow, and read
its per-group constants from tables that every printer handles (the IR text,
llvmlite's builder, the Python rendering). Where the groups do not repeat
exactly (an odd group inside a run, indices that do not step evenly, one sum
over every state), what is not a run stays straight-line and the values are
still right.
"""

import importlib.util

import numpy as np

import sciml
from sciml.model import derivatives, irtext, roll
from sciml.model.code import Loop

from .stiff_models import brusselator_1d, robertson_groups
from .test_model_kernels import central_diff, close

KERNELS = (("rhs", "values"), ("spjac", "spjac"), ("jac", "jac"), ("paramjac", "paramjac"),
           ("vjp", "vjp"), ("hvp", "hvp"))


def _values(m, rng):
    n, npar = m.n_states, m.n_params
    u, p = rng.uniform(0.5, 1.5, n), rng.uniform(0.5, 1.5, npar)
    lam, v = rng.standard_normal(n), rng.standard_normal(n)
    out = {"rhs": m.rhs(u, p, 0.3), "spjac": m.spjac(u, p, 0.3).toarray(),
           "jac": m.jac(u, p, 0.3), "paramjac": m.paramjac(u, p, 0.3)}
    out["vjp_u"], out["vjp_p"] = m.vjp(lam, u, p, 0.3)
    out["hvp_u"], out["hvp_p"] = m.hvp(lam, v, u, p, 0.3)
    return out, (u, p)


def _plain(make, monkeypatch):
    """The model with straight-line kernels (generated now: trees are made on first need)."""
    monkeypatch.setattr(derivatives, "ROLL", False)
    m = make()
    for k, meth in KERNELS:
        m._asm.sets["f"].tree(k, meth)
    monkeypatch.setattr(derivatives, "ROLL", True)
    return m


def _loops(m):
    fs = m._asm.sets["f"]
    return {k: [s for s in fs.tree(k, meth).body if isinstance(s, Loop)] for k, meth in KERNELS}


def _size(m, kernel, method):
    return sum(1 for _ in m._asm.sets["f"].tree(kernel, method).statements())


def _agree(make, monkeypatch, seed):
    m, plain = make(), _plain(make, monkeypatch)
    assert m._asm.sets["f"].gen.graph is not None
    got, _ = _values(m, np.random.default_rng(seed))
    ref, point = _values(plain, np.random.default_rng(seed))
    for k in got:
        close(got[k], ref[k], rtol=1e-13, atol=1e-15, err_msg=k)
    return m, plain, point


def test_robertson_copies_roll(monkeypatch):
    m, plain, (u, p) = _agree(lambda: robertson_groups(100), monkeypatch, 1)
    loops = _loops(m)
    # the first group (scale 1, folded away) stays straight-line; the other 99 roll
    assert [s.stop - s.start for s in loops["rhs"]] == [99]
    assert [s.stop - s.start for s in loops["spjac"]] == [99]
    # vjp: the states' cotangents, and one accumulating loop per parameter's sum
    assert len(loops["vjp"]) == 4
    for k, meth in KERNELS:
        assert _size(m, k, meth) < _size(plain, k, meth) / 5, k
    # and against differences, independently of either printer
    close(m.jac(u, p), central_diff(lambda v: m.rhs(v, p), u))


def test_rolled_code_does_not_grow(monkeypatch):
    small, big = robertson_groups(100), robertson_groups(400)
    for k, meth in KERNELS:
        if k != "jac":  # (the dense Jacobian writes n^2 zeros whatever its form)
            assert _size(small, k, meth) == _size(big, k, meth), k
    # the per-group constants live in tables: data growing with the groups, not code
    tables = big._asm.sets["f"].tree("rhs", "values").tables
    assert tables and all(len(v) == 399 for _, v in tables)


def test_brusselator_rolls_inside_its_boundaries(monkeypatch):
    m, _, _ = _agree(lambda: brusselator_1d(150), monkeypatch, 2)
    loops = _loops(m)["rhs"]
    # x and y: the interior cells roll, the boundary cells (other constants) do not
    assert len(loops) == 2 and all(s.stop - s.start == 148 for s in loops)
    assert not _loops(m)["rhs"][0].body[0].target.args[1].is_Integer


def _odd_groups(n_groups, odd):
    """Groups of two states, group ``odd`` of another form, constants alternating in two
    values, and a second block of outputs over a shuffled order of the states (indices
    that do not step evenly)."""
    perm = np.random.default_rng(7).permutation(n_groups)

    def f(u, p, t):
        a, b = [], []
        for i in range(n_groups):
            x, y = u[2 * i], u[2 * i + 1]
            c = (0.5, 2.0)[i % 2]
            if i == odd:
                a += [-p.k1 * x * x + p.k2 * y, p.k1 * x * x - c * y]
            else:
                a += [-p.k1 * c * x + p.k2 * y * y, p.k1 * c * x - p.k2 * y * y]
            b.append(u[2 * perm[i]] * p.k2 - np.exp(-u[2 * perm[i] + 1]))
        return a + b

    names = [f"{c}{i}" for i in range(n_groups) for c in "xy"]
    return sciml.Model(f, names + [f"z{i}" for i in range(n_groups)], ["k1", "k2"])


def test_runs_break_where_the_groups_differ(monkeypatch):
    m, _, _ = _agree(lambda: _odd_groups(120, 60), monkeypatch, 3)
    loops = _loops(m)["rhs"]
    # one run before the odd group and one after it; the shuffled block stays as it is
    # (any run of it has fewer than MIN_BLOCKS repeats)
    covered = sum(s.stop - s.start for s in loops)
    assert len(loops) == 2 and 100 <= covered <= 119


def test_a_sum_over_every_state_is_computed_once(monkeypatch):
    # each output reads one shared sum of all states (a small model, on the graph path by
    # lowering its threshold): the sum is read by more than MAX_PERIOD outputs, so it is a
    # leaf of the shapes and computed once, before the loop that reads it
    import sympy

    from sciml.model import trace

    monkeypatch.setattr(trace, "GRAPH_FROM", 0)
    monkeypatch.setattr(derivatives, "GRAPH_FROM", 0)

    def f(u, p, t):
        total = sum(u[i] for i in range(40))
        return [-p.k * u[i] + 1e-3 * total for i in range(40)]

    make = lambda: sciml.Model(f, [f"x{i}" for i in range(40)], ["k"])  # noqa: E731
    m, _, _ = _agree(make, monkeypatch, 4)
    rhs = m._asm.sets["f"].tree("rhs", "values").body
    (k,) = [j for j, s in enumerate(rhs) if isinstance(s, Loop)]
    assert rhs[k].stop - rhs[k].start >= 39
    hoisted = rhs[k - 1]
    assert isinstance(hoisted.target, sympy.Symbol) and hoisted.value.op == "mul"
    assert hoisted.target in rhs[k].body[0].value.sympy().free_symbols
    # the same with a budget below the sum's size (the sum is one leaf of the shapes)
    monkeypatch.setattr(roll, "BUDGET", 30)
    _agree(make, monkeypatch, 5)


def test_python_rendering_of_rolled_kernels(rng, tmp_path):
    # Model.source prints the loops and the tables; numba's compile of it agrees with the
    # machine code
    m = robertson_groups(100)
    path = tmp_path / "rolled.py"
    path.write_text(m.source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    u, p = rng.uniform(0.5, 1.5, 300), rng.uniform(0.5, 1.5, 3)
    ws = m.workspace()
    out = np.empty(300)
    mod.rhs(out, u, p, 0.0, ws)
    close(out, m.rhs(u, p), rtol=1e-13, atol=1e-15)
    out = np.empty(m.jac_sparsity.nnz)
    mod.spjac(out, u, p, 0.0, ws)
    close(out, m.spjac(u, p).data, rtol=1e-13, atol=1e-15)
    lam = rng.standard_normal(300)
    ubar, pbar = np.empty(300), np.zeros(3)
    mod.vjp(ubar, pbar, lam, u, p, 0.0, ws)
    for got, ref in zip((ubar, pbar), m.vjp(lam, u, p)):
        close(got, ref, rtol=1e-13, atol=1e-15)


def test_rolled_kernels_through_llvmlites_printer(monkeypatch, rng):
    # the printer a graph kernel falls back to (`sciml.model.llvm`) reads tables too
    def refuse(*args, **kwargs):
        raise irtext.LoweringError("refused for the test")

    ref = robertson_groups(100)
    monkeypatch.setattr(irtext, "kernel_text", refuse)
    m = robertson_groups(100)
    u, p = rng.uniform(0.5, 1.5, 300), rng.uniform(0.5, 1.5, 3)
    close(m.rhs(u, p), ref.rhs(u, p), rtol=1e-13, atol=1e-15)
    close(m.spjac(u, p).toarray(), ref.spjac(u, p).toarray(), rtol=1e-13, atol=1e-15)
    lam = rng.standard_normal(300)
    for got, want in zip(m.vjp(lam, u, p), ref.vjp(lam, u, p)):
        close(got, want, rtol=1e-13, atol=1e-15)


def test_periods():
    cover, period = roll._periodic(np.array([0, 1] * 20), 40)
    assert (period[0], cover[0]) == (2, 40) and (period[1], cover[1]) == (2, 38)
    cover, period = roll._periodic(np.array([3] * 20), 20)
    assert (period[0], cover[0]) == (1, 20) and (period[19], cover[19]) == (1, 1)
    cover, _ = roll._periodic(np.array([5] * 7), 7)  # fewer than MIN_BLOCKS
    assert not cover.any()


def _grid(N):
    """A periodic N x N diffusion-reaction grid (its wrap-around cells step unevenly)."""
    def f(u, p, t):
        out = []
        for i in range(N):
            for j in range(N):
                nb = [((i + 1) % N) * N + j, ((i - 1) % N) * N + j, i * N + (j + 1) % N,
                      i * N + (j - 1) % N]
                k = i * N + j
                out.append(p.a * (sum(u[q] for q in nb) - 4 * u[k]) - p.b * u[k] ** 2)
        return out

    return sciml.Model(f, [f"u{k}" for k in range(N * N)], ["a", "b"])


def test_a_grid_rolls_into_loop_nests(monkeypatch, rng):
    # each row's interior cells are a run; the rows' runs repeat with every index stepping
    # by N from row to row (a loop nest), and the boundary cells repeat from row to row too
    m, _, _ = _agree(lambda: _grid(20), monkeypatch, 7)
    rhs = m._asm.sets["f"].tree("rhs", "values")
    nests = [s for s in rhs.body if isinstance(s, Loop) and isinstance(s.body[0], Loop)]
    assert nests and sum(1 for _ in rhs.statements()) < 100
    grid = _grid(64)
    u, p = rng.uniform(0.5, 1.5, 64 * 64), np.array([0.3, 0.2])
    U = u.reshape(64, 64)
    lap = (np.roll(U, 1, 0) + np.roll(U, -1, 0) + np.roll(U, 1, 1) + np.roll(U, -1, 1) - 4 * U)
    close(grid.rhs(u, p), (0.3 * lap - 0.2 * U**2).ravel(), rtol=1e-13, atol=1e-15)


def test_kernels_of_many_loops_take_the_fast_code_generator(monkeypatch):
    # LLVM's optimising pipeline costs more per loop than per statement: a graph kernel's
    # rolled loops count as llvm.LOOP_SIZE statements each
    from sciml.model import llvm

    rhs = robertson_groups(100)._asm.sets["f"].tree("rhs", "values")
    assert not llvm.is_big(rhs)
    monkeypatch.setattr(llvm, "LOOP_SIZE", llvm.BIG)
    assert llvm.is_big(rhs)


def test_every_function_rolls(monkeypatch, rng):
    # test_model_graph's model using every supported function (piecewise values, logical
    # conditions, libm calls, the inline tanh), copied 12 times with a per-copy constant:
    # each kernel kind rolled agrees with its straight-line form
    from sciml.model import trace

    from .test_model_graph import every

    monkeypatch.setattr(trace, "GRAPH_FROM", 0)
    monkeypatch.setattr(derivatives, "GRAPH_FROM", 0)

    class View:
        def __init__(self, u, k):
            self.u, self.k = u, k

        def __iter__(self):
            return iter(self.u[4 * self.k:4 * self.k + 4])

    def copies(u, p, t):
        out = []
        for k in range(12):
            out += [(1 + 0.01 * k) * e for e in every(View(u, k), p, t)]
        return out

    names = [f"{c}{k}" for k in range(12) for c in "xyzw"]
    make = lambda: sciml.Model(copies, names, ["a", "b"])  # noqa: E731
    m, _, _ = _agree(make, monkeypatch, 6)
    loops = _loops(m)
    # (the hvp's expressions of this model are over roll.BUDGET nodes: left straight-line)
    assert all(loops[k] for k in ("rhs", "spjac", "paramjac", "vjp"))
