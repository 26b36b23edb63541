"""An independent reference for the Benchmark-Models-PEtab collection: every PEtab
experiment simulated by libroadrunner (CVODE), the log-likelihood at the nominal parameters.

This script does not import `sciml`: it is the second opinion where our simulations, the
collection's ``simulatedData`` tables and AMICI's published values disagree. Run it from
the repository root in an environment with libroadrunner, python-libsbml, petab and pandas::

    python -m benchmarks.petab_roadrunner --collection PATH [--models A B]
        [--json benchmarks/results/petab_roadrunner.json]

`benchmarks.petab_collection` reads the JSON as the reference labelled "roadrunner".

How a PEtab v1 problem is simulated here (the format's own semantics, written out with
libsbml so that roadrunner sees an ordinary SBML model per simulation):

- every SBML parameter of the parameter table takes its nominal value (linear scale);
- a condition sets parameters (their value), compartments (their size) and species (the
  initial concentration, or the amount with ``hasOnlySubstanceUnits``); a value that is a
  parameter id is that parameter's nominal value; an empty or ``NaN`` cell sets nothing;
  an initial assignment of a target it sets is removed;
- pre-equilibration: the model under the pre-equilibration condition simulated until its
  state stops moving (its change over a tenfold longer time below 1e-11 relative); the
  simulation then starts from that state (concentrations of species without
  ``hasOnlySubstanceUnits``, amounts of the others, values of rate-rule targets), except
  for the species its own condition sets;
- measurements at ``time = inf`` are the observables at the steady state reached from
  the simulation's start, in the same way;
- SBML events, piecewise rules and assignment rules are roadrunner's to handle;
- observable and noise formulas are evaluated (sympy, the `petab` library's grammar) on
  roadrunner's values at each measurement time: species as concentrations (amounts with
  ``hasOnlySubstanceUnits``), parameters, compartments, rule targets, ``time``, and the
  row's ``observableParameters`` / ``noiseParameters`` (numbers or parameter ids);
- the log-likelihood: normal or Laplace noise on the lin, log or log10 scale, as PEtab
  writes the densities (noise formulas that read the states included, which the `petab`
  library's ``calculate_llh`` cannot evaluate; where it can, its value is reported beside).

Tolerances: rtol 1e-10, atol 1e-14 (CVODE's BDF, up to 2 10^5 steps; an experiment where
CVODE stalls is run again at atol 1e-12, 1e-10, then rtol 1e-8 too, and named: Isensee's
inputs switched on at t = 30 and 55 stall it at atol 1e-14); each model is also run at
rtol 1e-8, atol 1e-10 (ours by default), and the llh difference between the two is
reported as roadrunner's own error estimate (Oliveira's llh moves by 100 between them:
atol is on roadrunner's amounts).
"""

import argparse
import glob
import json
import math
import os
import platform
import sys
import time
import warnings

import numpy as np

if __name__ == "__main__" and __package__ in (None, ""):
    # run as a file: this folder's petab.py (a benchmark) must not shadow the library
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
        os.path.abspath(__file__))]

TOLS = {"tight": (1e-10, 1e-14), "loose": (1e-8, 1e-10)}
SS_REL = 1e-11   # steady state: relative change of the state over a tenfold time
SS_T_MAX = 1e12
PETAB_LLH_MAX_ROWS = 3000  # the `petab` library's llh evaluates sympy row by row


def problem_yaml(folder):
    ys = sorted(y for y in glob.glob(os.path.join(folder, "*.yaml"))
                if "test" not in os.path.basename(y))
    return ys[0] if ys else None


def _is_number(v):
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


