"""One subject's contribution to the population objective (-2 log-likelihood).

Notation, per subject: observations ``y`` (m,), predictions ``f(eta)``,
residual variances ``R(f)`` (the error models), random effects
``eta ~ N(0, Omega)`` and the subject's objective

    O(eta) = sum_j [(y_j - f_j)**2 / R_j + log R_j] + eta^T Omega^-1 eta,

-2 log of p(y | eta) p(eta) without the constants. Its minimiser
``eta_hat`` is the empirical Bayes estimate; with ``G = df/deta`` and
``r = dR/deta`` (the interaction) the objective's first-order Hessian is
``2 H``, ``H = Omega^-1 + G^T diag(1/R + r**2/(2 R**2)) G`` (the expected
information of the Gaussian residuals: Almquist et al., J. Pharmacokinet.
Pharmacodyn. 42, 2015). The methods integrate eta out by (NONMEM
convention, no ``m log 2 pi``; Wang, J. Pharmacokinet. Pharmacodyn. 34, 2007):

- ``"focei"``: Laplace's approximation with that Hessian:
  ``O(eta_hat) + log|Omega| + log|H|``;
- ``"laplace"``: with the objective's own Hessian ``K`` (from the
  predictions' second derivatives in eta, `derivatives.hessian`):
  ``O(eta_hat) + log|Omega| + log|K / 2|``;
- ``"foce"``: no interaction: the model linearised in eta at ``eta_hat``
  with the variances at the population prediction ``f(0)``; ``y`` is then
  Gaussian with mean ``f(eta_hat) - G eta_hat`` and covariance
  ``G Omega G^T + diag(R(f(0)))``;
- ``"fo"``: the same linearisation at ``eta = 0``.

Observations below a limit of quantification (``NLME(lloq=...)``, Beal's M3,
J. Pharmacokinet. Pharmacodyn. 28, 2001) contribute ``-2 log Phi((LLOQ - f) / sqrt(R))``
instead of the Gaussian term, with their exact curvature in FOCE-I's ``H``
(`derivatives.residual_jets`); FO and FOCE, Gaussian linearisations, refuse them.

For additive errors FOCE and FOCE-I are the same objective.
"""

import numpy as np

from adjoints import SolveFailed

from .derivatives import Local, hessian, residual_jets, variance_terms
from .kernels import objective_into

METHODS = ("fo", "foce", "focei", "laplace")


