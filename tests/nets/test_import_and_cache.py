"""Process-level behaviour: import cost (no JAX) and numba's on-disk cache."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_python(code):
    """Run `code` in a fresh interpreter with this process' environment; return its JSON."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_nets_does_not_import_jax_or_sciml():
    loaded = run_python(
        "import json, sys\n"
        "import nets\n"
        "def heavy():\n"
        "    return sorted(m for m in sys.modules\n"
        "                  if m.split('.')[0] in ('jax', 'jaxlib', 'sciml', 'adjoints'))\n"
        "first = heavy()\n"
        "import nets.jax\n"
        "print(json.dumps([first, heavy()]))\n")
    assert loaded == [[], []]  # nets.jax imports jax only when used


# The work the child repeats; the parent runs it first so the cache is warm.
CACHE_WORK = """
import numpy as np
import nets
from nets import Chain, Dense
chain = Chain(3, Dense(8, "tanh"), Dense(2))
p = chain.init_params(seed=0)
X = np.linspace(-1, 1, 300 * 3).reshape(300, 3)
value, grad = nets.loss_and_grad(chain, p, X, np.zeros((300, 2)))
y = chain(X, p)
"""


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_fresh_process_loads_kernels_from_disk_cache():
    exec(compile(CACHE_WORK, "<cache-work>", "exec"), {})
    stats = run_python(CACHE_WORK + """
import json
from nets import kernels
names = ["chunk_size", "forward", "loss_grad", "penalty"]
print(json.dumps({n: [sum(getattr(kernels, n).stats.cache_hits.values()),
                      sum(getattr(kernels, n).stats.cache_misses.values())] for n in names}))
""")
    for name, (hits, misses) in stats.items():
        assert misses == 0, f"{name} was compiled, not loaded from the cache: {stats}"
        assert hits >= 1, f"{name} was not loaded from the cache: {stats}"

