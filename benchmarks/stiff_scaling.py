"""Benchmark ``stiff_scaling``: large stiff systems, ours against pydiffsol, scipy and diffrax.

Robertson's kinetics copied ``ngroups`` times (3 * ngroups states), the rate
constants of group i scaled by s_i = 1 + 0.001 i (so the copies differ and
no solver can share work between them), u(0) = (1, 0, 0) per group, solved
to t = 1e5 at rtol = tol and atol = 1e-4 tol for tol in 1e-4 and 1e-8, the
state saved at the end. Group i is the base problem in time s_i t, so one
Radau solve of the 3-state system at rtol 1e-12 is the reference for every
group; the error column is the largest relative error of any state there
(against max(|u|, 1e-8)).

- ours: `sciml.BDF()` and `sciml.Rodas5()`, both with ``linsolve="auto"``
  (dense LU below 16 states, the sparse LU of the trace's pattern above);
- pydiffsol (diffsol's Python binding, Rust with its own LLVM JIT): BDF,
  nalgebra dense below 20 groups and faer sparse LU above, as its own
  benchmark does;
- scipy ``solve_ivp(method="BDF")`` with a vectorised numpy right-hand side
  and ``jac_sparsity`` (up to 1,000 groups);
- diffrax Kvaerno5 (jitted, dense Jacobian, PID controller) up to 10 groups.

Timings are medians of alternating rounds after a first call; "first" is the
first call in this process (our model's kernels compiled, the engine loaded
from its disk cache; pydiffsol's JIT counted in its build), "build" the
model's construction. Run as ``python -m benchmarks.stiff_scaling [--quick]
[--groups 1,10,100,1000] [--json PATH]``.

``--equal-accuracy 100,1000,10000`` compares at equal accuracy instead: for
each tolerance of ``--tols``, pydiffsol's BDF at that rtol sets the error to
reach; ours (BDF and Rodas5) run over a sweep of rtols around it (`SWEEP`),
and each one's time at pydiffsol's error is read off its sweep (log-log
interpolation between the two solves that bracket it).

``--per-step 100,1000,10000`` gives ours' best time of a solve divided by its
steps and states, for each tolerance: how the cost grows with the states apart
from the number of steps.
"""

import json
import os
import time

import numpy as np
from scipy.integrate import solve_ivp

from benchmarks import _harness as H

K = (0.04, 3e7, 1e4)
T_END = 1e5


def scales(ng):
    return 1.0 + 0.001 * np.arange(ng)


def ours_model(ng):
    import sciml

    def f(u, p, t):
        out = []
        for i in range(ng):
            s = 1 + 0.001 * i
            a, b, c = u[3 * i], u[3 * i + 1], u[3 * i + 2]
            r1, r2, r3 = p.k1 * s * a, p.k2 * s * b * b, p.k3 * s * b * c
            out += [-r1 + r3, r1 - r2 - r3, r2]
        return out

    return sciml.Model(f, [f"{c}{i}" for i in range(ng) for c in "abc"], ["k1", "k2", "k3"])


def diffsl(ng):
    s = ", ".join(repr(float(v)) for v in scales(ng))
    return f"""
k1 {{ {K[0]} }}
k2 {{ {K[1]} }}
k3 {{ {K[2]} }}
s_i {{ {s} }}
u_i {{
(0:{ng}): x = 1,
({ng}:{2 * ng}): y = 0,
({2 * ng}:{3 * ng}): z = 0,
}}
F_i {{
 -k1 * s_i * x_i + k3 * s_i * y_i * z_i,
 k1 * s_i * x_i - k2 * s_i * y_i * y_i - k3 * s_i * y_i * z_i,
 k2 * s_i * y_i * y_i,
}}
"""


def pydiffsol_bdf(ds, ng, tol):
    """pydiffsol's BDF on the model at rtol ``tol``, atol ``1e-4 tol``: nalgebra dense below
    20 groups, faer's sparse LU above (as diffsol's own benchmark)."""
    mt = ds.nalgebra_dense if ng < 20 else ds.faer_sparse
    ode = ds.Ode(diffsl(ng), matrix_type=mt, scalar_type=ds.f64)
    ode.ode_solver = ds.bdf
    ode.rtol, ode.atol = tol, 1e-4 * tol
    return ode


