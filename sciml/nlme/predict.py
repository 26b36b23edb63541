"""One subject's predictions at its observations, and their derivatives.

A `SubjectFit` holds one subject of an event table (`sciml.data.Subject`) as
the likelihood needs it: the observed values flattened (one entry per
non-missing value), which error model each follows, and the subject's solve.
`predict` solves the subject's problem with the individual parameters and
returns the predictions ``f`` and, with forward sensitivities
(`adjoints.ForwardSensitivity`), their derivatives in the subject's columns.

**Pieces.** Where the individual parameters change within a subject's record (a
covariate of the individual function that varies with time, read by
``read_events(time_varying=True)``; an occasion with its own random effects; a
`sciml.Change` of the problem), the solve is made of pieces between those times
(`sciml.segments`' rule: a time on a boundary belongs to the later piece, the state
is continuous across it, a bolus at a boundary is given at the later piece's start).
Piece j has its own individual parameters ``phi_j`` (k of them), so the subject's
individual parameters are the stacked ``Phi = (phi_1, ..., phi_J)``.

**Columns.** The derivatives are taken in the subject's columns ``Q = (Phi, w)``:
the J k stacked individual parameters, then (with ``full``) the estimated network
weights ``w`` of the model (the same in every piece). In piece j the state's
sensitivities to ``phi_j`` and ``w`` are forced (``dS/dt = J S + df/dp``), those to
an earlier piece's ``phi_i`` are not: they only carry what piece i left. The
forward sensitivities integrate each column from its own start
(`ForwardSensitivity.prepare`'s ``s0``), so such a column is integrated as one of
``phi_j``'s first parameter started at the carried value, less that parameter's own
column started at zero (S is linear in its start; the two share every step, so the
difference is exact to rounding). Without pieces (J = 1) this is the plain solve.
"""

from dataclasses import dataclass

import numpy as np

from adjoints import ForwardSensitivity, Job, prepare_values
from sciml._validate import check_atol
from sciml.segments import doses_in, in_span, piece_problem, segments
from sciml.solvers import common
from sciml.solvers.kernels.observe import observe_along, observe_sensitivities

from .individual import SubjectIndividual

__all__ = ["SubjectFit"]

_SENS = ForwardSensitivity()


@dataclass
class Piece:
    """A stretch of a subject's record with one set of individual parameters: its span,
    the model parameters there before the individual function sets its own (``p``), the
    covariates the individual function sees (``cov``), the occasion (index among the
    subject's), the `adjoints.Job` of its solve (saving at its rows' times, and at its
    end unless it is the last) and the data rows it holds."""

    tspan: tuple
    p: np.ndarray
    cov: np.ndarray
    occasion: int
    job: object
    rows: np.ndarray
    last: bool


