"""llh_and_grad per PEtab SciML conformance case: ours (compiled solvers, forward
sensitivities) against the same problems on our JAX/diffrax path (`sciml.jax`).

AMICI's JAX backend would be the natural peer, but `amici` ships as a source distribution
that needs a C++/SWIG build, not available here; the peer is therefore `sciml.jax`
(diffrax, reverse mode through the solve, the same model, tolerances and likelihood:
`sciml.petab`'s per-experiment `loss_and_grad` swapped for `sciml.jax.loss_and_grad`).

    python -m benchmarks.petab [--cases 001 002 ...] [--repeats 20] [--out results/petab.md]

Timings are medians over alternating rounds after a warm-up (compilation excluded; the
first call of each is reported separately).
"""

import argparse
import os
import statistics
import time
import warnings

import numpy as np

ROOT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "petab_sciml",
                    "sciml_problem_import")


def _jax_loss_and_grad(prob, data, loss=None, solver=None, sensealg=None, rtol=1e-6,
                       atol=1e-6, params=None):
    import sciml.jax as sjax

    v, g = sjax.loss_and_grad(prob, data, loss=loss, solver="Tsit5", rtol=rtol, atol=atol,
                              params=params)
    return float(v), np.asarray(g, dtype=np.float64)


def _timed(fn, repeats):
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def run(cases, repeats):
    import sciml.petab
    import sciml.petab.problem as pp

    rows = []
    for case in cases:
        path = os.path.join(ROOT, case, "petab", "problem.yaml")
        try:
            problem = sciml.petab.load(path)
        except Exception as e:  # a case this build cannot read (Conv2d before nets.petab)
            rows.append((case, None, None, None, None, f"{type(e).__name__}"))
            continue
        x = problem.nominal
        ours = pp.loss_and_grad
        t = time.perf_counter()
        llh_o, g_o = problem.llh_and_grad(x)
        first_o = time.perf_counter() - t
        pp.loss_and_grad = _jax_loss_and_grad
        try:
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                llh_j, g_j = problem.llh_and_grad(x)
            first_j = time.perf_counter() - t
        finally:
            pp.loss_and_grad = ours
        t_o, t_j = [], []
        for _ in range(3):  # alternate: neither gets a quieter machine
            t_o += _timed(lambda p=problem, x=x: p.llh_and_grad(x), repeats)
            pp.loss_and_grad = _jax_loss_and_grad
            try:
                t_j += _timed(lambda p=problem, x=x: p.llh_and_grad(x), max(1, repeats // 4))
            finally:
                pp.loss_and_grad = ours
        dg = float(np.max(np.abs(g_o - g_j)) / max(1.0, np.max(np.abs(g_j))))
        rows.append((case, statistics.median(t_o), statistics.median(t_j), first_o, first_j,
                     f"llh diff {abs(llh_o - llh_j):.1e}, grad rel diff {dg:.1e}"))
        print(f"{case}: ours {1e3 * rows[-1][1]:.2f} ms, jax {1e3 * rows[-1][2]:.2f} ms, "
              f"{rows[-1][5]}", flush=True)
    return rows


def table(rows):
    lines = ["| case | ours llh+grad (ms) | sciml.jax (ms) | jax / ours "
             "| first call ours / jax (s) | agreement |", "|---|---|---|---|---|---|"]
    for case, o, j, fo, fj, note in rows:
        if o is None:
            lines.append(f"| {case} | - | - | - | - | not run: {note} |")
            continue
        lines.append(f"| {case} | {1e3 * o:.2f} | {1e3 * j:.2f} | {j / o:.0f}x | "
                     f"{fo:.1f} / {fj:.1f} | {note} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", nargs="*", default=sorted(os.listdir(ROOT)))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = run(a.cases, a.repeats)
    text = table(rows)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
