"""The Benchmark-Models-PEtab collection through `sciml.petab`, model by model.

For each model: whether it loads (or the one-line refusal), the log-likelihood at
the nominal parameters against a reference, the gradient against central finite
differences (directional, along random unit directions, from a tighter solve),
and the times of llh, of llh + gradient with the problem's default method
(`adjoints.default_sensealg`), with forward sensitivities (with BDF where the problem's
solver is stiff, as AMICI's forward mode runs) and with the adjoint (`GaussAdjoint`),
and of the first llh + gradient (the load, the model's compile and the
solves together, in this process). ``--markdown`` takes several JSON files: a model's row
comes from the last one that has it (a rerun of some models over a full run).

References, each independent of us: AMICI's values where it publishes one (`AMICI`,
below: its tests/benchmark_models/benchmark_models.yaml, BSD-3-Clause, with its CI
ceilings for simulation, forward and adjoint sensitivities); AMICI run on this machine
(``benchmarks/petab_amici.py``: AMICI 1.0.1 at its CI's rtol = atol = 1e-8, read from
``benchmarks/results/petab_amici.json``, labelled "AMICI here"); libroadrunner's (CVODE at
rtol 1e-10: ``benchmarks/petab_roadrunner.py``, run in its own environment, read from
its JSON); the collection's own ``simulatedData`` table, its llh computed by the `petab`
library (``calculate_llh``), used only where its simulations agree with ours (where
they do not, the table is not at the nominal parameters and is reported as such). The
closest of them is the row's reference, and every other one's difference is reported
beside it (where two references disagree with each other, the table shows which one we
side with). The likelihood is compared without priors, as AMICI reports it. AMICI's
measured times from the same JSON are shown beside its CI ceilings.

The collection is not vendored: clone Benchmarking-Initiative/Benchmark-Models-PEtab
and pass its ``Benchmark-Models`` folder (or set BENCHMARK_MODELS_PETAB)::

    python -m benchmarks.petab_collection --collection PATH [--models A B] [--json PATH]
        [--roadrunner benchmarks/results/petab_roadrunner.json]
        [--amici benchmarks/results/petab_amici.json]
"""

import argparse
import glob
import json
import os
import sys
import time
import warnings

import numpy as np

from ._harness import busy_note, machine_info

#: llh and CI ceilings (s) of AMICI's benchmark tests (`amici_ci.json`, with its provenance)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "amici_ci.json")) as _f:
    AMICI = {k: tuple(v) for k, v in json.load(_f)["models"].items()}


#: the collection's simulations are a reference only where they agree with ours to this
#: (relative): where the noise is huge (Perelson's sigma is 1e5 on a log10 scale) the llh
#: hardly depends on the simulations, and some tables are not at the nominal parameters
SIM_AGREE = 1e-3

#: forward sensitivities are not timed past this many (states x parameters)
FORWARD_LIMIT = 20_000


def problem_yaml(folder):
    """The model's PEtab problem file (the collection's test variants left out)."""
    ys = sorted(y for y in glob.glob(os.path.join(folder, "*.yaml"))
                if "test" not in os.path.basename(y))
    return ys[0] if ys else None


