"""The engine's first calls while it compiles (`sciml._tier`, `sciml._interpret`).

- The interpreted engine against the compiled one: solves and gradients through every
  method family and sensitivity method, events, doses, a steady state and a model of the
  Benchmark-Models collection, in a process that compiles no engine function
  (``SCIML_INTERPRET=always``), against this process's compiled engine.
- A tier's hand-over: interpreted calls until the background compile is done, then the
  compiled loop; an interpreted call that runs out of time puts its arguments back and
  the compiled loop starts over from them.
- The background process, end to end, into an empty disk cache.
"""

import base64
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import adjoints
import sciml

from . import model_zoo as mz
from .test_petab_v1 import BOEHM
from .test_state_events import BALL, TH, _bounce

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _spiral():
    case = mz.case_spiral(np.random.default_rng(3))
    t = np.linspace(0.0, 1.5, 12)
    prob = sciml.ODEProblem(case.model, [2.0, 0.0], (0.0, 1.5), case.theta)
    y = 0.9 * np.cos(t)[:, None] * np.array([1.0, 0.5]) + 0.05
    return prob, sciml.Data(t, y)


def _pk():
    case = mz.case_pk(np.random.default_rng(5))
    doses = [sciml.Bolus(0.0, 200.0, "depot", every=6.0, count=3),
             sciml.Infusion(start=3.0, duration=2.0, rate=40.0, state="central")]
    prob = sciml.ODEProblem(case.model, [0.0, 0.0, 0.0], (0.0, 16.0), case.theta, doses=doses)
    t = np.array([0.5, 1, 2, 3, 4, 5, 6, 7, 9, 12, 15, 16.0])
    return prob, sciml.Data(t, 2.0 + np.sin(t), observables=["conc"])


def _ball():
    prob = sciml.ODEProblem(BALL, [1.0, 0.0], (0.0, 2.0), TH, events=[_bounce()])
    t = np.array([0.2, 0.7, 1.0, 1.4, 1.9])
    return prob, sciml.Data(t, np.column_stack([0.5 + 0 * t, -t]))


def _steady():
    def production(u, p, t, nets):
        x, y = u
        return [p.s - p.k1 * x + p.k2 * y - p.d * x, p.k1 * x - p.k2 * y]

    m = sciml.Model(production, states=["x", "y"], params=["s", "k1", "k2", "d"])
    th = np.array([2.0, 0.7, 0.3, 0.5])
    prob = sciml.ODEProblem(m, sciml.SteadyState(params=th * 1.5), (0.0, 3.0), th)
    t = np.linspace(0.5, 3.0, 6)
    return prob, sciml.Data(t, np.ones((6, 2)))


M = adjoints
# Each a loop variant other tests compile too (test_adjoints, test_state_events, test_steady,
# test_bdf, test_petab_v1): no compile of this test's own.
CASES = {  # name: (problem, solver, sensitivity methods)
    "spiral": (_spiral, sciml.Tsit5, [M.DiscreteAdjoint, M.InterpolatingAdjoint,
                                      M.BacksolveAdjoint, M.GaussAdjoint, M.QuadratureAdjoint,
                                      M.ForwardSensitivity]),
    "spiral_rodas": (_spiral, sciml.Rodas5, [M.GaussAdjoint, M.ForwardSensitivity]),
    "spiral_bdf": (_spiral, sciml.BDF, []),
    "pk_doses": (_pk, sciml.Tsit5, [M.GaussAdjoint]),
    "ball_events": (_ball, sciml.Rodas5, [M.GaussAdjoint, M.ForwardSensitivity]),
    "steady": (_steady, sciml.Rodas5, [M.GaussAdjoint]),
}


def petab_load(yaml):
    import sciml.petab

    return sciml.petab.load(yaml, rtol=1e-10, atol=1e-12)


