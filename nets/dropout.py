"""`Dropout`, channel dropout (`Dropout1d/2d/3d`) and `AlphaDropout` (PyTorch's layers).

In training mode each entry (or, for channel dropout, each channel of each sample) is
kept with probability ``1 - p``; the mask is drawn from the counter-based stream of the
call's key (`nets.rng.uniform(ctx.key, i)`, i the entry's or channel's index in the
whole batch: the rows given start at ``ctx.row``), so the pullback regenerates it
instead of storing it, and the masks do not depend on how the chain splits a batch.
Evaluation mode is the identity. Kernels overwrite ``y`` / ``xbar`` only.

- Dropout: ``y = x * keep / (1 - p)``;
- AlphaDropout (for SELU networks): dropped entries are set to SELU's negative
  saturation ``a' = -scale * alpha`` and the result is rescaled, ``y = A (x keep + a'
  (1 - keep)) + B`` with ``A = ((1 - p)(1 + p a'^2))^(-1/2)`` and ``B = -A a' p``, which
  keeps a unit Gaussian's mean and variance.
"""

import math
from dataclasses import dataclass

import numpy as np

from ._config import jit
from .activations import _SELU_SA
from .layers import Layer, _shape
from .rng import uniform, uniform_np

_ALPHA_P = -_SELU_SA  # SELU's limit at -inf


@jit
def dropout_forward(X, Y, key, row, p, scale, shift, fill):
    """Y[r, j] = scale * (X[r, j] if kept else fill) + shift for the (rows, groups, S) view:
    one draw per (row, group), row r of the view being row `row + r` of the batch."""
    R, G, S = X.shape
    for r in range(R):
        for g in range(G):
            keep = uniform(key, (row + r) * G + g) >= p
            x, y = X[r, g], Y[r, g]
            for j in range(S):
                y[j] = scale * (x[j] if keep else fill) + shift


@jit
def dropout_pullback(V, Xbar, key, row, p, scale):
    """Xbar = scale * V where kept, else 0 (same view and draws as the forward)."""
    R, G, S = V.shape
    for r in range(R):
        for g in range(G):
            keep = uniform(key, (row + r) * G + g) >= p
            v, xb = V[r, g], Xbar[r, g]
            for j in range(S):
                xb[j] = scale * v[j] if keep else 0.0


def _check_p(owner, p):
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"{owner}: `p` must be a probability in [0, 1], got {p!r}")


@dataclass(frozen=True)
class Dropout(Layer):
    """Zeroes each entry with probability `p` in training mode and scales the rest by
    ``1 / (1 - p)``; the identity in evaluation mode (PyTorch's ``Dropout``)."""

    p: float = 0.5

    _channels = 0  # spatial axes a dropped channel spans (channel dropout), 0: entries

    def __post_init__(self):
        _check_p(type(self).__name__, self.p)

    def out_shape(self, in_shape):
        in_shape = _shape(in_shape)
        nd = self._channels
        if nd and len(in_shape) != nd + 1:
            raise ValueError(f"{type(self).__name__}: expects (C, {nd} spatial) samples, got "
                             f"input shape {in_shape}")
        return in_shape

    def _view(self, a):
        N = a.shape[0]
        if self._channels:
            return a.reshape(N, a.shape[1], -1)
        return a.reshape(N, -1, 1)

    def _coefficients(self):
        """(scale, shift, fill) of kept/dropped entries."""
        q = 1.0 - self.p
        return (1.0 / q if q > 0 else 0.0), 0.0, 0.0

    def forward(self, ctx, x, y, p, s, scratch):
        if not ctx.training or self.p == 0:
            np.copyto(y, x)
            return
        scale, shift, fill = self._coefficients()
        dropout_forward(self._view(x), self._view(y), ctx.key, ctx.row, float(self.p), scale,
                        shift, fill)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        if xbar is None:
            return
        if not ctx.training or self.p == 0:
            np.copyto(xbar, ybar)
            return
        dropout_pullback(self._view(ybar), self._view(xbar), ctx.key, ctx.row,
                         float(self.p), self._coefficients()[0])

    def mask_np(self, key, shape, row=0):
        """The keep mask (numpy, float) of a training call with `key` on inputs `shape`
        (batch first) starting at batch row `row`: the kernels' draws, for tests."""
        N = shape[0]
        G = shape[1] if self._channels else math.prod(shape[1:])
        keep = (uniform_np(key, np.arange(row * G, (row + N) * G)) >= self.p).reshape(N, G)
        if self._channels:
            keep = np.broadcast_to(keep.reshape((N, G) + (1,) * (len(shape) - 2)), shape)
        return keep.reshape(shape).astype(float)

    def jax_apply(self, params, state, x, ctx):
        if not ctx.training or self.p == 0:
            return x
        import jax.numpy as jnp

        scale, shift, fill = self._coefficients()
        keep = jnp.asarray(self.mask_np(ctx.key, x.shape, ctx.row), dtype=x.dtype)
        return scale * (x * keep + fill * (1 - keep)) + shift


@dataclass(frozen=True)
class Dropout1d(Dropout):
    """Zeroes whole channels of ``(C, L)`` samples (PyTorch's ``Dropout1d``)."""

    _channels = 1


@dataclass(frozen=True)
class Dropout2d(Dropout):
    """Zeroes whole channels of ``(C, H, W)`` samples (PyTorch's ``Dropout2d``)."""

    _channels = 2


@dataclass(frozen=True)
class Dropout3d(Dropout):
    """Zeroes whole channels of ``(C, D, H, W)`` samples (PyTorch's ``Dropout3d``)."""

    _channels = 3


@dataclass(frozen=True)
class AlphaDropout(Dropout):
    """Dropout for SELU networks (PyTorch's ``AlphaDropout``): see the module text."""

    def _coefficients(self):
        p = self.p
        if p == 1:
            return 0.0, 0.0, 0.0  # PyTorch: all zero
        a = 1.0 / math.sqrt((1 - p) * (1 + p * _ALPHA_P ** 2))
        return a, -a * _ALPHA_P * p, _ALPHA_P
