"""`nets.loss_and_grad`: values vs numpy, gradients vs finite differences, penalties."""

import numpy as np
import pytest

import nets
from nets import Chain, Dense

from . import reference as ref

FD = dict(rtol=1e-6, atol=1e-7)
REGRESSION = [nets.SquaredLoss(), nets.MeanSquaredLoss(), nets.AbsoluteLoss()]


def problem(rng, n=150, n_out=3, classes=False):
    chain = Chain(4, Dense(10, "tanh"), Dense(n_out))
    p = ref.random_params(chain, rng)
    X = rng.normal(size=(n, 4))
    Y = rng.integers(0, n_out, size=n) if classes else rng.normal(size=(n, n_out))
    return chain, p, X, Y


def numpy_value(chain, p, X, Y, loss):
    W = ref.weight_mask(chain)
    return loss(ref.forward(chain, p, X)[0], Y) + loss.l1 * np.abs(p[W]).sum() \
        + loss.l2 * np.sum(p[W] ** 2)


def dloss_dy(loss, yhat, Y):
    """Cotangent of the (unpenalised) loss with respect to the outputs."""
    if isinstance(loss, nets.LogitCrossEntropyLoss):
        q = np.exp(yhat - yhat.max(axis=1, keepdims=True))
        q /= q.sum(axis=1, keepdims=True)
        q[np.arange(len(Y)), Y] -= 1.0
        return q
    if isinstance(loss, nets.AbsoluteLoss):
        return np.sign(yhat - Y)
    g = 2 * (yhat - Y)
    return g / yhat.size if loss.mean else g


@pytest.mark.parametrize("loss", REGRESSION + [nets.LogitCrossEntropyLoss()],
                         ids=lambda l: type(l).__name__)
def test_loss_and_grad(loss, rng):
    classes = isinstance(loss, nets.LogitCrossEntropyLoss)
    chain, p, X, Y = problem(rng, classes=classes)
    value, grad = nets.loss_and_grad(chain, p, X, Y, loss=loss)
    assert isinstance(value, float)
    assert grad.shape == (chain.n_params,) and grad.dtype == np.float64
    np.testing.assert_allclose(value, loss(chain(X, p), Y), rtol=1e-12)
    np.testing.assert_allclose(value, numpy_value(chain, p, X, Y, loss), rtol=1e-12)
    # Gradient: reference backprop of the loss' output cotangent, and FD.
    _, expected = ref.vjp(chain, p, X, dloss_dy(loss, ref.forward(chain, p, X)[0], Y))
    np.testing.assert_allclose(grad, expected, rtol=1e-10, atol=1e-12)
    fd = ref.fd_params(lambda q: numpy_value(chain, q, X, Y, loss), p)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6 * max(1, np.abs(fd).max()))


@pytest.mark.parametrize("n", [1, nets.kernels.B - 1, nets.kernels.B + 1, 2 * nets.kernels.B + 44])
def test_mean_loss_scales_with_batch(n, rng):
    chain, p, X, Y = problem(rng, n=n)
    v_sum, g_sum = nets.loss_and_grad(chain, p, X, Y, loss=nets.SquaredLoss())
    v_mean, g_mean = nets.loss_and_grad(chain, p, X, Y, loss=nets.MeanSquaredLoss())
    np.testing.assert_allclose(v_mean, v_sum / (n * chain.n_out), rtol=1e-12)
    np.testing.assert_allclose(g_mean, g_sum / (n * chain.n_out), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("loss_cls", [nets.SquaredLoss, nets.MeanSquaredLoss,
                                      nets.AbsoluteLoss, nets.LogitCrossEntropyLoss])
def test_penalties_on_weights_only(loss_cls, rng):
    classes = loss_cls is nets.LogitCrossEntropyLoss
    chain, p, X, Y = problem(rng, n=40, classes=classes)
    W = ref.weight_mask(chain)
    assert 0 < W.sum() < chain.n_params  # the chain has biases
    l1, l2 = 0.3, 0.7
    v0, g0 = nets.loss_and_grad(chain, p, X, Y, loss=loss_cls())
    loss = loss_cls(l1=l1, l2=l2)
    v, g = nets.loss_and_grad(chain, p, X, Y, loss=loss)
    np.testing.assert_allclose(v - v0, l1 * np.abs(p[W]).sum() + l2 * np.sum(p[W] ** 2),
                               rtol=1e-12)
    np.testing.assert_array_equal(g[~W], g0[~W])  # biases: no penalty
    np.testing.assert_allclose(g[W] - g0[W], l1 * np.sign(p[W]) + 2 * l2 * p[W],
                               rtol=1e-10, atol=1e-12)
    fd = ref.fd_params(lambda q: numpy_value(chain, q, X, Y, loss), p)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-6 * max(1, np.abs(fd).max()))


def test_loss_and_grad_float32(rng):
    chain, p, X, Y = problem(rng, n=300)
    p32 = p.astype(np.float32)
    v32, g32 = nets.loss_and_grad(chain, p32, X, Y, loss=nets.SquaredLoss(l2=0.1))
    v64, g64 = nets.loss_and_grad(chain, p32.astype(np.float64), X.astype(np.float32), Y,
                                  loss=nets.SquaredLoss(l2=0.1))
    assert g32.dtype == np.float32
    np.testing.assert_allclose(v32, v64, rtol=1e-5)
    np.testing.assert_allclose(g32, g64, rtol=1e-4, atol=1e-4 * np.abs(g64).max())


def test_loss_and_grad_does_not_touch_inputs(rng):
    chain, p, X, Y = problem(rng, n=50)
    copies = [a.copy() for a in (p, X, Y)]
    nets.loss_and_grad(chain, p, X, Y, loss=nets.SquaredLoss(l1=0.1))
    for a, c in zip((p, X, Y), copies):
        np.testing.assert_array_equal(a, c)


def test_loss_kind_is_not_a_constructor_argument(rng):
    # The kernel branch and the mean/sum choice belong to the class; a stray
    # positional argument must not switch them silently.
    with pytest.raises(TypeError):
        nets.LogitCrossEntropyLoss(mean=True)
    chain, p, X, Y = problem(rng, n=50)
    loss = nets.SquaredLoss(1.0)  # the first positional setting is l1
    assert loss.l1 == 1.0
    value, _ = nets.loss_and_grad(chain, p, X, Y, loss=loss)
    W = np.concatenate([v.W.ravel() for v in chain.views(p)])
    np.testing.assert_allclose(value, loss(chain(X, p), Y) + np.abs(W).sum(), rtol=1e-12)
