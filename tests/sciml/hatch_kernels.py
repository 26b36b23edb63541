"""Module-level numba kernels for `Model.from_kernels` tests (they must be importable)."""

import numba


@numba.njit(cache=True)
def decay_rhs(du, u, p, t, ws):
    du[0] = -p[0] * u[0]


@numba.njit(cache=True)
def decay_vjp(ubar, pbar, lam, u, p, t, ws):
    ubar[0] = -p[0] * lam[0]
    pbar[0] += -u[0] * lam[0]
