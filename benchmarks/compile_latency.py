"""Benchmark 5, ``compile_latency``: time to a first result for a model the process has never seen.

Every case runs in new Python processes. A *new model* is a model whose
source no earlier process has seen (each run adds a different constant to
its right-hand side), so nothing of it can come from a cache: what a
scientist waits for after editing a model. Rows:

- ``new model``: caches warm for everything but this model's source (a
  first process with another model warmed them), timed inside the process
  from ``sciml.Model(...)`` to the first ``sciml.loss_and_grad`` returning
  (its default method), imports excluded;
- ``new model, every method``: the same, then one gradient by each of the
  seven methods (Tsit5), and with Rodas5 by the stiff default;
- ``diffrax``: the same model in JAX/diffrax, timed from defining the
  vector field to the first jitted solve and ``value_and_grad`` returning
  (RecursiveCheckpointAdjoint, Tsit5), imports excluded;
- ``cold``: the ``new model`` row with empty caches: the engine's loops run interpreted
  while a background process compiles them (`sciml._tier`), and, ``compiled in
  process``, with that switched off (``SCIML_INTERPRET=0``: numba compiles each loop
  before its first call);
- ``PEtab Boehm, cold``: ``sciml.petab.load`` of Boehm_JProteomeRes2014 (the
  Benchmark-Models collection's, in tests/data) to its first ``llh`` and
  ``llh_and_grad`` returning, empty caches, imports excluded;
- ``nets``: ``nets.loss_and_grad`` of the 4-32-16-4 matrix-exponential chain,
  warm and cold, imports included (its kernels are generic over chains);
- ``LeNet5``: ``nets.train``'s first float32 epoch of LeNet5 (two minibatches of 64
  random 28 x 28 images, Adam), empty caches, imports included: when a new user's
  first epoch starts running.

The model: the Lotka-Volterra UDE with a 2-16-16-2 tanh network, 31
observations of both states on (0, 3), sum of squares. Each warm row is the
median of three runs.

Every process but the cold ones runs with ``SCIML_INTERPRET=0`` (see
``benchmarks/__init__.py``), so that a warmed cache holds every loop.

Run as ``python -m benchmarks.compile_latency [--json PATH] [--quick]``. With
``--collection PATH`` (the Benchmark-Models-PEtab clone's ``Benchmark-Models`` folder) it
times instead every model of the collection that loads, each in a new process with empty
caches: load, first llh, first llh + gradient (``results/compile_latency_collection.json``).
"""

import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import _harness as H

_SETUP = """
import time, json
import numpy as np
t_import = time.perf_counter()
import sciml, adjoints
from nets import Chain, Dense
t0 = time.perf_counter()
U = Chain(2, Dense(16, "tanh"), Dense(16, "tanh"), Dense(2))
def f(u, p, t, nets):
    x, y = u
    z = nets.U(u)
    return [p.alpha * x + z[0] + {salt!r}, -p.delta * y + z[1]]
model = sciml.Model(f, states=["x", "y"], params=["alpha", "delta"], nets={{"U": U}})
theta = model.init_params(seed=0, alpha=1.3, delta=1.8)
prob = sciml.ODEProblem(model, [0.44249296, 4.6280594], (0.0, 3.0), theta)
t = np.linspace(0.0, 3.0, 31)
data = sciml.Data(t, np.ones((31, 2)))
v, g = sciml.loss_and_grad(prob, data)
marks = {{"first_gradient": time.perf_counter() - t0}}
"""

_EVERY = """
methods = [adjoints.DiscreteAdjoint(), adjoints.InterpolatingAdjoint(),
           adjoints.InterpolatingAdjoint(checkpointing=True), adjoints.BacksolveAdjoint(),
           adjoints.GaussAdjoint(), adjoints.QuadratureAdjoint(), adjoints.ForwardSensitivity()]
for m in methods:
    sciml.loss_and_grad(prob, data, sensealg=m)
sciml.loss_and_grad(prob, data, solver=sciml.Rodas5())
marks["every_method"] = time.perf_counter() - t0
"""

