"""Threaded gradients: agree with one thread, and do not depend on scheduling."""

import os
import threading

import numba
import numpy as np
import pytest

import nets
from nets import Chain, Dense

from . import reference as ref

pytestmark = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                reason="needs NUMBA_NUM_THREADS >= 2")

N = 8 * nets.kernels.B + 37  # about four chunks per thread with two threads


def record_nt(chain):
    """Wrap the chain's `loss_grad` kernel to record the thread count it is given."""
    seen = []
    kernel = chain._kernels["loss_grad"]

    def spy(*args):
        seen.append(args[-2])  # (..., nt, want_grad)
        return kernel(*args)

    chain._kernels = {**chain._kernels, "loss_grad": spy}
    return seen


@pytest.mark.parametrize("loss", [nets.SquaredLoss(l2=0.01), nets.MeanSquaredLoss(),
                                  nets.AbsoluteLoss()], ids=lambda l: type(l).__name__)
def test_two_threads_match_one(loss, rng):
    chain = Chain(3, Dense(16, "tanh"), Dense(8, "silu"), Dense(2))
    p = ref.random_params(chain, rng)
    X, Y = rng.normal(size=(N, 3)), rng.normal(size=(N, 2))
    seen = record_nt(chain)
    prev = numba.get_num_threads()
    v1, g1 = nets.loss_and_grad(chain, p, X, Y, loss=loss, threads=1)
    v2, g2 = nets.loss_and_grad(chain, p, X, Y, loss=loss, threads=2)
    assert seen == [1, 2]
    assert numba.get_num_threads() == prev  # restored
    np.testing.assert_allclose(v2, v1, rtol=1e-12)
    np.testing.assert_allclose(g2, g1, rtol=1e-12, atol=1e-12 * np.abs(g1).max())
    v_ref = loss(chain(X, p), Y) + loss.l2 * np.sum(p[ref.weight_mask(chain)] ** 2)
    np.testing.assert_allclose(v2, v_ref, rtol=1e-11)


def test_logit_cross_entropy_threads(rng):
    chain = Chain(3, Dense(10, "relu"), Dense(4))
    p = ref.random_params(chain, rng)
    X, labels = rng.normal(size=(N, 3)), rng.integers(0, 4, size=N)
    loss = nets.LogitCrossEntropyLoss()
    v1, g1 = nets.loss_and_grad(chain, p, X, labels, loss=loss, threads=1)
    v2, g2 = nets.loss_and_grad(chain, p, X, labels, loss=loss, threads=2)
    np.testing.assert_allclose(v2, v1, rtol=1e-12)
    np.testing.assert_allclose(g2, g1, rtol=1e-12, atol=1e-12 * np.abs(g1).max())


@pytest.mark.parametrize("n", [N, 2 * nets.kernels.B + 1, 3 * nets.kernels.B - 5])
def test_threaded_result_is_bitwise_reproducible(n, rng):
    chain = Chain(3, Dense(16, "tanh"), Dense(2))
    p = ref.random_params(chain, rng)
    X, Y = rng.normal(size=(n, 3)), rng.normal(size=(n, 2))
    runs = [nets.loss_and_grad(chain, p, X, Y, threads=2) for _ in range(6)]
    for v, g in runs[1:]:
        assert v == runs[0][0]
        np.testing.assert_array_equal(g, runs[0][1])


def test_threaded_training_matches_one_thread(rng):
    chain = Chain(2, Dense(12, "tanh"), Dense(1))
    p0 = ref.random_params(chain, rng)
    X = rng.uniform(-2, 2, size=(N, 2))
    Y = np.sin(X[:, :1]) * X[:, 1:]
    hist, ps = [], []
    for threads in (1, 2, 2):
        p = p0.copy()
        hist.append(nets.train(chain, p, X, Y, loss=nets.MeanSquaredLoss(),
                               optimizer=nets.Adam(1e-2), iters=20, threads=threads))
        ps.append(p)
    np.testing.assert_allclose(hist[1], hist[0], rtol=1e-10)
    np.testing.assert_allclose(ps[1], ps[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(ps[2], ps[1])
    np.testing.assert_array_equal(hist[2], hist[1])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to overlap calls")
def test_call_from_python_threads(rng):
    chain = Chain(4, Dense(32, "tanh"), Dense(32, "tanh"), Dense(2))
    p = chain.init_params(seed=0)
    Xs = [rng.normal(size=(2000, 4)) for _ in range(2)]
    expected = [chain(X, p) for X in Xs]
    wrong = [0, 0]

    def work(k):
        for _ in range(50):
            wrong[k] += not np.array_equal(chain(Xs[k], p), expected[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [0, 0]
