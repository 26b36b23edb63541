"""The pieces a subject's objective and its exact gradients are built from.

- `Local`: the predictions ``f`` at one eta and their derivatives, to first
  order (``G = df/deta`` and ``df/dpsi`` for the population directions
  ``psi = (theta, sigma, network weights)``, from the ODE's forward
  sensitivities) and to second order (``d2f/deta2``, ``d2f/deta dpsi``): the
  chain rule through the individual function (exact, sympy) and the ODE's
  second-order sensitivities along the directions ``dphi/deta_a`` (`directional`:
  central differences of the first-order ones, 2 n_eta extra solves, whatever the
  number of individual parameters or of pieces of the record).
- `curvatures`: third-order terms, second differences of the sensitivities
  along given directions of phi.
- `variance_terms`: the residual variances ``R(f)``, ``R'``, ``R''`` and their
  derivatives in the residual sds.
- `residual_jets`: ``l = (y - f)**2 / R + log R`` per observation and its
  total f-derivatives to third order, each with its partials in ``(R, R', R'')``
  (for changes of the sds at fixed f).
- `hessian`: the exact Hessian in eta of a subject's objective.
- `individual_third`: the individual function's third derivatives as the
  third-order term needs them, central differences of its exact second ones.

The step of the second-order sensitivities, 3e-4 of phi, keeps their truncation
near 1e-8 while not amplifying the solver's rounding much: Laplace's objective
holds the Hessian made of them (at 1e-5 its rounding reached 1e-8 of the
objective, at 3e-4 it is 3e-10).
"""

from collections import namedtuple

import numpy as np
from scipy.special import log_ndtr

from .kernels import second_order_into

_FD_PHI = 3e-4   # relative step of the central differences of the sensitivities
_FD_CURV = 1e-3  # largest relative change of phi in the second differences (`curvatures`)
_FD_IND = 1e-5   # step of the central differences of the individual function's 2nd derivatives

VarianceTerms = namedtuple("VarianceTerms", "R R1 R2 Rs R1s R2s")
VarianceTerms.__doc__ = """``R, R', R''`` (m,) at f and their derivatives in the residual
sds, ``(m, n_sigma)`` (zero for the sds of other error models)."""

Change = namedtuple("Change", "R R1 R2")
Change.__doc__ = """Changes of ``R, R', R''`` (each (m, n) over n directions) at fixed f;
None entries are no change."""


class Jet(namedtuple("Jet", "v f R R1 R2")):
    """A residual quantity per observation: its value ``v``, its total derivative ``f`` in
    the prediction, and its partials in ``R``, ``R'``, ``R''`` (all (m,))."""

    def change(self, df, dr=None):
        """Its change (m, n) for changes ``df`` (m, n; None: none) of f and ``dr`` (a
        `Change`)."""
        out = 0.0 if df is None else self.f[:, None] * df
        if dr is not None:
            for part, d in zip((self.R, self.R1, self.R2), dr):
                if d is not None:
                    out = out + part[:, None] * d
        return out

    def scaled(self, c):
        return Jet(*(c * a for a in self))


