"""Shared helpers for the benchmark scripts (see ../shared/BENCHMARKS.md).

Every benchmark runs our implementation and each installed peer in one
process, alternating them round by round after a warm-up, prints one table
and optionally writes the same numbers as JSON::

    {"bench": NAME, "machine": {"cpus", "threads", "cpu"},
     "results": [{"impl", "unit", "median_s", "min_s", "max_s",
                  "first_call_s", "quality": {...}}, ...],
     "ratios": {"peer/ours": median_peer / median_ours, ...}}

A row whose implementation could not run carries ``"error"`` (``"not
installed"`` for a missing peer) and nulls for the timings.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NOT_INSTALLED = "not installed"


# --------------------------------------------------------------------------- setup


def dense_init(sizes: Sequence[int], seed: int) -> np.ndarray:
    """Float64 parameters drawn as ``nets.Chain.init_params(seed)`` draws them for a chain
    of Dense layers of these `sizes` (input first), in its flat layout.

    PyTorch's default for Linear: per layer, from one ``default_rng(seed)``, the weight
    (out, in) row-major and then the bias (out,), each uniform in +-1/sqrt(in). For the
    peers when ``nets`` cannot give its own, and to check that it gave these.
    """
    rng = np.random.default_rng(seed)
    parts = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        bound = 1.0 / np.sqrt(fan_in)
        parts += [rng.uniform(-bound, bound, size=(fan_out, fan_in)).ravel(),
                  rng.uniform(-bound, bound, size=fan_out)]
    return np.concatenate(parts)


def dense_forward(p, sizes: Sequence[int], h, act, xp=np):
    """A Dense chain of these `sizes` on ``h`` (batch, in) with the flat parameters ``p`` in
    nets' layout (per layer W (out, in) row-major, then b): ``act`` after every layer but
    the last. ``xp`` is numpy or jax.numpy, for the peers' right-hand sides."""
    k = 0
    last = len(sizes) - 2
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        W = xp.reshape(p[k:k + fan_in * fan_out], (fan_out, fan_in))
        k += fan_in * fan_out
        h = h @ W.T + p[k:k + fan_out]
        k += fan_out
        if i < last:
            h = act(h)
    return h


