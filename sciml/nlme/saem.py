"""SAEM: stochastic approximation expectation-maximisation (Kuhn & Lavielle 2004, 2005).

Each iteration k draws random effects from their conditional law given the
data and the current population parameters (a few Metropolis-Hastings steps
per subject, `sampler`), updates stochastic approximations of the complete
data's sufficient statistics with step ``gamma_k``, and maximises the
approximated complete-data likelihood (the M-step):

- ``gamma_k = 1`` during the ``burn`` first iterations (the statistics are those
  of the last draw: the chain moves freely toward the likelihood's mode), then
  ``gamma_k = 1 / (k - burn)`` for the ``em`` others (the statistics become
  averages over the draws; the estimates converge);
- mu-referenced random effects (``psi_a = theta_j + eta_a``, found on the traced
  individual function): ``S1 = sum_i psi_i``, ``S2 = sum_i psi_i psi_i^T``, then in
  closed form ``theta_j = S1_a / N`` and ``Omega = S2 / N - mu mu^T`` (other
  random effects have mean 0; entries outside Omega's blocks are zero);
- additive and proportional residual errors: the mean of ``(y - f)**2`` (of
  ``((y - f) / f)**2``) over their observations, a closed form in that statistic;
- the rest (thetas that are not means of a random effect, network weights,
  combined errors) have no finite statistic: as in saemix (Comets et al., J. Stat.
  Softw. 80, 2017) their M-step is a few optimiser iterations on the current
  draws' complete-data objective (Levenberg-Marquardt on the exact derivatives of
  the predictions, `derivatives.Local`; for combined errors on the residuals at
  fixed predictions), and the parameter itself moves by ``gamma_k`` toward that
  point;
- during burn-in, as Monolix does (simulated annealing), a variance may shrink by
  at most the factor ``anneal`` per iteration, so the chains are not trapped
  early by a too small Omega or residual error.

The kernels (Monolix's and nlmixr2's three): ``kernels[0]`` draws from the
prior ``N(0, Omega)`` (accepted on the likelihood ratio); ``kernels[1]`` sweeps of
a random walk on each component in turn; ``kernels[2]`` random-walk moves of the
whole vector with covariance proportional to Omega. Each random walk's scale is
adapted after every move toward an acceptance rate of ``target``
(``scale *= 1 + 0.4 (rate - target)``, as saemix). All subjects' (and chains')
proposals are drawn at once; each subject's prediction is its compiled solve,
and the acceptance is one numpy evaluation over every observation.
"""

import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from adjoints import SolveFailed
from sciml._validate import real

from .derivatives import Local, residual_jets, variance_terms
from .errors import Additive, Proportional
from .likelihood import Subject

__all__ = ["SAEM", "SAEMTrace", "run_saem"]


def _count(v, what, low=0):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise ValueError(f"SAEM: `{what}` must be an int >= {low}, got {v!r}")
    return int(v)


