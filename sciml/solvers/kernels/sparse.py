"""Sparse LU on a fixed pattern: the linear algebra of large stiff steps.

An implicit step solves with ``W = ihg I + sign J`` where J has the pattern the
trace gave (`sciml.model.Model.jac_sparsity`). The pattern never changes, so
the expensive analysis runs once per model (`analyse`, on the Python side):

1. a fill-reducing symmetric ordering ``q`` of ``pattern(J) + pattern(J)^T +
   I`` (minimum degree on ``A^T + A``, SuperLU's, via scipy);
2. the fill pattern of the LU of ``B = W[q][:, q]`` without pivoting
   (`symbolic`, row by row: row i of the factors is row i of B joined with
   the rows of U it is eliminated against);
3. where each stored entry of J lands in the factors (``jmap``) and where the
   diagonals are.

Each step then refactors numerically on that pattern (`factor`), in compiled
code, writing only the factor's values: no allocation, no pivot search.
Diagonal pivots suit these matrices: for small ``h`` they are dominated by
``ihg I``; when a pivot vanishes the factorisation reports failure and the loop
retries a smaller step, as it does for a singular dense W. `solve` and
`solve_transposed` (for adjoints) are the two triangular sweeps each way.

Storage is CSR throughout: row i of the factors at ``ptr[i]:ptr[i + 1]`` of
``idx`` (sorted columns) and the values; ``diag[i]`` the position of (i, i);
L's unit diagonal is implied (entries left of ``diag[i]``), U holds the rest.
"""

from typing import NamedTuple

import numpy as np

from sciml._interpret import python, stand_in
from sciml._jit import jit

from .lu import getrs_into, lapack


class SparseLU(NamedTuple):
    """A fixed-pattern LU of ``ihg I + sign J`` (see the module text).

    jptr, jidx : J's CSR pattern (the model's); jmap (nnz_J,) : position of each of
    J's entries in the factors; perm (n,) : the ordering q (row/column i of the
    factors is q[i] of W); ptr, idx, diag : the factors' pattern; Jx (nnz_J,) : J's
    values; mass : the diagonal mass matrix (empty: the identity); LU1, LU2 (nnz_LU,) :
    two factorisations (a system uses one or both); w (n,) : scratch; mark (n,) int64 :
    scratch of an incomplete LU (``"ilu0"``), empty for the exact one.
    """

    jptr: np.ndarray
    jidx: np.ndarray
    jmap: np.ndarray
    perm: np.ndarray
    ptr: np.ndarray
    idx: np.ndarray
    diag: np.ndarray
    Jx: np.ndarray
    mass: np.ndarray
    LU1: np.ndarray
    LU2: np.ndarray
    w: np.ndarray
    mark: np.ndarray


