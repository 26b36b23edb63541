"""A second process that builds the same model compiles nothing.

The generated module is written under `SCIML_CACHE_DIR` and named by the
hash of its text; numba caches its kernels beside it. The parent builds the
models and calls every kernel (warming the cache), then a fresh interpreter
does the same and reports numba's cache hits and misses per kernel.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

ROOT = Path(__file__).resolve().parents[2]

KERNELS = ["rhs_into", "jac_into", "vjp_into", "paramjac_into", "obs_into", "obs_vjp_into"]

# The work both processes do: build models (traced, and from kernels), call every kernel.
WORK = """
import time
t_start = time.perf_counter()
import numpy as np
from tests.sciml import model_zoo as zoo
from tests.sciml.test_model_alloc import kernel_args, KERNELS
from tests.sciml.test_model_hatch import build as build_hatch
rng = np.random.default_rng(0)
models = {}
hatch = lambda rng: zoo.Case("hatch", build_hatch(), np.array([0.3, 1.1]),
                             np.linspace(0.1, 0.9, 6), 0.0, None)
for make in (zoo.case_ude, zoo.case_pk, zoo.case_two_nets, hatch):
    case = make(rng)
    t0 = time.perf_counter()
    m = case.model
    m.rhs(case.u, case.theta, case.t)
    models[case.name] = (case, time.perf_counter() - t0)
    for k in KERNELS:
        getattr(m.module, k)(*kernel_args(k, m, case.u, case.theta, case.t, rng))
t_total = time.perf_counter() - t_start
"""

REPORT = """
import json
stats = {name: {k: [sum(getattr(c.model.module, k).stats.cache_hits.values()),
                    sum(getattr(c.model.module, k).stats.cache_misses.values())]
                for k in KERNELS} for name, (c, _) in models.items()}
print(json.dumps({"stats": stats, "total_s": t_total}))
"""


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_second_process_compiles_nothing():
    exec(compile(WORK, "<model-cache-work>", "exec"), {})
    out = subprocess.run([sys.executable, "-c", WORK + REPORT], cwd=ROOT, env=dict(os.environ),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for model, kernels in result["stats"].items():
        for kernel, (hits, misses) in kernels.items():
            assert misses == 0, f"{model}.{kernel} was compiled in the second process: {result}"
            assert hits >= 1, f"{model}.{kernel} was not loaded from the cache: {result}"
    # Imports, three traces and module builds, every kernel loaded: seconds, not a compile.
    print(f"second process: {result['total_s']:.2f} s")
