"""The gradient of a subject's FOCE-I objective in the population parameters.

With the notation of `likelihood` (``l_j(f) = (y_j - f_j)**2 / R_j + log R_j``,
``O = sum_j l_j + eta^T Omega^-1 eta``, ``H = Omega^-1 + G^T diag(w) G`` with
``w = 1/R + R'**2 / (2 R**2)``), the objective is
``OFV(psi) = O(eta_hat, psi) + log|Omega| + log|H(eta_hat, psi)|`` where
``eta_hat(psi)`` minimises O. Its total derivative in a population parameter
``psi`` (a theta, an omega entry, a residual sd) is

    dOFV/dpsi = dO/dpsi + dlog|Omega|/dpsi + tr(H^-1 dH/dpsi)
                - u^T d(grad_eta O)/dpsi,      u = K^-1 (v + grad_eta O),

with ``v_c = tr(H^-1 dH/deta_c)`` and ``K`` the exact Hessian of O in eta:
the implicit-function derivative ``d eta_hat/dpsi = -K^-1 d(grad_eta O)/dpsi``
taken once, backwards, through ``u`` (``grad_eta O`` is zero at an exact
optimum; keeping it makes the result the derivative of what was computed).
It needs the predictions' second derivatives in eta and theta: the chain rule
through the individual function (exact, sympy) and the ODE's second-order
sensitivities ``d2f/dphi2``, here central differences of the first-order
ones (`_second_order`), 2 k extra sensitivity solves for k individual
parameters.
"""

import numpy as np

_FD_PHI = 1e-5  # relative step of the central differences of the sensitivities


def _second_order(s, phi):
    """``d2f/dphi dp`` (m, k, n_params): central differences over the k individual
    parameters of the sensitivities to every model parameter."""
    k = phi.shape[0]
    out = []
    for ell in range(k):
        h = _FD_PHI * max(abs(phi[ell]), 1e-3)
        d = np.zeros(k)
        d[ell] = h
        hi = s.sf.predict(phi + d, True, s.weights, s.weight_index, full=True)[1]
        lo = s.sf.predict(phi - d, True, s.weights, s.weight_index, full=True)[1]
        out.append((hi - lo) / (2 * h))
    return np.stack(out, axis=1)


