"""numba options for sciml's compiled code (generated modules import this)."""

from nets._config import Threads, jit, pjit  # one place for numba options, shared with nets

__all__ = ["jit", "pjit", "Threads"]
