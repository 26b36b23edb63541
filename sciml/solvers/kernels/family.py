"""The method families behind one name: their loops, stored steps and interpolants.

Sensitivity loops integrate with any family and read the forward solve's
stored steps. The helpers here pick the family's own code by the type of the
tableau, from `FAMILIES`: one entry (`loop.Family`) per family, the one line a
new family adds here.

- ``integrate(sys, tab, ctl, stops, z, rec)``: the family's loop, called where
  it is written (an intrinsic: no function of its own between a caller and the
  loop); `integrate_stored` runs it with per-step storage (inlined into its
  callers for the same reason);
- ``stored_state``, ``store_rows``, ``step_interp``: the family's functions of
  those names (`loop.Family` says what each does; a family without stages, as
  BDF, has no ``step_interp``, which only quadrature adjoints' own backward
  steps call).

numba links every compiled callee into its caller's module and optimises it
there again, so each function between an entry point and a loop costs another
optimisation of the whole loop: the helpers here and the wrappers of
`adjoints.kernels.backward` add none.
"""

import numpy as np
from numba import types
from numba.extending import intrinsic, overload

from sciml._interpret import python, stand_in
from sciml._jit import OPTIONS, jit

from . import bdf, erk, ros
from .structs import BDFTableau, ERKTableau, Record, RosTableau

# The registered families, by the type of their tableau.
FAMILIES = {ERKTableau: erk.FAMILY, RosTableau: ros.FAMILY, BDFTableau: bdf.FAMILY}


def _of(tab):
    return FAMILIES.get(getattr(tab, "instance_class", None))


def stored_state(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
    raise NotImplementedError("runs only inside compiled loops")


def step_interp(tab, out, theta, h, z, znew, K, w):
    raise NotImplementedError("runs only inside compiled loops")


def store_rows(tab):
    raise NotImplementedError("runs only inside compiled loops")


@overload(stored_state, jit_options=OPTIONS, inline="always")
def _ov_stored_state(ftab, fsys, rec, n_steps, out, t, k, j, tmp):
    fam = _of(ftab)
    return None if fam is None else fam.stored_state


@overload(step_interp, jit_options=OPTIONS, inline="always")
def _ov_step_interp(tab, out, theta, h, z, znew, K, w):
    fam = _of(tab)
    return None if fam is None else fam.step_interp


@overload(store_rows, jit_options=OPTIONS, inline="always")
def _ov_store_rows(tab):
    fam = _of(tab)
    return None if fam is None else fam.store_rows


@intrinsic
def integrate(typingctx, sys, tab, ctl, stops, z, rec):
    # A call to the family's compiled loop, emitted in the caller. An overload would do
    # the same with a function of its own, which numba compiles in full (its impl is
    # checked by compiling it), re-optimising the loop it links: 3-7 s a system type.
    fam = _of(tab)
    if fam is None:
        return None
    fnty = types.Dispatcher(fam.integrate)
    sig = fnty.get_call_type(typingctx, (sys, tab, ctl, stops, z, rec), {})

    def codegen(context, builder, signature, args):
        return context.get_function(fnty, sig)(builder, args)

    return sig, codegen


@stand_in(integrate)
def _integrate(sys, tab, ctl, stops, z, rec):
    return python(FAMILIES[type(tab)].integrate)(sys, tab, ctl, stops, z, rec)


@jit(inline="always")
def integrate_stored(sys, tab, ctl, stops, z0, save_t, cap):
    """Integrate from ``z0`` saving at ``save_t`` and storing every step (room for ``cap``
    at first: the loop grows it).

    Returns ``(status, t_end, rec, z)``: the record (`structs.Record`) and the final state.
    """
    nz = z0.shape[0]
    rows = store_rows(tab)
    cap = max(cap, 1)
    z = z0.copy()
    rec = Record(save_t, np.zeros((save_t.shape[0], nz)), False, np.zeros(0), True,
                 np.zeros(cap + 1), np.zeros((cap + 1, nz)), np.zeros((cap, rows, nz)),
                 np.zeros(cap, dtype=np.int8), np.zeros(cap, dtype=np.int64),
                 np.zeros(6, dtype=np.int64))
    status, t, rec = integrate(sys, tab, ctl, stops, z, rec)
    return status, t, rec, z