def pydiffsol_end(ode, ng):
    """The state at T_END, (ng, 3) as `reference` (diffsol orders the states x..., y...,
    z...)."""
    return np.asarray(ode.solve_dense(np.array([]), np.array([T_END])).ys)[:, -1].reshape(3, ng).T


def reference(ng):
    """(ng, 3) states at T_END, group by group (interleaved order)."""
    def f(t, u):
        a, b, c = u
        return [-K[0] * a + K[2] * b * c, K[0] * a - K[1] * b * b - K[2] * b * c, K[1] * b * b]

    ts = np.unique(scales(ng) * T_END)
    sol = solve_ivp(f, (0.0, ts[-1]), [1.0, 0.0, 0.0], method="Radau", rtol=1e-12,
                    atol=1e-20, t_eval=ts, dense_output=False)
    vals = {t: sol.y[:, k] for k, t in enumerate(ts)}
    return np.array([vals[t] for t in scales(ng) * T_END])


def rel_error(u, ref):
    return float(np.max(np.abs(u - ref) / np.maximum(np.abs(ref), 1e-8)))


def timed(name, run, first=None):
    """An `H.Impl` whose rounds last about 50 ms: ``first()`` (default ``run``) is the
    timed first call, after which ``units`` calls of ``run`` make a round."""
    imp = H.Impl(name)

    def warmup():
        t0 = time.perf_counter()
        (first or run)()
        t1 = time.perf_counter()
        run()
        imp.units = max(1, int(0.05 / max(time.perf_counter() - t1, 1e-6)))
        return t1 - t0

    def many():
        for _ in range(imp.units):
            run()

    imp.run, imp.warmup = many, warmup
    return imp


def impls(ng, tol):
    import sciml

    ref = reference(ng)
    out, quality = [], {}
    atol = 1e-4 * tol

    # ---- ours
    t0 = time.perf_counter()
    model = ours_model(ng)
    build = time.perf_counter() - t0
    prob = sciml.ODEProblem(model, u0=np.tile([1.0, 0.0, 0.0], ng), tspan=(0.0, T_END),
                            params=np.array(K))
    for name, solver in (("ours-BDF", sciml.BDF()), ("ours-Rodas5", sciml.Rodas5())):
        box = {}

        def run(solver=solver, box=box):
            box["sol"] = sciml.solve(prob, solver, rtol=tol, atol=atol, saveat=[T_END])

        out.append(timed(name, run))
        quality[name] = (box, lambda box: np.asarray(box["sol"].u)[-1].reshape(ng, 3),
                         {"build_s": build})

    # ---- pydiffsol
    ds, err = H.optional_import("pydiffsol")
    if ds is None:
        out.append(H.Impl("pydiffsol-BDF", error=err))
    else:
        box = {}

        def build_ds(box=box):
            t0 = time.perf_counter()
            box["ode"], box["build_s"] = pydiffsol_bdf(ds, ng, tol), time.perf_counter() - t0
            run_ds()

        def run_ds(box=box):
            box["y"] = pydiffsol_end(box["ode"], ng)

        out.append(timed("pydiffsol-BDF", run_ds, build_ds))
        quality["pydiffsol-BDF"] = (box, lambda box: box["y"], {})

    # ---- scipy
    if ng <= 1000:
        s = np.repeat(scales(ng), 3).reshape(ng, 3)[:, 0]

        def f_np(t, u):
            a, b, c = u[0::3], u[1::3], u[2::3]
            r1, r2, r3 = K[0] * s * a, K[1] * s * b * b, K[2] * s * b * c
            du = np.empty_like(u)
            du[0::3], du[1::3], du[2::3] = -r1 + r3, r1 - r2 - r3, r2
            return du

        pattern = model.jac_sparsity
        box = {}

        def run_sp(box=box):
            box["sol"] = solve_ivp(f_np, (0.0, T_END), np.tile([1.0, 0.0, 0.0], ng),
                                   method="BDF", rtol=tol, atol=atol, jac_sparsity=pattern,
                                   t_eval=[T_END])

        out.append(timed("scipy-BDF", run_sp))
        quality["scipy-BDF"] = (box, lambda box: box["sol"].y[:, -1].reshape(ng, 3), {})

    # ---- diffrax
    if ng <= 10:
        out.append(_diffrax(ng, tol, atol, quality))
    return out, quality, ref, build


