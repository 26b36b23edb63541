"""Shared checks for layers on the per-layer path: finite-difference gradients.

`check_gradients(chain, rng)` compares ``Chain.vjp_into`` (input cotangent and the
parameter cotangent it ADDS) with central differences of ``sum(v * chain(x, p))``
in float64, on two random samples.
"""

import numpy as np


def _fd(f, a, eps):
    g = np.zeros_like(a)
    flat, gf = a.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        gf[i] = (up - down) / (2 * eps)
    return g


def check_gradients(chain, rng, n=2, eps=1e-6, tol=1e-6, x=None):
    p = chain.init_params(seed=3) + 0.1 * rng.normal(size=chain.n_params)
    x = rng.normal(size=(n, *chain.in_shape)) if x is None else x
    v = rng.normal(size=(n, *chain.out_shape))
    ws = chain.workspace(n)
    xbar = np.empty_like(x)
    pbar = np.full(chain.n_params, 0.5)  # vjp_into ADDS into pbar

    chain.vjp_into(xbar, pbar, v, x, p, ws)

    def f():
        return float(np.sum(v * chain(x, p)))

    gx = _fd(f, x, eps)
    gp = _fd(f, p, eps)
    scale = max(1.0, np.abs(gx).max(), np.abs(gp).max() if gp.size else 0.0)
    np.testing.assert_allclose(xbar, gx, rtol=0, atol=tol * scale)
    np.testing.assert_allclose(pbar - 0.5, gp, rtol=0, atol=tol * scale)
    return p, x