def residual_jets(y, f, R, R1, R2, cens=None):
    """``(L0, L1, L2, w)``: `Jet` s of the per-observation ``l(f, R)`` with ``R = R(f)``
    (``L1``, ``L2`` its f-derivatives; pass ``R1 = R2 = 0`` for R held fixed) and of
    FOCE-I's weight ``w``. An observed value has ``l = (y - f)**2 / R + log R`` and
    ``w = 1/R + R'**2 / (2 R**2)`` (the Gaussian's expected information); a censored
    one (``cens``, M3: ``y`` is the limit, the value is below it) has
    ``l = -2 log Phi((y - f) / sqrt(R))`` and ``w = L2 / 2`` (its exact curvature: no
    expectation over a value that was not seen). With the partials of ``l`` in (f, R)
    (`_gaussian_partials`, `_censored_partials`): ``L1 = l_f + l_R R'``,
    ``L2 = l_ff + 2 l_fR R' + l_RR R'**2 + l_R R''`` and ``L3 = dL2/df`` (R's third
    derivative is zero in every error model here)."""
    P = _gaussian_partials(y, f, R)
    if cens is not None and np.any(cens):
        C = _censored_partials(y[cens], f[cens], R[cens])
        for key, v in C.items():
            P[key] = P[key].copy()
            P[key][cens] = v
    lf, lR, lff, lfR, lRR = P["f"], P["R"], P["ff"], P["fR"], P["RR"]
    lfff, lffR, lfRR, lRRR = P["fff"], P["ffR"], P["fRR"], P["RRR"]
    L1 = lf + lR * R1
    L2 = lff + 2.0 * lfR * R1 + lRR * R1 * R1 + lR * R2
    L3 = (lfff + 3.0 * lffR * R1 + 3.0 * lfRR * R1 * R1 + lRRR * R1 ** 3 + 3.0 * lfR * R2
          + 3.0 * lRR * R1 * R2)
    z = np.zeros_like(f)
    J1 = Jet(L1, L2, lfR + lRR * R1, lR, z)
    J2 = Jet(L2, L3, lffR + 2.0 * lfRR * R1 + lRRR * R1 * R1 + lRR * R2,
             2.0 * lfR + 2.0 * lRR * R1, lR)
    inv = 1.0 / R
    wR, wR1 = -inv ** 2 - R1 * R1 * inv ** 3, R1 * inv ** 2
    w = Jet(inv + 0.5 * R1 * R1 * inv ** 2, wR * R1 + wR1 * R2, wR, wR1, z)
    if cens is not None and np.any(cens):
        w = Jet(*(np.where(cens, 0.5 * b, a) for a, b in zip(w, J2)))
    return Jet(P["l"], L1, lR, z, z), J1, J2, w


def _gaussian_partials(y, f, R):
    """The partials of ``l = (y - f)**2 / R + log R`` in (f, R), to third order."""
    e, inv = y - f, 1.0 / R
    ee = e * e
    z = np.zeros_like(f)
    return {"l": ee * inv + np.log(R), "f": -2.0 * e * inv, "R": inv - ee * inv ** 2,
            "ff": 2.0 * inv, "fR": 2.0 * e * inv ** 2, "RR": -inv ** 2 + 2.0 * ee * inv ** 3,
            "fff": z, "ffR": -2.0 * inv ** 2, "fRR": -4.0 * e * inv ** 3,
            "RRR": 2.0 * inv ** 3 - 6.0 * ee * inv ** 4}


def _censored_partials(c, f, R):
    """The partials of ``l = -2 log Phi(z)``, ``z = (c - f) / sqrt(R)``, in (f, R) to third
    order: ``log Phi`` by `scipy.special.log_ndtr` (exact far in the tail, where
    ``Phi`` itself would underflow), its derivative the inverse Mills ratio
    ``m = phi / Phi = exp(log phi - log Phi)``; then the chain rule through z."""
    s = np.sqrt(R)
    zz = (c - f) / s
    log_phi = log_ndtr(zz)
    g1 = np.exp(-0.5 * zz * zz - 0.5 * np.log(2.0 * np.pi) - log_phi)
    g2 = -g1 * (zz + g1)
    g3 = -g2 * (zz + g1) - g1 * (1.0 + g2)
    zero = np.zeros_like(f)
    # z's partials; those with two or more f's vanish (z is linear in f)
    d = {"f": -1.0 / s, "R": -zz / (2.0 * R), "ff": zero, "fR": 0.5 / (s * R),
         "RR": 0.75 * zz / R ** 2, "fff": zero, "ffR": zero, "fRR": -0.75 / (s * R * R),
         "RRR": -1.875 * zz / R ** 3}

    def z_(*ab):
        return d["".join(sorted(ab, key="fR".index))]

    out = {"l": -2.0 * log_phi}
    for a in ("f", "R"):
        out[a] = -2.0 * g1 * z_(a)
    for a, b in (("f", "f"), ("f", "R"), ("R", "R")):
        out[a + b] = -2.0 * (g2 * z_(a) * z_(b) + g1 * z_(a, b))
    for a, b, c3 in (("f", "f", "f"), ("f", "f", "R"), ("f", "R", "R"), ("R", "R", "R")):
        out[a + b + c3] = -2.0 * (g3 * z_(a) * z_(b) * z_(c3)
                                  + g2 * (z_(a, b) * z_(c3) + z_(a, c3) * z_(b)
                                          + z_(b, c3) * z_(a))
                                  + g1 * z_(a, b, c3))
    return out


