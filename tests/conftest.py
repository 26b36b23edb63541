"""Shared fixtures for the test suite.

Randomness is seeded (`np.random.default_rng`); hypothesis runs derandomized
with a modest number of examples (profile "ci"; `HYPOTHESIS_PROFILE=explore`
for a longer randomized search).
"""

import os
import zlib

import numpy as np
import pytest

# No background compile of a fused solve entry after many solves of one model: such a
# compile (tens of seconds) pays off in a long fit, not in a test, and on two cores it
# takes its time from the other worker. The tests of fusing set `erk.FUSE_AFTER` themselves.
os.environ.setdefault("SCIML_FUSE_AFTER", "0")

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover
    settings = None

if settings is not None:
    settings.register_profile(
        "ci", deadline=None, derandomize=True, max_examples=20, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
    settings.register_profile(
        "explore", deadline=None, max_examples=300,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# Files whose tests compile the same engine loop variants (one per loop, system type and
# linear solver, 10-30 s each with empty caches). `make test` runs with
# `--dist loadgroup`, which sends a group to one worker: spread over two, tests of one
# group compiled the same variant on both workers at once (70 worker-seconds of a cold
# run; the disk cache helps only a worker that starts after the other has written).
COMPILE_GROUPS = {
    "tests/adjoints/test_matrix.py": "adjoint_loops",
    "tests/sciml/test_adjoints.py": "adjoint_loops",
    "tests/sciml/test_bdf.py": "stiff_loops",
    "tests/sciml/test_sparse.py": "stiff_loops",
    "tests/sciml/test_mass.py": "stiff_loops",
}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = COMPILE_GROUPS.get(item.nodeid.split("::")[0])
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: reproducible, distinct per test."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def cube_activation():
    """Registers the custom activation "cube" (z^3) once per session; returns its reference."""
    import numba

    import nets

    @numba.njit
    def cube(z):
        return z * z * z

    @numba.njit
    def dcube(z):
        return 3 * z * z

    nets.register_activation("cube", cube, dcube)
    return {"cube": (lambda z: z**3, lambda z: 3 * z**2)}


@pytest.fixture(scope="module")
def nrt_stats():
    """numba's allocation statistics switched on for a module (see tests/alloc.py)."""
    from numba.core.runtime import _nrt_python

    was = _nrt_python.memsys_stats_enabled()
    _nrt_python.memsys_enable_stats()
    yield
    if not was:
        _nrt_python.memsys_disable_stats()