class SubjectFit:
    """A subject prepared for the likelihood (see the module docstring).

    Attributes
    ----------
    ind : individual.SubjectIndividual
        The individual function for this subject: ``Phi`` and its derivatives in the
        subject's random effects (its occasions' included).
    n_phi : int
        J k, the stacked individual parameters.
    n_occ : int
        The subject's occasions (1 without `occasion`).
    """

    def __init__(self, subject, model, individual, error_of_column, solver, rtol, atol,
                 max_steps, effects=None):
        data = getattr(subject, "data", None)
        prob = getattr(subject, "problem", None)
        if prob is None or data is None:
            raise ValueError(f"NLME: subject {getattr(subject, 'id', '?')!r} has no "
                             "observations (or is not a sciml.data.Subject)")
        if prob.events:
            raise ValueError(f"NLME: subject {subject.id!r}'s problem has events "
                             "(sciml.Event); sciml.nlme does not support them yet")
        if prob.model is not model:
            raise ValueError(f"NLME: subject {subject.id!r} was read with another model; read "
                             "the event table with the NLME's model")
        self.id = subject.id
        self.subject = subject
        self.model = model
        self.individual = individual
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
        self.obs_t = data.t
        self.prob = prob
        atol = check_atol(atol, model.n_states)
        self.pieces = _pieces(subject, prob, individual, effects, data.t, solver, rtol, atol,
                              max_steps)
        self.n_occ = 1 + max(pc.occasion for pc in self.pieces)
        self.obs_occ = np.zeros(self.y.shape[0], dtype=np.int64)  # each observation's
        # each piece's observations (indices into y) and their rows in its solve
        self._where = []
        for pc in self.pieces:
            sel = np.flatnonzero(np.isin(self.obs_q, pc.rows))
            self._where.append((sel, np.searchsorted(pc.rows, self.obs_q[sel]),
                                self.col[sel]))
            self.obs_occ[sel] = pc.occasion
        self.ind = SubjectIndividual(individual, np.array([pc.cov for pc in self.pieces]),
                                     None if effects is None else effects.maps(
                                         [pc.occasion for pc in self.pieces], self.n_occ))
        self.k = individual.index.shape[0]
        self.n_phi = self.k * len(self.pieces)
        self.kern = prob.kernel_table("obs", "obs_vjp") if self.kind == "observables" else None
        self.ws = model.workspace()
        # the prepared sensitivity solves (`ForwardSensitivity.prepare`) per piece: to the
        # individual parameters (the empirical Bayes iterations), and to them and the
        # estimated weights
        self._sens = {}
        self._last = None  # (key, result) of the last `predict`

    @property
    def cov(self):
        """The covariates of the first piece (the subject's at its start)."""
        return self.pieces[0].cov

    @property
    def job(self):
        """The first piece's `adjoints.Job` (the whole solve without pieces)."""
        return self.pieces[0].job

    def params(self, phi, weights=None, weight_index=None, piece=0):
        """The model's flat parameters in ``piece``: its parameters, with that piece's
        individual parameters from the stacked ``phi`` and, when given, network weights
        ``weights`` at ``weight_index``."""
        pc = self.pieces[piece]
        p = pc.p.copy()
        k = self.k
        p[self.individual.index] = phi[piece * k:(piece + 1) * k]
        if weights is not None:
            p[weight_index] = weights
        return p

    def predict(self, phi, sens=True, weights=None, weight_index=None, full=False):
        """``f`` (m,) and, with ``sens``, its derivatives at the stacked individual
        parameters ``phi`` (J k,): ``df/dPhi`` (m, J k), or with ``full`` ``df/dQ``
        (m, J k + n_w), the estimated weights' columns last (module docstring). The
        last call's result is kept: the same arguments again cost nothing."""
        wi = weight_index if (full and weights is not None) else None
        nw = 0 if wi is None else wi.shape[0]
        key = (sens, nw, phi.tobytes(), None if weights is None else weights.tobytes())
        if self._last is not None and self._last[0] == key:
            f, F = self._last[1]
            return f.copy(), (None if F is None else F.copy())
        if len(self.pieces) == 1:
            out = self._whole(phi, sens, weights, weight_index, wi)
        else:
            out = self._chained(phi, sens, weights, weight_index, wi)
        self._last = (key, out)
        f, F = out
        return f.copy(), (None if F is None else F.copy())

    def sensitivities(self, phi, weights=None, weight_index=None):
        """``df/dQ`` at ``phi`` as `predict` gives it with ``full``, not kept (the
        difference quotients' points, `derivatives.directional`, are seen once)."""
        wi = weight_index if weights is not None else None
        if len(self.pieces) == 1:
            return self._whole(phi, True, weights, weight_index, wi)[1]
        return self._chained(phi, True, weights, weight_index, wi)[1]

    # ---------------------------------------------------------------- one solve

    def _values(self, piece):
        run = self._sens.get((piece, "values"))
        if run is None:
            run = self._sens[(piece, "values")] = prepare_values(self.pieces[piece].job)
        return run

    def _run(self, piece, cols_key, cols):
        run = self._sens.get((piece, cols_key))
        if run is None:
            run = self._sens[(piece, cols_key)] = _SENS.prepare(self.pieces[piece].job, cols)
        return run

    def _whole(self, phi, sens, weights, weight_index, wi):
        """Without pieces: one solve over the whole record."""
        p = self.params(phi, weights, weight_index)
        model, idx = self.model, self.individual.index
        job = self.pieces[0].job
        if not sens:
            st = self._values(0)(p).check()
            U = st.u
            if self.kind == "states":
                return U[self.obs_q, self.col], None
            Y = np.empty((U.shape[0], model.n_obs))
            observe_along(self.kern, p, self.ws, Y, job.obs_t, U)
            return Y[self.obs_q, self.col], None
        cols = idx if wi is None else np.concatenate([idx, wi])
        st = self._run(0, cols.shape[0], cols)(p)
        U, S = st.u, st.S
        if self.kind == "states":
            return U[self.obs_q, self.col], np.ascontiguousarray(S[self.obs_q, self.col])
        m = self.y.shape[0]
        f = np.empty(m)
        F = np.empty((m, cols.shape[0]))
        observe_sensitivities(self.kern, p, self.ws, U, S, job.obs_t, self.obs_q, self.col,
                              np.empty(model.n_obs), f, F, cols)
        return f, F

    # ---------------------------------------------------------------- pieces

    def _chained(self, phi, sens, weights, weight_index, wi):
        """Piece by piece, the state (and the sensitivities in Q) carried across."""
        model, idx, k = self.model, self.individual.index, self.k
        n = model.n_states
        nw = 0 if wi is None else wi.shape[0]
        nq = self.n_phi + nw
        m = self.y.shape[0]
        f = np.empty(m)
        F = np.zeros((m, nq)) if sens else None
        u0 = None
        carry = None  # (n, nq): dU/dQ at the piece's start
        for j, pc in enumerate(self.pieces):
            p = self.params(phi, weights, weight_index, j)
            sel, rows, col = self._where[j]  # this piece's observations, their rows in its solve
            if not sens:
                st = self._values(j)(p, u0).check()
                U = st.u
                f[sel] = self._observe(p, pc, U, rows, col)
            else:
                # columns: phi_j (forced; S0 = 0, or du0/dp in the first piece), w (forced,
                # carried), each earlier phi_i (phi_j's first parameter from the carried
                # value, less phi_j's first column)
                cols = np.concatenate([idx] + ([wi] if nw else []) + [np.full(j * k, idx[0])])
                run = self._run(j, nw, cols)
                if j == 0:
                    st = run(p)
                else:
                    s0 = np.zeros((n, cols.shape[0]))
                    if nw:
                        s0[:, k:k + nw] = carry[:, self.n_phi:]
                    s0[:, k + nw:] = carry[:, :j * k]
                    st = run(p, u0=u0, s0=s0)
                U, S = st.u, st.S
                SQ = np.zeros(S.shape[:2] + (nq,))
                SQ[:, :, j * k:(j + 1) * k] = S[:, :, :k]
                if nw:
                    SQ[:, :, self.n_phi:] = S[:, :, k:k + nw]
                SQ[:, :, :j * k] = S[:, :, k + nw:] - S[:, :, :1]
                direct = np.full(nq, -1, dtype=np.int64)  # the model parameter of a column
                direct[j * k:(j + 1) * k] = idx
                if nw:
                    direct[self.n_phi:] = wi
                f[sel], F[sel] = self._observe_sens(p, pc, U, SQ, rows, col, direct)
                carry = SQ[-1]
            u0 = U[-1]
        return f, F

    def _observe(self, p, pc, U, rows, col):
        if self.kind == "states":
            return U[rows, col]
        Y = np.empty((U.shape[0], self.model.n_obs))
        observe_along(self.kern, p, self.ws, Y, pc.job.obs_t, U)
        return Y[rows, col]

    def _observe_sens(self, p, pc, U, SQ, rows, col, direct):
        """``(f, dF/dQ)`` of the observations at ``rows`` (observables ``col``) of a piece:
        ``dh/du SQ + dh/dp`` (the last on the columns with a model parameter, ``direct >=
        0``)."""
        if self.kind == "states":
            return U[rows, col], SQ[rows, col]
        f = np.empty(rows.shape[0])
        F = np.empty((rows.shape[0], SQ.shape[2]))
        observe_sensitivities(self.kern, p, self.ws, U, SQ, pc.job.obs_t, rows, col,
                              np.empty(self.model.n_obs), f, F, direct)
        return f, F


