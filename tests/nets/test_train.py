"""`nets.train`: it fits, it is reproducible, its history and stopping behave."""

import numpy as np
import pytest

import nets
from nets import Chain, Dense

from . import reference as ref

DTYPES = (np.float64, np.float32)


def sine(dtype=np.float64, n=200):
    """y = sin(x) on [-3, 3]: a small regression problem a 1-16-1 tanh net fits."""
    X = np.linspace(-3, 3, n, dtype=dtype).reshape(-1, 1)
    return Chain(1, Dense(16, "tanh"), Dense(1)), X, np.sin(X)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_full_batch_fits_sine(dtype):
    chain, X, Y = sine(dtype)
    p = chain.init_params(seed=0, dtype=dtype)
    hist = nets.train(chain, p, X, Y, loss=nets.MeanSquaredLoss(),
                      optimizer=nets.Adam(2e-2), iters=400)
    assert hist.shape == (400,) and np.all(np.isfinite(hist))
    final, _ = nets.loss_and_grad(chain, p, X, Y, loss=nets.MeanSquaredLoss())
    assert final < 0.05 * hist[0]
    assert p.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_minibatch_fits_sine(dtype):
    chain, X, Y = sine(dtype)
    p = chain.init_params(seed=0, dtype=dtype)
    hist = nets.train(chain, p, X, Y, loss=nets.MeanSquaredLoss(), optimizer=nets.Adam(1e-2),
                      epochs=40, batch_size=16, seed=3)
    assert hist.shape == (40,) and np.all(np.isfinite(hist))
    assert hist[-1] < 0.1 * hist[0]


def test_history_is_loss_before_each_step(rng):
    # iters=3 equals three manual loss_and_grad + update steps.
    chain, X, Y = sine()
    p0 = ref.random_params(chain, rng)
    loss = nets.SquaredLoss(l2=1e-3)
    p = p0.copy()
    hist = nets.train(chain, p, X, Y, loss=loss, optimizer=nets.Adam(1e-2), iters=3)
    q, opt, manual = p0.copy(), nets.Adam(1e-2), []
    for _ in range(3):
        v, g = nets.loss_and_grad(chain, q, X, Y, loss=loss)
        manual.append(v)
        opt.update(q, g)
    np.testing.assert_allclose(hist, manual, rtol=1e-12)
    np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("loss", [nets.SquaredLoss(), nets.MeanSquaredLoss()],
                         ids=lambda l: type(l).__name__)
def test_one_batch_per_epoch_is_full_batch(loss, rng):
    # batch_size == N: each epoch is one full-batch step (rows only reordered).
    chain, X, Y = sine(n=150)
    p0 = ref.random_params(chain, rng)
    p1, p2 = p0.copy(), p0.copy()
    h1 = nets.train(chain, p1, X, Y, loss=loss, optimizer=nets.SGD(1e-3, momentum=0.9),
                    iters=4)
    h2 = nets.train(chain, p2, X, Y, loss=loss, optimizer=nets.SGD(1e-3, momentum=0.9),
                    epochs=4, batch_size=150, seed=1)
    np.testing.assert_allclose(h2, h1, rtol=1e-11)
    np.testing.assert_allclose(p2, p1, rtol=1e-10, atol=1e-13)


def test_epoch_history_sums_minibatch_losses(rng):
    # With a tiny learning rate the parameters barely move, so a sum-loss
    # epoch history is the full-data loss at the start.
    chain, X, Y = sine(n=100)
    p = ref.random_params(chain, rng)
    v0, _ = nets.loss_and_grad(chain, p, X, Y, loss=nets.SquaredLoss())
    m0, _ = nets.loss_and_grad(chain, p, X, Y, loss=nets.MeanSquaredLoss())
    hs = nets.train(chain, p.copy(), X, Y, loss=nets.SquaredLoss(),
                    optimizer=nets.SGD(1e-12), epochs=2, batch_size=7)
    hm = nets.train(chain, p.copy(), X, Y, loss=nets.MeanSquaredLoss(),
                    optimizer=nets.SGD(1e-12), epochs=2, batch_size=7)
    np.testing.assert_allclose(hs, v0, rtol=1e-8)
    np.testing.assert_allclose(hm, m0, rtol=1e-8)


