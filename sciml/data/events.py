"""Event tables (NONMEM / nlmixr2 / Pumas convention) -> one ODE problem and `Data` per subject.

`read_events` reads a table with one record per row: doses (``EVID`` 1 or
4, or a classic rxode2 bolus code such as 101), observations (``EVID`` 0)
and other events, grouped by subject (``ID``). Column names are matched
case-insensitively:

==========  ==============================================================
ID          subject identifier (any value; a subject's rows are contiguous)
TIME        record time, >= 0, non-decreasing within a subject
AMT         dose amount (> 0 on dose rows; 0 or missing elsewhere)
DV          observed value (observation rows); missing or 0 on dose rows
EVID        0 observation, 1 dose, 2 other, 3 reset, 4 reset + dose;
            ``100*c + 1`` (classic rxode2) = bolus into compartment ``c``
CMT         dose compartment (optional when `compartments` has one entry);
            on observation rows it may select the observable
CENS        1 = below the limit of quantification, DV the limit (optional)
LIMIT       lower end of a censored value's interval (optional; -inf only)
RATE, DUR   infusion rate or duration (optional); RATE = -1/-2 refused
MDV         1 = not an observation (optional)
II, ADDL    interdose interval and number of additional doses (optional)
SS          steady state: only 0 is supported (optional)
DVID        which output an observation measures (optional)
OCC         occasion (optional): a step function of time (`occasion`)
others      covariates (or only those named by ``covariates=``)
==========  ==============================================================

A missing value is an empty cell, ``.`` (NONMEM's missing), ``NA`` or NaN.
Errors name the row: ``line N`` of a CSV file (the header is line 1), or
``row <index label>`` of a DataFrame.

Decisions (each also stated where it applies):

- Replicate observations (same subject, time and observable) are each kept
  as an observation of its own by default, as NONMEM reads them (rows of the
  `Data` then share times: `sciml.nlme` counts each; `sciml.loss_and_grad`
  refuses such data); ``duplicates="mean"`` merges them into their mean with
  a weight equal to their count, which leaves `sciml.SSE` unchanged up to a
  constant; ``duplicates="error"`` refuses them.
- An observation record (EVID 0, MDV 0 or absent) whose DV is missing is left
  out with a warning naming its subject and row (NONMEM would read it as an
  observation of 0 or stop; MDV = 1 says it is not one).
- Censored observations in nlmixr2's convention (``CENS = 1``: below the
  limit of quantification, DV holds the limit; ``LIMIT`` the interval's
  lower end, only -inf supported) or below ``lloq=`` (a column or a number)
  are marked in `Subject.censored` / `Subject.lloq`, which `sciml.nlme`'s
  M3 likelihood and simulations read (`censoring`).
- Observations of different observables at one time share a `Data` row (NaN
  where a column is not measured).
- A covariate is read per subject; one that changes within a subject is
  taken at its first non-missing value with a warning (``time_varying=
  "first"``, the default) or refused (``time_varying="error"``). With
  ``time_varying=True`` it becomes a step function of time
  (`Subject.covariate_series`): ``interpolation="locf"`` (rxode2's default:
  the value of the last record at or before t holds until the next record)
  or ``"nocb"`` (NONMEM's: the value of the next record applies from the
  previous record's time). Records with the covariate missing are skipped.
  Through `covariate_params` / `Subject.with_params` a rule that copies the
  covariate into a model parameter (``WT="WT"``) becomes `sciml.Change`
  segments at the times the value changes, its value at the start in the
  problem's params.
- EVID 2 rows carry no dose and no observation; their times extend the
  default time span and their covariate values are read.
- EVID 3/4 (reset) as a subject's first record just starts the record;
  later resets are refused, or with ``reset="split"`` start a new occasion:
  a separate `Subject` (same ``id``, next ``occasion``) starting at the
  reset time from ``u0``.
- An observation listed before a bolus at the same time is a pre-dose
  sample in NONMEM, but sciml states are right-continuous at a bolus (the
  solution there is the post-dose value): such rows give a warning.

pandas is not needed: a CSV file is read with the `csv` module, and a
DataFrame (or a mapping of column name -> sequence) is read column by column.
"""

import csv
import math
import os
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

from ..problem import Bolus, Change, Infusion, ODEProblem, check_dose_times, initial_function
from .censoring import flag_column, lloq_values, read_censoring
from .observations import Data

__all__ = ["Subject", "read_events"]

# Column roles of the convention; everything else may be a covariate.
_ROLES = ("ID", "TIME", "AMT", "DV", "EVID", "CMT", "RATE", "DUR", "MDV", "II", "ADDL", "SS",
          "DVID")
_MISSING_TEXT = {"", ".", "na", "nan", "null", "none", "<na>"}


# --------------------------------------------------------------------- Subject


