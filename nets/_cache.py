"""numba's disk cache for nets' own kernels, stamped with all of nets' compiled sources.

numba stamps a cached function with its own source file only. The kernels
in `kernels.py` inline code from `activations.py`, `_bits.py` and `_config.py`, so an
edit there alone would load stale machine code from the cache (a clean install is
fine: every file is new). The locators here are tried before numba's own, claim only
files of this package, and add a fingerprint of those sources to the stamp, so a
change to any of them recompiles. Generated model modules (`sciml`) name the same
fingerprint in their text.
"""

import functools
import hashlib
from pathlib import Path

from numba.core import caching

ROOT = Path(__file__).resolve().parent
SOURCES = ("kernels.py", "activations.py", "_bits.py", "_config.py", "_cache.py")


@functools.lru_cache(maxsize=1)
def fingerprint():
    """A hash of the nets sources that compiled kernels are made of."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()[:16]


class _OwnSources:
    @classmethod
    def from_function(cls, py_func, py_file):
        if Path(py_file).resolve().parent != ROOT:
            return None
        return super().from_function(py_func, py_file)

    def get_source_stamp(self):
        return super().get_source_stamp(), fingerprint()


def install():
    """Put the nets locators first in numba's list (once per process)."""
    impl = caching.CacheImpl
    if any(issubclass(c, _OwnSources) for c in impl._locator_classes):
        return
    ours = [type(f"Nets{base.__name__}", (_OwnSources, base), {})
            for base in (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator,
                         caching.UserWideCacheLocator)]
    impl._locator_classes = ours + list(impl._locator_classes)
