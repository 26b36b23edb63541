"""The integration loop, written once: stops, events, saves, stored steps, counts.

Every family's loop (`erk.erk_integrate`, `ros.ros_integrate`,
`bdf.bdf_integrate`) is `integrate` with the family's step bound in
(`family_loop`). The loop owns what every integration does alike: it starts at
``stops[0]``, lands on every stop (the family sizes the steps; a stop is where
a dose, an infusion's start or end, a parameter change or an adjoint's jump
acts through ``sys_event``), records saves and stored steps (`record`, whose
storage it grows when full), stops at the step budget, and counts. The family
owns its arithmetic and the state it carries from step to step: a tuple ``st``
that its functions return anew (the seven stubs below say what each does).

`family_loop` compiles `integrate`'s code with the family's seven functions in
place of the stubs, as a function of the family's own name (cached under it):
numba then inlines them before typing, as it inlines every helper of a loop.
(Passed as arguments of an inlined loop instead, they would be inlined as
well, but numba copies an inlined function's whole body, so every loop would
be copied once more as it compiles.)
"""

import types
from collections.abc import Callable
from typing import NamedTuple

from sciml._jit import borrow, jit, keep_alive

from .control import MAX_STEPS, SUCCESS
from .record import grown, record_at, record_counts, saves_inside, set_at, storage_full
from .system import sys_event

# How one try at a step ended (`attempt`).
ACCEPTED, REJECTED, AGAIN = 0, 1, 2


# The family's step. Each is a family's own function (numba-inlined) in its loop.


def work(sys, tab, ctl, z):
    """``(own, work)``: the family's scratch; ``own`` is kept alive to the end of the loop,
    ``work`` holds views of it."""
    raise NotImplementedError("a family's step: bound by family_loop")


def begin(sys, tab, ctl, stops, z, work, t):
    """``(st, status, nfev)``: what a first step from ``t`` needs."""
    raise NotImplementedError("a family's step: bound by family_loop")


def attempt(sys, tab, ctl, stops, z, work, st, t, k):
    """``(outcome, status, t_new, lands, st, nfev, njac, nlu)``: one try at a step from
    ``t`` in segment ``k``, ending at ``t_new`` (on ``stops[k + 1]`` if ``lands``):
    ACCEPTED, REJECTED (counted) or AGAIN (tried again, not counted: with a fresh
    Jacobian); a ``status`` other than SUCCESS ends the loop."""
    raise NotImplementedError("a family's step: bound by family_loop")


def accept(sys, tab, z, work, st, t, t_new, k, want, d_k, j):
    """``(rows, have, nfev, st)``: the accepted step's own work (an adjoint's quadrature,
    extra interpolation stages) and its interpolation data ``rows``, stored as ``d_k[j]``
    unless ``j < 0`` (the record keeps no steps; ``have`` is its ``d_have``); ``want``: a
    save time lies inside the step."""
    raise NotImplementedError("a family's step: bound by family_loop")


def interp(tab, work, st, rows, out, ts, t, t_new, z):
    """The state at the save time ``ts`` inside the step from ``t`` (state ``z``) to
    ``t_new``, into ``out``."""
    raise NotImplementedError("a family's step: bound by family_loop")


def advance(tab, z, work, st, lands):
    """The accepted step's end state into ``z``."""
    raise NotImplementedError("a family's step: bound by family_loop")


def after(sys, tab, ctl, stops, z, work, st, t, k, nseg, lands, jumped):
    """``(st, nfev)``: after the events of the stop the step landed on (``jumped``: the
    state or its rate jumped), the next step's size and what it needs."""
    raise NotImplementedError("a family's step: bound by family_loop")


STEP = (work, begin, attempt, accept, interp, advance, after)


