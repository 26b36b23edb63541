"""`BatchNorm`, `InstanceNorm`, `LayerNorm` through the layer protocol: numpy references,
running statistics, central differences, JAX, PyTorch, allocation-free kernels."""

import numpy as np
import pytest

from nets import norm
from nets.norm import BatchNorm, InstanceNorm, LayerNorm

from ..alloc import allocations_in, needs_jit
from .layer_checks import Run, check_fd, check_jax


def bn_ref(x, w, b, eps, mean=None, var=None):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if mean is None:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    return y * w.reshape(shape) + b.reshape(shape)


def randomize(run, rng):
    run.p[:] = 1.0 + 0.3 * rng.standard_normal(run.p.size)
    return run


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 5)], ids=["1d_vec", "1d", "2d"])
def test_batchnorm_training_eval_and_running_stats(shape, rng):
    run = randomize(Run(BatchNorm(3, momentum=0.2), shape, training=True), rng)
    x = 2.0 + rng.standard_normal(shape)
    w, b = run.p[:3], run.p[3:]
    y, s = run.forward(x)
    np.testing.assert_allclose(y, bn_ref(x, w, b, 1e-5), rtol=1e-12, atol=1e-12)
    axes = (0,) + tuple(range(2, x.ndim))
    M = x.size // 3
    np.testing.assert_allclose(s[:3], 0.2 * x.mean(axis=axes), rtol=1e-13)
    np.testing.assert_allclose(s[3:6], 0.8 + 0.2 * x.var(axis=axes) * M / (M - 1), rtol=1e-13)
    assert s[6] == 1.0
    # evaluation: the running statistics, the state untouched
    run.ctx.training = False
    y2, s2 = run.forward(x, s=s.copy())
    np.testing.assert_array_equal(s2, s)
    np.testing.assert_allclose(y2, bn_ref(x, w, b, 1e-5, s[:3], s[3:6]), rtol=1e-12)
    check_fd(run, x, rng)
    run.ctx.training = True
    check_fd(run, x, rng)


def test_batchnorm_cumulative_average_and_no_tracking(rng):
    run = Run(BatchNorm(2, momentum=None), (5, 2, 3), training=True)
    s = run.s0.copy()
    xs = [rng.standard_normal((5, 2, 3)) for _ in range(3)]
    for x in xs:
        run.forward(x, s=s)
    np.testing.assert_allclose(s[:2], np.mean([x.mean(axis=(0, 2)) for x in xs], axis=0))
    assert s[4] == 3
    free = Run(BatchNorm(2, track_running_stats=False, affine=False), (5, 2, 3))
    assert free.s0.size == 0 and free.p.size == 0
    assert free.layer.couples_batch(False)  # batch statistics in evaluation mode too
    np.testing.assert_allclose(free.forward(xs[0])[0], bn_ref(xs[0], np.ones(2), np.zeros(2),
                                                             1e-5), rtol=1e-12)
    check_fd(free, xs[0], rng)


def in_ref(x, w, b, eps):
    axes = tuple(range(2, x.ndim))
    m, v = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - m) / np.sqrt(v + eps) * w.reshape(shape) + b.reshape(shape)


@pytest.mark.parametrize("affine", [True, False])
def test_instancenorm(affine, rng):
    run = Run(InstanceNorm(3, affine=affine, eps=1e-3), (2, 3, 4, 5))
    if affine:
        randomize(run, rng)
    x = rng.standard_normal((2, 3, 4, 5)) * 3 + 1
    w, b = (run.p[:3], run.p[3:]) if affine else (np.ones(3), np.zeros(3))
    np.testing.assert_allclose(run.forward(x)[0], in_ref(x, w, b, 1e-3), rtol=1e-12, atol=1e-13)
    assert not run.layer.couples_batch(True)
    check_fd(run, x, rng)


@pytest.mark.parametrize("affine, bias", [(True, True), (True, False), (False, False)])
def test_layernorm(affine, bias, rng):
    run = Run(LayerNorm((4, 5), elementwise_affine=affine, bias=bias), (3, 2, 4, 5))
    if affine:
        randomize(run, rng)
    x = rng.standard_normal((3, 2, 4, 5))
    m, v = x.mean(axis=(2, 3), keepdims=True), x.var(axis=(2, 3), keepdims=True)
    ref = (x - m) / np.sqrt(v + 1e-5)
    if affine:
        ref = ref * run.p[:20].reshape(4, 5) + (run.p[20:].reshape(4, 5) if bias else 0)
    np.testing.assert_allclose(run.forward(x)[0], ref, rtol=1e-12, atol=1e-13)
    check_fd(run, x, rng)


