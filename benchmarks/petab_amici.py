"""AMICI on the Benchmark-Models-PEtab collection: the speed peer of `petab_collection`.

Runs under AMICI's own interpreter, never the project's (it imports no project
package)::

    /work/amicivenv/bin/python benchmarks/petab_amici.py --collection PATH \
        [--models A B ...] [--models-dir /work/amici_models] [--repeat 5] \
        [--rtol 1e-8 --atol 1e-8 --max-steps 10000] \
        [--json benchmarks/results/petab_amici.json]

``--rtol/--atol/--max-steps`` change the solver's settings from AMICI's CI's (the
reference run at rtol 1e-12, atol 1e-16 is ``results/petab_amici_tight.json``: the llh of
models whose value moves with the tolerance, Okuonghae's and Oliveira's, converged).

For each model: AMICI's PEtab v1 import (`amici.importers.petab.v1.
import_petab_problem`, the SBML -> C++ code generation and compile, timed
separately as ``compile_s``; a model compiled before is reused and keeps the
compile time recorded beside it), then at the nominal parameters, with the
settings of AMICI's CI (tests/benchmark_models/test_petab_benchmark.py at
AMICI-dev/AMICI 3aebbe8, v1.0.1: rtol = atol = 1e-8, max_steps 10,000,
timepoint-specific overrides flattened, steady-state sensitivities by
integration for Brannmark and Isensee, the solver's other defaults: CVODES BDF,
Newton, dense KLU-free direct solver), three settings one after the other:

* ``sim``: the llh alone (``SensitivityOrder.none``);
* ``fwd``: llh + gradient by forward sensitivities (first order);
* ``adj``: llh + gradient by adjoint sensitivities (first order).

Each is timed three ways, medians over ``--repeat`` calls after one warm-up:

* ``t_*``: wall-clock of ``simulate_petab`` with the ExpData objects and the
  parameter mapping built once beforehand (as pyPESTO's objective reuses them:
  what an optimiser pays per evaluation). This is the number to set beside the
  project's ``petab_collection`` times (also wall-clock medians of a prepared
  objective).
* ``cpu_*``: AMICI's CI metric, the sum over conditions of the solver's own
  ``cpu_time + cpu_time_b`` (forward + backward integration only, no Python);
  CI takes the minimum of 3, reported here as ``cpu_*_min`` beside the median.
  It leaves out pre-equilibration; ``cpu_total_*`` (``cpu_time_total``) has it.
* ``full_*``: wall-clock of ``simulate_petab`` from the PEtab problem alone
  (mapping and ExpData rebuilt each call).

The llh is AMICI's (no priors). The gradient is w.r.t. the estimated
parameters on linear scale (``scaled_gradients=False``); ``grad_fwd_adj`` is
the largest relative difference between the forward and adjoint gradients.
``os.getloadavg()`` is recorded before and after each model's timings. Each
model runs in its own child process, so a crash is recorded as such.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import warnings

# run as a script, its folder leads sys.path, and benchmarks/petab.py would shadow
# the `petab` library: this script sees neither that folder nor the repository
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path
               if os.path.abspath(p or ".") not in (_HERE, os.path.dirname(_HERE))]

#: llh and CI ceilings (s: t_sim, t_fwd, t_adj) of AMICI's benchmark tests, from
#: amici_ci.json beside this script (shared with petab_collection; provenance there)
with open(os.path.join(_HERE, "amici_ci.json")) as _f:
    AMICI_CI = {k: tuple(v) for k, v in json.load(_f)["models"].items()}

#: models AMICI's CI computes steady-state sensitivities of by integration
SS_INTEGRATION_ONLY = ("Brannmark_JBC2010", "Isensee_JCB2018")

#: AMICI's CI settings for the nominal-parameter llh and timing test
RTOL = ATOL = 1e-8
MAX_STEPS = 10_000


def problem_yaml(folder):
    name = os.path.basename(os.path.normpath(folder))
    path = os.path.join(folder, f"{name}.yaml")
    return path if os.path.exists(path) else None


def machine_info():
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    from importlib.metadata import version

    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "amici": version("amici"),
        "petab": version("petab"),
        "numpy": version("numpy"),
        "sympy": version("sympy"),
        "blas": "scipy-openblas64 (AMICI's build requirement)",
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
    }


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def run_one(folder, models_dir, repeat, budget, rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS):
    """One model, in this process, at the solver's tolerances `rtol`, `atol` and step
    limit `max_steps` (AMICI's CI settings by default); returns its row."""
    import logging

    import numpy as np
    import petab.v1 as petab
    from amici.importers.petab.v1 import import_petab_problem
    from amici.sim.sundials import (
        AMICI_SUCCESS,
        SensitivityMethod,
        SensitivityOrder,
        SteadyStateSensitivityMode,
    )
    from amici.sim.sundials.petab.v1 import (
        LLH,
        RDATAS,
        SLLH,
        create_edatas,
        simulate_petab,
    )
    from amici.sim.sundials.petab.v1._parameter_mapping import (
        create_parameter_mapping,
    )
    from petab.v1.lint import measurement_table_has_timepoint_specific_mappings

    name = os.path.basename(os.path.normpath(folder))
    row = {"model": name}
    yaml = problem_yaml(folder)
    if yaml is None:
        row["failed"] = "no PEtab problem file"
        return row
    try:
        problem = petab.Problem.from_yaml(yaml)
    except Exception as e:
        row["failed"] = f"petab load: {type(e).__name__}: {str(e).splitlines()[0]}"
        return row
    if problem.model is None:
        row["failed"] = "no SBML model in the problem"
        return row
    if measurement_table_has_timepoint_specific_mappings(problem.measurement_df):
        petab.flatten_timepoint_specific_output_overrides(problem)
        row["flattened"] = True

    out = os.path.join(models_dir, name)
    stamp = os.path.join(out, "_compile_time.json")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = import_petab_problem(problem, output_dir=out)
    except Exception as e:
        row["failed"] = f"import: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
        row["compile_s"] = time.perf_counter() - t0
        return row
    t_import = time.perf_counter() - t0
    if t_import > 5.0 or not os.path.exists(stamp):
        # compiled now (a reused model loads in well under a second)
        with open(stamp, "w") as f:
            json.dump({"compile_s": t_import, "load1": os.getloadavg()[0]}, f)
        row["compile_s"] = t_import
        row["compile_load"] = os.getloadavg()[0]
    else:
        with open(stamp) as f:
            st = json.load(f)
        row["compile_s"] = st["compile_s"]
        row["compile_load"] = st.get("load1")
        row["compile_reused"] = True

    nx = model.nx_rdata
    row.update(
        n_states=int(nx() if callable(nx) else nx),
        n_params=int(problem.parameter_df[petab.ESTIMATE].sum()),
    )
    solver = model.create_solver()
    solver.set_absolute_tolerance(atol)
    solver.set_relative_tolerance(rtol)
    solver.set_max_steps(max_steps)
    if name in SS_INTEGRATION_ONLY:
        model.set_steady_state_sensitivity_mode(
            SteadyStateSensitivityMode.integrationOnly
        )

    sim_conds = problem.get_simulation_conditions_from_measurement_df()
    mapping = create_parameter_mapping(
        petab_problem=problem,
        simulation_conditions=sim_conds,
        scaled_parameters=True,
        amici_model=model,
    )
    edatas = create_edatas(
        amici_model=model, petab_problem=problem, simulation_conditions=sim_conds
    )
    row["n_sims"] = len(edatas)

    def prepared():
        return simulate_petab(
            problem, amici_model=model, solver=solver, edatas=edatas,
            parameter_mapping=mapping, log_level=logging.ERROR,
        )

    def full():
        return simulate_petab(
            problem, amici_model=model, solver=solver, log_level=logging.ERROR
        )

    row["load_before"] = list(os.getloadavg())
    grads = {}
    for key, method in (
        ("sim", SensitivityMethod.none),
        ("fwd", SensitivityMethod.forward),
        ("adj", SensitivityMethod.adjoint),
    ):
        solver.set_sensitivity_method(method)
        solver.set_sensitivity_order(
            SensitivityOrder.none if key == "sim" else SensitivityOrder.first
        )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = prepared()  # warm-up, and the values
                bad = [r.status for r in res[RDATAS] if r.status != AMICI_SUCCESS]
                if bad or not np.isfinite(res[LLH]):
                    row[f"failed_{key}"] = (
                        f"status {bad[:3]} in {len(bad)} of {len(res[RDATAS])} "
                        f"conditions, llh {res[LLH]}"
                    )
                    continue
                if key == "sim":
                    row["llh"] = float(res[LLH])
                else:
                    row[f"llh_{key}"] = float(res[LLH])
                    grads[key] = np.array(list(res[SLLH].values()), float)
                ts, cpus, cputot = [], [], []
                t_end = time.perf_counter() + budget
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    r = prepared()
                    ts.append(time.perf_counter() - t0)
                    cpus.append(
                        sum(d.cpu_time + d.cpu_time_b for d in r[RDATAS]) / 1000
                    )
                    cputot.append(sum(d.cpu_time_total for d in r[RDATAS]) / 1000)
                    if time.perf_counter() > t_end:
                        break
                fulls = []
                for _ in range(min(3, len(ts))):
                    t0 = time.perf_counter()
                    full()
                    fulls.append(time.perf_counter() - t0)
        except Exception as e:
            row[f"failed_{key}"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
            continue
        row[f"t_{key}"] = _median(ts)
        row[f"cpu_{key}"] = _median(cpus)
        row[f"cpu_{key}_min"] = min(cpus)
        row[f"cpu_total_{key}"] = _median(cputot)
        row[f"full_{key}"] = _median(fulls)
        row[f"n_{key}"] = len(ts)
    row["load_after"] = list(os.getloadavg())
    if "fwd" in grads and "adj" in grads:
        g, h = grads["fwd"], grads["adj"]
        row["grad_fwd_adj"] = float(
            np.max(np.abs(g - h)) / max(np.max(np.abs(g)), 1e-300)
        )
        row["grad_norm"] = float(np.linalg.norm(g))
    if name in AMICI_CI:
        ref, *ceil = AMICI_CI[name]
        row["ref_amici_ci"] = ref
        row["ci_ceilings"] = ceil
        if "llh" in row:
            row["llh_err"] = abs(row["llh"] - ref)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collection", default=os.environ.get(
        "BENCHMARK_MODELS_PETAB", "/work/bmp/Benchmark-Models"))
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--models-dir", default="/work/amici_models")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--budget", type=float, default=60.0,
                    help="stop repeating a setting after this many seconds")
    ap.add_argument("--timeout", type=float, default=3600.0,
                    help="per model (compile included), seconds")
    ap.add_argument("--json", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "petab_amici.json"))
    ap.add_argument("--rtol", type=float, default=RTOL)
    ap.add_argument("--atol", type=float, default=ATOL)
    ap.add_argument("--max-steps", type=int, default=MAX_STEPS)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("AMICI_PARALLEL_COMPILE", str(os.cpu_count() or 1))
    # the models' SWIG wrappers must come from the SWIG that built AMICI (the `swig`
    # wheel in AMICI's venv), not from a system one found first on PATH: a model
    # wrapped by Debian's swig 4.1 under AMICI built with 4.5 fails to load
    # ("'SwigPyObject' object has no attribute 'module'")
    os.environ["PATH"] = (os.path.dirname(sys.executable) + os.pathsep
                          + os.environ.get("PATH", ""))

    if args.one:
        row = run_one(args.one, args.models_dir, args.repeat, args.budget,
                      args.rtol, args.atol, args.max_steps)
        assert not any(m.split(".")[0] in ("sciml", "adjoints", "nets", "benchmarks")
                       for m in sys.modules), "a project package was imported"
        print("ROW " + json.dumps(row))
        return

    names = args.models or sorted(
        d for d in os.listdir(args.collection)
        if os.path.isdir(os.path.join(args.collection, d))
    )
    try:
        with open(args.json) as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {"rows": []}
    rows = {r["model"]: r for r in data.get("rows", [])}
    data["machine"] = machine_info()
    data["settings"] = {
        "rtol": args.rtol, "atol": args.atol, "max_steps": args.max_steps,
        "repeat": args.repeat, "num_threads": 1,
        "source": "AMICI-dev/AMICI tests/benchmark_models at 3aebbe8 (v1.0.1)",
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    os.makedirs(args.models_dir, exist_ok=True)
    for name in names:
        folder = os.path.join(args.collection, name)
        print(f"--- {name}", flush=True)
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--one", folder,
                 "--models-dir", args.models_dir, "--repeat", str(args.repeat),
                 "--budget", str(args.budget), "--rtol", repr(args.rtol),
                 "--atol", repr(args.atol), "--max-steps", str(args.max_steps)],
                capture_output=True, text=True, timeout=args.timeout,
                cwd=args.models_dir,
            )
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
            if lines:
                row = json.loads(lines[-1][4:])
            else:
                tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
                row = {"model": name,
                       "failed": f"child exited {p.returncode}: {' | '.join(tail)[:400]}"}
        except subprocess.TimeoutExpired:
            row = {"model": name, "failed": f"timed out after {args.timeout:.0f} s"}
        row["wall_total_s"] = time.perf_counter() - t0
        rows[name] = row
        print(fmt_row(row), flush=True)
        data["rows"] = [rows[k] for k in sorted(rows)]
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    print_table(data["rows"])