def make_parser(description: str, avx2: bool = False) -> argparse.ArgumentParser:
    """Return an argument parser with the options every benchmark shares.

    Parameters
    ----------
    description : str
        Text shown by ``--help``.
    avx2 : bool
        Also ``--avx2``: the benchmark run again with AVX2 code only (`rerun_as_avx2`).

    Returns
    -------
    argparse.ArgumentParser
        Parser with ``--quick``, ``--json PATH`` and ``--threads N``; a script
        adds its own options before calling ``parse_args``.
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small problem, few rounds (smoke test)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument(
        "--threads",
        type=int,
        default=available_cpus(),
        help="threads for every implementation (default: all available cores)",
    )
    if avx2:
        p.add_argument("--avx2", action="store_true",
                       help="on an AVX-512 machine: run AVX2 code only, as an AVX2 machine "
                            "would (every implementation)")
    return p


# On an AVX-512 machine, the environment of `avx2_environment` (set by a benchmark's --avx2)
AVX2_ONLY = os.environ.get("BENCH_AVX2_ONLY") == "1"


def avx2_environment() -> dict[str, str]:
    """Environment variables under which this machine runs the code an AVX2 machine
    would: numba targets its features less AVX-512 (a Zen 4 as its AVX2 predecessor,
    Zen 3), XLA keeps to AVX2, so do PyTorch's kernels, oneDNN and MKL under it, and
    OpenBLAS (the BLAS roof). An AVX-512 machine's stand-in for that class: on a Zen 4
    (2026-12-07) `matrix_exp` gave nets 2.66x jax-fori with it, where a Zen 3 gave
    2.62-2.70x."""
    import llvmlite.binding as ll

    features = ll.get_host_cpu_features()
    flags = [f"+{name}" for name, on in features.items() if on and not name.startswith("avx512")]
    flags += [f"-{name}" for name in features if name.startswith("avx512")]
    cpu = ll.get_host_cpu_name()
    return {"NUMBA_CPU_NAME": {"znver4": "znver3"}.get(cpu, cpu),
            "NUMBA_CPU_FEATURES": ",".join(flags),
            "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX2").strip(),
            # PyTorch's own kernels, and the libraries that dispatch apart from them: its
            # convolutions (oneDNN) and matrix products (MKL) used AVX-512 without these
            "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OPENBLAS_CORETYPE": "Haswell",
            "BENCH_AVX2_ONLY": "1"}


def rerun_as_avx2(module: str, argv: Sequence[str] | None) -> int:
    """Run benchmark ``module`` again in a process of `avx2_environment`, with ``argv``
    less ``--avx2``; its exit status."""
    import subprocess

    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--avx2"]
    env = dict(os.environ, **avx2_environment())
    return subprocess.call([sys.executable, "-m", module, *argv], env=env)


def available_cpus() -> int:
    """Number of cores this process may run on (respects taskset / cgroups affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpuinfo(field_name: str) -> str | None:
    """The value of `field_name` in /proc/cpuinfo (its first processor): "" if the field
    is absent, None where there is no such file."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == field_name:
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return ""


def machine_info(threads: int) -> dict[str, Any]:
    """Describe the machine as the JSON ``machine`` field.

    Parameters
    ----------
    threads : int
        Threads the benchmark gave each implementation.

    Returns
    -------
    dict
        ``{"cpus": int, "threads": int, "cpu": str}``; ``cpu`` is the model
        name from ``/proc/cpuinfo`` (or ``platform.processor()`` elsewhere).
    """
    cpu = _cpuinfo("model name")
    if cpu is None:
        import platform

        cpu = platform.processor()
    if AVX2_ONLY:
        cpu += " (AVX2 code only: --avx2)"
    return {"cpus": available_cpus(), "threads": int(threads), "cpu": cpu}


_CHAIN = None


def core_ghz(seconds: float = 0.1) -> float | None:
    """This core's clock in GHz, measured: a chain of dependent shifts and additions, each
    one cycle on every x86 core this project runs on, timed (best of five). A VM's
    /proc/cpuinfo gives its nominal clock, and the cores boost above it (a Zen 4 VM:
    2.60 GHz nominal, 3.64 measured). None without numba."""
    global _CHAIN
    if _CHAIN is None:
        try:
            import numba
        except ImportError:
            return None

        @numba.njit(cache=False)
        def chain(n, x):
            for _ in range(n):
                x = x + (x >> 60)  # shift then add: two cycles a step
            return x

        chain(10, 1)
        _CHAIN = chain
    n = 1 << 20
    while _timed(_CHAIN, n, 1) < seconds / 4 and n < 1 << 36:  # steps for `seconds`
        n *= 4
    best = min(_timed(_CHAIN, n, 1) for _ in range(5))
    return 2 * n / best / 1e9


def _timed(f: Callable[..., Any], *args: Any) -> float:
    t0 = time.perf_counter()
    f(*args)
    return time.perf_counter() - t0


def float32_peak(threads: int, features: str | None = None, vendor: str | None = None,
                 mhz: float | None = None) -> dict[str, Any]:
    """The float32 FMA peak a floor analysis divides by, for this machine class.

    Two FMA pipes a core (a multiply and an add pipe without FMA) on every class this
    project runs on (Zen 3, Zen 4, Xeon Scalable Gold/Platinum), each as wide as the
    widest vector the core executes at full rate: 512 bits on an Intel core with
    AVX-512, 256 bits on AMD's (Zen 4 runs a 512-bit FMA as two 256-bit halves) and on
    AVX2 machines. nets' register tiles (`nets.tiles`) use the widest vectors the target
    has; loops LLVM vectorises itself (pooling, activations) stay at 256 bits there.

    The clock is the one measured (`core_ghz`), else ``cpu MHz`` of ``/proc/cpuinfo``
    (a VM reports its nominal clock there; both are in the result). `features`,
    `vendor` default to this machine's; a given `mhz` is used as it is.

    Returns
    -------
    dict
        ``isa``, ``vendor``, ``ghz`` (the clock used), ``clock`` ("measured",
        "nominal" or "given"), ``nominal_ghz``, ``fma_bits`` and ``peak_gflops`` (the
        machine on `threads` cores).
    """
    if features is None:  # what numba compiles for (``--avx2``: AVX-512 taken away)
        features = os.environ.get("NUMBA_CPU_FEATURES")
    if features is None:
        try:
            import llvmlite.binding as ll

            features = ll.get_host_cpu_features().flatten()
        except Exception:
            features = ""
    flags = set(features.split(","))
    vendor = (_cpuinfo("vendor_id") or "") if vendor is None else vendor
    try:
        nominal = float(_cpuinfo("cpu MHz") or "nan") / 1000
    except ValueError:
        nominal = float("nan")
    if mhz is not None:
        ghz, clock = mhz / 1000, "given"
    else:
        measured = core_ghz()
        ghz, clock = (measured, "measured") if measured else (nominal, "nominal")
    avx512, avx2 = "+avx512f" in flags, "+avx2" in flags and "+fma" in flags
    isa = "AVX-512" if avx512 else "AVX2+FMA" if avx2 else "SSE"
    fma_bits = 512 if avx512 and vendor == "GenuineIntel" else 256 if (avx512 or avx2) else 128
    per_op = 2 if (avx512 or avx2) else 1  # an FMA is two flops; without, a pipe does one
    peak = 2 * (fma_bits // 32) * per_op * ghz * threads  # 2 pipes x lanes x flops
    return {"isa": isa, "vendor": vendor, "ghz": ghz, "clock": clock, "nominal_ghz": nominal,
            "fma_bits": fma_bits, "peak_gflops": peak}


def blas_roof(threads: int, n: int = 256, seconds: float = 0.5) -> dict[str, float]:
    """What a tuned BLAS reaches on these cores: float32 ``n x n`` matrix products
    (numpy's OpenBLAS, one BLAS thread each), on one thread alone, then on `threads`
    Python threads at once (numpy releases the GIL), in GFLOP/s, best of a few rounds.

    The nominal `float32_peak` counts every vCPU as a core. Two vCPUs that a VM's host
    runs as one core's hyperthreads share its FMA pipes, and hosts move vCPUs: on the
    2-core AMD EPYC Zen 3 VM of 2026-12-07, 90 GFLOP/s on one thread and 96 on two at
    02:30 and 03:15 UTC, 177 on two at 03:00. Only a measurement shows which, so a
    benchmark takes it before and after its timing.

    Returns
    -------
    dict
        ``one`` and ``all`` (GFLOP/s), ``n``.
    """
    import threading

    import numpy as np
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a, b = (rng.random((n, n), dtype=np.float32) for _ in range(2))
    flop = 2.0 * n ** 3

    def products(count):
        for _ in range(count):
            a @ b

    def rate(k):
        best = 0.0
        for _ in range(3):
            count = max(1, int(seconds / 3 * 40e9 / flop))  # ~seconds/3 at 40 GFLOP/s
            workers = [threading.Thread(target=products, args=(count,)) for _ in range(k)]
            t = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            best = max(best, k * count * flop / (time.perf_counter() - t) / 1e9)
        return best

    with threadpool_limits(1):
        products(4)
        return {"one": rate(1), "all": rate(max(1, threads)), "n": n}


def roof_note(before: dict[str, float], after: dict[str, float], threads: int) -> str:
    """One line: `blas_roof` before and after a timing."""
    return (f"BLAS roof (OpenBLAS float32 {before['n']}^3 products, one BLAS thread each), "
            f"before / after the timing: {before['one']:.0f} / {after['one']:.0f} GFLOP/s on "
            f"1 thread, {before['all']:.0f} / {after['all']:.0f} on {threads} at once")


def time_measured(impls: list[Impl], rounds: int, threads: int,
                  machine: dict[str, Any]) -> str:
    """`time_alternating` with what the machine gave meanwhile: other processes' load
    (`OtherLoad`) and the BLAS roof before and after (`blas_roof`, into ``machine``).
    Returns the lines to print after the table."""
    before = blas_roof(threads)
    mon = OtherLoad().start()
    time_alternating(impls, rounds)
    load = OtherLoad.note(mon.stop(), "during the timing")
    after = blas_roof(threads)
    machine["blas_roof"] = {"before": before, "after": after}
    return f"{load}\n{roof_note(before, after, threads)}"


def peak_note(peak: dict[str, Any], threads: int) -> str:
    """One line: the instruction set found and the peak `float32_peak` assumes."""
    return (f"float32 peak: {peak['isa']} ({peak['vendor'] or 'unknown vendor'}), 2 FMA pipes x "
            f"{peak['fma_bits']} bits x {peak['ghz']:.2f} GHz ({_clock_words(peak)}) x "
            f"{threads} cores = {peak['peak_gflops']:.0f} GFLOP/s")


def _clock_words(peak: dict[str, Any]) -> str:
    if peak["clock"] == "measured":
        return f"measured; {peak['nominal_ghz']:.2f} nominal"
    return peak["clock"]


def _cpu_seconds() -> tuple[float, float, float]:
    """(wall time, busy CPU seconds of the whole machine, CPU seconds of this process)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    busy = (sum(v[:8]) - v[3] - v[4]) / hz  # all but idle and iowait; guest is inside user
    t = os.times()
    return time.perf_counter(), busy, t.user + t.system


class OtherLoad:
    """How many cores other processes kept busy between ``start()`` and ``stop()``.

    Threaded peers (OpenMP spin barriers) slow down 10-100x when another
    process takes one of 2 cores, so every run says how quiet the machine
    was: machine-wide busy time (/proc/stat) minus this process's own.
    """

    def start(self) -> OtherLoad:
        try:
            self._t0 = _cpu_seconds()
        except (OSError, ValueError):  # no /proc: not Linux
            self._t0 = None
        return self

    def stop(self) -> float | None:
        """Average number of cores other processes used; None where unknown."""
        if self._t0 is None:
            return None
        (w0, b0, o0), (w1, b1, o1) = self._t0, _cpu_seconds()
        return max(0.0, ((b1 - b0) - (o1 - o0)) / max(w1 - w0, 1e-9))

    @staticmethod
    def note(cores: float | None, when: str) -> str:
        """Text for the report, with a warning above a third of a core."""
        if cores is None:
            return f"load of other processes {when}: unknown"
        txt = f"other processes used {cores:.2f} cores {when}"
        return txt + (" [WARNING: machine busy, timings unreliable]" if cores > 0.3 else "")


def busy_note(window_s: float = 0.5) -> str:
    """Load of other processes over a short window now (for the header)."""
    mon = OtherLoad().start()
    time.sleep(window_s)
    return OtherLoad.note(mon.stop(), "at start")


def optional_import(name: str) -> tuple[Any, str | None]:
    """Import a peer library, telling "not installed" apart from "broken".

    Parameters
    ----------
    name : str
        Module name.

    Returns
    -------
    module, error : (module or None, str or None)
        ``error`` is ``"not installed"`` when the module itself is missing,
        ``"error: ..."`` when it exists but fails to import (a real problem
        that must show in the table, not be mistaken for an absent peer).
    """
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as e:
        if e.name is not None and (e.name == name or name.startswith(e.name + ".")):
            return None, NOT_INSTALLED
        return None, error_text(e)
    except Exception as e:  # any import-time failure is reported in the row
        return None, error_text(e)


def error_text(e: BaseException) -> str:
    """One-line description of an exception for a table row."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"error: {type(e).__name__}: {msg}"[:200]


# --------------------------------------------------------------------------- timing


@dataclass
class Impl:
    """One implementation under test.

    Parameters
    ----------
    name : str
        Row label, e.g. ``"nets"``, ``"torch"``, ``"jax-fori"``.
    run : callable, optional
        One timed round of work; ``units`` units of work per call.
    units : int
        Units of work (iterations, steps, gradients) done by one ``run()``.
    warmup : callable, optional
        First call (compilation, cache load, one small unit of work); timed
        separately as ``first_call_s`` and not counted in the statistics.
    setup : callable, optional
        Untimed preparation before every ``run()`` (e.g. a fresh copy of the
        initial parameters, so that every round does the same work).
    error : str, optional
        Set when the implementation cannot run (``"not installed"``,
        ``"error: ..."``); such a row is reported, never timed.
    """

    name: str
    run: Callable[[], Any] | None = None
    units: int = 1
    warmup: Callable[[], Any] | None = None
    setup: Callable[[], Any] | None = None
    error: str | None = None
    first_call_s: float | None = None
    times: list[float] = field(default_factory=list)


def _call(impl: Impl, fn: Callable[[], Any]) -> float | None:
    """Run ``fn`` for ``impl``; on failure mark the row and print the traceback.

    The traceback goes to stderr so a broken implementation is visible at
    once rather than hidden behind an "error" cell.
    """
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    except Exception as e:  # reported in the row and on stderr
        impl.error = error_text(e)
        print(f"[{impl.name}] failed:", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        return None


def time_alternating(impls: Sequence[Impl], repeats: int, pause_s: float = 0.2) -> None:
    """Warm up, then time every implementation, alternating them each round.

    Round r runs impl 1, impl 2, ... then round r+1 again, so slow drifts of
    a shared machine (other jobs, frequency changes) hit all of them alike.
    Results are stored on the ``Impl`` objects (``first_call_s``, ``times``
    in seconds per unit, ``error``).

    Parameters
    ----------
    impls : sequence of Impl
        Implementations; those with ``error`` set are skipped.
    repeats : int
        Timed rounds per implementation.
    pause_s : float
        Sleep between calls, untimed: OpenMP / TBB worker threads keep
        spinning for a while after a parallel region, and without the pause
        they would steal cores from the next implementation.
    """
    for impl in impls:
        if impl.error is None and impl.warmup is not None:
            impl.first_call_s = _call(impl, impl.warmup)
            time.sleep(pause_s)
    for _ in range(repeats):
        for impl in impls:
            if impl.error is not None or impl.run is None:
                continue
            if impl.setup is not None and _call(impl, impl.setup) is None:
                continue
            # Collect the previous impl's garbage now rather than inside this impl's timing.
            gc.collect()
            dt = _call(impl, impl.run)
            if dt is not None:
                impl.times.append(dt / impl.units)
            time.sleep(pause_s)


def result_row(impl: Impl, unit: str, quality: dict[str, float] | None = None) -> dict[str, Any]:
    """JSON row for one implementation (timings in seconds per unit).

    Parameters
    ----------
    impl : Impl
        A timed implementation.
    unit : str
        Name of the unit of work ("iter", "step", "grad", ...).
    quality : dict, optional
        Quality figures (loss, accuracy, gradient error).

    Returns
    -------
    dict
        Row in the ../shared/BENCHMARKS.md JSON format; failed rows carry ``error``.
    """
    row: dict[str, Any] = {"impl": impl.name, "unit": unit}
    ok = impl.error is None and bool(impl.times)
    row["median_s"] = statistics.median(impl.times) if ok else None
    row["min_s"] = min(impl.times) if ok else None
    row["max_s"] = max(impl.times) if ok else None
    row["first_call_s"] = impl.first_call_s if ok else None
    row["quality"] = dict(quality or {}) if ok else {}
    if not ok:
        row["error"] = impl.error or "error: no successful round"
    return row


def ratios(rows: Sequence[dict[str, Any]], ours: str = "nets") -> dict[str, float]:
    """Median time of every peer divided by ours (> 1: ours is faster).

    Parameters
    ----------
    rows : sequence of dict
        Rows from :func:`result_row`.
    ours : str
        Name of our implementation's row.

    Returns
    -------
    dict
        ``{"peer/ours": ratio}`` for every peer row that ran; empty when our
        row did not run.
    """
    base = next((r["median_s"] for r in rows if r["impl"] == ours), None)
    if not base:
        return {}
    return {
        f"{r['impl']}/{ours}": r["median_s"] / base
        for r in rows
        if r["impl"] != ours and r.get("median_s")
    }


# --------------------------------------------------------------------------- reporting


def fmt_time(s: float | None) -> str:
    """Format seconds with a unit that keeps three significant digits."""
    if s is None:
        return "-"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def print_table(
    rows: Sequence[dict[str, Any]],
    extra: dict[str, Callable[[dict[str, Any]], str]] | None = None,
    ours: str = "nets",
    file=None,
) -> None:
    """Print the results table, then the peer/ours ratios.

    Parameters
    ----------
    rows : sequence of dict
        Rows from :func:`result_row`.
    extra : dict, optional
        Additional display-only columns, ``{title: row -> text}`` (e.g. an
        implied GFLOP/s), shown before the quality columns.
    ours : str
        Name of our implementation's row (the ratios' denominator).
    file : file-like, optional
        Output stream (default stdout).
    """
    file = file or sys.stdout
    extra = extra or {}
    qkeys: list[str] = []
    for r in rows:
        qkeys += [k for k in r["quality"] if k not in qkeys]
    unit = next((r["unit"] for r in rows), "unit")
    head = ["impl", f"median/{unit}", "min-max", "first call", *extra, *qkeys]
    body = []
    for r in rows:
        if r.get("error"):
            body.append([r["impl"], r["error"]])
            continue
        cells = [
            r["impl"],
            fmt_time(r["median_s"]),
            f"{fmt_time(r['min_s'])} - {fmt_time(r['max_s'])}",
            fmt_time(r["first_call_s"]),
            *(f(r) for f in extra.values()),
            *(_fmt_quality(r["quality"].get(k)) for k in qkeys),
        ]
        body.append(cells)
    # Width from complete rows only: an error row spans the remaining columns.
    width = [max(len(c[i]) for c in [head, *body] if len(c) == len(head)) for i in range(len(head))]

    def line(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, width, strict=True)).rstrip()

    print(line(head), file=file)
    print(line(["-" * w for w in width]), file=file)
    for cells in body:
        if len(cells) == len(head):
            print(line(cells), file=file)
        else:
            print(cells[0].ljust(width[0]) + "  " + cells[1], file=file)
    rat = ratios(rows, ours)
    if rat:
        txt = "  ".join(f"{k} {v:.2f}x" for k, v in rat.items())
        print(f"ratios (peer median / {ours} median, > 1: {ours} faster): {txt}", file=file)
    else:
        print(f"ratios: none ({ours} did not run)", file=file)


def _fmt_quality(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_json(path: str, bench: str, machine: dict[str, Any], rows, ours: str = "nets") -> None:
    """Write the results in the ../shared/BENCHMARKS.md JSON format.

    Parameters
    ----------
    path : str
        Output file; parent folders are created.
    bench : str
        Benchmark name.
    machine : dict
        From :func:`machine_info`.
    rows : sequence of dict
        Rows from :func:`result_row`.
    ours : str
        Name of our implementation's row.
    """
    doc = {"bench": bench, "machine": machine, "results": list(rows), "ratios": ratios(rows, ours)}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


class Work:
    """One implementation's unit of work, ``fn()``, repeated per timed round.

    The first ``setup()`` (untimed) times a few extra calls and fixes how many
    calls a timed round makes, so that every round lasts about ``target_s``:
    a fast implementation is not timed on a few calls of microseconds right
    after the harness's pause (cold caches, a core still waking up), nor a
    slow one (torchdiffeq) repeated for minutes. ``warmup`` (optional) is the
    first call (its time is reported), e.g. one that records the accuracy;
    ``settle`` (optional, untimed, before the calibration) brings ``fn`` to the
    steady state being timed.
    """

    def __init__(self, name: str, fn, target_s: float, max_units: int = 2000, warmup=None,
                 settle=None):
        self.fn, self.target_s, self.max_units = fn, target_s, max_units
        self.settle = settle
        self._calibrated = False
        self.impl = Impl(name, run=self.run, warmup=warmup or self.warmup, setup=self.setup)

    def warmup(self):
        self.fn()

    def setup(self):
        if not self._calibrated:
            if self.settle is not None:
                self.settle()
            # The first call after the harness's pause can cost 100x a warm one (caches,
            # an idle core waking up): calibrate on the calls that follow it, for ~target/10.
            self.fn()
            calls, t0 = 0, time.perf_counter()
            while True:
                self.fn()
                calls += 1
                dt = time.perf_counter() - t0
                if dt > 0.1 * self.target_s or calls >= self.max_units:
                    break
            per_call = dt / calls
            self.impl.units = int(min(self.max_units, max(1, round(self.target_s / per_call))))
            self._calibrated = True

    def run(self):
        for _ in range(self.impl.units):
            self.fn()


def sciml_grad_works(methods, sciml, prob, data, params, rtol, atol, target_s):
    """One `GradWork` per ``(row name, adjoints class name, keywords)`` in ``methods``:
    ``sciml.loss_and_grad`` of ``prob`` against ``data`` (SSE, Tsit5, both built once, as
    the peers' are) with that sensitivity algorithm; a row with the reason instead where
    the algorithm cannot be made."""
    adjoints, aerr = optional_import("adjoints")
    out = []
    for name, cls, kw in methods:
        if aerr is not None or not hasattr(adjoints, cls):
            why = f"adjoints: {aerr}" if aerr else f"adjoints.{cls} not available"
            print(f"[{name}] skipped: {why}", file=sys.stderr)
            out.append(Impl(name, error=why))
            continue
        try:
            alg = getattr(adjoints, cls)(**kw)
        except Exception as e:  # e.g. a keyword not supported
            out.append(Impl(name, error=error_text(e)))
            continue
        loss, solver = sciml.SSE(), sciml.Tsit5()

        def fn(alg=alg, loss=loss, solver=solver):
            return sciml.loss_and_grad(prob, data, loss=loss, solver=solver, sensealg=alg,
                                       rtol=rtol, atol=atol, params=params)

        out.append(GradWork(name, fn, target_s))
    return out


class GradWork(Work):
    """`Work` for ``fn() -> (loss, grad)``: the first call's result is kept in ``result``."""

    def __init__(self, name: str, fn, target_s: float, max_units: int = 2000):
        super().__init__(name, fn, target_s, max_units)
        self.result = None  # (loss, grad) of the first call

    def warmup(self):
        try:
            loss, grad = self.fn()
        except NotImplementedError as e:
            # a method not there (yet) is a reason, not a failure
            self.impl.error = f"not implemented: {e}"[:200]
            print(f"[{self.impl.name}] skipped: NotImplementedError: {e}", file=sys.stderr)
            return
        self.result = (float(loss), np.asarray(grad, dtype=np.float64).ravel())
