"""Compiled inner loops of a subject's gradient: the linear algebra that `gradient` spells
with numpy, in one call per subject (a subject's arrays are small: numpy's cost there is
its calls, about 200 of them per subject and evaluation, not its arithmetic), without the
GIL (subjects on threads then overlap these parts too).

Each kernel computes what its numpy twin does, term for term (`gradient`'s module
docstring has the notation); sums run in another order, so results agree to rounding
(about 1e-15 relative), not bit for bit. Outputs first (``_into``).
"""

import numpy as np

from sciml._jit import jit

__all__ = ["focei_gradient_into", "objective_into", "second_order_into"]


@jit
def focei_gradient_into(d_pop, gamma, K, dg, H, y, f, R, R1, R2, Rs, R1s, sig0, G, Gee,
                        df, dG, Oi, eta):
    """FOCE-I's ``dOFV/dpsi`` and ``Gamma`` of one subject without censored observations
    (`gradient._laplace_type` with ``d = w``, ``e = None``), and what `gradient.EtaStart`
    needs.

    Writes ``d_pop`` (n_pop,), ``gamma`` (n_eta, n_eta), ``K`` (the exact Hessian of O in
    eta), ``dg`` (n_eta, n_pop: ``dg/dpsi`` at fixed eta) and ``H`` (scoring's
    ``Omega^-1 + G^T diag(w) G``). Inputs: observations ``y``, predictions ``f``,
    variances ``R``, ``R'``, ``R''`` (m,), the variances' derivatives in the residual sds
    ``Rs``, ``R1s`` (m, n_sigma; `derivatives.variance_terms`), which sit in the
    population directions from column ``sig0``; ``G`` (m, n_eta), ``Gee`` (m, n_eta,
    n_eta), ``df`` (m, n_pop), ``dG`` (m, n_eta, n_pop) (`derivatives.Local`); ``Oi`` the
    inverse of the subject's prior covariance and ``eta`` its estimate.
    """
    m, ne = G.shape
    npop = df.shape[1]
    nsig = Rs.shape[1]
    # per observation: l' (L1), l'' (L2), their partials in R, R' (l = (y - f)^2 / R + log R,
    # R = R(f)) and FOCE-I's weight w with its total f-derivative and R, R' partials
    L1 = np.empty(m)
    L2 = np.empty(m)
    L1R = np.empty(m)
    lR = np.empty(m)
    w = np.empty(m)
    wf = np.empty(m)
    wR = np.empty(m)
    wR1 = np.empty(m)
    for j in range(m):
        e = y[j] - f[j]
        inv = 1.0 / R[j]
        r1 = R1[j]
        lf = -2.0 * e * inv
        lR_ = inv - e * e * inv * inv
        lfR = 2.0 * e * inv * inv
        lRR = -inv * inv + 2.0 * e * e * inv * inv * inv
        L1[j] = lf + lR_ * r1
        L2[j] = 2.0 * inv + 2.0 * lfR * r1 + lRR * r1 * r1 + lR_ * R2[j]
        L1R[j] = lfR + lRR * r1
        lR[j] = lR_
        w[j] = inv + 0.5 * r1 * r1 * inv * inv
        wR[j] = -inv * inv - r1 * r1 * inv * inv * inv
        wR1[j] = r1 * inv * inv
        wf[j] = wR[j] * r1 + wR1[j] * R2[j]
    for a in range(ne):
        for c in range(ne):
            k = 2.0 * Oi[a, c]
            h = Oi[a, c]
            for j in range(m):
                k += G[j, a] * L2[j] * G[j, c] + L1[j] * Gee[j, a, c]
                h += G[j, a] * w[j] * G[j, c]
            K[a, c] = k
            H[a, c] = h
    Hi = np.linalg.inv(H)
    B = G @ Hi
    q = np.zeros(m)
    for j in range(m):
        for a in range(ne):
            q[j] += B[j, a] * G[j, a]
    # tr(H^-1 dH) in the population directions and in eta, g, u = K^-1 (v + g)
    Oe = Oi @ eta
    rhs = np.zeros(ne)
    for c in range(ne):
        s = 0.0
        for j in range(m):
            for a in range(ne):
                s += 2.0 * w[j] * B[j, a] * Gee[j, a, c]
            s += q[j] * wf[j] * G[j, c] + G[j, c] * L1[j]
        rhs[c] = s + 2.0 * Oe[c]
    u = np.linalg.solve(K, rhs)
    for n in range(npop):
        sg = n - sig0
        tr = 0.0
        lin = 0.0
        for j in range(m):
            dfn = df[j, n]
            dR = Rs[j, sg] if 0 <= sg < nsig else 0.0
            dR1 = R1s[j, sg] if 0 <= sg < nsig else 0.0
            for a in range(ne):
                tr += 2.0 * w[j] * B[j, a] * dG[j, a, n]
            tr += q[j] * (wf[j] * dfn + wR[j] * dR + wR1[j] * dR1)
            lin += L1[j] * dfn + lR[j] * dR
            ch = L2[j] * dfn + L1R[j] * dR + lR[j] * dR1
            for a in range(ne):
                dg[a, n] = (dg[a, n] if j else 0.0) + dG[j, a, n] * L1[j] + G[j, a] * ch
        s = 0.0
        for a in range(ne):
            s += u[a] * dg[a, n]
        d_pop[n] = lin + tr - s
    Ou = Oi @ u
    OHO = Oi @ Hi @ Oi
    for a in range(ne):
        for c in range(ne):
            gamma[a, c] = (Oi[a, c] - Oe[a] * Oe[c] - OHO[a, c] + Oe[a] * Ou[c]
                           + Ou[a] * Oe[c])


