"""Build the example notebooks (``examples/*.ipynb``) from their percent-format sources.

Each notebook has one source of truth, a Python file that also runs as a
script: ``examples/NAME.py`` -> ``examples/NAME.ipynb``. Cells are separated
by lines that start with ``# %%``:

- ``# %%`` (optionally followed by a title) starts a code cell;
- ``# %% [markdown]`` (or ``[md]``) starts a markdown cell, whose lines are
  comments: ``# text`` becomes ``text`` and a bare ``#`` an empty line.

Anything before the first marker becomes a code cell of its own. Blank
lines at either end of a cell are dropped, and so are empty cells. A file is a
notebook source when it has at least one ``# %%`` line.

The notebooks are written without outputs and with deterministic cell ids,
so regenerating an unchanged source leaves the ``.ipynb`` byte for byte the
same. ``tests/test_notebooks.py`` checks that every notebook matches its
source and runs it in quick mode (``SCIML_QUICK=1``).

Usage::

    python -m examples._notebooks            # regenerate every notebook
    python -m examples._notebooks NAME ...   # only these (NAME or NAME.py)
    python -m examples._notebooks --check    # exit 1 if any notebook is stale
"""

import argparse
import re
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
_MARKER = re.compile(r"^# %%(?P<rest>.*)$")
_MARKDOWN = re.compile(r"^\s*\[(markdown|md)\]")

__all__ = ["parse", "build", "sources", "is_source", "notebook_path", "write", "stale"]


def is_source(path):
    """True when the file at ``path`` has a ``# %%`` cell marker."""
    with open(path, encoding="utf-8") as f:
        return any(_MARKER.match(line) for line in f)


def sources(folder=EXAMPLES):
    """The notebook sources in ``folder``: ``*.py`` files with cell markers, sorted by name."""
    return sorted(p for p in Path(folder).glob("*.py")
                  if not p.name.startswith("_") and is_source(p))


def notebook_path(source):
    """``examples/NAME.py`` -> ``examples/NAME.ipynb``."""
    return Path(source).with_suffix(".ipynb")


def parse(text, name="<source>"):
    """Split percent-format ``text`` into cells.

    Returns
    -------
    list of (kind, source)
        ``kind`` is ``"code"`` or ``"markdown"``; ``source`` has no blank
        lines at either end.

    Raises
    ------
    ValueError
        A line of a markdown cell that is not a comment (naming the line).
    """
    cells = []
    kind, lines, start = "code", [], 1
    for n, line in enumerate(text.splitlines(), 1):
        m = _MARKER.match(line)
        if m:
            cells.append((kind, lines, start))
            kind = "markdown" if _MARKDOWN.match(m.group("rest")) else "code"
            lines, start = [], n + 1
            continue
        if kind == "markdown":
            if line.startswith("# "):
                line = line[2:]
            elif line.rstrip() == "#":
                line = ""
            elif line.strip():
                raise ValueError(f"{name}, line {n}: a markdown cell holds comment lines "
                                 f"('# text'), got {line!r}; start a code cell with '# %%'")
            else:
                line = ""
        lines.append(line.rstrip())
    cells.append((kind, lines, start))
    out = []
    for kind, lines, _ in cells:
        while lines and not lines[0].strip():
            lines = lines[1:]
        while lines and not lines[-1].strip():
            lines = lines[:-1]
        if lines:  # an empty cell (nothing before the first marker, say) is left out
            out.append((kind, "\n".join(lines)))
    return out


def build(source):
    """The notebook (an `nbformat.NotebookNode`) for the percent-format file ``source``."""
    import nbformat
    from nbformat import v4

    source = Path(source)
    cells = []
    for i, (kind, text) in enumerate(parse(source.read_text(encoding="utf-8"), str(source))):
        make = v4.new_markdown_cell if kind == "markdown" else v4.new_code_cell
        # Ids from the position: the file does not change when the source does not.
        cells.append(make(text, id=f"{source.stem}-{i:02d}"[-64:]))
    nb = v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "source": f"generated from {source.name} by `python -m examples._notebooks`; "
                  "edit the .py file, not this notebook",
    })
    nbformat.validate(nb)
    return nb


def _cells(nb):
    return [(c["cell_type"], c["source"] if isinstance(c["source"], str)
             else "".join(c["source"])) for c in nb["cells"]]


def stale(source):
    """Why the notebook of ``source`` is out of date with it, or None when it is up to date.

    Only the cells' kinds and sources are compared: a notebook saved from
    Jupyter with outputs is still up to date.
    """
    import nbformat

    path = notebook_path(source)
    if not path.exists():
        return f"{path.name} does not exist"
    have = _cells(nbformat.read(path, as_version=4))
    want = _cells(build(source))
    if len(have) != len(want):
        return f"{path.name} has {len(have)} cells, {Path(source).name} gives {len(want)}"
    for i, (h, w) in enumerate(zip(have, want)):
        if h != w:
            return f"{path.name}: cell {i} differs from {Path(source).name} ({w[1][:60]!r}...)"
    return None


def write(source):
    """(Re)write the notebook of ``source``; returns its path."""
    import nbformat

    path = notebook_path(source)
    nbformat.write(build(source), path)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebook sources (NAME or NAME.py); default all")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a notebook is missing or out of date")
    args = ap.parse_args(argv)
    if args.names:
        srcs = []
        for n in args.names:
            p = EXAMPLES / (n if n.endswith(".py") else n + ".py")
            if not p.exists() or not is_source(p):
                ap.error(f"{n}: no percent-format source {p.relative_to(EXAMPLES.parent)} "
                         "(a .py file with '# %%' cell markers)")
            srcs.append(p)
    else:
        srcs = sources()
    bad = 0
    for s in srcs:
        if args.check:
            why = stale(s)
            if why:
                bad += 1
                print(f"stale: {why} (run python -m examples._notebooks {s.stem})")
        else:
            print(f"wrote {write(s).relative_to(EXAMPLES.parent)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
