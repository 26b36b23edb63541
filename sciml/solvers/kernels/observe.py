"""Observables along a trajectory, and their reverse pass as adjoint jumps."""

from sciml._jit import jit

from . import calls
from .structs import Model


@jit
def observe_along(kern, p, ws, Y, ts, U):
    """``Y[i] = g(U[i], p, ts[i])``: Y (T, n_obs), U (T, n)."""
    m = Model(kern, p, ws)
    for i in range(ts.shape[0]):
        calls.observe(m, Y[i], U[i], ts[i])


@jit
def observe_jumps(kern, p, ws, G, pbar, Ybar, U, ts, ub):
    """``G[q] += Ybar[q]^T dg/du`` and ``pbar += Ybar[q]^T dg/dp`` along a trajectory.

    G (T, n) is added to (an adjoint's jumps); U (T, n) the states; ub (n,) scratch.
    """
    m = Model(kern, p, ws)
    for q in range(ts.shape[0]):
        calls.observe_vjp(m, ub, pbar, Ybar[q], U[q], ts[q])
        for i in range(ub.shape[0]):
            G[q, i] += ub[i]
