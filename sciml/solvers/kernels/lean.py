"""The lean forward solve: one compiled call for the common case, per built-in tableau.

`sciml.solve` of one problem without doses, output at given times and no
dense storage, runs `erk.erk_integrate` through the entry point made here:
it checks the argument values itself (anything unexpected returns -1 with
nothing solved, for the full path's checks to name it), allocates its
scratch, and fills a ``keep`` vector with what the `Solution` keeps besides
the states (copies of the save times, u0 and the parameters, then t_end and
the counts), so that the caller allocates two arrays and copies nothing.

One entry point reads the tableau and the controller's settings from its
arguments and serves every explicit method: it calls the loop every other
forward solve of the same types runs (`erk.erk_integrate`, compiled once for
both). The fused entry of a model solved many times (`ExplicitRK._fuse`) may
also fold a tableau's coefficients in as constants
(`ButcherTableau.engine(constants=True)`, a closure numba freezes and caches on
disk keyed by its values): the same step code, with the loop inlined by LLVM so
that it folds the coefficients (see `ExplicitRK.fold_constants`). The
controller's settings are arguments in both, so a changed setting compiles
nothing.
"""

import math

import numpy as np
from numba import types
from numba.extending import overload

from sciml._jit import OPTIONS, borrow, jit, keep_alive

from .calls import K_WS
from .erk import erk_integrate
from .linked import Linked, n_states
from .structs import S_NACC, S_NFEV, S_NREJ, S_NSAVE, BoundModel, Control, Lin, Record
from .system import Forward

# The loop of a folded entry: LLVM inlines it there and folds the constants into it
# (`forceinline`; numba's IR inlining, used before, typed and lowered the whole loop
# again inside each entry)
_integrate_inlined = jit(forceinline=True)(erk_integrate.py_func)


def bind(kern, p, ws, code):
    """The model of a lean solve: a `BoundModel`, or with ``code`` a `Linked` one."""
    raise NotImplementedError("compiled loops only")


@overload(bind, jit_options=OPTIONS, inline="always")
def _ov_bind(kern, p, ws, code):
    if code is types.none:
        return lambda kern, p, ws, code: BoundModel(kern, p, ws)
    return lambda kern, p, ws, code: Linked(kern, p, ws, code)


# The tail of ``keep``: t_end, nfev, n_accepted, n_rejected, n_saved.
KEEP_TAIL = 5

_ENTRIES = {}


def solve_entry(folded=None, code=None):
    """The lean solve entry point: with ``folded`` (an `ERKTableau` of tuples) that
    tableau's coefficients as constants, else the one for every tableau; with ``code`` (a
    `linked.LinkedCode`), the fused entry point of that model. It is called
    ``(kern, tab, settings, u0, p, save_t, out_u, keep, atol, t0, tf, rtol, dt,
    max_steps)``, ``tab`` the `ERKTableau` of arrays (unread when folded) and ``settings``
    (6,) the controller's ``(safety, qmin, qmax, beta1, beta2, adaptive)``."""
    key = (folded, code)
    if key not in _ENTRIES:
        _ENTRIES[key] = _make(folded, code)
        if key == (None, None):  # how another process makes it (`sciml._tier`)
            _ENTRIES[key].made_by = (__name__, "solve_entry")
    return _ENTRIES[key]


def _make(folded, code):
    # A constant, so numba prunes the branch not taken. The branches call module globals:
    # a dispatcher held in the closure would change the disk cache's key in every process.
    fold = folded is not None
    n_fixed = n_states(code)  # the state count as a constant (0: read from u0)

    @jit
    def lean_solve(kern, tab, settings, u0, p, save_t, out_u, keep, atol, t0, tf, rtol, dt,
                   max_steps):
        """Solve at ``save_t`` into ``out_u`` (T, n); fill ``keep``; return the status
        (-1: an argument value is not as expected, nothing solved)."""
        adaptive = settings[5] != 0.0
        ns = save_t.shape[0]
        n = u0.shape[0] if n_fixed == 0 else n_fixed
        npar = p.shape[0]
        if (u0.shape[0] != n or out_u.shape[0] != ns or out_u.shape[1] != n
                or settings.shape[0] != 6
                or keep.shape[0] != ns + n + npar + KEEP_TAIL
                or not (rtol >= 1e-14 and rtol < math.inf) or not (dt >= 0.0 and dt < math.inf)
                or max_steps < 1 or not (t0 < tf and tf - t0 < math.inf)
                or (not adaptive and not dt > 0.0)):
            return -1
        for i in range(ns):
            if not (save_t[i] >= t0 and save_t[i] <= tf) or (i > 0 and save_t[i] < save_t[i - 1]):
                return -1
        # Every array below is borrowed (no reference counting: the caller holds the
        # arguments, `keep_alive` the scratch): a struct field read in the loop would
        # otherwise cost an atomic increment and decrement per use (see sciml._jit).
        # One allocation for all scratch: the float part, then the six int64 counters.
        nf = 3 * n + 2 + max(kern[K_WS], 1)
        own = np.zeros(nf + 6)
        buf = borrow(own)[:nf]
        atol_v = buf[:n]
        atol_v[:] = atol  # a number or one per state
        for i in range(n):
            if not (atol_v[i] > 0.0 and atol_v[i] < math.inf):
                return -1
        z = buf[n:2 * n]
        z[:] = u0
        stops = buf[2 * n:2 * n + 2]
        stops[0] = t0
        stops[1] = tf
        ws = buf[2 * n + 2:]
        stats = borrow(own)[nf:].view(np.int64)
        m = bind(borrow(kern), borrow(p), ws, code)
        no_f, no_i = buf[:0], stats[:0]
        no2 = buf[:0].reshape((0, n))
        no22 = buf[:0].reshape((0, 0))
        sys = Forward(m, no_i, no_i, no_f, Lin(no22, no22, no_i, no22, no_i, no_f))
        ctl = Control(rtol, atol_v, settings[0], settings[1], settings[2], settings[3],
                      settings[4], max_steps, dt, adaptive)
        rec = Record(borrow(save_t), borrow(out_u), False, no_f, False, no_f, no2,
                     buf[:0].reshape((0, 0, n)), stats[:0].view(np.int8), no_i, stats)
        if fold:
            status, t_end, _ = _integrate_inlined(sys, folded, ctl, stops, z, rec)
        else:
            status, t_end, _ = erk_integrate(sys, tab, ctl, stops, z, rec)
        for i in range(ns):
            keep[i] = save_t[i]
        for i in range(n):
            keep[ns + i] = u0[i]
        o = ns + n
        for i in range(npar):
            keep[o + i] = p[i]
        o += npar
        keep[o] = t_end
        keep[o + 1] = stats[S_NFEV]
        keep[o + 2] = stats[S_NACC]
        keep[o + 3] = stats[S_NREJ]
        keep[o + 4] = stats[S_NSAVE]
        keep_alive(own)
        return status

    return lean_solve
