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
        self.job = Job(prob, prob.params.copy(), common.schedule(prob), solver, rtol,
                       check_atol(atol, model.n_states), None, max_steps, data.t)
        if self.kind == "observables":
            model.kernel_table("obs", "obs_vjp")

    def params(self, phi):
        p = self.job.prob.params.copy()
        p[self.individual.index] = phi
        return p

    def predict(self, phi, sens=True):
        """``f`` (m,) and, with ``sens``, ``df/dphi`` (m, k) at individual parameters ``phi``."""
        p = self.params(phi)
        job = replace(self.job, p=p)
        st = _SENS.forward(job) if sens else values(job).check()
        U = st.u
        model, idx = self.model, self.individual.index
        m = self.y.shape[0]
        f = np.empty(m)
        F = np.empty((m, idx.shape[0])) if sens else None
        if self.kind == "states":
            f[:] = U[self.obs_q, self.col]
            if sens:
                F[:] = st.S[self.obs_q, self.col][:, idx]
            return f, F
        n = model.n_states
        ybar = np.zeros(model.n_obs)
        for j in range(m):
            q, c = self.obs_q[j], self.col[j]
            u, t = U[q], self.job.obs_t[q]
            f[j] = model.observe(u, p, t)[c]
            if sens:
                ybar[:] = 0.0
                ybar[c] = 1.0
                ubar, pbar = np.empty(n), np.zeros(model.n_params)
                model._call("obs_vjp", (ubar, pbar, ybar, np.ascontiguousarray(u), p), t)
                F[j] = (ubar @ st.S[q] + pbar)[idx]
        return f, F
