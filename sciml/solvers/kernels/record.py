"""What every loop records on its way, written once: saved states, stored steps, counts.

A loop reaches a state ``z`` at time ``t`` at its start and at the end of each
accepted step (after the events of a stop it lands on). `record_at` saves it (every
step, or the save times up to ``t``) and stores it as the start of the next stored
step; saves strictly inside a step are the family's interpolant's (`saves_inside`
says whether there are any). When the storage for every step is full, `grown` gives the
loop a record of twice the room with what it holds so far, and the loop goes on: a rerun
from the start with more (as before) repeated up to twice the steps' work, since the
first guess of a solve's steps (`sciml.solvers.common.capacity`) is low for most. Plain
loops copy the rows: numba's slice assignment costs more at these sizes, in time and in
compile time.
"""

import numpy as np

from sciml._interpret import stand_in
from sciml._jit import jit

from .structs import S_NACC, S_NFEV, S_NJAC, S_NLU, S_NREJ, S_NSAVE, Record


@jit(inline="always")
def copy_row(rows, r, z):
    """``rows[r] = z``."""
    for m in range(z.shape[0]):
        rows[r, m] = z[m]


@stand_in(copy_row)
def _copy_row_numpy(rows, r, z):
    rows[r, :z.shape[0]] = z


@jit(inline="always")
def set_at(a, i, v):
    """``a[i] = v``, written as a loop: as a plain item assignment inside `record_at`,
    inlined into the loops, numba 0.68 lost the write (the stored times stayed zero while
    the rows written by `copy_row` arrived: the dense-output tests against reference
    solutions see it)."""
    for m in range(i, i + 1):
        a[m] = v


@jit(inline="always")
def record_at(rec, t, z, sp, nsave, j):
    """Save ``z`` at ``t`` and store it as stored step ``j``'s start; returns the next save
    index ``sp`` (save times) and the rows saved ``nsave`` (every step)."""
    if rec.every:
        copy_row(rec.save_z, nsave, z)
        set_at(rec.all_t, nsave, t)
        nsave += 1
    else:
        while sp < rec.save_t.shape[0] and rec.save_t[sp] <= t:
            copy_row(rec.save_z, sp, z)
            sp += 1
    if rec.dense:
        copy_row(rec.d_z, j, z)
        set_at(rec.d_t, j, t)
    return sp, nsave


@jit(inline="always")
def storage_full(rec, nsave, nacc):
    """No room for another step's saved row or stored step (`grown` makes some)."""
    return (rec.every and nsave >= rec.all_t.shape[0]) or (rec.dense and nacc >= rec.d_k.shape[0])


@jit(inline="always")
def _copy_rows(new, old, n):
    """``new[:n] = old[:n]``, rows of 1-d, 2-d or 3-d arrays flattened."""
    a, b = new.reshape(-1), old.reshape(-1)
    per = 1
    for d in range(1, old.ndim):
        per *= old.shape[d]
    for m in range(n * per):
        a[m] = b[m]


@stand_in(_copy_rows)
def _copy_rows_numpy(new, old, n):
    new[:n] = old[:n]


@jit(inline="always")
def grown(rec, nsave, nacc):
    """``rec`` with twice the room for what is full (its every-step saves, its stored
    steps) and the ``nsave`` rows saved and ``nacc`` steps stored so far copied."""
    all_t, save_z = rec.all_t, rec.save_z
    if rec.every and nsave >= all_t.shape[0]:
        cap = max(2 * all_t.shape[0], 16)
        all_t = np.zeros(cap)
        save_z = np.zeros((cap, rec.save_z.shape[1]))
        _copy_rows(all_t, rec.all_t, nsave)
        _copy_rows(save_z, rec.save_z, nsave)
    d_t, d_z, d_k, d_have, d_seg = rec.d_t, rec.d_z, rec.d_k, rec.d_have, rec.d_seg
    if rec.dense and nacc >= d_k.shape[0]:
        cap = max(2 * d_k.shape[0], 16)
        d_t = np.zeros(cap + 1)
        d_z = np.zeros((cap + 1, rec.d_z.shape[1]))
        d_k = np.zeros((cap, rec.d_k.shape[1], rec.d_k.shape[2]))
        d_have = np.zeros(cap, dtype=np.int8)
        d_seg = np.zeros(cap, dtype=np.int64)
        # the start of step nacc (the state after the last accepted one) is stored too
        _copy_rows(d_t, rec.d_t, nacc + 1)
        _copy_rows(d_z, rec.d_z, nacc + 1)
        _copy_rows(d_k, rec.d_k, nacc)
        _copy_rows(d_have, rec.d_have, nacc)
        _copy_rows(d_seg, rec.d_seg, nacc)
    return Record(rec.save_t, save_z, rec.every, all_t, rec.dense, d_t, d_z, d_k, d_have, d_seg,
                  rec.stats)


@jit(inline="always")
def saves_inside(rec, sp, t_new):
    """Whether a save time lies strictly before ``t_new`` (inside the step ending there)."""
    return not rec.every and sp < rec.save_t.shape[0] and rec.save_t[sp] < t_new


@jit(inline="always")
def record_counts(rec, nfev, nacc, nrej, sp, nsave, njac, nlu):
    st = rec.stats
    st[S_NFEV] = nfev
    st[S_NACC] = nacc
    st[S_NREJ] = nrej
    st[S_NSAVE] = nsave if rec.every else sp
    st[S_NJAC] = njac
    st[S_NLU] = nlu
