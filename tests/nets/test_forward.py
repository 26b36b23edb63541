"""Forward pass (`forward_into`, `__call__`) against the numpy reference."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nets import Chain, Dense
from nets import kernels as K
from nets.activations import BUILTIN

from . import reference as ref

# Sample counts around the kernels' chunk width.
B = K.B
BATCHES = (1, 3, B - 1, B, B + 1, 2 * B + 44)
DTYPES = (np.float64, np.float32)
# float32 tanh is a rational approximation; float32 sums over up to 40 terms.
TOL = {np.float64: dict(rtol=1e-11, atol=1e-11), np.float32: dict(rtol=1e-5, atol=1e-5)}


def check_forward(chain, p, X, dtype):
    expected, _ = ref.forward(chain, p, X)
    tol = TOL[dtype]
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    y = chain(X, p)
    assert y.dtype == dtype and y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=tol["rtol"], atol=tol["atol"] * scale)
    ws = chain.workspace(batch=max(1, X.shape[0] if X.ndim == 2 else 1), dtype=dtype)
    out = np.full(expected.shape, np.nan, dtype=dtype)
    chain.forward_into(out, X, p, ws)
    np.testing.assert_array_equal(out, y)


@st.composite
def chains(draw, max_width=40, max_depth=4):
    n_in = draw(st.integers(1, max_width))
    depth = draw(st.integers(1, max_depth))
    layers = [Dense(draw(st.integers(1, max_width)), draw(st.sampled_from(BUILTIN)),
                    draw(st.booleans())) for _ in range(depth)]
    return Chain(n_in, *layers)


@given(chain=chains(), n=st.sampled_from(BATCHES), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1))
def test_forward_random_chains(chain, n, dtype, seed):
    rng = np.random.default_rng(seed)
    p = ref.random_params(chain, rng, dtype)
    X = rng.normal(size=(n, chain.n_in)).astype(dtype)
    check_forward(chain, p, X, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("n", BATCHES)
def test_forward_chunk_edges(n, dtype, rng):
    # Widths 13 and 5 are >= 4 and not multiples of 4: the blocked cores'
    # shifted edge blocks; the 3-wide layer takes the narrow path.
    chain = Chain(7, Dense(13, "tanh"), Dense(5, "softplus", bias=False), Dense(3))
    p = ref.random_params(chain, rng, dtype)
    X = rng.normal(size=(n, 7)).astype(dtype)
    check_forward(chain, p, X, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("act", BUILTIN)
def test_forward_each_activation(act, dtype, rng):
    chain = Chain(6, Dense(9, act), Dense(4, act), Dense(2, act, bias=False))
    p = ref.random_params(chain, rng, dtype)
    X = (2.0 * rng.normal(size=(B + 1, 6))).astype(dtype)
    check_forward(chain, p, X, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_single_sample_matches_batch_row(dtype, rng):
    chain = ref.random_chain(rng, n_in=5, widths=[11, 7, 3])
    p = ref.random_params(chain, rng, dtype)
    X = rng.normal(size=(10, 5)).astype(dtype)
    Y = chain(X, p)
    for k in (0, 9):
        y = chain(X[k], p)
        assert y.shape == (3,)
        check_forward(chain, p, X[k], dtype)
        np.testing.assert_allclose(y, Y[k], **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_activation_values_at_extremes(dtype):
    # Large |z|: no overflow or NaN (sigmoid, softplus, silu, elu, gelu, rbf).
    big = 700.0 if dtype == np.float64 else 80.0
    z = np.array([-big, -40.0, -1e-3, 0.0, 1e-3, 40.0, big], dtype=dtype).reshape(-1, 1)
    for act in BUILTIN:
        chain = Chain(1, Dense(1, act, bias=False))
        y = chain(z, np.ones(1, dtype=dtype))
        with np.errstate(over="ignore"):
            expected, _ = ref.activation(act, z.astype(np.float64))
        assert np.all(np.isfinite(y)), (act, y)
        np.testing.assert_allclose(y, expected, rtol=TOL[dtype]["rtol"], atol=1e-300,
                                   err_msg=act)


def test_parameter_layout():
    # Weight (out, in) row-major, then the bias; a layer without bias has none.
    chain = Chain(3, Dense(2), Dense(1, bias=False))
    assert chain.n_params == 3 * 2 + 2 + 2 * 1
    p = np.arange(chain.n_params, dtype=np.float64)
    (W0, b0), (W1, b1) = ((v.W, v.b) for v in chain.views(p))
    np.testing.assert_array_equal(W0, [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(b0, [6, 7])
    np.testing.assert_array_equal(W1, [[8, 9]])
    assert b1 is None
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(chain(x, p), W1 @ (W0 @ x + b0))
    W0[0, 0] = 100.0  # views write through
    assert p[0] == 100.0


def test_workspace_reuse_across_batch_sizes(rng):
    # One workspace streams any batch; results do not depend on its history.
    chain = ref.random_chain(rng, n_in=4, widths=[17, 2])
    p = ref.random_params(chain, rng)
    ws = chain.workspace(batch=1)
    for n in (2 * B + 44, 1, B + 1, 3):
        X = rng.normal(size=(n, 4))
        Y = np.empty((n, 2))
        chain.forward_into(Y, X, p, ws)
        np.testing.assert_allclose(Y, ref.forward(chain, p, X)[0], rtol=1e-11, atol=1e-11)
