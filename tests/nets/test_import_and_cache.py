"""Process-level behaviour: import cost (no JAX) and numba's on-disk cache."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_python(code):
    """Run `code` in a fresh interpreter with this process' environment; return its JSON."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_nets_does_not_import_jax_or_sciml():
    loaded = run_python(
        "import json, sys\n"
        "import nets\n"
        "def heavy():\n"
        "    return sorted(m for m in sys.modules\n"
        "                  if m.split('.')[0] in ('jax', 'jaxlib', 'sciml', 'adjoints'))\n"
        "first = heavy()\n"
        "import nets.jax\n"
        "print(json.dumps([first, heavy()]))\n")
    assert loaded == [[], []]  # nets.jax imports jax only when used


# The work the child repeats; the parent runs it first so the cache is warm.
CACHE_WORK = """
import numpy as np
import nets
from nets import Chain, Dense
chain = Chain(3, Dense(8, "tanh"), Dense(2))
p = chain.init_params(seed=0)
X = np.linspace(-1, 1, 300 * 3).reshape(300, 3)
value, grad = nets.loss_and_grad(chain, p, X, np.zeros((300, 2)))
y = chain(X, p)
"""


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_fresh_process_loads_kernels_from_disk_cache():
    exec(compile(CACHE_WORK, "<cache-work>", "exec"), {})
    stats = run_python(CACHE_WORK + """
import json
from nets import activations, kernels
names = ["forward", "loss_grad", "penalty"]
stats = {n: [sum(getattr(kernels, n).stats.cache_hits.values()),
             sum(getattr(kernels, n).stats.cache_misses.values())] for n in names}
# the C functions (row kernels, the rows kernel): compiled or loaded once, when made
cfuncs = {**{f"row {code} {dtype}": f for (code, dtype), f in activations._rows.items()},
          **{f"rows_kernel {dtype}": f for dtype, f in kernels._rows_kernels.items()}}
stats.update({n: [f.cache_hits, 1 - f.cache_hits] for n, f in cfuncs.items()})
print(json.dumps(stats))
""")
    assert len(stats) == 6  # tanh's and identity's row kernels, the rows kernel
    for name, (hits, misses) in stats.items():
        assert misses == 0, f"{name} was compiled, not loaded from the cache: {stats}"
        assert hits >= 1, f"{name} was not loaded from the cache: {stats}"


def _group_locators(name):
    return [c for c in numba.core.caching.CacheImpl._locator_classes
            if getattr(c, "_group", None) == name]


