"""One `Chain`, one behaviour: what a chain does does not depend on which engine runs it.

A Dense chain whose activations take no constants runs the fused kernels; the same chain
with ``"elu(alpha=2.0)"`` runs the per-layer path. Initialisation, views, activation
names, argument errors and the Jacobian must be the same for both.
"""

import numpy as np
import pytest

import nets
from nets import Chain, Conv, Dense, Flatten, LayerParams, MaxPool
from nets import kernels as K

WIDTH = 64


def pair(width=WIDTH):
    """The same 64-64-4 chain on each engine: fused (plain elu) and per-layer (a constant)."""
    return (Chain(width, Dense(width, "elu"), Dense(4)),
            Chain(width, Dense(width, "elu(alpha=2.0)"), Dense(4)))


def test_the_pair_runs_on_both_engines():
    fused, layerwise = pair()
    assert fused.fused and not layerwise.fused
    assert fused.dense_layers is not None and layerwise.dense_layers is not None


@pytest.mark.parametrize("which", [0, 1], ids=["fused", "per-layer"])
def test_init_is_pytorchs_default(which):
    # PyTorch's Linear: weight and bias uniform in +-1/sqrt(fan_in), std 1/sqrt(3 fan_in)
    # (0.0722 here; Glorot's uniform would give 0.125).
    chain = pair()[which]
    p = chain.init_params(seed=0)
    W, b = chain.views(p)[0].W, chain.views(p)[0].b
    bound = 1.0 / np.sqrt(WIDTH)
    std = bound / np.sqrt(3.0)
    # Standard error of a uniform sample's std: std * sqrt((kurtosis - 1) / (4 n)), kurtosis 9/5.
    se = std * np.sqrt(0.8 / (4 * W.size))
    assert abs(W.std() - std) < 4 * se
    assert np.abs(W).max() <= bound and np.abs(W).max() > 0.99 * bound
    assert np.abs(b).max() <= bound and b.std() > 0.5 * std  # biases drawn, not zero
    assert abs(W.mean()) < 4 * std / np.sqrt(W.size)


def test_init_draws_the_same_numbers_on_both_engines():
    fused, layerwise = pair()
    for seed in (0, 7):
        for dtype in (np.float64, np.float32):
            a, b = fused.init_params(seed, dtype), layerwise.init_params(seed, dtype)
            assert a.dtype == b.dtype == dtype
            np.testing.assert_array_equal(a, b)


def test_views_are_one_type():
    fused, layerwise = pair()
    conv = Chain((1, 6, 6), Conv(2, (3, 3), "tanh"), MaxPool((2, 2)), Flatten(), Dense(3))
    no_bias = Chain(3, Dense(2, bias=False))
    for chain in (fused, layerwise, conv, no_bias):
        views = chain.views(chain.init_params(seed=1))
        assert all(type(v) is LayerParams for v in views), chain
    a, b = fused.views(fused.init_params()), layerwise.views(layerwise.init_params())
    assert [dict((k, x.shape) for k, x in v.items()) for v in a] == \
        [dict((k, x.shape) for k, x in v.items()) for v in b] == \
        [{"weight": (64, 64), "bias": (64,)}, {"weight": (4, 64), "bias": (4,)}]
    v = no_bias.views(np.arange(6.0))[0]
    assert list(v) == ["weight"] and v.b is None and v["weight"] is not None
    v.W[0, 0] = -1.0  # views write through to p, whatever the engine
    p = layerwise.init_params()
    layerwise.views(p)[1].b[:] = 3.0
    assert np.all(p[-4:] == 3.0)
    pools = conv.views(conv.init_params())
    assert len(pools[1]) == 0 and pools[1].W is None
    with pytest.raises(KeyError, match="'bias'"):
        v["bias"]


def test_elu_with_its_default_constant_is_elu(rng):
    plain = Chain(5, Dense(7, "elu"), Dense(3, "leaky_relu"))
    spelled = Chain(5, Dense(7, "elu(alpha=1.0)"), Dense(3, "leaky_relu(negative_slope=0.01)"))
    assert spelled.layers == plain.layers and spelled.fused
    assert spelled.layers[0].activation == "elu"
    assert repr(spelled) == "Chain(5, Dense(7, 'elu'), Dense(3, 'leaky_relu'))"
    assert Dense(2, "elu( alpha = 2 )").activation == "elu(alpha=2.0)"
    p = plain.init_params(seed=3)
    x = rng.normal(size=(9, 5))
    np.testing.assert_array_equal(spelled(x, p), plain(x, p))
    v = rng.normal(size=(9, 3))
    out = []
    for chain in (plain, spelled):
        xbar, pbar = np.empty_like(x), np.zeros(chain.n_params)
        chain.vjp_into(xbar, pbar, v, x, p, chain.workspace())
        out.append((xbar, pbar))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


