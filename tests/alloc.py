"""Allocation counting with numba's runtime (NRT) statistics, for the no-allocation tests.

Calling a jitted function from Python allocates one NRT MemInfo per ndarray
argument while unboxing it (freed on return), so a kernel is measured from
inside a jitted loop (`repeat`), where its arguments are unboxed once: the
count for 1 + n calls minus the count for one call is the kernel's own. The
loop calls the kernel by its address (`nets._address`): linked, every kernel
would be compiled again inside it.
Tests that count need the `nrt_stats` fixture (tests/conftest.py).
"""

import warnings

import numba
import numpy as np
import pytest
from numba.core.errors import NumbaExperimentalFeatureWarning
from numba.core.runtime import rtsys

from nets._address import address, call_at

needs_jit = pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")


@numba.njit
def repeat(at, f, n, args):
    """``f(*args)`` ``n`` times, ``f`` called through its address ``at``."""
    for _ in range(n):
        call_at(at, f, args)


def allocs():
    """NRT allocations so far in this process."""
    return rtsys.get_allocation_stats().alloc


def n_arrays(x):
    """Arrays in a (nested) tuple of arguments: what unboxing them from Python allocates."""
    if isinstance(x, np.ndarray):
        return 1
    if isinstance(x, tuple):
        return sum(n_arrays(y) for y in x)
    return 0


def own_allocations(fn, args):
    """NRT allocations of one call ``fn(*args)`` from Python beyond unboxing its arrays,
    and what the call returned."""
    a0 = allocs()
    out = fn(*args)
    return allocs() - a0 - n_arrays(args), out


def allocations_in(kernel, args, n=20):
    """(allocations of one call beyond unboxing its arrays, allocations per further call)."""
    with warnings.catch_warnings():
        # Some kernels take a C function (`nets.kernels.rows_kernel`): a first-class
        # function to numba, which warns whenever it types a tuple holding one.
        warnings.filterwarnings("ignore", message=".*First-class function type",
                                category=NumbaExperimentalFeatureWarning)
        at = address(kernel, args)  # compiles the kernel
        repeat(at, kernel, 1, args)  # compiles the loop
        a0 = allocs()
        repeat(at, kernel, 1, args)
        a1 = allocs()
        repeat(at, kernel, 1 + n, args)
        a2 = allocs()
    unboxing = n_arrays(args)
    return (a1 - a0) - unboxing, ((a2 - a1) - (a1 - a0)) / n


class Spy:
    """Replaces a module kernel for one call, keeping its arguments (for `allocations_in`).

    Use with pytest's ``monkeypatch``: the kernel is restored after the test.
    """

    def __init__(self, module, name, monkeypatch):
        kernel = getattr(module, name)
        self.kernel = kernel.kernel if isinstance(kernel, Spy) else kernel
        self.args = None
        monkeypatch.setattr(module, name, self)

    def __call__(self, *args):
        self.args = args
        return self.kernel(*args)