_DIFFRAX = """
import time, json
import numpy as np
import jax, jax.numpy as jnp, diffrax
jax.config.update("jax_enable_x64", True)
t0 = time.perf_counter()
rng = np.random.default_rng(0)
sizes = (2, 16, 16, 2)
params = [(jnp.asarray(rng.uniform(-0.5, 0.5, (o, i))), jnp.zeros(o))
          for i, o in zip(sizes[:-1], sizes[1:])]
theta = {{"mech": jnp.array([1.3, 1.8]), "net": params}}
def field(t, u, th):
    z = u
    for k, (W, b) in enumerate(th["net"]):
        z = W @ z + b
        if k < len(th["net"]) - 1:
            z = jnp.tanh(z)
    a, d = th["mech"]
    return jnp.array([a * u[0] + z[0] + {salt!r}, -d * u[1] + z[1]])
ts = jnp.linspace(0.0, 3.0, 31)
term = diffrax.ODETerm(field)
def solve(th):
    return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 3.0, None,
                               jnp.array([0.44249296, 4.6280594]), args=th,
                               saveat=diffrax.SaveAt(ts=ts),
                               stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
                               max_steps=100_000,
                               adjoint=diffrax.RecursiveCheckpointAdjoint()).ys
y_obs = jnp.ones((31, 2))
loss = jax.jit(jax.value_and_grad(lambda th: jnp.sum((solve(th) - y_obs) ** 2)))
jax.block_until_ready(jax.jit(solve)(theta))
jax.block_until_ready(loss(theta))
marks = {{"first_gradient": time.perf_counter() - t0}}
"""

_NETS = """
import numpy as np
import nets
chain = nets.Chain(4, nets.Dense(32, "tanh"), nets.Dense(16, "tanh"), nets.Dense(4))
p = chain.init_params(seed=0, dtype=np.float32)
X = np.ones((100, 4), np.float32)
nets.loss_and_grad(chain, p, X, X)
marks = {}
"""

_LENET = """
import numpy as np
import nets
from nets import Chain, Conv, Dense, Flatten, MaxPool
lenet = Chain((1, 28, 28), Conv(6, (5, 5), "relu"), MaxPool((2, 2)), Conv(16, (5, 5), "relu"),
              MaxPool((2, 2)), Flatten(), Dense(120, "relu"), Dense(84, "relu"), Dense(10))
p = lenet.init_params(seed=0, dtype=np.float32)
rng = np.random.default_rng(0)
X, y = rng.random((128, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 128)
nets.train(lenet, p, X, y, loss=nets.LogitCrossEntropyLoss(), optimizer=nets.Adam(3e-4),
           epochs=1, batch_size=64)
marks = {}
"""

_PETAB = """
import time, warnings
import sciml.petab
warnings.simplefilter("ignore")
t0 = time.perf_counter()
pp = sciml.petab.load({yaml!r})
t1 = time.perf_counter()
pp.llh(pp.nominal)
t2 = time.perf_counter()
pp.llh_and_grad(pp.nominal)
t3 = time.perf_counter()
marks = {{"load": t1 - t0, "llh": t2 - t1, "grad": t3 - t2, "first_gradient": t3 - t0}}
"""

BOEHM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                     "data", "benchmark_models", "Boehm_JProteomeRes2014",
                     "Boehm_JProteomeRes2014.yaml")

_REPORT = "\nimport json\nprint('MARKS ' + json.dumps(marks))\n"


def _run(code, cache, interpret=False):
    """(wall time of the process, its internal marks); ``interpret``: the engine's first
    calls interpreted while it compiles (`sciml._tier`), else compiled before them."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONHASHSEED="0",
               SCIML_INTERPRET="1" if interpret else "0")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code + _REPORT], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    _wait_for_group(proc.pid)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
    line = next(s for s in out.splitlines() if s.startswith("MARKS "))
    return wall, json.loads(line[6:])


def _wait_for_group(pgid, timeout=600.0):
    """Until the process group ``pgid`` is gone: a process's background compiler
    (`sciml._tier`) finishes the loop it is compiling after its parent has ended, into the
    cache folder the caller is about to remove (and its compile would load the next run)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)


class _Salt:
    """A different constant for every run: a model source no process has seen."""

    def __init__(self):
        self.k = int(time.time() * 1000) % 1_000_000

    def __call__(self):
        self.k += 1
        return 1e-12 * self.k


