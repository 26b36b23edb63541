"""Python side of what every solver shares: the dose schedule and the forward system.

`schedule` turns a problem's doses into the arrays the compiled loops read;
`forward_system` binds a problem's model and parameters to them
(`kernels.system.Forward`). Everything here runs once per solve, outside the
compiled loop.
"""

from dataclasses import dataclass

import numpy as np

from .kernels import krylov
from .kernels.structs import BoundModel, Lin, lin
from .kernels.system import Forward, Infused

_NO_INT = np.zeros(0, dtype=np.int64)
_NO_FLOAT = np.zeros(0)
_NO_LIN = Lin(np.zeros((0, 0)), np.zeros((0, 0)), _NO_INT, np.zeros((0, 0)), _NO_INT, _NO_FLOAT)


@dataclass
class Schedule:
    """Stops, per-segment infusion rates and boluses of one problem over its tspan.

    stops : (m + 1,) float64 -- t0, dose boundaries and tstops inside the span, tf
    seg_rate : (m, n) float64 -- infusion rate added to du/dt on [stops[k], stops[k+1])
    bolus_k, bolus_i : (nb,) int64 -- stop index and state index of each bolus
    bolus_a : (nb,) float64 -- amounts
    """

    stops: np.ndarray
    seg_rate: np.ndarray
    bolus_k: np.ndarray
    bolus_i: np.ndarray
    bolus_a: np.ndarray

    @property
    def n_segments(self):
        return self.stops.shape[0] - 1

    @property
    def has_rate(self):
        return bool(np.any(self.seg_rate))

    def bolus_offsets(self):
        """(m + 2,) int64: the boluses of stop k are ``bolus_off[k]:bolus_off[k + 1]``
        (empty when there are none)."""
        if self.bolus_k.size == 0:
            return _NO_INT
        counts = np.bincount(self.bolus_k, minlength=self.stops.shape[0])
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def schedule(prob):
    """The `Schedule` of an `ODEProblem` (doses after ``tf`` are dropped; `ODEProblem` refuses
    those before ``t0``).

    Dose times come from the same float arrays as the stops, so matching them
    by equality is exact: a bolus at ``t`` is applied on arrival at the stop
    ``t``, an infusion is active on exactly the segments it covers.
    """
    t0, tf = prob.tspan
    da = prob.dose_arrays
    n = prob.model.n_states
    if da.tstops.size == 0:  # no doses, no tstops: the common case, made cheap
        return Schedule(np.array([t0, tf]), np.zeros((1, n)), _NO_INT, _NO_INT, _NO_FLOAT)
    inner = da.tstops[(da.tstops > t0) & (da.tstops < tf)]
    stops = np.concatenate([[t0], inner, [tf]]).astype(np.float64)
    starts = stops[:-1]
    seg_rate = np.zeros((starts.shape[0], n))
    for a, b, i, r in zip(da.inf_t0, da.inf_t1, da.inf_i, da.inf_rate):
        seg_rate[(a <= starts) & (starts < b), i] += r
    keep = (da.bolus_t >= t0) & (da.bolus_t <= tf)
    bolus_k = np.searchsorted(stops, da.bolus_t[keep]).astype(np.int64)
    assert np.array_equal(stops[bolus_k], da.bolus_t[keep]), "bolus time missing from stops"
    return Schedule(stops, seg_rate, bolus_k, da.bolus_i[keep].astype(np.int64),
                    da.bolus_a[keep].astype(np.float64))


LINSOLVES = ("auto", "dense", "sparse", "banded", "krylov")

# "auto" factors densely below this many states (Robertson blocks: equal at 3 states, the
# sparse LU 2x faster at 30 and 5x at 90, on these machines)
AUTO_SPARSE_MIN = 16
# ... and above it while the sparse factors would hold more than this share of n^2
AUTO_SPARSE_FILL = 0.25


