"""PEtab v1 problems (the Benchmark-Models collection) read into the v2 tables that
`PetabProblem` builds from.

The translation is the format's own correspondence, done here rather than by the
`petab` library's converter (petab 0.8 drops ``observableTransformation`` on the
way, turning log-normal observables into normal ones):

- the wide condition table (one column per target) becomes the long one
  (``conditionId, targetId, targetValue``), each row still naming its line of
  the original file; an empty or ``NaN`` cell sets nothing (for a species after
  pre-equilibration: it keeps its value);
- each distinct ``(preequilibrationConditionId, simulationConditionId)`` of the
  measurement table is an experiment: a pre-equilibration period at ``-inf``
  under the first (when given), then the simulation from ``t = 0`` under the
  second;
- ``objectivePriorType`` / ``objectivePriorParameters`` are the prior columns.
"""

import os

import pandas as pd

from .errors import PetabError
from .tables import Table, read_table

__all__ = ["read_v1", "experiment_id"]

#: columns of the v1 condition table that are not targets
_NOT_TARGETS = ("conditionId", "conditionName")


def experiment_id(pre, sim):
    """The experiment of a v1 measurement row: its simulation condition, preceded by its
    pre-equilibration condition when there is one."""
    return f"{pre}>{sim}" if pre else sim


def read_v1(path, cfg, file):
    """``(sbml_path, tables)`` of the v1 problem `cfg` (read from `path`): ``tables`` maps
    parameter, observable, measurement, condition and experiment to lists of `Table` in
    the v2 layout; `file` resolves a name relative to the problem's folder."""
    problems = cfg.get("problems") or []
    if len(problems) != 1:
        raise PetabError(f"{path}: `problems` must hold one problem, got {len(problems)}")
    pr = problems[0]
    sbml = pr.get("sbml_files") or []
    if len(sbml) != 1:
        raise PetabError(f"{path}: `sbml_files` must name one SBML model, got {len(sbml)}")
    sbml_path = file(sbml[0])
    if not os.path.isfile(sbml_path):
        raise PetabError(f"the SBML model {sbml_path} does not exist (named in {path})")

    def files(key, where=pr, required=True):
        out = where.get(key) or []
        if isinstance(out, str):
            out = [out]
        if required and not out:
            raise PetabError(f"{path}: `{key}` is missing (a required table)")
        return [file(p) for p in out]

    par = [_priors(read_table(p, ["parameterId", "parameterScale", "lowerBound",
                                  "upperBound", "nominalValue", "estimate"], "parameter"))
           for p in files("parameter_file", cfg)]
    obs = [read_table(p, ["observableId", "observableFormula", "noiseFormula"], "observable")
           for p in files("observable_files")]
    meas = [read_table(p, ["observableId", "simulationConditionId", "time", "measurement"],
                       "measurement") for p in files("measurement_files")]
    cond = [_long_conditions(read_table(p, ["conditionId"], "condition"))
            for p in files("condition_files")]
    exps, seen = [], set()
    for t in meas:
        exp_rows, exp_lines = [], []
        pre = t.df["preequilibrationConditionId"] if "preequilibrationConditionId" in t.df \
            else pd.Series([""] * len(t.df), index=t.df.index)
        eids = [experiment_id(a, b) for a, b in zip(pre, t.df["simulationConditionId"])]
        for (line, row), a, eid in zip(t.rows(), pre, eids):
            if not row["simulationConditionId"]:
                raise PetabError(f"{t.where(line, 'simulationConditionId')}: a value is "
                                 "required here")
            if eid not in seen:
                seen.add(eid)
                if a:
                    exp_rows.append((eid, "-inf", a))
                    exp_lines.append(line)
                exp_rows.append((eid, "0", row["simulationConditionId"]))
                exp_lines.append(line)
        t.df = t.df.assign(experimentId=eids)
        t.columns = list(t.df.columns)
        # an experiment's errors point at the measurement row that first names it
        exps.append(Table(t.path, pd.DataFrame(exp_rows, dtype=str, columns=[
            "experimentId", "time", "conditionId"]), lines=exp_lines))
    ids = {cid for t in cond for cid in t.ids}
    return sbml_path, dict(parameter=par, observable=obs, measurement=meas, condition=cond,
                           experiment=exps, condition_ids=ids)


def _priors(t):
    """v1's objective prior columns under v2's names."""
    ren = {"objectivePriorType": "priorDistribution",
           "objectivePriorParameters": "priorParameters"}
    if any(c in t.df for c in ren):
        t.df = t.df.drop(columns=[c for c in ren.values() if c in t.df]).rename(columns=ren)
        t.columns = list(t.df.columns)
    return t


def _long_conditions(t):
    """The wide v1 condition table as v2's long one, rows keeping their file lines."""
    targets = [c for c in t.columns if c not in _NOT_TARGETS]
    recs, lines = [], []
    for line, row in t.rows():
        cid = t.require(line, row, "conditionId")
        for c in targets:
            v = row[c]
            if v == "" or v.lower() == "nan":
                continue
            recs.append((cid, c, v))
            lines.append(line)
    df = pd.DataFrame(recs, columns=["conditionId", "targetId", "targetValue"], dtype=str)
    out = Table(t.path, df, lines=lines)
    out.ids = [row["conditionId"] for _, row in t.rows()]  # conditions that set nothing too
    return out