@jit(once=True)
def symbolic(bptr, bidx, n):
    """The fill pattern of the LU without pivoting of a matrix with CSR pattern
    ``(bptr, bidx)`` (diagonal present, columns sorted): ``(ptr, idx, diag)``.

    Row i starts as B's row; each column k < i reached, in increasing order,
    brings in U's row k beyond its diagonal (kept in a sorted linked list).
    """
    nxt = np.full(n + 1, -1, dtype=np.int64)  # sorted list of a row's columns; n = end
    cap = max(2 * bidx.shape[0], 16)
    idx = np.empty(cap, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    diag = np.zeros(n, dtype=np.int64)
    mark = np.full(n, -1, dtype=np.int64)
    nnz = 0
    for i in range(n):
        head = n  # empty list
        # B's row (sorted): build the list back to front
        for p in range(bptr[i + 1] - 1, bptr[i] - 1, -1):
            j = bidx[p]
            nxt[j] = head
            head = j
            mark[j] = i
        k = head
        while k < i:
            # merge U's row k (columns > k, sorted) after k
            prev = k
            for p in range(diag[k] + 1, ptr[k + 1]):
                j = idx[p]
                if mark[j] != i:
                    mark[j] = i
                    while nxt[prev] < j:
                        prev = nxt[prev]
                    nxt[j] = nxt[prev]
                    nxt[prev] = j
                    prev = j
                else:
                    while prev != j:
                        prev = nxt[prev]
            k = nxt[k]
        j = head
        while j < n:
            if nnz >= cap:
                cap *= 2
                grown = np.empty(cap, dtype=np.int64)
                grown[:nnz] = idx[:nnz]
                idx = grown
            if j == i:
                diag[i] = nnz
            idx[nnz] = j
            nnz += 1
            j = nxt[j]
        ptr[i + 1] = nnz
    return ptr, idx[:nnz].copy(), diag


def analyse(jptr, jidx, n, ordering="mmd"):
    """The `SparseLU` structure for J's CSR pattern ``(jptr, jidx)`` (n x n).

    ``ordering``: ``"mmd"`` (minimum degree on A^T + A, the least fill in general) or
    ``"rcm"`` (reverse Cuthill-McKee: the smallest band, inside which all fill stays:
    the banded LU of a banded matrix, any matrix made banded first), or ``"ilu0"``
    (natural order and no fill: the pattern of an incomplete LU, for `krylov`).
    """
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    jptr = np.ascontiguousarray(jptr, dtype=np.int64)
    jidx = np.ascontiguousarray(jidx, dtype=np.int64)
    A = sp.csr_array((np.ones(jidx.shape[0]), jidx, jptr), shape=(n, n))
    S = (A + A.T + sp.eye_array(n, format="csr")).tocsc()
    S.data[:] = 1.0
    if ordering == "ilu0":
        perm = np.arange(n, dtype=np.int64)
    elif ordering == "rcm":
        from scipy.sparse.csgraph import reverse_cuthill_mckee  # (0.07 s to import)

        perm = reverse_cuthill_mckee(S.tocsr(), symmetric_mode=True).astype(np.int64)
    elif n > 2:
        # Only the column ordering is wanted; a diagonally dominant matrix on the
        # symmetric pattern keeps SuperLU's pivots on the diagonal.
        S.setdiag(float(n + 1))
        # SuperLU factors A Pc with Pc[i, perm_c[i]] = 1: column j is A's column i
        # where perm_c[i] = j, so the order of columns is perm_c's inverse.
        perm_c = splu(S, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                      options={"SymmetricMode": True}).perm_c
        perm = np.argsort(perm_c).astype(np.int64)
    else:
        perm = np.arange(n, dtype=np.int64)
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    B = S.tocsr()[perm][:, perm]
    B.sort_indices()
    bptr, bidx = B.indptr.astype(np.int64), B.indices.astype(np.int64)
    if ordering == "ilu0":
        ptr, idx = bptr, bidx
        diag = _positions(ptr, idx, np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64))
    else:
        ptr, idx, diag = symbolic(bptr, bidx, n)
    rows = np.repeat(np.arange(n), np.diff(jptr))
    jmap = _positions(ptr, idx, inv[rows], inv[jidx])
    mark = np.zeros(n if ordering == "ilu0" else 0, dtype=np.int64)
    return SparseLU(jptr, jidx, jmap, perm, ptr, idx, diag, np.zeros(jidx.shape[0]),
                    np.zeros(0), np.zeros(idx.shape[0]), np.zeros(idx.shape[0]), np.zeros(n),
                    mark)


@jit(once=True)
def _positions(ptr, idx, rows, cols):
    """Position in the factors' storage of each entry (rows[e], cols[e])."""
    out = np.empty(rows.shape[0], dtype=np.int64)
    for e in range(rows.shape[0]):
        i, j = rows[e], cols[e]
        lo, hi = ptr[i], ptr[i + 1] - 1
        while lo < hi:  # columns of a row are sorted
            mid = (lo + hi) // 2
            if idx[mid] < j:
                lo = mid + 1
            else:
                hi = mid
        out[e] = lo
    return out


@jit
def factor(s, LU, ihg, sign):
    """``LU`` = the factors of ``ihg M + sign J`` (J's values in ``s.Jx``, M = diag(s.mass),
    the identity when empty) on the factors' pattern. True if it factored: every pivot
    finite and non-zero.

    On a pattern with its fill (`symbolic`) this is the exact LU; on one without (the
    ``"ilu0"`` analysis) the updates outside it are dropped (``mark``): the incomplete
    LU that preconditions `krylov.gmres`.
    """
    ptr, idx, diag, w, mark = s.ptr, s.idx, s.diag, s.w, s.mark
    n = diag.shape[0]
    drop = mark.shape[0] > 0  # an incomplete LU: updates outside the pattern dropped
    for q in range(LU.shape[0]):
        LU[q] = 0.0
    for e in range(s.Jx.shape[0]):
        LU[s.jmap[e]] += sign * s.Jx[e]
    unit = s.mass.shape[0] == 0
    for i in range(n):
        LU[diag[i]] += ihg if unit else ihg * s.mass[s.perm[i]]
        if drop:
            mark[i] = -1
    for i in range(n):
        lo, hi = ptr[i], ptr[i + 1]
        for q in range(lo, hi):
            w[idx[q]] = LU[q]
            if drop:
                mark[idx[q]] = i
        for q in range(lo, diag[i]):
            k = idx[q]
            lik = w[k] / LU[diag[k]]
            w[k] = lik
            if lik != 0.0:
                if drop:
                    for r in range(diag[k] + 1, ptr[k + 1]):
                        j = idx[r]
                        if mark[j] == i:
                            w[j] -= lik * LU[r]
                else:
                    # with its fill, row i's pattern holds all of U's row k beyond k
                    for r in range(diag[k] + 1, ptr[k + 1]):
                        w[idx[r]] -= lik * LU[r]
        for q in range(lo, hi):
            LU[q] = w[idx[q]]
            w[idx[q]] = 0.0
        piv = LU[diag[i]]
        if piv == 0.0 or not np.isfinite(piv):
            return False
    return True