def test_same_seed_same_result_other_seed_differs():
    chain, X, Y = sine()
    results = []
    for seed in (5, 5, 6):
        p = chain.init_params(seed=1)
        h = nets.train(chain, p, X, Y, optimizer=nets.Adam(1e-2), epochs=3, batch_size=32,
                       seed=seed)
        results.append((h, p))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert not np.array_equal(results[0][1], results[2][1])


def test_callback_stops_epochs():
    chain, X, Y = sine()
    p = chain.init_params(seed=0)
    calls = []

    def callback(step, params, loss):
        calls.append((step, loss))
        assert params is p
        return step == 3

    hist = nets.train(chain, p, X, Y, optimizer=nets.Adam(1e-2), epochs=10, batch_size=50,
                      callback=callback)
    assert [c[0] for c in calls] == [1, 2, 3]
    assert hist.shape == (3,)
    np.testing.assert_array_equal(hist, [c[1] for c in calls])


def test_callback_stops_iters():
    chain, X, Y = sine()
    p = chain.init_params(seed=0)
    steps = []

    def callback(step, params, loss):
        steps.append(step)
        return step >= 10

    hist = nets.train(chain, p, X, Y, optimizer=nets.Adam(1e-2), iters=500, callback=callback)
    assert steps == [5, 10]  # blocks of 1% of iters
    assert hist.shape == (10,)


def test_callback_returning_none_does_not_stop():
    chain, X, Y = sine()
    hist = nets.train(chain, chain.init_params(seed=0), X, Y, iters=200,
                      callback=lambda *a: None)
    assert hist.shape == (200,)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_lbfgs(dtype):
    chain, X, Y = sine(dtype)
    p = chain.init_params(seed=0, dtype=dtype)
    v0, _ = nets.loss_and_grad(chain, p, X, Y)
    opt = nets.LBFGS(iters=60)
    hist = nets.train(chain, p, X, Y, optimizer=opt, iters=60)
    assert 1 <= hist.size <= 60
    v1, _ = nets.loss_and_grad(chain, p, X, Y)
    assert p.dtype == dtype
    assert v1 < 0.05 * v0
    np.testing.assert_allclose(hist[-1], v1, rtol=1e-4)


def test_classification_with_cross_entropy(rng):
    # Two Gaussian blobs: cross-entropy training separates them.
    X = np.concatenate([rng.normal(-1.5, 1, (100, 2)), rng.normal(1.5, 1, (100, 2))])
    labels = np.repeat([0, 1], 100)
    chain = Chain(2, Dense(8, "relu"), Dense(2))
    p = chain.init_params(seed=0)
    hist = nets.train(chain, p, X, labels, loss=nets.LogitCrossEntropyLoss(),
                      optimizer=nets.Adam(1e-2), epochs=30, batch_size=20)
    assert hist[-1] < 0.5 * hist[0]
    accuracy = np.mean(chain(X, p).argmax(axis=1) == labels)
    assert accuracy > 0.9


def test_lbfgs_iters_from_optimizer_and_callback_sees_p():
    chain, X, Y = sine()
    p = chain.init_params(seed=0)
    opt = nets.LBFGS(iters=5)
    seen = []

    def cb(step, q, loss):
        assert q is p
        seen.append((step, loss, nets.loss_and_grad(chain, q, X, Y)[0]))

    hist = nets.train(chain, p, X, Y, optimizer=opt, callback=cb)
    assert opt.iters == 5 and 1 <= hist.size <= 5
    assert [s[0] for s in seen] == list(range(1, hist.size + 1))
    for _, loss, recomputed in seen:  # p holds the iterate the loss belongs to
        np.testing.assert_allclose(loss, recomputed, rtol=1e-10)


def test_penalty_applied_once_per_epoch_with_sum_loss():
    # With a sum loss, an epoch of minibatches carries the penalty once in
    # total; a full batch (one minibatch) is the same objective.
    chain, X, Y = sine()
    n = X.shape[0]
    loss = nets.SquaredLoss(l2=0.5)
    p = chain.init_params(seed=0)
    tiny = nets.SGD(lr=1e-12)  # parameters barely move: history ~ the objective at p
    epoch = nets.train(chain, p.copy(), X, Y, loss=loss, optimizer=tiny, epochs=1,
                       batch_size=n // 10)
    full, _ = nets.loss_and_grad(chain, p, X, Y, loss=loss)
    np.testing.assert_allclose(epoch[0], full, rtol=1e-8)
