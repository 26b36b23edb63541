"""Normalisation layers: `BatchNorm`, `InstanceNorm` and `LayerNorm` (PyTorch's
``BatchNorm1d/2d/3d``, ``InstanceNorm1d/2d/3d``, ``LayerNorm``).

One kernel family serves all three. The input is viewed as ``(A, K, S)`` and each of
the K groups is normalised over its A*S entries, ``xhat = (x - mean) / sqrt(var + eps)``
(biased variance), then scaled and shifted:

- BatchNorm: ``(N, C, prod(spatial))``, a group per channel, scale and shift per channel;
- InstanceNorm: ``(1, N*C, prod(spatial))``, a group per sample and channel, scale and
  shift per channel (group k has channel k % C);
- LayerNorm: ``(1, N*G, M)``, a group per sample and leading index, over the M trailing
  entries of `normalized_shape`, scale and shift per entry.

The pullback through batch statistics is ``xbar = invstd (dxhat - mean(dxhat) - xhat
mean(dxhat xhat))`` per group, with ``dxhat = ybar * weight``; through fixed statistics
(BatchNorm in evaluation mode) it is ``dxhat * invstd``. The forward leaves each group's
mean and inverse standard deviation in the scratch, where the pullback reads them.
"""

import math
from dataclasses import dataclass

import numpy as np

from ._config import jit
from .layers import Layer, _shape, check_positive_int

NONE, PER_GROUP, PER_ENTRY = 0, 1, 2


@jit
def group_stats(X, mean, invstd, var, eps):
    """mean[k], var[k] (biased) and invstd[k] = 1/sqrt(var + eps) over X[:, k, :]."""
    A, K, S = X.shape
    M = A * S
    for k in range(K):
        s = 0.0
        for a in range(A):
            x = X[a, k]
            for j in range(S):
                s += x[j]
        m = s / M
        q = 0.0
        for a in range(A):
            x = X[a, k]
            for j in range(S):
                d = x[j] - m
                q += d * d
        mean[k] = m
        var[k] = q / M
        invstd[k] = 1.0 / math.sqrt(q / M + eps)


@jit
def normalize(X, Y, mean, invstd, p, affine, C, has_bias):
    """Y = (X - mean) * invstd, scaled and shifted by p = [weight, bias] (see module)."""
    A, K, S = X.shape
    n_w = C if affine == PER_GROUP else S
    for a in range(A):
        for k in range(K):
            x, y = X[a, k], Y[a, k]
            m, r = mean[k], invstd[k]
            c = k % C
            for j in range(S):
                v = (x[j] - m) * r
                if affine == PER_GROUP:
                    v = v * p[c] + (p[n_w + c] if has_bias else 0.0)
                elif affine == PER_ENTRY:
                    v = v * p[j] + (p[n_w + j] if has_bias else 0.0)
                y[j] = v


@jit
def normalize_pullback(X, V, Xbar, want_x, mean, invstd, p, pbar, affine, C, has_bias,
                       batch_stats):
    """pbar += the scale's and shift's gradients; Xbar = V^T dY/dX (overwritten) if
    `want_x`, through the batch statistics if `batch_stats`, else through fixed ones."""
    A, K, S = X.shape
    M = A * S
    n_w = C if affine == PER_GROUP else S
    for k in range(K):
        m, r = mean[k], invstd[k]
        c = k % C
        s1 = 0.0  # sum of dxhat
        s2 = 0.0  # sum of dxhat * xhat
        for a in range(A):
            x, v = X[a, k], V[a, k]
            for j in range(S):
                xh = (x[j] - m) * r
                if affine == PER_GROUP:
                    pbar[c] += v[j] * xh
                    if has_bias:
                        pbar[n_w + c] += v[j]
                    g = v[j] * p[c]
                elif affine == PER_ENTRY:
                    pbar[j] += v[j] * xh
                    if has_bias:
                        pbar[n_w + j] += v[j]
                    g = v[j] * p[j]
                else:
                    g = v[j]
                s1 += g
                s2 += g * xh
        if not want_x:
            continue
        s1 /= M
        s2 /= M
        for a in range(A):
            x, v, xb = X[a, k], V[a, k], Xbar[a, k]
            for j in range(S):
                if affine == PER_GROUP:
                    g = v[j] * p[c]
                elif affine == PER_ENTRY:
                    g = v[j] * p[j]
                else:
                    g = v[j]
                if batch_stats:
                    xb[j] = r * (g - s1 - (x[j] - m) * r * s2)
                else:
                    xb[j] = r * g


