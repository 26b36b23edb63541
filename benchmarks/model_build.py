"""Benchmark ``model_build``: building a large model and its first solve, in a fresh process.

Robertson's kinetics copied ``ngroups`` times (`benchmarks.stiff_scaling.ours_model`:
the model function unrolls a Python loop over the groups, 3 ngroups states,
3 parameters, 7 Jacobian non-zeros a group). For each size, a new Python
process (the engine's loops warm in numba's disk cache, the model new to it):

- ``build``: ``sciml.Model(...)`` (tracing the function);
- ``first solve``: from there to the first ``sciml.solve(prob, sciml.BDF())``
  returning (rtol 1e-4, to t = 1e5): the right-hand side and the sparse
  Jacobian's kernels generated and compiled, the sparse LU analysed, the
  engine loaded, the solve;
- ``solve``: the median of the next calls (the solve alone);
- ``kernels``: statements in the two kernels' trees (rhs + spjac) and the
  length of their LLVM IR, which must grow linearly with the states;
- ``peak MB``: the process's peak resident memory.

Wall and CPU (this process) seconds are both given: the machine may be
shared, and the CPU time is what the work costs. Run as
``python -m benchmarks.model_build [--groups 100,1000,3334,10000] [--json PATH]``.
"""

import json
import os
import subprocess
import sys

from benchmarks import _harness as H

_CHILD = r"""
import json, resource, statistics, time
import numpy as np
t0 = time.perf_counter()
import sciml
from sciml.model import code, llvm
from benchmarks.stiff_scaling import K, T_END, ours_model
ng = {ng}
out = {{"import_s": time.perf_counter() - t0}}
w, c = time.perf_counter(), time.process_time()
model = ours_model(ng)
out["build_s"], out["build_cpu_s"] = time.perf_counter() - w, time.process_time() - c
prob = sciml.ODEProblem(model, u0=np.tile([1.0, 0.0, 0.0], ng), tspan=(0.0, T_END),
                        params=np.array(K))
run = lambda: sciml.solve(prob, sciml.BDF(), rtol=1e-4, atol=1e-8, saveat=[T_END])
w, c = time.perf_counter(), time.process_time()
sol = run()
out["first_s"], out["first_cpu_s"] = time.perf_counter() - w, time.process_time() - c
times = []
for _ in range(5):
    w = time.perf_counter()
    run()
    times.append(time.perf_counter() - w)
out["solve_s"] = statistics.median(times)
out["status"] = sol.status
fs = model._asm.sets["f"]
trees = [fs.tree("rhs", "values"), fs.tree("spjac", "spjac")]
out["statements"] = sum(1 for k in trees for _ in k.statements())
out["ir_chars"] = len(llvm.ir_text(trees))
out["nnz"] = int(model._pattern()[1].shape[0])
out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps(out))
"""


def child(ng):
    """The measurements of one fresh process for `ng` groups."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", _CHILD.format(ng=ng)], env=env, check=True,
                         capture_output=True, text=True, cwd=root).stdout
    line = next(s for s in res.splitlines() if s.startswith("RESULT "))
    return json.loads(line[7:])


def main(argv=None):
    p = H.make_parser(__doc__.splitlines()[0])
    p.add_argument("--groups", default="100,1000,3334,10000",
                   help="comma-separated group counts (3 states each)")
    args = p.parse_args(argv)
    groups = [int(g) for g in args.groups.split(",")]
    if args.quick:
        groups = [g for g in groups if g <= 1000] or groups[:1]
    info = H.machine_info(args.threads)
    print(f"model_build: {info['cpu']}, {info['cpus']} cores; {H.busy_note()}")
    head = (f"{'groups':>7s} {'states':>7s} {'nnz':>7s}  {'build s':>13s}  {'first solve s':>13s}"
            f"  {'solve ms':>8s}  {'stmts':>7s}  {'IR MB':>6s}  {'peak MB':>7s}  load")
    print(head)
    rows = []
    for ng in groups:
        mon = H.OtherLoad().start()
        r = child(ng)
        load = mon.stop()
        r.update(groups=ng, states=3 * ng, other_load=load)
        rows.append(r)
        print(f"{ng:7d} {3 * ng:7d} {r['nnz']:7d}  {r['build_s']:5.2f} ({r['build_cpu_s']:5.2f})"
              f"  {r['first_s']:5.2f} ({r['first_cpu_s']:5.2f})  {1e3 * r['solve_s']:8.2f}"
              f"  {r['statements']:7d}  {r['ir_chars'] / 1e6:6.2f}  {r['peak_mb']:7.0f}"
              f"  {load if load is None else round(load, 2)}", flush=True)
    print("(wall seconds, this process's CPU seconds in parentheses; load: cores other "
          "processes used meanwhile)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"bench": "model_build", "machine": info, "results": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