def _nets_imports(module, seen=None):
    """The nets modules `module` imports, itself included, followed through relative imports."""
    import ast

    from nets import _cache

    seen = set() if seen is None else seen
    if module in seen:
        return seen
    seen.add(module)
    tree = ast.parse((_cache.ROOT / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            for m in names:
                if (_cache.ROOT / f"{m}.py").exists():
                    _nets_imports(m, seen)
    return seen


def test_nets_kernels_are_stamped_with_all_nets_sources():
    from nets import _cache, kernels

    locator = kernels.forward._cache._impl._locator
    assert getattr(type(locator), "_group", None) == "Nets"
    assert locator.get_source_stamp()[1] == _cache.fingerprint()
    # the fingerprint covers every nets file the kernels are compiled from
    assert {f"{m}.py" for m in _nets_imports("kernels")} | {"_cache.py"} <= set(_cache.SOURCES)
    assert _cache.fingerprint() == _cache.fingerprint_of(_cache.ROOT / n for n in _cache.SOURCES)
    # installed once per process (numba's list of locators does not grow)
    ours = _group_locators("Nets")
    assert len(ours) == 3
    _cache.install()
    assert _group_locators("Nets") == ours
    # files elsewhere keep numba's own locators
    assert all(c.from_function(run_python, __file__) is None for c in ours)


GROUP_WORK = """
import json, sys
from pathlib import Path
src, other = Path(sys.argv[1]), Path(sys.argv[2])
sys.path[:0] = [str(src), str(other)]
from nets import _cache
_cache.install_group("Probe", [src], lambda: (src / "stamp.txt").read_text())
import grouped, plain
out = []
for mod in (grouped, plain):
    mod.f(1.0)
    out.append([sum(mod.f.stats.cache_hits.values()), sum(mod.f.stats.cache_misses.values()),
                getattr(type(mod.f._cache._impl._locator), "_group", None)])
print(json.dumps(out))
"""

KERNEL_FILE = "from numba import njit\n\n\n@njit(cache=True)\ndef f(x):\n    return x + 1.0\n"


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_install_group_stamps_a_group_of_folders(tmp_path):
    # a group's stamp is its `stamp()`: a change recompiles the group's functions only
    src, other = tmp_path / "src", tmp_path / "other"
    src.mkdir(), other.mkdir()
    (src / "grouped.py").write_text(KERNEL_FILE)
    (other / "plain.py").write_text(KERNEL_FILE)
    (src / "stamp.txt").write_text("a")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))

    def run():
        out = subprocess.run([sys.executable, "-c", GROUP_WORK, str(src), str(other)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run() == [[0, 1, "Probe"], [0, 1, None]]  # compiled; `plain` keeps numba's locator
    assert run() == [[1, 0, "Probe"], [1, 0, None]]  # loaded
    (src / "stamp.txt").write_text("b")
    assert run() == [[0, 1, "Probe"], [1, 0, None]]  # the group recompiles, nothing else


# float64 tanh reads and writes float bits through _bits.py (a small kernel: the whole
# activation table would cost ~15 s per compile here)
STALE_WORK = """
import json
from nets import activations
activations.tanh(0.3)
d = activations.tanh
print(json.dumps([sum(d.stats.cache_hits.values()), sum(d.stats.cache_misses.values())]))
"""


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_an_edit_to_an_inlined_nets_source_recompiles(tmp_path):
    # numba alone stamps a cached function with its own file: an edit to _bits.py (inlined
    # into activations.py's kernels) would load stale machine code. A copy of nets, its
    # own cache folder, three fresh processes.
    import shutil

    import nets

    pkg = tmp_path / "src" / "nets"
    shutil.copytree(Path(nets.__file__).parent, pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "src"),
               NUMBA_CACHE_DIR=str(tmp_path / "numba"))

    def run():
        out = subprocess.run([sys.executable, "-c", STALE_WORK], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run() == [0, 1]  # compiled
    assert run() == [1, 0]  # loaded
    with open(pkg / "_bits.py", "a") as f:
        f.write("\n# an edit\n")
    assert run() == [0, 1]  # compiled again, not the stale copy


STRUCT_FILE = """from typing import NamedTuple

from numba import njit


class {name}(NamedTuple):
    x: float


@njit(cache=True)
def f(s):
    return s.x + 1.0
"""

STRUCT_WORK = """
import json, sys
from pathlib import Path
src = Path(sys.argv[1])
sys.path[:0] = [str(src)]
from nets import _cache
_cache.install_group("Probe", [src], lambda: (src / "stamp.txt").read_text())
import grouped
grouped.f(grouped.__dict__[sys.argv[2]](1.0))
folders = sorted(p.name for p in Path(sys.argv[3]).rglob("g*") if p.is_dir()
                 and "src" in p.parent.name)
print(json.dumps([sum(grouped.f.stats.cache_hits.values()),
                  sum(grouped.f.stats.cache_misses.values()), folders]))
"""


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the jit")
def test_a_renamed_struct_in_new_sources_is_a_cache_miss_not_an_error(tmp_path):
    # numba unpickles a function's whole cache index (its argument types included) before
    # comparing stamps: an index written before a struct class was renamed would raise
    # AttributeError. Each fingerprint has its own folder; the old one is removed.
    src, cache = tmp_path / "src", tmp_path / "numba"
    src.mkdir()
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))

    def run(name, stamp):
        (src / "grouped.py").write_text(STRUCT_FILE.format(name=name))
        (src / "stamp.txt").write_text(stamp)
        out = subprocess.run([sys.executable, "-c", STRUCT_WORK, str(src), name, str(cache)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    old, new = "0123456789abcdef", "fedcba9876543210"
    assert run("Point", old) == [0, 1, [f"g{old}"]]  # compiled
    assert run("Point", old) == [1, 0, [f"g{old}"]]  # loaded
    assert run("Spot", new) == [0, 1, [f"g{new}"]]  # compiled; the stale folder is gone
