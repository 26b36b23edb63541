"""`nets.jax.apply` against the numba kernels: outputs and gradients."""

import numpy as np
import pytest

import nets
from nets import Chain, Dense
from nets.activations import BUILTIN

from . import reference as ref

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nets_jax = pytest.importorskip("nets.jax")


@pytest.fixture(scope="module", autouse=True)
def x64():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def sum_of_squares(chain, q, X, Y):
    return jnp.sum((nets_jax.apply(chain, q, X) - Y) ** 2)


@pytest.mark.parametrize("act", BUILTIN)
def test_outputs_and_gradients(act, rng):
    chain = Chain(3, Dense(7, act), Dense(5, act, bias=False), Dense(2))
    p = ref.random_params(chain, rng)
    X, Y = 1.5 * rng.normal(size=(40, 3)), rng.normal(size=(40, 2))

    y = nets_jax.apply(chain, p, X)
    assert y.dtype == jnp.float64 and y.shape == (40, 2)
    np.testing.assert_allclose(y, chain(X, p), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(nets_jax.apply(chain, p, X[0]), chain(X[0], p),
                               rtol=1e-12, atol=1e-13)

    value, grad = nets.loss_and_grad(chain, p, X, Y, loss=nets.SquaredLoss())
    jvalue, jgrad = jax.value_and_grad(lambda q: sum_of_squares(chain, q, X, Y))(p)
    np.testing.assert_allclose(jvalue, value, rtol=1e-12)
    np.testing.assert_allclose(jgrad, grad, rtol=1e-10, atol=1e-12)

    # Input gradient against vjp_into.
    v = rng.normal(size=(40, 2))
    jx = jax.grad(lambda Z: jnp.sum(v * nets_jax.apply(chain, p, Z)))(X)
    xbar, pbar = np.empty_like(X), np.zeros(chain.n_params)
    chain.vjp_into(xbar, pbar, v, X, p, chain.workspace())
    np.testing.assert_allclose(jx, xbar, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("acts", [("elu(alpha=2.0)", "leaky_relu(negative_slope=0.2)"),
                                  ("celu(alpha=0.5)", "hardtanh(min_val=-0.5, max_val=2.0)")])
def test_activations_with_constants(acts, rng):
    # The constants reach JAX (a per-layer chain in nets: the same kernels' values).
    chain = Chain(3, Dense(6, acts[0]), Dense(5, acts[1]), Dense(2))
    p = chain.init_params(seed=1)
    X, Y = 2.0 * rng.normal(size=(30, 3)), rng.normal(size=(30, 2))
    np.testing.assert_allclose(nets_jax.apply(chain, p, X), chain(X, p), rtol=1e-12, atol=1e-13)
    value, grad = nets.loss_and_grad(chain, p, X, Y, loss=nets.SquaredLoss())
    jgrad = jax.grad(lambda q: sum_of_squares(chain, q, X, Y))(p)
    np.testing.assert_allclose(jgrad, grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("act", ["relu", "elu"])
def test_derivative_at_the_kink_matches_kernels(act):
    # z == 0 exactly: relu'(0) = 0 and elu'(0) = 1 in the kernels; JAX agrees.
    chain = Chain(1, Dense(1, act, bias=False))
    p, x = np.ones(1), np.zeros((1, 1))
    xbar, pbar = np.empty((1, 1)), np.zeros(1)
    chain.vjp_into(xbar, pbar, np.ones((1, 1)), x, p, chain.workspace())
    g = jax.grad(lambda z: nets_jax.apply(chain, p, z).sum())(x)
    np.testing.assert_array_equal(g, xbar)


def test_float32_and_jit(rng):
    chain = Chain(4, Dense(16, "tanh"), Dense(16, "gelu"), Dense(3))
    p = ref.random_params(chain, rng, np.float32)
    X = rng.normal(size=(50, 4)).astype(np.float32)
    f = jax.jit(nets_jax.apply, static_argnums=0)
    y = f(chain, p, X)
    assert y.dtype == jnp.float32
    # float32 tanh in the kernels is a rational approximation.
    np.testing.assert_allclose(y, chain(X, p), rtol=1e-5, atol=1e-5)
    # x is cast to the dtype of p, as chain(x, p) does.
    assert nets_jax.apply(chain, p, X.astype(np.float64)).dtype == jnp.float32


def test_pytree_round_trip(rng):
    chain = Chain(3, Dense(4, "tanh"), Dense(2, bias=False), Dense(1))
    p = ref.random_params(chain, rng)
    tree = nets_jax.params_to_pytree(chain, p)
    # the names and shapes of chain.views, whichever kernels run the chain
    assert [{k: a.shape for k, a in layer.items()} for layer in tree] == \
        [{"weight": (4, 3), "bias": (4,)}, {"weight": (2, 4)}, {"weight": (1, 2), "bias": (1,)}]
    for layer, v in zip(tree, chain.views(p)):
        assert list(layer) == list(v)
        for k in v:
            np.testing.assert_array_equal(layer[k], v[k])
    np.testing.assert_array_equal(nets_jax.pytree_to_params(chain, tree), p)
    with pytest.raises(ValueError, match="layer 1 has no array 'bias'"):
        nets_jax.pytree_to_params(chain, [tree[0], {**tree[1], "bias": tree[0]["bias"]}, tree[2]])
    with pytest.raises(ValueError, match=r"layer 0 needs 'bias' of shape \(4,\), got None"):
        nets_jax.pytree_to_params(chain, [{"weight": tree[0]["weight"]}, tree[1], tree[2]])


def test_custom_activation_is_refused_by_name(cube_activation, rng):
    chain = Chain(2, Dense(3, "cube"), Dense(1))
    p = ref.random_params(chain, rng)
    with pytest.raises(NotImplementedError, match="'cube'"):
        nets_jax.apply(chain, p, np.zeros(2))
    # ... unless given a JAX version.
    y = nets_jax.apply(chain, p, np.ones((4, 2)), activations={"cube": lambda z: z**3})
    np.testing.assert_allclose(y, ref.forward(chain, p, np.ones((4, 2)),
                                              custom=cube_activation)[0], rtol=1e-12)


def test_bad_arguments(rng):
    chain = Chain(3, Dense(2))
    p = chain.init_params()
    with pytest.raises(ValueError, match="`p`"):
        nets_jax.apply(chain, p[:-1], np.zeros(3))
    with pytest.raises(ValueError, match="`x`"):
        nets_jax.apply(chain, p, np.zeros(4))
    with pytest.raises(ValueError, match="`x`"):
        nets_jax.apply(chain, p, np.zeros((2, 2, 3)))
    with pytest.raises(TypeError, match="`chain`"):
        nets_jax.apply("chain", p, np.zeros(3))
