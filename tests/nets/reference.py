"""Plain numpy references for the `nets` kernels: forward, backprop, finite differences.

Everything here is written for clarity, in float64, one layer at a time,
with the activation values and derivatives of `nets.activations.reference`
(or the ``custom`` mapping for a registered activation).
"""

import numpy as np

from nets import Chain, Dense
from nets.activations import BUILTIN
from nets.activations import reference as activation_reference


def activation(name, z, custom=None):
    """Value and derivative of activation `name` at `z` (float64)."""
    if custom is not None and name in custom:
        f, df = custom[name]
        return f(z), df(z)
    return activation_reference(name, z)


def forward(chain, p, x, custom=None):
    """``chain(x, p)`` in float64, with the tape needed by `vjp`.

    Returns
    -------
    y : ndarray, (n_out,) or (N, n_out)
    tape : list of (input, activation derivative) per layer, 2-D
    """
    x = np.asarray(x, dtype=np.float64)
    single = x.ndim == 1
    h = x.reshape(1, -1) if single else x
    tape = []
    p64 = np.ascontiguousarray(p, dtype=np.float64)
    for layer, v in zip(chain.layers, chain.views(p64)):
        W, b = v.W, v.b
        z = h @ W.T
        if b is not None:
            z = z + b
        a, d = activation(layer.activation, z, custom)
        tape.append((h, d))
        h = a
    return (h[0] if single else h), tape


def vjp(chain, p, x, v, custom=None):
    """Reverse mode by hand: ``xbar = v^T dy/dx`` (per row) and ``pbar = sum_rows v^T dy/dp``."""
    x = np.asarray(x, dtype=np.float64)
    _, tape = forward(chain, p, x, custom)
    p64 = np.ascontiguousarray(p, dtype=np.float64)
    pbar = np.zeros(chain.n_params)
    g = np.asarray(v, dtype=np.float64).reshape(tape[-1][1].shape)
    for (h, d), v, vbar in zip(reversed(tape), reversed(chain.views(p64)),
                               reversed(chain.views(pbar))):
        W, Wbar, bbar = v.W, vbar.W, vbar.b
        dz = g * d
        Wbar += dz.T @ h
        if bbar is not None:
            bbar += dz.sum(axis=0)
        g = dz @ W
    return (g[0] if x.ndim == 1 else g), pbar


def fd_params(f, p, h=1e-6):
    """Central differences of the scalar ``f(p)`` (float64 `p`), one entry at a time."""
    p = np.array(p, dtype=np.float64)
    out = np.empty_like(p)
    for k in range(p.size):
        old = p[k]
        p[k] = old + h
        fp = f(p)
        p[k] = old - h
        fm = f(p)
        p[k] = old
        out[k] = (fp - fm) / (2 * h)
    return out


def fd_input_jacobian(fun, x, n_out, h=1e-6):
    """Central differences of ``fun(X) -> (N, n_out)`` with respect to each row's inputs.

    All rows are perturbed together (rows are independent), so this costs
    2 * n_in evaluations. Returns (N, n_out, n_in).
    """
    X = np.atleast_2d(np.asarray(x, dtype=np.float64))
    J = np.empty((X.shape[0], n_out, X.shape[1]))
    for i in range(X.shape[1]):
        Xp, Xm = X.copy(), X.copy()
        Xp[:, i] += h
        Xm[:, i] -= h
        J[:, :, i] = (fun(Xp) - fun(Xm)) / (2 * h)
    return J


def random_chain(rng, n_in=None, widths=None, activations=BUILTIN, max_width=40,
                 max_depth=4):
    """A chain with random widths (1..max_width), depth, activations and biases."""
    n_in = int(rng.integers(1, max_width + 1)) if n_in is None else n_in
    if widths is None:
        widths = rng.integers(1, max_width + 1, size=int(rng.integers(1, max_depth + 1)))
    layers = [Dense(int(w), str(rng.choice(activations)), bool(rng.random() < 0.75))
              for w in widths]
    return Chain(n_in, *layers)


def random_params(chain, rng, dtype=np.float64):
    """`init_params` weights and N(0, 0.5^2) biases (larger than init_params' own, so
    that biases matter in the comparisons)."""
    p = chain.init_params(seed=int(rng.integers(2**31)), dtype=np.float64)
    for v in chain.views(p):
        if v.b is not None:
            v.b[:] = rng.normal(0.0, 0.5, size=v.b.shape)
    return p.astype(dtype)


def weight_mask(chain):
    """Boolean mask of the weight entries (not biases) of the flat vector."""
    mask = np.zeros(chain.n_params, dtype=bool)
    for nin, nout, _, woff, _ in chain.dense_layers:
        mask[woff:woff + nin * nout] = True
    return mask
