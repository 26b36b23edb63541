"""The forward pass every method starts from: one ERK solve into caller-visible storage.

`Job` holds what one (problem, data) gradient needs; `forward` runs the
model's compiled `erk_solve` on any schedule (the problem's, or one
checkpoint interval of it) and keeps the per-step storage the backward
passes read. Buffers are sized here, once per call; the compiled loops
allocate nothing.
"""

from dataclasses import dataclass

import numpy as np

from sciml.solvers import common
from sciml.solvers.base import NEED_STORAGE, STATUS_TEXT, SUCCESS
from sciml.solvers.erk import ExplicitRK


@dataclass
class Job:
    """One gradient's setting: problem arrays, solver, tolerances, observation times."""

    model: object
    u0: np.ndarray
    p: np.ndarray
    sched: common.Schedule
    solver: ExplicitRK
    rtol: float
    atol: np.ndarray
    dt: float | None
    max_steps: int
    obs_t: np.ndarray
    ws: np.ndarray
    prob: object = None  # the ODEProblem (its params may differ from p)

    @property
    def mod(self):
        return self.model.module

    @property
    def n(self):
        return self.model.n_states

    @property
    def n_params(self):
        return self.model.n_params

    def tableau(self):
        """(A, b, e, c, P, n_step, end_stage) of the solver."""
        A, b, e, c, P, n_step, end_stage, _, _ = self.solver._tableau_args()
        return A, b, e, c, P, n_step, end_stage


@dataclass
class Forward:
    """A forward solve: states at ``save_t`` and, when dense, the stored steps
    (``n_steps`` of them; 0 and empty arrays when not dense)."""

    save_t: np.ndarray
    u: np.ndarray
    status: int
    t_end: float
    d_t: np.ndarray
    d_u: np.ndarray
    d_k: np.ndarray
    d_have: np.ndarray
    d_seg: np.ndarray
    n_steps: int
    stats: np.ndarray

    def check(self):
        if self.status != SUCCESS:
            raise SolveFailed(f"the forward solve stopped at t = {self.t_end:g}: "
                              f"{STATUS_TEXT.get(self.status, self.status)}")
        return self


class SolveFailed(RuntimeError):
    """A forward or backward solve of a gradient computation did not reach its end."""


_NO_INT = np.zeros(0, dtype=np.int64)
_NO_FLOAT = np.zeros(0)


def forward(job, u0, stops, seg_rate, bolus_k, bolus_i, bolus_a, save_t, dense):
    """Run `erk_solve` of the job's model from ``u0`` over ``stops``; grow storage as needed."""
    solver = job.solver
    n, s_all = job.n, solver.tableau.n_stages
    fixed_dt = None if solver.adaptive else job.dt
    sched = common.Schedule(stops, seg_rate, bolus_k, bolus_i, bolus_a)
    cap = common.initial_capacity(sched, job.max_steps, fixed_dt) if dense else 0
    rtol, atol, *ctrl = solver._ctrl_args(job.rtol, job.atol)
    K = np.zeros((s_all, n))
    W = np.zeros((4, n))
    stats = np.zeros(4, dtype=np.int64)
    out_u = np.zeros((save_t.shape[0], n))
    while True:
        d_t, d_u = np.zeros(cap + 1), np.zeros((cap + 1, n))
        d_k = np.zeros((cap, s_all, n))
        d_have, d_seg = np.zeros(cap, dtype=np.int8), np.zeros(cap, dtype=np.int64)
        status, t_end = job.mod.erk_solve(
            *solver._tableau_args(), u0, job.p, job.ws, stops, seg_rate, bolus_k, bolus_i,
            bolus_a, False, save_t, _NO_FLOAT, out_u, rtol, atol, float(job.dt or 0.0),
            job.max_steps, *ctrl, dense, d_t, d_u, d_k, d_have, d_seg, K, W, stats)
        if status != NEED_STORAGE:
            break
        cap = common.grown_capacity(cap, t_end, sched, job.max_steps)
    return Forward(save_t, out_u, int(status), float(t_end), d_t, d_u, d_k, d_have, d_seg,
                   int(stats[1]) if dense else 0, stats.copy())


def forward_problem(job, save_t, dense):
    """`forward` over the job's whole schedule."""
    s = job.sched
    return forward(job, job.u0, s.stops, s.seg_rate, s.bolus_k, s.bolus_i, s.bolus_a, save_t,
                   dense)


def segment_rate(sched, t):
    """The infusion-rate row of the segment holding time ``t`` (as a (1, n) array)."""
    k = int(np.searchsorted(sched.stops, t, side="right")) - 1
    k = min(max(k, 0), sched.seg_rate.shape[0] - 1)
    return sched.seg_rate[k:k + 1]


def rodas_forward(job, dense):
    """The problem solved by the job's Rosenbrock solver at the observation times.

    With ``dense`` the result carries ``ros`` = (ts, us, kd), the stored steps.
    """
    prob = job.prob if job.p is job.prob.params else job.prob.remake(params=job.p)
    raw = job.solver._run(prob, job.obs_t, job.rtol, job.atol, job.dt, job.max_steps, dense)
    fw = Forward(job.obs_t, raw.u, raw.status, raw.t_end, None, None, None, None, None, 0,
                 None)  # (the Rosenbrock steps are in `ros`, not in the ERK fields)
    fw.ros = raw.dense
    return fw


def values(job):
    """States at the observation times (no per-step storage): what a loss alone needs."""
    if isinstance(job.solver, ExplicitRK):
        return forward_problem(job, job.obs_t, dense=False)
    return rodas_forward(job, dense=False)