def variance_terms(errors, sds, err_index, f):
    """`VarianceTerms` of predictions ``f``, observation ``j`` following error model
    ``errors[err_index[j]]`` with standard deviations ``sds[err_index[j]]``."""
    m, n_sigma = f.shape[0], sum(len(sd) for sd in sds)
    if m and (len(errors) == 1 or not np.any(err_index != err_index[0])):
        # one error model for every observation (the usual case): its terms as they are,
        # the sd derivatives in its columns
        q = int(err_index[0])
        parts = errors[q].terms(f, sds[q])
        o = sum(len(sd) for sd in sds[:q])
        sig = []
        for src in parts[3:]:
            d = np.zeros((m, n_sigma))
            d[:, o:o + len(sds[q])] = src.T
            sig.append(d)
        return VarianceTerms(*(np.array(a, dtype=float) for a in parts[:3]), *sig)
    out = VarianceTerms(*[np.empty(m) for _ in range(3)],
                        *[np.zeros((m, n_sigma)) for _ in range(3)])
    o = 0
    for q, (model, sd) in enumerate(zip(errors, sds)):
        sel = err_index == q
        if sel.any():
            parts = model.terms(f[sel], sd)
            for dst, src in zip(out[:3], parts[:3]):
                dst[sel] = src
            for dst, src in zip(out[3:], parts[3:]):
                dst[sel, o:o + len(sd)] = src.T
        o += len(sd)
    return out


def _sensitivities(s, phi):
    """``df/dQ`` (m, n_q) in the subject's columns (`predict`: the stacked individual
    parameters, then the estimated weights) at individual parameters ``phi``."""
    return s.sf.sensitivities(phi, s.weights, s.weight_index)


def directional(s, phi, V):
    """``sum_k V_kc d2f/dphi_k dQ`` (m, n_dir, n_q), the derivatives of the sensitivities
    in the subject's columns along the columns ``V_c`` (n_phi, n_dir) of individual
    parameter space: central differences, the step such that phi's largest relative
    change is `_FD_PHI` (zero, without a solve, along a zero column)."""
    scale = np.maximum(np.abs(phi), 1e-3)
    out = []
    for v in V.T:
        big = np.max(np.abs(v) / scale)
        if big == 0.0:
            out.append(None)
            continue
        h = _FD_PHI / big
        out.append((_sensitivities(s, phi + h * v) - _sensitivities(s, phi - h * v)) / (2 * h))
    shape = next((o.shape for o in out if o is not None), None)
    if shape is None:
        shape = _sensitivities(s, phi).shape
    return np.stack([np.zeros(shape) if o is None else o for o in out], axis=1)


