"""`NLME`: a population model (a `sciml.Model`, an individual-parameter function, typical
values, between-subject covariance, residual errors) and its estimation.

The population parameters, as the optimiser sees them, are one unconstrained
vector: the thetas as given, each omega block as its Cholesky factor (log
diagonal, then the entries below it) and the log of each residual standard
deviation. The objective is the sum of the subjects' contributions
(`likelihood`); each subject's empirical Bayes estimate is warm-started from
the last one found. The outer optimiser (BFGS) follows the objective's exact
gradient (`gradient`), for every method.
"""

import contextlib
import copy
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy import optimize

from sciml._tier import compiled_only
from sciml._validate import positive_number, real
from sciml.problem import initial_function
from sciml.solvers.erk import Tsit5

from . import bfgs
from .errors import ErrorModel
from .gradient import subject_gradient, subject_objective
from .individual import Effects, Individual
from .likelihood import METHODS, Subject
from .predict import SubjectFit
from .results import NLMEFit

__all__ = ["NLME"]


def _omega_blocks(omega, what="omega"):
    """``[(names, matrix)]`` from ``{name: variance, (name, ...): matrix}``, checked (``what``:
    the argument's name in messages)."""
    if not isinstance(omega, dict) or not omega:
        raise TypeError(f"NLME: `{what}` must be a non-empty dict {{eta name: variance}} (or "
                        "{(eta names): covariance matrix} for a block)")
    blocks, seen = [], set()
    for key, value in omega.items():
        names = (key,) if isinstance(key, str) else tuple(key)
        if not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError(f"NLME: `{what}` key {key!r} must be an eta name or a tuple of them")
        dup = seen.intersection(names)
        if dup:
            raise ValueError(f"NLME: `{what}` names eta {sorted(dup)[0]!r} twice")
        seen.update(names)
        try:
            m = np.array(value, dtype=float).reshape(len(names), len(names))
        except (TypeError, ValueError):
            raise ValueError(f"NLME: `{what}[{key!r}]` must be a variance (one eta) or a "
                             f"{len(names)}x{len(names)} covariance matrix, got {value!r}") \
                from None
        if not np.all(np.isfinite(m)) or not np.allclose(m, m.T, rtol=0, atol=1e-14):
            raise ValueError(f"NLME: `{what}[{key!r}]` must be finite and symmetric, got "
                             f"{m.tolist()}")
        if np.min(np.linalg.eigvalsh(m)) <= 0:
            raise ValueError(f"NLME: `{what}[{key!r}]` is not positive definite (eigenvalues "
                             f"{np.round(np.linalg.eigvalsh(m), 6).tolist()}); variances must "
                             "be > 0 and correlations inside (-1, 1)")
        blocks.append((names, m))
    return blocks