@jit
def solve(s, LU, x):
    """Overwrite ``x`` with the solution of ``W x = b`` (``x`` holds ``b``)."""
    ptr, idx, diag, w, perm = s.ptr, s.idx, s.diag, s.w, s.perm
    n = perm.shape[0]
    for i in range(n):
        acc = x[perm[i]]
        for q in range(ptr[i], diag[i]):
            acc -= LU[q] * w[idx[q]]
        w[i] = acc
    for i in range(n - 1, -1, -1):
        acc = w[i]
        for q in range(diag[i] + 1, ptr[i + 1]):
            acc -= LU[q] * w[idx[q]]
        w[i] = acc / LU[diag[i]]
    for i in range(n):
        x[perm[i]] = w[i]
        w[i] = 0.0


@jit
def solve_transposed(s, LU, x):
    """Overwrite ``x`` with the solution of ``W^T x = b`` (``x`` holds ``b``).

    With ``B = W[q][:, q] = L U``: ``U^T`` forward then ``L^T`` backward, both
    sweeping U's and L's rows as columns.
    """
    ptr, idx, diag, w, perm = s.ptr, s.idx, s.diag, s.w, s.perm
    n = perm.shape[0]
    for i in range(n):
        w[i] = x[perm[i]]
    for i in range(n):
        wi = w[i] / LU[diag[i]]
        w[i] = wi
        if wi != 0.0:
            for q in range(diag[i] + 1, ptr[i + 1]):
                w[idx[q]] -= LU[q] * wi
    for i in range(n - 1, -1, -1):
        wi = w[i]
        if wi != 0.0:
            for q in range(ptr[i], diag[i]):
                w[idx[q]] -= LU[q] * wi
    for i in range(n):
        x[perm[i]] = w[i]
        w[i] = 0.0


# The interpreter's versions (`sciml._interpret`: the calls made while the engine
# compiles). The loops above, interpreted, take a Python step per entry of the factors
# (Laske_PLOSComputBiol2019's 34 states: 60 % of an interpreted gradient). Up to
# `DENSE_MAX` states the stand-ins factor W densely by LAPACK (getrf, with partial
# pivoting where the loops keep the diagonal: the same solutions up to rounding) and keep
# that factorisation beside the values' array for the solves (getrs). The values' array
# is filled with NaN meanwhile: nothing reads it as a factorisation, and a solve finds
# the dense one only while it holds the NaN (a compiled refactorisation overwrites it).
# The incomplete LU (`krylov`'s preconditioner) and larger systems run the loops.

DENSE_MAX = 200
_DENSE = {}  # id(LU) -> (LU, W's dense LU, its pivots)


@stand_in(factor)
def _factor_dense(s, LU, ihg, sign):
    n = s.diag.shape[0]
    if s.mark.shape[0] > 0 or n > DENSE_MAX:
        _DENSE.pop(id(LU), None)
        return python(factor.py_func)(s, LU, ihg, sign)
    W = np.zeros((n, n))
    W[np.repeat(np.arange(n), np.diff(s.jptr)), s.jidx] = sign * s.Jx
    W.flat[::n + 1] += ihg if s.mass.shape[0] == 0 else ihg * s.mass
    lu, piv, info = lapack("dgetrf")(W)
    LU[:] = np.nan
    if len(_DENSE) > 32:  # (it holds the arrays)
        _DENSE.clear()
    _DENSE[id(LU)] = LU, lu, piv
    return info == 0 and bool(np.isfinite(lu).all())


def _dense_solver(loops, trans):
    def solve_dense(s, LU, x):
        hit = _DENSE.get(id(LU))
        if hit is None or hit[0] is not LU or not np.isnan(LU[0]):
            return python(loops.py_func)(s, LU, x)
        getrs_into(x, hit[1], hit[2], trans)

    return solve_dense


_solve_dense = stand_in(solve)(_dense_solver(solve, 0))
_solve_transposed_dense = stand_in(solve_transposed)(_dense_solver(solve_transposed, 1))