@dataclass
class Subject:
    """One subject (or one occasion of a subject) of an event table.

    Attributes
    ----------
    id : object
        The subject's ``ID`` as in the table (an int where it is integral).
    problem : sciml.ODEProblem
        Doses as `sciml.Bolus` / `sciml.Infusion`, time span covering the
        subject's records, ``u0`` and ``params``.
    data : sciml.Data or None
        The observations (EVID 0, MDV 0, DV present); None when the subject
        has none (a warning says so).
    covariates : dict
        Covariate name (as spelled in the table) -> value (float, or str for
        text columns such as ``sex``).
        With ``read_events(time_varying=True)``: the values at the problem's start.
    occasion : int
        0, or the occasion number when ``reset="split"`` split the record.
    rows : tuple of str
        Where the subject's records are in the table (``line N`` / ``row L``).
    covariate_series : dict
        Only with ``read_events(time_varying=True)``: covariate name -> ``(times,
        values)`` for each covariate that changes within the subject, a step function
        (``values[j]`` from ``times[j]`` until ``times[j + 1]``; ``values[0]`` before
        ``times[0]``), the interpolation (LOCF / NOCB) already applied.
    censored : ndarray of bool or None
        Shaped as ``data.y``: True where the value is below its limit of quantification
        (``CENS = 1``, or below ``read_events(lloq=)``); ``data.y`` there holds the limit.
        None when the table says nothing of censoring. `sciml.nlme` counts these by M3.
    lloq : ndarray or None
        Shaped as ``data.y``: each observation's limit of quantification (-inf where
        none is known; NaN where nothing is observed), when the table gives one.
    """

    id: object
    problem: ODEProblem
    data: Data | None
    covariates: dict
    occasion: int = 0
    rows: tuple = field(default=(), repr=False)
    covariate_series: dict = field(default_factory=dict, repr=False)
    censored: np.ndarray | None = field(default=None, repr=False)
    lloq: np.ndarray | None = field(default=None, repr=False)

    def covariates_at(self, t):
        """The covariates in effect at time ``t`` (right-continuous at a change)."""
        return _covariates_at(self.covariates, self.covariate_series, float(t))

    def params_with(self, theta=None, **rules):
        """A copy of ``theta`` with mechanistic parameters set from this subject's covariates.

        Parameters
        ----------
        theta : array_like, optional
            The flat parameter vector to start from (default: ``problem.params``).
        **rules
            ``name=rule`` for a mechanistic parameter ``name`` of the model:
            a covariate name (str) puts that covariate's value into ``name``;
            a callable ``rule(value, covariates)`` gets the parameter's current
            value and the covariates dict and returns the new value; a number
            sets it.

        Returns
        -------
        ndarray, (model.n_params,)
            With time-varying covariates (`covariate_series`), the parameters at the
            problem's start: `with_params` adds the changes after it.

        Examples
        --------
        >>> theta_i = subject.params_with(theta, V=lambda V, c: V * c["WT"] / 70.0)
        >>> theta_i = subject.params_with(theta, WT="WT")   # model parameter WT := covariate
        """
        model = self.problem.model
        theta = np.array(self.problem.params if theta is None else theta, dtype=np.float64)
        if theta.shape != (model.n_params,):
            raise ValueError(f"Subject.params_with: `theta` must have length {model.n_params} "
                             f"(model.n_params), got shape {theta.shape}")
        return _apply_rules(model, theta, rules, self.covariates, f"subject {self.id!r}")

    def with_params(self, theta=None, **rules):
        """This subject with ``problem.params`` replaced by `params_with(theta, **rules)`.

        Where a rule reads a time-varying covariate (`covariate_series`), the problem
        also gets a `sciml.Change` at each time the rule's value changes (replacing
        changes it had for the parameters these rules set); a callable rule whose value
        changes with time is refused (a Change holds a number, which would cut the
        gradient of the parameter it was computed from).
        """
        prob = self.problem
        base = np.array(prob.params if theta is None else theta, dtype=np.float64)
        theta = self.params_with(base, **rules)
        changes = prob.changes
        if self.covariate_series:
            mine = _rule_changes(prob.model, base, rules, self.covariates,
                                 self.covariate_series, prob.tspan, f"subject {self.id!r}")
            changes = [c for c in (_without(c, rules) for c in changes) if c is not None]
            changes += mine
        return replace(self, problem=prob.remake(params=theta, changes=changes))


def _apply_rules(model, theta, rules, covariates, who):
    for name, rule in rules.items():
        if name not in model.params:
            raise ValueError(f"covariate rule for {name!r}: not a mechanistic parameter of the "
                             f"model; parameters: {', '.join(model.params) or '(none)'}")
        k = model.param_slices[name].start
        if isinstance(rule, str):
            if rule not in covariates:
                raise ValueError(f"covariate rule {name}={rule!r}: {who} has no covariate "
                                 f"{rule!r}; covariates: {', '.join(covariates) or '(none)'}")
            value = covariates[rule]
        elif callable(rule):
            value = rule(float(theta[k]), covariates)
        else:
            value = rule
        if isinstance(value, (bool, np.bool_)) or not isinstance(
                value, (int, float, np.integer, np.floating)) or not np.isfinite(value):
            raise ValueError(f"covariate rule for {name!r} gave {value!r} for {who}; a finite "
                             "number is needed")
        theta[k] = float(value)
    return theta


def _covariates_at(covariates, series, t):
    """``covariates`` with each time-varying one at its value at ``t``."""
    out = dict(covariates)
    for name, (times, values) in series.items():
        j = int(np.searchsorted(times, t, side="right")) - 1
        out[name] = values[max(j, 0)]
    return out


def _without(change, rules):
    """``change`` without the parameters `rules` set (None when nothing is left)."""
    kept = {k: v for k, v in change.params.items() if k not in rules}
    return Change(change.time, kept) if kept else None


def _rule_changes(model, base, rules, cov0, series, tspan, who):
    """The `sciml.Change` list that makes `rules` follow time-varying covariates over
    ``tspan``: one per time in the open span at which a rule's value changes, setting
    the parameters whose value changed there (numbers: covariates are data). ``base``
    is theta before the rules (each segment applies them to it afresh, as at t0)."""
    t0, tf = tspan
    times = sorted({float(t) for ts, _ in series.values() for t in ts if t0 < t < tf})
    if not times or not rules:
        return []
    names = list(rules)
    slot = [model.param_slices[n].start for n in names]
    prev = _apply_rules(model, base.copy(), rules, cov0, who)[slot]
    changes = []
    for t in times:
        cov = _covariates_at(cov0, series, t)
        now = _apply_rules(model, base.copy(), rules, cov, f"{who} at t = {t:g}")[slot]
        upd = {}
        for n, a, b in zip(names, prev, now):
            if a == b:
                continue
            if callable(rules[n]):
                raise ValueError(f"covariate rule for {n!r}: its value changes at t = {t:g} "
                                 f"for {who} (time-varying covariates); a callable rule is "
                                 "evaluated once per segment into a fixed number, which "
                                 "would cut the gradient of the parameter it depends on. "
                                 f"Copy the covariate into a model parameter ({n}='COV' "
                                 "for a parameter COV of the model) and write the "
                                 "dependence in the model")
            upd[n] = float(b)
        if upd:
            changes.append(Change(t, upd))
        prev = now
    return changes


# ----------------------------------------------------------------- the table


