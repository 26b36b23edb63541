"""`NLMEFit`: estimates, standard errors, the diagnostics table and the plots of a fit."""

import numpy as np

from .likelihood import Subject

__all__ = ["NLMEFit"]


class NLMEFit:
    """The result of `NLME.fit`.

    Attributes
    ----------
    objective : float
        -2 log-likelihood of ``objective_method`` at the estimates (no ``n log 2 pi``, as
        NONMEM and nlmixr2 report it): the method's own, FOCE-I's for SAEM.
    method, objective_method : str
        The estimation method, and the approximation of the objective (and of the
        covariance step): the same but for SAEM (``"focei"``).
    saem : SAEMTrace or None
        SAEM's iterations (estimates, acceptance rates) and time split; None otherwise.
    theta, sigma : dict
        Estimates by name (sigma: residual standard deviations, ``"cp.sd"``).
    nets : dict
        Estimated network weights by network name (empty when none is estimated).
    omega : ndarray (n_eta, n_eta)
        Between-subject covariance (variances on the diagonal), order ``eta_names``.
    eta : ndarray (n_subjects, n_eta)
        Empirical Bayes estimates, in the order of the subjects.
    iov : ndarray (n_iov, n_iov) or None
        Between-occasion covariance (`NLME(iov=)`), order ``iov_names``; None without
        occasions.
    eta_occasion : list of ndarray or None
        With occasions, per subject its occasions' estimates (n_occ, n_iov).
    se : dict
        Standard errors by name (thetas, ``"omega.<eta>"`` variances,
        ``"omega.<eta1>,<eta2>"`` covariances, ``"iov.<eta>"`` between-occasion
        variances, sigmas), from the inverse of half the
        objective's Hessian in these parameters (forward differences of its exact
        gradient); empty without the covariance step, NaN where the Hessian is not
        positive definite.
    aic, bic : float
    n_obs, n_estimated : int
        Observations, and parameters estimated (thetas, omega entries, sigmas, weights).
    success : bool, message : str
        The outer optimiser's report.
    """

    def __init__(self, pop, fits, method, x, value, etas, res, free, covariance,
                 objective_method=None, at_estimates=None):
        self.pop, self._fits, self.method = pop, fits, method
        # (EtaStarts, gradient parts) of `NLME._objective_and_gradient` at x, when the fit
        # has them: the covariance step's first gradient
        self._at_estimates = at_estimates
        # the approximation the objective, its gradient and the covariance step use:
        # the method's own, FOCE-I for SAEM (which has no objective of its own)
        self.objective_method = objective_method or method
        self.saem = None
        self._x, self._free = x, free
        theta, blocks, sigma = pop.unpack(x)
        self.theta = dict(zip(pop.theta_names, theta.tolist()))
        self.omega = pop._omega_matrix(blocks)
        self.iov = pop._iov_matrix(blocks)
        self.eta_names, self.iov_names = pop.eta_names, pop.iov_names
        self.sigma = dict(zip(pop.sigma_names, sigma.tolist()))
        w = pop.weights(x)
        self.nets = {**{name: theta[sl].copy() for name, sl in pop.own_nets.items()},
                     **{name: w[sl].copy() for name, sl in pop.net_slices.items()}}
        self.objective = float(value)
        ne, ni = len(pop.eta_names), len(pop.iov_names)
        self._etas = [np.array(e, dtype=float) for e in etas]  # each subject's whole vector
        self.eta = np.array([e[:ne] for e in self._etas]).reshape(len(fits), ne)
        self.eta_occasion = [e[ne:].reshape(-1, ni) for e in self._etas] if ni else None
        self.ids = [sf.id for sf in fits]
        self.n_obs = int(sum(sf.y.shape[0] for sf in fits))
        k = self.n_estimated = len(free)
        self.aic = self.objective + 2 * k
        self.bic = self.objective + k * np.log(self.n_obs)
        self.success, self.message = bool(res.success), str(res.message)
        self.n_iter = int(getattr(res, "nit", 0))
        self.se = self._standard_errors() if covariance else {}
        self._table = None

    def __repr__(self):
        th = ", ".join(f"{k}={v:.4g}" for k, v in self.theta.items())
        return (f"NLMEFit({self.method}, objective={self.objective:.3f}, {th}, "
                f"omega diag={np.round(np.diag(self.omega), 4).tolist()}, "
                f"sigma={ {k: round(v, 4) for k, v in self.sigma.items()} })")

    def objective_on(self, subjects, **solve):
        """The objective of other subjects (held out of the fit) at this fit's estimates:
        -2 log of their marginal likelihood under the fitted population model."""
        return self.pop.objective(subjects, theta=self.theta, omega=self.omega,
                                  sigma=self.sigma, method=self.objective_method,
                                  nets=self.nets, iov=self.iov, **solve)

    # ---------------------------------------------------------------- covariance step

    def _natural(self):
        """``(names, values, to_x)``: the free parameters on their own scales and the map
        back to the optimiser's vector."""
        pop = self.pop
        theta, blocks, sigma = pop.unpack(self._x)
        names, vals = list(pop.theta_labels), list(theta)
        nb = len(pop.blocks)
        for b, ((enames, _), m) in enumerate(zip(pop.packed_blocks, blocks)):
            kind = "omega" if b < nb else "iov"
            for i in range(len(enames)):
                for j in range(i + 1):
                    names.append(f"{kind}.{enames[i]}" if i == j else
                                 f"{kind}.{enames[i]},{enames[j]}")
                    vals.append(m[i, j])
        names += list(pop.sigma_names)
        vals += list(sigma)
        for name in pop.net_names:
            names += [f"{name}[{i}]" for i in range(pop.model.nets[name].n_params)]
        nw = pop.w0.shape[0]
        if nw:
            vals += list(pop.weights(self._x))
        vals = np.array(vals)
        ns = len(pop.sigma_names)
        nt = len(pop.theta_labels)

        def to_x(v):
            th, o, bl = v[:nt], nt, []
            for enames, _ in pop.packed_blocks:
                b = len(enames)
                m = np.zeros((b, b))
                for i in range(b):
                    for j in range(i + 1):
                        m[i, j] = m[j, i] = v[o]
                        o += 1
                bl.append(m)
            return pop.pack(th, bl, v[o:o + ns], v[o + ns:] if nw else None)

        return names, vals, to_x

    def _natural_gradient(self, parts):
        """The gradient in `_natural`'s parameters (an omega covariance moves two symmetric
        entries)."""
        d_pop, gamma, gamma_iov = parts
        nt = len(self.pop.theta_labels)
        out, o = [d_pop[:nt]], 0
        nb = len(self.pop.blocks)
        for b, (enames, _) in enumerate(self.pop.packed_blocks):
            if b == nb:
                o = 0
            g = gamma if b < nb else gamma_iov
            for i in range(len(enames)):
                for j in range(i + 1):
                    out.append([g[o + i, o + j] * (1.0 if i == j else 2.0)])
            o += len(enames)
        out.append(d_pop[nt:])
        return np.concatenate([np.atleast_1d(np.asarray(v, dtype=float)) for v in out])

    def _standard_errors(self):
        """The covariance step: ``2 Hess^-1`` of the objective in `_natural`'s parameters,
        the Hessian by forward differences of the method's exact gradient (n + 1
        gradients for n parameters, n when the fit handed over the one at its estimates,
        `at_estimates`; relative step 1e-4: truncation and the gradient's
        rounding both near 1e-4 of the Hessian, far below what a standard error needs)."""
        pop, fits = self.pop, self._fits
        names, v0, to_x = self._natural()
        free = self._free
        etas = [e.copy() for e in self._etas]
        n = len(free)
        h = 1e-4 * np.maximum(np.abs(v0[free]), 0.1)
        H = np.full((n, n), np.nan)

        def grad(v, starts):
            _, new, parts = pop._objective_and_gradient(fits, to_x(v), starts,
                                                        self.objective_method)
            return self._natural_gradient(parts)[free], new

        try:
            if self._at_estimates is not None:
                starts, parts = self._at_estimates
                g0 = self._natural_gradient(parts)[free]
            else:
                g0, starts = grad(v0, etas)  # the estimates' moves predicted from here
            for a in range(n):
                e = np.zeros_like(v0)
                e[free[a]] = h[a]
                H[:, a] = (grad(v0 + e, starts)[0] - g0) / h[a]
            H = 0.5 * (H + H.T)
        except (np.linalg.LinAlgError, TypeError):  # a step left the positive-definite cone
            pass
        self.hessian = H
        out = {nm: np.nan for nm in names}
        if np.all(np.isfinite(H)) and np.min(np.linalg.eigvalsh(H)) > 0:
            cov = 2.0 * np.linalg.inv(H)  # objective = -2 log L
            for a, i in enumerate(free):
                out[names[i]] = float(np.sqrt(cov[a, a]))
        return out

    # ---------------------------------------------------------------- diagnostics

    @property
    def table(self):
        """Per observation: ID, TIME, OBS (the observable or state), DV, CENS, PRED, IPRED,
        RES, IRES, IWRES, WRES, CWRES (a pandas DataFrame when pandas is installed, else a
        dict of arrays). CENS is 1 for an observation below the LLOQ (M3; its DV is the
        limit, its residuals are those of the limit).

        PRED/IPRED: predictions at eta = 0 and at the estimates; WRES and CWRES the
        residuals decorrelated (symmetric inverse square root) by the FO covariance at
        eta = 0 and the FOCE covariance at the estimates (Hooker et al., Pharm. Res. 24,
        2007); IWRES = IRES / sqrt(R(IPRED))."""
        try:
            import pandas as pd
        except ImportError:
            return dict(self._columns())
        return pd.DataFrame(self._columns())

    def _columns(self):
        """The table's columns (dict of arrays), made once."""
        if self._table is None:
            self._table = self._make_table()
        return self._table

    def _make_table(self):
        pop = self.pop
        theta, blocks, sigma = pop.unpack(self._x)
        omega_bsv, pi = pop._omega_matrix(blocks), pop._iov_matrix(blocks)
        sds = pop._sd_per_error(sigma)
        cols = {c: [] for c in ("ID", "TIME", "OBS", "DV", "CENS", "PRED", "IPRED", "RES",
                                "IRES", "IWRES", "WRES", "CWRES")}
        for sf, eta in zip(self._fits, self._etas):
            omega = pop.subject_omega(omega_bsv, pi, sf.n_occ)
            s = Subject(sf, pop.errors, theta, omega, sds, "focei", pop.ebe_tol,
                        pop.weights(self._x), pop.weight_index)
            _, _, _, f0, G0, R0 = s.evaluate(np.zeros_like(eta))
            _, _, _, fi, Gi, Ri = s.evaluate(eta)
            y = sf.y
            wres = _decorrelate(G0 @ omega @ G0.T + np.diag(R0), y - f0)
            cwres = _decorrelate(Gi @ omega @ Gi.T + np.diag(Ri), y - fi + Gi @ eta)
            for c, v in (("ID", [sf.id] * y.shape[0]), ("TIME", sf.t),
                         ("OBS", [pop.error_names[e] for e in sf.err_index]), ("DV", y),
                         ("CENS", np.zeros(y.shape[0], dtype=int) if sf.cens is None else
                          sf.cens.astype(int)),
                         ("PRED", f0), ("IPRED", fi), ("RES", y - f0), ("IRES", y - fi),
                         ("IWRES", (y - fi) / np.sqrt(Ri)), ("WRES", wres),
                         ("CWRES", cwres)):
                cols[c].extend(list(v))
        return {c: (np.array(v) if c != "ID" else v) for c, v in cols.items()}

    def _select(self, observable):
        """The table's rows of ``observable`` (a boolean mask); None: the only one there is."""
        names = self.pop.error_names
        if observable is None:
            if len(names) > 1:
                raise ValueError(f"NLMEFit: the model has several observed quantities "
                                 f"({', '.join(names)}); pass `observable=`")
            observable = names[0]
        if observable not in names:
            raise ValueError(f"NLMEFit: `observable` {observable!r} is not observed; observed: "
                             f"{', '.join(names)}")
        return np.array(self._columns()["OBS"]) == observable

    def simulate(self, n_sim=200, seed=0, table=False):
        """Replicates of the observations from the fitted model (new etas from N(0, omega),
        new residuals from the error models; values below the fit's limits of
        quantification censored at them), by `NLME.simulate`'s code.

        Returns ``(n_sim, n_obs)`` simulated DVs in the table's order, or with ``table``
        the event-table layout of `NLME.simulate` (the same numbers for the same seed).
        """
        from .simulate import replicates
        from .simulate import table as layout

        if isinstance(n_sim, bool) or not isinstance(n_sim, (int, np.integer)) or n_sim < 1:
            raise ValueError(f"NLMEFit.simulate: `n_sim` must be an int >= 1, got {n_sim!r}")
        sims = replicates(self.pop, self._fits, self._x, int(n_sim), seed)
        return layout(self.pop, self._fits, sims) if table else sims.dv

    def npde(self, n_sim=1000, seed=0):
        """Normalised prediction distribution errors, per observation in the table's order.

        Per subject, the observations and ``n_sim`` replicates simulated from the fitted
        model (`simulate`) are decorrelated by the replicates' mean and covariance
        (Cholesky factor); the prediction distribution error of an observation is the
        fraction of decorrelated replicates below it, and the NPDE its standard normal
        quantile (the fraction kept inside ``[1/(2 n_sim), 1 - 1/(2 n_sim)]``). If the
        model is right they are independent N(0, 1) (Brendel et al., Pharm. Res. 23,
        2006; Comets et al., Comput. Methods Programs Biomed. 90, 2008).
        """
        from scipy.special import ndtri

        sims = self.simulate(n_sim, seed)
        dv = self._columns()["DV"]
        out = np.empty(dv.shape[0])
        o = 0
        for sf in self._fits:
            m = sf.y.shape[0]
            if n_sim <= m:
                raise ValueError(f"npde: `n_sim` must exceed the largest subject's number of "
                                 f"observations ({m}), got {n_sim}")
            ys = sims[:, o:o + m]
            mean = ys.mean(axis=0)
            L = np.linalg.cholesky(np.atleast_2d(np.cov(ys, rowvar=False)))
            z_obs = np.linalg.solve(L, dv[o:o + m] - mean)
            z_sim = np.linalg.solve(L, (ys - mean).T)  # (m, n_sim)
            pde = np.mean(z_sim < z_obs[:, None], axis=1)
            out[o:o + m] = ndtri(np.clip(pde, 0.5 / n_sim, 1.0 - 0.5 / n_sim))
            o += m
        return out

    def vpc_data(self, n_sim=200, bins=None, quantiles=(0.05, 0.5, 0.95), ci=0.95,
                 pred_corrected=False, seed=0, observable=None):
        """The numbers of a visual predictive check (`vpc`).

        Observations are binned by time (``bins``: None = one bin per distinct time when
        there are at most 12, else 10 bins of equal count; a count; or edges). For each
        bin: the observed ``quantiles`` and, over ``n_sim`` simulated replicates of the
        study, the median and the ``ci`` interval of each simulated quantile. With
        ``pred_corrected``, observations and simulations are scaled by the bin's median
        PRED over each one's PRED (Bergstrand et al., AAPS J. 13, 2011). ``observable``:
        which observed quantity (needed when there are several).

        Returns
        -------
        dict with ``time`` (bin mid-times: median observation time), ``observed``
        (n_bins, n_q), ``sim_median``, ``sim_lo``, ``sim_hi`` (n_bins, n_q), ``edges``.
        """
        t, sel = self._columns(), self._select(observable)
        time, dv, pred = t["TIME"][sel], t["DV"][sel], t["PRED"][sel]
        sims = self.simulate(n_sim, seed)[:, sel]
        if pred_corrected:
            if np.any(pred <= 0):
                raise ValueError("vpc: prediction correction needs PRED > 0 everywhere")
        edges = _bin_edges(time, bins)
        which = np.searchsorted(edges, time, side="right") - 1
        q = np.asarray(quantiles, dtype=float)
        a = (1.0 - ci) / 2.0
        rows = {k: [] for k in ("time", "observed", "sim_median", "sim_lo", "sim_hi")}
        for b in range(edges.shape[0] - 1):
            sel = which == b
            if not sel.any():
                continue
            obs, sim = dv[sel], sims[:, sel]
            if pred_corrected:
                scale = np.median(pred[sel]) / pred[sel]
                obs, sim = obs * scale, sim * scale
            sq = np.quantile(sim, q, axis=1).T  # (n_sim, n_q)
            rows["time"].append(np.median(time[sel]))
            rows["observed"].append(np.quantile(obs, q))
            rows["sim_median"].append(np.median(sq, axis=0))
            rows["sim_lo"].append(np.quantile(sq, a, axis=0))
            rows["sim_hi"].append(np.quantile(sq, 1.0 - a, axis=0))
        out = {k: np.array(v) for k, v in rows.items()}
        out["edges"], out["quantiles"] = edges, q
        return out

    def vpc(self, n_sim=200, bins=None, quantiles=(0.05, 0.5, 0.95), ci=0.95,
            pred_corrected=False, seed=0, observable=None, path=None, ax=None,
            legend=True):
        """A visual predictive check (see `vpc_data`): observed percentiles as lines over
        the simulated ones' confidence bands, the observations as points; a matplotlib
        figure, saved to ``path`` when given. ``ax``: draw into these axes instead of a
        new figure (a panel of a larger one)."""
        import matplotlib.pyplot as plt

        d = self.vpc_data(n_sim, bins, quantiles, ci, pred_corrected, seed, observable)
        t, sel = self._columns(), self._select(observable)
        if ax is None:
            fig, ax = plt.subplots(figsize=(8, 5))
        else:
            fig = ax.figure
        ax.scatter(t["TIME"][sel], t["DV"][sel], s=8, color="0.6", label="observed")
        for k, qv in enumerate(d["quantiles"]):
            shade = "C1" if abs(qv - 0.5) < 1e-12 else "C0"
            ax.fill_between(d["time"], d["sim_lo"][:, k], d["sim_hi"][:, k], color=shade,
                            alpha=0.25, label=f"simulated {qv:.0%} ({ci:.0%} CI)")
            ax.plot(d["time"], d["observed"][:, k], color=shade, lw=1.5,
                    label=f"observed {qv:.0%}")
        ax.set(xlabel="TIME", ylabel="pcDV" if pred_corrected else "DV",
               title=f"{'pc' if pred_corrected else ''}VPC ({n_sim} replicates)")
        if legend:
            ax.legend(fontsize=7)
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig

    def gof(self, path=None, observable=None):
        """Goodness-of-fit plots (DV vs PRED and IPRED, CWRES vs TIME and PRED) of
        ``observable`` (needed when there are several): a matplotlib figure, saved to
        ``path`` when given."""
        import matplotlib.pyplot as plt

        sel = self._select(observable)
        t = {k: np.asarray(v)[sel] for k, v in self._columns().items()}
        fig, ax = plt.subplots(2, 2, figsize=(9, 8))
        for a, x, label in ((ax[0, 0], "PRED", "population"), (ax[0, 1], "IPRED", "individual")):
            a.scatter(t[x], t["DV"], s=12, alpha=0.7)
            hi = max(np.max(t[x]), np.max(t["DV"]))
            a.plot([0, hi], [0, hi], "k--", lw=1)
            a.set(xlabel=x, ylabel="DV", title=f"DV vs {label} prediction")
        for a, x in ((ax[1, 0], "TIME"), (ax[1, 1], "PRED")):
            a.scatter(t[x], t["CWRES"], s=12, alpha=0.7)
            a.axhline(0, color="k", lw=1)
            for s in (-2, 2):
                a.axhline(s, color="k", lw=0.5, ls=":")
            a.set(xlabel=x, ylabel="CWRES", title=f"CWRES vs {x}")
        fig.suptitle(f"{self.method.upper()}: objective {self.objective:.2f}")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


def _bin_edges(t, bins):
    if bins is None:
        u = np.unique(t)
        if u.shape[0] <= 12:  # few distinct times: one bin each
            mids = 0.5 * (u[1:] + u[:-1])
            return np.concatenate([[-np.inf], mids, [np.inf]])
        bins = 10
    if np.isscalar(bins):
        edges = np.unique(np.quantile(t, np.linspace(0, 1, int(bins) + 1)))
        edges[0], edges[-1] = -np.inf, np.inf
        return edges
    edges = np.asarray(bins, dtype=float)
    if edges.ndim != 1 or edges.shape[0] < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"vpc: `bins` must be a count or increasing edges, got {bins!r}")
    return edges


def _decorrelate(C, r):
    w, V = np.linalg.eigh(C)
    return V @ ((V.T @ r) / np.sqrt(w))