def results():
    """Every case's solution, losses and gradients, as lists (JSON), and the types of the
    losses."""
    out = {}
    types = set()
    for name, (make, solver, methods) in CASES.items():
        prob, data = make()
        sol = sciml.solve(prob, solver(), rtol=1e-8, atol=1e-10, saveat=data.t)
        out[name] = {"u": sol.u.tolist()}
        for m in methods:
            v, g = sciml.loss_and_grad(prob, data, solver=solver(), sensealg=m(), rtol=1e-8,
                                       atol=1e-10)
            out[name][m.__name__] = [float(v), *np.asarray(g).tolist()]
            types.add(type(v).__name__)
    pytest.importorskip("libsbml")
    pp = petab_load(BOEHM)
    v, g = pp.llh_and_grad(pp.nominal)
    out["boehm"] = {"GaussAdjoint": [float(v), *g.tolist()]}
    out["types"] = sorted(types)
    return out


def _compiled_engine_functions():
    import gc

    from numba.core.dispatcher import Dispatcher

    from sciml._interpret import ENGINE_MODULES

    return sorted(d.py_func.__qualname__ for d in gc.get_objects()
                  if isinstance(d, Dispatcher) and d.overloads
                  and d.py_func.__module__.startswith(ENGINE_MODULES))


_SCRIPT = """
import json, sys
from tests.sciml import test_tier as t
out = t.results()
out["compiled"] = t._compiled_engine_functions()
print(json.dumps(out))
"""


def _run(script, timeout=600, **env):
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_interpreted_engine_agrees_with_the_compiled_one():
    pytest.importorskip("libsbml")
    interpreted = _run(_SCRIPT, SCIML_INTERPRET="always")
    assert interpreted.pop("compiled") == []  # nothing of the engine was compiled there
    compiled = results()
    assert interpreted.keys() == compiled.keys()
    assert interpreted.pop("types") == compiled.pop("types") == ["float"]  # Python's, both
    for name, by_method in compiled.items():
        for key, want in by_method.items():
            got = np.array(interpreted[name][key])
            # the same arithmetic but for fastmath's reassociation and FMAs, which can turn
            # a step's acceptance the other way: differences of the solves' tolerances
            np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-10 * np.max(np.abs(want)),
                                       err_msg=f"{name} {key}")


_HANDOVER = """
import json, threading, numpy as np, sciml, adjoints
from sciml import _tier
from tests.sciml.test_tier import _spiral

class Job:  # begun by the background process (a call waits for it), or not yet begun
    def __init__(self):                      # (with limit 0: the call compiles it itself)
        self.done, self.ok, self.started = threading.Event(), True, {limit} != 0.0

jobs = []
def request(disp, sig):  # a background compile that ends when the test says
    jobs.append(Job())
    if {limit} == 0.0 or {fit}:
        threading.Timer(0.05, jobs[-1].done.set).start()
    return jobs[-1]

interpreted = []
def python(obj):
    interpreted.append(obj)
    return interpret(obj)

interpret, _tier.python = _tier.python, python
_tier.ENABLED, _tier.LIMIT, _tier._COMPILER.request = True, {limit}, request
_tier.loaded = lambda disp, sig: None  # as if nothing were cached: every loop tiered
prob, data = _spiral()
def gradient():
    v, g = sciml.loss_and_grad(prob, data, solver=sciml.Rodas5(),
                               sensealg=adjoints.GaussAdjoint(), rtol=1e-8,
                               atol=1e-10)
    return [float(v), *g.tolist()]
if {fit}:
    with sciml.compiled_only():  # what sciml.fit and NLME.fit run in
        first = gradient()
        sciml.solve(prob, rtol=1e-8, atol=1e-10, saveat=data.t)  # data a fit would start from
else:
    first = gradient()
tiers = list(_tier._TIERS.values())
before = [t.fn is not None for t in tiers]
for j in jobs:
    j.done.set()
second = gradient()
print(json.dumps({{"first": first, "second": second, "before": before, "jobs": len(jobs),
                  "after": [t.fn is not None for t in tiers],
                  "interpreted": len(interpreted)}}))
"""


