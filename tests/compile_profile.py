"""Where a cold test run spends its time: a pytest plugin and its report.

numba reports each compile as a ``numba:compile`` event; the plugin records, per test,
its wall time and the compile time of every function it compiled (exclusive of the
functions compiled inside it), one JSON line per test, in a file per worker::

    NUMBA_CACHE_DIR=$(mktemp -d) COMPILE_PROFILE=/tmp/cp \\
        python -m pytest -n 2 -p tests.compile_profile
    python -m tests.compile_profile /tmp/cp

The report lists the files, the tests and the compiled functions (with the outer
type of their first argument: an engine loop compiles once per system type) that
took longest.
"""

import collections
import json
import os
import re
import sys
import time
from pathlib import Path

from numba.core import event

_MIN = 0.05  # compiles shorter than this (seconds) are summed, not listed


class _Listener(event.Listener):
    def __init__(self):
        self.stack = []
        self.events = []

    def on_start(self, ev):
        d = ev.data["dispatcher"]
        name = f"{d.py_func.__module__}.{d.py_func.__qualname__}"
        self.stack.append([name, str(ev.data.get("args"))[:300], time.perf_counter(), 0.0])

    def on_end(self, ev):
        name, sig, t0, inner = self.stack.pop()
        dt = time.perf_counter() - t0
        self.events.append((name, sig, dt - inner))
        if self.stack:
            self.stack[-1][3] += dt


_STATE = {}


def pytest_configure(config):
    folder = Path(os.environ.get("COMPILE_PROFILE", "compile_profile"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    listener = _Listener()
    event.register("numba:compile", listener)
    _STATE.update(listener=listener, out=open(folder / f"{worker}-{os.getpid()}.jsonl", "a"))


def pytest_runtest_protocol(item, nextitem):
    listener = _STATE["listener"]
    listener.events = []
    _STATE["t0"] = time.perf_counter()


def pytest_runtest_logfinish(nodeid, location):
    if "t0" not in _STATE:  # xdist's controller: it reports the workers' tests, runs none
        return
    listener, out = _STATE["listener"], _STATE["out"]
    ev = listener.events
    out.write(json.dumps({"id": nodeid, "wall": time.perf_counter() - _STATE["t0"],
                          "compile": sum(e[2] for e in ev),
                          "events": [e for e in ev if e[2] >= _MIN]}) + "\n")
    out.flush()


def pytest_unconfigure(config):
    if "out" in _STATE:
        _STATE.pop("out").close()


def _outer(sig):
    """The first argument's type constructors, outermost first (e.g. Quad, Adjoint)."""
    return ".".join(re.findall(r"[A-Z][A-Za-z]+(?=\()", sig)[:3]) or "-"


def report(folder, top=25):
    rows = [json.loads(line) for f in sorted(Path(folder).glob("*.jsonl")) for line in open(f)]
    wall = sum(r["wall"] for r in rows)
    print(f"{len(rows)} tests, {wall:.0f} worker-seconds, "
          f"{sum(r['compile'] for r in rows):.0f} of them compiling")
    by_test = collections.Counter()
    by_file = collections.Counter()
    by_fn = collections.Counter()
    for r in rows:
        by_test[r["id"].split("[")[0]] += r["wall"]
        by_file[r["id"].split("::")[0]] += r["wall"]
        for name, sig, dt in r["events"]:
            by_fn[f"{name.rsplit('.', 1)[-1]} [{_outer(sig)}]"] += dt
    for title, counts in (("files", by_file), ("tests (parameters summed)", by_test),
                          ("compiled functions", by_fn)):
        print(f"\n== {title}")
        for key, seconds in counts.most_common(top):
            print(f"{seconds:8.1f}  {key}")


if __name__ == "__main__":
    report(sys.argv[1] if len(sys.argv) > 1 else "compile_profile")