def collection_reference(pp, folder):
    """``(llh, max relative difference of the simulations)`` from the collection's
    ``simulatedData`` table (llh None where the `petab` library cannot compute it: a noise
    formula that reads the states), or None when there is no such table."""
    import pandas as pd
    import petab.v1 as petab

    files = glob.glob(os.path.join(folder, "simulatedData*.tsv")) + glob.glob(
        os.path.join(folder, "simulations.tsv"))
    if not files:
        return None
    ref = pd.read_csv(files[0], sep="\t", dtype=str, keep_default_na=False)
    ours = pp.simulate(pp.nominal)
    if len(ref) == len(ours):
        b = ref["simulation"].astype(float).to_numpy()
    else:  # rows matched by what determines a simulated value
        keys = [c for c in ("observableId", "preequilibrationConditionId",
                            "simulationConditionId", "time", "observableParameters")
                if c in ref.columns and c in ours.columns]
        ref["time"] = ref["time"].astype(float)
        table = {tuple(r[k] for k in keys): float(r["simulation"]) for _, r in ref.iterrows()}
        try:
            b = np.array([table[tuple(r[k] for k in keys)] for _, r in ours.iterrows()])
        except KeyError:
            return None
    a = ours["simulation"].to_numpy()
    diff = float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6 * np.max(np.abs(b)))))
    problem = petab.Problem.from_yaml(problem_yaml(folder))
    meas = problem.measurement_df.reset_index(drop=True)
    sim = meas.copy()
    sim = sim.rename(columns={"measurement": "simulation"})
    sim["simulation"] = b
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            llh = petab.calculate_llh(meas, sim, problem.observable_df, problem.parameter_df)
    except ValueError:  # petab cannot evaluate a noise formula that reads the states
        return None, diff
    return float(llh), diff


def median_time(fn, repeat, budget=20.0):
    ts = []
    t_end = time.perf_counter() + budget
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        if time.perf_counter() > t_end:
            break
    return float(np.median(ts))


#: the tolerances of the finite differences' solves, tightest first; the next one where the
#: llh is not finite along the check at one (Lang_PLOSComputBiol2024's llh at rtol 1e-11
#: is -inf: Rodas5 reaches t = 68,000 of 136,000 in its 100,000 steps; 77,000 at 1e-10)
FD_TOLERANCES = ((1e-11, 1e-13), (1e-10, 1e-12))


def fd_widths(lb, ub):
    """Each parameter's unit for the gradient check (point and directions): the width of
    its bounds, at most 1 (1 without bounds). A scale factor bounded in [0, 2e-10] on the
    linear scale (Lang's eight) is moved on its own scale, not by 0.05 (2.5e8 of its range,
    the llh -2.3e6 against 2742 at the nominal values) nor by finite-difference steps
    of 1e-4 (5e5 of it)."""
    w = np.asarray(ub, float) - np.asarray(lb, float)
    return np.where(np.isfinite(w) & (w > 0), np.minimum(w, 1.0), 1.0)


# The seeds of `check_point` tried in turn until the model solves there.
CHECK_SEEDS = (1, 2, 3)


def check_point(x, lb, ub, seed=1):
    """The point of the gradient check, away from the nominal values (often an optimum,
    where a gradient near zero has no relative accuracy to check): `x` plus 0.05 N(0, 1)
    of each parameter's `fd_widths`, kept 1% of a width inside the bounds (where a noise
    parameter stays positive). A parameter at -inf (log scale, nominal 0) stays there.
    Where every width is 1 and no bound is crossed, ``x + 0.05 N(0, 1)`` as before."""
    w = fd_widths(lb, ub)
    x1 = x + 0.05 * w * np.random.default_rng(seed).standard_normal(len(x))
    inside = np.clip(x1, np.asarray(lb) + 0.01 * w, np.asarray(ub) - 0.01 * w)
    return np.where(np.isfinite(x), inside, x)


