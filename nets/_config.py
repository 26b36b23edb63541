"""Numba options in one place, so every kernel is compiled the same way.

`error_model="numpy"` drops the division-by-zero checks that otherwise block
vectorisation; the fastmath flags allow reassociation (vectorised
reductions) and contraction (FMA) but keep NaN/Inf semantics, so that
non-finite checks still work inside kernels.
"""

import functools
import warnings

import numba
import numpy as np
from numba.core.errors import NumbaExperimentalFeatureWarning

from ._cache import install as _install_cache_locators

_install_cache_locators()  # before any kernel is defined (see `nets._cache`)


# numba warns at every compile of code that passes compiled functions as values, which
# our kernels do by design (the activation table, the engine's model kernels): the user
# can do nothing about it. It comes from typing (reported at our line) and from
# lowering (reported at numba's own line), so a filter on our file names cannot catch
# it; silencing it inside our dispatchers' compiles does, and leaves the user's own
# numba code, and every other warning, as it was.
_FIRST_CLASS = ".*First-class function type feature is experimental"


def quiet(dispatcher):
    """`dispatcher` with its compiles silent about numba's first-class-function warning.

    Every compile, whether a call from Python or a caller's compile reaches it, goes
    through ``dispatcher.compile``; the filter holds only while it runs (numba compiles
    under one global lock, callees inside their caller's compile).
    """
    compile_ = dispatcher.compile

    @functools.wraps(compile_)
    def compile_quietly(sig):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_FIRST_CLASS,
                                    category=NumbaExperimentalFeatureWarning)
            return compile_(sig)

    dispatcher.compile = compile_quietly
    return dispatcher


FASTMATH = {"reassoc", "contract", "nsz", "arcp"}

OPTIONS = dict(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH)


def jit(*args, **kwargs):
    """`numba.njit` with the project's options (keywords override), `quiet`."""
    opts = {**OPTIONS, **kwargs}
    if args and callable(args[0]):
        return quiet(numba.njit(**opts)(args[0]))
    decorate = numba.njit(*args, **opts)
    return lambda fn: quiet(decorate(fn))


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
