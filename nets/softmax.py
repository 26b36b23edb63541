"""`Softmax` and `LogSoftmax` as layers (PyTorch's ``nn.Softmax(dim)`` / ``LogSoftmax``).

A sample ``(d0, d1, ...)`` is viewed as ``(outer, k, inner)`` around the axis `dim`,
so one compiled kernel per dtype serves every shape and axis. The pullbacks use the
output only: softmax ``xbar = y * (v - sum_k v y)``, log-softmax
``xbar = v - exp(y) * sum_k v``.
"""

import math
from dataclasses import dataclass

import numpy as np

from ._config import jit
from .layers import Layer, _shape


@jit
def softmax_forward(X, Y, log):
    """Y = softmax (log-softmax if `log`) of X over axis 1; X, Y (outer, k, inner)."""
    outer, k, inner = X.shape
    for a in range(outer):
        for c in range(inner):
            m = X[a, 0, c]
            for j in range(1, k):
                m = max(m, X[a, j, c])
            s = 0.0
            for j in range(k):
                s += math.exp(X[a, j, c] - m)
            if log:
                ls = m + math.log(s)
                for j in range(k):
                    Y[a, j, c] = X[a, j, c] - ls
            else:
                r = 1.0 / s
                for j in range(k):
                    Y[a, j, c] = math.exp(X[a, j, c] - m) * r


@jit
def softmax_pullback(Y, V, Xbar, log):
    """Xbar = V^T dY/dX (overwritten), from the output Y; all (outer, k, inner)."""
    outer, k, inner = Y.shape
    for a in range(outer):
        for c in range(inner):
            s = 0.0
            if log:
                for j in range(k):
                    s += V[a, j, c]
                for j in range(k):
                    Xbar[a, j, c] = V[a, j, c] - math.exp(Y[a, j, c]) * s
            else:
                for j in range(k):
                    s += V[a, j, c] * Y[a, j, c]
                for j in range(k):
                    Xbar[a, j, c] = Y[a, j, c] * (V[a, j, c] - s)


def around(shape, dim):
    """``(outer, k, inner)`` of an array of `shape` around axis `dim`."""
    shape = tuple(shape)
    return (math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:]))


def softmax_np(x, dim, log=False):
    """numpy reference."""
    x = np.asarray(x, dtype=np.float64)
    z = x - x.max(axis=dim, keepdims=True)
    ls = np.log(np.exp(z).sum(axis=dim, keepdims=True))
    return z - ls if log else np.exp(z - ls)


@dataclass(frozen=True)
class Softmax(Layer):
    """``y = exp(x) / sum exp(x)`` along axis `dim` of each sample (0: the first axis of a
    sample, e.g. the features of a vector or the channels of an image; negative counts
    from the end). No parameters; kernels overwrite ``y`` / ``xbar`` only."""

    dim: int = 0

    _log = False

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)):
            raise TypeError(f"{type(self).__name__}: `dim` must be an int, got {self.dim!r}")

    def _axis(self, in_shape):
        nd = len(in_shape)
        if not -nd <= self.dim < nd:
            raise ValueError(f"{type(self).__name__}: `dim` {self.dim} is outside a sample of "
                             f"shape {tuple(in_shape)}")
        return self.dim % nd

    def out_shape(self, in_shape):
        in_shape = _shape(in_shape)
        self._axis(in_shape)
        return in_shape

    def _view(self, a):
        N = a.shape[0]
        o, k, i = around(a.shape[1:], self._axis(a.shape[1:]))
        return a.reshape(N * o, k, i)

    def forward(self, ctx, x, y, p, s, scratch):
        softmax_forward(self._view(x), self._view(y), self._log)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        if xbar is not None:
            softmax_pullback(self._view(y), self._view(ybar), self._view(xbar), self._log)

    def jax_apply(self, params, state, x, ctx):
        import jax

        axis = 1 + self._axis(x.shape[1:])
        f = jax.nn.log_softmax if self._log else jax.nn.softmax
        return f(x, axis=axis)


@dataclass(frozen=True)
class LogSoftmax(Softmax):
    """``y = x - log sum exp(x)`` along axis `dim` of each sample (see `Softmax`)."""

    _log = True