def fd_check(yaml, x, g, n_dirs, widths=None, seed=0):
    """The gradient `g` at `x` against finite differences, as a dict of row entries:
    ``grad_fd``, the max relative error of ``g . d`` against Richardson-extrapolated
    central differences of a tighter solve along `n_dirs` directions ``d = widths * v``
    (`v` random unit vectors; `widths` from `fd_widths`, default 1); ``grad_fd_rtol`` and
    ``grad_fd_atol``, the tolerances of that solve (the first of `FD_TOLERANCES` at which
    every llh of the check is finite); ``grad_fd_dirs``, ``[g . d, fd]`` per direction;
    and ``grad_fd_note``, why a tighter setting was left (which direction and step, the
    llh there, the solve's warning). Where no setting gives finite values, ``grad_fd`` is
    nan and the note says why."""
    import sciml
    import sciml.petab

    w = np.ones(len(x)) if widths is None else np.asarray(widths, float)
    h = 1e-4
    notes = []
    for rtol, atol in FD_TOLERANCES:
        tight = sciml.petab.load(yaml, rtol=rtol, atol=atol)
        rng = np.random.default_rng(seed)
        worst, dirs, failed = 0.0, [], None
        for k in range(n_dirs):
            v = rng.standard_normal(len(x))
            d = w * (v / np.linalg.norm(v))
            f = {}
            for s in (h, -h, h / 2, -h / 2):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", sciml.SolveWarning)
                    f[s] = tight.llh(x + s * d, prior=False)
                if not np.isfinite(f[s]):
                    why = "; ".join(str(m.message) for m in caught
                                    if issubclass(m.category, sciml.SolveWarning))
                    failed = (f"rtol {rtol:g}, atol {atol:g}: llh {f[s]} at direction {k}, "
                              f"step {s:+g}: {why or 'no solve failure reported'}")
                    break
            if failed:
                break
            # Richardson's extrapolation of two central differences: the truncation error
            # of one at h = 1e-4 is 3e-4 on the oscillating Borghans_BiophysChem1997
            c1 = (f[h] - f[-h]) / (2 * h)
            c2 = (f[h / 2] - f[-h / 2]) / h
            fd = (4 * c2 - c1) / 3
            gd = float(g @ d)
            dirs.append([gd, fd])
            worst = max(worst, abs(gd - fd) / max(abs(fd), 1e-2))
        if failed is None:
            return dict(grad_fd=worst, grad_fd_rtol=rtol, grad_fd_atol=atol,
                        grad_fd_dirs=dirs, grad_fd_note="; ".join(notes))
        notes.append(failed)
    return dict(grad_fd=float("nan"), grad_fd_note="; ".join(notes))


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def read_json_models(path, key):
    """``{model: row}`` of a JSON file of rows (`key` "rows": a list with "model") or of
    models (`key` "models": a dict); empty where the file is not there."""
    if not path or not os.path.isfile(path):
        return {}
    with open(path) as f:
        data = json.load(f)
    if key == "rows":
        return {r["model"]: r for r in data.get("rows", [])}
    return dict(data.get("models", {}))


def sim_difference(ours, ref):
    """The largest relative difference of two simulation columns (relative to the
    reference, with a floor of 1e-6 of its largest value)."""
    a, b = np.asarray(ours, float), np.asarray(ref, float)
    return float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6 * np.max(np.abs(b)))))


