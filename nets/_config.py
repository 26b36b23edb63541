"""Numba options in one place, so every kernel is compiled the same way.

`error_model="numpy"` drops the division-by-zero checks that otherwise block
vectorisation; the fastmath flags allow reassociation (vectorised
reductions) and contraction (FMA) but keep NaN/Inf semantics, so that
non-finite checks still work inside kernels.
"""

import numba

FASTMATH = {"reassoc", "contract", "nsz", "arcp"}

OPTIONS = dict(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)


def jit(*args, **kwargs):
    """`numba.njit` with the project's options (keywords override)."""
    opts = {**OPTIONS, **kwargs}
    if args and callable(args[0]):
        return numba.njit(**opts)(args[0])
    return numba.njit(*args, **opts)


def pjit(*args, **kwargs):
    """Like `jit` but with `parallel=True`, for the threaded kernels."""
    return jit(*args, parallel=True, **kwargs)
