"""Chains beyond Dense: the LeNet shape contract, training, threads, JAX parity, the
layer protocol with a user-defined layer, allocation-free kernels, input errors."""

from dataclasses import dataclass

import numpy as np
import pytest

import nets
from nets import (
    AdaptiveAvgPool,
    AvgPool,
    Chain,
    Conv,
    ConvTranspose,
    Dense,
    Flatten,
    Layer,
    LPPool,
    MaxPool,
)

from ..alloc import allocations_in, needs_jit
from .layer_checks import check_gradients


def lenet():
    return Chain((1, 28, 28), Conv(6, (5, 5), "relu"), MaxPool((2, 2)), Conv(16, (5, 5), "relu"),
                 MaxPool((2, 2)), Flatten(), Dense(120, "relu"), Dense(84, "relu"), Dense(10))


def small():
    # every kernel family, float64, small: conv (stride 1 and 2), pooling, dense
    return Chain((2, 9, 9), Conv(4, (3, 3), "tanh", padding=1), MaxPool((2, 2)),
                 Conv(3, (2, 2), "softplus", stride=2), Flatten(), Dense(5, "tanh"), Dense(3))


def blobs(rng, n, shape, classes=3):
    """Images whose class is the channel-0 quadrant holding a bright blob."""
    y = rng.integers(0, classes, size=n)
    x = 0.3 * rng.normal(size=(n, *shape))
    h, w = shape[1] // 2, shape[2] // 2
    for i, c in enumerate(y):
        r, s = divmod(int(c), 2)
        x[i, 0, r * h:(r + 1) * h, s * w:(s + 1) * w] += 1.5
    return x, y


def test_lenet_shape_contract(rng):
    chain = lenet()
    assert chain.out_shape == (10,) and chain.n_params == 44426 and not chain.fused
    assert [s for _, s in chain.shapes()] == [(6, 24, 24), (6, 12, 12), (16, 8, 8), (16, 4, 4),
                                             (256,), (120,), (84,), (10,)]
    p64 = chain.init_params(seed=0)
    x = rng.random((3, 1, 28, 28))
    y = chain(x, p64)
    assert y.dtype == np.float64 and y.shape == (3, 10)
    np.testing.assert_allclose(chain(x[0], p64), y[0], rtol=1e-13)  # one sample, no batch axis
    # (float32: the same generic source; its compile, ~60 s cold across the layer kernels, is
    # left to the benchmark, which trains in float32, to keep make test inside CI's limit)


def test_gradients_through_the_chain(rng):
    check_gradients(small(), rng)


@pytest.mark.parametrize("loss", [nets.LogitCrossEntropyLoss(l2=0.01),
                                  nets.MeanSquaredLoss(l1=0.01)], ids=lambda l: type(l).__name__)
def test_loss_and_grad_finite_differences(loss, rng):
    chain = small()
    p = chain.init_params(seed=1)
    x, labels = blobs(rng, 7, chain.in_shape)
    Y = labels if isinstance(loss, nets.LogitCrossEntropyLoss) else rng.normal(size=(7, 3))
    val, g = nets.loss_and_grad(chain, p, x, Y, loss=loss, threads=2)
    Yarr = np.asarray(Y)
    ref = loss(chain(x, p), Yarr) + sum(
        loss.l1 * np.abs(v["weight"]).sum() + loss.l2 * (v["weight"] ** 2).sum()
        for v in chain.views(p) if "weight" in v)
    assert np.isclose(val, ref, rtol=1e-12)
    k = rng.choice(chain.n_params, 12, replace=False)
    for i in k:
        e = np.zeros_like(p)
        e[i] = 1e-6
        fd = (nets.loss_and_grad(chain, p + e, x, Y, loss=loss)[0]
              - nets.loss_and_grad(chain, p - e, x, Y, loss=loss)[0]) / 2e-6
        assert np.isclose(g[i], fd, rtol=1e-5, atol=1e-7), i


def test_train_learns_and_is_deterministic(rng):
    chain = small()
    x, y = blobs(rng, 300, chain.in_shape)
    runs = []
    for threads in (2, 2, 1):
        p = chain.init_params(seed=0)
        hist = nets.train(chain, p, x, y, loss=nets.LogitCrossEntropyLoss(),
                          optimizer=nets.Adam(3e-2), epochs=6, batch_size=50, seed=3,
                          threads=threads)
        runs.append((p, hist))
    (p1, h1), (p2, h2), (p3, _) = runs
    np.testing.assert_array_equal(p1, p2)  # same thread count: bitwise the same
    np.testing.assert_allclose(p1, p3, rtol=1e-9, atol=1e-12)  # another: rounding only
    assert h1[-1] < 0.1 * h1[0]
    assert np.mean(np.argmax(chain(x, p1), axis=1) == y) > 0.95


