"""Setting up and running a backward solve: its schedule, its shared data, and the one-call entries.

`backward_schedule` turns the forward stops and the observation times into the
backward stops (in ``tau = -t``), the observation row at each of them and the
forward segment of each backward segment. `adjoint_data` builds the
`systems.Adjoint` every backward system holds.

The lean entries (`grad_discrete`, `grad_interp`, `grad_interp_checkpointed`,
`grad_gauss`, and `grad_discrete_many` in parallel threads) are
`sciml.loss_and_grad`'s common case in one compiled call: one problem without
doses, a sum of squares on states, an explicit RK solver. Each runs the
forward solve with its steps stored (with checkpoints: interval by interval),
the loss and its jumps, and the backward pass. The helpers between an entry and a
loop are inlined into the entry (``inline="always"``): as a function of its own each
would optimise the loop it links once more (see `sciml.solvers.kernels.family`); on a
first interpolating-adjoint gradient that halved the compile time.
"""

import math

import numpy as np
from numba import prange

from sciml._jit import jit, pjit
from sciml.solvers.kernels.calls import K_WS
from sciml.solvers.kernels.control import SUCCESS
from sciml.solvers.kernels.family import integrate, integrate_stored
from sciml.solvers.kernels.structs import S_NACC, S_NFEV, BoundModel, Control, Lin, Record
from sciml.solvers.kernels.system import Forward

from .discrete import erk_reverse
from .systems import ROWS, Adjoint, Gauss, Interp

# The schedules are plain loops: numba's np.unique, np.searchsorted and boolean masks each
# compile a generic implementation (quicksort among them), which a first gradient waits for.


@jit(inline="always")
def _union(a, b):
    """The distinct values of ``a`` and ``b``, increasing: one merge pass, as both come
    sorted (the forward stops, the observation times), then an insertion pass (one
    comparison a value when they did) and duplicates dropped: ``np.unique`` of both."""
    na, nb = a.shape[0], b.shape[0]
    out = np.empty(na + nb)
    i = j = 0
    for k in range(na + nb):
        if j >= nb or (i < na and a[i] <= b[j]):
            out[k] = a[i]
            i += 1
        else:
            out[k] = b[j]
            j += 1
    for k in range(1, na + nb):
        v = out[k]
        q = k - 1
        while q >= 0 and out[q] > v:
            out[q + 1] = out[q]
            q -= 1
        out[q + 1] = v
    n = 0
    for k in range(na + nb):
        if n == 0 or out[k] != out[n - 1]:
            out[n] = out[k]
            n += 1
    return out[:n]


@jit(inline="always")
def _bisect(a, x, right):
    """Where ``x`` goes in the increasing ``a``: ``np.searchsorted(a, x, side)``, side
    "right" if ``right``."""
    lo, hi = 0, a.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x or (right and a[mid] == x):
            lo = mid + 1
        else:
            hi = mid
    return lo


@jit
def backward_schedule(fstops, obs_t):
    """``(stops, jump, fseg)`` of a backward solve over the forward stops ``fstops``.

    stops (m + 1,) : the times, observations included, negated and increasing;
    jump (m + 1,) int64 : the observation row at each stop, -1 for none;
    fseg (m,) int64 : the forward segment each backward segment lies in.
    """
    times = _union(fstops, obs_t)
    t0, tf = fstops[0], fstops[fstops.shape[0] - 1]
    times = times[_bisect(times, t0, False):_bisect(times, tf, True)]
    m = times.shape[0] - 1
    stops = np.empty(m + 1)
    jump = np.empty(m + 1, dtype=np.int64)
    for k in range(m + 1):
        stops[k] = -times[m - k]
        jump[k] = -1
    for q in range(obs_t.shape[0]):
        jump[m - _bisect(times, obs_t[q], False)] = q
    fseg = np.zeros(max(m, 0), dtype=np.int64)
    nseg = fstops.shape[0] - 1
    for k in range(m):
        s = _bisect(fstops, times[m - k - 1], True) - 1
        fseg[k] = min(max(s, 0), nseg - 1)
    return stops, jump, fseg


@jit(inline="always")
def adjoint_data(m, fsys, ftab, frec, n_steps, fseg, jump, G, lin):
    """The `systems.Adjoint` of a backward solve (scratch allocated here)."""
    n = G.shape[1]
    width = max(n, len(ftab.c)) + 1
    return Adjoint(m, fsys, ftab, frec, n_steps, fseg, jump, G, np.zeros((ROWS, width)),
                   np.zeros(m.p.shape[0]), np.zeros(1, dtype=np.int64), lin, np.zeros(3))


