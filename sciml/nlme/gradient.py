"""Exact gradients of a subject's objective in the population parameters, all four methods.

Notation (`likelihood`, `derivatives`): per observation ``l_j = (y_j - f_j)**2 / R_j
+ log R_j``; ``O(eta) = sum_j l_j + eta^T Omega^-1 eta``, its gradient
``g = G^T l' + 2 Omega^-1 eta`` and exact Hessian
``K = G^T diag(l'') G + sum_j l'_j Gee_j + 2 Omega^-1`` (``G = df/deta``,
``Gee_j = d2f_j/deta2``; ``l'``, ``l''`` total derivatives in f, through ``R(f)``
where the variance moves with f). A population parameter ``psi`` is a theta, a
residual sd or a network weight (Omega apart, below); at fixed eta it moves f
(``df``), G (``dG``) and, for the sds, ``R, R', R''`` at fixed f (``dl``, ``dl'``, ...
are those changes plus the f-derivative times ``df``).

**The inner problem.** ``eta_hat(psi)`` solves ``g = 0``; the implicit derivative
``d eta_hat/dpsi = -K^-1 dg/dpsi`` is taken once, backwards: for an objective
``OFV(eta_hat(psi), psi)``

    dOFV/dpsi = dOFV/dpsi|_eta - u^T dg/dpsi|_eta,    u = K^-1 dOFV/deta|_psi,
    dg/dpsi|_eta = dG^T l' + G^T dl'.

**FOCE-I and Laplace**: ``OFV = O(eta_hat) + log|Omega| + log|H|`` with
``H = Omega^-1 + G^T diag(d) G + sum_j e_j Gee_j``: FOCE-I ``d = w = 1/R + R'**2/(2 R**2)``,
``e = 0`` (the expected information); Laplace ``d = l''/2``, ``e = l'/2`` (``H = K/2``,
the objective's own Hessian). Then ``dOFV/deta = g + v`` (g is zero at an exact
optimum; kept, the result is the derivative of what was computed),
``v_c = tr(H^-1 dH/deta_c)``, and

    dOFV/dpsi|_eta = l'.df + sum(dl) + tr(H^-1 dH/dpsi),
    tr(H^-1 dH) = 2 sum(dG * diag(d) G H^-1) + q.dd + t.de + T3,

``q_j = (G H^-1 G^T)_jj``, ``t_j = tr(H^-1 Gee_j)``, ``T3 = sum_j e_j tr(H^-1 dGee_j)``
(eta: ``df = G_c``, ``dG = Gee_c``). For Omega, ``dOFV = tr(Gamma dOmega)`` with
``Gamma = Omega^-1 - Oe Oe^T - Omega^-1 H^-1 Omega^-1 + Oe Ou^T + Ou Oe^T``
(``Oe = Omega^-1 eta_hat``, ``Ou = Omega^-1 u``; the last two from g's
``2 Omega^-1 eta``).

**The third-order term** (Laplace). ``T = sum_j e_j tr(A Gee_j)`` at fixed e and
``A = H^-1``, with ``Gee_j = pe^T F2_j pe + F_j pee`` (``F = df/dphi``,
``F2 = d2f/dphi2``, ``pe = dphi/deta``, ``pee = d2phi/deta2``). With
``M = pe A pe^T = sum_c lam_c V_c V_c^T`` (``A = sum_c lam_c a_c a_c^T``,
``V_c = pe a_c``) and ``N_k = sum_ac pee_kac A_ac``,
``T = sum_j e_j (sum_kl M_kl F2_jkl + F_j.N)``. It changes

- through the model parameters p (phi, the weights) at fixed M and N:
  ``tau_p = sum_j e_j (sum_c lam_c d2/dh2 S_jp(phi + h V_c) + sum_k F2p_jkp N_k)``,
  ``S = df/dp``; the curvatures along ``V_c`` are second differences of the
  sensitivities (2 n_eta extra solves), the last sum their derivative along N
  (`derivatives.directional`, 2 more);
- through pe: ``2 sum((Y pe A) * dpe)``, ``Y = sum_j e_j F2_j`` (``Y pe`` from the
  derivatives along pe's columns, `derivatives.Local.DF`), ``dpe = pet`` (theta)
  or ``pee`` (eta);
- through pee: ``(e F).dN``, dN by central differences of the individual function's
  exact second derivatives;

so ``T3(theta) = tau_phi pt + ...``, ``T3(eta) = tau_phi pe + ...``,
``T3(w) = tau_w``. The Hessian the objective uses is this K (second-order
sensitivities, `likelihood.Subject.hessian`), so the gradient is the derivative of
what is computed, up to the central differences' O(h**2) (about 1e-6 relative
against central differences of the objective; those need a step near 1e-4 there,
the Hessian inside being made of differenced sensitivities whose rounding, about
3e-10 of the objective, smaller steps magnify).

**FO and FOCE**: ``OFV = -2 log N(y; mu, C)`` without the constant,
``mu = f - G eta``, ``C = G Omega G^T + diag(R0)``, ``R0 = R(f(0))``. With
``a = C^-1 (y - mu)`` and ``P = C^-1 - a a^T``,

    dOFV = -2 a.dmu + tr(P dC)
         = -2 a.(df - dG eta) + 2 sum(dG * P G Omega) + diag(P).dR0 + tr(G^T P G dOmega),

``dR0 = R'(f(0)) df(0) + dR/dsd``. FO: ``eta = 0``, no inner problem. FOCE:
``eta_hat`` minimises O with R fixed at R0 (``l' = -2 e/R0``, ``l'' = 2/R0``,
``dl' = 2 e/R0**2 dR0``), ``dmu/deta_c = -Gee_c eta`` and ``u = K^-1 dOFV/deta``;
Gamma gains ``Oe Ou^T + Ou Oe^T``.

All need the predictions' second derivatives (`derivatives.Local`: 2 n_eta extra
sensitivity solves); FOCE with a variance that moves
with f also the sensitivities at eta = 0.
"""

