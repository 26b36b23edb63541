"""The primal solve every method starts from, and what one gradient's setting is.

`Job` holds what one (problem, data) gradient needs; `forward` solves the
problem with the solver's compiled loop, saving at the observation times and,
when asked, storing every step for the backward pass (`State`). Buffers are
sized here, once per call; the compiled loops allocate nothing per step.
"""

from dataclasses import dataclass

import numpy as np

from sciml._jit import compiled, entry_point
from sciml.solvers import common
from sciml.solvers.base import STATUS_TEXT, SUCCESS
from sciml.solvers.kernels.family import FAMILIES
from sciml.solvers.kernels.structs import S_NACC, record


class SolveFailed(RuntimeError):
    """A forward or backward solve of a gradient computation did not reach its end."""


@dataclass
class Job:
    """One gradient's setting: problem, parameters, solver, tolerances, observation times.

    Public as ``adjoints.Job``: with `values` and `ForwardSensitivity.prepare` it is how
    code that solves one problem many times (a population model's subjects) runs the
    compiled loops without building a setting per solve. ``sched`` is
    ``sciml.solvers.common.schedule(prob)``, ``atol`` an (n_states,) array, ``dt`` the
    first step (None: estimated), ``obs_t`` the sorted times the states are saved at.
    """

    prob: object
    p: np.ndarray
    sched: common.Schedule
    solver: object
    rtol: float
    atol: np.ndarray
    dt: float | None
    max_steps: int
    obs_t: np.ndarray

    @property
    def model(self):
        return self.prob.model

    @property
    def n(self):
        return self.model.n_states

    @property
    def n_params(self):
        return self.model.n_params

    @property
    def stiff(self):
        return self.solver.stiff

    def table(self, *needs):
        """The problem's kernel table with the solver's kernels and ``needs`` compiled."""
        return self.prob.kernel_table(*dict.fromkeys(self.solver.kernels(self.model) + needs))

    def linear(self):
        """Fresh buffers of the solver's linear solves for this model (None: explicit)."""
        return common.linear_algebra(self.model, self.solver.linsolve) if self.stiff else None

    def system(self, *needs):
        """The problem's forward system (`sciml.solvers.kernels.system.Forward`)."""
        return common.forward_system(self.table(*needs), self.p, self.sched, self.n,
                                     self.stiff, self.linear())

    def control(self):
        return self.solver.control(self.rtol, self.atol, self.dt, self.max_steps)


@dataclass
class State:
    """A forward solve: states at the observation times ``u`` (T, n), the status, the time
    reached, and for the backward passes the system, tableau and record that made them
    (stored steps when asked: ``n_steps`` of them), and the final state."""

    u: np.ndarray
    status: int
    t_end: float
    sys: object
    tab: object
    rec: object
    n_steps: int
    z_end: np.ndarray

    def check(self):
        if self.status != SUCCESS:
            raise SolveFailed(f"the forward solve stopped at t = {self.t_end:g}: "
                              f"{STATUS_TEXT.get(self.status, self.status)}")
        return self


def forward(job, dense, needs=(), u0=None):
    """The problem solved at the observation times (every step stored when ``dense``), from
    ``u0`` (default: the problem's initial state at ``job.p``)."""
    sys = job.system(*needs)
    tab = job.solver.engine_tableau()
    ctl = job.control()
    z = job.prob.initial_state(job.p) if u0 is None else np.array(u0, dtype=np.float64)
    if dense:  # the same loop as without: its record's types are the same (one compile)
        cap = common.capacity(job.sched, job.max_steps, None if job.solver.adaptive else job.dt)
        rec = record(job.n, job.obs_t, dense=True, rows=FAMILIES[type(tab)].store_rows(tab),
                     cap=cap)
    else:
        rec = record(job.n, job.obs_t)
    status, t_end, rec = job.solver._loop()(sys, tab, ctl, job.sched.stops, z, rec)
    n_steps = int(rec.stats[S_NACC]) if dense else 0
    return State(rec.save_z, int(status), float(t_end), sys, tab, rec, n_steps, z)


def values(job, u0=None):
    """The `State` at the observation times ``job.obs_t`` (``.u``: (T, n_states); no
    per-step storage): what a loss alone needs. ``u0``: the state to start from (default:
    the problem's initial state at ``job.p``). Public as ``adjoints.values``; call
    ``.check()`` on the result to raise `SolveFailed` where the solve stopped early."""
    return forward(job, dense=False, u0=u0)


def prepare_values(job):
    """``run(p, u0=None) -> State``: `values` of ``job`` at parameters ``p`` (from ``u0``,
    default the problem's initial state), its system, control and tableau built once (for
    many solves of one problem: a population model's sampler or simulations). The
    returned states share the system, whose parameters the next call overwrites. Public
    as ``adjoints.prepare_values``."""
    p_buf = np.array(job.p, dtype=np.float64)  # the system reads it: updated in place
    sys = common.forward_system(job.table(), p_buf, job.sched, job.n, job.stiff,
                                job.linear())
    tab, ctl, loop = job.solver.engine_tableau(), job.control(), job.solver._loop()
    stops = job.sched.stops
    call = Entry(loop)

    def run(p, u0=None):
        p_buf[:] = p
        z = job.prob.initial_state(p_buf) if u0 is None else np.array(u0, dtype=np.float64)
        rec = record(job.n, job.obs_t)
        status, t_end, _ = call(sys, tab, ctl, stops, z, rec)
        return State(rec.save_z, int(status), float(t_end), sys, tab, rec, 0, z)

    return run


class Entry:
    """A compiled loop called again and again with arguments of the same types: the first
    call goes through the numba dispatcher, the second finds the compiled entry for
    those types (`entry_point`) and every later call runs it directly. Not found at the
    first call: working out the types of the nested structures costs more than a small
    model's whole gradient, which calls once."""

    def __init__(self, loop):
        self.loop = loop
        self.fn = None
        self.called = False

    def __call__(self, *args):
        if self.fn is None:
            if not self.called:
                self.called = True
                return self.loop(*args)
            fn = entry_point(self.loop, args)
            if not compiled(fn):  # interpreted while it compiles: ask again next time
                return fn(*args)
            self.fn = fn
        return self.fn(*args)
