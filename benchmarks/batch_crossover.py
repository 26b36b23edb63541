"""Benchmark 4, ``batch_crossover``: one loss + gradient over B trajectories, threads vs JAX vmap.

The spiral model of ../shared/BENCHMARKS.md item 2 (f(u) = Dense(50 -> 2)(tanh(Dense(2
-> 50)(u^3))), float64, 252 parameters ``init_params(seed=0)``, tspan (0,
1.5), 30 save points) over B = 1, 10, 100, 1,000, 10,000 independent
trajectories: u0 uniform in [-2, 2]^2 (``default_rng(0)``, the first B of
one draw), each fitted to the true spiral du/dt = (u^3) A from its own u0
(solved at rtol = atol = 1e-10). Work unit: ONE loss (sum of squares over
all trajectories) and its gradient over the shared parameters, Tsit5, rtol =
atol = 1e-6:

- ``ours``: ``sciml.loss_and_grad(problems, data, params=theta)`` (default
  adjoint, the trajectories in parallel numba threads);
- ``jax-cpu``: ``sciml.jax.loss_and_grad(...)`` on JAX's CPU device (the
  batch is one ``jax.vmap`` of diffrax, RecursiveCheckpointAdjoint);
- ``jax-gpu``: the same on the first GPU, when JAX sees one.

Both are timed through their public entry points, host-side preparation of
the B problems included. Quality: the loss, and the relative difference of
the gradient from ours at the same B. The crossover is the smallest B from
which a JAX row's median beats ours at every larger B measured (the B
values where it is faster are printed too). ``--plot PATH`` draws time vs B
(log-log).

Run as ``python -m benchmarks.batch_crossover [--quick] [--json PATH] [--plot PATH]
[--impls ours,jax-cpu,jax-gpu] [--sizes 1,10,...] [--threads N]``.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from benchmarks import _harness as H
from benchmarks import _spiral as S

RTOL = ATOL = 1e-6
SIZES = (1, 10, 100, 1_000, 10_000)
QUICK_SIZES = (1, 10, 100, 1_000)
IMPLS = ("ours", "jax-cpu", "jax-gpu")


# ------------------------------------------------------------------------------- problems


def spiral_problems(bmax: int, seed: int = 0):
    """(theta, problems, data) for the first `bmax` trajectories of one seeded draw."""
    import sciml
    from nets import Chain, Dense

    def model_f(u, p, t, nets):
        return nets.U([u[0] ** 3, u[1] ** 3])

    def true_f(u, p, t):
        a, b = u[0] ** 3, u[1] ** 3  # (u^3) A, row vector times A
        return [a * S.A[0, 0] + b * S.A[1, 0], a * S.A[0, 1] + b * S.A[1, 1]]

    model = sciml.Model(model_f, ["x", "y"], [], nets={"U": Chain(2, Dense(50, "tanh"),
                                                                   Dense(2))})
    theta = model.init_params(seed=S.INIT_SEED)
    truth = sciml.Model(true_f, ["x", "y"], [])
    u0s = np.random.default_rng(seed).uniform(-2.0, 2.0, (bmax, 2))
    sols = sciml.solve([sciml.ODEProblem(truth, u0, S.TSPAN, np.zeros(0)) for u0 in u0s],
                       sciml.Tsit5(), rtol=1e-10, atol=1e-10, saveat=S.TS)
    probs = [sciml.ODEProblem(model, u0, S.TSPAN, theta) for u0 in u0s]
    data = [sciml.Data(S.TS, s.u) for s in sols]
    return theta, probs, data


# -------------------------------------------------------------------------- implementations


def our_fn(theta, threads):
    """``fn(probs, data) -> (loss, grad)`` with our threads, or (None, reason)."""
    import sciml

    if not hasattr(sciml, "loss_and_grad"):
        return None, "sciml.loss_and_grad not available yet"

    def fn(probs, data):
        return sciml.loss_and_grad(probs, data, loss=sciml.SSE(), solver=sciml.Tsit5(),
                                   rtol=RTOL, atol=ATOL, params=theta, threads=threads)

    return fn, None


def jax_fns(theta, wanted, max_steps):
    """{"jax-cpu": fn or reason, "jax-gpu": fn or reason}, and a note on the devices."""
    out = {}
    jax, err = H.optional_import("jax")
    if err is None:
        sj, err = H.optional_import("sciml.jax")
    if err is not None:
        return {k: err for k in ("jax-cpu", "jax-gpu")}, err
    devices = {"jax-cpu": jax.devices("cpu")[0]}
    try:
        devices["jax-gpu"] = jax.devices("gpu")[0]
    except RuntimeError as e:  # no GPU backend in this jaxlib, or no GPU
        out["jax-gpu"] = f"no GPU ({str(e).splitlines()[0][:80]})"
    for name, dev in devices.items():
        if name not in wanted:
            continue

        def fn(probs, data, dev=dev):
            with jax.default_device(dev):
                v, g = sj.loss_and_grad(probs, data, loss=None, solver="Tsit5", rtol=RTOL,
                                        atol=ATOL, params=theta, max_steps=max_steps)
            return v, g

        out[name] = fn
    note = ", ".join(f"{k}: {getattr(d, 'device_kind', d.platform)}" for k, d in devices.items())
    return out, f"jax {jax.__version__} ({note}; max_steps {max_steps})"


class Call:
    """One implementation at one B: the harness' `Impl` plus the first call's result."""

    def __init__(self, name, fn, probs, data):
        self.result = None
        self.impl = H.Impl(name, run=lambda: fn(probs, data), warmup=self.warmup)
        self._fn, self._args = fn, (probs, data)

    def warmup(self):
        v, g = self._fn(*self._args)
        self.result = (float(v), np.asarray(g, dtype=np.float64))


def rounds_for(b: int, quick: bool) -> int:
    if quick:
        return 3 if b <= 100 else 2
    return 7 if b <= 100 else (5 if b <= 1000 else 3)


# ---------------------------------------------------------------------------------- report


def faster_at(table: dict, sizes, peer: str, ours: str = "ours") -> list:
    """The B values at which `peer`'s median is below ours (both measured)."""
    return [b for b in sizes if table.get((ours, b)) and table.get((peer, b))
            and table[(peer, b)] < table[(ours, b)]]