class _Table:
    """Raw columns of an event table, with a label per row for messages."""

    def __init__(self, table):
        if isinstance(table, (str, os.PathLike)):
            self._from_csv(os.fspath(table))
        elif hasattr(table, "columns") and hasattr(table, "index"):  # a pandas DataFrame
            names = [str(c) for c in table.columns]
            self.raw = {n: list(table[c].to_numpy(dtype=object))
                        for n, c in zip(names, table.columns)}
            self.labels = [f"row {i!r}" for i in table.index]
            self.source = "DataFrame"
            self.names = names
        elif isinstance(table, dict):
            self.names = [str(c) for c in table]
            cols = [list(v) for v in table.values()]
            lengths = {len(c) for c in cols}
            if len(lengths) > 1:
                raise ValueError(f"read_events: the columns of `table` have different lengths "
                                 f"{sorted(lengths)}")
            self.raw = dict(zip(self.names, cols))
            self.labels = [f"row {i}" for i in range(lengths.pop() if lengths else 0)]
            self.source = "table"
        else:
            raise TypeError("read_events: `table` must be a pandas DataFrame, a CSV path or a "
                            f"dict of columns, got {type(table).__name__}")
        self.n = len(self.labels)
        if self.n == 0:
            raise ValueError(f"read_events: the {self.source} has no rows")
        upper = {}
        for n in self.names:
            key = n.strip().upper()
            if key in upper:
                raise ValueError(f"read_events: columns {upper[key]!r} and {n!r} differ only in "
                                 "case; column names are matched case-insensitively")
            upper[key] = n
        self.upper = upper

    def _from_csv(self, path):
        try:
            f = open(path, newline="", encoding="utf-8-sig")
        except OSError as e:
            raise ValueError(f"read_events: cannot open {path!r}: {e.strerror}") from None
        with f:
            reader = csv.reader(f)
            header, rows, labels = None, [], []
            for rec in reader:
                if not rec or (len(rec) == 1 and not rec[0].strip()):
                    continue  # blank line
                if rec[0].lstrip().startswith("#"):
                    continue  # comment line
                if header is None:
                    header = [h.strip() for h in rec]
                    continue
                if len(rec) != len(header):
                    raise ValueError(f"read_events: {path}, line {reader.line_num}: "
                                     f"{len(rec)} fields, the header has {len(header)}")
                rows.append(rec)
                labels.append(f"line {reader.line_num}")
        if header is None:
            raise ValueError(f"read_events: {path} has no header line")
        self.names = header
        self.raw = {h: [r[j] for r in rows] for j, h in enumerate(header)}
        self.labels = labels
        self.source = os.path.basename(path)

    def column(self, role):
        """The actual name of the column for ``role`` (case-insensitive), or None."""
        return self.upper.get(role.strip().upper())

    def where(self, i, col=None):
        s = f"read_events: {self.source}, {self.labels[i]}"
        return s if col is None else f"{s}, column {col!r}"

    def numbers(self, col, integer=False):
        """Column ``col`` as float64, NaN where missing; non-numeric entries raise."""
        out = np.empty(self.n)
        for i, v in enumerate(self.raw[col]):
            x = _float_or_none(v)
            if x is None:
                raise ValueError(f"{self.where(i, col)}: expected a number, got {v!r}")
            if math.isinf(x):
                raise ValueError(f"{self.where(i, col)}: expected a finite number, got {v!r}")
            if integer and not math.isnan(x) and x != int(x):
                raise ValueError(f"{self.where(i, col)}: expected an integer, got {v!r}")
            out[i] = x
        return out


def _float_or_none(v):
    """float(v); NaN for a missing value; None when ``v`` is not a number."""
    if v is None:
        return math.nan
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, str):
        s = v.strip()
        if s.lower() in _MISSING_TEXT:
            return math.nan
        try:
            return float(s)
        except ValueError:
            return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan if str(v) in ("<NA>", "NaT") else None


def _key(v):
    """A table value normalised for matching: integral numbers -> int, text -> stripped str."""
    x = _float_or_none(v)
    if x is None:
        return str(v).strip()
    if math.isnan(x):
        return None
    return int(x) if x == int(x) else x


def _value(v):
    """A covariate value: float where numeric, else the text; None where missing."""
    x = _float_or_none(v)
    if x is None:
        return str(v).strip() if isinstance(v, str) else v
    return None if math.isnan(x) else x


# --------------------------------------------------------------- read_events


