"""Optimizer updates against numpy implementations of each rule."""

import numpy as np
import pytest

import nets

STEPS = 6


def adam_reference(p, grads, lr, beta1, beta2, eps, weight_decay=0.0, decoupled=False):
    """Kingma & Ba (2015), Algorithm 1; AdamW (Loshchilov & Hutter) decays p by lr*wd first."""
    p = p.copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            p = p - lr * weight_decay * p
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        mhat = m / (1 - beta1**t)
        vhat = v / (1 - beta2**t)
        p = p - lr * mhat / (np.sqrt(vhat) + eps)
    return p


def sgd_reference(p, grads, lr, momentum, nesterov, weight_decay):
    """PyTorch's SGD (dampening 0): buf = mu*buf + g; step along g + mu*buf (Nesterov) or buf."""
    p = p.copy()
    buf = np.zeros_like(p)
    for g in grads:
        g = g + weight_decay * p
        buf = momentum * buf + g
        p = p - lr * (g + momentum * buf if nesterov else buf)
    return p


def run(opt, p, grads):
    p = p.copy()
    for g in grads:
        opt.update(p, g)
    return p


@pytest.fixture
def case(rng):
    p = rng.normal(size=37)
    grads = [rng.normal(size=37) * s for s in np.geomspace(1, 1e-3, STEPS)]
    return p, grads


@pytest.mark.parametrize("kw", [dict(), dict(lr=0.05, beta1=0.5, beta2=0.9, eps=1e-3)])
def test_adam(kw, case):
    p, grads = case
    opt = nets.Adam(**kw)
    full = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8) | kw
    np.testing.assert_allclose(run(opt, p, grads), adam_reference(p, grads, **full),
                               rtol=1e-12, atol=1e-14)
    assert opt.step == STEPS


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw(wd, case):
    p, grads = case
    opt = nets.AdamW(lr=0.01, weight_decay=wd)
    expected = adam_reference(p, grads, 0.01, 0.9, 0.999, 1e-8, wd, decoupled=True)
    np.testing.assert_allclose(run(opt, p, grads), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_sgd(momentum, nesterov, wd, case):
    p, grads = case
    opt = nets.SGD(lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    expected = sgd_reference(p, grads, 0.1, momentum, nesterov, wd)
    np.testing.assert_allclose(run(opt, p, grads), expected, rtol=1e-12, atol=1e-14)


def test_state_carries_over_and_init_resets(case):
    p, grads = case
    opt = nets.Adam(0.01)
    q = run(opt, p, grads[:3])
    q = run(opt, q, grads[3:])  # continues the same moment estimates
    np.testing.assert_allclose(q, adam_reference(p, grads, 0.01, 0.9, 0.999, 1e-8),
                               rtol=1e-12)
    opt.init(p)
    assert opt.step == 0
    np.testing.assert_allclose(run(opt, p, grads[:2]),
                               adam_reference(p, grads[:2], 0.01, 0.9, 0.999, 1e-8), rtol=1e-12)


def test_update_rejects_wrong_gradient_shape(case):
    p, _ = case
    with pytest.raises(ValueError, match="`g`"):
        nets.Adam().update(p.copy(), np.zeros(p.size + 1))


@pytest.mark.parametrize("make, arg", [
    (lambda: nets.Adam(lr=-1.0), "lr"),
    (lambda: nets.Adam(beta1=1.0), "beta1"),
    (lambda: nets.AdamW(weight_decay=-0.1), "weight_decay"),
    (lambda: nets.SGD(momentum=1.5), "momentum"),
    (lambda: nets.SGD(lr=0), "lr"),
    (lambda: nets.LBFGS(iters=0), "iters"),
])
def test_bad_hyperparameters(make, arg):
    with pytest.raises(ValueError, match=f"`{arg}`"):
        make()