class Model:
    """One PEtab v1 problem: its SBML document and tables, simulated per experiment."""

    def __init__(self, yaml_path, rtol, atol):
        import libsbml
        import petab.v1 as petab
        import yaml

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.problem = petab.Problem.from_yaml(yaml_path)
        with open(yaml_path) as f:
            cfg = yaml.safe_load(f)
        folder = os.path.dirname(os.path.abspath(yaml_path))
        sbml_file = os.path.join(folder, cfg["problems"][0]["sbml_files"][0])
        self.doc = libsbml.readSBMLFromFile(sbml_file)
        self.rtol, self.atol = rtol, atol
        m = self.doc.getModel()
        self.species = {s.getId(): s.getHasOnlySubstanceUnits() for s in m.getListOfSpecies()}
        self.compartments = {c.getId() for c in m.getListOfCompartments()}
        self.sbml_params = {p.getId(): p.getValue() for p in m.getListOfParameters()}
        self.rate_targets = [r.getVariable() for r in m.getListOfRules() if r.isRate()]
        self.rule_targets = {r.getVariable() for r in m.getListOfRules() if r.isAssignment()}
        self.reactions = {r.getId() for r in m.getListOfReactions()}
        pdf = self.problem.parameter_df
        self.nominal = {pid: float(pdf.loc[pid, "nominalValue"]) for pid in pdf.index}
        self.cond = self.problem.condition_df
        self.switches = _time_switches(m)
        self._rr = {}  # SBML text -> compiled RoadRunner
        self._pre = {}  # pre-equilibration condition -> state

    # ---------------------------------------------------------------- values

    def value(self, v):
        """A table cell as a number: a number, a parameter id's nominal value, or the SBML
        parameter's value; None for an empty / NaN cell."""
        if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
            return None
        if _is_number(v):
            x = float(v)
            return None if math.isnan(x) else x
        v = str(v).strip()
        if v in self.nominal:
            return self.nominal[v]
        if v in self.sbml_params:
            return self.sbml_params[v]
        raise ValueError(f"cannot resolve the value {v!r}")

    def condition(self, cid):
        """``{target: value}`` of condition `cid` (cells that set something)."""
        if not cid:
            return {}
        row = self.cond.loc[cid]
        out = {}
        for col in self.cond.columns:
            if col == "conditionName":
                continue
            x = self.value(row[col])
            if x is not None:
                out[col] = x
        return out

    # ---------------------------------------------------------------- models

    def sbml_for(self, cid, state=None):
        """The SBML text of the model under condition `cid`, starting from `state`
        (``{id: value}``, values as `carried` gives them) where given."""
        import libsbml

        doc = self.doc.clone()
        m = doc.getModel()

        def drop_ia(sid):
            ia = m.getInitialAssignment(sid)
            if ia is not None:
                m.removeInitialAssignment(sid)

        def set_entity(tid, x, what):
            if tid in self.species:
                s = m.getSpecies(tid)
                if self.species[tid]:
                    s.setInitialAmount(x)
                else:
                    s.setInitialConcentration(x)
                drop_ia(tid)
            elif tid in self.compartments:
                m.getCompartment(tid).setSize(x)
                drop_ia(tid)
            elif tid in self.sbml_params:
                m.getParameter(tid).setValue(x)
                drop_ia(tid)
            elif what == "condition":
                raise ValueError(f"condition target {tid!r} is not in the SBML model")

        for pid, x in self.nominal.items():
            set_entity(pid, x, "parameter")
        if state is not None:
            for tid, x in state.items():
                set_entity(tid, x, "state")
        for tid, x in self.condition(cid).items():
            set_entity(tid, x, "condition")
        return libsbml.writeSBMLToString(doc)

    def runner(self, text):
        import roadrunner

        rr = self._rr.get(text)
        if rr is None:
            rr = roadrunner.RoadRunner(text)
            self._rr[text] = rr
        else:
            rr.resetAll()
        integ = rr.integrator
        integ.relative_tolerance = self.rtol
        integ.absolute_tolerance = self.atol
        integ.maximum_num_steps = 200_000
        integ.stiff = True
        return rr

    def carried(self, rr):
        """The state that a simulation after `rr`'s hands on: floating species
        (concentration, amount with hasOnlySubstanceUnits) and rate-rule targets."""
        out = {}
        for sid in rr.model.getFloatingSpeciesIds():
            out[sid] = rr[sid] if self.species.get(sid) else rr[f"[{sid}]"]
        for v in self.rate_targets:
            out[v] = rr[v]
        return out

    def steady(self, rr, t0):
        """Simulate `rr` from `t0` (its current state) until its state stops moving; the
        final time, or raises."""
        t, span = t0, 100.0
        prev = np.array(list(self.carried(rr).values()))
        while span <= SS_T_MAX:
            rr.simulate(t, t + span, 2)
            t += span
            now = np.array(list(self.carried(rr).values()))
            scale = np.maximum(np.abs(now), 1e-12 * max(np.max(np.abs(now)), 1e-300))
            if np.all(np.abs(now - prev) <= SS_REL * scale):
                return t
            prev = now
            span *= 10.0
        raise RuntimeError(f"no steady state by t = {t:g}")

    def preequilibrate(self, pre):
        if pre not in self._pre:
            rr = self.runner(self.sbml_for(pre))
            self.steady(rr, 0.0)
            self._pre[pre] = self.carried(rr)
        return self._pre[pre]

    def switch_times(self, cid):
        """Roots in time of the model's piecewise conditions under condition `cid`."""
        env = dict(self.sbml_params)
        env.update({k: v for k, v in self.nominal.items()})
        env.update({k: v for k, v in self.condition(cid).items()})
        env.update({c: self.doc.getModel().getCompartment(c).getSize()
                    for c in self.compartments if c not in env})
        out = []
        for e in self.switches:
            try:
                v = float(e.subs({q: env[q.name] for q in e.free_symbols}))
            except (KeyError, TypeError):
                continue
            if math.isfinite(v):
                out.append(v)
        return out

    # ---------------------------------------------------------------- formulas

    def _symbols(self, exprs):
        out = set()
        for e in exprs:
            out |= {s.name for s in e.free_symbols}
        return out

    def selection(self, name):
        """roadrunner's selection string for an SBML entity in a formula."""
        if name in self.species:
            return name if self.species[name] else f"[{name}]"
        return name

    def simulate_experiment(self, pre, sim, rows):
        """Observable and noise values of the measurement rows `rows` (DataFrame) of one
        (pre-equilibration, simulation) pair."""
        from petab.v1.math import sympify_petab

        state = self.preequilibrate(pre) if pre else None
        if state is not None:
            # the simulation's own condition sets its species again
            own = self.condition(sim)
            state = {k: v for k, v in state.items() if k not in own}
        obs_df = self.problem.observable_df
        oids = sorted(set(rows["observableId"]))
        forms = {o: (sympify_petab(str(obs_df.loc[o, "observableFormula"])),
                     sympify_petab(str(obs_df.loc[o, "noiseFormula"]))) for o in oids}
        names = self._symbols([e for pair in forms.values() for e in pair])
        model_names = sorted(n for n in names if n in self.species or n in self.compartments
                             or n in self.sbml_params or n in self.rule_targets
                             or n in self.reactions)
        sels = ["time"] + [self.selection(n) for n in model_names]
        rr = self.runner(self.sbml_for(sim, state))
        times = rows["time"].astype(float).to_numpy()
        finite = np.unique(times[np.isfinite(times)])
        values = {}  # time -> {name: value}
        if len(finite):
            grid = np.unique(np.concatenate([[0.0], finite]))
            if len(grid) == 1:
                grid = np.array([0.0, 1e-12])  # roadrunner simulates over a span
            # integrated piece by piece between the switching times of piecewise terms
            # in time: each simulate() restarts CVODE, which then never steps across a
            # jump (at tight tolerances it stalls there: Isensee, Chen)
            cuts = [t for t in self.switch_times(sim) if grid[0] < t < grid[-1]]
            bounds = [grid[0], *sorted(set(cuts)), grid[-1]]
            for a, b in zip(bounds, bounds[1:]):
                pts = np.unique(np.concatenate([[a, b], grid[(grid > a) & (grid < b)]]))
                res = np.asarray(rr.simulate(times=pts, selections=sels))
                for k, tt in enumerate(pts):
                    if tt in grid:
                        values[float(tt)] = dict(zip(["time"] + model_names, res[k]))
        if np.any(np.isinf(times)):
            rr = self.runner(self.sbml_for(sim, state))
            t_end = self.steady(rr, 0.0)
            values[math.inf] = {"time": t_end, **{n: rr[self.selection(n)]
                                                  for n in model_names}}
        # every symbol of the formulas as a column over the rows, then each formula
        # evaluated on the rows of its observable at once (lambdified)
        n = len(rows)
        tt = rows["time"].astype(float).to_numpy()
        env = {"time": np.array([values[t]["time"] for t in tt])}
        for name in model_names:
            env[name] = np.array([values[t][name] for t in tt])
        for kind in ("observable", "noise"):
            col = f"{kind}Parameters"
            cells = rows[col].tolist() if col in rows else [""] * n
            for k, (cell, oid) in enumerate(zip(cells, rows["observableId"])):
                if isinstance(cell, float) and math.isnan(cell):
                    cell = ""
                parts = str(cell).split(";") if str(cell) != "" else []
                for i, v in enumerate(parts):
                    key = f"{kind}Parameter{i + 1}_{oid}"
                    if key not in env:
                        env[key] = np.full(n, np.nan)
                    env[key][k] = self.value(v.strip())
        for name in names:
            if name not in env:
                if name in self.nominal:
                    env[name] = np.full(n, self.nominal[name])
                elif name in self.sbml_params:
                    env[name] = np.full(n, self.sbml_params[name])
        y = np.full(n, np.nan)
        s = np.full(n, np.nan)
        obs_col = rows["observableId"].to_numpy()
        for oid, (fo, fs) in forms.items():
            sel = obs_col == oid
            y[sel] = _evaluate(fo, env, sel)
            s[sel] = _evaluate(fs, env, sel)
        return y, s