import numpy as np

from adjoints import SolveFailed

from .derivatives import (
    Change,
    Local,
    curvatures,
    directional,
    hessian,
    individual_third,
    residual_jets,
    variance_terms,
)
from .kernels import focei_gradient_into


def gradient(s, eta):
    """``(dOFV/dpsi (n_theta + n_sigma + n_w,), Gamma (n_eta, n_eta), start)`` of the
    subject ``s`` (`likelihood.Subject`, any method) at its estimate ``eta``: the
    population directions thetas, residual sds, estimated network weights;
    ``dOFV = tr(Gamma dOmega)`` for symmetric changes of Omega; ``start`` the `EtaStart`
    that predicts the estimate at other parameters (the estimate itself for FO)."""
    if s.method in ("fo", "foce"):
        return _linearised(s, s.local(eta))
    return _laplace_type(s, s.local(eta))


class EtaStart:
    """Where a subject's empirical Bayes estimate moves when the population parameters do:
    to first order ``eta_hat + d eta_hat = eta_hat - K^-1 (dg/dpsi dpsi + 2 dOmega^-1
    eta_hat)``, the implicit derivative of ``g(eta_hat, psi) = 0`` (module docstring; ``K``
    the exact Hessian in eta, ``psi`` the thetas, sds and weights, ``dOmega^-1`` the change
    of Omega's inverse). The next estimate starts there: the outer optimiser's steps and
    the covariance step's differences then cost the estimates one or two iterations."""

    def __init__(self, eta, psi, omega_inv, K=None, dg=None, H=None):
        self.eta, self.psi, self.omega_inv = eta, psi, omega_inv
        self.Kinv = np.linalg.inv(K) if K is not None else None
        self.A = None if K is None else self.Kinv @ dg
        # the residuals' curvature that scoring's Hessian 2 H leaves out (`Subject.ebe`)
        self.curvature = None if K is None or H is None else K - 2.0 * H

    @staticmethod
    def psi_of(s):
        """The population vector (thetas, sds, weights) of the subject ``s``."""
        parts = [s.theta, [v for sd in s.sd for v in sd]]
        if s.weights is not None:
            parts.append(s.weights)
        return np.concatenate([np.asarray(p, dtype=float) for p in parts])

    def at(self, s):
        """The predicted estimate at the parameters of the subject ``s`` (the last one when
        the prediction is not finite)."""
        if self.A is None:
            return self.eta
        psi = self.psi_of(s)
        if psi.shape != self.psi.shape or self.eta.shape[0] != s.omega_inv.shape[0]:
            return self.eta
        d = self.A @ (psi - self.psi) + self.Kinv @ (2.0 * (s.omega_inv - self.omega_inv)
                                                   @ self.eta)
        out = self.eta - d
        return out if np.all(np.isfinite(out)) else self.eta


def _variances(s, f):
    return variance_terms(s.errors, s.sd, s.sf.err_index, f)