def _s(x, w=9):
    return f"{x:{w}.4g}" if isinstance(x, (int, float)) else f"{'-':>{w}}"


HEADER = (f"{'model':<36}{'llh':>14}{'sim s':>9}{'fwd s':>9}{'adj s':>9}"
          f"{'compile s':>10}{'load':>6}  CI ceil sim/fwd/adj")


def fmt_row(r):
    if "failed" in r:
        return f"{r['model']:<36} FAILED: {r['failed']}"
    llh = f"{r['llh']:14.6f}" if "llh" in r else f"{'-':>14}"
    ceil = r.get("ci_ceilings")
    ceil = "/".join("-" if c is None else f"{c:g}" for c in ceil) if ceil else ""
    load = r.get("load_before", [None])[0]
    s = (f"{r['model']:<36}{llh}{_s(r.get('t_sim'))}{_s(r.get('t_fwd'))}"
         f"{_s(r.get('t_adj'))}{_s(r.get('compile_s'), 10)}"
         f"{_s(load, 6) if load is not None else '-':>6}  {ceil}")
    fails = [f"{k[7:]}: {v}" for k, v in r.items() if k.startswith("failed_")]
    return s + ("".join(f"\n    failed {f}" for f in fails))


def print_table(rows):
    print(HEADER)
    for r in rows:
        print(fmt_row(r))


if __name__ == "__main__":
    main()