class Subject:
    """A subject's objective as a function of eta, at fixed population parameters."""

    def __init__(self, sf, errors, theta, omega, sd, method, tol=1e-12, weights=None,
                 weight_index=None):
        self.sf, self.errors, self.theta, self.sd = sf, errors, theta, sd
        self.tol = tol
        self.weights, self.weight_index = weights, weight_index  # estimated network weights
        self.omega = omega
        self.omega_inv = np.linalg.inv(omega)
        self.method = method
        self.cens = sf.cens
        if self.cens is not None and method in ("fo", "foce"):
            raise ValueError(f"NLME: subject {sf.id!r} has observations below the LLOQ "
                             f"(`lloq`), whose M3 likelihood is not Gaussian: method="
                             f"{method!r} linearises a Gaussian one; use 'focei' or 'laplace'")
        self.f0 = self.R0 = None
        if method in ("fo", "foce"):
            self.f0, _ = self._predict(np.zeros(omega.shape[0]), sens=False)
            self.R0 = self._variance(self.f0)[0]
        self._local = None

    def _predict(self, eta, sens=True):
        if sens:
            phi, dphi_de, _ = self.sf.ind.derivatives(self.theta, eta)
        else:
            phi = self.sf.ind.values(self.theta, eta)
        f, F = self.sf.predict(phi, sens, self.weights, self.weight_index)
        return f, (F @ dphi_de if sens else None)

    def _variance(self, f):
        return variances(self.errors, self.sd, self.sf.err_index, f)

    def evaluate(self, eta):
        """``(O, gradient of O, H, f, G, R)`` at ``eta`` (see the module docstring); O is
        infinite where the subject's solve fails (a line search then steps back)."""
        try:
            f, G = self._predict(eta)
        except SolveFailed:
            k = eta.shape[0]
            return np.inf, np.full(k, np.nan), np.full((k, k), np.nan), None, None, None
        Oi = self.omega_inv
        if self.cens is not None:  # M3 terms: the residual jets (`derivatives.residual_jets`)
            vt = variance_terms(self.errors, self.sd, self.sf.err_index, f)
            L0, L1, _, w = residual_jets(self.sf.y, f, vt.R, vt.R1, vt.R2, self.cens)
            value = float(np.sum(L0.v) + eta @ Oi @ eta)
            H = Oi + G.T @ (w.v[:, None] * G)
            return value, G.T @ L1.v + 2.0 * (Oi @ eta), H, f, G, vt.R
        if self.R0 is not None:
            R, dR = self.R0, np.zeros_like(f)
        else:
            R, dR = self._variance(f)
        k = eta.shape[0]
        grad, H = np.empty(k), np.empty((k, k))
        # (y - f)^2 / R + log R summed, plus the prior; O's gradient and H (one call)
        value = objective_into(grad, H, self.sf.y, f, G, R, dR, Oi, eta)
        return value, grad, H, f, G, R

    def ebe(self, eta0, max_iter=200, curvature=None):
        """The empirical Bayes estimate from ``eta0``: quasi-Newton steps with a
        backtracking line search, until the predicted decrease of O is below ``tol``.

        The step is ``-(H + S/2)^-1 grad / 2``: ``2 H`` is the scoring (Gauss-Newton)
        Hessian of O, which leaves out the residuals' curvature ``sum_j l'_j d2f_j/deta2``;
        ``S`` estimates that term (a structured secant update as in NL2SOL: Dennis, Gay &
        Welsch, ACM TOMS 7, 1981). After a step ``s`` the gradient's change ``y``
        less the scoring part ``2 H s`` is what ``S s`` should be; the symmetric
        (Powell-symmetric-Broyden) update makes it so. ``curvature`` is the start of S
        (`gradient.EtaStart`: the exact term at the last estimate), zero when not given;
        where ``H + S/2`` is not positive definite the step is scoring's. On theo_sd
        scoring alone overshot by a quarter and needed 12 steps from eta = 0 to the
        tolerance; with S the steps converge superlinearly.

        Once a step had to be cut to a quarter or less (a strongly nonlinear network,
        large residuals), the iterations use Newton steps on the exact Hessian
        (`hessian`, second-order sensitivities) whenever it is positive definite.

        Near the optimum O's changes are lost in the solves' rounding, but its gradient
        (from the sensitivities) is not: steps predicted to change O by less than 1e-8
        are taken without testing the decrease. Below 1e-6, a predicted decrease that is
        not under half the smallest one seen means the gradient's own rounding is
        reached (it then bounces around the optimum): the search stops there too.
        Returns ``(eta_hat, evaluate(eta_hat))``.
        """
        eta = np.array(eta0, dtype=float)
        k = eta.shape[0]
        S = np.zeros((k, k)) if curvature is None else np.array(curvature, dtype=float)
        cur = self.evaluate(eta)
        least, newton = np.inf, False
        for _ in range(max_iter):
            value, grad, H = cur[:3]
            M = self._newton_matrix(eta) if newton else _positive_definite(H + 0.5 * S)
            step = -0.5 * np.linalg.solve(H if M is None else M, grad)
            decrease = -(grad @ step)
            if not decrease > self.tol or (decrease < 1e-6 and decrease > 0.5 * least):
                break
            least = min(least, decrease)
            a = 1.0
            for _ in range(30):
                trial = self.evaluate(eta + a * step)
                if np.isfinite(trial[0]) and (a * decrease < 1e-8
                                              or trial[0] <= value - 1e-4 * a * decrease):
                    break
                a *= 0.5
            else:
                break
            newton = newton or a <= 0.25
            s_ = a * step
            ss = float(s_ @ s_)
            if ss > 0.0:  # PSB: S s = y - 2 H_new s afterwards, S stays symmetric
                r = trial[1] - grad - 2.0 * (trial[2] @ s_) - S @ s_
                S = S + (np.outer(r, s_) + np.outer(s_, r)) / ss \
                    - float(r @ s_) * np.outer(s_, s_) / (ss * ss)
            eta, cur = eta + s_, trial
        return eta, cur

    def _newton_matrix(self, eta):
        """Half the exact Hessian of O at ``eta`` when it is positive definite, else None."""
        K = 0.5 * self.hessian(eta)
        try:
            np.linalg.cholesky(K)
        except np.linalg.LinAlgError:
            return None
        return K

    def objective(self, eta0, curvature=None):
        """``(contribution to the objective, eta_hat)``; ``curvature``: see `ebe`."""
        _, logdet_omega = np.linalg.slogdet(self.omega)
        if self.method == "fo":
            eta = np.zeros(self.omega.shape[0])
            _, _, _, f, G, _ = self.evaluate(eta)
            return _linearised(self.sf.y, f, G, self.omega, self.R0), eta
        eta, (value, _, H, f, G, R) = self.ebe(eta0, curvature=curvature)
        if not np.isfinite(value):
            return np.inf, eta
        if self.method == "foce":
            return _linearised(self.sf.y, f - G @ eta, G, self.omega, self.R0), eta
        if self.method == "laplace":
            H = self.hessian(eta) / 2.0
        sign, logdet_h = np.linalg.slogdet(H)
        if sign <= 0:
            return np.inf, eta
        return value + logdet_omega + logdet_h, eta

    def local(self, eta):
        """The predictions' derivatives at ``eta`` (`derivatives.Local`), kept for the
        last ``eta`` asked (the objective's Hessian and the gradient share them)."""
        if self._local is None or not np.array_equal(self._local.eta, eta):
            self._local = Local(self, np.array(eta, dtype=float))
        return self._local

    def hessian(self, eta):
        """The exact Hessian of O at ``eta`` (`derivatives.hessian`)."""
        loc = self.local(eta)
        R, R1, R2 = variance_terms(self.errors, self.sd, self.sf.err_index, loc.f)[:3]
        _, L1, L2, _ = residual_jets(self.sf.y, loc.f, R, R1, R2, self.cens)
        return hessian(loc, L1.v, L2.v, self.omega_inv)


def _positive_definite(M):
    """``M`` when it is positive definite, else None."""
    try:
        np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        return None
    return M


def variances(errors, sds, err_index, f):
    """``(R, dR/df)`` of predictions ``f``, observation ``j`` following error model
    ``errors[err_index[j]]`` with standard deviations ``sds[err_index[j]]``."""
    if f.shape[0] and (len(errors) == 1 or not np.any(err_index != err_index[0])):
        q = int(err_index[0])  # one error model for every observation: only its R, R'
        return tuple(np.array(a, dtype=float) for a in errors[q].terms(f, sds[q])[:2])
    return tuple(variance_terms(errors, sds, err_index, f)[:2])


def _linearised(y, mean, G, omega, R):
    """-2 log N(y; mean, G Omega G^T + diag(R)) without the constant."""
    C = G @ omega @ G.T + np.diag(R)
    L = np.linalg.cholesky(C)
    z = np.linalg.solve(L, y - mean)
    return float(z @ z + 2.0 * np.sum(np.log(np.diag(L))))
