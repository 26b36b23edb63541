"""Reading the PEtab tables (TSV) with errors that name the file, the row and the column.

Rows are numbered as in the file: the header is line 1, the first data row line 2.
Formulas are parsed by the `petab` library's PEtab math grammar
(`petab.v1.math.sympify_petab`), plain arithmetic without it (`.arithmetic`), and
re-expressed in this package's symbols.
"""

import math
import os

import numpy as np
import pandas as pd
import sympy

from .arithmetic import arithmetic
from .errors import PetabError
from .sbml import TIME, symbol

__all__ = ["Table", "read_table", "parse_formula", "number"]


class Table:
    """One TSV table: its rows as dicts of strings, and where each came from."""

    def __init__(self, path, df, lines=None):
        self.path = path
        self.df = df
        self.columns = list(df.columns)
        # the file's line of each row: a table derived from another (PEtab v1's wide
        # condition table in long form) keeps pointing at the rows it came from
        self.lines = list(range(2, len(df) + 2)) if lines is None else list(lines)
        self._records = None  # (the frame, its rows as dicts): see `rows`

    def rows(self):
        """``(line, row)`` pairs: the file's line number and the row as a dict of str (read
        once per table: a measurement table of 27,000 rows is walked ten times on load)."""
        if self._records is None or self._records[0] is not self.df:
            cols = list(self.df.columns)
            self._records = self.df, [dict(zip(cols, r)) for r in self.df.to_numpy(object)]
        yield from zip(self.lines, self._records[1])

    def where(self, line, column):
        return f"{self.path}, line {line}, column {column!r}"

    def require(self, line, row, column):
        """The non-empty value of `column` in `row`, else an error naming it."""
        v = row.get(column, "")
        if v == "":
            raise PetabError(f"{self.where(line, column)}: a value is required here")
        return v

    def __len__(self):
        return len(self.df)


def read_table(path, required, what):
    """Read a PEtab TSV; `required` columns must be there. Missing file: a `PetabError`."""
    if not os.path.isfile(path):
        raise PetabError(f"the {what} table {path} does not exist (named in problem.yaml)")
    try:
        df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    except Exception as e:  # pandas' parser errors carry the line
        raise PetabError(f"{path}: cannot read the {what} table: {e}") from None
    df.columns = [c.strip() for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise PetabError(f"{path}: the {what} table has no column {missing[0]!r} (columns: "
                         f"{', '.join(df.columns)})")
    df = df.apply(lambda c: c.str.strip())
    return Table(path, df)


def number(table, line, column, text):
    """`text` as a float (inf/-inf allowed), else an error naming the cell."""
    try:
        v = float(text)
    except ValueError:
        raise PetabError(f"{table.where(line, column)}: expected a number, got {text!r}") \
            from None
    if math.isnan(v):
        raise PetabError(f"{table.where(line, column)}: expected a number, got {text!r}")
    return v


def parse_formula(table, line, column, text):
    """A PEtab math formula as a sympy expression in this package's symbols."""
    if text == "":
        raise PetabError(f"{table.where(line, column)}: a formula is required here")
    e = arithmetic(text)
    if e is None:
        from petab.v1.math import sympify_petab

        try:
            e = sympify_petab(text)
        except Exception as err:
            raise PetabError(
                f"{table.where(line, column)}: cannot parse {text!r}: {err}") from None
    e = sympy.sympify(e)
    if isinstance(e, (bool, np.bool_)):
        return sympy.true if e else sympy.false
    return e.xreplace({s: (TIME if s.name == "time" else symbol(s.name))
                       for s in e.free_symbols})
