"""One subject's predictions at its observations, and their derivatives.

A `SubjectFit` holds one subject of an event table (`sciml.data.Subject`) as
the likelihood needs it: the observed values flattened (one entry per
non-missing value), which error model each follows, the covariates, and the
subject's solve. `predict` solves the subject's problem with the individual
parameters and returns the predictions ``f`` and, with forward
sensitivities (`adjoints.ForwardSensitivity`), ``df/dphi`` for the
parameters the individual function sets.
"""

from dataclasses import replace

import numpy as np

from adjoints._forward import Job, values
from adjoints.forward import ForwardSensitivity
from sciml._validate import check_atol
from sciml.solvers import common
from sciml.solvers.kernels.observe import observe_along, observe_sensitivities

_SENS = ForwardSensitivity()


class SubjectFit:
    """A subject prepared for the likelihood (see the module docstring)."""

    def __init__(self, subject, model, individual, error_of_column, solver, rtol, atol,
                 max_steps):
        data = getattr(subject, "data", None)
        prob = getattr(subject, "problem", None)
        if prob is None or data is None:
            raise ValueError(f"NLME: subject {getattr(subject, 'id', '?')!r} has no "
                             "observations (or is not a sciml.data.Subject)")
        if prob.changes or prob.events:
            # the predictions below run one forward-sensitivity solve over the whole span,
            # which would ignore the changes (or events) silently
            what = "parameter changes (sciml.Change, e.g. from read_events(..., " \
                "time_varying=True) with covariate_params)" if prob.changes else \
                "events (sciml.Event)"
            raise ValueError(f"NLME: subject {subject.id!r}'s problem has {what}; sciml.nlme "
                             "does not support them yet")
        if prob.model is not model:
            raise ValueError(f"NLME: subject {subject.id!r} was read with another model; read "
                             "the event table with the NLME's model")
        self.id = subject.id
        self.subject = subject
        self.model = model
        self.individual = individual
        self.cov = individual.subject_covariates(subject)
        cols = data.columns(model)
        self.kind = data.kind
        q, c = np.nonzero(data.mask)
        self.obs_q, self.obs_c = q, c
        self.t = data.t[q]
        self.y = data.y[q, c]
        self.col = cols[c]  # state or observable index in the model
        names = data.names if data.names is not None else \
            (model.states if data.kind == "states" else model.obs_names)
        self.err_index = np.array([error_of_column(names[j]) for j in c], dtype=np.int64)
        # M3: which observations are below their limit (``y`` then holds the limit; None
        # when none is), and each observation's limit (-inf: none), which simulated values
        # are censored at: from the table (`read_events(censored=, lloq=)`), raised by
        # `NLME.prepare(lloq=)`
        flags = getattr(subject, "censored", None)
        self.cens = None if flags is None or not flags[q, c].any() else flags[q, c].copy()
        limits = getattr(subject, "lloq", None)
        self.lloq = np.full(self.y.shape[0], -np.inf) if limits is None else \
            np.array(limits[q, c], dtype=float)
        if self.cens is not None:
            self.lloq[self.cens] = self.y[self.cens]
        self.job = Job(prob, prob.params.copy(), common.schedule(prob), solver, rtol,
                       check_atol(atol, model.n_states), None, max_steps, data.t)
        self.kern = prob.kernel_table("obs", "obs_vjp") if self.kind == "observables" else None
        self.ws = model.workspace()
        # the prepared sensitivity solves (`ForwardSensitivity.prepare`): to the individual
        # parameters only (the empirical Bayes iterations), and to every parameter
        self._sens = {}

    def params(self, phi, weights=None, weight_index=None):
        """The model's flat parameters: the subject's, with the individual parameters
        ``phi`` and, when given, network weights ``weights`` at ``weight_index``."""
        p = self.job.prob.params.copy()
        p[self.individual.index] = phi
        if weights is not None:
            p[weight_index] = weights
        return p

    def predict(self, phi, sens=True, weights=None, weight_index=None, full=False):
        """``f`` (m,) and, with ``sens``, ``df/dphi`` (m, k) at individual parameters ``phi``
        (with ``full``: the derivatives in every model parameter, (m, n_params))."""
        p = self.params(phi, weights, weight_index)
        model, idx = self.model, self.individual.index
        if sens:
            if full not in self._sens:
                self._sens[full] = _SENS.prepare(self.job, None if full else idx)
            st = self._sens[full](p)
        else:
            st = values(replace(self.job, p=p)).check()
        U = st.u
        m = self.y.shape[0]
        f = np.empty(m)
        if self.kind == "states":
            f[:] = U[self.obs_q, self.col]
            if sens:
                return f, np.ascontiguousarray(st.S[self.obs_q, self.col])
            return f, None
        if not sens:
            Y = np.empty((U.shape[0], model.n_obs))
            observe_along(self.kern, p, self.ws, Y, self.job.obs_t, U)
            return Y[self.obs_q, self.col], None
        S = st.S
        if not full:  # the followed columns in place; the others' du/dp are not needed
            S = np.zeros(S.shape[:2] + (model.n_params,))
            S[:, :, idx] = st.S
        Fp = np.empty((m, model.n_params))
        observe_sensitivities(self.kern, p, self.ws, U, np.ascontiguousarray(S),
                              self.job.obs_t, self.obs_q, self.col, np.empty(model.n_obs), f,
                              Fp)
        return f, (Fp if full else np.ascontiguousarray(Fp[:, idx]))
