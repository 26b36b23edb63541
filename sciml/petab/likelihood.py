"""The PEtab likelihood as a `sciml` loss, and parameter priors.

`Measurements` is a `sciml.Data` over the distinct measurement times of one
simulation, whose columns are every observable and its noise formula (both
model observables); each measurement row points at its time and its two
columns. `NegLogLikelihood` is the loss on it: minus the PEtab log-likelihood
of the rows (normal or Laplace noise, on the linear, log or log10 scale of
the observable, densities as PEtab writes them), and its derivative with
respect to every observable and noise value, which the sensitivity methods
carry to the parameters.
"""

import math

import numpy as np

from ..data import Data
from ..losses import ObservationLoss
from .errors import PetabError

__all__ = ["Measurements", "NegLogLikelihood", "DISTRIBUTIONS", "log_prior"]

#: noise distribution name -> (kind: 0 normal / 1 laplace, transformation: 0 lin, 1 log, 2 log10)
DISTRIBUTIONS = {"normal": (0, 0), "laplace": (1, 0), "log-normal": (0, 1),
                 "log-laplace": (1, 1), "log10-normal": (0, 2), "log10-laplace": (1, 2)}
TRANSFORMS = {"lin": 0, "log": 1, "log10": 2}
_LN10 = math.log(10.0)


class Measurements(Data):
    """Times, columns and rows of one simulation's measurements (see the module docstring).

    Parameters
    ----------
    times : ndarray (T,)
        Distinct measurement times, increasing.
    names : sequence of str
        The model observables the loss reads (observables, then noise formulas).
    row_t, row_y, row_s : int arrays (R,)
        Per measurement row: index of its time, of its observable column, of its noise column.
    value : float array (R,)
    kind, transform : int arrays (R,)
        Noise distribution (0 normal, 1 Laplace) and scale (0 lin, 1 log, 2 log10).
    """

    def __init__(self, times, names, row_t, row_y, row_s, value, kind, transform):
        super().__init__(times, np.zeros((len(times), len(names))), observables=names)
        self.row_t, self.row_y, self.row_s = row_t, row_y, row_s
        self.value, self.dist, self.transform = value, kind, transform


class NegLogLikelihood(ObservationLoss):
    """``-log L`` of the measurement rows of a `Measurements`, PEtab's densities."""

    def __call__(self, yhat, data, theta, model):
        sim = yhat[data.row_t, data.row_y]
        sigma = yhat[data.row_t, data.row_s]
        value, dsim, dsig = nllh(sim, sigma, data.value, data.dist, data.transform)
        ybar = np.zeros_like(yhat)
        np.add.at(ybar, (data.row_t, data.row_y), dsim)
        np.add.at(ybar, (data.row_t, data.row_s), dsig)
        return value, ybar, None

    def __repr__(self):
        return "NegLogLikelihood()"


def nllh(sim, sigma, m, kind, transform):
    """``(value, d/dsim, d/dsigma)`` of minus the log-likelihood of measurements `m`.

    Normal: ``0.5 log(2 pi sigma^2) + 0.5 r^2``, Laplace: ``log(2 sigma) + |r|``,
    with ``r = (h(m) - h(sim)) / sigma`` for the scale's ``h`` (identity, log,
    log10) and, off the linear scale, the density's Jacobian ``log(m)`` (times
    ``ln 10`` for log10) added, as PEtab defines them.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        lin, lg = transform == 0, transform == 1
        h_s = np.where(lin, sim, np.where(lg, np.log(sim), np.log10(sim)))
        h_m = np.where(lin, m, np.where(lg, np.log(m), np.log10(m)))
        dh = np.where(lin, 1.0, np.where(lg, 1.0 / sim, 1.0 / (sim * _LN10)))
        jac = np.where(lin, 0.0, np.where(lg, np.log(m), np.log(m * _LN10)))
        r = (h_m - h_s) / sigma
        normal = kind == 0
        value = np.where(normal, 0.5 * np.log(2 * math.pi * sigma**2) + 0.5 * r * r,
                         np.log(2 * sigma) + np.abs(r)) + jac
        dr = np.where(normal, r, np.sign(r))  # d value / d r
        dsim = -dr * dh / sigma
        dsig = 1.0 / sigma - dr * r / sigma
    total = float(np.sum(value))
    if not np.isfinite(total):
        return math.inf, np.zeros_like(sim), np.zeros_like(sim)
    return total, dsim, dsig


# ------------------------------------------------------------------------------ priors

# Elementwise on arrays (a network row's prior covers many entries), floats for floats.

def _normal(x, mu, s):
    return -0.5 * np.log(2 * math.pi * s * s) - 0.5 * ((x - mu) / s) ** 2, -(x - mu) / s**2


def _laplace(x, mu, b):
    # sign(0) = 0: the subgradient 0 at the kink
    return -np.log(2 * b) - np.abs(x - mu) / b, -np.sign(x - mu) / b


def _uniform(x, lo, hi):
    inside = (lo <= x) & (x <= hi)
    return np.where(inside, -math.log(hi - lo), -np.inf), np.zeros_like(x)


def _log_version(f):
    def g(x, a, b):
        pos = x > 0
        lx = np.log(np.where(pos, x, 1.0))  # x <= 0: density 0 (log -inf), no gradient
        v, d = f(lx, a, b)
        xs = np.where(pos, x, 1.0)
        return np.where(pos, v - lx, -np.inf), np.where(pos, d / xs - 1.0 / xs, 0.0)
    return g


PRIORS = {"normal": _normal, "laplace": _laplace, "uniform": _uniform,
          "log-normal": _log_version(_normal), "log-laplace": _log_version(_laplace),
          # PEtab v1 names: the prior is on the parameter's scale
          "parameterScaleNormal": _normal, "parameterScaleLaplace": _laplace,
          "parameterScaleUniform": _uniform, "logNormal": _log_version(_normal),
          "logLaplace": _log_version(_laplace)}
ON_SCALE = {"parameterScaleNormal", "parameterScaleLaplace", "parameterScaleUniform"}


def check_prior(where, name, params):
    if name not in PRIORS:
        raise PetabError(f"{where}: unknown prior distribution {name!r}; supported: "
                         f"{', '.join(PRIORS)}")
    if len(params) != 2:
        raise PetabError(f"{where}: prior {name!r} takes two parameters (separated by ';'), "
                         f"got {len(params)}")


def log_prior(name, params, value):
    """``(log density, d/d value)`` of prior `name` with its two parameters at `value`:
    floats for a float, elementwise arrays for an array."""
    x = np.asarray(value, dtype=np.float64)
    v, d = PRIORS[name](x, *params)
    if x.ndim == 0:
        return float(v), float(d)
    return np.asarray(v, dtype=np.float64), np.asarray(d, dtype=np.float64)