def _time_switches(m):
    """Where the SBML model's piecewise conditions change in time: for each relation that
    is linear in ``time`` (in rules and kinetic laws), its root as a sympy expression of
    the model's symbols."""
    import libsbml
    import sympy
    from petab.v1.math import sympify_petab

    maths = [r.getMath() for r in m.getListOfRules()]
    maths += [r.getKineticLaw().getMath() for r in m.getListOfReactions()
              if r.getKineticLaw() is not None]
    out = set()
    for a in maths:
        text = libsbml.formulaToL3String(a) if a is not None else ""
        if "time" not in text:
            continue
        try:
            e = sympify_petab(text)
        except Exception:  # a construct the PEtab grammar does not read: no cuts from it
            continue
        time = [q for q in e.free_symbols if q.name == "time"]
        if not time:
            continue
        for r in e.atoms(sympy.core.relational.Relational):
            g = sympy.expand(r.lhs - r.rhs)
            slope = g.diff(time[0])
            if slope.is_number and slope != 0:
                out.add(sympy.simplify(-(g - slope * time[0]) / slope))
    return sorted(out, key=str)


def _evaluate(expr, env, sel):
    """`expr` on the rows `sel`, each symbol's values taken from its column in `env`."""
    import sympy

    syms = sorted(expr.free_symbols, key=lambda q: q.name)
    missing = [q.name for q in syms if q.name not in env]
    if missing:
        raise ValueError(f"no value for {missing[0]!r} in a formula ({expr})")
    f = sympy.lambdify(syms, expr, "numpy")
    out = f(*[env[q.name][sel] for q in syms])
    return np.broadcast_to(np.asarray(out, dtype=np.float64), (int(np.sum(sel)),))


