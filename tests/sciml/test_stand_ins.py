"""The interpreter's stand-ins (`sciml._interpret.stand_in`): numpy and LAPACK for the
engine functions whose loops it runs slowly, against those loops run by the same
interpreter.

Whole solves and gradients run interpreted (``SCIML_INTERPRET=always``: nothing is
compiled) twice, with and without the stand-ins, through every place they stand in:
the Rosenbrock step, its rows, interpolant and error norm, the shifted factorisation,
the sparse LU (dense by LAPACK; the incomplete one of the Krylov solves by its loops),
forward sensitivities (dense LU: their columns in one solve; sparse LU: column by
column), the adjoints' right-hand side and forward state, the discrete adjoint's reverse
pass through Rosenbrock steps (dense and sparse LU), BDF's Newton iterations, a
mass matrix, a non-autonomous model. The pieces that take arrays only are checked on
their own too.
"""

import numpy as np
import pytest

import adjoints
import sciml
from adjoints.kernels import discrete, systems
from sciml import _interpret
from sciml.solvers.kernels import control, lu, record, ros, sparse
from sciml.solvers.tableaus import RODAS5

STANDING_IN = {ros.ros_step: ros._ros_step_numpy, ros.ros_interp: ros._ros_interp_numpy,
               ros.ros_dense_rows: ros._ros_dense_rows_numpy,
               lu.factor_shifted_into: lu._factor_shifted_lapack,
               systems._adjoint_rhs: systems._adjoint_rhs_numpy,
               systems._u_at: systems._u_at_chosen,
               systems._sens_f: systems._sens_f_numpy,
               systems._sens_solve: systems._sens_solve_numpy,
               systems._sens_coupling: systems._sens_coupling_numpy,
               sparse.factor: sparse._factor_dense, sparse.solve: sparse._solve_dense,
               sparse.solve_transposed: sparse._solve_transposed_dense,
               control.err_norm2: control._err_norm2_numpy,
               control.all_finite: control._all_finite_numpy,
               discrete.ros_reverse: discrete._ros_reverse_numpy,
               discrete._ros_step_again: discrete._ros_step_again_numpy,
               record._copy_rows: record._copy_rows_numpy, record.copy_row: record._copy_row_numpy,
               ros._advance: ros._advance_numpy}


def _forced():
    def f(u, p, t):
        x, v = u
        return [v, -p.k * x - p.c * v + p.a * np.sin(2.0 * t)]

    m = sciml.Model(f, ["x", "v"], ["k", "c", "a"])
    t = np.linspace(0.3, 4.0, 9)
    prob = sciml.ODEProblem(m, [1.0, 0.0], (0.0, 4.0), [30.0, 0.8, 2.0])
    return prob, sciml.Data(t, np.column_stack([np.cos(t), -np.sin(t)]))


def _dae():
    def f(u, p, t):
        a, b, c = u
        return [-p.k1 * a + p.k3 * b * c, p.k1 * a - p.k2 * b * b - p.k3 * b * c,
                a + b + c - 1.0]

    m = sciml.Model(f, ["a", "b", "c"], ["k1", "k2", "k3"], mass_matrix=[1.0, 1.0, 0.0])
    return sciml.ODEProblem(m, [1.0, 0.0, 0.0], (0.0, 40.0), [0.04, 3e7, 1e4])


def _runs(stand_ins):
    """Every case's results, interpreted, with or without the stand-ins under test."""
    prob, data = _forced()
    kw = dict(rtol=1e-8, atol=1e-10)
    out = {"forced": sciml.solve(prob, sciml.Rodas5(), saveat=data.t, **kw).u}
    # every step saved and stored: storage grown by the loop (room for 64 steps at first);
    # its dense output, not its steps' times (1e-5 apart here: another order of the same
    # sums changes an error estimate's last bits, which its cancellation magnifies)
    every = sciml.solve(prob, sciml.Rodas5(), dense=True, **kw)
    assert every.stats["n_accepted"] > 64
    out["every"] = np.concatenate([every.u[-1], every(data.t - 0.01).ravel()])
    for linsolve in ("dense", "sparse"):  # BDF's Newton iterations on both LUs
        out[f"bdf {linsolve}"] = sciml.solve(prob, sciml.BDF(linsolve=linsolve),
                                             saveat=data.t, **kw).u
    for name, solver in (("dense", sciml.Rodas5()), ("sparse", sciml.Rodas5(linsolve="sparse")),
                         ("krylov", sciml.Rodas5(linsolve="krylov"))):
        for m in (adjoints.ForwardSensitivity, adjoints.GaussAdjoint,
                  adjoints.InterpolatingAdjoint, adjoints.DiscreteAdjoint):
            if name == "krylov" and m is adjoints.DiscreteAdjoint:
                continue
            v, g = sciml.loss_and_grad(prob, data, solver=solver, sensealg=m(), **kw)
            out[f"{name} {m.__name__}"] = [v, *g]
    out["dae"] = sciml.solve(_dae(), sciml.Rodas5(), rtol=1e-8, atol=1e-12,
                             saveat=[1e-3, 0.1, 1.0, 40.0]).u
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def _interpreted(stand_ins):
    """`_runs` in this process with every engine function interpreted afresh (run under
    ``SCIML_INTERPRET=always``, where nothing of the engine compiles)."""
    saved = _interpret._PY.copy(), _interpret._STAND_INS.copy()
    _interpret._PY.clear()
    if not stand_ins:
        for fn in STANDING_IN:
            del _interpret._STAND_INS[fn]
    try:
        for fn, numpy_ in STANDING_IN.items():
            assert (_interpret.python(fn) is numpy_) == stand_ins
        return {k: v.tolist() for k, v in _runs(stand_ins).items()}
    finally:
        for d, old in zip((_interpret._PY, _interpret._STAND_INS), saved):
            d.clear()
            d.update(old)