def crossover(table: dict, sizes, peer: str, ours: str = "ours"):
    """The smallest B from which `peer` beats ours at every larger measured B; None if none.

    "From which it stays ahead", not merely "somewhere ahead": on a noisy
    machine a single B where the two are close can flip either way.
    """
    measured = [b for b in sizes if table.get((ours, b)) and table.get((peer, b))]
    wins = set(faster_at(table, sizes, peer, ours))
    out = None
    for b in reversed(measured):
        if b not in wins:
            break
        out = b
    return out


def print_summary(table: dict, sizes, impls) -> None:
    head = ["B", *impls, *[f"{p}/ours" for p in impls if p != "ours"], "per trajectory"]
    body = []
    for b in sizes:
        cells = [str(b)] + [H.fmt_time(table.get((i, b))) for i in impls]
        for p in impls:
            if p != "ours":
                t_o, t_p = table.get(("ours", b)), table.get((p, b))
                cells.append(f"{t_p / t_o:.2f}" if t_o and t_p else "-")
        best = min((table[(i, b)] for i in impls if table.get((i, b))), default=None)
        cells.append(H.fmt_time(best / b) if best else "-")
        body.append(cells)
    width = [max(len(r[k]) for r in [head, *body]) for k in range(len(head))]
    for r in [head, ["-" * w for w in width], *body]:
        print("  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip())
    print("(median time of one loss + gradient over all B; ratio > 1: ours faster; "
          "per trajectory: the fastest row / B)")


def plot(path: str, table: dict, sizes, impls, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, marker in zip(impls, "osd^v"):
        pts = [(b, table[(name, b)]) for b in sizes if table.get((name, b))]
        if pts:
            xs, ys = zip(*pts)
            ax.loglog(xs, ys, marker=marker, label=name)
    ax.set_xlabel("B (trajectories in the loss)")
    ax.set_ylabel("time of one loss + gradient (s)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------ main


def parse(argv):
    ap = H.make_parser(__doc__.splitlines()[0])
    ap.add_argument("--plot", metavar="PATH", help="write a log-log PNG of time vs B")
    ap.add_argument("--sizes", help="comma-separated B values (default 1,10,100,1000,10000; "
                    "--quick: up to 1000)")
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help=f"comma-separated subset of {','.join(IMPLS)} (default: all)")
    ap.add_argument("--jax-max-steps", type=int, default=4096,
                    help="max_steps of sciml.jax (default 4096, its default): fewer means "
                    "fewer checkpoints per trajectory in reverse mode, less memory")
    ap.add_argument("--max-call-s", type=float, default=60.0,
                    help="skip larger B for an implementation whose first call took longer")
    args = ap.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else \
        (QUICK_SIZES if args.quick else SIZES)
    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    bad = [s for s in impls if s not in IMPLS]
    if bad or not sizes or min(sizes) < 1:
        ap.error(f"--impls must name {', '.join(IMPLS)} (got {bad}); --sizes positive ints")
    return args, sorted(set(sizes)), impls


def main(argv=None) -> int:
    args, sizes, impls = parse(argv)
    threads = max(1, args.threads)
    t0 = time.perf_counter()
    theta, probs, data = spiral_problems(max(sizes))
    setup_s = time.perf_counter() - t0
    fns = {}
    if "ours" in impls:
        fn, err = our_fn(theta, threads)
        fns["ours"] = fn if fn is not None else err
    jfns, jnote = jax_fns(theta, impls, args.jax_max_steps)
    fns.update({k: v for k, v in jfns.items() if k in impls})

    machine = H.machine_info(threads)
    print(f"batch_crossover: spiral neural ODE (252 params, float64), tspan (0, 1.5), 30 save "
          f"points per trajectory, u0 ~ U[-2, 2]^2 (seed 0); one SSE loss + gradient over B "
          f"trajectories, Tsit5, rtol = atol = {RTOL:g}{' [--quick]' if args.quick else ''}")
    print(f"machine: {machine['cpus']} cpus, {machine['cpu']}; ours: {threads} numba threads; "
          f"{jnote}; {H.busy_note()}")
    print(f"set-up (models, {max(sizes)} true trajectories): {setup_s:.1f} s", flush=True)

    rows, table, skip = [], {}, {}
    mon = H.OtherLoad().start()
    for b in sizes:
        calls, errs = [], []
        for name in impls:
            fn = fns.get(name, "not requested")
            if isinstance(fn, str):
                errs.append(H.Impl(name, error=fn))
            elif name in skip:
                errs.append(H.Impl(name, error=skip[name]))
            else:
                calls.append(Call(name, fn, probs[:b], data[:b]))
        H.time_alternating([c.impl for c in calls], rounds_for(b, args.quick))
        ref = next((c.result for c in calls if c.impl.name == "ours" and c.result), None)
        brows = []
        for c in calls:
            q = None
            if c.result is not None:
                v, g = c.result
                q = {"loss": v}
                if ref is not None and c.impl.name != "ours":
                    q["grad_rel_diff"] = float(np.linalg.norm(g - ref[1]) / np.linalg.norm(ref[1]))
            row = H.result_row(c.impl, "grad", q)
            brows.append(row)
            if row.get("median_s"):
                table[(c.impl.name, b)] = row["median_s"]
            first = c.impl.first_call_s
            if first is not None and first > args.max_call_s:
                skip[c.impl.name] = f"skipped: first call at B = {b} took {first:.0f} s"
        brows += [H.result_row(e, "grad") for e in errs]
        print(f"\n== B = {b}  (grad_rel_diff: |grad - ours| / |ours|)", flush=True)
        H.print_table(brows, ours="ours")
        sys.stdout.flush()
        rows += [dict(r, B=b) for r in brows]
        if args.json:  # after every B: a run cut short by a time limit keeps what it measured
            write_json(args.json, machine, jnote, rows, sizes, table, impls, fns, setup_s,
                       "incomplete", complete=False)
    load_note = H.OtherLoad.note(mon.stop(), "during the timing")

    print("\n== summary")
    print_summary(table, sizes, impls)
    print(load_note)
    cross = crossovers(table, sizes, impls, fns)
    for label, b in cross.items():
        peer = f"jax-{label}"
        what = f"B = {b}" if b is not None else f"none up to B = {max(sizes)}"
        wins = faster_at(table, sizes, peer)
        print(f"{label.upper()} crossover (smallest B from which {peer} beats ours at every "
              f"larger B): {what}; {peer} faster at B in {wins or 'none'}")
    if args.plot:
        plot(args.plot, table, sizes, impls,
             f"spiral loss + gradient over B trajectories ({machine['cpus']} cpus"
             f"{', GPU' if 'jax-gpu' in table_impls(table) else ''})")
        print(f"plot written to {args.plot}")
    if args.json:
        write_json(args.json, machine, jnote, rows, sizes, table, impls, fns, setup_s,
                   load_note, complete=True)
    return 0


def crossovers(table, sizes, impls, fns) -> dict:
    """{"cpu": B or None, "gpu": B or None} for the JAX rows that ran."""
    out = {}
    for peer in ("jax-cpu", "jax-gpu"):
        if peer in impls and not isinstance(fns.get(peer), str):
            out[peer[4:]] = crossover(table, sizes, peer)
    return out


def wins(table, sizes, impls, fns) -> dict:
    return {peer[4:]: faster_at(table, sizes, peer) for peer in ("jax-cpu", "jax-gpu")
            if peer in impls and not isinstance(fns.get(peer), str)}


def write_json(path, machine, jnote, rows, sizes, table, impls, fns, setup_s, load_note,
               complete) -> None:
    import json

    doc = {"bench": "batch_crossover", "machine": dict(machine, jax=jnote),
           "results": rows,
           "ratios": {str(b): H.ratios([r for r in rows if r["B"] == b], ours="ours")
                      for b in sizes if any(r["B"] == b for r in rows)},
           "crossover": crossovers(table, sizes, impls, fns),
           "jax_faster_at": wins(table, sizes, impls, fns), "sizes": list(sizes),
           "setup_s": setup_s, "load": load_note, "complete": complete}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")


def table_impls(table: dict) -> set:
    return {name for name, _ in table}


if __name__ == "__main__":
    sys.exit(main())