@jit
def update_running(s, mean, var, C, momentum, count):
    """Running statistics s = [running_mean (C), running_var (C), num_batches_tracked]
    updated with a batch's mean and biased var (count entries per channel): PyTorch's
    exponential average (the unbiased variance), or the cumulative one if momentum < 0."""
    s[2 * C] += 1.0
    f = momentum if momentum >= 0 else 1.0 / s[2 * C]
    unbias = count / (count - 1.0) if count > 1 else 1.0
    for c in range(C):
        s[c] = (1 - f) * s[c] + f * mean[c]
        s[C + c] = (1 - f) * s[C + c] + f * var[c] * unbias


@jit
def running_invstd(s, C, eps, mean, invstd):
    """mean[c] = running_mean[c], invstd[c] = 1/sqrt(running_var[c] + eps)."""
    for c in range(C):
        mean[c] = s[c]
        invstd[c] = 1.0 / math.sqrt(s[C + c] + eps)


def _check_eps(owner, eps):
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"{owner}: `eps` must be a positive number, got {eps!r}")


def _channels(owner, in_shape, C):
    in_shape = _shape(in_shape)
    if len(in_shape) < 1 or in_shape[0] != C:
        raise ValueError(f"{owner}: expects {C} channels first, (C, *spatial), got input "
                         f"shape {in_shape}")
    return in_shape


@dataclass(frozen=True)
class BatchNorm(Layer):
    """Batch normalisation over each channel (PyTorch's ``BatchNorm1d/2d/3d``: inputs
    ``(C,)``, ``(C, L)``, ``(C, H, W)`` or ``(C, D, H, W)`` per sample).

    Parameters
    ----------
    channels : int
        C (PyTorch's ``num_features``).
    eps : float
    momentum : float or None
        Weight of the batch in the running averages; None: the cumulative average.
    affine : bool
        Learnable ``weight`` and ``bias`` per channel (ones and zeros at first).
    track_running_stats : bool
        Keep ``running_mean``, ``running_var``, ``num_batches_tracked`` in the chain's
        state vector: training mode normalises with the batch's statistics and updates
        them; evaluation mode normalises with them. False: always the batch's.

    The forward overwrites ``y``, the scratch (each channel's mean, inverse std and
    variance) and, in training mode, the state; the pullback adds into ``pbar`` and
    overwrites ``xbar``.
    """

    channels: int
    eps: float = 1e-5
    momentum: float = 0.1
    affine: bool = True
    track_running_stats: bool = True

    def __post_init__(self):
        check_positive_int("BatchNorm", "channels", self.channels)
        _check_eps("BatchNorm", self.eps)
        if self.momentum is not None and (isinstance(self.momentum, bool) or not isinstance(
                self.momentum, (int, float)) or not 0 <= self.momentum <= 1):
            raise ValueError(f"BatchNorm: `momentum` must be in [0, 1] or None, "
                             f"got {self.momentum!r}")

    def out_shape(self, in_shape):
        return _channels("BatchNorm", in_shape, self.channels)

    def param_shapes(self, in_shape):
        C = self.channels
        return (("weight", (C,)), ("bias", (C,))) if self.affine else ()

    def state_shapes(self, in_shape):
        C = self.channels
        if not self.track_running_stats:
            return ()
        return (("running_mean", (C,)), ("running_var", (C,)), ("num_batches_tracked", ()))

    def init_params(self, in_shape, arrays, rng):
        if self.affine:
            arrays["weight"][...] = 1.0
            arrays["bias"][...] = 0.0

    def init_state(self, in_shape, arrays):
        if self.track_running_stats:
            arrays["running_var"][...] = 1.0

    def _batch(self, training):
        return training or not self.track_running_stats

    def couples_batch(self, training):
        return self._batch(training)

    def scratch_size(self, in_shape, batch):
        return 3 * self.channels

    def _view(self, a):
        return a.reshape(a.shape[0], self.channels, -1)

    def forward(self, ctx, x, y, p, s, scratch):
        C = self.channels
        X = self._view(x)
        mean, invstd, var = scratch[:C], scratch[C:2 * C], scratch[2 * C:3 * C]
        if self._batch(ctx.training):
            group_stats(X, mean, invstd, var, self.eps)
            if ctx.training and self.track_running_stats:
                update_running(s, mean, var, C, -1.0 if self.momentum is None
                               else float(self.momentum), X.shape[0] * X.shape[2])
        else:
            running_invstd(s, C, self.eps, mean, invstd)
        normalize(X, self._view(y), mean, invstd, p, PER_GROUP if self.affine else NONE, C,
                  self.affine)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        C = self.channels
        X = self._view(x)
        want = xbar is not None
        normalize_pullback(X, self._view(ybar), self._view(xbar) if want else X, want,
                           scratch[:C], scratch[C:2 * C], p, pbar,
                           PER_GROUP if self.affine else NONE, C, self.affine,
                           self._batch(ctx.training))

    def jax_apply(self, params, state, x, ctx):
        import jax.numpy as jnp

        axes = (0,) + tuple(range(2, x.ndim))
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if self._batch(ctx.training):
            m = jnp.mean(x, axis=axes, keepdims=True)
            v = jnp.mean((x - m) ** 2, axis=axes, keepdims=True)
        else:
            m = state["running_mean"].reshape(shape)
            v = state["running_var"].reshape(shape)
        y = (x - m) / jnp.sqrt(v + self.eps)
        if self.affine:
            y = y * params["weight"].reshape(shape) + params["bias"].reshape(shape)
        return y