def test_interpreted_until_compiled():
    out = _run(_HANDOVER.format(limit=60.0, fit=False))
    # every loop of the gradient ran interpreted, while its compile was not done
    assert out["jobs"] >= 3 and len(out["before"]) == out["jobs"] and not any(out["before"])
    assert all(out["after"])  # then the compiled loops took over
    np.testing.assert_allclose(out["first"], out["second"], rtol=1e-7)


def test_a_fit_waits_for_the_compiled_loops():
    out = _run(_HANDOVER.format(limit=60.0, fit=True))
    assert out["jobs"] >= 3 and out["interpreted"] == 0 and all(out["before"])
    assert out["first"] == out["second"]  # reproducible: what a warm cache gives


def test_an_interpreted_call_out_of_time_starts_over_compiled():
    # stopped at its first kernel call, each loop that calls the model is compiled here (its
    # background compile not begun) and runs compiled (the backward schedule, which calls
    # none, ends interpreted)
    out = _run(_HANDOVER.format(limit=0.0, fit=False))
    assert out["jobs"] >= 3 and sum(out["before"]) >= 2
    # bit for bit: the compiled loops started from the arguments as they came
    assert out["first"] == out["second"]


_BACKGROUND = """
import json, numpy as np, sciml
from sciml import _tier
from tests.sciml.test_tier import _spiral
from numba.core.base import builtin_registry
from numba.core.registry import cpu_target
prob, data = _spiral()
started = _tier._COMPILER.proc is not None  # by the model's build, before any solve
first = sciml.solve(prob, rtol=1e-8, atol=1e-10, saveat=data.t).u
prepared = builtin_registry in cpu_target.target_context._registries
tiers = list(_tier._TIERS.values())
jobs = [t.job for t in tiers]
ok = [j.done.wait(300) and j.ok for j in jobs]
again = sciml.solve(prob, rtol=1e-8, atol=1e-10, saveat=data.t).u
loaded = [_tier.loaded(t.disp, t.sig) is not None for t in tiers]
print(json.dumps({"n": len(tiers), "ok": ok, "loaded": loaded, "prepared": prepared,
                  "started": started, "diff": float(np.max(np.abs(first - again)))}))
"""

_WARM = """
import json, sciml
from sciml import _tier
from tests.sciml.test_tier import _spiral
prob, data = _spiral()
print(json.dumps({"started": _tier._COMPILER.proc is not None}))
"""


def test_the_background_process_fills_an_empty_cache(tmp_path):
    out = _run(_BACKGROUND, SCIML_INTERPRET="1", NUMBA_CACHE_DIR=str(tmp_path))
    assert out["n"] >= 1 and all(out["ok"]) and all(out["loaded"])
    assert out["diff"] < 1e-10
    # the first, interpreted solve found nothing on disk without numba preparing its
    # compiler first (0.15-0.2 s of a cold first call)
    assert not out["prepared"]
    # started as the model was built, the cache being empty; not where it holds loops
    assert out["started"]
    assert not _run(_WARM, SCIML_INTERPRET="1", NUMBA_CACHE_DIR=str(tmp_path))["started"]


class _Pipe:
    """The background process's ends of the pipes: what it was asked, what it answers."""

    def __init__(self, answers=()):
        self.asked, self.stdout = [], answers

    def write(self, line):
        self.asked.append(pickle.loads(base64.b64decode(line))[1:3])

    def flush(self):
        pass

    def poll(self):
        return None