def run_model(name, folder, quick, roadrunner=None, amici_here=None):
    import adjoints
    import sciml.petab

    row = {"model": name}
    yaml = problem_yaml(folder)
    if yaml is None:
        row["refused"] = "no PEtab problem file"
        return row
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pp = sciml.petab.load(yaml)
    except Exception as e:  # a refusal is the result here
        row["refused"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        return row
    t_load = time.perf_counter() - t0
    x = pp.nominal
    v, g = pp.llh_and_grad(x, prior=False)
    row["t_first"] = t_load + (time.perf_counter() - t0 - t_load)
    row.update(n_params=len(x), n_states=pp.model.n_states, n_sims=len(pp.sims),
               llh=float(v))
    # both references where there are two: AMICI's published llh, and the llh of the
    # collection's own simulations (they disagree for Crauste_CellSystems2017 by 1.2e-3:
    # AMICI's value predates a change of the collection); the closer one is reported
    refs = []
    if name in AMICI:
        row.update(ref_amici=AMICI[name][0], t_amici=AMICI[name][1:])
        refs.append((abs(row["llh"] - AMICI[name][0]), AMICI[name][0], "AMICI"))
    try:
        cref = collection_reference(pp, folder)
    except Exception as e:
        cref = None
        row["ref_note"] = f"collection reference failed: {type(e).__name__}: {e}"
    if cref is not None:
        row.update(ref_collection=cref[0], ref_sim_diff=cref[1])
        if cref[0] is not None and cref[1] <= SIM_AGREE:
            refs.append((abs(row["llh"] - cref[0]), cref[0], "collection"))
    here = (amici_here or {}).get(name, {})
    if "llh" in here:
        row["ref_amici_here"] = here["llh"]
        refs.append((abs(row["llh"] - here["llh"]), here["llh"], "AMICI here"))
    rr = (roadrunner or {}).get(name, {})
    if "llh" in rr:
        row["ref_roadrunner"] = rr["llh"]
        row["roadrunner_self_error"] = rr.get("self_error")
        sim = pp.simulate(pp.nominal)["simulation"].to_numpy()
        if len(rr.get("simulation", ())) == len(sim):
            row["roadrunner_sim_diff"] = sim_difference(sim, rr["simulation"])
        refs.append((abs(row["llh"] - rr["llh"]), rr["llh"], "roadrunner"))
    elif "error" in rr:
        row["roadrunner_error"] = rr["error"]
    if refs:
        err, ref, src = min(refs)
        row.update(ref=ref, ref_source=src, llh_err=err)
    rep = 1 if quick else 5
    row["sensealg"] = type(pp.sensealg).__name__
    row["t_llh"] = median_time(lambda: pp.llh(x, prior=False), rep)
    row["t_grad"] = median_time(lambda: pp.llh_and_grad(x, prior=False), rep)
    default, solver = pp.sensealg, pp.solver
    # forward sensitivities on a stiff problem with BDF, as AMICI's forward mode runs
    # (CVODES' BDF, the sensitivities corrected with the states' Newton matrix): with
    # Rodas5 each stage needs n Hessian-vector products of the model (the augmented
    # system's exact Jacobian), 1.3-5x slower on the models over AMICI's ceilings
    fwd_solver = sciml.BDF() if solver.stiff else solver
    row["fwd_solver"] = type(fwd_solver).__name__
    for key, method in (("fwd", adjoints.ForwardSensitivity()), ("adj", adjoints.GaussAdjoint())):
        if type(method) is type(default) and (key == "adj" or fwd_solver is solver):
            row[f"t_{key}"] = row["t_grad"]
            continue
        if key == "fwd" and pp.model.n_states * pp.model.n_params > FORWARD_LIMIT:
            row["fwd_error"] = (f"not run: {pp.model.n_states} x {pp.model.n_params} "
                                "sensitivities")
            continue
        try:
            pp.sensealg = method
            if key == "fwd":
                pp.solver = fwd_solver
            _, gm = pp.llh_and_grad(x, prior=False)
            row[f"t_{key}"] = median_time(lambda: pp.llh_and_grad(x, prior=False), rep)
            row[f"{key}_vs_default"] = float(np.linalg.norm(gm - g) /
                                             max(np.linalg.norm(g), 1e-12))
        except Exception as e:
            row[f"{key}_error"] = f"{type(e).__name__}: {e}"
        finally:
            pp.sensealg, pp.solver = default, solver
    # The gradient check away from the nominal values, within the bounds. A random point
    # may lie where the model cannot be solved (Crauste_CellSystems2017 at the first one:
    # a step size underflow at t = 8.1); the next seed's point is checked then, and the
    # row says which and why.
    lb, ub = pp.lower_bounds, pp.upper_bounds
    skipped = []
    for seed in CHECK_SEEDS:
        x1 = check_point(x, lb, ub, seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", sciml.SolveWarning)
            _, g1 = pp.llh_and_grad(x1, prior=False)
        if np.all(np.isfinite(g1)):
            row.update(fd_check(yaml, x1, g1, 2 if quick else 4, fd_widths(lb, ub)))
            row["grad_fd_seed"] = seed
            break
        skipped.append(f"check point {seed}: the gradient is not finite: " + "; ".join(
            str(m.message) for m in caught if issubclass(m.category, sciml.SolveWarning)))
    if skipped:
        row["grad_fd_note"] = "; ".join(filter(None, [*skipped, row.get("grad_fd_note")]))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collection", default=os.environ.get("BENCHMARK_MODELS_PETAB", ""))
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--roadrunner", default=os.path.join(RESULTS, "petab_roadrunner.json"),
                    help="libroadrunner's llh per model (benchmarks/petab_roadrunner.py)")
    ap.add_argument("--amici", default=os.path.join(RESULTS, "petab_amici.json"),
                    help="AMICI's llh and measured times per model (benchmarks/petab_amici.py)")
    ap.add_argument("--markdown", nargs="*", metavar="JSON",
                    help="print the table of earlier runs' JSON files and exit")
    a = ap.parse_args(argv)
    amici = read_json_models(a.amici, "rows")
    if a.markdown is not None:
        # a model's row from the last file that has it (a rerun of some models)
        rows = {r["model"]: r for path in a.markdown for r in json.load(open(path))["rows"]}
        rows = sorted((usable(r) for r in rows.values()), key=lambda r: r["model"])
        print(markdown(rows, amici))
        print("\n" + summary(rows))
        return
    if not a.collection or not os.path.isdir(a.collection):
        sys.exit("petab_collection: pass --collection PATH (the Benchmark-Models folder of "
                 "Benchmarking-Initiative/Benchmark-Models-PEtab) or set BENCHMARK_MODELS_PETAB")
    names = a.models or sorted(d for d in os.listdir(a.collection)
                               if os.path.isdir(os.path.join(a.collection, d)))
    machine = machine_info(1)
    print(machine, busy_note())
    rows = []
    roadrunner = read_json_models(a.roadrunner, "models")
    for name in names:
        row = run_model(name, os.path.join(a.collection, name), a.quick, roadrunner, amici)
        rows.append(row)
        print(_line(row), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"machine": machine, "rows": rows}, f, indent=1, default=str)
    print("\n" + summary(rows))