def linsolve_kind(model, linsolve):
    """``"dense"``, ``"sparse"`` or ``"banded"``: what `linear_algebra` builds for ``model``
    when a solver asks for ``linsolve`` (one of `LINSOLVES`)."""
    if linsolve == "dense":
        return "dense"
    n = model.n_states
    if linsolve == "auto" and n < AUTO_SPARSE_MIN:
        return "dense"
    if not model._sparse_jacobian():
        if linsolve != "auto":
            raise ValueError(f"linsolve={linsolve!r} needs the Jacobian's values on its sparsity "
                             "pattern: a model from hand-written kernels has only the dense "
                             "Jacobian; use 'dense'")
        return "dense"
    if linsolve in ("sparse", "banded", "krylov"):
        return linsolve
    return "sparse" if model._sparse_lu().idx.shape[0] <= AUTO_SPARSE_FILL * n * n \
        else "dense"


def linear_algebra(model, linsolve):
    """Fresh buffers of the implicit steps' linear solves for ``model``: a dense
    `kernels.structs.Lin`, or a `kernels.sparse.SparseLU` on the model's pattern (its
    analysis shared, its values this solve's own)."""
    n = model.n_states
    mass = _NO_FLOAT if model.mass_matrix is None else model.mass_matrix
    kind = linsolve_kind(model, linsolve)
    if kind == "dense":
        return lin(n, mass)
    s = model._sparse_lu({"banded": "rcm", "krylov": "ilu0"}.get(kind, "mmd"))
    nnz = s.idx.shape[0]
    s = s._replace(Jx=np.zeros(s.jidx.shape[0]), mass=mass, LU1=np.zeros(nnz),
                   LU2=np.zeros(nnz), w=np.zeros(n), mark=np.zeros_like(s.mark))
    return krylov.build(s) if kind == "krylov" else s


def consistent(model, u0, p, t0, tol=1e-12, max_iter=50):
    """``u0`` with its algebraic states (zero rows of the mass matrix) solved from
    ``0 = f_alg(u, p, t0)`` by Newton on their block of the Jacobian, the differential
    states kept (u0 itself when the model is an ODE)."""
    mass = model.mass_matrix
    if mass is None:
        return u0
    alg = np.flatnonzero(mass == 0.0)
    if alg.size == 0:
        return u0
    z = np.array(u0, dtype=np.float64)
    for _ in range(max_iter):
        r = model.rhs(z, p, t0)[alg]
        if np.all(np.abs(r) <= tol * (1.0 + np.abs(z[alg]))):
            return z
        J = model.spjac(z, p, t0) if model._sparse_jacobian() else model.jac(z, p, t0)
        Jaa = J[alg][:, alg]
        if hasattr(Jaa, "toarray"):
            Jaa = Jaa.toarray()
        z[alg] -= np.linalg.solve(Jaa, r)
    raise ValueError(f"the initial values of the algebraic states {alg.tolist()} could not "
                     "be made consistent (0 = f_alg by Newton did not converge): check u0 "
                     "and that the DAE is index 1 (df_alg/du_alg invertible)")


def forward_system(table, params, sched, n, stiff=False, linear=None):
    """The problem's ODE as the loops integrate it (`kernels.system.Forward`).

    ``table`` : the kernel table; ``params`` : the flat parameters; ``stiff`` :
    with the implicit steps' linear-algebra buffers, ``linear`` (`linear_algebra`;
    dense when not given).
    """
    m = BoundModel(table, params, np.zeros(max(int(table[0]), 1)))
    la = (linear if linear is not None else lin(n)) if stiff else _NO_LIN
    parts = (m, sched.bolus_offsets(), sched.bolus_i, sched.bolus_a, la)
    if sched.has_rate:
        return Infused(*parts, np.ascontiguousarray(sched.seg_rate))
    return Forward(*parts)


def capacity(sched, max_steps, dt=None):
    """Steps to reserve for per-step storage: exact for a fixed step ``dt``, a guess for
    adaptive solves (the loops grow their storage when it runs out)."""
    span = sched.stops[-1] - sched.stops[0]
    if dt is not None:
        need = int(np.ceil(span / dt * (1 + 1e-12))) + 2 * sched.n_segments + 1
    else:
        need = 64 + 4 * sched.n_segments
    return max(1, min(need, max_steps + 1))