class SAEM:
    """Settings of the SAEM estimation (``NLME.fit(subjects, method=SAEM(...))``; the
    string ``"saem"`` takes these defaults, nlmixr2's).

    Parameters
    ----------
    burn : int
        Iterations with step size 1 (nlmixr2's ``nBurn``, 200).
    em : int
        Iterations with step sizes ``1 / (k - burn)`` (``nEm``, 300).
    chains : int
        Markov chains per subject (their statistics averaged; nlmixr2's ``nmc``, 3: on
        theo_sd one chain left tka 0.02 from the reference for one seed in four).
    kernels : (int, int, int)
        Metropolis-Hastings moves per iteration: draws from the prior, sweeps of
        component-wise random walks, random walks of the whole vector.
    seed : int
        Seed of the sampler (`numpy.random.default_rng`): the same seed gives the
        same estimates.
    anneal : float
        During burn-in, a variance (of Omega or a residual error) is at least ``anneal``
        times its previous value (Monolix's simulated annealing); 0 turns it off.
    target : float
        The random walks' acceptance rate their scales are adapted to.
    mstep_iter : int
        Optimiser iterations of the M-step where there is no closed form.

    References
    ----------
    Delyon, Lavielle & Moulines, Ann. Stat. 27 (1999); Kuhn & Lavielle, ESAIM P&S 8
    (2004) and Comput. Stat. Data Anal. 49 (2005); Comets, Lavenu & Lavielle, J. Stat.
    Softw. 80 (2017) (saemix).
    """

    def __init__(self, burn=200, em=300, chains=3, kernels=(2, 2, 2), seed=0, anneal=0.95,
                 target=0.4, mstep_iter=1):
        self.burn, self.em = _count(burn, "burn"), _count(em, "em")
        if self.burn + self.em < 1:
            raise ValueError("SAEM: `burn` + `em` must be at least 1 iteration")
        self.chains = _count(chains, "chains", 1)
        k = tuple(kernels) if isinstance(kernels, (tuple, list)) else None
        if k is None or len(k) != 3:
            raise ValueError(f"SAEM: `kernels` must be three counts (prior, component-wise, "
                             f"vector moves), got {kernels!r}")
        self.kernels = tuple(_count(v, "kernels[i]") for v in k)
        if sum(self.kernels) < 1:
            raise ValueError("SAEM: `kernels` must make at least one move per iteration")
        self.seed = _count(seed, "seed")
        self.anneal = _fraction(anneal, "anneal", closed=True)
        self.target = _fraction(target, "target", closed=False)
        self.mstep_iter = _count(mstep_iter, "mstep_iter", 1)

    def __repr__(self):
        return (f"SAEM(burn={self.burn}, em={self.em}, chains={self.chains}, "
                f"kernels={self.kernels}, seed={self.seed})")


def _fraction(v, what, closed):
    return real(v, what, "SAEM", 0.0, 1.0, lo_open=not closed, hi_open=not closed,
                want="in [0, 1]" if closed else "in (0, 1)")


@dataclass
class SAEMTrace:
    """What SAEM did: per iteration the thetas (n_iter, n_theta), Omega's diagonal,
    the residual sds and the random walks' acceptance rates (n_iter, 2: component-wise,
    vector); and ``seconds``: in the sampler's solves (``sampler_solves``: the
    compiled solves and the Python that calls each) and around them
    (``sampler_python``: proposals, acceptance, statistics), in the M-step's
    sensitivity solves with their chain rule (``mstep_solves``) and its other work,
    ``n_solves`` (predictions of one walker), and (filled by `NLME.fit`) the FOCE-I
    evaluation and the covariance step."""

    theta: np.ndarray
    omega: np.ndarray
    sigma: np.ndarray
    acceptance: np.ndarray
    settings: SAEM
    seconds: dict = field(default_factory=dict)