def usable(r):
    """A row with the collection's reference dropped where its simulations disagree with
    ours (rows written before `SIM_AGREE` was applied in `run_model`)."""
    if r.get("ref_source") == "collection" and r.get("ref_sim_diff", 1.0) > SIM_AGREE:
        r = {k: v for k, v in r.items() if k not in ("ref", "ref_source", "llh_err")}
        if "ref_amici" in r:
            r.update(ref=r["ref_amici"], ref_source="AMICI",
                     llh_err=abs(r["llh"] - r["ref_amici"]))
    return r


def reproduces(r):
    """The llh within 1e-3 of its reference (relative past 1: the PEtab test suites'
    `tol * max(1, |llh|)`)."""
    return "llh_err" in r and r["llh_err"] <= 1e-3 * max(1.0, abs(r["ref"]))


def summary(rows):
    ok = [r for r in rows if "llh" in r]
    good = [r for r in ok if reproduces(r)]
    by = {}
    for r in good:
        by[r["ref_source"]] = by.get(r["ref_source"], 0) + 1
    strict = [r for r in good if r["llh_err"] <= 1e-3]
    split = [f"{r['model']} ({', '.join(f'{k} {d:+.2g}' for k, d in others(r))})"
             for r in ok if others(r)]
    return (f"{len(ok)} of {len(rows)} run; {len(good)} reproduce their closest reference "
            f"llh to 1e-3 relative past |llh| = 1 "
            f"({', '.join(f'{k} {v}' for k, v in sorted(by.items()))}), {len(strict)} of them "
            f"to 1e-3 absolute" + (f"; our llh minus another reference's, past 1e-3: "
                                   f"{'; '.join(split)}" if split else ""))


REF_KEYS = (("AMICI", "ref_amici"), ("AMICI here", "ref_amici_here"),
            ("roadrunner", "ref_roadrunner"))


def others(r):
    """``[(source, ours - its llh)]`` of the llh references (AMICI's published, AMICI
    run here, roadrunner's) that differ from our llh by more than 1e-3."""
    return [(k, r["llh"] - r[key]) for k, key in REF_KEYS
            if r.get(key) is not None and abs(r["llh"] - r[key]) > 1e-3]


def _delta(r, key):
    """Our llh minus reference `key`'s, as the table shows it."""
    v = r.get(key)
    return "" if v is None else f"{r['llh'] - v:+.1e}"