def read_events(table, model, compartments, observable=None, params=None, covariates=None,
                tspan=None, u0=None, *, id_col="ID", time_col="TIME", dv_col="DV",
                obs_col=None, duplicates="keep", time_varying="first", reset="error",
                covariate_params=None, interpolation="locf", censored=None, lloq=None,
                limit=None, occasion=None, initial=None):
    """Read an event table into one `Subject` (problem, data, covariates) per subject.

    Parameters
    ----------
    table : pandas.DataFrame, str or path, or dict of columns
        Records in the NONMEM / nlmixr2 / Pumas convention (see the module
        docstring for the columns); a str or path is read as CSV (``#``
        lines are comments).
    model : sciml.Model
    compartments : mapping
        Compartment (``CMT`` value, usually a number) -> name of the model
        state doses go into, e.g. ``{1: "depot", 2: "central"}``.
    observable : str or mapping, optional
        The model observable (or state) that ``DV`` measures; or a mapping
        from the ``DVID`` (else ``CMT``) value of an observation row to the
        observable it measures, e.g. ``{"cp": "conc", "pca": "effect"}``; the
        Data then has one column per observable, NaN where one is not
        measured at a time. Default: the model's only observable.
    params : array_like or callable, optional
        The flat parameter vector of every subject's problem, or
        ``params(covariates) -> theta`` per subject. Default: the given
        theta is needed unless the model has no mechanistic parameters.
    covariates : sequence of str, optional
        Covariate columns to read (default: every column that is not one of
        the convention's).
    tspan : (t0, tf), optional
        The same time span for every subject. Default: from the subject's
        first record (a reset's time for a later occasion) to its last.
    u0 : array_like or callable, optional
        Initial state (default zeros), or ``u0(covariates) -> array``.
    id_col, time_col, dv_col : str
        Names of the ID, TIME and DV columns (case-insensitive).
    obs_col : str, optional
        The column that selects the observable when `observable` is a
        mapping (default ``DVID`` if present, else ``CMT``).
    duplicates : {"keep", "mean", "error"}
        Several observations of one observable at one time in one subject
        (replicates): kept as separate observations, as NONMEM reads them
        (the default: `Data` rows sharing a time, in table order; `sciml.nlme`
        counts each, `sciml.loss_and_grad` refuses them), merged into their
        mean with weight = their count (for `sciml.SSE` the same loss up to a
        constant; `sciml.GaussianNLL` ignores weights and counts the mean
        once), or refused.
    time_varying : {"first", "error", True, False}
        A covariate that changes within a subject: take its first
        non-missing value and warn (``"first"``, or False), refuse, or (True)
        keep it as a step function of time (`Subject.covariate_series`,
        `interpolation`); rules in `covariate_params` that copy it into a
        model parameter then change that parameter at those times
        (`sciml.Change`), and `Subject.covariates` holds the values at the
        problem's start (what `params` and `u0` as functions receive).
    reset : {"error", "split"}
        EVID 3/4 after a subject's first record: refuse, or start a new
        occasion (a separate Subject with the same id).
    covariate_params : dict, optional
        Rules of `Subject.params_with` applied to every subject's params,
        e.g. ``{"V": lambda V, c: V * c["WT"] / 70}``. With time-varying
        covariates only rules that copy a covariate (``{"WT": "WT"}``) or set
        numbers may follow them: a callable rule whose value changes in time
        is refused (write the dependence in the model instead).
    interpolation : {"locf", "nocb"}
        With ``time_varying=True``, the covariate between records: ``"locf"``
        (last observation carried forward, rxode2's default: a record's value
        holds from its time until the next record's; of records at one time
        the last counts) or ``"nocb"`` (next observation carried backward,
        NONMEM's: a record's value applies from the previous record's time,
        i.e. while the system advances to it; of records at one time the
        first counts). Before a subject's first value it takes that value;
        after its last (NOCB) the last. The problem's parameters are
        right-continuous at a change, so an observable that reads the
        changed parameter at a NOCB change time sees the new value (NONMEM:
        the old); the states are continuous either way.
    censored : str or False, optional
        The column of censoring flags, nlmixr2's ``CENS`` (default: a ``CENS``
        column when there is one; False ignores it): 1 on an observation
        below its limit of quantification, whose DV holds the limit (or is
        missing, the limit then from `lloq`); 0 or missing otherwise. -1
        (above an upper limit) is not supported. `Subject.censored` and
        `Subject.lloq` hold them; `sciml.nlme` counts them by M3.
    lloq : str or float, optional
        The lower limit of quantification: a column (per record) or a number.
        Without a ``censored`` column an observation whose DV is below it is
        censored (DV replaced by the limit); with one, the flags decide, and
        the limit fills a missing DV of a flagged record. Either way it is the
        limit `sciml.nlme.NLME.simulate` censors simulated values at.
    limit : str, optional
        nlmixr2's ``LIMIT`` column (default: one named so, if present): the
        lower end of a censored value's interval. Missing or ``-inf`` is the M3
        likelihood's ``(-inf, LLOQ)``; a finite lower end (M3 on an interval)
        is refused for now.
    initial : dict, optional
        Initial states that are expressions of the parameters, nlmixr2's
        ``effect(0) <- e0``: ``{state: parameter name}``, or a function of the
        parameters (``{"effect": lambda p: p.e0}``, traced), or a number; the
        other states start at `u0`. Each subject's problem then has ``u0`` as a
        function (`sciml.ODEProblem`), with exact gradients through it.
    occasion : str or False, optional
        The occasion column (default: an ``OCC`` column when there is one; False
        reads it as an ordinary covariate). Its value is a step function of time
        whatever `time_varying` says, always last observation carried forward (an
        occasion starts at its first record): in `Subject.covariate_series` when
        it changes within a subject, its value at the start in
        `Subject.covariates`. `sciml.nlme.NLME(iov=, occasion=)` reads it.

    Returns
    -------
    list of Subject
        In table order (occasions of a subject in time order).

    Raises
    ------
    ValueError
        Naming the row and column: missing required columns, non-numeric or
        negative times, times decreasing within a subject, a subject's rows
        not contiguous, a dose into an unknown compartment, AMT <= 0 on a
        dose row, DV (other than missing or 0) on a dose row, AMT on a
        non-dose row, SS != 0, modelled RATE/DUR, unsupported EVID,
        duplicated observations with ``duplicates="error"``, CENS other than
        0 or 1, a censored record without its limit, a finite LIMIT.

    Warns
    -----
    UserWarning
        An observation record (EVID 0, MDV 0 or no MDV column) with DV
        missing is left out, named by subject and row (set MDV = 1 on records
        that are not observations); subjects without observations
        (`Subject.data` None); covariates that change within a subject (with
        ``time_varying="first"``); observations listed before a bolus at the
        same time.

    Examples
    --------
    >>> subjects = sciml.data.read_events("theo_sd.csv", pk, {1: "depot"}, "conc",
    ...                                   params=theta)
    >>> fit = sciml.fit([s.problem for s in subjects], [s.data for s in subjects], ...)
    """
    for name, val, ok in (("duplicates", duplicates, ("error", "mean", "keep")),
                          ("reset", reset, ("error", "split")),
                          ("interpolation", interpolation, ("locf", "nocb"))):
        if not isinstance(val, str) or val not in ok:
            raise ValueError(f"read_events: `{name}` must be one of {ok}, got {val!r}")
    # bool checked by type: 1 == True would pass a membership test
    if not (isinstance(time_varying, bool) or (isinstance(time_varying, str)
                                               and time_varying in ("first", "error"))):
        raise ValueError("read_events: `time_varying` must be True, False, 'first' or "
                         f"'error', got {time_varying!r}")
    if time_varying is False:
        time_varying = "first"
    comp = _compartments(compartments, model)
    obs_kind, obs_names, obs_map = _observables(observable, model)
    initial = None if initial is None else _initial_functions(model, initial)
    tab = _Table(table)

    # Required columns, with the names the caller chose for ID / TIME / DV.
    role_col = {"ID": id_col, "TIME": time_col, "DV": dv_col}
    cols = {r: tab.column(role_col.get(r, r)) for r in _ROLES}
    required = ["ID", "TIME", "AMT", "DV", "EVID"] + ([] if len(comp) == 1 else ["CMT"])
    missing = [role_col.get(r, r) for r in required if cols[r] is None]
    if missing:
        why = "" if "CMT" not in required else (" (CMT is needed because `compartments` has "
                                                f"{len(comp)} entries)")
        raise ValueError(f"read_events: the {tab.source} lacks required column(s) "
                         f"{', '.join(missing)}{why}; its columns are {', '.join(tab.names)}")
    if obs_map is not None:
        key_col = tab.column(obs_col) if obs_col is not None else (cols["DVID"] or cols["CMT"])
        if key_col is None:
            raise ValueError(f"read_events: `observable` is a mapping but the {tab.source} has "
                             f"no {obs_col if obs_col is not None else 'DVID or CMT'} column "
                             "to tell which observable a DV row measures")
    else:
        key_col = None
    cens_col = flag_column(tab, censored, "CENS", "censored")
    limit_col = flag_column(tab, limit, "LIMIT", "limit")
    limits, lloq_col = lloq_values(tab, lloq)
    occ_col = flag_column(tab, occasion, "OCC", "occasion")
    used = {c for c in cols.values() if c is not None} | {key_col, cens_col, limit_col,
                                                           lloq_col, occ_col}
    cov_cols = [c for c in _covariate_columns(covariates, tab, used) if c != occ_col]

    # Parse the columns (errors name the first bad entry).
    num = {}
    for r, integer in (("TIME", False), ("AMT", False), ("DV", False), ("EVID", True),
                       ("RATE", False), ("DUR", False), ("MDV", True), ("II", False),
                       ("ADDL", True), ("SS", True)):
        if cols[r] is not None:
            num[r] = tab.numbers(cols[r], integer)
    time = num["TIME"]
    zero = np.zeros(tab.n)
    amt, evid = np.nan_to_num(num["AMT"]), np.nan_to_num(num["EVID"]).astype(np.int64)
    rate, dur, mdv, ii, addl, ss = (np.nan_to_num(num[r]) if r in num else zero
                                    for r in ("RATE", "DUR", "MDV", "II", "ADDL", "SS"))
    observed = (evid == 0) & (mdv == 0)
    dv, cens, row_lloq = read_censoring(tab, num["DV"], observed, cens_col, limit_col, limits,
                                        lloq_col)
    # censoring columns given (or found): Subject.censored / lloq say so, even if all 0
    censoring = (cens, row_lloq) if cens_col is not None or limits is not None else None
    ids = [_key(v) for v in tab.raw[cols["ID"]]]
    cmt = [_key(v) for v in tab.raw[cols["CMT"]]] if cols["CMT"] is not None else None
    okey = [_key(v) for v in tab.raw[key_col]] if key_col is not None else None

    # Row checks that do not depend on the subject.
    for i in range(tab.n):
        if ids[i] is None:
            raise ValueError(f"{tab.where(i, cols['ID'])}: missing subject ID")
        if math.isnan(time[i]):
            raise ValueError(f"{tab.where(i, cols['TIME'])}: missing time")
        if time[i] < 0:
            raise ValueError(f"{tab.where(i, cols['TIME'])}: negative time {float(time[i])!r}")
        if cmt is not None and isinstance(cmt[i], (int, float)) and cmt[i] <= 0:
            raise ValueError(f"{tab.where(i, cols['CMT'])}: compartment {cmt[i]!r}; compartments "
                             "are numbered from 1 (turning a compartment off with a negative "
                             "CMT is not supported)")
        if ss[i] != 0:
            raise ValueError(f"{tab.where(i, cols['SS'])}: SS={int(ss[i])} (steady-state "
                             "dosing) is not supported; give the doses leading to steady state "
                             "explicitly (e.g. with ADDL/II)")

    # Subjects: contiguous blocks of rows; times non-decreasing within each.
    blocks, seen = [], {}
    for i in range(tab.n):
        if i > 0 and ids[i] == ids[i - 1]:
            if time[i] < time[i - 1]:
                t, prev = float(time[i]), float(time[i - 1])
                raise ValueError(f"{tab.where(i, cols['TIME'])}: time {t!r} is before the "
                                 f"previous record's {prev!r} ({tab.labels[i - 1]}) of subject "
                                 f"{ids[i]!r}; sort each subject's records by time")
            blocks[-1].append(i)
            continue
        if ids[i] in seen:
            raise ValueError(f"{tab.where(i, cols['ID'])}: subject {ids[i]!r} appears again "
                             f"after other subjects (first block at {tab.labels[seen[ids[i]]]}); "
                             "a subject's records must be contiguous")
        seen[ids[i]] = i
        blocks.append([i])

    ctx = _Ctx(tab, cols, comp, (obs_kind, obs_names, obs_map), key_col, duplicates, reset,
               (time, amt, evid, rate, dur, mdv, ii, addl, dv), cmt, okey, censoring)
    subjects, no_data, late_obs, no_dv = [], [], 0, []
    varying = {}
    for rows in blocks:
        cov = _subject_covariates(tab, ids[rows[0]], rows, cov_cols, time_varying, varying)
        series = {} if time_varying is not True else \
            _covariate_series(tab, rows, cov_cols, time, interpolation)
        if occ_col is not None:  # a step function of time, always LOCF
            cov.update(_subject_covariates(tab, ids[rows[0]], rows, [occ_col], True, {}))
            series.update(_covariate_series(tab, rows, [occ_col], time, "locf"))
        for occ, seg in enumerate(ctx.occasions(rows)):
            doses, (data, flags, lim), t_first, t_last, n_late, empty = ctx.segment(seg)
            late_obs += n_late
            sid = ids[rows[0]]
            who = f"subject {sid!r}" + (f" occasion {occ}" if occ else "")
            no_dv += [f"{who} {tab.labels[i]}" for i in empty]
            t_start = t_first if tspan is None else float(tspan[0])
            cov_k = _covariates_at(cov, series, t_start) if series else cov
            prob = _problem(model, doses, data, t_first, t_last, cov_k, who, params, u0, tspan,
                            covariate_params, series, initial)
            if data is None:
                no_data.append(who)
            subjects.append(Subject(sid, prob, data, cov_k, occ,
                                    tuple(tab.labels[i] for i in seg), series, flags, lim))
    if varying:
        desc = "; ".join(f"{c} (subjects {', '.join(map(repr, s[:5]))}"
                         f"{', ...' if len(s) > 5 else ''})" for c, s in varying.items())
        warnings.warn(f"read_events: covariates change within a subject; their first value is "
                      f"used: {desc}", UserWarning, stacklevel=2)
    if no_dv:
        warnings.warn(f"read_events: {len(no_dv)} observation record(s) (EVID 0, MDV not 1) "
                      f"have no DV and are left out: {', '.join(no_dv[:5])}"
                      f"{', ...' if len(no_dv) > 5 else ''}; set MDV = 1 on records that are "
                      "not observations", UserWarning, stacklevel=2)
    if no_data:
        warnings.warn(f"read_events: {len(no_data)} subject(s) have no observations (their "
                      f"`data` is None): {', '.join(no_data[:5])}"
                      f"{', ...' if len(no_data) > 5 else ''}", UserWarning, stacklevel=2)
    if late_obs:
        warnings.warn(f"read_events: {late_obs} observation(s) are listed before a bolus at the "
                      "same time (pre-dose samples); sciml states are right-continuous at a "
                      "bolus, so the model value there is the post-dose one", UserWarning,
                      stacklevel=2)
    return subjects


