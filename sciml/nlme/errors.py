"""Residual error models: the variance of an observation given its prediction.

Each model has named standard deviations (its *sigma* parameters) and gives
``R(f)``, the residual variance at prediction ``f``, and ``dR/df`` (the
interaction of FOCE-I and Laplace: the variance moves with the random
effects through the prediction). As in nlmixr2, a combined error adds the
variances (``add.sd**2 + (prop.sd * f)**2``).
"""

import numpy as np

from sciml._validate import real

__all__ = ["Additive", "Proportional", "Combined"]


def _sd(value, cls, name):
    return real(value, name, cls, lo=0.0, want="a standard deviation > 0")


class ErrorModel:
    """Base class: ``names`` of the standard deviations, ``sd`` their values."""

    names: tuple = ()

    def __init__(self, *sd):
        self.sd = tuple(_sd(v, type(self).__name__, n) for v, n in zip(sd, self.names))

    def variance(self, f, sd):
        """``(R, dR/df)`` at predictions ``f`` for standard deviations ``sd``."""
        return self.terms(f, sd)[:2]

    def terms(self, f, sd):
        """``(R, R', R'', dR/dsd, dR'/dsd, dR''/dsd)``: the variance, its first and second
        derivatives in ``f``, and the derivatives of these three in each sd (arrays
        (n_sd, len(f))). The exact gradients take the variance at most quadratic in ``f``
        (no third derivative), as it is in the three models here."""
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{v:g}' for v in self.sd)})"


class Additive(ErrorModel):
    """``y = f + eps``, ``eps ~ N(0, sd**2)``."""

    names = ("sd",)

    def __init__(self, sd):
        super().__init__(sd)

    def terms(self, f, sd):
        z = np.zeros_like(f)
        return (np.full_like(f, sd[0] ** 2), z, z, np.full((1, f.shape[0]), 2.0 * sd[0]), z[None],
                z[None])


class Proportional(ErrorModel):
    """``y = f (1 + eps)``, ``eps ~ N(0, sd**2)``: variance ``(sd f)**2``."""

    names = ("sd",)

    def __init__(self, sd):
        super().__init__(sd)

    def terms(self, f, sd):
        s = sd[0]
        return ((s * f) ** 2, 2.0 * s * s * f, np.full_like(f, 2.0 * s * s),
                (2.0 * s * f * f)[None], (4.0 * s * f)[None], np.full((1, f.shape[0]), 4.0 * s))


class Combined(ErrorModel):
    """Additive and proportional: variance ``add**2 + (prop f)**2``."""

    names = ("add", "prop")

    def __init__(self, add, prop):
        super().__init__(add, prop)

    def terms(self, f, sd):
        a, p = sd
        return (a * a + (p * f) ** 2, 2.0 * p * p * f, np.full_like(f, 2.0 * p * p),
                np.stack([np.full_like(f, 2.0 * a), 2.0 * p * f * f]),
                np.stack([np.zeros_like(f), 4.0 * p * f]),
                np.stack([np.zeros_like(f), np.full_like(f, 4.0 * p)]))
