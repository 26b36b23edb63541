"""What every loop records on its way, written once: saved states, stored steps, counts.

A loop reaches a state ``z`` at time ``t`` at its start and at the end of each
accepted step (after the events of a stop it lands on). `record_at` saves it (every
step, or the save times up to ``t``) and stores it as the start of the next stored
step; saves strictly inside a step are the family's interpolant's (`saves_inside`
says whether there are any). Plain loops copy the rows: numba's slice assignment
costs more at these sizes, in time and in compile time.
"""

from sciml._jit import jit

from .structs import S_NACC, S_NFEV, S_NJAC, S_NLU, S_NREJ, S_NSAVE


@jit(inline="always")
def copy_row(rows, r, z):
    """``rows[r] = z``."""
    for m in range(z.shape[0]):
        rows[r, m] = z[m]


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
    """No room for another step's saved row or stored step (the caller reruns with more)."""
    return (rec.every and nsave >= rec.all_t.shape[0]) or (rec.dense and nacc >= rec.d_k.shape[0])


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
