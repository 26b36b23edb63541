"""Losses on observations: sum of squares (optionally weighted), Gaussian likelihood.

A loss sees the model's predictions at the observation times, ``yhat``
(T, k), the `Data` and the flat parameter vector; it returns its value,
``dL/dyhat`` (T, k) (zero where the data are missing) and the gradient with
respect to parameters it uses directly (the noise level of `GaussianNLL`).
The adjoint methods turn ``dL/dyhat`` into the jumps of the adjoint state.
"""

import math

import numpy as np

__all__ = ["ObservationLoss", "SSE", "GaussianNLL"]


class ObservationLoss:
    """Base of the losses on observations of a solution (a network's training losses are
    `nets.losses.Loss`): ``loss(yhat, data, theta, model) -> (value, ybar, pbar or None)``."""

    def bind(self, model):
        """Check the loss against ``model`` (once, before a fit); returns self."""
        return self

    def __call__(self, yhat, data, theta, model):
        raise NotImplementedError


class SSE(ObservationLoss):
    """Sum of squared errors ``sum w * (yhat - y)**2`` over the observed values.

    The weights are `Data`'s ``weights`` (1 where none were given); missing
    values (NaN) are left out.
    """

    def __call__(self, yhat, data, theta, model):
        r = yhat - data.y_filled
        wr = data.w_masked * r
        return float(np.sum(wr * r)), 2.0 * wr, None

    def __repr__(self):
        return "SSE()"


class GaussianNLL(ObservationLoss):
    """Negative log-likelihood of independent Gaussian errors, with the noise level fitted.

    ``L = sum over observed values of 0.5 * ((yhat - y) / sigma)**2 + log(sigma) + 0.5 log(2 pi)``

    Parameters
    ----------
    sigma : str, float, or sequence of them (one per data column)
        A mechanistic parameter of the model holding the noise standard
        deviation (fitted with the rest), or a fixed positive number.
    log : bool
        The named parameters hold ``log(sigma)`` (unconstrained, often the
        better-conditioned choice) instead of sigma itself.
    """

    def __init__(self, sigma="sigma", log=False):
        self.sigma = sigma
        self.log = bool(log)

    def _sigmas(self, k, theta, model):
        spec = self.sigma if isinstance(self.sigma, (list, tuple)) else [self.sigma] * k
        if len(spec) != k:
            raise ValueError(f"GaussianNLL: `sigma` has {len(spec)} entries for {k} data columns")
        sig, idx = np.empty(k), np.full(k, -1, dtype=np.int64)
        for j, s in enumerate(spec):
            if isinstance(s, str):
                if s not in model.params:
                    raise ValueError(f"GaussianNLL: `sigma` names {s!r}, which is not a "
                                     f"mechanistic parameter of the model {model.params!r}")
                idx[j] = model.params.index(s)
                v = theta[idx[j]]
                sig[j] = math.exp(v) if self.log else v
            else:
                if isinstance(s, bool) or not isinstance(s, (int, float)) or not s > 0:
                    raise ValueError(f"GaussianNLL: a fixed `sigma` must be a number > 0, got "
                                     f"{s!r}")
                sig[j] = s
        if not np.all(sig > 0) or not np.all(np.isfinite(sig)):
            raise ValueError(f"GaussianNLL: sigma must be finite and > 0, got {sig.tolist()} "
                             "(start it positive, or use log=True)")
        return sig, idx

    def bind(self, model):
        if isinstance(self.sigma, str) or (isinstance(self.sigma, (list, tuple)) and any(
                isinstance(s, str) for s in self.sigma)):
            names = [self.sigma] if isinstance(self.sigma, str) else self.sigma
            for s in names:
                if isinstance(s, str) and s not in model.params:
                    raise ValueError(f"GaussianNLL: `sigma` names {s!r}, which is not a "
                                     f"mechanistic parameter of the model {model.params!r}")
        return self

    def __call__(self, yhat, data, theta, model):
        k = yhat.shape[1]
        sig, idx = self._sigmas(k, theta, model)
        m = data.mask
        r = np.where(m, yhat - data.y_filled, 0.0) / sig
        cnt = m.sum(axis=0)
        value = float(0.5 * np.sum(r * r) + np.sum(cnt * np.log(sig))
                      + 0.5 * math.log(2 * math.pi) * cnt.sum())
        ybar = r / sig
        pbar = None
        if np.any(idx >= 0):
            pbar = np.zeros(theta.shape[0])
            dsig = -np.sum(r * r, axis=0) / sig + cnt / sig  # dL/dsigma per column
            for j in range(k):
                if idx[j] >= 0:
                    pbar[idx[j]] += dsig[j] * (sig[j] if self.log else 1.0)
        return value, ybar, pbar

    def __repr__(self):
        return f"GaussianNLL(sigma={self.sigma!r}{', log=True' if self.log else ''})"