# Equal accuracy (``--equal-accuracy``): each of ours swept over rtols around pydiffsol's
# (these factors), and its time at pydiffsol's error read off the sweep.
SWEEP = {"ours-BDF": (2.0, 1.0, 0.5, 0.25), "ours-Rodas5": (100.0, 30.0, 10.0, 3.0, 1.0)}


def at_error(points, target):
    """The time at error ``target`` on a work-precision sweep ``[(error, seconds)]``,
    interpolated linearly in log-log between the two solves adjacent in error that
    bracket it; None if none do."""
    pts = sorted(points)
    for (e0, t0), (e1, t1) in zip(pts, pts[1:]):
        if e0 <= target <= e1 and e0 > 0:
            if e1 == e0:
                return min(t0, t1)
            f = np.log(target / e0) / np.log(e1 / e0)
            return float(np.exp(np.log(t0) + f * (np.log(t1) - np.log(t0))))
    return None


def equal_accuracy(ng, tol, repeats):
    """Ours (BDF and Rodas5, each over its `SWEEP`) against pydiffsol's BDF at ``tol``:
    every solve's time and error, and ours' time at pydiffsol's error."""
    import sciml

    ds, err = H.optional_import("pydiffsol")
    if ds is None:
        return {"error": err}
    ref = reference(ng)
    model = ours_model(ng)
    prob = sciml.ODEProblem(model, u0=np.tile([1.0, 0.0, 0.0], ng), tspan=(0.0, T_END),
                            params=np.array(K))
    imps, quality = [], {}
    for name, factors in SWEEP.items():
        solver = sciml.BDF() if name == "ours-BDF" else sciml.Rodas5()
        for fct in factors:
            rtol, box = tol * fct, {}

            def run(solver=solver, rtol=rtol, box=box):
                box["u"] = sciml.solve(prob, solver, rtol=rtol, atol=1e-4 * rtol,
                                       saveat=[T_END]).u
            imp = timed(f"{name} rtol {rtol:.3g}", run)
            imps.append(imp)
            quality[imp.name] = (name, rtol, box, lambda b: np.asarray(b["u"])[-1].reshape(ng, 3))
    ode, box = pydiffsol_bdf(ds, ng, tol), {}

    def run_ds(box=box):
        box["y"] = pydiffsol_end(ode, ng)
    imp = timed(f"pydiffsol-BDF rtol {tol:.3g}", run_ds)
    imps.append(imp)
    quality[imp.name] = ("pydiffsol-BDF", tol, box, lambda b: b["y"])
    load = H.OtherLoad().start()
    H.time_alternating(imps, repeats, pause_s=0.05)
    cores = load.stop()
    rows = []
    for imp in imps:
        who, rtol, b, get = quality[imp.name]
        rows.append({"impl": who, "rtol": rtol, "median_s": float(np.median(imp.times)),
                     "rel_error": rel_error(get(b), ref)})
    peer = rows[-1]
    at = {name: at_error([(r["rel_error"], r["median_s"]) for r in rows if r["impl"] == name],
                         peer["rel_error"]) for name in SWEEP}
    return {"ngroups": ng, "states": 3 * ng, "rtol": tol, "other_load": cores, "rows": rows,
            "pydiffsol": peer, "ours_at_its_error_s": at}


def _diffrax(ng, tol, atol, quality):
    try:
        import diffrax
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        return H.Impl("diffrax-Kvaerno5", error=H.error_text(e))
    jax.config.update("jax_enable_x64", True)
    s = jnp.asarray(scales(ng))

    def f(t, u, args):
        a, b, c = u[0::3], u[1::3], u[2::3]
        r1, r2, r3 = K[0] * s * a, K[1] * s * b * b, K[2] * s * b * c
        return jnp.stack([-r1 + r3, r1 - r2 - r3, r2], axis=1).ravel()

    @jax.jit
    def solve():
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(f), diffrax.Kvaerno5(), 0.0, T_END, 1e-6,
            jnp.tile(jnp.array([1.0, 0.0, 0.0]), ng),
            saveat=diffrax.SaveAt(t1=True), max_steps=100_000,
            stepsize_controller=diffrax.PIDController(rtol=tol, atol=atol))
        return sol.ys

    box = {}

    def run(box=box):
        box["y"] = np.asarray(solve().block_until_ready())

    quality["diffrax-Kvaerno5"] = (box, lambda box: box["y"][-1].reshape(ng, 3), {})
    return timed("diffrax-Kvaerno5", run)


