"""Replicates of a study simulated from a population model at given parameters.

One replicate draws, for every subject, new random effects ``eta = L z`` (``L`` the
Cholesky factor of Omega) and new residuals ``y = f + sqrt(R(f)) eps`` at the
subject's observation records (its design: times and observables), ``z`` and
``eps`` standard normal. The normals come from one ``np.random.default_rng(seed)``
in a fixed order (per replicate, per subject: its ``n_eta`` then its ``m``), drawn
before any solve, so a seed gives the same study whatever the threads; an
observation below its limit of quantification (`SubjectFit.lloq`) is censored as
nlmixr2 marks it: ``CENS = 1`` and ``DV`` the limit.

`NLME.simulate` (a design and given parameters) and `NLMEFit.simulate` (the fit's
estimates, for VPCs and NPDE) both call `replicates`.
"""

import warnings
from collections import namedtuple

import numpy as np

from adjoints import SolveFailed

from .likelihood import variances

__all__ = ["Replicates", "replicates", "table"]

Replicates = namedtuple("Replicates", "eta ipred dv cens pred kappa", defaults=(None,))
Replicates.__doc__ = """Simulated studies: ``eta`` (n, n_subjects, n_eta), ``ipred``, ``dv``
(n, n_obs; the observations of every subject in order), ``cens`` (n, n_obs) bool (below
the limit: ``dv`` is the limit), ``pred`` (n_obs,) the predictions at eta = 0; with
occasions (`NLME(iov=)`) ``kappa`` (n, n_obs, n_iov), each observation's occasion
effects."""


def replicates(pop, fits, x, n, seed):
    """``n`` replicates of the subjects ``fits`` (`predict.SubjectFit`) at the population
    parameters ``x`` (`NLME.pack`'s vector) from ``seed`` (see the module docstring)."""
    theta, blocks, sigma = pop.unpack(x)
    omega, pi = pop._omega_matrix(blocks), pop._iov_matrix(blocks)
    sds = pop._sd_per_error(sigma)
    w = pop.weights(x)
    ne, ni = omega.shape[0], len(pop.iov_names)
    sizes = [sf.y.shape[0] for sf in fits]
    ks = [pop.n_random(sf) for sf in fits]  # each subject's random effects (its occasions')
    Z = np.random.default_rng(seed).standard_normal((n, sum(sizes) + sum(ks)))
    starts = np.cumsum([0] + [k + m for k, m in zip(ks, sizes)])

    def one(sf, o):
        k = pop.n_random(sf)
        L = np.linalg.cholesky(pop.subject_omega(omega, pi, sf.n_occ))
        eta = Z[:, o:o + k] @ L.T
        eps = Z[:, o + k:o + k + sf.y.shape[0]]
        phi = sf.ind.values_many(theta, eta)
        f = np.full((n, sf.y.shape[0]), np.nan)
        for r in range(n):
            try:
                f[r] = sf.predict(phi[r], False, w, pop.weight_index)[0]
            except SolveFailed:  # an extreme draw: its row stays NaN, counted below
                pass
        R = variances(pop.errors, sds, np.tile(sf.err_index, n),
                      np.nan_to_num(f).ravel())[0].reshape(f.shape)
        p0 = sf.ind.values(theta, np.zeros(k))
        pred = sf.predict(p0, False, w, pop.weight_index)[0]
        return eta, f, f + np.sqrt(R) * eps, pred

    out = pop._each(one, fits, starts[:-1])
    ipred = np.concatenate([f for _, f, _, _ in out], axis=1)
    dv = np.concatenate([y for _, _, y, _ in out], axis=1)
    failed = int(np.sum(np.isnan(ipred).any(axis=1)))
    if failed:
        warnings.warn(f"simulate: {failed} of {n} replicates have a subject whose solve "
                      "failed (extreme random effects); its values are NaN", UserWarning,
                      stacklevel=3)
    lloq = np.concatenate([sf.lloq for sf in fits])
    cens = dv < lloq
    dv = np.where(cens, lloq, dv)
    kappa = None
    if ni:  # each observation's occasion effects
        kappa = np.concatenate([
            e[:, ne:].reshape(n, sf.n_occ, ni)[:, sf.obs_occ] for (e, *_), sf in zip(out, fits)],
            axis=1)
    return Replicates(np.stack([e[:, :ne] for e, *_ in out], axis=1), ipred, dv, cens,
                      np.concatenate([p for *_, p in out]), kappa)


def table(pop, fits, sims):
    """The replicates in the event-table layout, one row per simulated observation:
    ``SIM`` (replicate, from 1), ``ID``, ``TIME``, ``OBS`` (the observable or state),
    ``DV``, ``CENS``, ``IPRED``, ``PRED`` and ``eta.<name>`` (the subject's random
    effects in that replicate; with occasions also ``OCC``, the subject's occasion
    numbered from 1, and ``iov.<name>``, that occasion's effects); a pandas DataFrame
    when pandas is installed, else a dict of arrays."""
    n, m = sims.dv.shape
    ids = [sf.id for sf in fits for _ in range(sf.y.shape[0])]
    owner = np.repeat(np.arange(len(fits)), [sf.y.shape[0] for sf in fits])
    cols = {"SIM": np.repeat(np.arange(1, n + 1), m), "ID": ids * n,
            "TIME": np.tile(np.concatenate([sf.t for sf in fits]), n),
            "OBS": np.tile(np.array([pop.error_names[e] for sf in fits
                                     for e in sf.err_index], dtype=object), n),
            "DV": sims.dv.ravel(), "CENS": sims.cens.ravel().astype(np.int64),
            "IPRED": sims.ipred.ravel(), "PRED": np.tile(sims.pred, n)}
    for a, name in enumerate(pop.eta_names):
        cols[f"eta.{name}"] = sims.eta[:, owner, a].ravel()
    if sims.kappa is not None:
        cols["OCC"] = np.tile(np.concatenate([sf.obs_occ + 1 for sf in fits]), n)
        for a, name in enumerate(pop.iov_names):
            cols[f"iov.{name}"] = sims.kappa[:, :, a].ravel()
    try:
        import pandas as pd
    except ImportError:
        return cols
    return pd.DataFrame(cols)