# ------------------------------------------------------------------ helpers


def _compartments(compartments, model):
    if not hasattr(compartments, "items") or len(compartments) == 0:
        raise TypeError("read_events: `compartments` must be a non-empty mapping compartment "
                        f"-> state name, e.g. {{1: 'depot'}}; got {compartments!r}")
    comp = {}
    for k, s in compartments.items():
        if s not in model.states:
            raise ValueError(f"read_events: `compartments[{k!r}]` = {s!r} is not a state of the "
                             f"model; states: {', '.join(model.states)}")
        comp[_key(k)] = s
    return comp


def _observables(observable, model):
    """(kind, column names, mapping key -> column name or None)."""
    if observable is None:
        if len(model.obs_names) != 1:
            raise ValueError("read_events: say which model output DV measures with "
                             f"`observable=`; the model's observables: "
                             f"{', '.join(model.obs_names) or '(none)'}; states: "
                             f"{', '.join(model.states)}")
        observable = model.obs_names[0]
    if isinstance(observable, str):
        names, mapping = [observable], None
    elif hasattr(observable, "items") and len(observable) > 0:
        mapping = {_key(k): v for k, v in observable.items()}
        names = list(dict.fromkeys(mapping.values()))
    else:
        raise TypeError("read_events: `observable` must be a name or a non-empty mapping "
                        f"DVID/CMT -> name, got {observable!r}")
    kinds = set()
    for n in names:
        if n in model.obs_names:
            kinds.add("observables")
        elif n in model.states:
            kinds.add("states")
        else:
            raise ValueError(f"read_events: `observable` {n!r} is neither an observable "
                             f"({', '.join(model.obs_names) or 'none'}) nor a state "
                             f"({', '.join(model.states)}) of the model")
    if len(kinds) > 1:
        raise ValueError("read_events: `observable` mixes states and observables "
                         f"({names!r}); make the states observables of the model")
    return kinds.pop(), names, mapping


