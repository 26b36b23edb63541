"""What differs between the method families, behind one name: interpolants and stored steps.

Sensitivity loops integrate with any family and read the forward solve's
stored steps; these helpers pick the family's code by the type of the
tableau (`structs.ERKTableau`, `structs.RosTableau` or `structs.BDFTableau`;
a BDF step has no stages, so `step_interp`, which quadrature adjoints call on
their own backward steps, has no BDF version):

- ``stored_state(ftab, fsys, rec, n_steps, out, t, k, j, tmp)``: the stored
  forward solution at time ``t`` in segment ``k`` (``k < 0``: any), searching
  from step ``j``; returns the step used;
- ``step_interp(tab, out, theta, h, z, znew, K, w)``: a step's interpolant at
  ``theta`` from its start ``z``, end ``znew`` and stages ``K`` (``w``: scratch
  of ``max(nz, s + nh)``);
- ``integrate(sys, tab, ctl, stops, z, rec)``: the family's loop, called where
  it is written (an intrinsic: no function of its own between a caller and the
  loop); `integrate_stored` runs it with per-step storage that grows until it
  suffices (inlined into its callers for the same reason).

numba links every compiled callee into its caller's module and optimises it
there again, so each function between an entry point and a loop costs another
optimisation of the whole loop: the helpers here and the wrappers of
`adjoints.kernels.backward` add none.
"""

import numpy as np
from numba import types
from numba.extending import intrinsic, overload

from sciml._jit import OPTIONS, jit

from .bdf import MAX_ORDER, bdf_integrate, bdf_store_at
from .control import NEED_STORAGE
from .erk import erk_integrate, erk_interp, store_at
from .ros import ros_integrate, ros_store_at
from .structs import BDFTableau, ERKTableau, Record, RosTableau


def stored_state(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
    raise NotImplementedError("runs only inside compiled loops")


def step_interp(tab, out, theta, h, z, znew, K, w):
    raise NotImplementedError("runs only inside compiled loops")


def _family(tab):
    return getattr(tab, "instance_class", None)


@overload(stored_state, jit_options=OPTIONS, inline="always")
def _ov_stored_state(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
    if _family(ftab) is ERKTableau:
        def impl(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
            return store_at(fsys, ftab, rec, n_steps, out, t, k, j, tmp)
        return impl
    if _family(ftab) is RosTableau:
        def impl(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
            return ros_store_at(rec, n_steps, out, t, k, j)
        return impl
    if _family(ftab) is BDFTableau:
        def impl(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
            return bdf_store_at(rec, n_steps, out, t, k, j)
        return impl


@overload(step_interp, jit_options=OPTIONS, inline="always")
def _ov_step_interp(tab, out, theta, h, z, znew, K, w):
    if _family(tab) is ERKTableau:
        def impl(tab, out, theta, h, z, znew, K, w):
            erk_interp(tab, out, theta, h, z, K, w)
        return impl
    if _family(tab) is RosTableau:
        def impl(tab, out, theta, h, z, znew, K, w):
            # the step's rows D (end state, then K_j = sum_i H[j, i] K_i), then the interpolant
            s = len(tab.c)
            nh = len(tab.H) // s
            th1 = 1.0 - theta
            for m in range(out.shape[0]):
                acc = 0.0
                for jh in range(nh - 1, -1, -1):
                    row = 0.0
                    for i in range(s):
                        row += tab.H[jh * s + i] * K[i, m]
                    acc = row + theta * acc if jh < nh - 1 else row
                out[m] = th1 * z[m] + theta * (znew[m] + th1 * acc)
        return impl


def store_rows(tab):
    raise NotImplementedError("runs only inside compiled loops")


_LOOPS = {ERKTableau: erk_integrate, RosTableau: ros_integrate, BDFTableau: bdf_integrate}


@intrinsic
def integrate(typingctx, sys, tab, ctl, stops, z, rec):
    # A call to the family's compiled loop, emitted in the caller. An overload would do
    # the same with a function of its own, which numba compiles in full (its impl is
    # checked by compiling it), re-optimising the loop it links: 3-7 s a system type.
    loop = _LOOPS.get(_family(tab))
    if loop is None:
        return None
    fnty = types.Dispatcher(loop)
    sig = fnty.get_call_type(typingctx, (sys, tab, ctl, stops, z, rec), {})

    def codegen(context, builder, signature, args):
        return context.get_function(fnty, sig)(builder, args)

    return sig, codegen


@overload(store_rows, jit_options=OPTIONS, inline="always")
def _ov_store_rows(tab):
    if _family(tab) is ERKTableau:
        return lambda tab: len(tab.c)
    if _family(tab) is RosTableau:
        return lambda tab: 1 + len(tab.H) // len(tab.c)
    if _family(tab) is BDFTableau:
        return lambda tab: MAX_ORDER + 1


@jit(inline="always")
def integrate_stored(sys, tab, ctl, stops, z0, save_t, cap):
    """Integrate from ``z0`` saving at ``save_t`` and storing every step (capacity ``cap``,
    quadrupled and the solve rerun while it is not enough).

    Returns ``(status, t_end, rec, z)``: the record (`structs.Record`) and the final state.
    """
    nz = z0.shape[0]
    rows = store_rows(tab)
    cap = max(cap, 1)
    while True:
        z = z0.copy()
        rec = Record(save_t, np.zeros((save_t.shape[0], nz)), False, np.zeros(0), True,
                     np.zeros(cap + 1), np.zeros((cap + 1, nz)), np.zeros((cap, rows, nz)),
                     np.zeros(cap, dtype=np.int8), np.zeros(cap, dtype=np.int64),
                     np.zeros(6, dtype=np.int64))
        status, t = integrate(sys, tab, ctl, stops, z, rec)
        if status != NEED_STORAGE or cap > ctl.max_steps:
            return status, t, rec, z
        cap = 4 * cap
