"""A registered activation runs in recompiled kernels: forward vs numpy, vjp vs FD.

This compiles a kernel set in-process (not cacheable), so it stays one tiny test.
"""

import numpy as np
import pytest

import nets
from nets import Chain, Dense

from . import reference as ref


@pytest.mark.heavy
def test_cube_activation(cube_activation, rng):
    assert "cube" in nets.activation_names()
    chain = Chain(2, Dense(3, "cube"), Dense(2, "tanh"))
    p = ref.random_params(chain, rng)
    X = rng.normal(size=(5, 2))

    y = chain(X, p)
    np.testing.assert_allclose(y, ref.forward(chain, p, X, custom=cube_activation)[0],
                               rtol=1e-12, atol=1e-14)

    V = rng.normal(size=(5, 2))
    xbar, pbar = np.empty_like(X), np.zeros(chain.n_params)
    chain.vjp_into(xbar, pbar, V, X, p, chain.workspace())
    xbar_ref, pbar_ref = ref.vjp(chain, p, X, V, custom=cube_activation)
    np.testing.assert_allclose(xbar, xbar_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(pbar, pbar_ref, rtol=1e-10, atol=1e-12)
    fd_p = ref.fd_params(lambda q: float(np.sum(V * chain(X, q))), p)
    np.testing.assert_allclose(pbar, fd_p, rtol=1e-6, atol=1e-7)
    J = ref.fd_input_jacobian(lambda Z: chain(Z, p), X, 2)
    np.testing.assert_allclose(xbar, np.einsum("no,noi->ni", V, J), rtol=1e-6, atol=1e-7)
