"""The example notebooks: each is up to date with its source, runs in quick mode, has its plots.

Every ``examples/*.ipynb`` is found by itself, and so is every percent-format
source (``examples/*.py`` with ``# %%`` cells, see ``examples/_notebooks.py``).
A notebook runs in a fresh kernel of this interpreter (nbclient, kernel
``python3``, working directory ``examples/``) with ``SCIML_QUICK=1``, which
the notebooks read to shrink their fits, and ``SCIML_OUTPUT`` pointing at a
temporary folder, so that the committed full-mode plots in
``examples/output/`` are left alone.
"""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from examples import _notebooks  # noqa: E402

pytestmark = pytest.mark.heavy  # see `heavy` in pyproject.toml

EXAMPLES = Path(_notebooks.__file__).resolve().parent
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
SOURCES = _notebooks.sources(EXAMPLES)
# Generous: a cell that compiles a model with a cold numba cache takes tens of seconds.
CELL_TIMEOUT_S = 600


def _ids(paths):
    return [p.stem for p in paths]


def test_notebooks_found():
    assert SOURCES, "no percent-format sources in examples/"


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_source_has_notebook(source):
    nb = _notebooks.notebook_path(source)
    assert nb.exists(), (f"{source.name} has no notebook; run python -m examples._notebooks "
                         f"{source.stem}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_up_to_date(path):
    source = path.with_suffix(".py")
    assert source.exists() and _notebooks.is_source(source), (
        f"{path.name} has no percent-format source {source.name} (notebooks are generated "
        "from one, see examples/_notebooks.py)")
    why = _notebooks.stale(source)
    assert why is None, f"{why}; run python -m examples._notebooks {source.stem}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_full_mode_plots_committed(path):
    pngs = sorted((EXAMPLES / "output").glob(f"{path.stem}*.png"))
    assert pngs, (f"no examples/output/{path.stem}*.png: run the notebook in full mode "
                  f"(python -m examples.{path.stem}) and commit its plots")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_quick(path, tmp_path, monkeypatch):
    # The kernel inherits this process's environment.
    monkeypatch.setenv("SCIML_QUICK", "1")
    monkeypatch.setenv("SCIML_OUTPUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(EXAMPLES)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name} failed in quick mode:\n{e}")
    assert list(tmp_path.glob(f"{path.stem}*.png")), (
        f"{path.name} wrote no {path.stem}*.png into $SCIML_OUTPUT")
    shown = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", ())
                if "image/png" in o.get("data", {}))
    assert shown, f"{path.name} displayed no plot"
