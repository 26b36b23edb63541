"""Censored observations of an event table, nlmixr2's convention (``CENS``, ``LIMIT``).

``CENS = 1`` on an observation record says the value is below the lower limit of
quantification and ``DV`` holds that limit; ``CENS = 0`` (or missing) is an
ordinary observation. ``LIMIT``, when present, is the lower end of a censored
value's interval (``-inf`` by default). A separate limit (`read_events(lloq=)`,
a column or a number) censors the observations below it where no ``CENS``
column says otherwise, and is the limit simulated values are censored at.
"""

import math

import numpy as np

__all__ = ["flag_column", "read_censoring"]


def flag_column(tab, given, default, what):
    """The table's column for ``given`` (a name; None: ``default`` if the table has it;
    False: none)."""
    if given is False:
        return None
    if given is None:
        return tab.column(default)
    if not isinstance(given, str):
        raise TypeError(f"read_events: `{what}` must be a column name (or False), got "
                        f"{given!r}")
    col = tab.column(given)
    if col is None:
        raise ValueError(f"read_events: `{what}` column {given!r} is not in the {tab.source}; "
                         f"its columns are {', '.join(tab.names)}")
    return col


def lloq_values(tab, lloq):
    """``(per-row limits (NaN: none), its column or None)`` of `read_events(lloq=)`."""
    if lloq is None:
        return None, None
    if isinstance(lloq, str):
        col = flag_column(tab, lloq, None, "lloq")
        return tab.numbers(col), col
    try:
        v = float(lloq)
    except (TypeError, ValueError):
        raise TypeError(f"read_events: `lloq` must be a column name or a number, got "
                        f"{lloq!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"read_events: `lloq` must be finite, got {lloq!r}")
    return np.full(tab.n, v), None


def read_censoring(tab, dv, observed, cens_col, limit_col, limits, lloq_col):
    """``(dv, censored, lloq)`` per row: DV with censored records holding their limit,
    which rows are censored (bool), and each row's limit (-inf: none).

    ``observed``: the observation records (EVID 0, MDV 0); only they are read.
    ``limits``: `lloq_values`' per-row limits or None."""
    dv = dv.copy()
    lloq = np.full(tab.n, -np.inf) if limits is None else np.where(np.isnan(limits), -np.inf,
                                                                    limits)
    if cens_col is None:
        below = observed & (dv < lloq)  # NaN DV compares False: not censored
        return np.where(below, lloq, dv), below, lloq
    flags = tab.numbers(cens_col, integer=True)
    cens = np.zeros(tab.n, dtype=bool)
    for i in np.nonzero(observed)[0]:
        c = flags[i]
        if math.isnan(c) or c == 0:
            continue
        if c == -1:
            raise ValueError(f"{tab.where(i, cens_col)}: CENS = -1 (above an upper limit of "
                             "quantification) is not supported; only lower limits (CENS = 1)")
        if c != 1:
            raise ValueError(f"{tab.where(i, cens_col)}: CENS must be 0, 1 or missing, got "
                             f"{int(c)}")
        if math.isnan(dv[i]):
            if not math.isfinite(lloq[i]):
                raise ValueError(f"{tab.where(i, tab.column('DV') or 'DV')}: a censored "
                                 "record (CENS = 1) needs its limit in DV, or in an `lloq` "
                                 "column")
            dv[i] = lloq[i]
        if limit_col is not None:
            lo = tab.raw[limit_col][i]
            x = _lower(lo)
            if x is None:
                raise ValueError(f"{tab.where(i, limit_col)}: expected a number, got {lo!r}")
            if x != -math.inf:
                raise ValueError(f"{tab.where(i, limit_col)}: LIMIT {x!r} (a finite lower end "
                                 "of the censored interval) is not supported yet; the M3 "
                                 "likelihood takes the value in (-inf, LLOQ): leave LIMIT "
                                 "missing or -Inf")
        cens[i] = True
        lloq[i] = dv[i]  # nlmixr2: DV holds the limit of a censored record
    return dv, cens, lloq


def _lower(v):
    """A LIMIT entry: -inf where missing or ``-Inf``, a float, or None (not a number)."""
    if v is None:
        return -math.inf
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("", ".", "na", "nan", "-inf", "-infinity"):
            return -math.inf
        try:
            return float(s)
        except ValueError:
            return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return -math.inf if math.isnan(x) else x