@jit
def sse_jumps(U, Yd, Wd, cols, n):
    """``(loss, G)``: ``sum Wd * (U[:, cols] - Yd)**2`` and its gradient as jumps (T, n)."""
    T = U.shape[0]
    G = np.zeros((T, n))
    loss = 0.0
    for q in range(T):
        for j in range(cols.shape[0]):
            r = U[q, cols[j]] - Yd[q, j]
            wr = Wd[q, j] * r
            loss += wr * r
            G[q, cols[j]] += 2.0 * wr
    return loss, G


@jit(inline="always")
def _plain_system(kern, p):
    """``(model, forward system)`` of a plain problem: no doses, no Rosenbrock buffers."""
    m = BoundModel(kern, p, np.zeros(max(kern[K_WS], 1)))
    no_i = np.zeros(0, dtype=np.int64)
    no2 = np.zeros((0, 0))
    return m, Forward(m, no_i, no_i, np.zeros(0), Lin(no2, no2, no_i, no2, no_i, np.zeros(0)))


@jit(inline="always")
def _forward(kern, tab, ctl, u0, p, span, obs_t):
    """The forward half of a lean gradient: the plain problem solved with its steps stored."""
    n = u0.shape[0]
    m, fsys = _plain_system(kern, p)
    stops = np.empty(2)
    stops[0] = span[0]
    stops[1] = span[1]
    status, t, rec, z = integrate_stored(fsys, tab, ctl, stops, u0, obs_t, 64)
    return status, m, fsys, stops, rec, int(rec.stats[S_NACC]), n


@jit
def grad_discrete(kern, tab, ctl, u0, p, span, data, grad, stats):
    """Loss and gradient by the discrete adjoint; ``data = (obs_t, Yd, Wd, cols)``.

    Returns ``(status, loss)``: 0 or the failing solve's status; ``grad`` (n_params,)
    written. stats (3,) int64: forward accepted steps, backward evaluations, steps.
    """
    obs_t, Yd, Wd, cols = data
    status, m, fsys, stops, rec, n_steps, n = _forward(kern, tab, ctl, u0, p, span, obs_t)
    stats[0] = n_steps
    if status != SUCCESS:
        return status, math.inf
    loss, G = sse_jumps(rec.save_z, Yd, Wd, cols, n)
    for i in range(grad.shape[0]):
        grad[i] = 0.0
    erk_reverse(m, tab, rec, n_steps, obs_t, G, np.zeros(n), grad)
    return SUCCESS, loss


@jit(inline="always")
def _backward(sys, tab, ctl_b, stops_b, z, stats):
    no_f = np.zeros(0)
    rec = Record(no_f, np.zeros((0, z.shape[0])), False, no_f, False, no_f,
                 np.zeros((0, z.shape[0])), np.zeros((0, 0, z.shape[0])),
                 np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64),
                 np.zeros(6, dtype=np.int64))
    status, t, _ = integrate(sys, tab, ctl_b, stops_b, z, rec)
    stats[1] = rec.stats[S_NFEV]
    stats[2] = rec.stats[S_NACC]
    return status


@jit(inline="always")
def first_step(ctl, rec, n_steps):
    """``ctl`` with the first step of a backward solve: the forward's last step."""
    h0 = rec.d_t[n_steps] - rec.d_t[n_steps - 1] if n_steps > 0 else 0.0
    return Control(ctl.rtol, ctl.atol, ctl.safety, ctl.qmin, ctl.qmax, ctl.beta1, ctl.beta2,
                   ctl.max_steps, h0, ctl.adaptive)


@jit(inline="always")
def _interp_back(m, fsys, tab, ctl_b, rec, n_steps, stops, obs_t, G, z, stats):
    """The interpolating adjoint back over one stored forward solve: ``z = [lambda, mu]``
    in and out."""
    stops_b, jump, fseg = backward_schedule(stops, obs_t)
    a = adjoint_data(m, fsys, tab, rec, n_steps, fseg, jump, G, fsys.lin)
    return _backward(Interp(a), tab, first_step(ctl_b, rec, n_steps), stops_b, z, stats)


@jit
def grad_interp(kern, tab, ctl, ctl_b, u0, p, span, data, grad, stats):
    """`grad_discrete` by the interpolating adjoint (backward control ``ctl_b``)."""
    obs_t, Yd, Wd, cols = data
    status, m, fsys, stops, rec, n_steps, n = _forward(kern, tab, ctl, u0, p, span, obs_t)
    stats[0] = n_steps
    if status != SUCCESS:
        return status, math.inf
    loss, G = sse_jumps(rec.save_z, Yd, Wd, cols, n)
    z = np.zeros(n + p.shape[0])
    status = _interp_back(m, fsys, tab, ctl_b, rec, n_steps, stops, obs_t, G, z, stats)
    for i in range(grad.shape[0]):
        grad[i] = z[n + i]
    return status, loss


