"""`Bilinear` through the layer protocol: against numpy's einsum, PyTorch, central
differences, JAX; allocation-free kernels."""

import numpy as np
import pytest

from nets import bilinear
from nets.bilinear import Bilinear

from ..alloc import allocations_in, needs_jit
from .layer_checks import Run, check_fd, check_jax


@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_gradients(bias, rng):
    run = Run(Bilinear(3, 4, bias=bias), (5, 3 + 6), rng=rng)
    x = rng.standard_normal((5, 9))
    W = run.p[:72].reshape(4, 3, 6)
    ref = np.einsum("ni,oij,nj->no", x[:, :3], W, x[:, 3:]) + (run.p[72:] if bias else 0)
    np.testing.assert_allclose(run.forward(x)[0], ref, rtol=1e-13, atol=1e-14)
    assert np.all(np.abs(run.p) <= 1 / np.sqrt(3))
    check_fd(run, x, rng)
    check_jax(run, x, rng)


def test_against_pytorch(rng):
    torch = pytest.importorskip("torch")
    t = torch.nn.Bilinear(2, 3, 4).double()
    run = Run(Bilinear(2, 4), (6, 5))
    run.p[:] = torch.cat([t.weight.flatten(), t.bias]).detach().numpy()
    x1, x2 = rng.standard_normal((6, 2)), rng.standard_normal((6, 3))
    np.testing.assert_allclose(run.forward(np.hstack([x1, x2]))[0],
                               t(torch.tensor(x1), torch.tensor(x2)).detach().numpy(),
                               rtol=1e-13, atol=1e-14)


@needs_jit
@pytest.mark.usefixtures("nrt_stats")
def test_kernels_allocate_nothing(rng):
    X, p = rng.standard_normal((3, 5)), rng.standard_normal(2 * 2 * 3 + 2)
    Y, V, Xb, pb = np.empty((3, 2)), np.ones((3, 2)), np.empty((3, 5)), np.zeros(14)
    assert allocations_in(bilinear.bilinear_forward, (X, p, 2, 2, True, Y))[1] == 0
    assert allocations_in(bilinear.bilinear_pullback, (X, p, 2, 2, True, V, Xb, True, pb))[1] == 0


def test_errors():
    with pytest.raises(ValueError, match="takes vectors \\[x1 \\(3\\), x2 \\(at least 1\\)\\]"):
        Bilinear(3, 2).out_shape((3,))
    with pytest.raises(ValueError, match="`in1` must be a positive int"):
        Bilinear(0, 2)
