"""Losses on network outputs. Settings only; the compiled code lives in `kernels`.

Every loss takes optional penalties on the weights (not the biases):
``l1 * sum|W| + l2 * sum W^2``.
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import kernels
from ._checks import as_float_array, check_finite


@dataclass(frozen=True)
class Loss:
    """Base of the losses: `l1`, `l2` are the only settings a user passes."""

    # Which kernel branch, and whether the sum is divided by the number of
    # entries: fixed per class, never constructor arguments.
    code: ClassVar[int]
    mean: ClassVar[bool] = False
    l1: float = 0.0
    l2: float = 0.0

    def __post_init__(self):
        for name in ("l1", "l2"):
            v = getattr(self, name)
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"{type(self).__name__}: `{name}` must be >= 0, got {v!r}")

    def targets(self, Y, n, n_out, dtype):
        """Targets as the (N, k) float array the kernels read, checked."""
        Y = as_float_array("Y", Y, dtype=dtype, ndim=2)
        if Y.shape != (n, n_out):
            raise ValueError(f"`Y` must have shape ({n}, {n_out}), got {Y.shape}")
        check_finite("Y", Y)
        return np.ascontiguousarray(Y)

    def __call__(self, yhat, y):
        """The loss of predictions `yhat` (N, out) against `y` in plain numpy (no penalty)."""
        yhat = np.asarray(yhat, dtype=np.float64)
        r = self._value(yhat, np.asarray(y))
        return r / yhat.size if self.mean else r


@dataclass(frozen=True)
class SquaredLoss(Loss):
    """Sum of squared errors over samples and outputs."""

    code: ClassVar[int] = kernels.SQUARED

    def _value(self, yhat, y):
        return float(np.sum((yhat - y) ** 2))


@dataclass(frozen=True)
class MeanSquaredLoss(SquaredLoss):
    """Mean of squared errors over samples and outputs (over the minibatch when training)."""

    mean: ClassVar[bool] = True


@dataclass(frozen=True)
class AbsoluteLoss(Loss):
    """Sum of absolute errors over samples and outputs."""

    code: ClassVar[int] = kernels.ABSOLUTE

    def _value(self, yhat, y):
        return float(np.sum(np.abs(yhat - y)))


@dataclass(frozen=True)
class LogitCrossEntropyLoss(Loss):
    """Softmax cross-entropy of logits against integer class labels, summed over samples.

    Targets are labels ``Y`` of shape (N,) with values in ``0 .. n_out-1``.
    """

    code: ClassVar[int] = kernels.LOGITCE

    def targets(self, Y, n, n_out, dtype):
        Y = np.asarray(Y)
        if Y.shape != (n,):
            raise ValueError(f"`Y` must be integer labels of shape ({n},), got {Y.shape}")
        if not np.issubdtype(Y.dtype, np.integer):
            raise TypeError(f"`Y` must hold integer class labels, got dtype {Y.dtype}")
        if n and (Y.min() < 0 or Y.max() >= n_out):
            raise ValueError(f"`Y` labels must be in 0..{n_out - 1}, got range "
                             f"{Y.min()}..{Y.max()}")
        return Y.astype(dtype).reshape(n, 1)

    def __call__(self, yhat, y):
        yhat = np.asarray(yhat, dtype=np.float64)
        m = yhat.max(axis=1, keepdims=True)
        lse = (m + np.log(np.exp(yhat - m).sum(axis=1, keepdims=True)))[:, 0]
        return float(np.sum(lse - yhat[np.arange(len(y)), np.asarray(y)]))


def check_loss(loss):
    if not isinstance(loss, Loss):
        raise TypeError(f"`loss` must be a nets loss such as nets.SquaredLoss(), got {loss!r}")
    return loss