@jit
def grad_interp_checkpointed(kern, tab, ctl, ctl_b, u0, p, span, data, grad, stats):
    """`grad_interp` with checkpoints at the observation times: a forward solve keeping
    only the states there, then, last interval first, each interval re-solved with its
    steps stored and integrated back (memory: the steps of one interval)."""
    obs_t, Yd, Wd, cols = data
    n = u0.shape[0]
    breaks = _union(np.array([span[0], span[1]]), obs_t)
    nb = breaks.shape[0]
    m, fsys = _plain_system(kern, p)
    no_i = np.zeros(0, dtype=np.int64)
    no_f = np.zeros(0)
    ub = np.zeros((nb, n))
    rec = Record(breaks, ub, False, no_f, False, no_f, np.zeros((0, n)), np.zeros((0, 0, n)),
                 np.zeros(0, dtype=np.int8), no_i, np.zeros(6, dtype=np.int64))
    stops = np.array([span[0], span[1]])
    status, t, _ = integrate(fsys, tab, ctl, stops, u0.copy(), rec)
    if status != SUCCESS:
        return status, math.inf
    at_obs = np.empty((obs_t.shape[0], n))
    for q in range(obs_t.shape[0]):
        at_obs[q] = ub[_bisect(breaks, obs_t[q], False)]
    loss, G = sse_jumps(at_obs, Yd, Wd, cols, n)
    z = np.zeros(n + p.shape[0])
    stats[0] = 0
    for i in range(nb - 2, -1, -1):
        lo, hi = breaks[i], breaks[i + 1]
        # the observations in (lo, hi], and at lo for the first interval
        qa = _bisect(obs_t, lo, True) if i > 0 else 0
        qb = _bisect(obs_t, hi, True)
        stops[0], stops[1] = lo, hi
        obs_i = np.ascontiguousarray(obs_t[qa:qb])
        status, t, rec_i, _ = integrate_stored(fsys, tab, ctl, stops, ub[i], obs_i, 64)
        if status != SUCCESS:
            return status, math.inf
        n_steps = int(rec_i.stats[S_NACC])
        stats[0] += n_steps
        status = _interp_back(m, fsys, tab, ctl_b, rec_i, n_steps, stops, obs_i,
                              np.ascontiguousarray(G[qa:qb]), z, stats)
        if status != SUCCESS:
            return status, loss
    for i in range(grad.shape[0]):
        grad[i] = z[n + i]
    return SUCCESS, loss


@jit
def grad_gauss(kern, tab, ctl, ctl_b, nodes, u0, p, span, data, grad, stats):
    """`grad_discrete` by the Gauss adjoint; ``nodes = (qx, qw)`` on [0, 1]."""
    obs_t, Yd, Wd, cols = data
    status, m, fsys, stops, rec, n_steps, n = _forward(kern, tab, ctl, u0, p, span, obs_t)
    stats[0] = n_steps
    if status != SUCCESS:
        return status, math.inf
    loss, G = sse_jumps(rec.save_z, Yd, Wd, cols, n)
    stops_b, jump, fseg = backward_schedule(stops, obs_t)
    a = adjoint_data(m, fsys, tab, rec, n_steps, fseg, jump, G, fsys.lin)
    for i in range(grad.shape[0]):
        grad[i] = 0.0
    z = np.zeros(n)
    status = _backward(Gauss(a, grad, nodes[0], nodes[1]), tab, first_step(ctl_b, rec, n_steps),
                       stops_b, z, stats)
    return status, loss


@pjit
def grad_discrete_many(kern, tab, ctl, U0, Pm, spans, data, o_off, grads, losses, status):
    """`grad_discrete` for many problems of one model in parallel threads (a row each).

    U0 (m, n), Pm (m, n_params), spans (m, 2); problem i owns rows
    ``o_off[i]:o_off[i+1]`` of the concatenated ``data``. Writes ``grads`` (m, n_params),
    ``losses`` and ``status`` (m,); the caller sums them in a fixed order.
    """
    obs_t, Yd, Wd, cols = data
    for i in prange(U0.shape[0]):
        st = np.zeros(3, dtype=np.int64)
        a, b = o_off[i], o_off[i + 1]
        # contiguous copies: the same argument types as a single `grad_discrete` call
        part = (np.ascontiguousarray(obs_t[a:b]), np.ascontiguousarray(Yd[a:b]),
                np.ascontiguousarray(Wd[a:b]), cols)
        status[i], losses[i] = grad_discrete(kern, tab, ctl, U0[i], Pm[i], spans[i], part,
                                             grads[i], st)