def integrate(sys, tab, ctl, stops, z, rec):
    """Integrate ``sys`` from ``stops[0]`` to ``stops[-1]`` with the family's step. ``z``
    is the state in and out; records into ``rec`` (`structs.Record`). Returns ``(status,
    t, rec)``: a status code of `control`, the time reached and the record (``rec``
    itself, or a larger one with its contents where its storage for every step filled)."""
    # (see sciml._jit; ``kept`` is the record returned: a borrowed array has no owner)
    kept = rec
    sys, tab, ctl, stops, z, rec = borrow((sys, tab, ctl, stops, z, rec))
    own, wk = work(sys, tab, ctl, z)
    save_t, save_z = rec.save_t, rec.save_z
    nseg = stops.shape[0] - 1
    t = stops[0]
    sys_event(sys, z, 0)
    sp, nsave = record_at(rec, t, z, 0, 0, 0)
    st, status, nfev = begin(sys, tab, ctl, stops, z, wk, t)
    njac = nlu = nacc = nrej = 0
    if status != SUCCESS:
        nseg = 0  # skip the loop
    k = 0
    full = True
    while full:  # the steps; storage grown between runs of them (a record that changes
        full = False  # inside the steps' loop cost its solves 10%: vdp_stiff 277 -> 314 us)
        while k < nseg:
            if nacc + nrej >= ctl.max_steps:
                status = MAX_STEPS
                break
            if storage_full(rec, nsave, nacc):
                full = True
                break
            outcome, status, t_new, lands, st, df, dj, dl = attempt(sys, tab, ctl, stops, z, wk,
                                                                    st, t, k)
            nfev += df
            njac += dj
            nlu += dl
            if outcome == REJECTED:
                nrej += 1
            if status != SUCCESS:
                break
            if outcome != ACCEPTED:
                continue
            nacc += 1
            want = saves_inside(rec, sp, t_new)
            rows, have, df, st = accept(sys, tab, z, wk, st, t, t_new, k, want, rec.d_k,
                                        nacc - 1 if rec.dense else -1)
            nfev += df
            if rec.dense:  # (through set_at: see there)
                set_at(rec.d_have, nacc - 1, have)
                set_at(rec.d_seg, nacc - 1, k)
            while want and saves_inside(rec, sp, t_new):
                interp(tab, wk, st, rows, save_z[sp], save_t[sp], t, t_new, z)
                sp += 1
            t = t_new
            advance(tab, z, wk, st, lands)
            jumped = False
            if lands:
                k += 1
                jumped = sys_event(sys, z, k)
            st, df = after(sys, tab, ctl, stops, z, wk, st, t, k, nseg, lands, jumped)
            nfev += df
            sp, nsave = record_at(rec, t, z, sp, nsave, nacc)
        if full:
            kept = grown(kept, nsave, nacc)  # (owned arrays: it keeps some)
            rec = borrow(kept)
            save_z = rec.save_z
    keep_alive(own)
    record_counts(rec, nfev, nacc, nrej, sp, nsave, njac, nlu)
    return status, t, kept


def family_loop(name, doc, *step):
    """The compiled loop of a family: `integrate` with ``step``, the family's seven
    functions in the order of `STEP`, in place of the stubs; named ``name``."""
    if len(step) != len(STEP):
        raise TypeError(f"family_loop: {len(STEP)} functions expected "
                        f"({', '.join(f.__name__ for f in STEP)}), got {len(step)}")
    bound = {**globals(), **{f.__name__: g for f, g in zip(STEP, step)}}
    fn = types.FunctionType(integrate.__code__, bound, name)
    fn.__qualname__, fn.__doc__ = name, doc
    return jit(fn)


class Family(NamedTuple):
    """What a method family gives the engine: its loop, and what sensitivity loops read of
    its stored steps; one entry of `family.FAMILIES` (its registration). Each function but
    the loop is plain Python that the engine compiles inline where a sensitivity loop
    calls it:

    - ``integrate``: the family's loop (`family_loop`);
    - ``stored_state(ftab, fsys, rec, n_steps, out, t, k, j, tmp)``: the stored forward
      solution at ``t`` in segment ``k`` (``k < 0``: any) into ``out``, searching from step
      ``j``; returns the step used (``tmp``: scratch of ``max(nz, s)``);
    - ``store_rows(tab)``: the rows a stored step keeps;
    - ``step_interp(tab, out, theta, h, z, znew, K, w)``: a step's interpolant at
      ``theta`` from its start, end and stages (quadrature adjoints' own backward steps),
      or None for a family without stages.
    """

    integrate: object
    stored_state: Callable
    store_rows: Callable
    step_interp: Callable | None
