"""Shared checks for layers: one layer through the protocol of `nets.layers.Layer` (no
chain: `Run`, `check_fd` against central differences, `check_jax` against JAX), and a
chain on the per-layer path (`check_gradients`: ``Chain.vjp_into``, the input cotangent
and the parameter cotangent it ADDS, against central differences of
``sum(v * chain(x, p))`` in float64, on two random samples)."""

import numpy as np

from nets.layers import Context


class Run:
    """One layer on one input shape: its arrays sized once, as a chain would size them."""

    def __init__(self, layer, x_shape, dtype=np.float64, rng=None, training=False, key=7):
        self.layer, self.dtype = layer, np.dtype(dtype)
        self.in_shape = tuple(x_shape[1:])
        self.N = x_shape[0]
        self.out_shape = (self.N, *layer.out_shape(self.in_shape))
        self.ctx = Context(training=training, key=key)
        rng = rng or np.random.default_rng(0)
        self.p = np.zeros(layer.n_params(self.in_shape), dtype=dtype)
        layer.init_params(self.in_shape, layer.unpack(layer.param_shapes(self.in_shape), self.p),
                          rng)
        self.s0 = np.zeros(layer.n_state(self.in_shape), dtype=dtype)
        layer.init_state(self.in_shape, layer.unpack(layer.state_shapes(self.in_shape), self.s0))
        self.scratch = np.zeros(max(layer.scratch_size(self.in_shape, self.N), 1), dtype=dtype)

    def forward(self, x, p=None, s=None):
        """(y, state after the call)."""
        s = self.s0.copy() if s is None else s
        y = np.full(self.out_shape, np.nan, dtype=self.dtype)
        self.layer.forward(self.ctx, np.ascontiguousarray(x, dtype=self.dtype),
                           y, self.p if p is None else p, s, self.scratch)
        return y, s

    def vjp(self, v, x, p=None):
        """(xbar, pbar) at (x, p) for the cotangent v (a forward first, as the chain does)."""
        p = self.p if p is None else p
        y, s = self.forward(x, p)
        pbar = np.zeros_like(p)
        xbar = np.full(x.shape, np.nan, dtype=self.dtype)
        self.layer.pullback(self.ctx, np.array(v, dtype=self.dtype), np.asarray(x, self.dtype),
                            y, p, s, pbar, xbar, self.scratch)
        return xbar, pbar


def check_fd(run, x, rng, n=10, h=1e-6, rtol=1e-6):
    """The pullback against central differences of ``sum(v * forward)`` (float64)."""
    v = rng.standard_normal(run.out_shape)
    xbar, pbar = run.vjp(v, x)

    def f(xx, pp):
        return float(np.sum(v * run.forward(xx, pp)[0]))

    for k in rng.choice(x.size, min(n, x.size), replace=False):
        e = np.zeros(x.size)
        e[k] = h
        e = e.reshape(x.shape)
        fd = (f(x + e, run.p) - f(x - e, run.p)) / (2 * h)
        assert abs(fd - xbar.ravel()[k]) <= rtol * (1 + abs(fd)), ("x", k, fd, xbar.ravel()[k])
    for k in rng.choice(run.p.size, min(n, run.p.size), replace=False):
        e = np.zeros(run.p.size)
        e[k] = h
        fd = (f(x, run.p + e) - f(x, run.p - e)) / (2 * h)
        assert abs(fd - pbar[k]) <= rtol * (1 + abs(fd)), ("p", k, fd, pbar[k])


def check_jax(run, x, rng, rtol=1e-12):
    """jax_apply's value and JAX's gradients against forward and pullback."""
    import pytest

    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    layer = run.layer
    pshapes, sshapes = layer.param_shapes(run.in_shape), layer.state_shapes(run.in_shape)
    state = {k: jnp.asarray(a) for k, a in layer.unpack(sshapes, run.s0).items()}

    def f(xx, pp):
        return layer.jax_apply(layer.unpack(pshapes, pp), state, xx, run.ctx)

    y, _ = run.forward(x)
    np.testing.assert_allclose(np.asarray(f(jnp.asarray(x), jnp.asarray(run.p))), y, rtol=rtol,
                               atol=rtol)
    v = rng.standard_normal(run.out_shape)
    gx, gp = jax.grad(lambda xx, pp: jnp.sum(v * f(xx, pp)), argnums=(0, 1))(
        jnp.asarray(x), jnp.asarray(run.p))
    xbar, pbar = run.vjp(v, x)
    np.testing.assert_allclose(np.asarray(gx), xbar, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gp), pbar, rtol=1e-10, atol=1e-12)


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
