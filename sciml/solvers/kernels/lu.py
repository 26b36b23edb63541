"""Dense LU with partial pivoting for the small matrices of implicit steps.

Rosenbrock steps solve with ``W = I/(h*gamma) - J`` several times per step.
numba's ``np.linalg.solve`` allocates its result and copies its operands on
every call (and a LAPACK call costs more than the elimination itself for a
handful of states), so the loops use this plain right-looking elimination.
Both kernels work in place on caller-owned buffers and allocate nothing.
"""

import functools

import numpy as np

from sciml._interpret import per_call, stand_in
from sciml._jit import jit


@jit
def lu_factor_into(A, piv):
    """Factor ``A`` in place as ``P A = L U`` (partial pivoting).

    Parameters
    ----------
    A : ndarray, float64, (n, n)
        Overwritten with ``L`` (strictly below the diagonal, unit diagonal
        implied) and ``U`` (on and above it).
    piv : ndarray, int64, (n,)
        Written: row ``k`` was swapped with row ``piv[k]`` at elimination step ``k``.

    Returns
    -------
    int
        0 on success; ``k + 1`` if the pivot of column ``k`` is exactly zero
        (the matrix is singular; ``A`` is then only partly factored).
    """
    n = A.shape[0]
    for k in range(n):
        p = k
        amax = abs(A[k, k])
        for i in range(k + 1, n):
            v = abs(A[i, k])
            if v > amax:
                amax = v
                p = i
        piv[k] = p
        if amax == 0.0:
            return k + 1
        if p != k:
            for j in range(n):
                tmp = A[k, j]
                A[k, j] = A[p, j]
                A[p, j] = tmp
        inv = 1.0 / A[k, k]
        for i in range(k + 1, n):
            A[i, k] *= inv
        # Rank-one update of the trailing block, row by row (C order: unit stride in j), on
        # views indexed from 0: a loop over range(k + 1, n) indexing A keeps numba's
        # wraparound of negative indices in it, which LLVM does not vectorise (n = 100:
        # 131 -> 86 us a factorisation; no change under 25 states)
        u = A[k, k + 1:]
        for i in range(k + 1, n):
            lik = A[i, k]
            if lik != 0.0:
                row = A[i, k + 1:]
                for j in range(u.shape[0]):
                    row[j] -= lik * u[j]
    return 0


@jit
def lu_solve_into(x, LU, piv):
    """Overwrite ``x`` with the solution of ``A x = b`` (``x`` holds ``b`` on entry).

    Parameters
    ----------
    x : ndarray, float64, (n,)
        Right-hand side on entry, solution on return.
    LU, piv : the output of `lu_factor_into` for ``A``.
    """
    n = LU.shape[0]
    for k in range(n):
        p = piv[k]
        if p != k:
            tmp = x[k]
            x[k] = x[p]
            x[p] = tmp
    for i in range(1, n):
        s = x[i]
        for j in range(i):
            s -= LU[i, j] * x[j]
        x[i] = s
    for i in range(n - 1, -1, -1):
        s = x[i]
        row, xs = LU[i, i + 1:], x[i + 1:]  # views from 0 (see lu_factor_into)
        for j in range(row.shape[0]):
            s -= row[j] * xs[j]
        x[i] = s / LU[i, i]


@jit(inline="always")
def factor_shifted_into(W, J, ihg, mass, sign, piv):
    """``W = ihg M + sign J`` with ``M = diag(mass)`` (empty ``mass``: the identity),
    factored in place as by `lu_factor_into`: the matrix of every implicit step (``sign``
    -1.0 for the forward and adjoint systems, +1.0 for a system integrated in reverse
    time). True if it factored (no zero pivot)."""
    n = J.shape[0]
    unit = mass.shape[0] == 0
    for i in range(n):
        for j in range(n):
            W[i, j] = sign * J[i, j]
        W[i, i] += ihg if unit else ihg * mass[i]
    return lu_factor_into(W, piv) == 0


@jit
def lu_solve_transposed_into(x, LU, piv):
    """Overwrite ``x`` with the solution of ``A^T x = b`` (``x`` holds ``b`` on entry).

    With ``P A = L U``: ``A^T = U^T L^T P``, so solve ``U^T y = b``, then
    ``L^T w = y``, then undo the row swaps in reverse order.
    """
    n = LU.shape[0]
    for i in range(n):
        s = x[i]
        for j in range(i):
            s -= LU[j, i] * x[j]
        x[i] = s / LU[i, i]
    for i in range(n - 1, -1, -1):
        s = x[i]
        for j in range(i + 1, n):
            s -= LU[j, i] * x[j]
        x[i] = s
    for k in range(n - 1, -1, -1):
        p = piv[k]
        if p != k:
            tmp = x[k]
            x[k] = x[p]
            x[p] = tmp


# The interpreter's versions (`sciml._interpret`: the calls made while the engine
# compiles): LAPACK's getrf / getrs, with the same pivoting (row k swapped with row piv[k]
# at step k), 1-2 us a call where the loops above, interpreted, take 20-100 us at 9
# states. The LU is the same matrix up to rounding.


@functools.cache  # once: the stand-ins are called at every step
def lapack(name):
    """LAPACK's routine ``name`` (scipy's wrapper), for the interpreter's stand-ins."""
    from scipy.linalg import lapack as routines

    return getattr(routines, name)


# LAPACK's factors in its own (Fortran) order, by the C-ordered buffer they were copied
# into: getrs takes them as they are, where from the buffer it copies them first (0.4 of
# a solve's 1.3 us at 25 states)
_FORTRAN = per_call({})


@stand_in(lu_factor_into)
def _factor_lapack(A, piv):
    if A.shape[0] == 0:
        return 0
    lu, p, info = lapack("dgetrf")(A)
    A[...] = lu
    piv[:] = p
    _FORTRAN[id(A)] = (A, lu)
    return int(info)  # > 0: the first zero pivot's column + 1, as above


def getrs_into(x, lu, piv, trans):
    """``x`` = the solution from LAPACK's factors ``(lu, piv)``: written in place where
    LAPACK can (a vector, a matrix in Fortran order), else copied back."""
    out = lapack("dgetrs")(lu, piv, x, trans=trans, overwrite_b=1)[0]
    if out is not x:
        x[...] = out


def _solver_lapack(trans):
    def solve(x, LU, piv):
        if x.shape[0] > 0:
            hit = _FORTRAN.get(id(LU))
            getrs_into(x, LU if hit is None or hit[0] is not LU else hit[1], piv, trans)

    return solve


stand_in(lu_solve_into)(_solver_lapack(0))
stand_in(lu_solve_transposed_into)(_solver_lapack(1))


@stand_in(factor_shifted_into)
def _factor_shifted_lapack(W, J, ihg, mass, sign, piv):
    np.multiply(J, sign, out=W)
    W.flat[::W.shape[0] + 1] += ihg if mass.shape[0] == 0 else ihg * mass
    return _factor_lapack(W, piv) == 0
