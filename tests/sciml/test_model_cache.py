"""The engine is compiled once: a new model in a new process compiles no numba code.

The solver and sensitivity loops (`sciml.solvers.kernels`, `adjoints.kernels`)
are ordinary numba functions cached on disk, stamped with a fingerprint of
every engine source (`sciml._jit.engine_fingerprint`); a model is data to
them (a table of kernel addresses), and its own kernels are compiled by LLVM
in milliseconds (`sciml.model.llvm`). So: a first interpreter builds a model,
solves it and takes one gradient (warming numba's cache, wherever
NUMBA_CACHE_DIR points); a second, fresh interpreter with the same
environment builds a NEW model (a function whose source it has never seen),
solves it and takes one gradient, while numba's compile events are recorded:
there must be none, and every engine dispatcher it used must report cache
hits and no misses. Last, a model's generated source is its kernels alone.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numba
import pytest

from . import model_zoo as zoo

ROOT = Path(__file__).resolve().parents[2]

# argv[1]: a constant written into the model function, so each run traces new source.
WORK = r'''
import json, sys, time
t_start = time.perf_counter()
from numba.core import event

compiled = []


class Compiles(event.Listener):
    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        compiled.append(f"{f.__module__}.{f.__qualname__}")

    def on_end(self, ev):
        pass


event.register("numba:compile", Compiles())

import numpy as np
import sciml
from nets import Chain, Dense

source = f"""
def new_ude(u, p, t, nets):
    x, y = u
    z = nets.U(u)
    return [p.alpha * x + {sys.argv[1]} * z[0], -p.delta * y + z[1] * x]
"""
env = {}
exec(compile(source, "<new model>", "exec"), env)
model = sciml.Model(env["new_ude"], ["x", "y"], ["alpha", "delta"],
                    nets={"U": Chain(2, Dense(5, "rbf"), Dense(5, "rbf"), Dense(2))})
theta = model.init_params(seed=0, alpha=1.3, delta=1.8)
prob = sciml.ODEProblem(model, [0.44, 4.63], (0.0, 1.0), theta)
t = np.linspace(0.1, 1.0, 5)
sol = sciml.solve(prob, saveat=t)
value, grad = sciml.loss_and_grad(prob, sciml.Data(t, sol.u + 0.01))
assert np.isfinite(value) and np.all(np.isfinite(grad)) and np.any(grad != 0)
t_work = time.perf_counter() - t_start

# every engine dispatcher of this process (module-level, and those made by factories such
# as the lean solve's entry points): cache hits and misses
import gc
from numba.core.registry import CPUDispatcher

engine = {}
for obj in gc.get_objects():
    if isinstance(obj, CPUDispatcher):
        f = obj.py_func
        if f.__module__.startswith(("sciml.solvers.kernels", "adjoints.kernels")):
            s = obj.stats
            hits, misses = sum(s.cache_hits.values()), sum(s.cache_misses.values())
            if hits or misses:
                key = f"{f.__module__}.{f.__qualname__}"
                old = engine.get(key, [0, 0])
                engine[key] = [old[0] + hits, old[1] + misses]
during = list(compiled)

# the listener sees a compilation
import numba
numba.njit(lambda x: x + 1)(1)
print(json.dumps({"compiled": during, "probe": compiled[len(during):], "engine": engine,
                  "work_s": t_work}))
'''


def run(constant):
    out = subprocess.run([sys.executable, "-c", WORK, constant], cwd=ROOT, env=dict(os.environ),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-5000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_a_new_model_in_a_fresh_process_compiles_no_engine_code():
    run("1.0")  # warms the cache (compiles the engine if it is not cached yet)
    result = run("2.5")  # a fresh interpreter, a model function it has never traced
    assert result["probe"], f"the compile listener saw nothing: {result}"
    assert result["compiled"] == [], f"numba compiled in the second process: {result}"
    engine = result["engine"]
    assert engine, f"no engine dispatcher was used: {result}"
    for name, (hits, misses) in engine.items():
        assert misses == 0 and hits >= 1, f"{name} was compiled, not loaded: {result}"
    # the solve loop and the gradient's loops both came from the cache
    assert any(".erk." in n or ".lean." in n for n in engine), engine
    assert any(n.startswith("adjoints.kernels") for n in engine), engine
    print(f"second process: {result['work_s']:.2f} s for imports, model, solve and gradient")


def test_the_model_source_is_its_kernels_alone(rng):
    m = zoo.case_ude(rng).model
    src = m.source
    # one function per kernel of f (no observables here), after the network's passes they
    # call, nothing of a solver
    defs = re.findall(r"^def (\w+)\(", src, flags=re.M)
    passes = [d for d in defs if d.startswith("net_U_")]
    assert defs == passes + ["rhs", "jac", "spjac", "paramjac", "vjp", "hvp"]
    assert {"net_U_forward", "net_U_backward", "net_U_jacobian"} <= set(passes)
    assert "while " not in src and "tableau" not in src.lower() and "solve" not in src
    assert "import sciml.solvers" not in src and "adjoints" not in src
    n_lines = len(src.splitlines())
    assert n_lines <= 800, f"{n_lines} lines"  # a few hundred
    # the rendering is valid Python
    compile(src, "<model source>", "exec")
