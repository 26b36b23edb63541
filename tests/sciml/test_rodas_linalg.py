"""The dense LU kernels of `sciml.solvers.kernels.lu` against numpy/scipy, and their allocations.

``lu_solve_transposed_into`` (A^T x = b with the factors of A) serves the stiff adjoints.
"""

import numba
import numpy as np
import pytest
import scipy.linalg
from hypothesis import given
from hypothesis import strategies as st
from numba.core.runtime import _nrt_python, rtsys

from sciml.solvers.kernels.lu import (
    factor_shifted_into,
    lu_factor_into,
    lu_solve_into,
    lu_solve_transposed_into,
)


def factor(A):
    LU = np.array(A, dtype=np.float64, order="C")
    piv = np.zeros(LU.shape[0], dtype=np.int64)
    info = lu_factor_into(LU, piv)
    return LU, piv, info


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 30])
def test_factor_matches_scipy(rng, n):
    A = rng.normal(size=(n, n))
    LU, piv, info = factor(A)
    ref_lu, ref_piv = scipy.linalg.lu_factor(A)
    assert info == 0
    # Same pivoting rule (largest magnitude in the column), same pivot convention.
    np.testing.assert_array_equal(piv, ref_piv)
    np.testing.assert_allclose(LU, ref_lu, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sign", [-1.0, 1.0])
@pytest.mark.parametrize("with_mass", [False, True])
def test_factor_shifted_is_the_shifted_matrix_factored(rng, sign, with_mass):
    n = 5
    J = rng.normal(size=(n, n))
    mass = np.array([1.0, 0.0, 2.0, 1.0, 0.5]) if with_mass else np.zeros(0)
    W, piv = np.full((n, n), np.nan), np.zeros(n, dtype=np.int64)
    assert factor_shifted_into(W, J, 37.0, mass, sign, piv)
    M = np.diag(mass) if with_mass else np.eye(n)
    ref_lu, ref_piv = scipy.linalg.lu_factor(37.0 * M + sign * J)
    np.testing.assert_array_equal(piv, ref_piv)
    np.testing.assert_allclose(W, ref_lu, rtol=1e-12, atol=1e-12)
    assert not factor_shifted_into(W, np.zeros((n, n)), 0.0, mass, sign, piv)  # singular


@pytest.mark.parametrize("n", [1, 2, 4, 9, 20])
def test_solve_matches_numpy(rng, n):
    # A W-like matrix: diagonal shift minus a Jacobian with large entries.
    J = rng.normal(size=(n, n)) * 10.0 ** rng.uniform(-2, 4, size=(n, 1))
    A = np.eye(n) / 0.019 - J
    b = rng.normal(size=n)
    LU, piv, _ = factor(A)
    x = b.copy()
    lu_solve_into(x, LU, piv)
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(A @ x, b, rtol=1e-9, atol=1e-9 * np.abs(A).max())


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9, 20])
def test_solve_transposed_matches_scipy(rng, n):
    # A^T x = b from the factors of A: scipy's lu_solve(trans=1) and a dense solve with A^T.
    J = rng.normal(size=(n, n)) * 10.0 ** rng.uniform(-2, 4, size=(n, 1))
    A = np.eye(n) / 0.019 - J
    b = rng.normal(size=n)
    LU, piv, _ = factor(A)
    x = b.copy()
    lu_solve_transposed_into(x, LU, piv)
    np.testing.assert_allclose(x, scipy.linalg.lu_solve(scipy.linalg.lu_factor(A), b, trans=1),
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(x, np.linalg.solve(A.T, b), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(A.T @ x, b, rtol=1e-9, atol=1e-9 * np.abs(A).max())
    if n > 1 and not np.allclose(A, A.T):  # not the plain solve under another name
        y = b.copy()
        lu_solve_into(y, LU, piv)
        assert not np.allclose(x, y)


def test_permutation_is_applied(rng):
    # A zero leading pivot forces a row swap.
    A = np.array([[0.0, 2.0, 1.0], [3.0, 1.0, 0.0], [1.0, 0.0, 4.0]])
    LU, piv, info = factor(A)
    assert info == 0 and piv[0] == 1
    b = rng.normal(size=3)
    x = b.copy()
    lu_solve_into(x, LU, piv)
    np.testing.assert_allclose(A @ x, b, atol=1e-14)
    x = b.copy()
    lu_solve_transposed_into(x, LU, piv)  # the swaps undone after the triangular solves
    np.testing.assert_allclose(A.T @ x, b, atol=1e-14)


def test_transposed_with_several_swaps(rng):
    # Pivots at every step, in an order where applying the swaps in the wrong order
    # (or before the triangular solves) gives a wrong answer.
    n = 5
    P = np.eye(n)[[3, 0, 4, 1, 2]]
    A = P @ (np.triu(rng.uniform(1, 2, (n, n))) + np.tril(rng.uniform(0, 0.5, (n, n)), -1))
    LU, piv, info = factor(A)
    assert info == 0 and np.count_nonzero(piv != np.arange(n)) >= 2
    b = rng.normal(size=n)
    x = b.copy()
    lu_solve_transposed_into(x, LU, piv)
    np.testing.assert_allclose(x, np.linalg.solve(A.T, b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("A, column", [
    (np.zeros((3, 3)), 0),
    (np.array([[1.0, 2.0], [2.0, 4.0]]), 1),
    (np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), 1),
])
def test_singular_reports_column(A, column):
    _, _, info = factor(A)
    assert info == column + 1


@given(st.integers(1, 7), st.integers(0, 2**32 - 1))
def test_random_solves(n, seed):
    g = np.random.default_rng(seed)
    A = g.normal(size=(n, n)) + n * np.eye(n) * g.uniform(0, 2)
    b = g.normal(size=n)
    if np.linalg.cond(A) > 1e10:
        return
    LU, piv, info = factor(A)
    assert info == 0
    x = b.copy()
    lu_solve_into(x, LU, piv)
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-8, atol=1e-10)
    x = b.copy()
    lu_solve_transposed_into(x, LU, piv)
    np.testing.assert_allclose(x, np.linalg.solve(A.T, b), rtol=1e-8, atol=1e-10)


@numba.njit
def _factor_and_solve_many(reps, A, LU, piv, x, b):
    for _ in range(reps):
        LU[:, :] = A
        lu_factor_into(LU, piv)
        x[:] = b
        lu_solve_into(x, LU, piv)
        lu_solve_transposed_into(x, LU, piv)


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_no_allocation(rng):
    was = _nrt_python.memsys_stats_enabled()
    _nrt_python.memsys_enable_stats()
    try:
        n = 6
        args = (rng.normal(size=(n, n)) + 5 * np.eye(n), np.zeros((n, n)),
                np.zeros(n, dtype=np.int64), np.zeros(n), rng.normal(size=n))
        _factor_and_solve_many(1, *args)  # compile
        a0 = rtsys.get_allocation_stats().alloc
        _factor_and_solve_many(1, *args)
        a1 = rtsys.get_allocation_stats().alloc
        _factor_and_solve_many(101, *args)
        a2 = rtsys.get_allocation_stats().alloc
        assert (a2 - a1) - (a1 - a0) == 0
    finally:
        if not was:
            _nrt_python.memsys_disable_stats()


@pytest.mark.parametrize("n", [0, 1, 2, 5, 9, 30])
def test_the_interpreters_lapack_stand_ins_agree_with_the_loops(rng, n):
    """What the interpreted engine runs for the three (`sciml._interpret.python`: LAPACK's
    getrf/getrs) against the loops' own Python: the same pivots, the same factors and
    solutions to rounding."""
    from sciml._interpret import python

    A, b = rng.normal(size=(n, n)), rng.normal(size=n)
    loops, lapack = [], []
    for run, out in ((lambda f: f.py_func, loops), (python, lapack)):
        LU, piv = A.copy(), np.zeros(n, dtype=np.int64)
        info = run(lu_factor_into)(LU, piv)
        x, y = b.copy(), b.copy()
        run(lu_solve_into)(x, LU, piv)
        run(lu_solve_transposed_into)(y, LU, piv)
        out.extend([info, piv, LU, x, y])
    assert loops[0] == lapack[0] == 0
    np.testing.assert_array_equal(loops[1], lapack[1])
    for want, got in zip(loops[2:], lapack[2:]):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)
    singular = np.array([[1.0, 2.0], [2.0, 4.0]])
    assert python(lu_factor_into)(singular, np.zeros(2, dtype=np.int64)) == 2  # as the loop
