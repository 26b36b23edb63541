"""`Softmax` and `LogSoftmax` through the layer protocol: numpy reference on several axes,
large inputs, central differences, JAX; allocation-free kernels."""

import numpy as np
import pytest

from nets import softmax
from nets.softmax import LogSoftmax, Softmax, softmax_np

from ..alloc import allocations_in, needs_jit
from .layer_checks import Run, check_fd, check_jax


@pytest.mark.parametrize("cls", [Softmax, LogSoftmax])
@pytest.mark.parametrize("dim, shape", [(0, (4, 5)), (1, (3, 2, 4, 3)), (-1, (3, 2, 4))])
def test_against_numpy_and_differences(cls, dim, shape, rng):
    run = Run(cls(dim), shape)
    x = 3 * rng.standard_normal(shape)
    axis = 1 + dim % (len(shape) - 1)
    np.testing.assert_allclose(run.forward(x)[0], softmax_np(x, axis, cls is LogSoftmax),
                               rtol=1e-13, atol=1e-15)
    check_fd(run, x, rng)


def test_large_inputs_and_jax(rng):
    x = np.array([[1000.0, 1001.0, -1000.0]])
    for cls in (Softmax, LogSoftmax):
        y = Run(cls(0), x.shape).forward(x)[0]
        assert np.all(np.isfinite(y))
    np.testing.assert_allclose(Run(Softmax(0), x.shape).forward(x)[0],
                               [[1 / (1 + np.e), np.e / (1 + np.e), 0.0]], rtol=1e-14)
    for cls in (Softmax, LogSoftmax):
        check_jax(Run(cls(1), (2, 3, 4)), rng.standard_normal((2, 3, 4)), rng)


@needs_jit
@pytest.mark.usefixtures("nrt_stats")
def test_kernels_allocate_nothing(rng):
    X = rng.standard_normal((2, 3, 4))
    Y, Xb = np.empty_like(X), np.empty_like(X)
    assert allocations_in(softmax.softmax_forward, (X, Y, False))[1] == 0
    assert allocations_in(softmax.softmax_pullback, (Y, X, Xb, True))[1] == 0


def test_errors():
    with pytest.raises(ValueError, match="`dim` 2 is outside a sample of shape \\(3, 4\\)"):
        Softmax(2).out_shape((3, 4))
    with pytest.raises(TypeError, match="`dim` must be an int"):
        LogSoftmax(1.0)