def test_against_pytorch(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((4, 3, 6))
    t = torch.nn.BatchNorm1d(3, momentum=0.3).double()
    with torch.no_grad():
        t.weight.uniform_(0.5, 1.5)
        t.bias.uniform_(-0.5, 0.5)
    run = Run(BatchNorm(3, momentum=0.3), x.shape, training=True)
    run.p[:] = torch.cat([t.weight, t.bias]).detach().numpy()
    y, s = run.forward(x)
    ty = t(torch.tensor(x))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s, np.concatenate([t.running_mean, t.running_var,
                                                  [t.num_batches_tracked.item()]]), rtol=1e-12)
    ln = torch.nn.LayerNorm((3, 6)).double()
    run = Run(LayerNorm((3, 6)), x.shape)
    np.testing.assert_allclose(run.forward(x)[0], ln(torch.tensor(x)).detach().numpy(),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make, shape, training", [
    (lambda: BatchNorm(3), (4, 3, 5), True),
    (lambda: BatchNorm(3), (4, 3, 5), False),
    (lambda: InstanceNorm(3, affine=True), (2, 3, 4), False),
    (lambda: LayerNorm(4), (3, 2, 4), False),
], ids=["batchnorm_train", "batchnorm_eval", "instancenorm", "layernorm"])
def test_jax_mirror(make, shape, training, rng):
    run = randomize(Run(make(), shape, training=training), rng)
    check_jax(run, rng.standard_normal(shape), rng)


def test_float32(rng):
    run = Run(BatchNorm(3), (4, 3, 5), dtype=np.float32, training=True)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    y, _ = run.forward(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, bn_ref(x.astype(float), np.ones(3), np.zeros(3), 1e-5),
                               rtol=1e-5, atol=1e-5)


@needs_jit
@pytest.mark.usefixtures("nrt_stats")
def test_kernels_allocate_nothing(rng):
    X = rng.standard_normal((4, 3, 5))
    Y, Xb = np.empty_like(X), np.empty_like(X)
    m, r, v = np.empty(3), np.empty(3), np.empty(3)
    p, pb = np.ones(6), np.zeros(6)
    for kernel, args in ((norm.group_stats, (X, m, r, v, 1e-5)),
                         (norm.normalize, (X, Y, m, r, p, 1, 3, True)),
                         (norm.normalize_pullback, (X, Y, Xb, True, m, r, p, pb, 1, 3, True,
                                                    True))):
        assert allocations_in(kernel, args)[1] == 0, kernel


@pytest.mark.parametrize("make, shape, match", [
    (lambda: BatchNorm(3), (4,), "expects 3 channels first"),
    (lambda: InstanceNorm(3), (3,), "needs spatial axes"),
    (lambda: LayerNorm((4, 5)), (4, 6), "trailing shape must be \\(4, 5\\)"),
])
def test_shape_errors(make, shape, match):
    with pytest.raises(ValueError, match=match):
        make().out_shape(shape)


@pytest.mark.parametrize("make, match", [
    (lambda: BatchNorm(0), "`channels` must be a positive int"),
    (lambda: BatchNorm(2, eps=0), "`eps` must be a positive number"),
    (lambda: BatchNorm(2, momentum=2.0), "`momentum` must be in \\[0, 1\\] or None"),
    (lambda: LayerNorm(()), "`normalized_shape` must be a positive int"),
])
def test_bad_settings(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_in_a_chain_training_mode_against_differences(rng):
    # through nets.Chain: batch statistics (one block: couples_batch), state updated,
    # Dropout's masks the same in forward and pullback for one seed
    from nets import Chain, Dense
    from nets.dropout import Dropout
    from nets.pool import Flatten

    chain = Chain((2, 4), BatchNorm(2), LayerNorm(4), Flatten(), Dropout(0.3), Dense(3, "tanh"))
    p = chain.init_params(seed=2) + 0.1 * rng.standard_normal(chain.n_params)
    x, v = rng.standard_normal((6, 2, 4)), rng.standard_normal((6, 3))
    state = chain.init_state(np.float64)
    chain(x, p, state=state, training=True, seed=4)
    assert state[-1] == 1.0 and np.any(state[:2] != 0)

    def f(xx, pp):
        # a fresh workspace: its call counter, and so the masks, as in the vjp below
        y = np.empty((6, 3))
        chain.forward_into(y, xx, pp, chain.workspace(batch=6),
                           state=chain.init_state(np.float64), training=True, seed=4)
        return float(np.sum(v * y))

    xbar, pbar = np.zeros_like(x), np.zeros(chain.n_params)
    chain.vjp_into(xbar, pbar, v, x, p, chain.workspace(batch=6), state=chain.init_state(
        np.float64), training=True, seed=4)
    h = 1e-6
    for k in range(0, chain.n_params, 5):
        e = np.zeros(chain.n_params)
        e[k] = h
        fd = (f(x, p + e) - f(x, p - e)) / (2 * h)
        assert abs(fd - pbar[k]) <= 1e-6 * (1 + abs(fd)), k
    for k in range(0, x.size, 7):
        e = np.zeros(x.size)
        e[k] = h
        e = e.reshape(x.shape)
        fd = (f(x + e, p) - f(x - e, p)) / (2 * h)
        assert abs(fd - xbar.ravel()[k]) <= 1e-6 * (1 + abs(fd)), k