@pytest.mark.parametrize("name, match", [
    ("elu(alpha=1.0", r"Dense: `activation` 'elu\(alpha=1.0': expected 'elu' or "
                      r"elu\(name=value, \.\.\.\) as in 'elu\(alpha=1.0\)'"),
    ("elu(beta=1.0)", r"`activation` 'elu\(beta=1.0\)': elu takes the constants alpha "
                      r"\(as in 'elu\(alpha=1.0\)'\), got 'beta=1.0'"),
    ("elu(alpha=one)", r"`activation` 'elu\(alpha=one\)': `alpha` must be a number, got 'one'"),
    ("elu(alpha=inf)", r"`alpha` must be a finite number, got 'inf'"),
    ("elu(alpha=1, alpha=2)", r"`alpha` is given twice"),
    ("tanh(alpha=1)", r"tanh takes no constants, got 'alpha=1'"),
    ("swish", r"Dense: unknown activation 'swish'; known: identity, tanh"),
])
def test_a_bad_activation_name_says_what_was_expected(name, match):
    with pytest.raises(ValueError, match=match):
        Dense(4, name)


def test_a_bad_activation_name_is_refused_by_every_layer():
    with pytest.raises(ValueError, match=r"Conv: `activation` 'relu\(\)\)'"):
        Conv(2, (3, 3), "relu())")
    with pytest.raises(TypeError, match="Dense: `activation` must be a name"):
        Dense(2, None)


def _message(call, chain):
    with pytest.raises((ValueError, TypeError)) as err:
        call(chain)
    # the message may name the first layer, which differs between the two chains only
    return err.type, str(err.value).replace(repr(chain.layers[0]), "<layer 0>")


@pytest.mark.parametrize("call", [
    lambda c: c(np.zeros(WIDTH + 1), c.init_params()),
    lambda c: c(np.zeros((2, 3, WIDTH)), c.init_params()),
    lambda c: c(np.zeros(WIDTH), c.init_params()[:-1]),
    lambda c: c.forward_into(np.empty((3, 4)), np.zeros((2, WIDTH)), c.init_params(),
                             c.workspace()),
    lambda c: c.forward_into(np.empty((2, 4), np.float32), np.zeros((2, WIDTH)),
                             c.init_params(), c.workspace()),
    lambda c: c.vjp_into(np.empty((2, WIDTH)), np.zeros(c.n_params), np.zeros((3, 4)),
                         np.zeros((2, WIDTH)), c.init_params(), c.workspace()),
    lambda c: c.jacobian_into(np.empty((4, WIDTH + 1)), np.zeros(WIDTH), c.init_params(),
                              c.workspace()),
    lambda c: c(np.zeros(WIDTH), c.init_params(), state=np.zeros(2)),
    lambda c: nets.loss_and_grad(c, c.init_params(), np.zeros((5, 3)), np.zeros((5, 4))),
    lambda c: nets.loss_and_grad(c, c.init_params(), np.zeros((5, WIDTH)), np.zeros((5, 4)),
                                 state=np.zeros(1)),
    lambda c: nets.train(c, c.init_params(), np.zeros((5, WIDTH)), np.zeros((5, 4)),
                         epochs=1, batch_size=6),
    lambda c: c.init_params(dtype=np.int32),
], ids=["x", "x-3d", "p", "y-samples", "y-dtype", "v-samples", "J", "state", "X", "state-lg",
        "batch_size", "dtype"])
def test_the_same_errors_on_both_engines(call):
    fused, layerwise = pair()
    assert _message(call, fused) == _message(call, layerwise)


def test_a_wide_chains_jacobian_is_computed_not_refused(rng):
    # More inputs than the fused batched Jacobian kernel takes: one vjp per output instead.
    n = K.B + 1
    fused, layerwise = (Chain(n, Dense(2, "tanh")), Chain(n, Dense(2, "elu(alpha=2.0)")))
    assert fused.fused
    p = fused.init_params(seed=0)
    x = rng.normal(size=(3, n))
    J = np.full((3, 2, n), np.nan)
    fused.jacobian_into(J, x, p, fused.workspace())
    W, b = fused.views(p)[0].W, fused.views(p)[0].b
    np.testing.assert_allclose(J, (1 - np.tanh(x @ W.T + b) ** 2)[:, :, None] * W,
                               rtol=1e-12, atol=1e-15)
    J2 = np.full((3, 2, n), np.nan)
    layerwise.jacobian_into(J2, x, p, layerwise.workspace(3))
    z = x @ W.T + b
    np.testing.assert_allclose(J2, np.where(z > 0, 1.0, 2.0 * np.exp(z))[:, :, None] * W,
                               rtol=1e-12, atol=1e-15)
