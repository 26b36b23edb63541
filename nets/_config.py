"""Numba options in one place, so every kernel is compiled the same way.

`error_model="numpy"` drops the division-by-zero checks that otherwise block
vectorisation; the fastmath flags allow reassociation (vectorised
reductions) and contraction (FMA) but keep NaN/Inf semantics, so that
non-finite checks still work inside kernels.
"""

import numba
import numpy as np

from ._cache import install as _install_cache_locators

_install_cache_locators()  # before any kernel is defined (see `nets._cache`)

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


class Threads:
    """Context manager: run numba's parallel regions on `n` threads (all cores if None).

    Checks `n` (the user's ``threads=`` argument) and restores the previous
    count on exit; `n` is capped at numba's thread pool size.
    """

    def __init__(self, n):
        if n is None:
            n = numba.config.NUMBA_NUM_THREADS
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"`threads` must be a positive int or None, got {n!r}")
        self.n = min(int(n), numba.config.NUMBA_NUM_THREADS)

    def __enter__(self):
        self.prev = numba.get_num_threads()
        numba.set_num_threads(self.n)
        return self.n

    def __exit__(self, *exc):
        numba.set_num_threads(self.prev)