class _Walkers:
    """Every chain of every subject: their random effects, predictions and data
    objectives, the predictions flat (one entry per observation of each walker)."""

    def __init__(self, pop, fits, chains):
        self.pop, self.fits = pop, fits
        self.C = chains
        self.sub = np.repeat(np.arange(len(fits)), chains)
        self.covs = np.array([fits[i].cov for i in self.sub]).reshape(self.sub.shape[0], -1)
        # one set of individual parameters per subject: all walkers' in one evaluation;
        # else (time-varying covariates) each walker's per piece of its record
        self.simple = all(sf.ind.simple for sf in fits)
        sizes = np.array([fits[i].y.shape[0] for i in self.sub])
        self.start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self.obs_w = np.repeat(np.arange(self.sub.shape[0]), sizes)
        self.y = np.concatenate([fits[i].y for i in self.sub])
        self.err = np.concatenate([fits[i].err_index for i in self.sub])
        self.solve_seconds = 0.0
        self.n_solves = 0

    @property
    def n(self):
        return self.sub.shape[0]

    def predict(self, theta, eta, weights):
        """Flat predictions (n_obs,) of every walker at ``eta`` (n, n_eta); NaN where a
        walker's solve fails (its proposal is then refused)."""
        pop = self.pop
        if self.simple:
            phi = pop.individual.values_many(theta, eta, self.covs)
        else:
            phi = [self.fits[i].ind.values(theta, eta[w]) for w, i in enumerate(self.sub)]
        out = np.empty(self.y.shape[0])

        def chunk(ws):
            for w in ws:
                sf = self.fits[self.sub[w]]
                sl = slice(self.start[w], self.start[w] + sf.y.shape[0])
                try:
                    out[sl] = sf.predict(phi[w], False, weights, pop.weight_index)[0]
                except SolveFailed:
                    out[sl] = np.nan

        # serial: the solves release the GIL, but the Python around each one (a third of
        # its 35 us) does not; two threads measured no faster on two cores
        t0 = time.perf_counter()
        chunk(range(self.n))
        self.solve_seconds += time.perf_counter() - t0
        self.n_solves += self.n
        return out

    def variance(self, errors, sds, f):
        R = np.empty_like(f)
        for q, (model, sd) in enumerate(zip(errors, sds)):
            sel = self.err == q
            if sel.any():
                R[sel] = model.variance(f[sel], sd)[0]
        return R

    def data_objective(self, errors, sds, f):
        """``-2 log p(y | eta)`` per walker without constants, (n,); inf where a solve
        failed or a variance is not positive."""
        with np.errstate(divide="ignore", invalid="ignore"):
            R = self.variance(errors, sds, f)
            e = self.y - f
            terms = e * e / R + np.log(R)
        terms[~np.isfinite(terms)] = np.inf
        return np.add.reduceat(terms, self.start)


class _State:
    """The population parameters as SAEM moves them (theta with the individual function's
    weights, the full Omega, the residual sds, the model networks' weights)."""

    def __init__(self, pop, x):
        theta, blocks, sigma = pop.unpack(x)
        self.theta = theta.copy()
        self.omega = pop._omega_matrix(blocks)
        self.sigma = sigma.copy()
        w = pop.weights(x)
        self.w = None if w is None else w.copy()

    def sds(self, pop):
        return pop._sd_per_error(self.sigma)