def _covariate_columns(covariates, tab, used):
    if covariates is None:
        return [n for n in tab.names if n not in used and n.strip().upper() not in _ROLES
                and n.strip() not in ("", "rownames") and not n.startswith("Unnamed:")]
    if isinstance(covariates, str):
        covariates = [covariates]
    out = []
    for c in covariates:
        col = tab.column(c)
        if col is None:
            raise ValueError(f"read_events: covariate column {c!r} is not in the {tab.source}; "
                             f"its columns are {', '.join(tab.names)}")
        out.append(col)
    return out


def _subject_covariates(tab, sid, rows, cov_cols, time_varying, varying):
    cov = {}
    for c in cov_cols:
        first, first_i = None, None
        for i in rows:
            v = _value(tab.raw[c][i])
            if v is None:
                continue
            if first is None:
                first, first_i = v, i
            elif v != first:
                if time_varying == "error":
                    raise ValueError(f"{tab.where(i, c)}: covariate changes within subject "
                                     f"(from {first!r} at {tab.labels[first_i]} to {v!r}); "
                                     "time_varying='error' refuses that (pass "
                                     "time_varying='first' to use the first value, True to "
                                     "follow it in time)")
                if time_varying == "first":  # True: followed in time, nothing to warn of
                    varying.setdefault(c, []).append(sid)
                break
        cov[c] = first if first is not None else math.nan
    return cov


def _covariate_series(tab, rows, cov_cols, time, interpolation):
    """{column: (times, values)} for the covariates that change within these rows: the
    step function the interpolation gives (see `read_events`), equal neighbours merged."""
    out = {}
    for c in cov_cols:
        at = {}  # distinct time -> the value that counts there
        for i in rows:
            v = _value(tab.raw[c][i])
            if v is None:
                continue  # a missing value is no record of the covariate
            t = float(time[i])
            if interpolation == "locf" or t not in at:
                at[t] = v  # LOCF: the last record at a time; NOCB: the first
        ts, vs = list(at), list(at.values())
        if interpolation == "nocb":
            # the value of record j holds while advancing to it: from record j-1's time
            vs = vs[1:] + vs[-1:]
        steps_t, steps_v = [], []
        for t, v in zip(ts, vs):
            if not steps_v or v != steps_v[-1]:
                steps_t.append(t), steps_v.append(v)
        if len(steps_v) > 1:
            values = np.array(steps_v, dtype=object if any(isinstance(v, str) for v in steps_v)
                              else np.float64)
            out[c] = (np.array(steps_t), values)
    return out