def focei_gradient(s, eta):
    """``(dOFV/dtheta (n_theta,), Gamma (n_eta, n_eta), dOFV/dsd per error model,
    dOFV/dweights)`` of the subject ``s`` (`likelihood.Subject`, method "focei") at its
    estimate ``eta``; ``dOFV = tr(Gamma dOmega)`` for symmetric changes of Omega; the
    last is empty unless network weights are estimated (``s.weight_index``)."""
    ind, sf = s.sf.individual, s.sf
    phi, pe, pt = ind.derivatives(s.theta, eta, sf.cov)
    pee, pet = ind.second_derivatives(s.theta, eta, sf.cov)
    f, Ffull = sf.predict(phi, True, s.weights, s.weight_index, full=True)
    idx = ind.index
    F = Ffull[:, idx]
    F2full = _second_order(s, phi)
    F2 = F2full[:, :, idx]
    F2 = 0.5 * (F2 + F2.transpose(0, 2, 1))
    G = F @ pe                      # (m, n_eta)
    Ft = F @ pt                     # df/dtheta at fixed eta, (m, n_theta)
    Gee = np.einsum("jkl,ka,lc->jac", F2, pe, pe) + np.einsum("jk,kac->jac", F, pee)
    Get = np.einsum("jkl,ka,lb->jab", F2, pe, pt) + np.einsum("jk,kab->jab", F, pet)

    y = sf.y
    e = y - f
    m, ne, nt = y.shape[0], eta.shape[0], s.theta.shape[0]
    R, R1, R2 = np.empty(m), np.empty(m), np.empty(m)
    sd_parts = []  # (error index, selection, dR/dsd, dR'/dsd)
    for q, (model, sd) in enumerate(zip(s.errors, s.sd)):
        sel = sf.err_index == q
        r, r1, r2, rs, r1s = model.terms(f[sel], sd)
        R[sel], R1[sel], R2[sel] = r, r1, r2
        sd_parts.append((sel, rs, r1s))
    inv = 1.0 / R
    c0 = inv - e * e * inv * inv             # dl/dR
    lf = -2.0 * e * inv + R1 * c0
    lff = (2.0 * inv + 4.0 * e * R1 * inv * inv + R2 * c0
           + R1 * R1 * (2.0 * e * e * inv ** 3 - inv * inv))
    w = inv + 0.5 * R1 * R1 * inv * inv
    wf = -R1 * inv * inv + R1 * R2 * inv * inv - R1 ** 3 * inv ** 3

    Oi = s.omega_inv
    H = Oi + G.T @ (w[:, None] * G)
    Hi = np.linalg.inv(H)
    K = G.T @ (lff[:, None] * G) + np.einsum("j,jac->ac", lf, Gee) + 2.0 * Oi
    g_eta = G.T @ lf + 2.0 * Oi @ eta
    WG = w[:, None] * G

    def dH(dG, df):
        """dH for a change dG (m, n_eta) of G and df (m,) of f."""
        A = dG.T @ WG
        return A + A.T + G.T @ ((wf * df)[:, None] * G)

    v = np.array([np.sum(Hi * dH(Gee[:, :, c], G[:, c])) for c in range(ne)])
    u = np.linalg.solve(K, v + g_eta)

    d_theta = np.empty(nt)
    for a in range(nt):
        dGa = Get[:, :, a]
        d_grad = dGa.T @ lf + G.T @ (lff * Ft[:, a])
        d_theta[a] = lf @ Ft[:, a] + np.sum(Hi * dH(dGa, Ft[:, a])) - u @ d_grad

    Oe = Oi @ eta
    OHO = Oi @ Hi @ Oi
    Ou = Oi @ u
    gamma = Oi - np.outer(Oe, Oe) - OHO + (np.outer(Oe, Ou) + np.outer(Ou, Oe))

    d_sd = []
    for (sel, rs, r1s), sd in zip(sd_parts, s.sd):
        out = np.empty(len(sd))
        Gs, es, R1s_, inv_s = G[sel], e[sel], R1[sel], inv[sel]
        for b in range(len(sd)):
            dR, dR1 = rs[b], r1s[b]
            dl = dR * c0[sel]
            dlf = (2.0 * es * dR * inv_s ** 2 + dR1 * c0[sel]
                   + R1s_ * (-dR * inv_s ** 2 + 2.0 * es * es * dR * inv_s ** 3))
            dw = -dR * inv_s ** 2 + R1s_ * dR1 * inv_s ** 2 - R1s_ ** 2 * dR * inv_s ** 3
            dHs = Gs.T @ (dw[:, None] * Gs)
            out[b] = np.sum(dl) + np.sum(Hi * dHs) - u @ (Gs.T @ dlf)
        d_sd.append(out)

    # network weights: like a theta, with dphi/dw = 0 (the weights act on f directly)
    wi = s.weight_index if s.weights is not None else np.zeros(0, dtype=np.int64)
    d_w = np.empty(wi.shape[0])
    Fw = Ffull[:, wi]                                   # df/dw, (m, n_w)
    Gw = np.einsum("jkw,ka->jaw", F2full[:, :, wi], pe)  # dG/dw, (m, n_eta, n_w)
    for a in range(wi.shape[0]):
        dGa = Gw[:, :, a]
        d_grad = dGa.T @ lf + G.T @ (lff * Fw[:, a])
        d_w[a] = lf @ Fw[:, a] + np.sum(Hi * dH(dGa, Fw[:, a])) - u @ d_grad
    return d_theta, gamma, d_sd, d_w
