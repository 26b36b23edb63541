"""A first run is quiet: importing nets and compiling a chain's kernels warns nothing, while
the user's own numba code still gets numba's warnings.

numba warns only while it compiles, and the suite's disk cache would skip the compiles, so
this runs a fresh interpreter on an empty cache directory with every warning an error.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import numpy as np
    import nets
    from nets import Chain, Dense

    assert nets.__file__.startswith({root!r}), nets.__file__
    fused = Chain(3, Dense(5, "tanh"), Dense(2))
    p = fused.init_params(seed=0)
    x = np.ones(3)
    fused(x, p)
    fused.vjp_into(np.empty(3), np.zeros(fused.n_params), np.ones(2), x, p, fused.workspace())
    per_layer = Chain(3, Dense(5, "elu(alpha=2.0)"), Dense(2))
    per_layer(x, per_layer.init_params(seed=0))
    print("nets: quiet")

    import numba
    from numba import literal_unroll
    from numba.core.errors import NumbaExperimentalFeatureWarning

    @numba.njit
    def inc(z):
        return z + 1.0

    @numba.njit
    def dec(z):
        return z - 1.0

    TABLE = ((0, inc), (1, dec))  # a table of functions, as nets' activations are

    @numba.njit
    def call(code, z):
        for entry in literal_unroll(TABLE):
            if code == entry[0]:
                z = entry[1](z)
        return z

    try:
        call(0, 1.0)
    except NumbaExperimentalFeatureWarning:
        print("user: warned")
""")


@pytest.mark.heavy
def test_import_and_first_calls_warn_nothing(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-W", "error", "-c", SCRIPT.format(root=str(ROOT))],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr == ""
    assert run.stdout.split("\n")[:2] == ["nets: quiet", "user: warned"]