# ---------------------------------------------------------------- 2-D Brusselator

BRUSS = (3.4, 1.0, 10.0)  # A, B, alpha (alpha / dx^2 the diffusion)
BRUSS_T = (0.0, 11.5)
BRUSS_SAVE = np.array([1.0, 2.0, 5.0, 11.5])


def bruss_grid(N):
    xy = np.linspace(0.0, 1.0, N)
    X, Y = np.meshgrid(xy, xy, indexing="ij")
    disc = ((X - 0.3) ** 2 + (Y - 0.6) ** 2 <= 0.01).astype(float)
    u0 = np.concatenate([(22 * (Y * (1 - Y)) ** 1.5).ravel(), (27 * (X * (1 - X)) ** 1.5).ravel()])
    return xy[1] - xy[0], disc, u0


def bruss_model(N):
    """SciML's 2-D Brusselator on an N x N periodic grid (2 N^2 states: x then y), the
    forcing 5 inside a disc switched on at t = 1.1."""
    import sciml

    dx, disc, _ = bruss_grid(N)

    def f(u, p, t):
        a = p.alpha / dx ** 2
        on = np.where(t >= 1.1, 5.0, 0.0)
        x, y = u[:N * N], u[N * N:]
        dxs, dys = [], []
        for i in range(N):
            for j in range(N):
                k = i * N + j
                nb = [((i + 1) % N) * N + j, ((i - 1) % N) * N + j, i * N + (j + 1) % N,
                      i * N + (j - 1) % N]
                lx = sum(x[q] for q in nb) - 4 * x[k]
                ly = sum(y[q] for q in nb) - 4 * y[k]
                r = x[k] * x[k] * y[k]
                fx = a * lx + p.B + r - (p.A + 1) * x[k] + (on if disc[i, j] else 0)
                dxs.append(fx)
                dys.append(a * ly + p.A * x[k] - r)
        return dxs + dys

    states = [f"x{k}" for k in range(N * N)] + [f"y{k}" for k in range(N * N)]
    return sciml.Model(f, states, ["A", "B", "alpha"])


def bruss_numpy(N):
    dx, disc, _ = bruss_grid(N)
    A, B, alpha = BRUSS
    a = alpha / dx ** 2

    def lap(v):
        return (np.roll(v, 1, 0) + np.roll(v, -1, 0) + np.roll(v, 1, 1) + np.roll(v, -1, 1)
                - 4 * v)

    def f(t, u):
        x, y = u[:N * N].reshape(N, N), u[N * N:].reshape(N, N)
        r = x * x * y
        fx = a * lap(x) + B + r - (A + 1) * x + (5.0 * disc if t >= 1.1 else 0.0)
        return np.concatenate([fx.ravel(), (a * lap(y) + A * x - r).ravel()])

    return f


def bruss_rows(N, tol, repeats, with_grad):
    import adjoints
    import sciml

    t0 = time.perf_counter()
    model = bruss_model(N)
    build = time.perf_counter() - t0
    _, _, u0 = bruss_grid(N)
    prob = sciml.ODEProblem(model, u0=u0, tspan=BRUSS_T, params=np.array(BRUSS), tstops=[1.1])
    ref = solve_ivp(bruss_numpy(N), BRUSS_T, u0, method="BDF", rtol=1e-10, atol=1e-12,
                    jac_sparsity=model.jac_sparsity, t_eval=BRUSS_SAVE).y.T
    atol = 1e-3 * tol
    imps, got = [], {}
    for name, solver in (("ours-BDF", sciml.BDF()), ("ours-Rodas5", sciml.Rodas5())):
        def run(solver=solver, name=name):
            got[name] = np.asarray(sciml.solve(prob, solver, rtol=tol, atol=atol,
                                               saveat=BRUSS_SAVE).u)
        imps.append(timed(name, run))
    if N <= 32:
        f_np, pattern = bruss_numpy(N), model.jac_sparsity

        def run_sp():
            got["scipy-BDF"] = solve_ivp(f_np, BRUSS_T, u0, method="BDF", rtol=tol, atol=atol,
                                         jac_sparsity=pattern, t_eval=BRUSS_SAVE).y.T
        imps.append(timed("scipy-BDF", run_sp))
    if with_grad:
        data = sciml.Data(BRUSS_SAVE, ref * 1.02)
        p1 = prob.remake(params=np.array(BRUSS) * 1.01)

        def grad():
            got["grad"] = sciml.loss_and_grad(p1, data, solver=sciml.Rodas5(), rtol=tol,
                                              atol=atol, sensealg=adjoints.GaussAdjoint())[1]
        imps.append(timed("ours-gradient", grad))
    H.time_alternating(imps, repeats, pause_s=0.05)
    rows = []
    for imp in imps:
        q = {"rel_error": rel_error(got[imp.name], ref)} if imp.name in got and \
            imp.name != "ours-gradient" else {}
        if imp.name == "ours-gradient" and "grad" in got:
            q = {"grad": got["grad"].tolist()}
        rows.append(H.result_row(imp, "solve" if imp.name != "ours-gradient" else "grad", q))
    return rows, build


