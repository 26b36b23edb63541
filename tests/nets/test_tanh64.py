"""The inline float64 tanh of `nets.activations` against numpy's, in ulp, on a dense grid."""

import numba
import numpy as np
import pytest

from nets._config import jit
from nets.activations import tanh

needs_jit = pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")


@jit
def _apply(z, out):
    for i in range(z.shape[0]):
        out[i] = tanh(z[i])


@needs_jit
def test_float64_tanh_within_2_ulp_of_numpy():
    xs = np.concatenate([
        np.linspace(-25.0, 25.0, 2_000_001), np.linspace(-1.0, 1.0, 1_000_001),
        np.linspace(0.6, 0.65, 100_001), -np.linspace(0.6, 0.65, 100_001),  # the switch
        np.geomspace(1e-300, 1.0, 10_001), -np.geomspace(1e-300, 1.0, 10_001),
        [0.0, 0.625, -0.625, 19.0, 20.0, 40.0, 1e300, -1e300, np.inf, -np.inf, 5e-324]])
    out = np.empty_like(xs)
    _apply(xs, out)
    ref = np.tanh(xs)
    ulps = np.abs(out - ref) / np.spacing(np.abs(ref))
    assert ulps.max() <= 2.0, (ulps.max(), xs[np.argmax(ulps)])
    assert np.all(np.abs(out) <= 1.0)


@needs_jit
def test_float64_tanh_propagates_nan():
    out = np.empty(2)
    _apply(np.array([np.nan, -np.nan]), out)
    assert np.isnan(out).all()