def collection(folder, path):
    """Every model of the collection that loads, cold, each in its own process."""
    rows = []
    from benchmarks.petab_collection import problem_yaml

    for model in sorted(glob.glob(os.path.join(folder, "*", ""))):
        name, yaml = os.path.basename(model.rstrip(os.sep)), problem_yaml(model)
        if yaml is None:
            continue
        with tempfile.TemporaryDirectory() as cache:
            try:
                wall, marks = _run(_PETAB.format(yaml=yaml), cache, interpret=True)
            except subprocess.CalledProcessError as e:
                print(f"{name:40s} not loaded: {e.stderr.strip().splitlines()[-1][:80]}")
                continue
        rows.append({"model": name, "wall_s": wall, **marks})
        print(f"{name:40s} load {marks['load']:6.2f}  llh {marks['llh']:6.2f}  "
              f"gradient {marks['grad']:6.2f}  first llh + gradient "
              f"{marks['first_gradient']:6.2f} s (process {wall:.1f} s)", flush=True)
    firsts = sorted(r["first_gradient"] for r in rows)
    print(f"{len(rows)} models: median {statistics.median(firsts):.2f} s, "
          f"{sum(f < 5.0 for f in firsts)} under 5 s")
    with open(path, "w") as fh:
        json.dump({"bench": "compile_latency_collection", "machine": H.machine_info(1),
                   "rows": rows}, fh, indent=2)


def main(argv=None):
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--collection", help="the Benchmark-Models folder: time its models cold")
    args = parser.parse_args(argv)
    if args.collection:
        return collection(args.collection, args.json or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results",
            "compile_latency_collection.json"))
    salt = _Salt()
    rows = []
    repeats = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as cold_cache, tempfile.TemporaryDirectory() as cache:
        # warm the engine with one model, then time models it has never seen
        _run(_SETUP.format(salt=salt()) + _EVERY, cache)
        new = [_run(_SETUP.format(salt=salt()), cache)[1]["first_gradient"]
               for _ in range(repeats)]
        every = [_run(_SETUP.format(salt=salt()) + _EVERY, cache)[1] for _ in range(repeats)]
        cold_wall, cold = _run(_SETUP.format(salt=salt()), cold_cache, interpret=True)
        with tempfile.TemporaryDirectory() as compiled_cache:
            compiled_wall, compiled = _run(_SETUP.format(salt=salt()), compiled_cache)
        with tempfile.TemporaryDirectory() as boehm_cache:
            boehm_wall, boehm = _run(_PETAB.format(yaml=BOEHM), boehm_cache, interpret=True)
        try:
            import diffrax  # noqa: F401

            dfx = [_run(_DIFFRAX.format(salt=salt()), cache)[1]["first_gradient"]
                   for _ in range(repeats)]
        except ImportError:
            dfx = None
        with tempfile.TemporaryDirectory() as nets_cache:
            nets_cold = _run(_NETS, nets_cache)[0]
            nets_warm = min(_run(_NETS, nets_cache)[0] for _ in range(repeats))
        with tempfile.TemporaryDirectory() as lenet_cache:
            lenet_cold = _run(_LENET, lenet_cache)[0]

    med = statistics.median
    table = [
        ("new model: Model() to first gradient", med(new), "warm engine, imports excluded"),
        ("new model, every method", med(e["every_method"] for e in every),
         "7 methods with Tsit5, then Rodas5"),
        ("  of which the first gradient", med(e["first_gradient"] for e in every), ""),
        ("cold: empty caches, first gradient", cold["first_gradient"],
         f"process wall time {cold_wall:.1f} s"),
        ("  compiled in process (SCIML_INTERPRET=0)", compiled["first_gradient"],
         f"process wall time {compiled_wall:.1f} s"),
        ("PEtab Boehm, cold: load to first llh + gradient", boehm["first_gradient"],
         f"load {boehm['load']:.2f}, llh {boehm['llh']:.2f}, gradient {boehm['grad']:.2f} s; "
         f"process wall time {boehm_wall:.1f} s"),
    ]
    if dfx is not None:
        table.append(("diffrax: jit solve + value_and_grad", med(dfx), "imports excluded"))
    table += [("nets.loss_and_grad, warm (with imports)", nets_warm, ""),
              ("nets.loss_and_grad, cold (with imports)", nets_cold, ""),
              ("LeNet5 first float32 epoch, cold (with imports)", lenet_cold,
               "2 minibatches of 64")]
    width = max(len(r[0]) for r in table)
    print(f"{'case':{width}s}  {'seconds':>8s}")
    for name, sec, note in table:
        print(f"{name:{width}s}  {sec:8.2f}  {note}")
        rows.append({"impl": name.strip(), "unit": "seconds", "median_s": sec, "min_s": sec,
                     "max_s": sec, "first_call_s": sec, "quality": {}})
    ratios = {}
    if dfx is not None:
        ratios["diffrax/new model"] = med(dfx) / med(new)
        ratio = ratios["diffrax/new model"]
        print(f"ratio diffrax / ours (new model to first gradient): {ratio:.1f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"bench": "compile_latency", "machine": H.machine_info(args.threads),
                       "results": rows, "ratios": ratios}, fh, indent=2)


if __name__ == "__main__":
    main()
