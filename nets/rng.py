"""A counter-based random stream for layers (Dropout): the i-th number of stream `key`.

``uniform(key, i)`` hashes (key, i) with SplitMix64's finaliser (Steele, Lea and Flood,
2014) into a float64 in [0, 1). There is no generator state: any thread can draw any
element, so a threaded kernel gives the same numbers for any thread count and schedule,
and a pullback can regenerate the mask its forward drew from the same ``ctx.key``.
`uniform_np` is the numpy mirror (for references and tests).
"""

import numpy as np
from numba import uint64

from ._config import jit

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


@jit(inline="always")
def _mix(z):
    z = (z ^ (z >> uint64(30))) * uint64(_M1)
    z = (z ^ (z >> uint64(27))) * uint64(_M2)
    return z ^ (z >> uint64(31))


@jit(inline="always")
def uniform(key, i):
    """The `i`-th number (int >= 0) of stream `key` (int >= 0): a float64 in [0, 1)."""
    # SplitMix64's i-th output from the seed mix(key): state = seed + (i + 1) * golden.
    z = _mix(_mix(uint64(key) + uint64(_GOLDEN)) + (uint64(i) + uint64(1)) * uint64(_GOLDEN))
    return float(z >> uint64(11)) * (1.0 / 9007199254740992.0)


def uniform_np(key, i):
    """numpy mirror of `uniform` for integer array `i` (same numbers)."""
    with np.errstate(over="ignore"):
        g = np.uint64(_GOLDEN)
        k = np.uint64(key)

        def mix(z):
            z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
            return z ^ (z >> np.uint64(31))

        z = mix(mix(k + g) + (np.asarray(i, dtype=np.uint64) + np.uint64(1)) * g)
        return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def _mix_py(z):
    m = 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * _M1) & m
    z = ((z ^ (z >> 27)) * _M2) & m
    return z ^ (z >> 31)


def layer_key(seed, call, index):
    """The key of layer `index` at call number `call` of a chain seeded with `seed`: an int
    in [0, 2**63), different for every (seed, call, index) in practice (a 64-bit hash)."""
    m = 0xFFFFFFFFFFFFFFFF
    z = _mix_py((int(seed) + _GOLDEN) & m)
    z = _mix_py((z + (int(call) + 1) * _GOLDEN) & m)
    z = _mix_py((z + (int(index) + 1) * _GOLDEN) & m)
    return z >> 1


__all__ = ["uniform", "uniform_np", "layer_key"]