class _Ctx:
    """What `segment` needs to turn a subject's rows into doses and Data."""

    def __init__(self, tab, cols, comp, observables, key_col, duplicates, reset, arrays,
                 cmt, okey, censoring):
        self.tab, self.cols, self.comp = tab, cols, comp
        self.obs_kind, self.obs_names, self.obs_map = observables
        self.key_col, self.duplicates, self.reset = key_col, duplicates, reset
        (self.time, self.amt, self.evid, self.rate, self.dur, self.mdv, self.ii, self.addl,
         self.dv) = arrays
        self.cmt, self.okey = cmt, okey   # normalised CMT / observable-key values, or None
        self.censoring = censoring        # (censored, limit) per row, or None
        self.dose_cmt = {}                # row -> compartment decoded from a classic EVID

    def occasions(self, rows):
        """Split a subject's rows at resets (EVID 3/4 after its first record)."""
        tab, segs = self.tab, [[]]
        for n, i in enumerate(rows):
            e = self._evid(i)
            if e in (3, 4) and n > 0:
                if self.reset == "error":
                    raise ValueError(f"{tab.where(i, self.cols['EVID'])}: EVID {e} (reset) "
                                     "inside a subject's record is not supported; pass "
                                     "reset='split' to start a new occasion (a separate "
                                     "Subject) there, or give the occasions different IDs")
                segs.append([])
            segs[-1].append(i)
        return [s for s in segs if s]

    def _evid(self, i):
        """EVID of row i with classic rxode2 bolus codes decoded (EVID 1, compartment kept)."""
        e = int(self.evid[i])
        tab, c = self.tab, self.cols["EVID"]
        if e >= 100:
            kind, flag = e % 100, (e // 10000) % 10
            cm = (e // 100000) * 100 + (e // 100) % 100
            if kind != 1 or flag != 0 or cm == 0:
                raise ValueError(f"{tab.where(i, c)}: classic rxode2 EVID {e} is not supported "
                                 "(only bolus codes 100*cmt + 1, e.g. 101); use NONMEM EVID "
                                 "1 with RATE/DUR for infusions")
            if self.cmt is not None and self.cmt[i] is not None and self.cmt[i] != cm:
                raise ValueError(f"{tab.where(i, self.cols['CMT'])}: CMT {self.cmt[i]!r} "
                                 f"disagrees with EVID {e} (a bolus into compartment {cm})")
            self.dose_cmt[i] = cm
            return 1
        if e < 0 or e > 4:
            raise ValueError(f"{tab.where(i, c)}: EVID {e} is not supported (0 observation, "
                             "1 dose, 2 other, 3 reset, 4 reset and dose)")
        return e

    def segment(self, rows):
        """(doses, (Data, censored, lloq) or Nones, first time, last time, #observations
        before a same-time bolus, observation records without DV)."""
        tab, cols = self.tab, self.cols
        doses, obs, bolus_rows, empty = [], [], {}, []
        for i in rows:
            e = self._evid(i)
            if e in (1, 4):
                d = self._dose(i)
                doses.append(d)
                if isinstance(d, Bolus):
                    bolus_rows.setdefault(d.time, i)
                continue
            if self.amt[i] != 0:
                raise ValueError(f"{tab.where(i, cols['AMT'])}: AMT {float(self.amt[i])!r} on "
                                 f"a row with EVID {e} (not a dose); use EVID 1 for a dose, AMT 0 "
                                 "or missing otherwise")
            if e == 0 and self.mdv[i] == 0:
                (empty if math.isnan(self.dv[i]) else obs).append(i)
        late = sum(1 for i in obs if self.time[i] in bolus_rows and i < bolus_rows[self.time[i]])
        data = self._data(obs) if obs else (None, None, None)
        return (doses, data, float(self.time[rows[0]]), float(self.time[rows[-1]]), late,
                empty)

    def _dose(self, i):
        tab, cols = self.tab, self.cols
        t, a = float(self.time[i]), float(self.amt[i])
        if not a > 0:
            raise ValueError(f"{tab.where(i, cols['AMT'])}: a dose row (EVID "
                             f"{int(self.evid[i])}) needs AMT > 0, got {a!r}")
        dv = float(self.dv[i])
        if not (math.isnan(dv) or dv == 0):
            raise ValueError(f"{tab.where(i, cols['DV'])}: DV {dv!r} on a dose row; a dose row "
                             "carries DV missing ('.') or 0; put the observation on its own "
                             "row with EVID 0")
        if i in self.dose_cmt:
            c = self.dose_cmt[i]
        elif self.cmt is None:
            c = next(iter(self.comp))
        else:
            c = self.cmt[i]
            if c is None:
                raise ValueError(f"{tab.where(i, cols['CMT'])}: a dose row needs a compartment")
        if c not in self.comp:
            raise ValueError(f"{tab.where(i, cols['CMT'] or cols['EVID'])}: dose into "
                             f"compartment {c!r}, which `compartments` does not map; known: "
                             f"{', '.join(map(repr, self.comp))}")
        state = self.comp[c]
        rate, dur = float(self.rate[i]), float(self.dur[i])
        if rate in (-1.0, -2.0):
            raise ValueError(f"{tab.where(i, cols['RATE'])}: RATE {rate:g} (modelled infusion "
                             "rate/duration) is not supported; give RATE > 0 or DUR > 0")
        if rate < 0:
            raise ValueError(f"{tab.where(i, cols['RATE'])}: RATE must be >= 0, got {rate!r}")
        if dur < 0:
            raise ValueError(f"{tab.where(i, cols['DUR'])}: DUR must be >= 0, got {dur!r}")
        if rate > 0 and dur > 0 and not math.isclose(a / rate, dur, rel_tol=1e-9):
            raise ValueError(f"{tab.where(i, cols['DUR'])}: DUR {dur!r} disagrees with "
                             f"AMT/RATE = {a / rate!r}; give one of RATE and DUR")
        ii, addl = float(self.ii[i]), int(self.addl[i])
        if addl < 0:
            raise ValueError(f"{tab.where(i, cols['ADDL'])}: ADDL must be >= 0, got {addl}")
        if ii < 0:
            raise ValueError(f"{tab.where(i, cols['II'])}: II must be >= 0, got {ii!r}")
        if addl > 0 and ii == 0:
            raise ValueError(f"{tab.where(i, cols['ADDL'])}: ADDL {addl} additional doses need "
                             "an interdose interval II > 0")
        every, count = (ii, addl + 1) if addl > 0 else (None, 1)
        try:
            if rate > 0:
                return Infusion(t, a / rate, rate, state, every=every, count=count)
            if dur > 0:
                return Infusion(t, dur, a / dur, state, every=every, count=count)
            return Bolus(t, a, state, every=every, count=count)
        except ValueError as e:
            raise ValueError(f"{tab.where(i)}: {e}") from None

    def _data(self, obs):
        tab, cols, names = self.tab, self.cols, self.obs_names
        col_of = {n: j for j, n in enumerate(names)}
        cells = {}  # (time, column) -> list of rows
        for i in obs:
            if self.obs_map is None:
                j = 0
            else:
                k = self.okey[i]
                if k not in self.obs_map:
                    raise ValueError(f"{tab.where(i, self.key_col)}: observation of {k!r}, "
                                     "which `observable` does not map; known: "
                                     f"{', '.join(map(repr, self.obs_map))} (drop these rows "
                                     "or map them)")
                j = col_of[self.obs_map[k]]
            cells.setdefault((float(self.time[i]), j), []).append(i)
        times = sorted({t for t, _ in cells})
        kw = {self.obs_kind: names}
        if self.duplicates == "keep":  # as many rows at a time as its most replicated column
            reps = {t: max(len(rs) for (tt, _), rs in cells.items() if tt == t) for t in times}
            first, times_k = {}, []
            for t in times:
                first[t] = len(times_k)
                times_k += [t] * reps[t]
            at = np.full((len(times_k), len(names)), -1)  # the row of each value
            for (t, j), rs in cells.items():
                at[first[t]:first[t] + len(rs), j] = rs
            y = np.where(at >= 0, self.dv[at], np.nan)
            data = Data(np.array(times_k), y, repeated_times=True, **kw)
            return (data,) + self._censoring_of(at)
        row_of = {t: r for r, t in enumerate(times)}
        at = np.full((len(times), len(names)), -1)
        y = np.full(at.shape, np.nan)
        w = np.ones_like(y)
        merged = False
        for (t, j), rs in cells.items():
            at[row_of[t], j] = rs[0]
            if len(rs) > 1:
                if self.duplicates == "error":
                    raise ValueError(f"{tab.where(rs[1], cols['DV'])}: a second observation of "
                                     f"{names[j]!r} at time {t!r} (also at {tab.labels[rs[0]]}); "
                                     "pass duplicates='keep' to keep each (NONMEM's reading, "
                                     "sciml.nlme), duplicates='mean' to merge replicates into "
                                     "their mean (weighted by their count), or remove them")
                if self.censoring is not None and self.censoring[0][rs].any():
                    c = rs[int(np.argmax(self.censoring[0][rs]))]
                    raise ValueError(f"{tab.where(c, cols['DV'])}: a censored replicate of "
                                     f"{names[j]!r} at time {t!r}: duplicates='mean' cannot "
                                     "average a value below the limit; use duplicates='keep'")
                merged = True
                w[row_of[t], j] = len(rs)
            y[row_of[t], j] = float(np.mean(self.dv[rs]))
        data = Data(np.array(times), y, weights=w if merged else None, **kw)
        return (data,) + self._censoring_of(at)

    def _censoring_of(self, at):
        """``(censored, lloq)`` shaped as the Data's ``y`` (``at``: the row of each value,
        -1 where none), or Nones when the table says nothing of censoring."""
        if self.censoring is None:
            return None, None
        cens, lloq = self.censoring
        has = at >= 0
        return has & cens[at], np.where(has, lloq[at], np.nan)


def _problem(model, doses, data, t_first, t_last, cov, who, params, u0, tspan, rules,
             series, initial=None):
    if params is None:
        if model.params:
            raise ValueError("read_events: give `params` (the flat theta, e.g. from "
                             "model.init_params(...)); the model has mechanistic parameters "
                             f"{', '.join(model.params)}")
        theta = model.init_params()
    else:
        theta = params(cov) if callable(params) else params
    theta = np.array(theta, dtype=np.float64)
    if theta.shape != (model.n_params,):
        raise ValueError(f"read_events: `params` must have length {model.n_params} "
                         f"(model.n_params), got shape {theta.shape} for {who}")
    base = theta
    if rules:
        theta = _apply_rules(model, theta.copy(), rules, cov, who)
    x0 = np.zeros(model.n_states) if u0 is None else (u0(cov) if callable(u0) else u0)
    if tspan is None:
        span = (t_first, t_last)
        if not t_last > t_first:
            raise ValueError(f"read_events: {who} has all its records at time {t_first!r}; "
                             "give `tspan` to say how long to simulate")
    else:
        span = tspan
    if initial is not None:
        x0 = initial(x0)
    prob = ODEProblem(model, x0, span, theta)
    if series:
        if callable(params):
            # `params` sees the covariates at the start only; one that reads a time-varying
            # covariate would silently hold its first value
            for t in sorted({float(t) for ts, _ in series.values() for t in ts}):
                if prob.tspan[0] < t < prob.tspan[1] and not np.array_equal(
                        np.asarray(params(_covariates_at(cov, series, t)), dtype=np.float64),
                        base):
                    raise ValueError(f"read_events: `params` (a function of the covariates) "
                                     f"changes at t = {t:g} for {who}, whose covariates "
                                     f"{', '.join(series)} vary with time; it is evaluated at "
                                     "the start only: pass time-varying covariates through "
                                     "`covariate_params` rules such as {'WT': 'WT'}")
        if rules:
            prob.changes = _rule_changes(model, base, rules, cov, series, prob.tspan, who)
    # the default span starts at the subject's first record, so only a given one can miss
    # a dose: say which subject
    check_dose_times(doses, prob.tspan[0], who=f"read_events: {who}, `tspan` {prob.tspan}")
    prob.doses = doses
    if data is not None:
        data.check_span(prob.tspan, where=f"read_events: {who}")
    return prob



def _initial_functions(model, initial):
    """``base -> u0 function`` of `problem.initial_function` for ``initial``, one function
    per distinct base: a table's subjects share it, so it is traced once."""
    initial_function(model, initial, np.zeros(model.n_states), "read_events")  # checked
    made = {}

    def of(base):
        base = np.array(base, dtype=np.float64)
        key = base.tobytes()
        if key not in made:
            made[key] = initial_function(model, initial, base, "read_events")
        return made[key]

    return of