@dataclass(frozen=True)
class InstanceNorm(Layer):
    """Instance normalisation: each sample's channels over their spatial entries
    (PyTorch's ``InstanceNorm1d/2d/3d`` without running statistics; inputs ``(C, L)``,
    ``(C, H, W)``, ``(C, D, H, W)`` per sample).

    Parameters
    ----------
    channels : int
    eps : float
    affine : bool
        Learnable ``weight`` and ``bias`` per channel (PyTorch's default: False).

    The forward overwrites ``y`` and the scratch (each group's statistics); the
    pullback adds into ``pbar`` and overwrites ``xbar``.
    """

    channels: int
    eps: float = 1e-5
    affine: bool = False

    def __post_init__(self):
        check_positive_int("InstanceNorm", "channels", self.channels)
        _check_eps("InstanceNorm", self.eps)

    def out_shape(self, in_shape):
        in_shape = _channels("InstanceNorm", in_shape, self.channels)
        if len(in_shape) < 2:
            raise ValueError(f"InstanceNorm: needs spatial axes, (C, *spatial), got input "
                             f"shape {in_shape}")
        return in_shape

    def param_shapes(self, in_shape):
        C = self.channels
        return (("weight", (C,)), ("bias", (C,))) if self.affine else ()

    def init_params(self, in_shape, arrays, rng):
        if self.affine:
            arrays["weight"][...] = 1.0
            arrays["bias"][...] = 0.0

    def scratch_size(self, in_shape, batch):
        return 3 * self.channels * batch

    def _view(self, a):
        return a.reshape(1, a.shape[0] * self.channels, -1)

    def forward(self, ctx, x, y, p, s, scratch):
        K = x.shape[0] * self.channels
        X = self._view(x)
        mean, invstd, var = scratch[:K], scratch[K:2 * K], scratch[2 * K:3 * K]
        group_stats(X, mean, invstd, var, self.eps)
        normalize(X, self._view(y), mean, invstd, p, PER_GROUP if self.affine else NONE,
                  self.channels, self.affine)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        K = x.shape[0] * self.channels
        X = self._view(x)
        want = xbar is not None
        normalize_pullback(X, self._view(ybar), self._view(xbar) if want else X, want,
                           scratch[:K], scratch[K:2 * K], p, pbar,
                           PER_GROUP if self.affine else NONE, self.channels, self.affine, True)

    def jax_apply(self, params, state, x, ctx):
        import jax.numpy as jnp

        axes = tuple(range(2, x.ndim))
        shape = (1, -1) + (1,) * (x.ndim - 2)
        m = jnp.mean(x, axis=axes, keepdims=True)
        v = jnp.mean((x - m) ** 2, axis=axes, keepdims=True)
        y = (x - m) / jnp.sqrt(v + self.eps)
        if self.affine:
            y = y * params["weight"].reshape(shape) + params["bias"].reshape(shape)
        return y