def _in_sigma(loc, parts):
    """Per-sd arrays (m, n_sigma) placed in the population directions (zero elsewhere)."""
    m, nt = loc.f.shape[0], loc.pt.shape[1]
    nw = loc.w_cols.stop - loc.w_cols.start
    return [loc.population(np.zeros((m, nt)), np.zeros((m, nw)), p) for p in parts]


def _implicit(loc, L1, dr):
    """``dg/dpsi`` at fixed eta (n_eta, n_pop), ``L1`` the `Jet` of l'."""
    return np.einsum("jan,j->an", loc.dG, L1.v) + loc.G.T @ L1.change(loc.df, dr)


def _omega_implicit(omega_inv, eta, u):
    """Gamma's part from ``-u^T dg/dOmega`` (g's ``2 Omega^-1 eta``)."""
    Oe, Ou = omega_inv @ eta, omega_inv @ u
    return np.outer(Oe, Ou) + np.outer(Ou, Oe)


def _trace(loc, Hi, d, e, df, dG, dr=None):
    """``tr(H^-1 dH)`` (n,) for changes ``df`` (m, n), ``dG`` (m, n_eta, n) and ``dr``,
    without the third-order term (see the module docstring)."""
    B = loc.G @ Hi
    out = (2.0 * np.einsum("ja,jan->n", d.v[:, None] * B, dG)
           + np.sum(B * loc.G, axis=1) @ d.change(df, dr))
    if e is not None:
        out = out + np.einsum("ac,jac->j", Hi, loc.Gee) @ e.change(df, dr)
    return out


def _laplace_type(s, loc):
    """FOCE-I and Laplace (``O(eta_hat) + log|Omega| + log|H|``)."""
    Oi, eta, G = s.omega_inv, loc.eta, loc.G
    vt = _variances(s, loc.f)
    if s.method == "focei" and s.cens is None:  # the same terms in one compiled call
        npop, ne = loc.df.shape[1], eta.shape[0]
        d_pop, gamma = np.empty(npop), np.empty((ne, ne))
        K, dg, H = np.empty((ne, ne)), np.empty((ne, npop)), np.empty((ne, ne))
        focei_gradient_into(d_pop, gamma, K, dg, H, s.sf.y, loc.f, vt.R, vt.R1, vt.R2,
                            vt.Rs, vt.R1s, loc.pt.shape[1], G, loc.Gee, loc.df, loc.dG,
                            Oi, eta)
        return d_pop, gamma, EtaStart(eta, EtaStart.psi_of(s), Oi, K, dg, H)
    L0, L1, L2, w = residual_jets(s.sf.y, loc.f, vt.R, vt.R1, vt.R2, s.cens)
    dr = Change(*_in_sigma(loc, (vt.Rs, vt.R1s, vt.R2s)))
    K = hessian(loc, L1.v, L2.v, Oi)
    scoring = Oi + G.T @ (w.v[:, None] * G)  # `Subject.evaluate`'s H
    if s.method == "focei":
        d, e = w, None
        H = scoring
    else:
        d, e = L2.scaled(0.5), L1.scaled(0.5)
        H = 0.5 * K
    Hi = np.linalg.inv(H)
    tr = _trace(loc, Hi, d, e, loc.df, loc.dG, dr)
    v = _trace(loc, Hi, d, e, G, loc.Gee)
    if e is not None:
        t_pop, t_eta = _third_order(s, loc, e.v, Hi)
        tr, v = tr + t_pop, v + t_eta
    g = G.T @ L1.v + 2.0 * Oi @ eta
    u = np.linalg.solve(K, v + g)
    dg = _implicit(loc, L1, dr)
    d_pop = (L1.v @ loc.df + np.sum(L0.change(None, dr), axis=0) + tr - u @ dg)
    Oe = Oi @ eta
    gamma = Oi - np.outer(Oe, Oe) - Oi @ Hi @ Oi + _omega_implicit(Oi, eta, u)
    return d_pop, gamma, EtaStart(eta, EtaStart.psi_of(s), Oi, K, dg, scoring)


