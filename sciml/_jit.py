"""numba options for sciml's compiled code (generated modules import this), and two
intrinsics for the lean solve loops.

numba counts references to every array, views included: making a view, or handing
one to an inlined helper, costs an atomic increment and decrement (~10 ns a view
here). The lean loops cut ~25 work views out of one scratch buffer per solve, ~0.3 us
of a 5 us solve. `borrow` gives an array whose views are not counted (its meminfo
is NULL); the caller must keep the owner alive for as long as those views are used,
which `keep_alive` at the end of the function does (numba frees an array after the
last use of its variable).
"""

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from nets._config import Threads, jit, pjit  # one place for numba options, shared with nets

__all__ = ["jit", "pjit", "Threads", "borrow", "keep_alive"]


@intrinsic
def borrow(typingctx, arr):
    """``arr`` without its reference count (only for scratch that never leaves the function)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        out = context.make_array(sig.args[0])(context, builder, args[0])
        out.meminfo = cgutils.get_null_value(out.meminfo.type)
        out.parent = cgutils.get_null_value(out.parent.type)
        return out._getvalue()

    return arr(arr), codegen


@intrinsic
def keep_alive(typingctx, arr):
    """A use of ``arr`` that does nothing: it lives at least until here."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        return context.get_dummy_value()

    return types.none(arr), codegen