def main(argv=None):
    p = H.make_parser(__doc__.splitlines()[0])
    p.add_argument("--groups", default="1,10,100,1000",
                   help="comma-separated ngroups (default 1,10,100,1000)")
    p.add_argument("--tols", default="1e-4,1e-8")
    p.add_argument("--bruss", default="16,32", help="2-D Brusselator grid sizes N (N x N)")
    p.add_argument("--per-step", default="", metavar="GROUPS",
                   help="comma-separated ngroups: ours' time per step and state at each of "
                        "--tols (then only this runs)")
    p.add_argument("--equal-accuracy", default="", metavar="GROUPS",
                   help="comma-separated ngroups: ours swept over rtols against pydiffsol at "
                        "each of --tols, ours' time read off at pydiffsol's error (then only "
                        "this runs)")
    args = p.parse_args(argv)
    groups = [int(g) for g in args.groups.split(",") if g]
    tols = [float(t) for t in args.tols.split(",")]
    repeats = 3 if args.quick else 7
    print(H.busy_note())
    if args.per_step:
        return _per_step_main(args, tols, repeats)
    if args.equal_accuracy:
        return _equal_accuracy_main(args, tols, repeats)
    if args.quick:
        groups = [g for g in groups if g <= 10]
    results = []
    for ng in groups:
        for tol in tols:
            imps, quality, ref, build = impls(ng, tol)
            load = H.OtherLoad().start()
            H.time_alternating(imps, repeats, pause_s=0.05)
            cores = load.stop()
            rows = []
            for imp in imps:
                q = {}
                if imp.error is None and imp.name in quality:
                    box, get, extra = quality[imp.name]
                    try:
                        q = {"rel_error": rel_error(get(box), ref), **extra}
                    except Exception as e:  # a peer that ran but returned nothing usable
                        q = {"rel_error": float("nan"), "note": H.error_text(e)}
                    if "build_s" in box:
                        q["build_s"] = box["build_s"]
                rows.append(H.result_row(imp, "solve", q))
            base = next((r["median_s"] for r in rows if r["impl"] == "ours-BDF"), None)
            print(f"\nRobertson x {ng} ({3 * ng} states), rtol {tol:g}; "
                  f"{H.OtherLoad.note(cores, 'while timing')}")
            print(f"{'impl':18s} {'median':>10s} {'first':>9s} {'rel err':>9s} "
                  f"{'/ ours-BDF':>10s}")
            for r in rows:
                if r.get("error"):
                    print(f"{r['impl']:18s} {r['error']}")
                    continue
                ratio = r["median_s"] / base if base else float("nan")
                print(f"{r['impl']:18s} {r['median_s'] * 1e3:8.2f}ms {r['first_call_s']:8.2f}s "
                      f"{r['quality'].get('rel_error', float('nan')):9.1e} {ratio:10.2f}")
            results.append({"problem": "robertson_groups", "ngroups": ng, "states": 3 * ng,
                            "rtol": tol, "atol": 1e-4 * tol, "build_s": build,
                            "other_load": cores, "rows": rows})
    for N in [int(v) for v in args.bruss.split(",") if v]:
        for tol in (1e-4, 1e-8) if N <= 32 else (1e-4,):
            load = H.OtherLoad().start()
            rows, build = bruss_rows(N, tol, repeats, with_grad=tol == 1e-4)
            cores = load.stop()
            print(f"\n2-D Brusselator {N} x {N} ({2 * N * N} states), rtol {tol:g}; "
                  f"model built in {build:.1f} s; {H.OtherLoad.note(cores, 'while timing')}")
            for r in rows:
                if r.get("error"):
                    print(f"{r['impl']:18s} {r['error']}")
                    continue
                print(f"{r['impl']:18s} {r['median_s'] * 1e3:9.2f}ms {r['first_call_s']:8.2f}s "
                      f"{r['quality'].get('rel_error', float('nan')):9.1e}")
            results.append({"problem": "brusselator_2d", "N": N, "states": 2 * N * N,
                            "rtol": tol, "atol": 1e-3 * tol, "build_s": build,
                            "other_load": cores, "rows": rows})
    _write_json(args.json, {"bench": "stiff_scaling", "results": results})


