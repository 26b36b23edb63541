"""Benchmark ``sciml.nlme``: population fits, time and agreement with nlmixr2's published fit.

- ``theo_sd``: the one-compartment oral model by FOCE-I on nlmixr2data's theo_sd
  (12 subjects, all 132 observations), from nlmixr2's start values (tka 0.45,
  tcl 1, tv 3.45; omega variances 0.6, 0.3, 0.1; add.sd 0.7), covariance step
  included; compared with nlmixr2's published estimates (OBJF 116.80, tka
  0.464, tcl 1.012, tv 3.460, omega 0.400 / 0.069 / 0.019, add.sd 0.694). Also
  by FOCE and Laplace (central differences of the objective in the outer loop).
- ``theo_sd saem``: SAEM with nlmixr2's settings (200 + 300 iterations, 3 chains, seed
  0), then the FOCE-I objective and covariance step at its estimates; compared with
  nlmixr2's published SAEM (tka 0.464, tcl 1.009, tv 3.456, omega 0.403 / 0.071 /
  0.019, add.sd 0.697, FOCE-I objective 116.85); the time split (sampler solves,
  Python around them, M-step, FOCE-I and covariance step) is in the JSON.
- ``simulated``: 500 subjects simulated from the theo_sd estimates (the theo_sd
  dose of 320 mg, its 11 sample times), fitted by FOCE-I from the same start.

No Python peer fits an NLME with ODEs; the time is ours alone (fresh
``NLME`` and subjects, the compiled model warm: a first run compiles it,
once per machine). Run as ``python -m benchmarks.nlme [--quick] [--json PATH]``.
"""

import time
from pathlib import Path

import numpy as np

from benchmarks import _harness as H

DATA = Path(__file__).resolve().parents[1] / "examples" / "data" / "theo_sd_nlmixr2data.csv"
PUBLISHED = {"objective": 116.80, "tka": 0.464, "tcl": 1.012, "tv": 3.460, "omega.ka": 0.400,
             "omega.cl": 0.069, "omega.v": 0.019, "cp.sd": 0.694}
PUBLISHED_SAEM = {"objective": 116.85, "tka": 0.464, "tcl": 1.009, "tv": 3.456,
                  "omega.ka": 0.403, "omega.cl": 0.071, "omega.v": 0.019, "cp.sd": 0.697}
TIMES = [0.0, 0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0]


def _model():
    import sciml

    def one_cpt(u, p, t):
        return [-p.ka * u.depot, p.ka * u.depot - p.cl / p.v * u.central]

    return sciml.Model(one_cpt, ["depot", "central"], ["ka", "cl", "v"],
                       observables={"cp": lambda u, p: u.central / p.v})


def _individual(theta, eta, cov):
    return {"ka": np.exp(theta.tka + eta.ka), "cl": np.exp(theta.tcl + eta.cl),
            "v": np.exp(theta.tv + eta.v)}


def _pop(model):
    import sciml.nlme as nl

    return nl.NLME(model, _individual, theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
                   omega={"ka": 0.6, "cl": 0.3, "v": 0.1}, error={"cp": nl.Additive(0.7)})


def _simulate(model, n, seed=0):
    """A theo_sd-like table of ``n`` subjects drawn from nlmixr2's FOCE-I estimates."""
    import sciml

    rng = np.random.default_rng(seed)
    theta = np.array([0.464, 1.012, 3.460])
    sd = np.sqrt([0.400, 0.069, 0.019])
    cols = {"ID": [], "TIME": [], "DV": [], "AMT": [], "EVID": [], "CMT": []}
    for i in range(n):
        ka, cl, v = np.exp(theta + sd * rng.normal(size=3))
        prob = sciml.ODEProblem(model, [320.0, 0.0], (0.0, 24.0), [ka, cl, v])
        cp = sciml.solve(prob, rtol=1e-10, atol=1e-10, saveat=np.array(TIMES)[1:]).u[:, 1] / v
        dv = np.concatenate([[0.0], cp]) + 0.694 * rng.normal(size=len(TIMES))
        cols["ID"] += [i + 1] * (len(TIMES) + 1)
        cols["TIME"] += [0.0] + TIMES
        cols["DV"] += [0.0] + dv.tolist()
        cols["AMT"] += [320.0] + [0.0] * len(TIMES)
        cols["EVID"] += [101] + [0] * len(TIMES)
        cols["CMT"] += [1] + [2] * len(TIMES)
    return cols


def _row(name, fit, seconds, published=None):
    got = {"objective": fit.objective, **fit.theta, **{f"omega.{e}": fit.omega[i, i]
                                                       for i, e in enumerate(fit.eta_names)},
           **fit.sigma}
    row = {"impl": name, "seconds": seconds, "objective": fit.objective,
           "estimates": got, "se": fit.se, "iterations": fit.n_iter, "success": fit.success}
    if published is not None:
        row["vs_published"] = {k: got[k] - v for k, v in published.items()}
    return row


def main(argv=None):
    ap = H.make_parser(__doc__.splitlines()[0])
    args = ap.parse_args(argv)
    from sciml.data import read_events

    model = _model()
    comp = {1: "depot", 2: "central"}
    subjects = read_events(str(DATA), model, comp, "cp", params=[1.0, 1.0, 1.0])
    _pop(model).fit(subjects, method="focei", max_iter=1, covariance=False)  # compile
    rows = []
    print(H.busy_note())
    for method in ("focei",) if args.quick else ("focei", "foce", "laplace"):
        t0 = time.perf_counter()
        fit = _pop(model).fit(subjects, method=method)
        rows.append(_row(f"theo_sd {method}", fit, time.perf_counter() - t0, PUBLISHED))
    t0 = time.perf_counter()
    fit = _pop(model).fit(subjects, method="saem", seed=0)
    rows.append(_row("theo_sd saem", fit, time.perf_counter() - t0, PUBLISHED_SAEM))
    rows[-1]["split"] = fit.saem.seconds
    n = 60 if args.quick else 500
    sim = read_events(_simulate(model, n), model, comp, "cp", params=[1.0, 1.0, 1.0])
    t0 = time.perf_counter()
    fit = _pop(model).fit(sim, method="focei")
    rows.append(_row(f"simulated {n} focei", fit, time.perf_counter() - t0))
    print(f"\n{'fit':<22}{'time':>9}{'objective':>12}  estimates (published: nlmixr2 FOCE-I)")
    for r in rows:
        est = "  ".join(f"{k} {v:.4g}" for k, v in r["estimates"].items() if k != "objective")
        print(f"{r['impl']:<22}{r['seconds']:>8.2f}s{r['objective']:>12.3f}  {est}")
    print(f"{'nlmixr2 (published)':<22}{'':>9}{PUBLISHED['objective']:>12.2f}  " + "  ".join(
        f"{k} {v:.4g}" for k, v in PUBLISHED.items() if k != "objective"))
    if args.json:
        import json

        with open(args.json, "w") as fh:
            json.dump({"bench": "nlme", "machine": H.machine_info(args.threads),
                       "results": rows}, fh, indent=2, default=float)


if __name__ == "__main__":
    main()
