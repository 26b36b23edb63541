"""A registered activation runs in the disk-cached kernels through its own row kernel
(compiled in-process: numba cannot cache it): forward vs numpy, vjp vs FD, on the fused
kernels, the per-layer path and its compiled training step.
"""

import numpy as np
import pytest

import nets
from nets import Chain, Dense, layerwise
from nets.activations import reference

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


def test_cube_on_the_per_layer_path_and_its_compiled_step(cube_activation, rng):
    # an activation with constants keeps the chain off the fused kernels
    chain = Chain(2, Dense(3, "cube"), Dense(2, "elu(alpha=2.0)"))
    assert not chain.fused
    custom = {**cube_activation, "elu(alpha=2.0)": (lambda z: reference("elu", z, 2.0)[0],
                                                    lambda z: reference("elu", z, 2.0)[1])}
    p = ref.random_params(chain, rng)
    X, Y = rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    np.testing.assert_allclose(chain(X, p), ref.forward(chain, p, X, custom=custom)[0],
                               rtol=1e-12, atol=1e-14)
    # a minibatch step, compiled (`nets.lanestep`) and from Python, against the reference
    y, _ = ref.forward(chain, p, X, custom=custom)
    _, pbar = ref.vjp(chain, p, X, 2 * (y - Y), custom=custom)
    ws = layerwise.LayerWorkspace(chain, 6, np.float64, 2, 1)
    lane = ws.lanes[0]
    for compiled in (True, False):
        lane._program = False if compiled else None  # False: made on first use
        g = np.zeros_like(p)
        val = layerwise._step(chain, ws, X, Y, np.arange(6), 0, 6, nets.SquaredLoss(), 1.0, p,
                              np.zeros(0), True, 0, g, 1)
        assert (lane._program is not None) == compiled
        np.testing.assert_allclose(val, np.sum((y - Y) ** 2), rtol=1e-12)
        np.testing.assert_allclose(g, pbar, rtol=1e-10, atol=1e-12)