_SCRIPT = """
import json
from tests.sciml import test_stand_ins as t, test_tier
out = {"loops": t._interpreted(False), "numpy": t._interpreted(True)}
out["compiled"] = test_tier._compiled_engine_functions()
print(json.dumps(out))
"""


def test_whole_solves_and_gradients_agree_with_and_without_the_stand_ins():
    from .test_tier import _run

    out = _run(_SCRIPT, SCIML_INTERPRET="always")
    assert out["compiled"] == []  # all of it interpreted: loops against stand-ins
    loops, numpy_ = out["loops"], out["numpy"]
    assert loops.keys() == numpy_.keys()
    for key, want in loops.items():
        assert np.all(np.isfinite(want)), key
        # the same arithmetic summed in another order: last bits, which a step's
        # acceptance can carry a little further
        np.testing.assert_allclose(numpy_[key], want, rtol=1e-9, atol=1e-12, err_msg=key)


def test_the_step_rows_and_interpolant_agree_with_their_loops():
    tab, rng = RODAS5._engine, np.random.default_rng(1)
    s, nh = len(tab.c), len(tab.H) // len(tab.c)
    for n, cols in ((9, 9), (3, 5)):  # fewer outputs than the rows' columns too
        K, znew = rng.standard_normal((s, cols)), rng.standard_normal(n)
        for rows in (1 + nh, 1 + nh + s):  # a solve's stored steps; a discrete adjoint's
            D1, D2 = np.zeros((rows, cols)), np.full((rows, cols), 7.0)
            ros.ros_dense_rows.py_func(tab, D1, znew, K)
            ros._ros_dense_rows_numpy(tab, D2, znew, K)
            np.testing.assert_allclose(D2[:, :n], D1[:, :n], rtol=1e-13, atol=1e-14)
            assert np.all(D2[:, n:] == 7.0)  # columns past the state's untouched
            z0 = rng.standard_normal(cols)
            for theta in (0.0, 0.4, 1.0):
                a, b = np.zeros(n), np.full(n, np.nan)
                ros.ros_interp.py_func(a, theta, z0, D1, nh)
                ros._ros_interp_numpy(b, theta, z0, D1, nh)
                np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-14)
        np.testing.assert_array_equal(D1[1 + nh:, :n], K[:, :n])


@pytest.mark.parametrize("mass", [None, [1.0, 0.0, 2.5, 1.0]])
@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_the_shifted_factorisation_agrees_with_its_loops(mass, sign):
    J = np.random.default_rng(2).standard_normal((4, 4))
    mass = np.array([] if mass is None else mass)
    (W1, p1), (W2, p2) = [(np.zeros((4, 4)), np.zeros(4, dtype=np.int64)) for _ in range(2)]
    ok = lu.factor_shifted_into.py_func(W1, J, 3.0, mass, sign, p1)
    assert ok == lu._factor_shifted_lapack(W2, J, 3.0, mass, sign, p2)
    np.testing.assert_array_equal(p2, p1)
    np.testing.assert_allclose(W2, W1, rtol=1e-12, atol=1e-14)


def test_lapacks_own_factors_serve_the_solves_of_one_interpreted_call_only():
    """The dense LU's stand-in solves from LAPACK's own copy of the factors, which it keeps
    beside the engine's buffer: only until the next interpreted call begins, as a compiled
    loop may have factored another matrix into that buffer meanwhile."""
    from scipy.linalg import lapack

    rng = np.random.default_rng(3)
    A, B = (rng.standard_normal((6, 6)) + 6.0 * np.eye(6) for _ in range(2))
    W, piv, b = A.copy(), np.zeros(6, dtype=np.int64), rng.standard_normal(6)
    factor, solve = _interpret.python(lu.lu_factor_into), _interpret.python(lu.lu_solve_into)
    solve_t = _interpret.python(lu.lu_solve_transposed_into)
    _interpret.begin_call()
    assert factor(W, piv) == 0
    for fn, M in ((solve, A), (solve_t, A.T)):
        x = b.copy()
        fn(x, W, piv)
        np.testing.assert_allclose(M @ x, b, rtol=1e-12, atol=1e-12)
    X = rng.standard_normal((6, 3))  # several right-hand sides (C order: through a copy)
    Y = X.copy()
    solve(Y, W, piv)
    np.testing.assert_allclose(A @ Y, X, rtol=1e-12, atol=1e-12)
    # a compiled loop's factorisation of B in the same buffer (the same layout and pivots)
    f, p, _ = lapack.dgetrf(B)
    W[...], piv[:] = f, p
    _interpret.begin_call()
    x = b.copy()
    solve(x, W, piv)
    np.testing.assert_allclose(B @ x, b, rtol=1e-12, atol=1e-12)
