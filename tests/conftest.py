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
# Every first call of an engine loop compiles, with no interpreted calls meanwhile and no
# background process (`sciml._tier`): the tests check the compiled engine, and the two
# workers keep the two cores. The tier's own tests switch it on.
os.environ.setdefault("SCIML_INTERPRET", "0")

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
# linear solver, 10-30 s each with empty caches): on two workers, each group's tests run
# on one of them. Spread over both, they compiled the same variants on both at once (70
# of a cold run's worker-seconds; the disk cache helps only a worker that starts after
# the other has written). xdist's own `--dist loadgroup` marks cannot do it with pytest
# 9, whose node ids no longer take the group's suffix; a scheduler of our own can.
COMPILE_GROUPS = {
    "tests/adjoints/test_matrix.py": "adjoint_loops",
    "tests/sciml/test_adjoints.py": "adjoint_loops",
    "tests/sciml/test_tier.py": "adjoint_loops",
    "tests/sciml/test_bdf.py": "stiff_loops",
    "tests/sciml/test_sparse.py": "stiff_loops",
    "tests/sciml/test_mass.py": "stiff_loops",
    # nets: the layer kernels and `train_step` variants of convolutional chains
    "tests/nets/test_chain_layers.py": "layer_kernels",
    "tests/nets/test_lanestep.py": "layer_kernels",
    "tests/nets/test_alloc.py": "layer_kernels",
    "tests/nets/test_conv.py": "layer_kernels",
    "tests/nets/test_custom_activation.py": "layer_kernels",
    # not a compile: the tests that start a dask LocalCluster (marked `cluster`), two of
    # which at once contend for its dashboard's port (a UserWarning)
    "tests/sciml/test_multistart.py": "clusters",
    "tests/sciml/test_nlme.py": "clusters",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`-n N` (xdist's "load" mode): each compile group one unit of work, every other test
    a unit of its own; the groups are handed out first (the most tests first)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CompileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return COMPILE_GROUPS.get(nodeid.split("::")[0], nodeid)

    return CompileGroups(config, log)


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