def _write_json(path, payload):
    """``payload`` with the machine's description to ``path`` (nothing when no path)."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"bench": payload["bench"], "machine": H.machine_info(1),
                       **{k: v for k, v in payload.items() if k != "bench"}}, f, indent=1)
            f.write("\n")


def per_step(ng, tol, repeats):
    """Ours (BDF, Rodas5) on ``ng`` groups at rtol ``tol``: best time of ``repeats`` solves,
    the steps taken (accepted and rejected), and the time per step and state: flat when
    the cost is linear in the states (the steps themselves grow slowly with the groups)."""
    import sciml

    model = ours_model(ng)
    prob = sciml.ODEProblem(model, u0=np.tile([1.0, 0.0, 0.0], ng), tspan=(0.0, T_END),
                            params=np.array(K))
    out = []
    for name, solver in (("ours-BDF", sciml.BDF()), ("ours-Rodas5", sciml.Rodas5())):
        def run(solver=solver):
            return sciml.solve(prob, solver, rtol=tol, atol=1e-4 * tol, saveat=[T_END])

        sol = run()
        best = min(_timed_once(run) for _ in range(repeats))
        steps = sol.stats["n_accepted"] + sol.stats["n_rejected"]
        out.append({"impl": name, "ngroups": ng, "states": 3 * ng, "rtol": tol,
                    "best_s": best, "steps": steps, "nfev": sol.stats["nfev"],
                    "ns_per_step_state": best / steps / (3 * ng) * 1e9})
    return out


def _timed_once(run):
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def _per_step_main(args, tols, repeats):
    rows = []
    load = H.OtherLoad().start()
    print(f"{'impl':12s} {'groups':>7s} {'rtol':>6s} {'best':>10s} {'steps':>6s} "
          f"{'ns / step / state':>18s}")
    for tol in tols:
        for ng in [int(g) for g in args.per_step.split(",") if g]:
            for r in per_step(ng, tol, repeats):
                rows.append(r)
                print(f"{r['impl']:12s} {ng:7d} {tol:6.0e} {r['best_s'] * 1e3:8.2f}ms "
                      f"{r['steps']:6d} {r['ns_per_step_state']:18.1f}", flush=True)
    print(H.OtherLoad.note(load.stop(), "while timing"))
    _write_json(args.json, {"bench": "stiff_scaling --per-step", "results": rows})


def _equal_accuracy_main(args, tols, repeats):
    results = []
    for ng in [int(g) for g in args.equal_accuracy.split(",") if g]:
        for tol in tols:
            r = equal_accuracy(ng, tol, repeats)
            if "error" in r:
                print(f"pydiffsol: {r['error']}")
                return
            peer = r["pydiffsol"]
            print(f"\nRobertson x {ng} ({3 * ng} states), pydiffsol BDF at rtol {tol:g}: "
                  f"{peer['median_s'] * 1e3:.2f} ms, error {peer['rel_error']:.2e}; "
                  f"{H.OtherLoad.note(r['other_load'], 'while timing')}")
            for row in r["rows"][:-1]:
                print(f"  {row['impl']:12s} rtol {row['rtol']:8.2g} {row['median_s'] * 1e3:9.2f} ms"
                      f"  error {row['rel_error']:.2e}")
            for name, t in r["ours_at_its_error_s"].items():
                what = "not bracketed by its sweep" if t is None else \
                    f"{t * 1e3:.2f} ms at error {peer['rel_error']:.2e}: pydiffsol / ours " \
                    f"{peer['median_s'] / t:.2f}x"
                print(f"  {name} {what}")
            results.append(r)
    _write_json(args.json, {"bench": "stiff_scaling --equal-accuracy", "sweep": SWEEP,
                            "results": results})


if __name__ == "__main__":
    main()
