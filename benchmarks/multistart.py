"""Benchmark ``multistart``: `sciml.fit_multistart` on threads against a Dask LocalCluster.

The Lotka-Volterra UDE of ``examples/lotka_volterra_ude.py`` (87 weights in
U, inputs scaled, 31 noisy observations, noise seed 1234), N = 64 starts
(16 with ``--quick``) drawn by ``fit_multistart(seed=0)`` (fresh network
parameters per start), three ways:

- ``serial``: ``client=None, workers=1`` (one thread: the reference cost);
- ``threads``: ``client=None``, 2 threads (the machine's cores);
- ``dask-2``: a ``dask.distributed.LocalCluster`` of 2 worker processes, one
  thread each, started once outside the timing (its start-up and the
  workers' first task, which loads the engine from numba's disk cache, are
  reported apart), driven through ``client=``; plus ``client="local"`` end
  to end once (cluster start and close included).

Work unit: the whole multistart (wall time), for fits of several sizes:
``Adam(0.05) x n`` for n in ``--sizes`` (one gradient per iteration, so a
fit's cost is about n gradients), then the realistic fit ``Adam(0.1) x 50,
L-BFGS x 200`` whose final losses make the waterfall plot. Reported per size:
the mean fit cost (``StartFit.time_s``), each way's wall time, the speed-up
over serial, and the per-task overhead of each parallel way,
``(wall * workers - sum of fit times) / N``, i.e. what a task costs beyond
its fit; plus the raw Dask round trip of an empty task (64 no-op tasks).
The crossover is the smallest fit size from which dask-2 beats threads.

Run as ``python -m benchmarks.multistart [--quick] [--json PATH] [--sizes 1,10,100,400,1600]
[--plot PATH]``; writes ``benchmarks/results/multistart.json`` and the
waterfall PNG ``benchmarks/results/multistart_waterfall.png`` by default.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

import nets  # noqa: E402
import sciml  # noqa: E402
from benchmarks import _harness as H  # noqa: E402
from examples import lotka_volterra_ude as lv  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JSON = os.path.join(HERE, "results", "multistart.json")
PNG = os.path.join(HERE, "results", "multistart_waterfall.png")


def problem():
    X = lv.truth()
    Xn = lv.noisy(X, lv.NOISE, lv.SEED)
    scale = np.ceil(np.abs(Xn).max(axis=0))
    model, chain = lv.ude_model(scale)
    prob = sciml.ODEProblem(model, Xn[0], lv.TSPAN, model.init_params(seed=lv.INIT_SEED))
    return prob, sciml.Data(t=lv.T_OBS, y=Xn), lv.hidden_weight_decay(model, chain, lv.DECAY)


def run_way(way, prob, data, n, opts, client):
    kw = dict(starts=n, seed=0, progress=False, **opts)
    t0 = time.perf_counter()
    if way == "serial":
        res = sciml.fit_multistart(prob, data, workers=1, **kw)
    elif way == "threads":
        res = sciml.fit_multistart(prob, data, workers=2, **kw)
    else:
        res = sciml.fit_multistart(prob, data, client=client, **kw)
    return time.perf_counter() - t0, res


def noop_roundtrip(client, n=64):
    """Seconds per task of n empty tasks through the scheduler (submit to result)."""
    import distributed

    client.submit(int, 0, pure=False).result()
    t0 = time.perf_counter()
    futs = [client.submit(int, i, pure=False) for i in range(n)]
    for f in distributed.as_completed(futs, loop=client.loop):
        f.result()
    return (time.perf_counter() - t0) / n


def main(argv=None):
    ap = H.make_parser(__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=None, help="Adam iterations per fit (comma-separated)")
    ap.add_argument("--plot", default=PNG, help="waterfall PNG")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per size")
    args = ap.parse_args(argv)
    n = 16 if args.quick else 64
    default = "1,10,50" if args.quick else "1,10,100,400,1600"
    sizes = [int(s) for s in (args.sizes or default).split(",")]
    rounds = args.rounds or 1
    workers = 2
    warnings.simplefilter("ignore")  # blown-up line searches: the fit keeps its best point
    import distributed

    machine = H.machine_info(workers)
    print(f"multistart: Lotka-Volterra UDE (87 weights), {n} starts; machine {machine}; "
          f"{H.busy_note()}")
    prob, data, penalty = problem()
    t0 = time.perf_counter()
    sciml.loss_and_grad(prob, data)
    print(f"first gradient here (compile or cache load): {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                       dashboard_address=None,
                                       env=dict(sciml.multistart.WORKER_ENV), silence_logs=50)
    client = distributed.Client(cluster, set_as_default=False)
    cluster_start = time.perf_counter() - t0
    # The workers' first task: import sciml, rebuild the model, load the engine from disk.
    t0 = time.perf_counter()
    sciml.fit_multistart(prob, data, starts=workers, seed=99, progress=False, client=client,
                         optimizers=[nets.Adam(0.05, iters=1)])
    first_tasks = time.perf_counter() - t0
    rt = noop_roundtrip(client)
    print(f"LocalCluster({workers} processes) start {cluster_start:.2f} s; first tasks "
          f"(worker warm-up) {first_tasks:.2f} s; empty-task round trip {1e3 * rt:.2f} ms")

    cases = [(f"Adam x {s}", {"optimizers": [nets.Adam(0.05, iters=s)]}) for s in sizes]
    cases.append(("Adam x 50 + L-BFGS x 200",
                  {"optimizers": [nets.Adam(0.1, iters=50), sciml.LBFGS(iters=200)],
                   "penalty": penalty}))
    mon = H.OtherLoad().start()
    rows, waterfall = [], None
    for label, opts in cases:
        walls = {w: [] for w in ("serial", "threads", "dask-2")}
        results = {}
        for _ in range(rounds):
            for way in walls:
                wall, res = run_way(way, prob, data, n, opts, client)
                walls[way].append(wall)
                results[way] = res
                time.sleep(0.2)
        fit_cost = {w: float(np.mean([f.time_s for f in r])) for w, r in results.items()}
        sum_fit = {w: float(np.sum([f.time_s for f in r])) for w, r in results.items()}
        same = all(np.array_equal(a.params, b.params) and np.array_equal(a.params, c.params)
                   for a, b, c in zip(results["serial"], results["threads"], results["dask-2"]))
        med = {w: float(np.median(v)) for w, v in walls.items()}
        row = {
            "case": label, "n_starts": n,
            "fit_s_serial": fit_cost["serial"],
            "wall_s": med, "wall_min_s": {w: float(min(v)) for w, v in walls.items()},
            "speedup_vs_serial": {w: med["serial"] / med[w] for w in med},
            "overhead_per_task_s": {
                "threads": (med["threads"] * workers - sum_fit["threads"]) / n,
                "dask-2": (med["dask-2"] * workers - sum_fit["dask-2"]) / n},
            "fit_s_in_threads": fit_cost["threads"], "fit_s_on_workers": fit_cost["dask-2"],
            "identical_fits": bool(same),
            "best_objective": float(results["serial"].best.objective),
            "n_best": results["serial"].n_best(),
        }
        rows.append(row)
        print(f"{label:26s} fit {1e3 * row['fit_s_serial']:8.2f} ms | wall serial "
              f"{med['serial']:6.2f} s threads {med['threads']:6.2f} s dask-2 "
              f"{med['dask-2']:6.2f} s | overhead/task threads "
              f"{1e3 * row['overhead_per_task_s']['threads']:7.2f} ms dask "
              f"{1e3 * row['overhead_per_task_s']['dask-2']:7.2f} ms | identical {same}",
              flush=True)
        waterfall = results["serial"]
    load = mon.stop()
    t0 = time.perf_counter()
    sciml.fit_multistart(prob, data, starts=n, seed=0, progress=False, client="local",
                         workers=workers, **cases[-1][1])
    local_e2e = time.perf_counter() - t0
    client.close()
    cluster.close()
    print(f"client='local' end to end (cluster start + warm-up + fits + close), last case: "
          f"{local_e2e:.2f} s")
    print(H.OtherLoad.note(load, "during the timing"))
    cross = None
    fit_rows = rows[:-1]
    for i, r in enumerate(fit_rows):
        if all(x["wall_s"]["dask-2"] < x["wall_s"]["threads"] for x in fit_rows[i:]):
            cross = r["fit_s_serial"]
            break
    print("crossover (dask-2 faster than threads from this fit cost on): "
          + (f"{1e3 * cross:.1f} ms per fit" if cross is not None else "none in the sizes run"))
    if waterfall is not None and args.plot:
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        waterfall.waterfall(path=args.plot, title=f"Lotka-Volterra UDE: {n} starts, Adam x 50 "
                            "+ L-BFGS x 200")
        print(f"waterfall: {os.path.relpath(args.plot)}")
    doc = {"bench": "multistart", "machine": machine, "complete": True,
           "cluster": {"workers": workers, "start_s": cluster_start,
                       "first_tasks_s": first_tasks, "noop_roundtrip_s": rt,
                       "local_end_to_end_s": local_e2e},
           "other_load_cores": load, "crossover_fit_s": cross, "results": rows}
    path = args.json or (None if args.quick else JSON)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        print(f"json: {os.path.relpath(path)}")
    return doc


if __name__ == "__main__":
    main()