def test_vjp_chunks_and_threads_agree(rng):
    # more samples than the workspace holds: chunks; the sum over lanes in fixed order
    chain = small()
    p = chain.init_params(seed=2)
    x = rng.normal(size=(11, *chain.in_shape))
    v = rng.normal(size=(11, 3))
    out = []
    for batch in (11, 4):
        ws = chain.workspace(batch)
        xbar, pbar = np.empty_like(x), np.zeros(chain.n_params)
        chain.vjp_into(xbar, pbar, v, x, p, ws)
        y = np.empty((11, 3))
        chain.forward_into(y, x, p, ws)
        out.append((xbar, pbar, y))
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_jax_parity(rng):
    jax = pytest.importorskip("jax")
    nets_jax = pytest.importorskip("nets.jax")
    chain = Chain((2, 8, 7), Conv(3, (3, 2), "tanh", padding=(1, 0)),
                  ConvTranspose(2, (2, 2), "sigmoid", stride=2), AvgPool((2, 2), padding=1),
                  LPPool(2, (2, 1)), MaxPool((2, 2), stride=1), AdaptiveAvgPool((2, 3)),
                  Flatten(), Dense(4, "gelu"))
    p = chain.init_params(seed=4)
    x = rng.normal(size=(3, *chain.in_shape))
    v = rng.normal(size=(3, 4))
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        y = np.asarray(nets_jax.apply(chain, p, x))
        np.testing.assert_allclose(y, chain(x, p), rtol=1e-11, atol=1e-12)
        gp, gx = jax.grad(lambda q, z: (nets_jax.apply(chain, q, z) * v).sum(), (0, 1))(p, x)
        tree = nets_jax.params_to_pytree(chain, p)
        back = nets_jax.pytree_to_params(chain, tree)
    finally:
        jax.config.update("jax_enable_x64", previous)
    xbar, pbar = np.empty_like(x), np.zeros(chain.n_params)
    chain.vjp_into(xbar, pbar, v, x, p, chain.workspace(3))
    np.testing.assert_allclose(pbar, gp, rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(xbar, gx, rtol=1e-10, atol=1e-11)
    assert tree[0]["weight"].shape == (3, 2, 3, 2) and tree[1]["weight"].shape == (3, 2, 2, 2)
    np.testing.assert_array_equal(back, p)


@dataclass(frozen=True)
class Affine(Layer):
    """y = a * x + c per channel, numpy only; counts training calls in its state."""

    def out_shape(self, in_shape):
        return tuple(in_shape)

    def param_shapes(self, in_shape):
        return (("weight", (in_shape[0],)), ("bias", (in_shape[0],)))

    def state_shapes(self, in_shape):
        return (("calls", (1,)),)

    def init_params(self, in_shape, arrays, rng):
        arrays["weight"][...] = 1.0

    def init_state(self, in_shape, arrays):
        arrays["calls"][...] = 10.0

    def forward(self, ctx, x, y, p, s, scratch):
        a, c = np.split(p, 2)
        y[...] = a.reshape(-1, 1, 1) * x + c.reshape(-1, 1, 1)
        if ctx.training:
            s[0] += 1.0

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        c = len(p) // 2
        pbar[:c] += (ybar * x).sum(axis=(0, 2, 3))
        pbar[c:] += ybar.sum(axis=(0, 2, 3))
        if xbar is not None:
            xbar[...] = p[:c].reshape(-1, 1, 1) * ybar


def test_a_user_layer_through_the_protocol(rng):
    chain = Chain((2, 4, 4), Affine(), Conv(2, (3, 3)), Flatten(), Dense(2))
    assert chain.n_state == 1 and chain.n_params == 4 + 38 + 18
    p = chain.init_params(seed=0)
    assert np.array_equal(chain.views(p)[0]["weight"], [1.0, 1.0])
    state = chain.init_state()
    assert state[0] == 10.0
    check_gradients(chain, rng)
    x, y = rng.normal(size=(8, 2, 4, 4)), rng.integers(0, 2, size=8)
    nets.train(chain, p, x, y, loss=nets.LogitCrossEntropyLoss(), epochs=2, batch_size=4,
               threads=1, state=state)
    assert state[0] == 14.0  # four training steps
    chain(x, p, state=state)
    assert state[0] == 14.0  # evaluation mode leaves it


def test_input_errors(rng):
    chain = lenet()
    p = chain.init_params(seed=0)
    with pytest.raises(ValueError, match=r"\(1, 28, 28\) or \(N, 1, 28, 28\) \(the input of "
                                         r"layer 0, Conv\(6, \(5, 5\), 'relu'\)\), got \(2, 3, 28"):
        chain(np.zeros((2, 3, 28, 28)), p)
    with pytest.raises(ValueError, match=r"`X` must have shape \(N, 1, 28, 28\)"):
        nets.train(chain, p, np.zeros((4, 784)), np.zeros(4, int), epochs=1, batch_size=2,
                   loss=nets.LogitCrossEntropyLoss())
    with pytest.raises(ValueError, match=r"layer 1 \(Dense.*put a Flatten\(\) before it"):
        Chain((1, 8, 8), Conv(2, (3, 3)), Dense(3))
    with pytest.raises(TypeError, match="layer 0 must be a nets layer"):
        Chain((1, 8, 8), "conv")
    with pytest.raises(ValueError, match="`input_size`"):
        Chain((1, 0, 8), Flatten())
    with pytest.raises(ValueError, match=r"`J` must have shape \(10, 1, 28, 28\)"):
        chain.jacobian_into(np.zeros((10, 784)), np.zeros((1, 28, 28)), p, chain.workspace())
    with pytest.raises(ValueError, match="`state` must be"):
        Chain((1, 4, 4), Affine(), Flatten())(np.zeros((1, 4, 4)), np.zeros(2),
                                              state=np.zeros(3))




@needs_jit
@pytest.mark.usefixtures("nrt_stats")
def test_kernels_allocate_nothing(rng):
    from nets import conv, lanestep, layerwise, linear, pool

    chain = small()
    ws = chain.workspace(4)
    lane = ws.lanes[0]
    p = chain.init_params(seed=0)
    n = lane.rows
    x = rng.normal(size=(n, *chain.in_shape))
    chain.forward_into(np.empty((n, 3)), x, p, ws)
    cases = []
    h = x.reshape(n, -1)
    for l, L in enumerate(chain._plan):
        y = lane.out[l][:n * L.out_size].reshape(n, -1)
        pp = p[L.poff:L.poff + L.n_params]
        g = np.zeros_like(pp)
        layer = L.layer
        if isinstance(layer, Conv):
            geo, taps = layer._geo(L.in_shape)
            cases += [(conv.conv_forward, (geo, taps, False, h, pp, True, y, lane.scratch[l])),
                      (conv.conv_pullback, (geo, taps, False, h, pp, True, y, np.empty_like(h),
                                            True, g, lane.scratch[l]))]
        elif isinstance(layer, MaxPool):
            geo = layer._geo(L.in_shape)
            taps = pool._taps(geo)
            cases += [(pool._pool, (geo, 1.0, h, y, y, h, taps, False)),
                      (pool._pool, (geo, 1.0, h, y, y, np.empty_like(h), taps, True))]
        elif isinstance(layer, Dense):
            cases += [(linear.dense_forward, (h, pp, layer.out, True, y, lane.scratch[l])),
                      (linear.dense_pullback, (h, pp, layer.out, True, y, np.empty_like(h),
                                               True, g))]
        h = y
    T = np.zeros((n, 1))
    cases += [(layerwise.loss_seed, (2, h, T, np.empty_like(h), 1.0))]
    # max pooling's own kernel for 2x2 windows tiling the input (LeNet's)
    geo = MaxPool((2, 2)).pool_args((2, 8, 8))[0]
    x8, y8 = rng.normal(size=(n, 128)), np.empty((n, 32))
    cases += [(pool._pool, (geo, 1.0, x8, y8, y8, x8, pool._taps(geo), False)),
              (pool._pool, (geo, 1.0, x8, y8, y8, np.empty_like(x8), pool._taps(geo), True))]
    # the whole training step of a lane in one call (nets.lanestep)
    prog = lane.program(chain)
    X2, rows = x.reshape(n, -1), np.arange(n, dtype=np.int64)
    cases += [(lanestep.train_step, prog.step_args(X2, T, rows, 0, n, p, 2, 1.0))]
    assert prog.table[0, lanestep.FM]  # its convolution and pooling feature-major
    for kernel, args in cases:
        assert allocations_in(kernel, args)[1] == 0, kernel


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
def test_jacobian_of_a_layer_chain_matches_finite_differences(batched, rng):
    # Not a fused Dense chain (a convolution; an activation with a constant): one vjp
    # per output, J shaped (N,) + out_shape + in_shape.
    chain = Chain((1, 6, 6), Conv(2, (3, 3), "tanh"), MaxPool((2, 2)), Flatten(),
                  Dense(3, "elu(alpha=2.0)"))
    p = chain.init_params(seed=0)
    x = rng.normal(size=(4, 1, 6, 6) if batched else (1, 6, 6))
    J = np.full(x.shape[:-3] + (3, 1, 6, 6), np.nan)
    chain.jacobian_into(J, x, p, chain.workspace())
    xs = x.reshape(-1, 36)
    h = 1e-6
    for i in range(36):
        e = np.zeros(36)
        e[i] = h
        up = chain((xs + e).reshape(x.shape), p)
        down = chain((xs - e).reshape(x.shape), p)
        fd = (up - down) / (2 * h)
        np.testing.assert_allclose(J.reshape(*x.shape[:-3], 3, 36)[..., i], fd, atol=1e-8)