def log_likelihood(m, y, sigma, kind, transform):
    """PEtab's log-likelihood of the measurements `m` given simulations `y` and noise
    `sigma`, rows with ``kind`` normal / laplace and ``transform`` lin / log / log10."""
    total = 0.0
    for mi, yi, si, k, tr in zip(m, y, sigma, kind, transform):
        if tr == "lin":
            r, jac = (mi - yi) / si, 0.0
        elif tr == "log":
            r, jac = (math.log(mi) - math.log(yi)) / si, math.log(mi)
        else:
            r, jac = (math.log10(mi) - math.log10(yi)) / si, math.log(mi * math.log(10.0))
        if k == "normal":
            total -= 0.5 * math.log(2 * math.pi * si * si) + 0.5 * r * r + jac
        else:
            total -= math.log(2 * si) + abs(r) + jac
    return total


def run(yaml_path, rtol, atol):
    """``dict(llh, simulation, sigma, ...)`` of one problem at the nominal parameters."""
    import petab.v1 as petab

    model = Model(yaml_path, rtol, atol)
    meas = model.problem.measurement_df.reset_index(drop=True)
    if "preequilibrationConditionId" not in meas:
        meas["preequilibrationConditionId"] = ""
    pre_col = meas["preequilibrationConditionId"].astype(object)
    pre_col = pre_col.where(pre_col.notna(), "").astype(str)
    y = np.full(len(meas), np.nan)
    s = np.full(len(meas), np.nan)
    fallback = []
    for (pre, sim), idx in meas.groupby([pre_col, meas["simulationConditionId"]]).groups.items():
        rows = meas.loc[idx]
        # where CVODE stalls (t + h = t right after a switch in Isensee_JCB2018 at atol
        # 1e-14), the experiment again at looser tolerances, noted
        ladder = [(rtol, atol)] + [(rtol, a) for a in (1e-12, 1e-10) if a > atol] + \
            [(max(rtol, 1e-8), max(atol, 1e-10))]
        for k, (rt, at) in enumerate(ladder):
            model.rtol, model.atol = rt, at
            try:
                yy, ss = model.simulate_experiment(pre, sim, rows)
                break
            except RuntimeError:
                if k == len(ladder) - 1:
                    raise
        if k:
            fallback.append(f"{pre + '>' if pre else ''}{sim}: rtol {rt:g}, atol {at:g}")
        model.rtol, model.atol = rtol, atol
        y[np.asarray(idx)] = yy
        s[np.asarray(idx)] = ss
    obs = model.problem.observable_df
    kind, tr = [], []
    for o in meas["observableId"]:
        dist = obs.loc[o].get("noiseDistribution", "normal")
        trans = obs.loc[o].get("observableTransformation", "lin")
        kind.append("normal" if not isinstance(dist, str) or dist == "" else dist)
        tr.append("lin" if not isinstance(trans, str) or trans == "" else trans)
    llh = log_likelihood(meas["measurement"].astype(float).to_numpy(), y, s, kind, tr)
    out = dict(llh=llh, simulation=y.tolist(), sigma=s.tolist(), rows=len(meas))
    if fallback:
        out["looser"] = fallback
    sim_df = meas.rename(columns={"measurement": "simulation"})
    sim_df["simulation"] = y
    if len(meas) > PETAB_LLH_MAX_ROWS:
        out["llh_petab_error"] = f"not computed: {len(meas)} rows (slow row by row)"
        return out
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out["llh_petab"] = float(petab.calculate_llh(meas, sim_df, obs,
                                                         model.problem.parameter_df))
    except Exception as e:  # a noise formula that reads the states
        out["llh_petab_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return out


def main(argv=None):
    import roadrunner

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collection", default=os.environ.get("BENCHMARK_MODELS_PETAB", ""))
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not a.collection or not os.path.isdir(a.collection):
        sys.exit("petab_roadrunner: pass --collection PATH (the Benchmark-Models folder)")
    names = a.models or sorted(d for d in os.listdir(a.collection)
                               if os.path.isdir(os.path.join(a.collection, d)))
    roadrunner.Logger.setLevel(roadrunner.Logger.LOG_ERROR)
    results = {}
    if a.json and os.path.isfile(a.json) and a.models:
        with open(a.json) as f:
            results = json.load(f).get("models", {})
    for name in names:
        yaml_path = problem_yaml(os.path.join(a.collection, name))
        row = {}
        t0 = time.perf_counter()
        try:
            row = run(yaml_path, *TOLS["tight"])
            row["seconds"] = time.perf_counter() - t0
        except Exception as e:  # reported per model
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if "llh" in row:
            try:
                loose = run(yaml_path, *TOLS["loose"])
                row["llh_loose"] = loose["llh"]
                row["self_error"] = abs(row["llh"] - loose["llh"])
            except Exception as e:
                row["loose_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        results[name] = row
        if "error" in row:
            print(f"{name:38s} error: {row['error']}", flush=True)
        else:
            print(f"{name:38s} llh {row['llh']:.6f} (rtol 1e-8: "
                  f"{row.get('llh_loose', float('nan')):.6f}) "
                  f"petab {row.get('llh_petab', float('nan')):.6f} {row['seconds']:.1f} s",
                  flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"roadrunner": roadrunner.__version__,
                           "tolerances": TOLS, "machine": platform.processor() or
                           platform.machine(), "models": results}, f, indent=0)


if __name__ == "__main__":
    main()