def markdown(rows, amici=None):
    """The README's table of `rows` (one per model); `amici`: AMICI's measured times per
    model (a peer's run), where there are some."""
    amici = amici or {}
    head = ("| model | states | params | llh | - AMICI | - AMICI here | - roadrunner | "
            "- collection | fd | llh s | grad s | fwd s | adj s | first s | "
            "AMICI fwd / adj s | AMICI ceilings fwd / adj s |")
    ncol = head.count("|") - 1
    out = [head, "|" + "---|" * ncol]
    for r in rows:
        if "refused" in r or "not_run" in r:
            why = (f"refused: {r['refused'][:110]}" if "refused" in r
                   else f"not run here: {r['not_run']}")
            out.append(f"| {r['model']} | | | {why} |" + " |" * (ncol - 4))
            continue
        am = r.get("t_amici")
        ceil = f"{am[1]} / {am[2]}" if am and am[1] is not None else ""
        peer = amici.get(r["model"], {})
        measured = (f"{peer['t_fwd']:.3f} / {peer['t_adj']:.3f}"
                    if "t_fwd" in peer and "t_adj" in peer else "")
        coll = _delta(r, "ref_collection") if r.get("ref_sim_diff", 1.0) <= SIM_AGREE else (
            f"sims differ {r['ref_sim_diff']:.0e}" if "ref_sim_diff" in r else "")
        if r.get("ref_collection", 0) is None and r.get("ref_sim_diff", 1.0) <= SIM_AGREE:
            coll = f"sims agree {r['ref_sim_diff']:.0e}"
        rr = _delta(r, "ref_roadrunner") or ("fails" if "roadrunner_error" in r else "")

        def t(k, r=r):
            return f"{r[k]:.3f}" if k in r else r.get(k.replace("t_", "") + "_error", "")[:20]

        mark = "" if reproduces(r) else " (no)"
        out.append(f"| {r['model']} | {r['n_states']} | {r['n_params']} | {r['llh']:.4f}{mark}"
                   f" | {_delta(r, 'ref_amici')} | {_delta(r, 'ref_amici_here')} | {rr} | {coll} | "
                   f"{_fd(r)} | {t('t_llh')} | {_grad(r)} | "
                   f"{t('t_fwd')} | {t('t_adj')} | {r['t_first']:.1f} | {measured} | {ceil} |")
    return "\n".join(out)


#: the table's short names of the default methods
SHORT = {"DiscreteAdjoint": "discrete", "GaussAdjoint": "Gauss",
         "ForwardSensitivity": "forward", "InterpolatingAdjoint": "interpolating"}


def _grad(r):
    """The table's `grad s` cell: the default method's llh + gradient, and which it is."""
    if "t_grad" not in r:
        return ""
    name = r.get("sensealg", "")
    return f"{r['t_grad']:.3f} ({SHORT.get(name, name)})"


def _fd(r):
    """The table's `fd` cell: the check's max relative error, and its solve's rtol where it
    is not the first of `FD_TOLERANCES`."""
    out = f"{r.get('grad_fd', float('nan')):.0e}"
    rtol = r.get("grad_fd_rtol", FD_TOLERANCES[0][0])
    return out if rtol == FD_TOLERANCES[0][0] else f"{out} (rtol {rtol:g})"


def _line(r):
    if "refused" in r:
        return f"{r['model']:38s} refused: {r['refused'][:150]}"
    ref = (f"ref {r['ref']:.6f} ({r['ref_source']}) err {r['llh_err']:.1e}" if "ref" in r
           else "no reference")
    am = r.get("t_amici")
    ceil = f" AMICI ceilings fwd {am[1]} adj {am[2]}" if am and am[1] is not None else ""
    return (f"{r['model']:38s} llh {r['llh']:.6f} {ref} | fd {_fd(r)}"
            f" | llh {r['t_llh']:.3f}s grad {_grad(r)} fwd {r.get('t_fwd', np.nan):.3f}s"
            f" adj {r.get('t_adj', np.nan):.3f}s"
            f" first {r['t_first']:.1f}s{ceil}")


if __name__ == "__main__":
    main()