def test_a_one_off_function_compiles_after_the_loops():
    from sciml import _tier
    from sciml.solvers.kernels import ros, sparse

    compiler = _tier._Compiler()
    compiler.proc = pipe = _Pipe()
    pipe.stdin = pipe
    sig = ("argument types",)
    once = compiler.request(sparse.symbolic, sig)  # asked first, as a model's load does
    loop = compiler.request(ros.ros_integrate, sig)
    assert pipe.asked == [("sciml.solvers.kernels.ros", "ros_integrate")]
    key = (id(ros.ros_integrate), sig)
    pipe.stdout = [base64.b64encode(pickle.dumps((key, status))) + b"\n"
                   for status in ("started", "ok")]
    compiler._answers()  # the loop compiled: the process is idle
    assert loop.ok and pipe.asked[1:] == [("sciml.solvers.kernels.sparse", "symbolic")]
    assert compiler.idle == [] and once is compiler.jobs[(id(sparse.symbolic), sig)]
    # asked once the loops are compiled, a one-off goes at once
    compiler.request(sparse._positions, sig)
    assert pipe.asked[2:] == [("sciml.solvers.kernels.sparse", "_positions")]


def test_an_interpreted_call_stops_when_its_compile_is_done():
    import threading

    from sciml._interpret import TooSlow, deadline, interrupt

    ready = threading.Event()
    with deadline(60.0, ready):
        for _ in range(32):
            interrupt()  # neither late nor ready: goes on
        ready.set()
        with pytest.raises(TooSlow):
            for _ in range(16):  # it looks at every 16th call
                interrupt()
    for _ in range(32):
        interrupt()  # outside: never stops


def test_a_forked_child_waits_for_no_compile_of_its_parent(monkeypatch):
    from sciml import _tier

    compiler = _tier._Compiler()
    monkeypatch.setattr(_tier, "_COMPILER", compiler)
    job = compiler.jobs["a loop"] = _tier._Job()
    _tier._forked()  # what os.fork runs in the child
    assert job.done.is_set() and not job.ok  # the tier loads from the cache or compiles
    assert compiler.jobs == {} and compiler.proc is None  # a background process of its own


_FORK = """
import json, os, numpy as np, sciml, adjoints
from sciml import _tier
from tests.sciml.test_tier import _spiral
_tier.ENABLED = True
_tier.loaded = lambda disp, sig: None  # every loop tiered, with a real background process
prob, data = _spiral()
def gradient():
    return sciml.loss_and_grad(prob, data, sensealg=adjoints.GaussAdjoint(), rtol=1e-8,
                               atol=1e-10)[1]
g = gradient()
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # the answer thread was reading the background process's pipe at the fork
    os.write(w, (np.abs(gradient() - g).max() / np.abs(g).max()).tobytes())
    os._exit(0)
child = np.frombuffer(os.read(r, 8), dtype=np.float64)[0]
os.waitpid(pid, 0)
print(json.dumps({"child": float(child), "background": _tier._COMPILER.proc is not None}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_runs_without_its_parents_background_process():
    out = _run(_FORK, timeout=180)  # a lock held at the fork would hang the child
    assert out["background"] and out["child"] < 1e-7


def test_the_rosenbrock_interpolants_numpy_stand_in_agrees_with_its_loops():
    """What the interpreter runs for `ros._step_interp` (one matrix product and a Horner
    sum) against the loops, at both ends of a step and inside, for fewer outputs than
    the stages' columns too."""
    from sciml._interpret import python
    from sciml.solvers.kernels import ros
    from sciml.solvers.tableaus import RODAS5

    assert python(ros._step_interp) is ros._step_interp_numpy
    tab, rng = RODAS5._engine, np.random.default_rng(0)
    for n, cols in ((9, 9), (3, 5)):
        K = rng.standard_normal((len(tab.c), cols))
        z, znew = rng.standard_normal(cols), rng.standard_normal(cols)
        for theta in (0.0, 0.3, 1.0):
            loops, numpy_ = np.zeros(n), np.full(n, np.nan)
            ros._step_interp(tab, loops, theta, 0.1, z, znew, K, None)
            ros._step_interp_numpy(tab, numpy_, theta, 0.1, z, znew, K, None)
            np.testing.assert_allclose(numpy_, loops, rtol=1e-13, atol=1e-14)
