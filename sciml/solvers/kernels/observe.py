"""Observables along a trajectory, and their reverse pass as adjoint jumps."""

import numpy as np

from sciml._jit import jit

from . import calls
from .structs import BoundModel


@jit
def observe_along(kern, p, ws, Y, ts, U):
    """``Y[i] = g(U[i], p, ts[i])``: Y (T, n_obs), U (T, n)."""
    m = BoundModel(kern, p, ws)
    for i in range(ts.shape[0]):
        calls.observe(m, Y[i], U[i], ts[i])


@jit
def observe_jumps(kern, p, ws, G, pbar, Ybar, U, ts, ub):
    """``G[q] += Ybar[q]^T dg/du`` and ``pbar += Ybar[q]^T dg/dp`` along a trajectory.

    G (T, n) is added to (an adjoint's jumps); U (T, n) the states; ub (n,) scratch.
    """
    m = BoundModel(kern, p, ws)
    for q in range(ts.shape[0]):
        calls.observe_vjp(m, ub, pbar, Ybar[q], U[q], ts[q])
        for i in range(ub.shape[0]):
            G[q, i] += ub[i]


@jit
def observe_sensitivities(kern, p, ws, U, S, ts, rows, cols, y, f, F, direct):
    """Observed values and their derivatives along forward sensitivities.

    For each observation ``j`` (row ``rows[j]`` of the trajectory, observable
    ``cols[j]``): ``f[j] = g_c(U[r], p, ts[r])`` and, for each sensitivity column ``q``,
    ``F[j, q] = dg_c/du S[r, :, q] + dg_c/dp_d`` with ``d = direct[q]``, the model
    parameter that column is the sensitivity to (-1: none, no direct term: a column
    carried from elsewhere). U (T, n), S (T, n, k), direct (k,), y (n_obs,) scratch,
    f (m,), F (m, k).
    """
    m = BoundModel(kern, p, ws)
    n = U.shape[1]
    k = S.shape[2]
    ybar = np.zeros(y.shape[0])
    ub = np.zeros(n)
    pbar = np.zeros(p.shape[0])
    for j in range(rows.shape[0]):
        r, c = rows[j], cols[j]
        calls.observe(m, y, U[r], ts[r])
        f[j] = y[c]
        ybar[c] = 1.0
        for i in range(pbar.shape[0]):
            pbar[i] = 0.0
        calls.observe_vjp(m, ub, pbar, ybar, U[r], ts[r])
        ybar[c] = 0.0
        for q in range(k):
            d = direct[q]
            acc = pbar[d] if d >= 0 else 0.0
            for i in range(n):
                if ub[i] != 0.0:  # (a zero derivative times a non-finite S adds nothing)
                    acc += ub[i] * S[r, i, q]
            F[j, q] = acc
