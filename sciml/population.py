"""Population fits: shared parameters, per-subject deviations with an L2 penalty.

A simple, honest form of what pharmacometricians do with mixed-effects
models: every subject has its own value of a few mechanistic parameters
(``individual``), equal to the population value plus a deviation ``eta``;
everything else (network weights, other parameters) is shared. The fit
minimises

    sum over subjects of loss_i(theta_i)  +  penalty * sum_ij (eta_ij / scale_j)**2

which is the joint posterior mode under a Gaussian prior on eta with a FIXED
spread (``scale / sqrt(2 penalty)``). This is NOT a mixed-effects
likelihood: the between-subject variance is not estimated and eta is not
integrated out (no FOCE/Laplace/SAEM); use it for shrinkage of individual
parameters toward the population, not for inference on their spread.
Parametrise positive parameters on a log scale (``log_CL``) so that
additive deviations are proportional ones.
"""

import numpy as np

from ._validate import number
from .gradient import loss_and_grad

__all__ = ["Population"]


class Population:
    """The packed vector of a population fit and the objective over it.

    Layout of ``x``: the model's flat parameters (shared; the entries of the
    individual parameters hold their population values), then the
    deviations ``eta`` (n_subjects, n_individual) row by row.

    Parameters
    ----------
    problems : list of ODEProblem
        One per subject, all of one model (their own params are ignored
        except to start from, see `initial`).
    data : list of Data
        One per subject.
    individual : sequence of str
        Mechanistic parameter names that vary between subjects.
    penalty : float
        Weight of the L2 penalty on the deviations (>= 0).
    scale : float or sequence of float
        Typical size of each individual parameter's deviation (default 1).
    **grad_options
        Passed to `sciml.loss_and_grad` (loss, solver, sensealg, rtol, atol,
        threads, max_steps).
    """

    def __init__(self, problems, data, individual, penalty=1.0, scale=1.0, **grad_options):
        if not isinstance(problems, (list, tuple)) or not problems:
            raise ValueError("Population: `problems` must be a non-empty list of ODEProblem")
        if not isinstance(data, (list, tuple)) or len(data) != len(problems):
            got = f"{len(data)} entries" if isinstance(data, (list, tuple)) else \
                type(data).__name__
            raise ValueError(f"Population: `data` must be a list with one Data per problem "
                             f"({len(problems)}), got {got}")
        model = problems[0].model
        for i, p in enumerate(problems):
            if p.model is not model:
                raise ValueError(f"Population: every problem must use the same model; "
                                 f"problems[{i}] does not")
        if isinstance(individual, str):
            individual = [individual]
        individual = list(individual)
        unknown = [k for k in individual if k not in model.params]
        if unknown or len(set(individual)) != len(individual):
            raise ValueError(f"Population: `individual` must name distinct mechanistic "
                             f"parameters of the model {model.params!r}; got {individual!r}")
        number(penalty, "penalty", "Population", lo=0.0, lo_open=False)
        sc = np.broadcast_to(np.asarray(scale, dtype=np.float64), (len(individual),)).copy()
        if not np.all(sc > 0) or not np.all(np.isfinite(sc)):
            raise ValueError(f"Population: `scale` must be > 0 and finite, got {scale!r}")
        self.problems, self.data, self.model = list(problems), list(data), model
        self.individual = individual
        self.idx = np.array([model.params.index(k) for k in individual], dtype=np.int64)
        self.penalty, self.scale = float(penalty), sc
        self.grad_options = grad_options
        self.n_subjects = len(problems)
        self.n_shared = model.n_params
        self.size = self.n_shared + self.n_subjects * len(individual)

    def initial(self):
        """A starting x: shared = the first problem's params (individual entries: the mean
        over subjects), deviations = each subject's params minus that mean."""
        theta = self.problems[0].params.copy()
        own = np.stack([p.params[self.idx] for p in self.problems])
        theta[self.idx] = own.mean(axis=0)
        return self.pack(theta, own - theta[self.idx])

    def pack(self, theta, eta):
        eta = np.asarray(eta, dtype=np.float64).reshape(self.n_subjects, len(self.idx))
        return np.concatenate([np.asarray(theta, dtype=np.float64), eta.ravel()])

    def split(self, x):
        """(shared theta, eta (n_subjects, n_individual)) views of ``x``."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.size,):
            raise ValueError(f"Population: `x` must have length {self.size}, got {x.shape}")
        return x[:self.n_shared], x[self.n_shared:].reshape(self.n_subjects, len(self.idx))

    def subject_params(self, x):
        """Each subject's flat parameter vector, (n_subjects, n_params)."""
        theta, eta = self.split(x)
        th = np.repeat(theta[None, :], self.n_subjects, axis=0)
        th[:, self.idx] += eta
        return th

    def problems_at(self, x):
        """The subjects' problems with their own parameters at ``x``."""
        return [p.remake(params=th) for p, th in zip(self.problems, self.subject_params(x))]

    def loss_and_grad(self, x):
        """Objective (losses + penalty) and its gradient over ``x``."""
        theta, eta = self.split(x)
        values, grads = loss_and_grad(self.problems_at(x), self.data, per_problem=True,
                                      **self.grad_options)
        z = eta / self.scale
        value = float(np.sum(values) + self.penalty * np.sum(z * z))
        g = np.empty(self.size)
        g[:self.n_shared] = grads.sum(axis=0)
        g[self.n_shared:] = (grads[:, self.idx] + 2.0 * self.penalty * z / self.scale).ravel()
        if not np.isfinite(value):
            return np.inf, np.full(self.size, np.nan)
        return value, g

    def fit(self, optimizers=None, params=None, **options):
        """Fit the population vector with `sciml.fit`'s stages, bookkeeping and stop rules.

        ``params``: the packed starting point (default `initial`); ``options``:
        `sciml.fit`'s callback, progress, patience, min_delta, target. The
        result's ``params`` is the packed vector; ``result.subject_params``
        (n_subjects, n_params) and ``result.problems`` hold each subject's
        fitted parameters and problem, and ``result.plot()`` draws every
        subject with its own.
        """
        from .fit import fit

        x0 = self.initial() if params is None else np.asarray(params, dtype=np.float64)
        self.split(x0)  # checks the length
        g = self.grad_options
        result = fit(self.problems, self.data, optimizers=optimizers, params=x0,
                     objective=self.loss_and_grad, solver=g.get("solver"),
                     rtol=g.get("rtol", 1e-6), atol=g.get("atol", 1e-6), **options)
        result.subject_params = self.subject_params(result.params)
        result.problems = self.problems_at(result.params)
        result._setup = (result.problems,) + tuple(result._setup[1:])
        result._own_params = True
        return result