def _pieces(subject, prob, individual, effects, obs_t, solver, rtol, atol, max_steps):
    """The `Piece` s of a subject (see the module docstring)."""
    model = prob.model
    t0, tf = prob.tspan
    idx = set(int(i) for i in individual.index)
    for ch in prob.changes:
        if isinstance(ch.time, str):
            raise ValueError(f"NLME: subject {subject.id!r} has a sciml.Change at a time "
                             f"given by parameter {ch.time!r}; sciml.nlme takes changes at "
                             "fixed times")
        both = [n for n in ch.params if model.param_slices[n].start in idx]
        if both:
            raise ValueError(f"NLME: subject {subject.id!r} has a sciml.Change of {both[0]!r} "
                             f"at t = {float(ch.time):g}, a parameter `individual` sets; let "
                             "`individual` read the covariate instead (cov.NAME, "
                             "read_events(..., time_varying=True))")
    series = getattr(subject, "covariate_series", None) or {}
    used = [name for name in individual.covariates if name in series]
    times = {float(t) for name in used for t in series[name][0]}
    occ_times, occ_at = (set(), None) if effects is None else effects.occasions(subject)
    times |= occ_times
    times |= {float(ch.time) for ch in prob.changes}
    bounds = [t0, *sorted(t for t in times if t0 < t < tf), tf]
    segs = segments(prob, prob.params)  # the problem's own changes
    seg_start = np.array([s.tspan[0] for s in segs])
    out = []
    for j in range(len(bounds) - 1):
        lo, hi = bounds[j], bounds[j + 1]
        last = j == len(bounds) - 2
        seg = segs[int(np.searchsorted(seg_start, lo, side="right")) - 1]
        rows = np.flatnonzero(in_span(obs_t, lo, hi, last))
        save = obs_t[rows] if last else np.append(obs_t[rows], hi)
        q = prob if len(bounds) == 2 else piece_problem(
            prob, (lo, hi), seg.p, doses_in(prob.doses, lo, hi, last), None)
        job = Job(q, seg.p.copy(), common.schedule(q), solver, rtol, atol, None, max_steps,
                  np.ascontiguousarray(save, dtype=np.float64))
        cov = individual.covariate_vector(subject, lo)
        occ = 0 if occ_at is None else occ_at(lo)
        out.append(Piece((lo, hi), seg.p.copy(), cov, occ, job, rows, last))
    return out