@dataclass(frozen=True)
class LayerNorm(Layer):
    """Layer normalisation over each sample's trailing axes `normalized_shape` (PyTorch's
    ``LayerNorm``).

    Parameters
    ----------
    normalized_shape : int or tuple
        The trailing shape normalised together (an int: the last axis).
    eps : float
    elementwise_affine : bool
        Learnable ``weight`` (ones at first) per entry of `normalized_shape`.
    bias : bool
        With `elementwise_affine`: a learnable ``bias`` (zeros at first) too.

    The forward overwrites ``y`` and the scratch; the pullback adds into ``pbar`` and
    overwrites ``xbar``.
    """

    normalized_shape: tuple
    eps: float = 1e-5
    elementwise_affine: bool = True
    bias: bool = True

    def __post_init__(self):
        v = self.normalized_shape
        v = (v,) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else v
        if not isinstance(v, (tuple, list)) or not v or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0
                for d in v):
            raise ValueError(f"LayerNorm: `normalized_shape` must be a positive int or a tuple "
                             f"of them, got {self.normalized_shape!r}")
        object.__setattr__(self, "normalized_shape", tuple(int(d) for d in v))
        _check_eps("LayerNorm", self.eps)

    def out_shape(self, in_shape):
        in_shape = _shape(in_shape)
        k = len(self.normalized_shape)
        if tuple(in_shape[len(in_shape) - k:]) != self.normalized_shape:
            raise ValueError(f"LayerNorm: the input's trailing shape must be "
                             f"{self.normalized_shape}, got input shape {in_shape}")
        return in_shape

    def _affine(self):
        if not self.elementwise_affine:
            return NONE
        return PER_ENTRY

    def param_shapes(self, in_shape):
        if not self.elementwise_affine:
            return ()
        s = self.normalized_shape
        return (("weight", s),) + ((("bias", s),) if self.bias else ())

    def init_params(self, in_shape, arrays, rng):
        if self.elementwise_affine:
            arrays["weight"][...] = 1.0
            if self.bias:
                arrays["bias"][...] = 0.0

    def scratch_size(self, in_shape, batch):
        M = math.prod(self.normalized_shape)
        return 3 * batch * (math.prod(_shape(in_shape)) // M)

    def _view(self, a):
        M = math.prod(self.normalized_shape)
        return a.reshape(1, a.size // M, M)

    def forward(self, ctx, x, y, p, s, scratch):
        X = self._view(x)
        K = X.shape[1]
        mean, invstd, var = scratch[:K], scratch[K:2 * K], scratch[2 * K:3 * K]
        group_stats(X, mean, invstd, var, self.eps)
        normalize(X, self._view(y), mean, invstd, p, self._affine(), 1,
                  self.elementwise_affine and self.bias)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        X = self._view(x)
        K = X.shape[1]
        want = xbar is not None
        normalize_pullback(X, self._view(ybar), self._view(xbar) if want else X, want,
                           scratch[:K], scratch[K:2 * K], p, pbar, self._affine(), 1,
                           self.elementwise_affine and self.bias, True)

    def jax_apply(self, params, state, x, ctx):
        import jax.numpy as jnp

        axes = tuple(range(x.ndim - len(self.normalized_shape), x.ndim))
        m = jnp.mean(x, axis=axes, keepdims=True)
        v = jnp.mean((x - m) ** 2, axis=axes, keepdims=True)
        y = (x - m) / jnp.sqrt(v + self.eps)
        if self.elementwise_affine:
            y = y * params["weight"]
            if self.bias:
                y = y + params["bias"]
        return y