class NLME:
    """A nonlinear mixed-effects model with networks allowed in its dynamics.

    Parameters
    ----------
    model : sciml.Model
        The dynamics, observables and doses (subjects from `sciml.data.read_events`).
    individual : callable
        ``individual(theta, eta, cov) -> {model parameter: expression}``, plain Python
        traced once (``theta.NAME``, ``eta.NAME``, ``cov.NAME``; numpy functions such as
        ``np.exp``); model parameters it does not set keep each subject's values.
    theta : dict
        Typical values (fixed effects), name -> initial value.
    omega : dict
        Between-subject covariance as variances: ``{eta: variance}`` (diagonal) or
        ``{(eta1, eta2): [[v1, c], [c, v2]]}`` (a block).
    error : dict
        Observable (or state) -> residual error model (`Additive`, `Proportional`,
        `Combined`), for every observed column.
    nets : dict, optional
        Networks whose weights are population parameters (fixed effects). A network of
        the model: name -> initial flat weights (e.g. ``chain.init_params(seed=0)``; the
        model's other networks keep each subject's weights). A network of the individual
        function (``individual(theta, eta, cov, nets)`` calls ``nets.NAME([inputs])``):
        name -> ``(chain, initial weights)`` or a `nets.Chain`; its weights follow the
        thetas in the optimiser's vector (see `individual`).
    ebe_tol : float
        The empirical Bayes estimates stop when a step would lower a subject's objective
        by less than this (the objective is then exact to about ``sqrt(ebe_tol)`` times
        its sensitivity to eta; the FOCE-I gradient accounts for the remainder).
    threads : int, optional
        Subjects are evaluated on this many threads (default: the machine's cores); the
        sums are taken in the subjects' order, so results do not depend on it.
    iov : dict, optional
        Inter-occasion variability: ``{eta: variance}`` (or ``{(eta1, eta2): matrix}``),
        as `omega`. Each subject gets, in each of its occasions, random effects of these
        names with this covariance, independent between occasions (NONMEM's ``SAME``
        blocks); in occasion o the individual function's ``eta.NAME`` is the subject's
        between-subject ``eta.NAME`` (if `omega` has one) plus the occasion's. The
        between-occasion variances are estimated with the rest (``fit.iov``).
    occasion : str
        The occasion column of the subjects (default ``"OCC"``): a covariate that is a
        step function of time, as ``read_events(..., occasion="OCC")`` reads it (a subject
        with a constant value has one occasion). Occasions of a subject are numbered in
        the order they start; each is one stretch of its record.
    workers : int, optional
        Evaluate the subjects in this many worker processes (forked once per `fit` or
        `objective` with the prepared subjects, each holding a block of them; `parallel`):
        the Python around each subject's solves then runs on every core, which threads
        cannot do. Results are the serial ones bit for bit. ``1``: no worker processes
        (the subjects on `threads` threads of this process). Default: `threads` worker
        processes where that is safe and pays (`parallel.auto_workers`: forking is the
        platform's default, this process runs one thread, at least
        `parallel.SUBJECTS_PER_WORKER` subjects each), else threads. With ``client``: the
        number of blocks (default: one per Dask worker).
    client : None, "local" or dask.distributed.Client
        Evaluate blocks of subjects on Dask workers (``"local"``: an embedded
        ``LocalCluster`` of `workers` processes, closed at the end of each call): each
        block is shipped once per fit, and each evaluation returns its subjects'
        objective and gradient contributions. For populations beyond one machine.
    initial : dict, optional
        Initial states that are expressions of the model's parameters (so of the
        individual parameters): ``{"effect": "e0"}`` (nlmixr2's ``effect(0) <- e0``), a
        function of the parameters (``lambda p: p.e0``) or a number; the other states
        start where the subjects' problems do (`sciml.data.read_events` takes the same
        ``initial=``; give it in one place).

    Examples
    --------
    >>> pop = sciml.nlme.NLME(model, lambda th, eta, cov: {
    ...     "ka": np.exp(th.tka + eta.ka), "cl": np.exp(th.tcl + eta.cl),
    ...     "v": np.exp(th.tv + eta.v)},
    ...     theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
    ...     omega={"ka": 0.6, "cl": 0.3, "v": 0.1}, error={"cp": sciml.nlme.Additive(0.7)})
    >>> fit = pop.fit(subjects, method="focei")
    """

    def __init__(self, model, individual, theta, omega, error, nets=None, ebe_tol=1e-12,
                 threads=None, iov=None, occasion=None, initial=None, workers=None,
                 client=None):
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                    or workers < 1):
            raise ValueError(f"NLME: `workers` must be a positive int or None, got {workers!r}")
        if client is not None and client != "local":
            dist = sys.modules.get("distributed")
            if dist is None or not isinstance(client, dist.Client):
                raise TypeError(f"NLME: `client` must be None, \"local\" (an embedded Dask "
                                f"LocalCluster) or a dask.distributed.Client, got {client!r}")
        if not isinstance(theta, dict) or not theta:
            raise TypeError("NLME: `theta` must be a non-empty dict {name: initial value}")
        self.model = model
        self.theta_names = tuple(theta)
        self.theta0 = np.array([_number(v, f"theta[{k!r}]") for k, v in theta.items()])
        self.blocks = _omega_blocks(omega)
        self.eta_names = tuple(n for names, _ in self.blocks for n in names)
        if iov is None and occasion is not None:
            raise ValueError("NLME: `occasion` names the occasion column of `iov`; give iov="
                             "{eta: variance} as well")
        self.iov_blocks = [] if iov is None else _omega_blocks(iov, "iov")
        self.iov_names = tuple(n for names, _ in self.iov_blocks for n in names)
        if initial is not None:
            initial_function(model, initial, np.zeros(model.n_states), "NLME")  # checked
        self.initial, self._initial_fns = initial, {}
        if occasion is not None and not isinstance(occasion, str):
            raise TypeError(f"NLME: `occasion` must be a column name, got {occasion!r}")
        self.occasion = (occasion or "OCC") if iov is not None else None
        # the eta names the individual function reads: between-subject, then occasion-only
        traced = self.eta_names + tuple(n for n in self.iov_names if n not in self.eta_names)
        self.effects = None if iov is None else Effects(traced, self.eta_names,
                                                        self.iov_names, self.occasion)
        if not isinstance(error, dict) or not error:
            raise TypeError("NLME: `error` must be a dict {observable: sciml.nlme.Additive(sd)"
                            ", ...}")
        pool = set(model.obs_names) | set(model.states)
        for name, e in error.items():
            if name not in pool:
                raise ValueError(f"NLME: `error` names {name!r}, not an observable or state of "
                                 f"the model ({', '.join(model.obs_names + model.states)})")
            if not isinstance(e, ErrorModel):
                raise TypeError(f"NLME: `error[{name!r}]` must be sciml.nlme.Additive, "
                                f"Proportional or Combined, got {e!r}")
        self.error_names = tuple(error)
        self.errors = tuple(error.values())
        self.sigma_names = tuple(f"{o}.{n}" for o, e in error.items() for n in e.names)
        self.sigma0 = np.array([v for e in self.errors for v in e.sd])
        if not isinstance(nets or {}, dict):
            raise TypeError(f"NLME: `nets` must be a dict {{network: initial weights}}, got "
                            f"{type(nets).__name__}")
        nets = dict(nets or {})
        own = {k: nets.pop(k) for k in list(nets) if k not in model.nets}
        chains, self.own_nets, w_own = {}, {}, []
        for name, value in own.items():
            chain, w = _own_net(name, value, model)
            chains[name] = chain
            o = len(self.theta0) + sum(len(v) for v in w_own)
            self.own_nets[name] = slice(o, o + chain.n_params)
            w_own.append(w)
        # the weights of the individual function's networks are thetas to the rest
        self.theta0 = np.concatenate([self.theta0] + w_own)
        self.theta_labels = self.theta_names + tuple(
            f"{n}[{i}]" for n, c in chains.items() for i in range(c.n_params))
        self.individual = Individual(individual, model, self.theta_names, traced, chains)
        self.net_slices, self.w0, self.weight_index = _nets(model, nets)
        self.net_names = tuple(self.net_slices)
        self.ebe_tol = _number(ebe_tol, "ebe_tol")
        if threads is None:
            threads = os.cpu_count() or 1
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"NLME: `threads` must be a positive int, got {threads!r}")
        self.threads = threads
        self.workers, self.client = workers, client
        self._runner = None  # the worker processes or Dask blocks of the current call

    def __getstate__(self):
        # what a worker process or a Dask worker gets: never the runner of a call
        return {**self.__dict__, "_runner": None}

    @contextlib.contextmanager
    def _parallel(self, fits, solve):
        """Start the worker processes or Dask blocks of `workers` / `client` for ``fits``
        (prepared with ``solve``) for the duration of a call."""
        from .parallel import DaskBlocks, Workers, auto_workers

        workers = self.workers
        if workers is None and self.client is None:
            workers = auto_workers(len(fits), self.threads)
        if self._runner is not None or (self.client is None and (workers or 1) < 2) \
                or len(fits) < 2:
            yield
            return
        runner = DaskBlocks(self, fits, solve, self.client, self.workers) \
            if self.client is not None else Workers(self, fits, workers)
        self._runner = runner
        try:
            yield
        finally:
            self._runner = None
            runner.close()

    # ---------------------------------------------------------------- parameters

    def _omega_matrix(self, blocks):
        """Omega (n_eta, n_eta) from `unpack`'s blocks (the IOV ones left out)."""
        k = len(self.eta_names)
        om = np.zeros((k, k))
        o = 0
        for m in blocks[:len(self.blocks)]:
            b = m.shape[0]
            om[o:o + b, o:o + b] = m
            o += b
        return om

    @property
    def packed_blocks(self):
        """``[(names, matrix)]`` of every covariance the optimiser's vector holds: Omega's
        blocks, then the between-occasion (`iov`) blocks."""
        return self.blocks + self.iov_blocks

    def pack(self, theta, blocks, sigma, weights=None):
        """The unconstrained vector of (theta, covariance blocks (`packed_blocks`: Omega's,
        then the occasions'), sigma, network weights)."""
        parts = [np.asarray(theta, dtype=float)]
        for m in blocks:
            L = np.linalg.cholesky(m)
            b = L.shape[0]
            parts.append(np.log(np.diag(L)))
            parts.append(L[np.tril_indices(b, -1)])
        parts.append(np.log(np.asarray(sigma, dtype=float)))
        parts.append(self.w0 if weights is None else np.asarray(weights, dtype=float))
        return np.concatenate(parts)

    def unpack(self, x):
        """``(theta, covariance blocks (`packed_blocks`), sigma)`` of an unconstrained
        vector."""
        nt = self.theta0.shape[0]
        theta, o = x[:nt], nt
        blocks = []
        for names, _ in self.packed_blocks:
            b = len(names)
            L = np.diag(np.exp(x[o:o + b]))
            o += b
            nl = b * (b - 1) // 2
            L[np.tril_indices(b, -1)] = x[o:o + nl]
            o += nl
            blocks.append(L @ L.T)
        return theta, blocks, np.exp(x[o:o + len(self.sigma_names)])

    def _iov_matrix(self, blocks):
        """The between-occasion covariance Pi (n_iov, n_iov) from `unpack`'s blocks (None
        without occasions)."""
        if not self.iov_blocks:
            return None
        k = len(self.iov_names)
        pi = np.zeros((k, k))
        o = 0
        for m in blocks[len(self.blocks):]:
            b = m.shape[0]
            pi[o:o + b, o:o + b] = m
            o += b
        return pi

    def subject_omega(self, omega, pi, n_occ):
        """A subject's prior covariance of its random effects ``(eta, kappa_1, ...,
        kappa_O)``: ``blockdiag(Omega, Pi, ..., Pi)``."""
        if pi is None:
            return omega
        return _block_diag([omega] + [pi] * n_occ)

    def n_random(self, sf):
        """The random effects of the subject ``sf`` (`predict.SubjectFit`)."""
        return len(self.eta_names) + sf.n_occ * len(self.iov_names)

    def weights(self, x):
        """The estimated network weights in ``x`` (None when no network is estimated)."""
        nw = self.w0.shape[0]
        return x[x.shape[0] - nw:] if nw else None

    def _sd_per_error(self, sigma):
        out, o = [], 0
        for e in self.errors:
            out.append(tuple(sigma[o:o + len(e.names)]))
            o += len(e.names)
        return out

    # ---------------------------------------------------------------- objective

    def prepare(self, subjects, solver=None, rtol=1e-8, atol=1e-10, max_steps=100_000,
                lloq=None):
        """The subjects as the likelihood needs them (`predict.SubjectFit`).

        ``lloq``: a lower limit of quantification, one number for every observed quantity
        or ``{observable: limit}``; an observation below it is censored (M3, as nlmixr2's
        ``CENS = 1``: it counts as the probability of being below the limit, its value
        replaced by the limit). Observations the table censored (`read_events`'
        ``censored=`` / ``lloq=``: `sciml.data.Subject.censored`) are censored as well,
        at their own limits.

        Subjects without observations (``data`` None) are left out with a warning: they
        contribute nothing, as in NONMEM."""
        if not isinstance(subjects, (list, tuple)) or not subjects:
            raise TypeError("NLME: `subjects` must be a non-empty list of sciml.data.Subject "
                            "(from sciml.data.read_events)")
        solver = Tsit5() if solver is None else solver

        def error_of(name):
            if name not in self.error_names:
                raise ValueError(f"NLME: observations of {name!r} have no error model; add "
                                 f"error={{{name!r}: sciml.nlme.Additive(sd)}}")
            return self.error_names.index(name)

        empty = [s for s in subjects if getattr(s, "data", None) is None
                 and getattr(s, "problem", None) is not None]
        if empty:
            # NONMEM includes such a subject with no data contribution; so does dropping it
            warnings.warn(f"NLME: {len(empty)} subject(s) have no observations and contribute "
                          f"nothing: {', '.join(repr(s.id) for s in empty[:5])}"
                          f"{', ...' if len(empty) > 5 else ''}", UserWarning, stacklevel=3)
            subjects = [s for s in subjects if all(s is not e for e in empty)]
            if not subjects:
                raise ValueError("NLME: no subject has observations")
        fits = [SubjectFit(self._with_initial(s), self.model, self.individual, error_of,
                           solver, rtol, atol, max_steps, self.effects) for s in subjects]
        limits = self._limits(lloq)
        if limits is not None:
            for sf in fits:
                c = limits[sf.err_index]
                # a value the table already censored keeps its own limit (its y)
                flagged = np.zeros(sf.y.shape[0], bool) if sf.cens is None else sf.cens
                below = (sf.y < c) & ~flagged
                if below.any():
                    sf.y = np.where(below, c, sf.y)
                    sf.cens = below | flagged
                sf.lloq = np.where(flagged, sf.lloq, np.maximum(sf.lloq, c))
        return fits

    def _with_initial(self, subject):
        """``subject`` with its problem's initial states from `initial` (a copy), or itself."""
        if self.initial is None:
            return subject
        prob = getattr(subject, "problem", None)
        if prob is None or prob.model is not self.model:
            return subject  # SubjectFit says what is wrong
        if prob.u0_function is not None:
            raise ValueError(f"NLME: subject {subject.id!r}'s problem has initial values as a "
                             "function already (read_events(initial=) or u0=); give "
                             "`initial` in one place")
        key = prob.u0.tobytes()
        if key not in self._initial_fns:
            self._initial_fns[key] = initial_function(self.model, self.initial, prob.u0,
                                                      "NLME")
        out = copy.copy(subject)
        out.problem = prob.remake(u0=self._initial_fns[key])
        return out

    def _limits(self, lloq):
        """The LLOQ of each error model's observations (-inf: none), or None."""
        if lloq is None:
            return None
        given = lloq if isinstance(lloq, dict) else dict.fromkeys(self.error_names, lloq)
        out = np.full(len(self.error_names), -np.inf)
        for name, v in given.items():
            if name not in self.error_names:
                raise ValueError(f"NLME: `lloq` names {name!r}, not an observed quantity "
                                 f"({', '.join(self.error_names)})")
            out[self.error_names.index(name)] = _number(v, f"lloq[{name!r}]")
        return out

    def _subject(self, x, method, ebe_tol=None):
        """``sf -> likelihood.Subject``: a subject's objective at the parameters ``x``."""
        theta, blocks, sigma = self.unpack(x)
        omega, pi = self._omega_matrix(blocks), self._iov_matrix(blocks)
        sds = self._sd_per_error(sigma)
        w = self.weights(x)
        return lambda sf: Subject(sf, self.errors, theta, self.subject_omega(omega, pi, sf.n_occ),
                                  sds, method, ebe_tol or self.ebe_tol, w, self.weight_index)

    def _each(self, fn, fits, etas):
        """``[fn(subject fit, eta0)]`` in the subjects' order, on ``threads`` threads: the
        compiled solves release the GIL, and each subject has its own buffers."""
        pairs = list(zip(fits, etas))
        n = min(self.threads, len(pairs))
        if n < 2:
            return [fn(*a) for a in pairs]
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(lambda a: fn(*a), pairs))

    def evaluate(self, kind, fits, x, method, starts, ebe_tol=None):
        """Each subject's ``subject_objective`` (``kind="objective"``) or
        ``subject_gradient`` (``"gradient"``) at ``x``, in the subjects' order: in this
        process on `threads` threads, or on the worker processes or Dask blocks that hold
        ``fits`` (`parallel`)."""
        runner = self._runner
        if runner is not None and runner.holds(fits):
            return runner.run(kind, x, method, list(starts), ebe_tol)
        subject = self._subject(x, method, ebe_tol)
        one = subject_objective if kind == "objective" else subject_gradient
        return self._each(lambda sf, start: one(subject(sf), start), fits, starts)

    def _objective(self, fits, x, method, etas, ebe_tol=None):
        """``(objective, etas)`` at ``x``; each subject's estimate starts from its entry of
        ``etas`` (an array, or an `EtaStart` of `_objective_and_gradient`)."""
        out = self.evaluate("objective", fits, x, method, etas, ebe_tol)
        return sum(v for v, _ in out), [eta for _, eta in out]

    def _objective_and_gradient(self, fits, x, etas, method):
        """``(objective, starts, (dOFV/dpsi, Gamma))``: the exact gradient of ``method``
        (`gradient.gradient`, summed over subjects) in the thetas, residual sds and
        estimated weights (in that order), and ``dOFV = tr(Gamma dOmega)``; no parts
        (None) where the objective is not finite. ``starts``: each subject's `EtaStart`
        (its estimate, ``.eta``, and where it moves with the parameters), what the next
        call's ``etas`` should be."""
        out = self.evaluate("gradient", fits, x, method, etas)
        if not all(np.isfinite(v) for v, *_ in out):
            return np.inf, etas, None
        total, d_pop, gamma, gamma_iov = 0.0, 0.0, 0.0, 0.0
        for (value, dp, g, _), sf in zip(out, fits):  # in the subjects' order, whatever the
            total, d_pop = total + value, d_pop + dp   # threads
            g_bsv, g_iov = self._split_gamma(g, sf.n_occ)
            gamma, gamma_iov = gamma + g_bsv, gamma_iov + g_iov
        return total, [start for *_, start in out], (d_pop, gamma, gamma_iov)

    def _split_gamma(self, gamma, n_occ):
        """A subject's ``Gamma`` (its random effects) as ``(Gamma of Omega, Gamma of Pi)``:
        ``tr(Gamma dOmega_i) = tr(G_bsv dOmega) + sum_o tr(G_oo dPi)``."""
        ne, ni = len(self.eta_names), len(self.iov_names)
        g_iov = 0.0
        for o in range(n_occ if ni else 0):
            a = ne + o * ni
            g_iov = g_iov + gamma[a:a + ni, a:a + ni]
        return gamma[:ne, :ne], g_iov

    def gradient_x(self, x, parts):
        """The gradient in the unconstrained vector ``x`` from `_objective_and_gradient`'s
        parts (chain rule through the Cholesky factors and the log sds)."""
        d_pop, gamma, gamma_iov = parts
        _, blocks, sigma = self.unpack(x)
        nt, ns = self.theta0.shape[0], sigma.shape[0]
        out = [d_pop[:nt]]
        o = 0
        nb = len(self.blocks)
        for i, ((names, _), om) in enumerate(zip(self.packed_blocks, blocks)):
            if i == nb:
                o = 0
            g = gamma if i < nb else gamma_iov
            b = len(names)
            L = np.linalg.cholesky(om)
            dL = 2.0 * g[o:o + b, o:o + b] @ L
            out.append(np.diag(dL) * np.diag(L))
            out.append(dL[np.tril_indices(b, -1)])
            o += b
        out.append(d_pop[nt:nt + ns] * sigma)
        out.append(d_pop[nt + ns:])
        return np.concatenate(out)

    def objective(self, subjects, theta=None, omega=None, sigma=None, method="focei",
                  nets=None, iov=None, **solve):
        """The objective (-2 log-likelihood, no ``n log 2 pi``) at fixed values.

        ``theta``, ``sigma`` : dicts (or sequences in the model's order); ``omega``, ``iov``
        : dicts as in the constructor, or full matrices (their blocks are read); ``nets``
        : estimated networks' weights by name; each defaults to the initial values. For
        subjects left out of a fit, the objective at the fit's estimates is their marginal
        likelihood (`NLMEFit.objective_on`).
        """
        method = _method(method)
        fits = self.prepare(subjects, **solve)
        x = self._given(theta, omega, sigma, nets, iov)
        with self._parallel(fits, solve):
            return self._objective(fits, x, method, self._zero_etas(fits))[0]

    def _zero_etas(self, fits):
        return [np.zeros(self.n_random(sf)) for sf in fits]

    def simulate(self, subjects, theta=None, omega=None, sigma=None, n=100, seed=0, *,
                 nets=None, iov=None, **solve):
        """Simulate ``n`` replicates of a study from its design, at given parameters (no
        fit needed): new random effects from ``N(0, omega)`` per subject and replicate, new
        residuals from the error models (`simulate.replicates`).

        Parameters
        ----------
        subjects : list of sciml.data.Subject
            The design: each subject's doses, covariates and observation records (their
            times and observables; the DV values are not used). Subjects without
            observations are left out, with a warning.
        theta, omega, sigma, nets
            As in `objective` (each defaults to the initial values).
        n : int
            Replicates (>= 1).
        seed : int
            Seed of `numpy.random.default_rng`: the same seed, the same study.
        **solve
            ``solver``, ``rtol``, ``atol``, ``max_steps``; ``lloq`` (a number or
            ``{observable: limit}``): simulated values below it are censored as nlmixr2
            marks them, ``CENS = 1`` and ``DV`` the limit (the limits read by
            `read_events` from ``lloq=`` / ``censored=`` apply as well).

        Returns
        -------
        pandas.DataFrame (a dict of arrays without pandas)
            One row per replicate and observation record, replicates stacked in order:
            ``SIM`` (1..n), ``ID``, ``TIME``, ``OBS``, ``DV``, ``CENS``, ``IPRED``,
            ``PRED`` (eta = 0) and ``eta.<name>``.

        Examples
        --------
        >>> sim = pop.simulate(subjects, theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
        ...                    n=500, seed=1)
        >>> sim.groupby("TIME")["DV"].quantile([0.05, 0.5, 0.95])
        """
        from .simulate import replicates, table

        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"NLME.simulate: `n` (replicates) must be an int >= 1, got {n!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(
                seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"NLME.simulate: `seed` must be an int >= 0 (or None), got "
                             f"{seed!r}")
        x = self._given(theta, omega, sigma, nets, iov)
        fits = self.prepare(subjects, **solve)
        return table(self, fits, replicates(self, fits, x, int(n), seed))

    def _given(self, theta, omega, sigma, nets, iov=None):
        """The unconstrained vector of given values (`objective`'s arguments)."""
        nt = len(self.theta_names)
        th, w = self._with_nets(nets, np.concatenate([
            self._vector(theta, self.theta_names, self.theta0[:nt], "theta"),
            self.theta0[nt:]]))
        sd = self._vector(sigma, self.sigma_names, self.sigma0, "sigma")
        if np.any(sd <= 0):
            bad = self.sigma_names[int(np.argmax(sd <= 0))]
            raise ValueError(f"NLME: `sigma[{bad!r}]` must be a standard deviation > 0, got "
                             f"{sd[self.sigma_names.index(bad)]!r}")
        if iov is not None and not self.iov_blocks:
            raise ValueError("NLME: `iov` given, but the model has no occasions (NLME(iov=))")
        blocks = self._blocks_of(omega) + (
            self._blocks_of(iov, self.iov_blocks, "iov") if self.iov_blocks else [])
        return self.pack(th, blocks, sd, w)

    @staticmethod
    def _vector(values, names, defaults, kind):
        """``values`` (None, a dict by name, or a sequence in ``names``' order) as an array,
        ``defaults`` where not given."""
        if values is None:
            return defaults
        if isinstance(values, dict):
            unknown = set(values) - set(names)
            if unknown:
                raise ValueError(f"NLME: unknown {kind} {sorted(unknown)}; {kind}s: "
                                 f"{', '.join(names)}")
            out = np.array([_number(values.get(n, v), f"{kind}[{n!r}]")
                            for n, v in zip(names, defaults)])
        else:
            try:
                out = np.array(values, dtype=float)
            except (TypeError, ValueError):
                raise TypeError(f"NLME: `{kind}` must be a dict by name or {len(names)} "
                                f"numbers ({', '.join(names)}), got {values!r}") from None
            if out.shape != (len(names),):
                raise ValueError(f"NLME: `{kind}` must have {len(names)} values "
                                 f"({', '.join(names)}), got shape {out.shape}")
            if not np.all(np.isfinite(out)):
                raise ValueError(f"NLME: `{kind}` must be finite, got {out.tolist()}")
        return out

    def _with_nets(self, nets, theta):
        """``(theta, model network weights)`` with the weights given in ``nets`` by network
        name (the individual function's networks are in ``theta``), defaults elsewhere."""
        if nets is None:
            return theta, None
        known = self.net_names + tuple(self.own_nets)
        unknown = set(nets) - set(known)
        if unknown:
            raise ValueError(f"NLME: `nets` names {sorted(unknown)}, not estimated networks "
                             f"({', '.join(known) or 'none'})")
        theta, w = theta.copy(), self.w0.copy()
        places = {**{n: (theta, sl) for n, sl in self.own_nets.items()},
                  **{n: (w, sl) for n, sl in self.net_slices.items()}}
        for name, value in nets.items():
            target, sl = places[name]
            v = np.array(value, dtype=float).ravel()
            if v.shape != (sl.stop - sl.start,):
                raise ValueError(f"NLME: `nets[{name!r}]` must have {sl.stop - sl.start} "
                                 f"weights, got shape {np.shape(value)}")
            target[sl] = v
        return theta, w

    def _blocks_of(self, omega, model_blocks=None, what="omega"):
        """The covariance blocks of a given ``omega`` (or ``iov``, with ``model_blocks``
        `iov_blocks`): a dict as in the constructor or the full matrix; the model's own
        where None."""
        model_blocks = self.blocks if model_blocks is None else model_blocks
        names_all = [n for names, _ in model_blocks for n in names]
        if omega is None:
            return [m for _, m in model_blocks]
        if not isinstance(omega, dict):
            try:
                omega = np.array(omega, dtype=float)
            except (TypeError, ValueError):
                raise TypeError(f"NLME: `{what}` must be a dict as in the constructor or an "
                                f"(n, n) matrix, got {omega!r}") from None
        if isinstance(omega, np.ndarray):
            k = len(names_all)
            if omega.shape != (k, k):
                raise ValueError(f"NLME: `{what}` as a matrix must be ({k}, {k}) for etas "
                                 f"{', '.join(names_all)}, got shape {omega.shape}")
            out, o = [], 0
            for names, _ in model_blocks:
                b = len(names)
                out.append(np.array(omega[o:o + b, o:o + b], dtype=float))
                o += b
            omega = {names if len(names) > 1 else names[0]: m
                     for (names, _), m in zip(model_blocks, out)}
        given = _omega_blocks(omega, what)
        if [n for n, _ in given] != [n for n, _ in model_blocks]:
            raise ValueError(f"NLME: `{what}` must have the model's blocks "
                             f"{[n for n, _ in model_blocks]}, got {[n for n, _ in given]}")
        return [m for _, m in given]

    # ---------------------------------------------------------------- estimation

    @compiled_only()  # reproducible: no interpreted first calls (see sciml._tier)
    def fit(self, subjects, method="focei", *, fixed=(), max_iter=500, covariance=True,
            stages=(), start=None, seed=None, ftol=1e-5, **solve):
        """Estimate theta, omega and sigma by minimising the objective of ``method``, or by
        SAEM.

        Parameters
        ----------
        subjects : list of sciml.data.Subject
        method : {"focei", "foce", "laplace", "fo", "saem"} or SAEM
            ``"saem"`` (or `SAEM` settings): stochastic approximation EM (`saem`), then
            the FOCE-I objective, empirical Bayes estimates and covariance step at its
            estimates, so the result reads as the other methods' (``fit.method`` is
            ``"saem"``, ``fit.objective`` FOCE-I's, ``fit.saem`` the iterations' trace
            and where the time went).
        seed : int, optional
            SAEM's sampler seed (default: the `SAEM` settings', 0); the other methods are
            deterministic and refuse it.
        fixed : sequence of str
            Theta, sigma and estimated network names (e.g. ``"tka"``, ``"cp.sd"``,
            ``"U"``) kept at their values.
        max_iter : int
            Iterations of the outer optimiser (BFGS on the method's exact gradient,
            `bfgs.minimize`); for SAEM, 0 evaluates the result at the start without
            iterating (its iterations are the settings' ``burn`` and ``em``).
        ftol : float
            The outer optimiser stops when its quasi-Newton model predicts a decrease of
            the objective below this (the objective is -2 log-likelihood: at 1e-5 each
            estimate is within about 0.003 of its standard error of the optimum).
        stages : sequence of nets optimizers
            First-order stages run before BFGS, each for its ``iters`` steps on the same
            exact gradient (e.g. ``[nets.Adam(0.01, iters=200)]``): for networks with many
            weights, where BFGS from a poor start is slow; BFGS refines from the best
            point they reached.
        start : array_like, optional
            An unconstrained vector to start from (`pack`'s layout; e.g. a start of
            `fit_multistart`) instead of the initial values; fixed entries keep its values.
        covariance : bool
            Run the covariance step (standard errors from the objective's Hessian, forward
            differences of its exact gradient).
        **solve
            ``solver``, ``rtol``, ``atol``, ``max_steps`` of the subjects' solves, and
            ``lloq`` (censored observations, M3: see `prepare`).

        Returns
        -------
        NLMEFit
        """
        settings = _saem(method, seed)
        if settings is None:
            method = _method(method)
        fits = self.prepare(subjects, **solve)
        x0 = self._start(start)
        free = self._free(fixed)
        ftol = positive_number("ftol", ftol, where="NLME.fit")
        with self._parallel(fits, solve):
            if settings is not None:
                return self._fit_saem(fits, settings, x0, free, self._zero_etas(fits),
                                      max_iter, covariance, stages)
            return self._fit(fits, method, x0, free, max_iter, covariance, stages, ftol)

    def _fit(self, fits, method, x0, free, max_iter, covariance, stages, ftol):
        state = {"etas": self._zero_etas(fits), "n_eval": 0}

        def full(z):
            x = x0.copy()
            x[free] = z
            return x

        def fun_and_grad(z):
            x = full(z)
            value, new, parts = self._objective_and_gradient(fits, x, state["etas"], method)
            state["n_eval"] += 1
            if not np.isfinite(value):
                return np.inf, np.zeros_like(z)
            state["etas"] = new
            state["last"] = (z.tobytes(), value, new, parts)
            return value, self.gradient_x(x, parts)[free]

        z0 = _first_order(stages, fun_and_grad, x0[free])
        res = bfgs.minimize(fun_and_grad, z0, max_iter=max_iter, ftol=ftol)
        x = full(res.x)
        last = state.get("last")
        if res.nit > 0 and last is not None and last[0] == res.x.tobytes():
            # the optimiser's last evaluation is at its result (it stops after an accepted
            # step), its estimates started from the previous point's: its objective,
            # estimates and gradient are the fit's, and the covariance step starts from
            # them instead of evaluating them again (without an iteration, the only
            # evaluation started the estimates from zero: they are polished once more)
            _, value, starts, parts = last
            return NLMEFit(self, fits, method, x, value, [st.eta for st in starts], res, free,
                           covariance, at_estimates=(starts, parts))
        value, etas = self._objective(fits, x, method, state["etas"])
        return NLMEFit(self, fits, method, x, value, etas, res, free, covariance)

    def _fit_saem(self, fits, settings, x0, free, etas, max_iter, covariance, stages):
        if stages:
            raise ValueError("NLME.fit: `stages` are first-order stages of the gradient-based "
                             "methods; method='saem' takes none")
        from .saem import run_saem

        censored = [sf.id for sf in fits if sf.cens is not None]
        if censored:
            raise ValueError(f"NLME.fit: method='saem' does not take observations below the "
                             f"LLOQ yet (subject {censored[0]!r} has some); use 'focei' or "
                             "'laplace'")
        if self.iov_blocks:
            raise ValueError("NLME.fit: method='saem' does not take occasions (iov=) yet; use "
                             "'focei', 'foce' or 'laplace'")

        if max_iter == 0:
            x, trace = x0, None
        else:
            x, etas, trace = run_saem(self, fits, settings, x0, free)
        t0 = time.perf_counter()
        value, etas = self._objective(fits, x, "focei", etas)
        t1 = time.perf_counter()
        n = settings.burn + settings.em if trace is not None else 0
        res = optimize.OptimizeResult(success=True, nit=n, message=(
            f"SAEM: {settings.burn} burn-in and {settings.em} averaging iterations, "
            f"seed {settings.seed}" if n else "SAEM: evaluated at the start (max_iter=0)"))
        fit = NLMEFit(self, fits, "saem", x, value, etas, res, free, covariance,
                      objective_method="focei")
        fit.saem = trace
        if trace is not None:
            trace.seconds["focei"] = t1 - t0
            trace.seconds["covariance"] = time.perf_counter() - t1
        return fit

    def _start(self, start):
        x0 = self.pack(self.theta0, [m for _, m in self.packed_blocks], self.sigma0)
        if start is None:
            return x0
        x = np.array(start, dtype=float).ravel()
        if x.shape != x0.shape or not np.all(np.isfinite(x)):
            raise ValueError(f"NLME.fit: `start` must be {x0.shape[0]} finite numbers (the "
                             f"unconstrained vector of `pack`), got shape {np.shape(start)}")
        return x

    def fit_multistart(self, subjects, starts=16, seed=0, spread=0.5, method="focei", *,
                       fixed=(), client=None, results=None, progress=True, workers=None,
                       covariance=True, **fit_options):
        """Fit from many start points, with `sciml.fit_multistart`'s mechanism (threads, an
        embedded Dask ``LocalCluster`` with ``client="local"``, or a Dask client; a
        resumable ``results`` folder; one progress bar).

        Start k is the initial unconstrained vector (`pack`: thetas, log-Cholesky omega,
        log sds, weights) plus ``spread`` times standard normals drawn from
        ``np.random.SeedSequence(seed).spawn(starts)[k]`` on the entries not ``fixed``
        (``starts`` may also be an array of such vectors). Each start is one `fit` (its
        subjects on one thread; ``fit_options``: ``max_iter``, ``stages``, solver
        settings).

        Returns
        -------
        sciml.MultistartResult
            Every start (``StartFit.params``: the fitted unconstrained vector,
            ``objective``), sorted by objective, and ``best_fit``: the `NLMEFit` of the
            best start (with the covariance step unless ``covariance=False``).
        """
        from .starts import fit_multistart

        return fit_multistart(self, subjects, starts, seed, _number(spread, "spread"),
                              _method(method), fixed, client, results, progress, workers,
                              covariance, fit_options)

    def _free(self, fixed):
        fixed = (fixed,) if isinstance(fixed, str) else tuple(fixed)
        nt = self.theta0.shape[0]
        n_om = sum(len(n) * (len(n) + 1) // 2 for n, _ in self.packed_blocks)
        ns = len(self.sigma_names)
        mask = np.ones(nt + n_om + ns + self.w0.shape[0], dtype=bool)
        for name in fixed:
            if name in self.theta_names:
                mask[self.theta_names.index(name)] = False
            elif name in self.sigma_names:
                mask[nt + n_om + self.sigma_names.index(name)] = False
            elif name in self.own_nets:
                mask[self.own_nets[name]] = False
            elif name in self.net_slices:
                sl, o = self.net_slices[name], nt + n_om + ns
                mask[o + sl.start:o + sl.stop] = False
            else:
                known = self.theta_names + self.sigma_names + self.net_names + \
                    tuple(self.own_nets)
                raise ValueError(f"NLME.fit: `fixed` names {name!r}, not a theta, sigma or "
                                 f"estimated network ({', '.join(known)})")
        return np.nonzero(mask)[0]


def _block_diag(mats):
    n = sum(m.shape[0] for m in mats)
    out = np.zeros((n, n))
    o = 0
    for m in mats:
        b = m.shape[0]
        out[o:o + b, o:o + b] = m
        o += b
    return out


def _first_order(stages, fun_and_grad, z):
    """The best point of first-order ``stages`` (nets optimizers with ``iters``) from ``z``."""
    stages = [stages] if hasattr(stages, "update") else list(stages)
    best, best_value = z.copy(), np.inf
    for i, opt in enumerate(stages):
        iters = getattr(opt, "iters", None)
        if not (callable(getattr(opt, "init", None)) and callable(getattr(opt, "update", None))
                and isinstance(iters, int) and iters > 0):
            raise TypeError(f"NLME.fit: `stages[{i}]` must be a nets optimizer with an "
                            f"iteration budget, e.g. nets.Adam(0.01, iters=200), got {opt!r}")
        z = best.copy()
        opt.init(z)
        for _ in range(iters):
            value, g = fun_and_grad(z)
            if not np.isfinite(value):
                break  # back to the best point: the next stage (or BFGS) starts there
            if value < best_value:
                best, best_value = z.copy(), value
            opt.update(z, g)
    return best


def _own_net(name, value, model):
    """``(chain, initial weights)`` of a network of the individual function: ``value`` is a
    `nets.Chain` (weights ``init_params(seed=0)``) or ``(chain, weights)``."""
    from nets import Chain

    chain, w = (value, None) if isinstance(value, Chain) else \
        (value if isinstance(value, tuple) and len(value) == 2 else (None, None))
    if not isinstance(chain, Chain):
        raise ValueError(f"NLME: `nets` names {name!r}, not a network of the model "
                         f"({', '.join(model.nets) or 'it has none'}); a network of the "
                         "individual function is given as a nets.Chain or (chain, initial "
                         f"weights), got {type(value).__name__}")
    w = chain.init_params(seed=0) if w is None else np.array(w, dtype=float).ravel()
    if w.shape != (chain.n_params,) or not np.all(np.isfinite(w)):
        raise ValueError(f"NLME: `nets[{name!r}]` must have {chain.n_params} finite weights "
                         f"(the chain's n_params), got shape {w.shape}")
    return chain, w


def _nets(model, nets):
    """``({name: its slice of the weights}, initial weights, their indices in the model's
    flat parameters)`` of the model's networks estimated as population parameters."""
    slices, w, idx = {}, [], []
    for name, w0 in nets.items():
        n = model.nets[name].n_params
        v = np.array(w0, dtype=float).ravel()
        if v.shape != (n,) or not np.all(np.isfinite(v)):
            raise ValueError(f"NLME: `nets[{name!r}]` must be {n} finite weights (the chain's "
                             f"n_params), got shape {np.shape(w0)}")
        sl = model.param_slices[name]
        o = sum(len(v) for v in w)
        slices[name] = slice(o, o + n)
        w.append(v)
        idx.append(np.arange(sl.start, sl.stop))
    if not w:
        return {}, np.zeros(0), np.zeros(0, dtype=np.int64)
    return slices, np.concatenate(w), np.concatenate(idx).astype(np.int64)


def _saem(method, seed):
    """SAEM settings of ``method`` (the string "saem" or `SAEM`, ``seed`` overriding its
    seed), or None for the other methods (which refuse a seed)."""
    from .saem import SAEM

    if isinstance(method, SAEM) or method == "saem":
        settings = copy.copy(method) if isinstance(method, SAEM) else SAEM()
        if seed is not None:
            settings.seed = SAEM(seed=seed).seed
        return settings
    if seed is not None:
        raise ValueError(f"NLME.fit: `seed` is the sampler's seed of method='saem'; method="
                         f"{method!r} is deterministic")
    return None


def _method(method):
    if method not in METHODS:
        raise ValueError(f"NLME: `method` must be one of {', '.join(map(repr, METHODS))}, got "
                         f"{method!r}")
    return method


def _number(v, what):
    return real(v, what, "NLME")