@jit
def second_order_into(Gee, Get, DF, F, pe, pee, pt, pet):
    """``Gee = d2f/deta2`` (m, n_eta, n_eta, symmetrised) and ``Get = d2f/deta dtheta``
    (m, n_eta, n_theta) from ``DF`` (m, n_eta, n_phi: the sensitivities' derivatives along
    pe's columns, their individual-parameter columns), ``F = df/dphi`` and the individual
    function's ``pe``, ``pee``, ``pt``, ``pet`` (`derivatives.Local`)."""
    m, ne, nk = DF.shape
    nt = pt.shape[1]
    for j in range(m):
        for a in range(ne):
            for c in range(ne):
                s = 0.0
                for k in range(nk):
                    s += DF[j, a, k] * pe[k, c] + F[j, k] * pee[k, a, c]
                Gee[j, a, c] = s
            for b in range(nt):
                s = 0.0
                for k in range(nk):
                    s += DF[j, a, k] * pt[k, b] + F[j, k] * pet[k, a, b]
                Get[j, a, b] = s
        for a in range(ne):
            for c in range(a + 1, ne):
                v = 0.5 * (Gee[j, a, c] + Gee[j, c, a])
                Gee[j, a, c] = v
                Gee[j, c, a] = v


@jit
def objective_into(grad, H, y, f, G, R, dR, Oi, eta):
    """``O(eta) = sum_j (y_j - f_j)**2 / R_j + log R_j + eta^T Omega^-1 eta`` (returned),
    its gradient in eta into ``grad`` (n_eta,) and scoring's ``H = Omega^-1 + G^T diag(w)
    G`` into ``H`` (`likelihood.Subject.evaluate` without censored observations; ``dR``
    = dR/df, zero where R is held fixed)."""
    m, ne = G.shape
    value = 0.0
    for a in range(ne):
        grad[a] = 0.0
        for c in range(ne):
            H[a, c] = Oi[a, c]
            value += eta[a] * Oi[a, c] * eta[c]
            grad[a] += 2.0 * Oi[a, c] * eta[c]
    for j in range(m):
        e = y[j] - f[j]
        inv = 1.0 / R[j]
        value += e * e * inv + np.log(R[j])
        coef = -2.0 * e * inv + (inv - e * e * inv * inv) * dR[j]
        w = inv + 0.5 * dR[j] * dR[j] * inv * inv
        for a in range(ne):
            grad[a] += G[j, a] * coef
            for c in range(ne):
                H[a, c] += G[j, a] * w * G[j, c]
    return value
