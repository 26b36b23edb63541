"""Krylov solves for the largest systems: restarted GMRES, preconditioned by ILU(0).

Where even the sparse LU's fill is too much (3-D grids, very wide bands), the
implicit steps solve ``W x = b``, ``W = ihg M + sign J``, by GMRES on products
with W (J's values on the trace's pattern: one sparse product a Krylov
vector), right-preconditioned by the incomplete LU of W on J's own pattern
(no fill: `sparse.factor` on the ``"ilu0"`` pattern). Factoring only
refactors the preconditioner and remembers ``(ihg, sign)``; every solve
iterates to ``tol`` relative residual (default 1e-10: Rosenbrock and Newton
steps want nearly exact solves) or ``max_iter`` products. Transposed solves
(adjoints) run GMRES on ``W^T`` with the transposed preconditioner.

Y. Saad, M. H. Schultz, "GMRES: a generalized minimal residual algorithm for
solving nonsymmetric linear systems", SIAM J. Sci. Stat. Comput. 7 (1986);
Y. Saad, "Iterative Methods for Sparse Linear Systems", 2nd ed., SIAM 2003,
Sec. 6.5 and 10.3 (ILU(0)).
"""

import math
from typing import NamedTuple

import numpy as np

from sciml._jit import jit

from . import sparse
from .sparse import SparseLU


class KrylovLin(NamedTuple):
    """GMRES buffers: ``pre`` the ILU(0) of W on J's pattern with the diagonal (a
    `sparse.SparseLU` whose factor pattern is that pattern, natural order, factored by
    `sparse.factor`; its ``Jx`` holds J's values); ``V`` (restart + 1, n) the Krylov
    basis, ``Z`` (restart, n) its preconditioned vectors; ``Hh`` (restart + 1,
    restart), ``g, cs, sn`` (restart + 1,) the least-squares problem; ``x, tmp`` (n,);
    ``at`` (4,) the (ihg, sign) of the two slots; ``tol``, ``max_iter``."""

    pre: SparseLU
    V: np.ndarray
    Z: np.ndarray
    Hh: np.ndarray
    g: np.ndarray
    cs: np.ndarray
    sn: np.ndarray
    x: np.ndarray
    tmp: np.ndarray
    at: np.ndarray
    tol: float
    max_iter: int


def build(s, restart=30, tol=1e-10, max_iter=300):
    """`KrylovLin` from a `sparse.SparseLU` analysed with ``ordering="ilu0"`` (see
    `sparse.analyse`)."""
    n = s.perm.shape[0]
    return KrylovLin(s, np.zeros((restart + 1, n)),
                     np.zeros((restart, n)), np.zeros((restart + 1, restart)),
                     np.zeros(restart + 1), np.zeros(restart + 1), np.zeros(restart + 1),
                     np.zeros(n), np.zeros(n), np.zeros(4), float(tol), int(max_iter))


@jit(inline="always")
def _apply_w(s, ihg, sign, v, out, transposed):
    """``out = (ihg M + sign J) v`` (``J^T`` when ``transposed``)."""
    n = v.shape[0]
    unit = s.mass.shape[0] == 0
    for i in range(n):
        out[i] = ihg * v[i] if unit else ihg * s.mass[i] * v[i]
    jptr, jidx, Jx = s.jptr, s.jidx, s.Jx
    if transposed:
        for i in range(n):
            vi = sign * v[i]
            for q in range(jptr[i], jptr[i + 1]):
                out[jidx[q]] += Jx[q] * vi
    else:
        for i in range(n):
            acc = 0.0
            for q in range(jptr[i], jptr[i + 1]):
                acc += Jx[q] * v[jidx[q]]
            out[i] += sign * acc


@jit
def gmres(k, LU, ihg, sign, b, transposed):
    """Overwrite ``b`` with the solution of ``W x = b`` (``W^T`` when ``transposed``) by
    restarted GMRES, right-preconditioned with the ILU(0) factors ``LU``. Returns the
    products with W taken (``-1`` if it stopped above the tolerance)."""
    s = k.pre
    V, Z, Hh, g, cs, sn, x, tmp = k.V, k.Z, k.Hh, k.g, k.cs, k.sn, k.x, k.tmp
    m = Z.shape[0]
    n = b.shape[0]
    bn = 0.0
    for i in range(n):
        x[i] = 0.0
        bn += b[i] * b[i]
    bn = math.sqrt(bn)
    if bn == 0.0:
        return 0
    target = k.tol * bn
    products = 0
    while True:
        # r = b - W x
        _apply_w(s, ihg, sign, x, tmp, transposed)
        beta = 0.0
        for i in range(n):
            r = b[i] - tmp[i]
            V[0, i] = r
            beta += r * r
        beta = math.sqrt(beta)
        if beta <= target:
            break
        if products >= k.max_iter:
            products = -1
            break
        for i in range(n):
            V[0, i] /= beta
        for j in range(m + 1):
            g[j] = 0.0
        g[0] = beta
        steps = 0
        for j in range(m):
            # z_j = P^-1 v_j (P^-T for the transposed system), w = W z_j
            for i in range(n):
                Z[j, i] = V[j, i]
            if transposed:
                sparse.solve_transposed(s, LU, Z[j])
            else:
                sparse.solve(s, LU, Z[j])
            _apply_w(s, ihg, sign, Z[j], V[j + 1], transposed)
            products += 1
            for l in range(j + 1):  # modified Gram-Schmidt
                h = 0.0
                for i in range(n):
                    h += V[j + 1, i] * V[l, i]
                Hh[l, j] = h
                for i in range(n):
                    V[j + 1, i] -= h * V[l, i]
            h = 0.0
            for i in range(n):
                h += V[j + 1, i] * V[j + 1, i]
            h = math.sqrt(h)
            Hh[j + 1, j] = h
            if h > 0.0:
                for i in range(n):
                    V[j + 1, i] /= h
            for l in range(j):  # the previous rotations on the new column
                a, c = Hh[l, j], Hh[l + 1, j]
                Hh[l, j] = cs[l] * a + sn[l] * c
                Hh[l + 1, j] = -sn[l] * a + cs[l] * c
            a, c = Hh[j, j], Hh[j + 1, j]
            d = math.hypot(a, c)
            cs[j] = a / d if d > 0.0 else 1.0
            sn[j] = c / d if d > 0.0 else 0.0
            Hh[j, j] = d
            Hh[j + 1, j] = 0.0
            g[j + 1] = -sn[j] * g[j]
            g[j] = cs[j] * g[j]
            steps = j + 1
            if abs(g[j + 1]) <= target or products >= k.max_iter:
                break
        # x += Z y, with H y = g (upper triangular, steps x steps)
        for l in range(steps - 1, -1, -1):
            acc = g[l]
            for c2 in range(l + 1, steps):
                acc -= Hh[l, c2] * g[c2]
            g[l] = acc / Hh[l, l]
        for l in range(steps):
            for i in range(n):
                x[i] += g[l] * Z[l, i]
    for i in range(n):
        b[i] = x[i]
    return products
