"""numba's disk cache for compiled code made of several source files, stamped with all of them.

numba stamps a cached function with its own source file only. The kernels
in `kernels.py` inline code from `activations.py`, `_bits.py` and `_config.py`, so an
edit there alone would load stale machine code from the cache (a clean install is
fine: every file is new). The locators here are tried before numba's own, claim only
the files of one group (a set of folders), and add a fingerprint of every source of
the group to the stamp, so a change to any of them recompiles the group. `install`
sets up the group of nets' own files; `sciml` adds its compiled engine the same way.

The fingerprint also names the folder a group's cache lives in (``__pycache__/g<hash>``):
numba unpickles a function's whole cache index, types included, before it compares
stamps, so an index written by other sources (an upgrade that renamed a struct class)
would fail to load instead of missing. Folders of other fingerprints are removed when
a group first writes beside them.
"""

import functools
import hashlib
import re
import shutil
from pathlib import Path

from numba.core import caching

ROOT = Path(__file__).resolve().parent
SOURCES = ("kernels.py", "activations.py", "_bits.py", "_config.py", "_cache.py",
           # the per-layer path: kernels that call each other's compiled code
           "gemm.py", "linear.py", "conv.py", "pool.py", "layerwise.py", "rng.py", "norm.py",
           "dropout.py", "bilinear.py", "softmax.py", "lanestep.py", "tiles.py")


def fingerprint_of(paths):
    """A hash of the contents of ``paths``."""
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def fingerprint():
    """A hash of the nets sources that compiled kernels are made of."""
    return fingerprint_of(ROOT / name for name in SOURCES)


def install_group(name, folders, stamp):
    """Put locators first in numba's list (once per process) that claim the functions of
    files in ``folders`` and add ``stamp()`` to their cache stamp."""
    impl = caching.CacheImpl
    if any(getattr(c, "_group", None) == name for c in impl._locator_classes):
        return
    folders = tuple(Path(f).resolve() for f in folders)

    class _Group:
        _group = name

        @classmethod
        def from_function(cls, py_func, py_file):
            parent = Path(py_file).resolve().parent
            if parent not in folders:
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return super().get_source_stamp(), stamp()

        def get_cache_path(self):
            return str(Path(super().get_cache_path()) / f"g{stamp()}")

        def ensure_cache_path(self):
            super().ensure_cache_path()
            _prune(Path(self.get_cache_path()))

    ours = [type(f"{name}{base.__name__}", (_Group, base), {})
            for base in (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator,
                         caching.UserWideCacheLocator)]
    impl._locator_classes = ours + list(impl._locator_classes)


_STALE = re.compile(r"g[0-9a-f]{16,}$")
_pruned = set()


def _prune(path):
    """Remove the cache folders of other fingerprints beside ``path`` (once per folder)."""
    parent = path.parent
    if parent in _pruned:
        return
    _pruned.add(parent)
    for other in parent.iterdir():
        if other != path and other.is_dir() and _STALE.match(other.name):
            shutil.rmtree(other, ignore_errors=True)


def install():
    """The group of nets' own kernels (their stamp: `fingerprint`)."""
    install_group("Nets", [ROOT], fingerprint)
