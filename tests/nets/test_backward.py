"""`vjp_into` and `jacobian_into` against the numpy reference and finite differences."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nets import Chain, Dense
from nets.activations import BUILTIN
from nets.kernels import B

from . import reference as ref

# Exact backprop vs the float64 reference; finite differences (h = 1e-6).
EXACT = dict(rtol=1e-10, atol=1e-10)
FD = dict(rtol=1e-6, atol=1e-7)


def vjp(chain, p, x, v, pbar0=None):
    """Run `vjp_into` with fresh buffers (pbar starting at `pbar0`)."""
    ws = chain.workspace(dtype=p.dtype)
    xbar = np.full(x.shape, np.nan, dtype=p.dtype)  # must be overwritten
    pbar = np.zeros(chain.n_params, p.dtype) if pbar0 is None else pbar0.copy()
    chain.vjp_into(xbar, pbar, v, x, p, ws)
    return xbar, pbar


@given(seed=st.integers(0, 2**32 - 1), n=st.sampled_from([None, 1, 3, B - 1, B, B + 1, 2 * B + 44]))
def test_vjp_matches_reference_random_chains(seed, n):
    rng = np.random.default_rng(seed)
    chain = ref.random_chain(rng)
    p = ref.random_params(chain, rng)
    shape_x = (chain.n_in,) if n is None else (n, chain.n_in)
    shape_v = (chain.n_out,) if n is None else (n, chain.n_out)
    x, v = rng.normal(size=shape_x), rng.normal(size=shape_v)
    xbar, pbar = vjp(chain, p, x, v)
    xbar_ref, pbar_ref = ref.vjp(chain, p, x, v)
    assert xbar.shape == x.shape
    scale = max(1.0, np.abs(pbar_ref).max())
    np.testing.assert_allclose(xbar, xbar_ref, rtol=1e-10, atol=1e-10 * scale)
    np.testing.assert_allclose(pbar, pbar_ref, rtol=1e-10, atol=1e-10 * scale)


@pytest.mark.parametrize("act", BUILTIN)
@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
def test_vjp_finite_differences(act, batched, rng):
    chain = Chain(3, Dense(6, act), Dense(5, act, bias=False), Dense(2))
    p = ref.random_params(chain, rng)
    x = rng.normal(size=(7, 3) if batched else (3,))
    v = rng.normal(size=(7, 2) if batched else (2,))
    xbar, pbar = vjp(chain, p, x, v)

    np.testing.assert_allclose(xbar, ref.vjp(chain, p, x, v)[0], **EXACT)
    np.testing.assert_allclose(pbar, ref.vjp(chain, p, x, v)[1], **EXACT)

    fd_p = ref.fd_params(lambda q: float(np.sum(v * chain(x, q))), p)
    np.testing.assert_allclose(pbar, fd_p, **FD)
    J = ref.fd_input_jacobian(lambda X: chain(X, p), x, chain.n_out)
    fd_x = np.einsum("no,noi->ni", np.atleast_2d(v), J).reshape(x.shape)
    np.testing.assert_allclose(xbar, fd_x, **FD)


@pytest.mark.parametrize("n", [None, 300])
def test_vjp_accumulates_pbar_and_writes_xbar(n, rng):
    chain = Chain(4, Dense(9, "tanh"), Dense(3))
    p = ref.random_params(chain, rng)
    x = rng.normal(size=(4,) if n is None else (n, 4))
    v = rng.normal(size=(3,) if n is None else (n, 3))
    pbar0 = rng.normal(size=chain.n_params)
    xbar, pbar = vjp(chain, p, x, v, pbar0=pbar0)
    xbar_ref, pbar_ref = ref.vjp(chain, p, x, v)
    np.testing.assert_allclose(pbar, pbar0 + pbar_ref, **EXACT)
    np.testing.assert_allclose(xbar, xbar_ref, **EXACT)
    # Twice into the same buffers: pbar holds both contributions, xbar the latest only.
    ws = chain.workspace()
    chain.vjp_into(xbar, pbar, v, x, p, ws)
    np.testing.assert_allclose(pbar, pbar0 + 2 * pbar_ref, **EXACT)
    np.testing.assert_allclose(xbar, xbar_ref, **EXACT)


def test_vjp_float32_matches_reference(rng):
    chain = Chain(5, Dense(12, "tanh"), Dense(7, "gelu"), Dense(3))
    p = ref.random_params(chain, rng, np.float32)
    x = rng.normal(size=(200, 5)).astype(np.float32)
    v = rng.normal(size=(200, 3)).astype(np.float32)
    xbar, pbar = vjp(chain, p, x, v)
    assert xbar.dtype == pbar.dtype == np.float32
    xbar_ref, pbar_ref = ref.vjp(chain, p, x, v)
    np.testing.assert_allclose(xbar, xbar_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pbar, pbar_ref, rtol=1e-4, atol=1e-4 * np.abs(pbar_ref).max())


@pytest.mark.parametrize("widths", [[1], [6, 2], [13, 13, 5], [3, 40, 4]])
@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
def test_jacobian_finite_differences(widths, batched, rng):
    chain = ref.random_chain(rng, n_in=int(rng.integers(1, 9)), widths=widths)
    p = ref.random_params(chain, rng)
    x = rng.normal(size=(5, chain.n_in) if batched else (chain.n_in,))
    shape = (5, chain.n_out, chain.n_in) if batched else (chain.n_out, chain.n_in)
    J = np.full(shape, np.nan)
    chain.jacobian_into(J, x, p, chain.workspace())
    fd = ref.fd_input_jacobian(lambda X: chain(X, p), x, chain.n_out).reshape(shape)
    np.testing.assert_allclose(J, fd, **FD)
    # Rows of J are vjps with unit cotangents.
    for o in range(chain.n_out):
        e = np.zeros(chain.n_out)
        e[o] = 1.0
        v = np.broadcast_to(e, x.shape[:-1] + (chain.n_out,))
        xbar_ref, _ = ref.vjp(chain, p, x, v)
        np.testing.assert_allclose(J[..., o, :], xbar_ref, **EXACT)


def test_jacobian_widest_input(rng):
    # n_in == B: the tangent directions fill a whole chunk.
    chain = Chain(B, Dense(5, "tanh"), Dense(3))
    p = ref.random_params(chain, rng)
    x = rng.normal(size=B)
    J = np.empty((3, B))
    chain.jacobian_into(J, x, p, chain.workspace())
    expected = np.stack([ref.vjp(chain, p, x, np.eye(3)[o])[0] for o in range(3)])
    np.testing.assert_allclose(J, expected, **EXACT)


def test_inputs_wider_than_a_chunk(rng):
    # n_in > B: the input block of a chunk is wider than the chunk itself.
    chain = Chain(B + 22, Dense(9, "silu"), Dense(2))
    p = ref.random_params(chain, rng)
    x, v = rng.normal(size=(130, B + 22)), rng.normal(size=(130, 2))
    np.testing.assert_allclose(chain(x, p), ref.forward(chain, p, x)[0], **EXACT)
    xbar, pbar = vjp(chain, p, x, v)
    xbar_ref, pbar_ref = ref.vjp(chain, p, x, v)
    np.testing.assert_allclose(xbar, xbar_ref, **EXACT)
    np.testing.assert_allclose(pbar, pbar_ref, **EXACT)