def _third_order(s, loc, e, A):
    """``T3``: the change of ``sum_j e_j tr(A Gee_j)`` at fixed e and A, in the population
    directions (n_pop,) and in eta (n_eta,) (see the module docstring)."""
    idx = loc.phi_cols
    lam, vec = np.linalg.eigh(A)
    D = curvatures(s, loc, loc.pe @ vec)                    # (m, n_eta, n_q)
    N = np.einsum("kac,ac->k", loc.pee, A)
    tau = np.einsum("j,jcp,c->p", e, D, lam) + e @ directional(s, loc.phi, N[:, None])[:, 0]
    YpA = 2.0 * np.einsum("j,jak->ka", e, loc.DF[:, :, idx]) @ A  # Y pe A, (n_phi, n_eta)
    eF = e @ loc.F
    dN_theta, dN_eta = individual_third(s, loc, A)
    t_theta = tau[idx] @ loc.pt + np.einsum("ka,kab->b", YpA, loc.pet) + eF @ dN_theta
    t_eta = tau[idx] @ loc.pe + np.einsum("ka,kac->c", YpA, loc.pee) + eF @ dN_eta
    return loc.population(t_theta, tau[loc.w_cols]), t_eta


def _linearised(s, loc):
    """FO and FOCE (``-2 log N(y; f - G eta, G Omega G^T + diag(R(f(0))))``)."""
    Om, Oi, eta, G = s.omega, s.omega_inv, loc.eta, loc.G
    vt0, df0 = _population_prediction(s, loc)
    dR0 = vt0.R1[:, None] * df0 + _in_sigma(loc, (vt0.Rs,))[0]
    Ci = np.linalg.inv(G @ Om @ G.T + np.diag(vt0.R))
    a = Ci @ (s.sf.y - loc.f + G @ eta)
    P = Ci - np.outer(a, a)
    B = P @ G @ Om

    def d_ofv(dmu, dG, dR=None):
        out = -2.0 * a @ dmu + 2.0 * np.einsum("ja,jan->n", B, dG)
        return out if dR is None else out + np.diag(P) @ dR

    d_pop = d_ofv(loc.df - np.einsum("jan,a->jn", loc.dG, eta), loc.dG, dR0)
    gamma = G.T @ P @ G
    K = dg = scoring = None
    if s.method == "foce":
        _, L1, L2, _ = residual_jets(s.sf.y, loc.f, vt0.R, 0.0, 0.0)
        v = d_ofv(-np.einsum("jac,a->jc", loc.Gee, eta), loc.Gee)
        K = hessian(loc, L1.v, L2.v, Oi)
        u = np.linalg.solve(K, v)
        dg = _implicit(loc, L1, Change(dR0, None, None))
        d_pop = d_pop - u @ dg
        gamma = gamma + _omega_implicit(Oi, eta, u)
        scoring = Oi + G.T @ (G / vt0.R[:, None])  # `Subject.evaluate`'s H (R fixed at R0)
    return d_pop, gamma, EtaStart(eta, EtaStart.psi_of(s), Oi, K, dg, scoring)


def _population_prediction(s, loc):
    """``(VarianceTerms at f(0), df(0)/dpsi)``; FOCE needs the sensitivities at eta = 0
    only where the variance moves with f."""
    if s.method == "fo":
        return _variances(s, loc.f), loc.df
    vt0 = _variances(s, s.f0)
    if not np.any(vt0.R1):
        return vt0, np.zeros_like(loc.df)
    return vt0, Local(s, np.zeros_like(loc.eta), second=False).df


def subject_objective(subj, start):
    """``(contribution to the objective, eta_hat)`` of one subject (`likelihood.Subject`)
    from ``start`` (infinite where its solve fails)."""
    try:
        return subj.objective(*_eta0(start, subj))
    except SolveFailed:  # parameters where this subject cannot be solved
        return np.inf, _eta0(start, None)[0]


def subject_gradient(subj, start):
    """``(contribution, dOFV/dpsi, Gamma, EtaStart)`` of one subject (`gradient.gradient`);
    ``(inf, None, None, start)`` where it cannot be solved."""
    try:
        value, eta = subj.objective(*_eta0(start, subj))
        return (value,) + (gradient(subj, eta) if np.isfinite(value) else (None, None, eta))
    except SolveFailed:  # parameters where this subject cannot be solved
        return np.inf, None, None, start


def _eta0(start, subject):
    """``(first eta, curvature)`` of a subject's estimate (`likelihood.Subject.ebe`):
    ``start`` itself (an array), or an `EtaStart`'s prediction at the parameters of
    ``subject`` (its estimate where ``subject`` is None) and its curvature."""
    if isinstance(start, EtaStart):
        return (start.eta if subject is None else start.at(subject)), start.curvature
    return start, None