class Local:
    """A subject's predictions at one ``eta`` and their derivatives.

    The individual parameters are the subject's stacked ``Phi`` (`predict`: k per piece
    of its record, n_phi in all); the derivatives are in the subject's columns
    ``Q = (Phi, w)`` (the estimated network weights w last), ``phi_cols`` and
    ``w_cols`` the two slices.

    First order: ``f`` (m,), ``Fp = df/dQ`` (m, n_q), ``F = df/dPhi`` (m, n_phi),
    ``G = df/deta`` (m, n_eta), ``df`` (m, n_pop): ``df/dpsi`` in the population
    directions (thetas, residual sds, estimated weights; zero for the sds); the
    individual function's ``phi``, ``pe = dPhi/deta``, ``pt = dPhi/dtheta``. With
    ``second``: ``DF = d/deta_a df/dQ`` along the individual parameters' own change
    (m, n_eta, n_q; `directional` along the columns of pe), ``pee``, ``pet``
    (``d2Phi/deta2``, ``d2Phi/deta dtheta``), ``Gee = d2f/deta2`` (m, n_eta, n_eta)
    and ``dG = dG/dpsi`` (m, n_eta, n_pop). With ``F2 = d2f/dPhi2``:
    ``Gee_j = pe^T F2_j pe + F_j pee`` (symmetrised), ``dG/dtheta_j = pe^T F2_j pt +
    F_j pet`` and ``dG/dw_j = pe^T d2f_j/dPhi dw``, each a contraction of DF.
    """

    def __init__(self, s, eta, second=True):
        sf = s.sf
        ind = sf.ind
        self.eta = eta
        self.phi, self.pe, self.pt = ind.derivatives(s.theta, eta)
        self.f, self.Fp = sf.predict(self.phi, True, s.weights, s.weight_index, full=True)
        n_phi = self.phi.shape[0]
        self.phi_cols = slice(0, n_phi)
        self.w_cols = slice(n_phi, self.Fp.shape[1])
        self.n_sigma = sum(len(sd) for sd in s.sd)
        self.F = self.Fp[:, self.phi_cols]
        self.G = self.F @ self.pe
        self.df = self.population(self.F @ self.pt, self.Fp[:, self.w_cols])
        if not second:
            return
        self.pee, self.pet = ind.second_derivatives(s.theta, eta)
        self.DF = directional(s, self.phi, self.pe)
        m, ne = self.G.shape
        self.Gee = np.empty((m, ne, ne))
        Get = np.empty((m, ne, self.pt.shape[1]))
        second_order_into(self.Gee, Get, np.ascontiguousarray(self.DF[:, :, self.phi_cols]),
                          self.F, self.pe, self.pee, self.pt, self.pet)
        self.dG = self.population(Get, self.DF[:, :, self.w_cols])

    def population(self, theta_part, weight_part, sigma_part=None):
        """An array over the population directions (last axis) from its theta, weight and
        residual sd parts (the last zero unless given)."""
        if sigma_part is None:
            sigma_part = np.zeros(theta_part.shape[:-1] + (self.n_sigma,))
        return np.concatenate([theta_part, sigma_part, weight_part], axis=-1)


def hessian(loc, L1, L2, omega_inv):
    """The exact Hessian in eta of ``O = sum_j l_j + eta^T Omega^-1 eta``:
    ``G^T diag(l'') G + sum_j l'_j d2f_j/deta2 + 2 Omega^-1`` (``L1``, ``L2``: l', l'')."""
    G = loc.G
    return (G.T @ (L2[:, None] * G) + np.einsum("j,jac->ac", L1, loc.Gee) + 2.0 * omega_inv)


def curvatures(s, loc, V):
    """``d2/dh2 df/dQ (phi + h V_c)`` (m, n_dirs, n_q) for the columns ``V_c`` of V:
    central second differences, the largest relative change of phi `_FD_CURV`."""
    scale = np.maximum(np.abs(loc.phi), 1e-3)
    out = []
    for v in V.T:
        h = _FD_CURV / max(np.max(np.abs(v) / scale), 1e-300)
        out.append((_sensitivities(s, loc.phi + h * v) - 2.0 * loc.Fp
                    + _sensitivities(s, loc.phi - h * v)) / (h * h))
    return np.stack(out, axis=1)


def individual_third(s, loc, A):
    """``(dN/dtheta (n_phi, n_theta), dN/deta (n_phi, n_eta))`` of ``N_k = sum_ac A_ac
    d2phi_k/deta_a deta_c`` at fixed A: central differences of the individual function's
    exact second derivatives (smooth closed forms: accurate to about 1e-10)."""
    ind = s.sf.ind

    def N(theta, eta):
        return np.einsum("kac,ac->k", ind.second_derivatives(theta, eta)[0], A)

    def columns(x, point):
        out = np.zeros((loc.phi.shape[0], x.shape[0]))
        for i in range(x.shape[0]):
            d = np.zeros_like(x)
            d[i] = _FD_IND * max(abs(x[i]), 1.0)
            out[:, i] = (N(*point(x + d)) - N(*point(x - d))) / (2 * d[i])
        return out

    return (columns(s.theta, lambda th: (th, loc.eta)),
            columns(loc.eta, lambda eta: (s.theta, eta)))
