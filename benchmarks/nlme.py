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
  dose of 320 mg, its 11 sample times), fitted by FOCE-I from the same start
  (by default: worker processes where forking is safe, `sciml.nlme.parallel.auto_workers`;
  and on this process's threads, ``NLME(workers=1)``).
- ``warfarin``: nlmixr2's warfarin PK/PD model (``pk.turnover.emax3``: transit
  and absorption, one compartment, turnover with an Emax inhibition, ``effect(0) =
  e0``; eight random effects, combined error on cp, additive on pca) by FOCE-I
  from nlmixr2's start values on nlmixr2data's warfarin (32 subjects, 283 + 232
  observations), no covariance step; by default and with ``workers=1``.

Each row's ``solves`` is the time inside the compiled solver loops (the prepared
solves' compiled entries, timed around each call) and ``solve_calls`` their
number (summed over the subjects' threads: the ``threads=1`` row gives the split on
one thread); the rest of ``seconds`` is Python around them (building each subject's
parameters, the likelihood's linear algebra, the optimiser). With worker processes
(the default where `auto_workers` forks them) the loops run there and are not counted.

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
WARFARIN = DATA.parent / "warfarin_nlmixr2data.csv"
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


def _pop(model, **kw):
    import sciml.nlme as nl

    return nl.NLME(model, _individual, theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
                   omega={"ka": 0.6, "cl": 0.3, "v": 0.1}, error={"cp": nl.Additive(0.7)},
                   **kw)


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


def _warfarin():
    """nlmixr2's ``pk.turnover.emax3`` on its warfarin data: (NLME, subjects)."""
    import sciml
    import sciml.nlme as nl
    from sciml.data import read_events

    def rhs(u, p, t):
        cp = u.center / p.v
        pd = 1.0 - p.emax * cp / (p.ec50 + cp)
        return [-p.ktr * u.depot, p.ktr * u.depot - p.ka * u.gut,
                p.ka * u.gut - p.cl / p.v * u.center, p.e0 * p.kout * pd - p.kout * u.effect]

    model = sciml.Model(rhs, ["depot", "gut", "center", "effect"],
                        ["ktr", "ka", "cl", "v", "emax", "ec50", "kout", "e0"],
                        observables={"cp": lambda u, p: u.center / p.v,
                                     "pca": lambda u, p: u.effect})

    def individual(theta, eta, cov):
        return {"ktr": np.exp(theta.tktr + eta.ktr), "ka": np.exp(theta.tka + eta.ka),
                "cl": np.exp(theta.tcl + eta.cl), "v": np.exp(theta.tv + eta.v),
                "emax": 1.0 / (1.0 + np.exp(-(theta.temax + eta.emax))),
                "ec50": np.exp(theta.tec50 + eta.ec50), "kout": np.exp(theta.tkout + eta.kout),
                "e0": np.exp(theta.te0 + eta.e0)}

    subjects = read_events(str(WARFARIN), model, {1: "depot"},
                           observable={"cp": "cp", "pca": "pca"}, params=np.ones(8),
                           u0=[0.0, 0.0, 0.0, 1.0], duplicates="keep")

    def pop(**kw):
        return nl.NLME(model, individual,
                       theta=dict(tktr=0.0, tka=0.0, tcl=np.log(0.1), tv=np.log(10.0),
                                  temax=np.log(0.8 / 0.2), tec50=np.log(0.5),
                                  tkout=np.log(0.05), te0=np.log(100.0)),
                       omega=dict(ktr=1.0, ka=1.0, cl=2.0, v=1.0, emax=0.5, ec50=0.5,
                                  kout=0.5, e0=0.5),
                       error={"cp": nl.Combined(0.1, 0.1), "pca": nl.Additive(10.0)},
                       initial={"effect": "e0"}, **kw)

    return pop, subjects


class _SolveClock:
    """Times the calls of a prepared solve's compiled entry (`adjoints.prepare_values`,
    `ForwardSensitivity.prepare`, through `adjoints.primal.Entry`) while installed:
    every call but a prepared solve's first, which goes through numba's dispatcher."""

    def __init__(self):
        import adjoints.primal as af

        self.seconds, self.calls = 0.0, 0
        self._mods, self._orig = (af,), af.entry_point

        def timed(loop, args):
            f = self._orig(loop, args)

            def call(*a):
                t0 = time.perf_counter()
                try:
                    return f(*a)
                finally:
                    self.seconds += time.perf_counter() - t0
                    self.calls += 1

            return call

        for m in self._mods:
            m.entry_point = timed

    def reset(self):
        self.seconds, self.calls = 0.0, 0


def _row(name, fit, seconds, published=None, clock=None):
    got = {"objective": fit.objective, **fit.theta, **{f"omega.{e}": fit.omega[i, i]
                                                       for i, e in enumerate(fit.eta_names)},
           **fit.sigma}
    row = {"impl": name, "seconds": seconds, "objective": fit.objective,
           "estimates": got, "se": fit.se, "iterations": fit.n_iter, "success": fit.success}
    if clock is not None:
        row["solves"], row["solve_calls"] = clock.seconds, clock.calls
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
    clock = _SolveClock()

    def timed(name, make, fit_kw, published=None):
        clock.reset()
        t0 = time.perf_counter()
        fit = make().fit(**fit_kw)
        rows.append(_row(name, fit, time.perf_counter() - t0, published, clock))
        r = rows[-1]
        print(f"{name}: {r['seconds']:.2f} s, solves {r['solves']:.2f} s "
              f"({r['solve_calls']} calls), objective {fit.objective:.3f}", flush=True)
        return fit

    for method in ("focei",) if args.quick else ("focei", "foce", "laplace"):
        timed(f"theo_sd {method}", lambda: _pop(model), dict(subjects=subjects, method=method),
              PUBLISHED)
    # the split between compiled solves and the Python around them, on one thread (with
    # threads the solves' times add up across threads, their sum can exceed the wall time)
    timed("theo_sd focei threads=1", lambda: _pop(model, threads=1),
          dict(subjects=subjects, method="focei"), PUBLISHED)
    fit = timed("theo_sd saem", lambda: _pop(model),
                dict(subjects=subjects, method="saem", seed=0), PUBLISHED_SAEM)
    rows[-1]["split"] = fit.saem.seconds
    n = 60 if args.quick else 500
    sim = read_events(_simulate(model, n), model, comp, "cp", params=[1.0, 1.0, 1.0])
    for workers in (None, 1):
        timed(f"simulated {n} focei" + (" threads (workers=1)" if workers else ""),
              lambda w=workers: _pop(model, workers=w),
              dict(subjects=sim, method="focei"))
    if not args.quick:
        wpop, wsub = _warfarin()
        wpop().fit(wsub, max_iter=1, covariance=False)  # compile
        for workers in (None, 1):
            timed("warfarin focei" + (" threads (workers=1)" if workers else ""),
                  lambda w=workers: wpop(workers=w), dict(subjects=wsub, method="focei",
                                                     covariance=False))
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