def run_saem(pop, fits, settings, x0, free):
    """SAEM from the unconstrained vector ``x0``, estimating the entries ``free`` of it.

    Returns
    -------
    x : ndarray
        The estimates as an unconstrained vector (`NLME.pack`).
    etas : list of ndarray
        Each subject's conditional mean of eta (the stochastic approximation of its
        draws), the start of the FOCE-I empirical Bayes estimates.
    trace : SAEMTrace
    """
    t_all = time.perf_counter()
    W = _Walkers(pop, fits, settings.chains)
    rng = np.random.default_rng(settings.seed)
    st = _State(pop, x0)
    k = len(pop.eta_names)
    N = len(fits)
    free = set(int(i) for i in free)
    nt = st.theta.shape[0]
    n_om = sum(len(n) * (len(n) + 1) // 2 for n, _ in pop.blocks)
    ns = st.sigma.shape[0]
    mu_ref = {a: j for a, j in pop.individual.mu_references().items()}
    mu_free = {a: j for a, j in mu_ref.items() if j in free}
    other_theta = [j for j in range(nt) if j in free and j not in mu_ref.values()]
    w_free = [i for i in range(0 if st.w is None else st.w.shape[0])
              if nt + n_om + ns + i in free]
    sigma_free = [q for q in range(ns) if nt + n_om + q in free]
    in_block = _block_mask(pop, k)

    eta = np.zeros((W.n, k))
    f = W.predict(st.theta, eta, st.w)
    d = W.data_objective(pop.errors, st.sds(pop), f)
    if not np.all(np.isfinite(d)):
        bad = fits[int(W.sub[np.argmax(~np.isfinite(d))])].id
        raise ValueError(f"NLME.fit(method='saem'): subject {bad!r} cannot be predicted at "
                         "the initial values (eta = 0): its solve fails or a residual variance "
                         "is not positive; change the initial theta or sigma")
    scale = 0.5 * np.sqrt(np.diag(st.omega))
    scale_v = np.array(0.5)
    n_iter = settings.burn + settings.em
    stats = None
    eta_mean = np.zeros((N, k))
    rec = {"theta": [], "omega": [], "sigma": [], "acceptance": []}
    t_mstep = mstep_solves = 0.0
    for it in range(1, n_iter + 1):
        gamma = 1.0 if it <= settings.burn else 1.0 / (it - settings.burn)
        eta, f, d, acc = _sample(W, pop, st, eta, f, d, scale, scale_v, rng, settings)
        t0 = time.perf_counter()
        solves_before = W.solve_seconds
        mu = np.zeros(k)
        for a, j in mu_ref.items():
            mu[a] = st.theta[j]
        psi = eta + mu
        new = {"S1": psi.sum(axis=0) / W.C, "S2": psi.T @ psi / W.C,
               "res": _residual_stats(W, pop, f)}
        stats = new if stats is None else {key: stats[key] + gamma * (new[key] - stats[key])
                                           for key in stats}
        if it > settings.burn:
            eta_mean += gamma * (eta.reshape(N, W.C, k).mean(axis=1) - eta_mean)
        anneal = settings.anneal if it <= settings.burn else 0.0
        moved = _closed_form(st, stats, N, mu_free, mu_ref, in_block, sigma_free, pop,
                             anneal, W)
        for a, delta in moved.items():  # psi kept: the predictions do not change
            eta[:, a] -= delta
        if sigma_free:
            _numeric_sigma(W, pop, st, f, sigma_free, gamma, anneal)
        if other_theta or w_free:
            _mstep_numeric(W, pop, st, eta, f, other_theta, w_free, gamma,
                           settings.mstep_iter)
            f = W.predict(st.theta, eta, st.w)
        d = W.data_objective(pop.errors, st.sds(pop), f)
        t_mstep += time.perf_counter() - t0
        mstep_solves += W.solve_seconds - solves_before
        rec["theta"].append(st.theta.copy())
        rec["omega"].append(np.diag(st.omega).copy())
        rec["sigma"].append(st.sigma.copy())
        rec["acceptance"].append(acc)
    if settings.em == 0:
        eta_mean = eta.reshape(N, W.C, k).mean(axis=1)
    blocks = []
    o = 0
    for names, _ in pop.blocks:
        b = len(names)
        blocks.append(st.omega[o:o + b, o:o + b].copy())
        o += b
    x = pop.pack(st.theta, blocks, st.sigma, st.w)
    total = time.perf_counter() - t_all
    trace = SAEMTrace(*(np.array(rec[key]) for key in ("theta", "omega", "sigma",
                                                       "acceptance")), settings)
    sampler_solves = W.solve_seconds - mstep_solves
    trace.seconds = {"sampler_solves": sampler_solves,
                     "sampler_python": total - t_mstep - sampler_solves,
                     "mstep_solves": mstep_solves, "mstep_python": t_mstep - mstep_solves,
                     "n_solves": W.n_solves}
    return x, list(eta_mean), trace


def _block_mask(pop, k):
    mask = np.zeros((k, k), dtype=bool)
    o = 0
    for names, _ in pop.blocks:
        b = len(names)
        mask[o:o + b, o:o + b] = True
        o += b
    return mask


def _sample(W, pop, st, eta, f, d, scale, scale_v, rng, settings):
    """One iteration's Metropolis-Hastings moves of every walker (see the module
    docstring); ``scale`` and ``scale_v`` are adapted in place. Returns the new
    ``(eta, f, d)`` and the random walks' acceptance rates."""
    k = eta.shape[1]
    L = np.linalg.cholesky(st.omega)
    Oi = np.linalg.inv(st.omega)
    sds = st.sds(pop)

    def prior(e):
        return np.einsum("wa,ab,wb->w", e, Oi, e)

    def move(prop, with_prior):
        nonlocal eta, f, d
        fp = W.predict(st.theta, prop, st.w)
        dp = W.data_objective(pop.errors, sds, fp)
        delta = dp - d
        if with_prior:
            delta = delta + prior(prop) - prior(eta)
        with np.errstate(invalid="ignore", over="ignore"):
            ok = np.log(rng.uniform(size=W.n)) < -0.5 * delta
        ok &= np.isfinite(dp)
        eta = np.where(ok[:, None], prop, eta)
        f = np.where(ok[W.obs_w], fp, f)
        d = np.where(ok, dp, d)
        return ok.mean()

    n1, n2, n3 = settings.kernels
    rates = [[], []]
    for _ in range(n1):
        move(rng.standard_normal((W.n, k)) @ L.T, False)
    for _ in range(n2):
        for a in range(k):
            prop = eta.copy()
            prop[:, a] += scale[a] * rng.standard_normal(W.n)
            r = move(prop, True)
            scale[a] *= 1.0 + 0.4 * (r - settings.target)
            rates[0].append(r)
    for _ in range(n3):
        r = move(eta + scale_v * (rng.standard_normal((W.n, k)) @ L.T), True)
        scale_v *= 1.0 + 0.4 * (r - settings.target)
        rates[1].append(r)
    return eta, f, d, [float(np.mean(r)) if r else np.nan for r in rates]


def _residual_stats(W, pop, f):
    """Per error model: the sum over its observations of ``(y - f)**2`` (additive),
    ``((y - f) / f)**2`` (proportional), per chain; NaN for the others."""
    out = np.full(len(pop.errors), np.nan)
    e = W.y - f
    for q, model in enumerate(pop.errors):
        sel = W.err == q
        if isinstance(model, Additive):
            out[q] = np.sum(e[sel] ** 2) / W.C
        elif isinstance(model, Proportional):
            out[q] = np.sum((e[sel] / f[sel]) ** 2) / W.C
    return out


def _closed_form(st, stats, N, mu_free, mu_ref, in_block, sigma_free, pop, anneal, W):
    """The M-step's closed forms (theta means, Omega, additive and proportional sds) from
    the approximated statistics, in place; returns how far each moved mean went."""
    k = st.omega.shape[0]
    mu = np.zeros(k)
    for a, j in mu_ref.items():
        mu[a] = st.theta[j]
    moved = {}
    for a, j in mu_free.items():
        new = stats["S1"][a] / N
        moved[a] = new - mu[a]
        mu[a] = st.theta[j] = new
    S1, S2 = stats["S1"], stats["S2"]
    om = (S2 - np.outer(mu, S1) - np.outer(S1, mu)) / N + np.outer(mu, mu)
    om = np.where(in_block, 0.5 * (om + om.T), 0.0)
    if anneal > 0.0:  # variances shrink by at most `anneal` per iteration, correlations kept
        floor = anneal * np.diag(st.omega)
        dg = np.diag(om)
        c = np.sqrt(np.maximum(floor, dg) / np.maximum(dg, 1e-300))
        om = om * np.outer(c, c)
    # a degenerate draw (all chains at one point) must not leave the positive-definite cone
    om += np.diag(np.maximum(1e-10 * np.diag(st.omega), 1e-14) * (np.linalg.eigvalsh(om).min()
                                                                   <= 0))
    st.omega = om
    n_obs = np.bincount(W.err, minlength=len(pop.errors)) / W.C
    o = 0
    for q, model in enumerate(pop.errors):
        if isinstance(model, (Additive, Proportional)) and o in sigma_free:
            var = stats["res"][q] / n_obs[q]
            if anneal > 0.0:
                var = max(var, anneal * st.sigma[o] ** 2)
            st.sigma[o] = math.sqrt(var)
        o += len(model.names)
    return moved


def _numeric_sigma(W, pop, st, f, sigma_free, gamma, anneal):
    """Combined (and other) errors: the sds minimising the current draws' residual objective
    at fixed predictions (a few BFGS iterations in log sd), approached by ``gamma``."""
    o = 0
    for q, model in enumerate(pop.errors):
        sl = slice(o, o + len(model.names))
        o = sl.stop
        idx = [i for i in range(sl.start, sl.stop) if i in sigma_free]
        if not idx or isinstance(model, (Additive, Proportional)):
            continue
        sel = W.err == q
        target = _sd_minimiser(model, st.sigma[sl], [i - sl.start for i in idx], f[sel],
                               W.y[sel])
        new = st.sigma[idx] + gamma * (target - st.sigma[idx])
        if anneal > 0.0:
            new = np.maximum(new, math.sqrt(anneal) * st.sigma[idx])
        st.sigma[idx] = new


def _sd_minimiser(model, sd0, which, f, y):
    """The sds ``sd0[which]`` minimising ``sum (y - f)**2 / R + log R`` of error ``model``."""
    e2 = (y - f) ** 2
    index = np.zeros(f.shape[0], dtype=np.int64)

    def objective(z):
        sd = np.array(sd0, dtype=float)
        sd[which] = np.exp(z)
        vt = variance_terms((model,), (tuple(sd),), index, f)
        lR = 1.0 / vt.R - e2 / vt.R ** 2
        return np.sum(e2 / vt.R + np.log(vt.R)), (lR @ vt.Rs)[which] * np.exp(z)

    res = optimize.minimize(objective, np.log(np.asarray(sd0)[which]), jac=True,
                            method="BFGS", options={"maxiter": 5})
    return np.exp(res.x)


def _mstep_numeric(W, pop, st, eta, f, other_theta, w_free, gamma, n_iter):
    """Thetas that are not means of a random effect and network weights: Levenberg-Marquardt
    iterations on the current draws' complete-data objective ``sum l(y, f(psi, eta))``
    (exact derivatives of the predictions at fixed eta), then ``psi += gamma (psi* -
    psi)``."""
    nt = st.theta.shape[0]
    ns = st.sigma.shape[0]
    cols = list(other_theta) + [nt + ns + i for i in w_free]
    start = _get(st, other_theta, w_free)
    sds = st.sds(pop)
    lam = 1e-3

    def value(p):
        _set(st, other_theta, w_free, p)
        fp = W.predict(st.theta, eta, st.w)
        return float(np.sum(W.data_objective(pop.errors, sds, fp)))

    p = start.copy()
    current = float(np.sum(W.data_objective(pop.errors, sds, f)))
    for _ in range(n_iter):
        _set(st, other_theta, w_free, p)
        g = np.zeros(len(cols))
        H = np.zeros((len(cols), len(cols)))
        subjects = [Subject(sf, pop.errors, st.theta, st.omega, sds, "focei", pop.ebe_tol,
                            st.w, pop.weight_index) for sf in W.fits]
        t0 = time.perf_counter()
        for w, i in enumerate(W.sub):
            try:
                loc = Local(subjects[i], eta[w], second=False)
            except SolveFailed:
                W.solve_seconds += time.perf_counter() - t0
                return _set(st, other_theta, w_free, start)
            vt = variance_terms(pop.errors, sds, W.fits[i].err_index, loc.f)
            _, L1, _, wt = residual_jets(W.fits[i].y, loc.f, vt.R, vt.R1, vt.R2)
            J = loc.df[:, cols]
            g += J.T @ L1.v
            H += 2.0 * J.T @ (wt.v[:, None] * J)
        W.solve_seconds += time.perf_counter() - t0
        W.n_solves += W.n
        for _ in range(8):
            step = -np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-12), g)
            trial = value(p + step)
            if trial < current:
                p, current, lam = p + step, trial, lam * 0.3
                break
            lam *= 10.0
        else:
            break
    _set(st, other_theta, w_free, start + gamma * (p - start))


def _get(st, other_theta, w_free):
    parts = [st.theta[other_theta]]
    if w_free:
        parts.append(st.w[w_free])
    return np.concatenate(parts)


def _set(st, other_theta, w_free, p):
    n = len(other_theta)
    st.theta[other_theta] = p[:n]
    if w_free:
        st.w[w_free] = p[n:]
